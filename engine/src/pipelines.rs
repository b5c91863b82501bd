//! Builds the configured consumer pipelines from the shared machinery of `tally-actors`.

use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Duration;

use actix::prelude::*;
use anyhow::Context;
use rdkafka::config::ClientConfig;
use rdkafka::producer::FutureProducer;
use tally_actors::antifraud::{Antifraud, AntifraudSpec, RiskRules, RulesRiskEngine};
use tally_actors::consume::{Pipeline, PipelineSpec};
use tally_actors::ledger::{BatchSettler, LedgerHandler, LedgerTopics, SettlementBatcher};
use tally_actors::notify::{Notifier, NotifierSettings};
use tally_actors::orders::OrderMaterializer;
use tally_actors::projection::StatusProjector;
use tally_actors::store::group_commit::GroupCommitSettings;
use tally_actors::store::PgPool;
use tally_actors::supervise::{DeadLetters, DependencyProbe, Supervision};
use tally_actors::Metrics;

use crate::app::Pools;
use crate::config::{Config, DbPool, RetryConfig};

/// What every pipeline needs from the daemon.
pub struct Wiring<'a> {
    pub config: &'a Config,
    pub bootstrap: &'a str,
    /// A pool per stage: each stage, its dead letters included, takes connections from
    /// its own.
    pub pools: Pools,
    pub metrics: Metrics,
    /// Producer for dead-letter writes (idempotent, acks=all).
    pub dlt_producer: FutureProducer,
}

impl Wiring<'_> {
    /// Settings of pipeline `name`'s consumer: with `instance.static_membership`, the
    /// static member `<instance.id>-<name>`.
    fn consumer_client(&self, name: &str) -> ClientConfig {
        let mut clients = self.config.kafka.clients(self.bootstrap);
        if self.config.instance.static_membership {
            clients = clients.with_static_membership(&self.config.instance.id);
        }
        clients.group_consumer(name)
    }

    /// The spec of a pipeline whose records retry under `retry`, each attempt taking at
    /// most `attempt_timeout`: its drain waits at least the worst case of that sequence.
    fn spec(
        &self,
        name: &str,
        group_id: &str,
        topics: Vec<String>,
        retry: &RetryConfig,
        attempt_timeout: Duration,
    ) -> PipelineSpec {
        let client = self.consumer_client(name);
        let c = &self.config.consumer;
        let worst_case = retry.policy().worst_case(attempt_timeout);
        let drain_timeout = c.drain_timeout.max(worst_case);
        if drain_timeout > c.drain_timeout {
            tracing::info!(
                pipeline = name,
                drain_timeout_ms = drain_timeout.as_millis() as u64,
                "Drain timeout raised to the worst case of the retry sequence."
            );
        }
        PipelineSpec {
            name: name.into(),
            group_id: group_id.into(),
            topics,
            client,
            max_in_flight: c.max_in_flight,
            max_uncommitted: c.max_uncommitted,
            max_live_workers: c.max_live_workers,
            idle_after: c.idle_after,
            drain_timeout,
            due_header: None,
        }
    }

    /// The longest a database attempt of a handler takes.
    fn statement_timeout(&self) -> Duration {
        self.config.database.statement_timeout
    }

    /// The pool of `stage`.
    fn pool(&self, stage: DbPool) -> PgPool {
        self.pools.get(stage).clone()
    }

    /// Dead letters of a pipeline of `stage`, stored (when their DLT refuses them) through
    /// the stage's own pool.
    fn dead_letters(&self, stage: DbPool, group_id: &str, stopping: &Arc<AtomicBool>) -> DeadLetters {
        DeadLetters::new(
            self.dlt_producer.clone(),
            group_id.into(),
            self.metrics.clone(),
            Arc::clone(stopping),
            self.pool(stage),
        )
    }

    fn supervision(
        &self,
        stage: DbPool,
        name: &str,
        group_id: &str,
        retry: &RetryConfig,
        stopping: &Arc<AtomicBool>,
    ) -> Supervision {
        Supervision {
            pipeline: name.into(),
            policy: retry.policy(),
            dead_letters: Arc::new(self.dead_letters(stage, group_id, stopping)),
            metrics: self.metrics.clone(),
            in_retry: Arc::default(),
            health: Arc::default(),
            probe: Some(Arc::new(DependencyProbe::new(name, self.pool(stage)))),
        }
    }

    /// The ledger: `transfers.analyzed` -> account ledgers -> settlement batcher.
    ///
    /// # Errors
    /// When the consumer cannot be created.
    pub fn start_ledger(&self) -> anyhow::Result<Pipeline> {
        let cfg = &self.config.ledger;
        let topics = &self.config.kafka.topics;
        let batcher = SettlementBatcher::new(
            self.pool(DbPool::Ledger),
            LedgerTopics {
                settled: topics.transfers_settled.clone(),
                rejected: topics.transfers_rejected.clone(),
                max_balance_cents: cfg.max_balance_cents,
            },
            self.metrics.clone(),
            Arc::new(BatchSettler { max_batch: cfg.batch_size }),
            cfg.max_concurrent_batches,
            cfg.linger,
        )
        .start();
        let spec = self.spec(
            "ledger",
            &cfg.group_id,
            vec![topics.transfers_analyzed.clone()],
            &cfg.retry,
            self.statement_timeout(),
        );
        let stopping = Arc::new(AtomicBool::new(false));
        let supervision = self.supervision(DbPool::Ledger, "ledger", &cfg.group_id, &cfg.retry, &stopping);
        Pipeline::start(
            spec,
            Arc::new(LedgerHandler::new(batcher)),
            supervision,
            stopping,
            self.metrics.clone(),
            Arbiter::current(),
        )
        .context("cannot start the ledger pipeline")
    }

    /// The order materializer: `orders.received` -> `received_orders`, keyed by order id.
    ///
    /// # Errors
    /// When the consumer cannot be created.
    pub fn start_orders(&self) -> anyhow::Result<Pipeline> {
        let cfg = &self.config.orders;
        let topics = vec![self.config.kafka.topics.orders_received.clone()];
        let spec = self.spec("orders", &cfg.group_id, topics, &cfg.retry, self.statement_timeout());
        let stopping = Arc::new(AtomicBool::new(false));
        let supervision = self.supervision(DbPool::Orders, "orders", &cfg.group_id, &cfg.retry, &stopping);
        Pipeline::start(
            spec,
            Arc::new(OrderMaterializer::new(self.pool(DbPool::Orders))),
            supervision,
            stopping,
            self.metrics.clone(),
            Arbiter::current(),
        )
        .context("cannot start the orders pipeline")
    }
}

