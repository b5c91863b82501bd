//! The outbox relay logic, without the actor: claim pending rows, produce
//! them, mark them published only after the broker acknowledged every record, and park
//! the rows the broker refuses for good ([`super::refusal`]).
//!
//! Per-key order with several publishers: see [`crate::store::outbox`], which holds the
//! statements.

use std::collections::HashSet;
use std::time::{Duration, Instant};

use chrono::Utc;
use diesel_async::scoped_futures::ScopedFutureExt;
use diesel_async::AsyncConnection;
use futures_util::future::join_all;
use rdkafka::error::KafkaError;
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord};
use tally_schema::headers;
use tally_schema::models::PendingOutboxEvent;
use tracing::field::Empty;
use tracing::warn;

use super::refusal::{settle, Outcome, Refusal};
use crate::backoff::Backoff;
use crate::metrics::Metrics;
use crate::signing::Keyring;
use crate::store::outbox::{self, ClaimedOutboxEvent, Reach};
use crate::store::{outbox_parked, PgPool};
use crate::trace;

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum OutboxError {
    #[error("database error: {0}")]
    Database(#[from] diesel::result::Error),
    #[error("no database connection: {0}")]
    Pool(String),
    #[error("broker did not acknowledge record {event_id}: {source}")]
    Delivery { event_id: uuid::Uuid, source: KafkaError },
    #[error("cannot enqueue record {event_id}: {source}")]
    Enqueue { event_id: uuid::Uuid, source: KafkaError },
    #[error("delivery report lost for record {0}")]
    Canceled(uuid::Uuid),
    #[error("the batch panicked (a bug): {0}")]
    Panicked(String),
}

impl OutboxError {
    /// A stable code for logs and metrics.
    #[must_use]
    pub fn code(&self) -> &'static str {
        match self {
            Self::Database(_) => "database",
            Self::Pool(_) => "pool",
            Self::Delivery { .. } => "delivery",
            Self::Enqueue { .. } => "enqueue",
            Self::Canceled(_) => "canceled",
            Self::Panicked(_) => "panicked",
        }
    }
}

/// What one batch did: rows published, parked (refused by the broker, again or for the
/// first time) and held (behind a parked row of their topic and key); whether it found
/// every shard held by other publishers, so that it could claim nothing; and whether rows
/// may be waiting that it did not take (`more`): a claim of it took as many rows as it
/// may, or it released rows held behind a row it published.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BatchOutcome {
    pub published: usize,
    pub parked: usize,
    pub held: usize,
    pub no_free_shard: bool,
    pub more: bool,
}

impl BatchOutcome {
    /// Rows that changed state: while a batch moves some, the loop claims again at once.
    #[must_use]
    pub fn moved(&self) -> usize {
        self.published + self.parked + self.held
    }

    /// The labels of `tally_outbox_claims_total`.
    pub const FOUND: [&'static str; 3] = ["rows", "nothing", "held"];

    /// What its claim found, as `tally_outbox_claims_total` labels it.
    #[must_use]
    pub fn found(&self) -> &'static str {
        match (self.no_free_shard, self.moved()) {
            (true, _) => Self::FOUND[2],
            (false, 0) => Self::FOUND[1],
            (false, _) => Self::FOUND[0],
        }
    }
}

/// Claims, publishes and marks outbox rows.
pub struct OutboxRelay {
    pool: PgPool,
    producer: FutureProducer,
    metrics: Metrics,
    batch_size: i64,
    parked_retry: Backoff,
    keyring: Keyring,
}

impl OutboxRelay {
    /// `parked_retry` is the curve of waits between the attempts of a parked row; every
    /// record is signed with `keyring`'s signing key.
    #[must_use]
    pub fn new(
        pool: PgPool,
        producer: FutureProducer,
        metrics: Metrics,
        batch_size: i64,
        parked_retry: Backoff,
        keyring: Keyring,
    ) -> Self {
        // Every label set from the start, so that `increase()` sees the first claim.
        for found in BatchOutcome::FOUND {
            metrics.outbox_claims_total.with_label_values(&[found]);
        }
        Self { pool, producer, metrics, batch_size, parked_retry, keyring }
    }

    #[must_use]
    pub fn batch_size(&self) -> i64 {
        self.batch_size
    }

    pub fn producer(&self) -> &FutureProducer {
        &self.producer
    }

