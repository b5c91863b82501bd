//! What every stage is started with ([`Wiring`]), and the machinery they share: a
//! pipeline's spec, supervision and dead letters, from `tally-actors`.

use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Duration;

use actix::prelude::*;
use anyhow::Context;
use rdkafka::config::ClientConfig;
use rdkafka::producer::FutureProducer;
use tally_actors::consume::{Pipeline, PipelineSpec};
use tally_actors::store::PgPool;
use tally_actors::supervise::{DeadLetters, DependencyProbe, RecordHandler, Supervision};
use tally_actors::Metrics;

use crate::app::Pools;
use crate::config::{Config, ConsumerConfig, DbPool, RetryConfig};

use super::Stage;

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
    /// Rung after each write, committed or not, on a pool for which
    /// [`super::rings_after_commit`] holds.
    pub outbox_commits: tally_actors::outbox::CommitBell,
    /// Signs what the stages produce; what they consume must be signed with one of its keys.
    pub keyring: tally_actors::signing::Keyring,
}

impl Wiring<'_> {
    /// Settings of pipeline `name`'s consumer: with `instance.static_membership`, the
    /// static member `<instance.id>-<name>`.
    pub(super) fn consumer_client(&self, name: &str) -> ClientConfig {
        let mut clients = self.config.kafka.clients(self.bootstrap);
        if self.config.instance.static_membership {
            clients = clients.with_static_membership(&self.config.instance.id);
        }
        clients.group_consumer(name)
    }

    /// The spec of a pipeline whose records retry under `retry`, each attempt taking at
    /// most `attempt_timeout`: its drain waits at least the worst case of that sequence.
    pub(super) fn spec(
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
            stall_after: c.stall_after.max(worst_case + ConsumerConfig::STALL_MARGIN),
            due_header: None,
            keyring: self.keyring.clone(),
        }
    }

    /// The longest a database attempt of a handler takes.
    pub(super) fn statement_timeout(&self) -> Duration {
        self.config.database.statement_timeout
    }

    /// The pool of `stage`.
    pub(super) fn pool(&self, stage: DbPool) -> PgPool {
        self.pools.get(stage).clone()
    }

    /// Dead letters of a pipeline of `stage`, stored (when their DLT refuses them) through
    /// the stage's own pool.
    pub(super) fn dead_letters(&self, stage: DbPool, group_id: &str, stopping: &Arc<AtomicBool>) -> DeadLetters {
        DeadLetters::new(
            self.dlt_producer.clone(),
            group_id.into(),
            self.metrics.clone(),
            Arc::clone(stopping),
            self.pool(stage),
        )
    }

    pub(super) fn supervision(
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

    /// Starts `stage`'s one pipeline: `spec`'s records to `handler`, under `retry`.
    ///
    /// # Errors
    /// When the consumer cannot be created.
    pub(super) fn start_pipeline(
        &self,
        stage: &Stage,
        spec: PipelineSpec,
        retry: &RetryConfig,
        handler: Arc<dyn RecordHandler>,
    ) -> anyhow::Result<Pipeline> {
        let stopping = Arc::new(AtomicBool::new(false));
        let supervision = self.supervision(stage.db_pool(), &spec.name, &spec.group_id, retry, &stopping);
        let name = spec.name.clone();
        Pipeline::start(spec, handler, supervision, stopping, self.metrics.clone(), Arbiter::current())
            .with_context(|| format!("cannot start the {name} pipeline"))
    }
}
