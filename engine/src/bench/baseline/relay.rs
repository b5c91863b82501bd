//! The outbox baseline of `make bench`: the classic scheduled relay
//! (`@Scheduled(fixedDelay = 200)`, batches of 100, no LISTEN). One loop publishes one
//! batch with tally's own claim, produce and mark ([`OutboxRelay::publish_batch`] over
//! every free shard), then sleeps the fixed delay, whether rows are pending or not.

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use rdkafka::producer::FutureProducer;
use tally_actors::backoff::Backoff;
use tally_actors::outbox::OutboxRelay;
use tally_actors::store::outbox::Reach;
use tally_actors::store::{build_pool, PoolSettings};
use tally_actors::Metrics;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::config::Config;

/// The classic relay's fixed delay between batches.
pub const FIXED_DELAY: Duration = Duration::from_millis(200);
/// The classic relay's batch.
pub const BATCH: i64 = 100;

/// A running classic relay; [`ClassicRelay::stop`] ends it.
pub struct ClassicRelay {
    stop: watch::Sender<bool>,
    task: JoinHandle<()>,
}

impl ClassicRelay {
    /// Starts publishing the outbox of `config`'s database to `bootstrap`. Call inside a
    /// tokio runtime.
    ///
    /// # Errors
    /// When the pool, the producer or the metrics cannot be created.
    pub fn start(config: &Config, bootstrap: &str) -> anyhow::Result<Self> {
        let pool = build_pool(&PoolSettings {
            url: config.database.url.expose().to_owned(),
            max_size: 2,
            statement_timeout: config.database.statement_timeout,
            connect_timeout: config.database.connect_timeout,
            application_name: "tally-bench-relay".into(),
            outbox_notify_after_commit: false,
        })
        .context("cannot build the relay's pool")?;
        let producer: FutureProducer = config
            .kafka
            .clients(bootstrap)
            .producer("tally-bench-relay", config.outbox.send_timeout)
            .create()
            .context("cannot create the relay's producer")?;
        let metrics = Metrics::new().context("cannot register metrics")?;
        let parked = Backoff::doubling(config.outbox.parked_retry_initial, config.outbox.parked_retry_max);
        let (_, keyring) = crate::bench::bench_keys()?;
        let relay = Arc::new(OutboxRelay::new(pool, producer, metrics, BATCH, parked, keyring));
        let (stop, mut stopped) = watch::channel(false);
        let task = tokio::spawn(async move {
            while !*stopped.borrow() {
                if let Err(e) = relay.publish_batch(Reach::AllFree).await {
                    tracing::warn!(error = %e, "Classic relay batch failed.");
                }
                tokio::select! {
                    () = tokio::time::sleep(FIXED_DELAY) => {}
                    _ = stopped.changed() => {}
                }
            }
            let producer = relay.producer().clone();
            let _ = tokio::task::spawn_blocking(move || {
                rdkafka::producer::Producer::flush(&producer, Duration::from_secs(10))
            })
            .await;
        });
        Ok(Self { stop, task })
    }

    /// Stops after the batch in hand.
    pub async fn stop(self) {
        let _ = self.stop.send(true);
        let _ = self.task.await;
    }
}