    #[must_use]
    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    /// Publishes one batch: locks free shards (as many as `reach` says), claims up to
    /// `batch_size` publishable rows of those shards in `seq` order (`FOR UPDATE SKIP
    /// LOCKED`) and the parked rows due for another attempt, produces them, waits for every
    /// answer, then sets `published_at` on the acknowledged rows, parks the refused ones
    /// and holds the rows behind them, all in one database transaction. A row found behind
    /// a parked row of its topic and key is held without being produced. On any other
    /// failure nothing is marked and the transaction rolls back.
    ///
    /// # Errors
    /// [`OutboxError`] when the database or the broker fails; the rows stay pending.
    pub async fn publish_batch(&self, reach: Reach) -> Result<BatchOutcome, OutboxError> {
        let started = Instant::now();
        let mut conn = self.pool.get().await.map_err(|e| OutboxError::Pool(e.to_string()))?;
        let mut refused: Vec<(String, Refusal)> = Vec::new();
        let result = conn
            .transaction::<BatchOutcome, OutboxError, _>(|conn| {
                let refused = &mut refused;
                async move {
                    let shards = outbox::lock_free_shards(conn, reach).await?;
                    if shards.is_empty() {
                        return Ok(BatchOutcome { no_free_shard: true, ..BatchOutcome::default() });
                    }
                    let claimed = outbox::claim_pending(conn, &shards, self.batch_size).await?;
                    let limit = usize::try_from(self.batch_size).unwrap_or(usize::MAX);
                    let mut more = claimed.len() >= limit;
                    // A claim that found rows says whether any row is parked: if none, none
                    // is due, and the statement is spared.
                    let any_parked = claimed.first().is_none_or(|r| r.any_parked);
                    let (behind, mut rows): (Vec<_>, Vec<_>) = claimed.into_iter().partition(|r| r.behind_parked);
                    if any_parked {
                        let due = outbox_parked::claim_due(conn, &shards, self.batch_size).await?;
                        more |= due.len() >= limit;
                        rows.extend(due);
                    }
                    rows.sort_by_key(|r| r.event.seq);
                    let behind: Vec<uuid::Uuid> = behind.iter().map(|r| r.event.id).collect();
                    outbox_parked::hold(conn, &behind).await?;
                    if crate::faults::is_on(crate::faults::Fault::OutboxOutOfOrder) {
                        // Broken on purpose (test builds only): per-key order lost.
                        rows.reverse();
                    }
                    let outcomes = self.produce_all(&rows).await?;
                    let settled = settle(&rows, &outcomes, self.parked_retry);
                    outbox::mark_published(conn, &settled.published).await?;
                    // Released rows are pending again, and nothing rings for them.
                    more |= outbox_parked::release(conn, &settled.released).await? > 0;
                    outbox_parked::park(conn, &settled.parked).await?;
                    outbox_parked::hold(conn, &settled.held).await?;
                    for (row, outcome) in rows.iter().zip(&outcomes) {
                        if let Outcome::Refused { refusal, error } = outcome {
                            refused.push((row.event.topic.clone(), *refusal));
                            warn!(event_id = %row.event.id, topic = %row.event.topic, key = %row.event.key,
                                  reason = refusal.code(), error = %error, attempts = row.attempts + 1,
                                  "Outbox row refused by the broker; parked, later rows of its topic and key held.");
                        }
                    }
                    if !settled.overtaken.is_empty() {
                        warn!(rows = ?settled.overtaken,
                              "Outbox rows acknowledged after an earlier row of their topic and key was refused; \
                               published ahead of it.");
                    }
                    Ok(BatchOutcome {
                        published: settled.published.len(),
                        parked: settled.parked.len(),
                        held: behind.len() + settled.held.len(),
                        no_free_shard: false,
                        more,
                    })
                }
                .scope_boxed()
            })
            .await;
        match &result {
            Ok(batch) => {
                self.metrics.outbox_claims_total.with_label_values(&[batch.found()]).inc();
                for (topic, refusal) in &refused {
                    self.metrics.outbox_refused_total.with_label_values(&[topic, refusal.code()]).inc();
                }
                if batch.published > 0 {
                    self.metrics.outbox_published_total.inc_by(batch.published as u64);
                    self.metrics.outbox_batch_seconds.observe(started.elapsed().as_secs_f64());
                }
            }
            Err(_) => self.metrics.outbox_publish_failures_total.inc(),
        }
        result
    }

