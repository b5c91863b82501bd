//! The `OutboxPublisher` actor: a mailbox shell around [`OutboxRelay`]. It publishes
//! batches while rows are pending, then sleeps until PostgreSQL notifies a commit
//! (LISTEN/NOTIFY) or the poll interval passes; on failure it backs off exponentially and
//! marks nothing. A row the broker refuses for good is parked instead ([`refusal`]). It
//! also deletes published rows after the retention period.

mod backlog;
mod listen;
pub mod refusal;
mod relay;

use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::{Duration, Instant};

use actix::prelude::*;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use futures_util::FutureExt;
use tokio::sync::{watch, Notify};
use tracing::{info, warn};

use crate::backoff::Backoff;
use crate::store::outbox::Reach;

pub use crate::store::outbox::{PendingStats, SHARDS};
pub use crate::store::outbox_parked::ParkedRow;
pub use backlog::{parked_rows, pending_by_topic, refresh_gauges, retry_parked};
pub use listen::{spawn_announcer, spawn_listener, Own, CHANNEL, LISTENERS_CHECK};
pub use refusal::Refusal;
pub use relay::{BatchOutcome, OutboxError, OutboxRelay};

/// How the publisher loop paces itself.
#[derive(Debug, Clone)]
pub struct PublisherSettings {
    pub poll_interval: Duration,
    pub retention: Duration,
    pub cleanup_interval: Duration,
    pub backoff_initial: Duration,
    pub backoff_max: Duration,
    /// Publish loops running at once. While rows keep coming each claims a random half of
    /// the free shards, and the shard locks keep their rows apart, so per-key order holds
    /// across them.
    pub concurrency: usize,
}

/// Publishes the transactional outbox to Kafka.
pub struct OutboxPublisher {
    relay: Arc<OutboxRelay>,
    settings: PublisherSettings,
    wake: Arc<Doorbell>,
    stop: watch::Sender<bool>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl OutboxPublisher {
    /// `wake` is notified on every committed outbox insert (see [`spawn_listener`]).
    #[must_use]
    pub fn new(relay: OutboxRelay, settings: PublisherSettings, wake: Arc<Doorbell>) -> Self {
        let (stop, _) = watch::channel(false);
        Self { relay: Arc::new(relay), settings, wake, stop, tasks: Vec::new() }
    }
}

impl Actor for OutboxPublisher {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        ctx.set_mailbox_capacity(16);
        self.relay.metrics().stage_restarts_total.with_label_values(&["outbox"]).inc_by(0);
        for index in 0..self.settings.concurrency.max(1) {
            let relay = Arc::clone(&self.relay);
            let settings = self.settings.clone();
            let wake = Arc::clone(&self.wake);
            let stop = self.stop.subscribe();
            // Only the first loop deletes published rows past retention.
            self.tasks.push(actix::spawn(publish_loop(relay, settings, wake, stop, index == 0)));
        }
        info!(loops = self.tasks.len(), "Outbox publisher started.");
    }
}

/// Wakes the publisher now (e.g. after a notification).
#[derive(Message)]
#[rtype(result = "()")]
pub struct Wake;

impl Handler<Wake> for OutboxPublisher {
    type Result = ();

    fn handle(&mut self, _: Wake, _: &mut Self::Context) {
        self.wake.ring();
    }
}

/// Stops claiming new batches, lets the batch in hand finish (so acknowledged rows are
/// marked), flushes the producer, and stops the actor.
#[derive(Message)]
#[rtype(result = "()")]
pub struct StopPublishing;

impl Handler<StopPublishing> for OutboxPublisher {
    type Result = ResponseActFuture<Self, ()>;