impl Wiring<'_> {
    /// The status projection: `transfers.settled` + `transfers.rejected` -> `transfers`.
    ///
    /// # Errors
    /// When the consumer cannot be created.
    pub fn start_projection(&self) -> anyhow::Result<Pipeline> {
        let cfg = &self.config.projection;
        let topics = &self.config.kafka.topics;
        let spec = self.spec(
            "projection",
            &cfg.group_id,
            vec![topics.transfers_settled.clone(), topics.transfers_rejected.clone()],
            &cfg.retry,
            self.statement_timeout(),
        );
        let stopping = Arc::new(AtomicBool::new(false));
        let supervision = self.supervision(DbPool::Projection, "projection", &cfg.group_id, &cfg.retry, &stopping);
        Pipeline::start(
            spec,
            Arc::new(StatusProjector::new(
                self.pool(DbPool::Projection),
                topics.transfers_settled.clone(),
                GroupCommitSettings {
                    max_batch: cfg.batch_max,
                    writers: cfg.writers,
                    max_wait: self.config.database.connect_timeout,
                },
                &self.metrics,
            )),
            supervision,
            stopping,
            self.metrics.clone(),
            Arbiter::current(),
        )
        .context("cannot start the projection pipeline")
    }

    /// The antifraud stage: `transfers.requested` -> Kafka transactions ->
    /// `transfers.analyzed` | `transfers.rejected`.
    ///
    /// # Errors
    /// When the consumer or the transactional producer cannot be created.
    pub fn start_antifraud(&self) -> anyhow::Result<Antifraud> {
        let cfg = &self.config.antifraud;
        let topics = &self.config.kafka.topics;
        let transactional_id = if cfg.transactional_id.is_empty() {
            format!("tally-antifraud-{}", self.config.instance.id)
        } else {
            cfg.transactional_id.clone()
        };
        let spec = AntifraudSpec {
            group_id: cfg.group_id.clone(),
            input: topics.transfers_requested.clone(),
            analyzed: topics.transfers_analyzed.clone(),
            rejected: topics.transfers_rejected.clone(),
            consumer: self.consumer_client("antifraud"),
            producer: self.config.kafka.clients(self.bootstrap).transactional_producer(
                "tally-antifraud",
                &transactional_id,
                cfg.transaction_timeout,
            ),
            transactional_id,
            block_limit: cfg.block_score,
            max_batch: cfg.batch_max_records,
            max_batch_wait: cfg.batch_max_wait,
            transaction_timeout: cfg.transaction_timeout,
            call_timeout: cfg.call_timeout,
            retry: cfg.retry.policy(),
            database: self.pool(DbPool::Antifraud),
        };
        let rules = RiskRules {
            base: cfg.base_score,
            amount_tiers: cfg.amount_tiers.clone(),
            velocity_window: cfg.velocity_window,
            velocity_max: cfg.velocity_max,
            velocity_points: cfg.velocity_points,
        };
        Antifraud::start(spec, Box::new(RulesRiskEngine::new(rules)), self.metrics.clone())
            .context("cannot start the antifraud stage")
    }
}