    /// Enqueues every row, then waits for every delivery report; returns each row's
    /// [`Outcome`], in the order of `rows`. A refusal at enqueue stops the rows of its topic
    /// and key that follow in the batch (not sent); any error that is not a refusal fails
    /// the batch. A row with a traceparent is published inside an `outbox.publish` span
    /// ([`publish_span`]), which passes its own traceparent on when traces are exported.
    async fn produce_all(&self, rows: &[ClaimedOutboxEvent]) -> Result<Vec<Outcome>, OutboxError> {
        let mut outcomes = vec![Outcome::NotSent; rows.len()];
        let mut deliveries = Vec::with_capacity(rows.len());
        let mut stopped: HashSet<(&str, &str)> = HashSet::new();
        for (index, row) in rows.iter().map(|r| &r.event).enumerate() {
            if stopped.contains(&(row.topic.as_str(), row.key.as_str())) {
                continue;
            }
            let id = row.id.to_string();
            let span = row.traceparent.as_ref().map(|_| publish_span(row));
            let traceparent = span
                .as_ref()
                .and_then(|span| trace::join(span, row.traceparent.as_deref()))
                .or_else(|| row.traceparent.clone());
            let mut hdrs = OwnedHeaders::new_with_capacity(3)
                .insert(Header { key: headers::EVENT_ID, value: Some(id.as_bytes()) })
                .insert(Header { key: headers::EVENT_TYPE, value: Some(row.event_type.as_bytes()) });
            if let Some(tp) = &traceparent {
                hdrs = hdrs.insert(Header { key: headers::TRACEPARENT, value: Some(tp.as_bytes()) });
            }
            let hdrs = self.keyring.sign(hdrs, row.key.as_bytes(), row.payload.as_bytes(), &id, &row.event_type);
            let record = FutureRecord::to(&row.topic).key(&row.key).payload(&row.payload).headers(hdrs);
            match self.producer.send_result(record) {
                Ok(delivery) => deliveries.push((index, row.id, row.created_at, delivery, span)),
                Err((source, _)) => {
                    if let Some(span) = &span {
                        span.record("outcome", "enqueue_failed");
                        trace::failed(span, "enqueue_failed", &source.to_string());
                    }
                    let Some(refusal) = Refusal::of(&source) else {
                        return Err(OutboxError::Enqueue { event_id: row.id, source });
                    };
                    stopped.insert((row.topic.as_str(), row.key.as_str()));
                    outcomes[index] = Outcome::Refused { refusal, error: source.to_string() };
                }
            }
        }
        let (waiting, reports): (Vec<_>, Vec<_>) =
            deliveries.into_iter().map(|(index, id, at, delivery, span)| ((index, id, at, span), delivery)).unzip();
        let reports = join_all(reports).await;
        let now = Utc::now();
        let mut failure = None;
        for ((index, event_id, created_at, span), report) in waiting.into_iter().zip(reports) {
            let outcome = |label: &'static str, error: Option<&dyn std::fmt::Display>| {
                if let Some(span) = &span {
                    span.record("outcome", label);
                    if let Some(e) = error {
                        trace::failed(span, label, &e.to_string());
                    }
                }
            };
            match report {
                Ok(Ok(delivery)) => {
                    outcome("published", None);
                    if let Some(span) = &span {
                        span.record("messaging.kafka.destination.partition", i64::from(delivery.partition));
                        span.record("messaging.kafka.offset", delivery.offset);
                    }
                    let age = (now - created_at).num_microseconds().unwrap_or(0) as f64 / 1e6;
                    self.metrics.outbox_commit_to_ack_seconds.observe(age.max(0.0));
                    outcomes[index] = Outcome::Published;
                }
                Ok(Err((source, _))) => match Refusal::of(&source) {
                    Some(refusal) => {
                        outcome("refused", Some(&source));
                        outcomes[index] = Outcome::Refused { refusal, error: source.to_string() };
                    }
                    None => {
                        outcome("delivery_failed", Some(&source));
                        failure.get_or_insert(OutboxError::Delivery { event_id, source });
                    }
                },
                Err(e) => {
                    outcome("canceled", Some(&e));
                    failure.get_or_insert(OutboxError::Canceled(event_id));
                }
            }
        }
        match failure {
            Some(e) => Err(e),
            None => Ok(outcomes),
        }
    }

    /// Deletes rows published longer than `retention` ago, in bounded chunks, and releases
    /// held rows left without a parked row. Returns the numbers deleted and released.
    ///
    /// # Errors
    /// When the database fails.
    pub async fn delete_published(&self, retention: Duration) -> Result<(u64, usize), OutboxError> {
        let mut conn = self.pool.get().await.map_err(|e| OutboxError::Pool(e.to_string()))?;
        let total = outbox::delete_published(&mut conn, retention).await?;
        self.metrics.outbox_deleted_total.inc_by(total);
        let released = outbox_parked::release_orphans(&mut conn).await?;
        if released > 0 {
            warn!(released, "Released held outbox rows whose parked row is gone (deleted or marked by hand).");
        }
        Ok((total, released))
    }
}

/// The `outbox.publish` hop span of `row` (kind PRODUCER; the partition and offset are
/// recorded on the broker's acknowledgement, a failure marks it failed), from enqueueing
/// its record to the broker's acknowledgement, with the transfer id of a transfer event (read from the payload only
/// when traces are exported: a span enabled for logs alone does not pay for the parse).
fn publish_span(row: &PendingOutboxEvent) -> tracing::Span {
    let span = tracing::info_span!(
        "outbox.publish",
        otel.kind = "producer",
        otel.status_code = Empty,
        otel.status_description = Empty,
        error.type = Empty,
        trace_id = Empty,
        transfer.id = Empty,
        messaging.system = "kafka",
        messaging.operation.type = "send",
        messaging.destination.name = row.topic.as_str(),
        messaging.kafka.destination.partition = Empty,
        messaging.kafka.offset = Empty,
        messaging.kafka.message.key = row.key.as_str(),
        db.system = "postgresql",
        event.type = row.event_type.as_str(),
        outcome = Empty,
    );
    if !span.is_disabled() && crate::trace::exporting() {
        #[derive(serde::Deserialize)]
        #[serde(rename_all = "camelCase")]
        struct TransferEvent {
            transfer_id: uuid::Uuid,
        }
        if let Ok(event) = serde_json::from_str::<TransferEvent>(&row.payload) {
            span.record("transfer.id", tracing::field::display(event.transfer_id));
        }
    }
    span
}
