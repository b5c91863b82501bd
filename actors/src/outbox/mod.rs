//! The `OutboxPublisher` actor: a mailbox shell around [`OutboxRelay`]. It publishes
//! batches while rows are pending, then sleeps until PostgreSQL notifies a commit
//! (LISTEN/NOTIFY) or the poll interval passes; on failure it backs off exponentially and
//! marks nothing. It also deletes published rows after the retention period.

mod listen;
mod relay;

use std::sync::Arc;
use std::time::{Duration, Instant};

use actix::prelude::*;
use tokio::sync::{watch, Notify};
use tracing::{info, warn};

use crate::backoff::Backoff;

pub use crate::store::outbox::{PendingStats, SHARDS};
pub use listen::spawn_listener;
pub use relay::{pending_by_topic, refresh_gauges, OutboxError, OutboxRelay};

/// How the publisher loop paces itself.
#[derive(Debug, Clone)]
pub struct PublisherSettings {
    pub poll_interval: Duration,
    pub retention: Duration,
    pub cleanup_interval: Duration,
    pub backoff_initial: Duration,
    pub backoff_max: Duration,
    /// Claim again at once while rows are pending (tally). `false` is the classic
    /// scheduled relay (the bench's baseline): one batch, then the poll interval, always.
    pub claim_until_empty: bool,
    /// Publish loops running at once. Each claims a random half of the free shards, and the
    /// shard locks keep their rows apart, so per-key order holds across them.
    pub concurrency: usize,
}

/// Publishes the transactional outbox to Kafka.
pub struct OutboxPublisher {
    relay: Arc<OutboxRelay>,
    settings: PublisherSettings,
    wake: Arc<Notify>,
    stop: watch::Sender<bool>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl OutboxPublisher {
    /// `wake` is notified on every committed outbox insert (see [`spawn_listener`]).
    #[must_use]
    pub fn new(relay: OutboxRelay, settings: PublisherSettings, wake: Arc<Notify>) -> Self {
        let (stop, _) = watch::channel(false);
        Self { relay: Arc::new(relay), settings, wake, stop, tasks: Vec::new() }
    }
}

impl Actor for OutboxPublisher {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        ctx.set_mailbox_capacity(16);
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
        self.wake.notify_one();
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
    wake: Arc<Notify>,
    mut stop: watch::Receiver<bool>,
    cleans: bool,
) {
    let mut waits = Backoff::doubling(settings.backoff_initial, settings.backoff_max).waits();
    let mut last_cleanup = Instant::now();
    let mut empty_claims = 0_u32;
    while !*stop.borrow() {
        let pause = match relay.publish_batch().await {
            Ok(n) => {
                waits.reset();
                empty_claims = if n > 0 { 0 } else { empty_claims + 1 };
                // A claim covers half of the shards: claim again before sleeping, so rows
                // in the other half do not wait for the next wake-up.
                if settings.claim_until_empty && empty_claims < 2 {
                    None
                } else {
                    Some(settings.poll_interval)
                }
            }
            Err(e) => {
                let wait = waits.next_wait();
                warn!(error = %e, code = e.code(), backoff_ms = wait.as_millis() as u64,
                      "Outbox batch failed; nothing was marked published, retrying after backoff.");
                Some(wait)
            }
        };
        if cleans && last_cleanup.elapsed() >= settings.cleanup_interval {
            last_cleanup = Instant::now();
            match relay.delete_published(settings.retention).await {
                Ok(0) => {}
                Ok(n) => info!(deleted = n, "Deleted published outbox rows past retention."),
                Err(e) => warn!(error = %e, "Outbox retention cleanup failed."),
            }
        }
        if let Some(wait) = pause {
            tokio::select! {
                () = wake.notified() => {}
                () = tokio::time::sleep(wait) => {}
                _ = stop.changed() => {}
            }
        }
    }
}