    fn handle(&mut self, _: StopPublishing, _: &mut Self::Context) -> Self::Result {
        let _ = self.stop.send(true);
        let tasks = std::mem::take(&mut self.tasks);
        let relay = Arc::clone(&self.relay);
        Box::pin(
            async move {
                for task in tasks {
                    let _ = task.await;
                }
                let producer = relay.producer().clone();
                let flushed = tokio::task::spawn_blocking(move || {
                    rdkafka::producer::Producer::flush(&producer, Duration::from_secs(10))
                })
                .await;
                match flushed {
                    Ok(Ok(())) => info!("Outbox producer flushed."),
                    Ok(Err(e)) => warn!(error = %e, "Outbox producer flush incomplete."),
                    Err(e) => warn!(error = %e, "Outbox producer flush task failed."),
                }
            }
            .into_actor(self)
            .map(|(), _, ctx| {
                ctx.stop();
                info!("Outbox publisher stopped.");
            }),
        )
    }
}

async fn publish_loop(
    relay: Arc<OutboxRelay>,
    settings: PublisherSettings,
    wake: Arc<Doorbell>,
    mut stop: watch::Receiver<bool>,
    cleans: bool,
) {
    let mut waits = Backoff::doubling(settings.backoff_initial, settings.backoff_max).waits();
    let mut last_cleanup = Instant::now();
    // A loop woken by a ring (or the poll) claims from every free shard. While rows keep
    // coming it claims half of the free shards, so that several loops share the key space,
    // and it looks at every free shard before it sleeps, so a row never waits for the poll
    // interval just because its shard was in the other half. A sweep during which a commit
    // rang the bell is made again: its row may have been in a shard another loop held with
    // an older snapshot, and the ring woke that other loop, not this one. A claim that
    // finds every shard held waits for a batch of this daemon to end rather than for the
    // next ring: the holders end with such sweeps themselves, and until one ends every
    // claim would find the shards held again. Only a ring's row in the shards of a daemon
    // that does not hear the bell (its listener down) needs this loop: it claims again
    // `HELD_RETRY` after a ring.
    let mut reach = Reach::AllFree;
    while !*stop.borrow() {
        let rings = wake.rings();
        // Registered before the claim, so that a batch ending meanwhile is not missed.
        let ended = wake.ended.notified();
        tokio::pin!(ended);
        ended.as_mut().enable();
        // A panic in a batch (a bug) costs that batch, not the loop: nothing it claimed was
        // marked, so it is claimed again after the backoff.
        let batch = match AssertUnwindSafe(relay.publish_batch(reach)).catch_unwind().await {
            Ok(batch) => batch,
            Err(panic) => {
                let cause = crate::supervise::restart::panic_message(&*panic);
                relay.metrics().stage_restarts_total.with_label_values(&["outbox"]).inc();
                tracing::error!(cause, "Outbox batch panicked (a bug); the loop goes on after a backoff.");
                Err(OutboxError::Panicked(cause))
            }
        };
        // Its shards are free again, unless it held none, or it panicked: then its
        // connection went back to the pool with the transaction still open, and the locks
        // go only when the pool discards it.
        if !matches!(&batch, Ok(BatchOutcome { no_free_shard: true, .. }) | Err(OutboxError::Panicked(_))) {
            wake.ended.notify_waiters();
        }
        let (wait, timeout) = match batch {
            Ok(batch) => {
                waits.reset();
                let heard = Heard { rang: wake.rings() != rings, hears: wake.hears() };
                let (next, wait) = next_claim(reach, &batch, heard);
                reach = next;
                (wait, settings.poll_interval)
            }
            Err(e) => {
                reach = Reach::Half;
                let wait = waits.next_wait();
                warn!(error = %e, code = e.code(), backoff_ms = wait.as_millis() as u64,
                      "Outbox batch failed; nothing was marked published, retrying after backoff.");
                (Wait::Ring, wait)
            }
        };
        if cleans && last_cleanup.elapsed() >= settings.cleanup_interval {
            last_cleanup = Instant::now();
            match relay.delete_published(settings.retention).await {
                Ok((deleted, released)) => {
                    if deleted > 0 {
                        info!(deleted, "Deleted published outbox rows past retention.");
                    }
                    // Released rows are pending again, and no commit rang for them.
                    if released > 0 {
                        wake.ring();
                    }
                }
                Err(e) => warn!(error = %e, "Outbox retention cleanup failed."),
            }
        }
        match wait {
            Wait::No => {}
            Wait::Ring => tokio::select! {
                () = wake.notify.notified() => {}
                () = tokio::time::sleep(timeout) => {}
                _ = stop.changed() => {}
            },
            Wait::BatchEnd => tokio::select! {
                () = ended => {}
                () = async {
                    wake.notify.notified().await;
                    tokio::time::sleep(HELD_RETRY).await;
                } => {}
                () = tokio::time::sleep(timeout) => {}
                _ = stop.changed() => {}
            },
        }
    }
}

