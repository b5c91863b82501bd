//! The outbox relay logic, without the actor: claim pending rows, produce
//! them, mark them published only after the broker acknowledged every record.
//!
//! Per-key order with several publishers: see [`crate::store::outbox`], which holds the
//! statements.

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

use crate::metrics::Metrics;
use crate::store::outbox::{self, PendingStats, Reach};
use crate::store::PgPool;
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
        }
    }
}

/// Claims, publishes and marks outbox rows.
pub struct OutboxRelay {
    pool: PgPool,
    producer: FutureProducer,
    metrics: Metrics,
    batch_size: i64,
}

impl OutboxRelay {
    #[must_use]
    pub fn new(pool: PgPool, producer: FutureProducer, metrics: Metrics, batch_size: i64) -> Self {
        Self { pool, producer, metrics, batch_size }
    }

    #[must_use]
    pub fn batch_size(&self) -> i64 {
        self.batch_size
    }

    pub fn producer(&self) -> &FutureProducer {
        &self.producer
    }

    /// Publishes one batch: locks free shards (as many as `reach` says), claims up to `batch_size` pending rows
    /// of those shards in `seq` order (`FOR UPDATE SKIP LOCKED`), produces them, waits for
    /// every acknowledgement, then sets `published_at`, all in one database transaction. On
    /// any failure nothing is marked and the transaction rolls back. Returns the number of
    /// rows published.
    ///
    /// # Errors
    /// [`OutboxError`] when the database or the broker fails; the rows stay pending.
    pub async fn publish_batch(&self, reach: Reach) -> Result<usize, OutboxError> {
        let started = Instant::now();
        let mut conn = self.pool.get().await.map_err(|e| OutboxError::Pool(e.to_string()))?;
        let result = conn
            .transaction::<usize, OutboxError, _>(|conn| {
                async move {
                    let shards = outbox::lock_free_shards(conn, reach).await?;
                    if shards.is_empty() {
                        return Ok(0);
                    }
                    let mut rows = outbox::claim_pending(conn, &shards, self.batch_size).await?;
                    if rows.is_empty() {
                        return Ok(0);
                    }
                    if crate::faults::is_on(crate::faults::Fault::OutboxOutOfOrder) {
                        // Broken on purpose (test builds only): per-key order lost.
                        rows.reverse();
                    }
                    self.produce_all(&rows).await?;
                    let ids: Vec<uuid::Uuid> = rows.iter().map(|r| r.id).collect();
                    outbox::mark_published(conn, &ids).await?;
                    Ok(rows.len())
                }
                .scope_boxed()
            })
            .await;
        match &result {
            Ok(n) if *n > 0 => {
                self.metrics.outbox_published_total.inc_by(*n as u64);
                self.metrics.outbox_batch_seconds.observe(started.elapsed().as_secs_f64());
            }
            Ok(_) => {}
            Err(_) => self.metrics.outbox_publish_failures_total.inc(),
        }
        result
    }

    /// Enqueues every row, then waits for every delivery report. A row with a traceparent
    /// is published inside an `outbox.publish` span ([`publish_span`]), which passes its
    /// own traceparent on when traces are exported.
    async fn produce_all(&self, rows: &[PendingOutboxEvent]) -> Result<(), OutboxError> {
        let mut deliveries = Vec::with_capacity(rows.len());
        let mut spans = Vec::with_capacity(rows.len());
        for row in rows {
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
            let record = FutureRecord::to(&row.topic).key(&row.key).payload(&row.payload).headers(hdrs);
            match self.producer.send_result(record) {
                Ok(delivery) => deliveries.push((row.id, row.created_at, delivery)),
                Err((source, _)) => {
                    if let Some(span) = &span {
                        span.record("outcome", "enqueue_failed");
                    }
                    return Err(OutboxError::Enqueue { event_id: row.id, source });
                }
            }
            spans.push(span);
        }
        let ids_and_times: Vec<_> = deliveries.iter().map(|(id, at, _)| (*id, *at)).collect();
        let reports = join_all(deliveries.into_iter().map(|(_, _, d)| d)).await;
        let now = Utc::now();
        for (((event_id, created_at), report), span) in ids_and_times.into_iter().zip(reports).zip(spans) {
            let outcome = |label: &'static str| {
                if let Some(span) = &span {
                    span.record("outcome", label);
                }
            };
            match report {
                Ok(Ok(_)) => {
                    outcome("published");
                    let age = (now - created_at).num_microseconds().unwrap_or(0) as f64 / 1e6;
                    self.metrics.outbox_commit_to_ack_seconds.observe(age.max(0.0));
                }
                Ok(Err((source, _))) => {
                    outcome("delivery_failed");
                    return Err(OutboxError::Delivery { event_id, source });
                }
                Err(_) => {
                    outcome("canceled");
                    return Err(OutboxError::Canceled(event_id));
                }
            }
        }
        Ok(())
    }

    /// Deletes rows published longer than `retention` ago, in bounded chunks. Returns the
    /// number deleted.
    ///
    /// # Errors
    /// When the database fails.
    pub async fn delete_published(&self, retention: Duration) -> Result<u64, OutboxError> {
        let mut conn = self.pool.get().await.map_err(|e| OutboxError::Pool(e.to_string()))?;
        let total = outbox::delete_published(&mut conn, retention).await?;
        self.metrics.outbox_deleted_total.inc_by(total);
        Ok(total)
    }
}

/// The `outbox.publish` hop span of `row`, from enqueueing its record to the broker's
/// acknowledgement, with the transfer id of a transfer event (read from the payload only
/// when traces are exported: a span enabled for logs alone does not pay for the parse).
fn publish_span(row: &PendingOutboxEvent) -> tracing::Span {
    let span = tracing::info_span!(
        "outbox.publish",
        trace_id = Empty,
        transfer.id = Empty,
        messaging.destination.name = row.topic.as_str(),
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

/// Pending rows per topic with the age of the oldest (for `/admin/outbox` and gauges).
///
/// # Errors
/// When the database fails.
pub async fn pending_by_topic(pool: &PgPool) -> Result<Vec<PendingStats>, OutboxError> {
    let mut conn = pool.get().await.map_err(|e| OutboxError::Pool(e.to_string()))?;
    Ok(outbox::pending_by_topic(&mut conn).await?)
}

/// Refreshes the outbox gauges from the database.
///
/// # Errors
/// When the database fails.
pub async fn refresh_gauges(pool: &PgPool, metrics: &Metrics) -> Result<Vec<PendingStats>, OutboxError> {
    let stats = pending_by_topic(pool).await?;
    metrics.outbox_pending.set(stats.iter().map(|s| s.pending).sum());
    metrics.outbox_oldest_pending_age_seconds.set(stats.iter().map(|s| s.oldest_age_seconds).fold(0.0, f64::max));
    metrics.outbox_pending_by_topic.reset();
    for s in &stats {
        metrics.outbox_pending_by_topic.with_label_values(&[&s.topic]).set(s.pending as f64);
    }
    Ok(stats)
}
