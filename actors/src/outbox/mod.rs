//! The `OutboxPublisher` actor: a mailbox shell around [`OutboxRelay`]. It publishes
//! batches while rows are pending, then sleeps until PostgreSQL notifies a commit
//! (LISTEN/NOTIFY) or the poll interval passes; on failure it backs off exponentially and
//! marks nothing. A row the broker refuses for good is parked instead ([`refusal`]). It
//! also deletes published rows after the retention period.

mod backlog;
mod bell;
mod listen;
mod pace;
pub mod refusal;
mod relay;

use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::{Duration, Instant};

use actix::prelude::*;

use futures_util::FutureExt;
use tokio::sync::watch;
use tracing::{info, warn};

use crate::backoff::Backoff;
use crate::store::outbox::Reach;
use pace::{next_claim, Heard, Wait, HELD_RETRY};

pub use crate::store::outbox::{PendingStats, SHARDS};
pub use crate::store::outbox_parked::ParkedRow;
pub use backlog::{parked_rows, pending_by_topic, refresh_gauges, retry_parked};
pub use bell::{CommitBell, Doorbell, Hearing};
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