/// What wakes the publish loops: the notification of every outbox commit rings it (see
/// [`spawn_listener`]). A ring wakes one waiting loop, or the next loop to wait; and every
/// ring is counted, so a loop can tell that one came while it was claiming. A loop that
/// found every shard held also wakes when another loop's batch ends (`ended`). Whether the
/// bell hears other daemons' commits (its listener is up) decides how far a loop may trust
/// it: see `next_claim`.
#[derive(Debug, Default)]
pub struct Doorbell {
    notify: Notify,
    rings: AtomicU64,
    ended: Notify,
    hearing: AtomicBool,
}

impl Doorbell {
    pub fn ring(&self) {
        self.rings.fetch_add(1, Ordering::SeqCst);
        self.notify.notify_one();
    }

    fn rings(&self) -> u64 {
        self.rings.load(Ordering::SeqCst)
    }

    /// Whether every commit of other daemons and of SQL rings this bell: a listener is
    /// up.
    fn hears(&self) -> bool {
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
/// daemons' through a notification that [`spawn_announcer`] sends outside the writing
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

/// How soon after a ring a loop that found every shard held claims again, when no batch of
/// its own daemon ended first.
const HELD_RETRY: Duration = Duration::from_millis(20);

/// What a loop waits for before its next claim.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Wait {
    /// Nothing: it claims again at once.
    No,
    /// A ring, or the poll interval.
    Ring,
    /// Another loop's batch to end, a ring and then `HELD_RETRY`, or the poll interval.
    BatchEnd,
}

/// What a loop heard of the bell over a batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Heard {
    /// It rang after the batch's claim began.
    rang: bool,
    /// It hears other daemons' commits (a listener is up) as the batch ends.
    hears: bool,
}

