//! A count of things in some state, held up by guards: each [`Counted`] adds one while it
//! lives, so the count stays right however its holder ends (finished, failed, or its future
//! dropped).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

/// One of `count`, from [`Counted::new`] until dropped.
#[derive(Debug)]
pub struct Counted(Arc<AtomicUsize>);

impl Counted {
    #[must_use]
    pub fn new(count: &Arc<AtomicUsize>) -> Self {
        count.fetch_add(1, Ordering::AcqRel);
        Self(Arc::clone(count))
    }
}

impl Drop for Counted {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}
