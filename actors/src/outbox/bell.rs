//! The bells of the publish loops: the [`Doorbell`] they wait on, rung by every outbox
//! commit they hear of, and the [`CommitBell`] that this daemon's own writers ring after
//! their commits.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use tokio::sync::Notify;

/// What wakes the publish loops: the notification of every outbox commit rings it (see
/// [`super::spawn_listener`]). A ring wakes one waiting loop, or the next loop to wait; and every
/// ring is counted, so a loop can tell that one came while it was claiming. A loop that
/// found every shard held also wakes when another loop's batch ends (`ended`). Whether the
/// bell hears other daemons' commits (its listener is up) decides how far a loop may trust
/// it: see `next_claim`.
#[derive(Debug, Default)]
pub struct Doorbell {
    pub(super) notify: Notify,
    rings: AtomicU64,
    pub(super) ended: Notify,
    hearing: AtomicBool,
}

impl Doorbell {
    pub fn ring(&self) {
        self.rings.fetch_add(1, Ordering::SeqCst);
        self.notify.notify_one();
    }

    pub(super) fn rings(&self) -> u64 {
        self.rings.load(Ordering::SeqCst)
    }

    /// Whether every commit of other daemons and of SQL rings this bell: a listener is
    /// up.
    pub(super) fn hears(&self) -> bool {
        self.hearing.load(Ordering::SeqCst)
    }

    /// The bell hears other daemons' commits until the guard drops: the listener holds it
    /// while its LISTEN is in effect.
    #[must_use = "the bell hears only while the guard lives"]
    pub fn hearing(&self) -> Hearing<'_> {
        self.hearing.store(true, Ordering::SeqCst);
        Hearing(&self.hearing)
    }
}

/// See [`Doorbell::hearing`].
pub struct Hearing<'a>(&'a AtomicBool);

impl Drop for Hearing<'_> {
    fn drop(&mut self) {
        self.0.store(false, Ordering::SeqCst);
    }
}

/// Wakes the publishers after a commit that wrote outbox rows on a connection that sets
/// `tally.outbox_notify = 'after_commit'`, for which the `outbox_events` trigger sends no
/// notification: this daemon's publish loops at once (its [`Doorbell`]), and other
/// daemons' through a notification that [`super::spawn_announcer`] sends outside the writing
/// transaction, while another daemon listens. A notification in the writing transaction
/// would make its commit wait for, and then hold through its flush, a lock that every
/// committing transaction with a notification takes in turn.
///
/// Rings that come while a notification is on its way are answered by one more
/// notification after it, so while another daemon listens every commit is followed by a
/// notification sent after it.
#[derive(Debug, Clone, Default)]
pub struct CommitBell {
    local: Arc<Doorbell>,
    announce: Arc<Notify>,
}

impl CommitBell {
    /// A bell that rings `local` at once and asks the announcer for a notification.
    #[must_use]
    pub fn new(local: Arc<Doorbell>) -> Self {
        Self { local, announce: Arc::default() }
    }

    /// Rows were committed.
    pub fn ring(&self) {
        self.local.ring();
        self.announce.notify_one();
    }

    /// What the announcer waits on.
    #[must_use]
    pub fn announcements(&self) -> Arc<Notify> {
        Arc::clone(&self.announce)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_ring_with_no_loop_waiting_is_kept_for_the_next_one() {
        let bell = Doorbell::default();
        bell.ring();
        bell.ring();
        assert_eq!(bell.rings(), 2);
        let runtime = tokio::runtime::Builder::new_current_thread().enable_time().build().expect("a runtime");
        let woke = runtime.block_on(async {
            tokio::time::timeout(std::time::Duration::from_secs(5), bell.notify.notified()).await.is_ok()
        });
        assert!(woke, "the stored ring wakes the next waiter at once");
    }
}