impl Wiring<'_> {
    /// Notifications: the main pipeline on `transfers.settled` + `transfers.rejected`, and
    /// one pipeline per retry delay on the `-retry-<delay_ms>` topics, holding each record
    /// until it is due. Nothing runs without `notifications.webhook_url`.
    ///
    /// # Errors
    /// When a consumer or the HTTP client cannot be created.
    pub fn start_notifications(&self) -> anyhow::Result<Vec<Pipeline>> {
        let cfg = &self.config.notifications;
        if cfg.webhook_url.is_empty() {
            tracing::info!("Notifications pipeline not started: notifications.webhook_url is empty.");
            return Ok(Vec::new());
        }
        let topics = &self.config.kafka.topics;
        let sources = [topics.transfers_settled.clone(), topics.transfers_rejected.clone()];
        let delays = cfg.delays_ms();
        let stopping = Arc::new(AtomicBool::new(false));
        let notifier = Arc::new(
            Notifier::new(
                self.pool(DbPool::Notifications),
                self.dlt_producer.clone(),
                self.dead_letters(DbPool::Notifications, &cfg.group_id, &stopping),
                self.metrics.clone(),
                NotifierSettings {
                    webhook_url: cfg.webhook_url.expose().to_owned(),
                    secret: cfg.webhook_secret.expose().to_owned(),
                    root_certs: cfg
                        .root_certs()
                        .map_err(|e| anyhow::anyhow!("notifications.webhook_root_cert: {e}"))?,
                    timeout: cfg.timeout,
                    delays_ms: delays.clone(),
                    database_wait: self.config.database.connect_timeout,
                },
            )
            .context("cannot build the webhook client")?,
        );
        let mut stages = Vec::with_capacity(delays.len() + 1);
        let attempt_timeout = self.statement_timeout().max(cfg.timeout);
        let main = self.spec("notifications", &cfg.group_id, sources.to_vec(), &cfg.retry, attempt_timeout);
        stages.push(main);
        for delay in &delays {
            let name = format!("notifications-retry-{delay}");
            let mut spec = self.spec(
                &name,
                &format!("{}-retry-{delay}", cfg.group_id),
                sources.iter().map(|t| tally_schema::topics::retry(t, *delay)).collect(),
                &cfg.retry,
                attempt_timeout,
            );
            spec.due_header = Some(tally_schema::headers::RETRY_DUE_AT.into());
            stages.push(spec);
        }
        stages
            .into_iter()
            .map(|spec| {
                let name = spec.name.clone();
                let supervision = self.supervision(DbPool::Notifications, &name, &spec.group_id, &cfg.retry, &stopping);
                let handler: Arc<dyn tally_actors::supervise::RecordHandler> = notifier.clone();
                Pipeline::start(
                    spec,
                    handler,
                    supervision,
                    Arc::clone(&stopping),
                    self.metrics.clone(),
                    Arbiter::current(),
                )
                .with_context(|| format!("cannot start the {name} pipeline"))
            })
            .collect()
    }
}