/// After a claim of `reach` that did `batch`, with what the loop `heard` of the bell: the
/// reach of the next claim, and what to wait for before it.
///
/// A loop sleeps once a claim of every free shard took all it found (no `more`) and no
/// ring came after it began. A row committed before that claim was in a shard it held, and
/// it took it; or in a shard another publisher held, which either took it too or began its
/// batch before the commit, heard the commit's ring, and claims again. Looking again until
/// a claim finds nothing would cost a row committed alone three or four transactions, each
/// locking shards, where one publishes it. That needs a bell that hears every commit: a
/// loop whose daemon does not hear other daemons (`outbox.listen` off, or its listener
/// down) keeps claiming until a sweep of every free shard finds nothing, because a row
/// another daemon committed into shards it held rang only there.
///
/// A claim that found every shard held waits for a batch to end. Each holder is in the
/// middle of a batch, and a loop only ever waits after a sweep of every free shard that
/// took all it found and during which no ring came (or after finding every shard held in
/// its turn), so a row whose ring came before finds its publisher without this loop;
/// claiming again at each ring would only spin on the database while the holder waits for
/// the broker. A holder in another daemon ends no batch here, and one whose daemon does not
/// hear the bell (its listener down) does not sweep again for a ring's row: a ring is
/// followed by another claim after `HELD_RETRY`.
fn next_claim(reach: Reach, batch: &BatchOutcome, heard: Heard) -> (Reach, Wait) {
    match (batch.moved(), reach) {
        (0, _) if batch.no_free_shard => (Reach::Half, Wait::BatchEnd),
        (1.., _) if batch.more || heard.rang || !heard.hears => (Reach::Half, Wait::No),
        (_, Reach::Half) => (Reach::AllFree, Wait::No),
        (_, Reach::AllFree) if heard.rang => (Reach::AllFree, Wait::No),
        (_, Reach::AllFree) => (Reach::AllFree, Wait::Ring),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const QUIET: Heard = Heard { rang: false, hears: true };
    const RANG: Heard = Heard { rang: true, hears: true };
    const DEAF: Heard = Heard { rang: false, hears: false };

    #[test]
    fn a_loop_sleeps_only_after_a_sweep_of_every_free_shard_that_took_all_it_found() {
        let busy = BatchOutcome { published: 5, ..BatchOutcome::default() };
        let empty = BatchOutcome::default();
        for heard in [QUIET, RANG, DEAF] {
            // Nothing in this half: look at every free shard before sleeping.
            assert_eq!(next_claim(Reach::Half, &empty, heard), (Reach::AllFree, Wait::No));
        }
        // An empty sweep sleeps, unless a commit rang meanwhile: then it sweeps again.
        assert_eq!(next_claim(Reach::AllFree, &empty, QUIET), (Reach::AllFree, Wait::Ring));
        assert_eq!(next_claim(Reach::AllFree, &empty, DEAF), (Reach::AllFree, Wait::Ring));
        assert_eq!(next_claim(Reach::AllFree, &empty, RANG), (Reach::AllFree, Wait::No));
        // A half that had rows: the other half is still to be looked at.
        assert_eq!(next_claim(Reach::Half, &busy, QUIET), (Reach::AllFree, Wait::No));
        // A sweep that took every row it found, with no commit since it began: nothing is
        // left that this loop could miss, so it sleeps until the next ring.
        assert_eq!(next_claim(Reach::AllFree, &busy, QUIET), (Reach::AllFree, Wait::Ring));
    }

    #[test]
    fn a_loop_claims_again_while_rows_keep_coming() {
        let busy = BatchOutcome { published: 5, ..BatchOutcome::default() };
        let parked = BatchOutcome { parked: 1, held: 2, ..BatchOutcome::default() };
        for batch in [busy, parked] {
            for reach in [Reach::Half, Reach::AllFree] {
                // A commit rang while it ran.
                assert_eq!(next_claim(reach, &batch, RANG), (Reach::Half, Wait::No), "{reach:?}, rang");
                // It took as many rows as a claim may, or released held rows.
                let more = BatchOutcome { more: true, ..batch };
                for heard in [QUIET, RANG] {
                    assert_eq!(next_claim(reach, &more, heard), (Reach::Half, Wait::No), "{reach:?}, more");
                }
            }
        }
    }

    #[test]
    fn a_loop_that_does_not_hear_other_daemons_claims_again_until_it_finds_nothing() {
        // Another daemon's row committed into shards this loop held rang only there.
        let busy = BatchOutcome { published: 5, ..BatchOutcome::default() };
        for reach in [Reach::Half, Reach::AllFree] {
            assert_eq!(next_claim(reach, &busy, DEAF), (Reach::Half, Wait::No), "{reach:?}");
        }
    }

    #[test]
    fn a_loop_that_finds_every_shard_held_waits_for_a_batch_to_end() {
        let all_held = BatchOutcome { no_free_shard: true, ..BatchOutcome::default() };
        for (reach, rang) in
            [(Reach::Half, false), (Reach::Half, true), (Reach::AllFree, false), (Reach::AllFree, true)]
        {
            for hears in [false, true] {
                let heard = Heard { rang, hears };
                assert_eq!(next_claim(reach, &all_held, heard), (Reach::Half, Wait::BatchEnd), "{reach:?}, {heard:?}");
            }
        }
    }

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
