//! `Lease`: one partition assignment's right to act. Every record carries the lease of the
//! assignment it was taken under, and every side effect of the record (each handler
//! attempt, each dead-letter write) checks it first. When the partition is revoked (or the
//! pipeline stops) the lease goes through two states:
//!
//! - draining: the owner is finishing in-flight work. Records keep running, except those
//!   waiting for an unavailable dependency: they cannot finish, so they give up at once and
//!   stay uncommitted instead of holding the drain up to its timeout;
//! - revoked: the drain finished or timed out. Nothing more may happen for the partition on
//!   this instance; whatever is still running stops at its next check, uncommitted, and the
//!   partition's new owner redoes it.

use std::future::Future;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Arc;

const HELD: u8 = 0;
const DRAINING: u8 = 1;
const REVOKED: u8 = 2;

#[derive(Debug, Clone)]
pub struct Lease(Arc<AtomicU8>);

impl Default for Lease {
    fn default() -> Self {
        Self::new()
    }
}

tokio::task_local! {
    static CURRENT: Lease;
}

impl Lease {
    /// A held lease.
    #[must_use]
    pub fn new() -> Self {
        Self(Arc::new(AtomicU8::new(HELD)))
    }

    /// The owner stopped taking records and waits for in-flight ones.
    pub fn drain(&self) {
        let _ = self.0.compare_exchange(HELD, DRAINING, Ordering::AcqRel, Ordering::Acquire);
    }

    /// The partition is no longer ours: no more side effects for it.
    pub fn revoke(&self) {
        self.0.store(REVOKED, Ordering::Release);
    }

    /// Whether side effects may still happen under this lease (held or draining).
    #[must_use]
    pub fn is_live(&self) -> bool {
        self.0.load(Ordering::Acquire) != REVOKED
    }

    /// Whether the owner is giving the partition up (draining or revoked).
    #[must_use]
    pub fn is_ending(&self) -> bool {
        self.0.load(Ordering::Acquire) != HELD
    }

    /// Runs `fut` with this lease as the current one, so that code called by a handler
    /// (e.g. a dead-letter write) checks it without being handed it.
    pub async fn scope<F: Future>(self, fut: F) -> F::Output {
        CURRENT.scope(self, fut).await
    }

    /// Whether the lease of the running record (if any) is live; true outside a record.
    #[must_use]
    pub fn current_is_live() -> bool {
        CURRENT.try_with(Lease::is_live).unwrap_or(true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lifecycle() {
        let lease = Lease::new();
        assert!(lease.is_live() && !lease.is_ending());
        lease.drain();
        assert!(lease.is_live() && lease.is_ending());
        lease.revoke();
        assert!(!lease.is_live() && lease.is_ending());
        lease.drain();
        assert!(!lease.is_live(), "a revoked lease never comes back");
    }

    #[tokio::test]
    async fn the_current_lease_is_seen_inside_its_scope_only() {
        assert!(Lease::current_is_live(), "no record, nothing to check");
        let lease = Lease::new();
        lease.revoke();
        assert!(!lease.clone().scope(async { Lease::current_is_live() }).await);
        assert!(Lease::current_is_live());
    }
}
