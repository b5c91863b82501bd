//! Writing dead letters. `DeadLetters` writes a record to `<topic>-dlt` on the same partition, keeping its key,
//! value and headers and adding the `dlt-*` headers. The record's offset
//! completes only after the broker acknowledged the DLT write, or, when the DLT can never
//! take it ([`is_permanent_dlt_error`]), after it was stored in the `dead_letters` table.
//! Every write first checks the record's [`Lease`]: a revoked partition dead-letters
//! nothing more on this instance.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::util::Timeout;
use tally_schema::{headers, topics};
use tracing::{error, warn};

use crate::backoff::Backoff;
use crate::metrics::Metrics;
use crate::record::{Lease, Record};
use crate::store::dead_letters::{store_dead_letter, DeadLetterRow};
use crate::store::PgPool;

/// Why a record was not dead-lettered.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the pipeline is stopping; the record stays uncommitted and will be redelivered")]
pub struct Stopping;

#[derive(Clone)]
pub struct DeadLetters {
    producer: FutureProducer,
    group: String,
    metrics: Metrics,
    stopping: Arc<AtomicBool>,
    /// The `dead_letters` table, for records the DLT can never take.
    pool: PgPool,
}

/// Whether a DLT write failed for good: the same record to the same topic fails the same
/// way on every try, so retrying would hold its key and partition forever.
///
/// - the record is too large or malformed for the topic (`MessageSizeTooLarge`,
///   `InvalidMessageSize`, `MessageBatchTooLarge`, `InvalidRecord`, `InvalidMessage`,
///   `PolicyViolation`);
/// - the topic or partition does not exist or cannot exist (`UnknownTopic`,
///   `UnknownPartition`, `UnknownTopicOrPartition` after librdkafka's own metadata retries,
///   `InvalidTopic`);
/// - tally may not write there (`TopicAuthorizationFailed`, `ClusterAuthorizationFailed`).
///
/// Everything else (timeouts, broker down, leader changes, queue full) may pass: retried.
#[must_use]
pub fn is_permanent_dlt_error(error: &KafkaError) -> bool {
    use RDKafkaErrorCode as C;
    matches!(
        error.rdkafka_error_code(),
        Some(
            C::MessageSizeTooLarge
                | C::InvalidMessageSize
                | C::MessageBatchTooLarge
                | C::InvalidRecord
                | C::InvalidMessage
                | C::PolicyViolation
                | C::UnknownTopic
                | C::UnknownPartition
                | C::UnknownTopicOrPartition
                | C::InvalidTopic
                | C::TopicAuthorizationFailed
                | C::ClusterAuthorizationFailed
        )
    )
}

/// The waits between two tries of a DLT or `dead_letters` write: 200 ms, doubling, at
/// most 30 s.
const WRITE_BACKOFF: Backoff = Backoff::doubling(Duration::from_millis(200), Duration::from_secs(30));

impl DeadLetters {
    #[must_use]
    pub fn new(
        producer: FutureProducer,
        group: String,
        metrics: Metrics,
        stopping: Arc<AtomicBool>,
        pool: PgPool,
    ) -> Self {
        Self { producer, group, metrics, stopping, pool }
    }

    /// Whether the pipeline is stopping.
    #[must_use]
    pub fn is_stopping(&self) -> bool {
        self.stopping.load(Ordering::Relaxed)
    }

    /// Whether a write may happen now: the pipeline runs and the running record's lease
    /// (if any) is live.
    fn may_write(&self) -> bool {
        !self.is_stopping() && Lease::current_is_live()
    }

    /// Writes `record` to its DLT, retrying with capped backoff until the broker
    /// acknowledges it: a record that cannot reach the DLT is never dropped. When the DLT
    /// can never take it, stores it in the `dead_letters` table instead (retrying while the
    /// database is down). Gives up only when the pipeline stops or the record's lease ends,
    /// leaving the offset uncommitted.
    ///
    /// # Errors
    /// [`Stopping`] when the pipeline stops (or the lease ends) before the write was
    /// acknowledged.
    pub async fn publish(&self, record: &Record, kind: &str, message: &str, attempts: u32) -> Result<(), Stopping> {
        // A record read from a retry topic goes to its original topic's DLT.
        let origin = record.origin();
        let dlt = topics::dlt(&origin.topic);
        let mut waits = WRITE_BACKOFF.waits();
        loop {
            if !self.may_write() {
                return Err(Stopping);
            }
            match self.try_publish(&dlt, record, kind, message, attempts).await {
                Ok(()) => {
                    self.metrics.dlt_records_total.with_label_values(&[&dlt]).inc();
                    error!(topic = %origin.topic, partition = origin.partition, offset = origin.offset, kind, attempts,
                           reason = message, "Record dead-lettered.");
                    return Ok(());
                }
                Err(e) if is_permanent_dlt_error(&e) => {
                    warn!(topic = %dlt, offset = origin.offset, error = %e,
                          "The DLT can never take this record; storing it in dead_letters.");
                    let dlt_error = e.to_string();
                    let row =
                        DeadLetterRow { record, group: &self.group, kind, message, attempts, dlt_error: &dlt_error };
                    return self.store(&dlt, &row).await;
                }
                Err(e) => {
                    warn!(topic = %dlt, error = %e, "DLT write failed; retrying.");
                    tokio::time::sleep(waits.next_wait()).await;
                }
            }
        }
    }

    /// Stores `row` in `dead_letters`, retrying with capped backoff while the database
    /// fails (never dropped), until stopped.
    async fn store(&self, dlt: &str, row: &DeadLetterRow<'_>) -> Result<(), Stopping> {
        let origin = row.record.origin();
        let mut waits = WRITE_BACKOFF.waits();
        loop {
            if !self.may_write() {
                return Err(Stopping);
            }
            let stored = match self.pool.get().await {
                Ok(mut conn) => store_dead_letter(&mut conn, row).await.map_err(|e| e.to_string()),
                Err(e) => Err(e.to_string()),
            };
            match stored {
                Ok(inserted) => {
                    if inserted {
                        self.metrics.dlt_records_total.with_label_values(&[dlt]).inc();
                        self.metrics.dlt_fallback_records_total.with_label_values(&[dlt]).inc();
                    }
                    error!(topic = %origin.topic, partition = origin.partition, offset = origin.offset,
                           kind = row.kind, attempts = row.attempts, reason = row.message, dlt_error = row.dlt_error,
                           "Record dead-lettered to the dead_letters table.");
                    return Ok(());
                }
                Err(e) => {
                    warn!(topic = %dlt, offset = origin.offset, error = %e, "Cannot store the dead letter; retrying.");
                    tokio::time::sleep(waits.next_wait()).await;
                }
            }
        }
    }

    async fn try_publish(
        &self,
        dlt: &str,
        record: &Record,
        kind: &str,
        message: &str,
        attempts: u32,
    ) -> Result<(), KafkaError> {
        let hdrs = dlt_headers(record, &self.group, kind, message, attempts);
        let partition = record.origin().partition;
        let mut out: FutureRecord<'_, [u8], [u8]> = FutureRecord::to(dlt).partition(partition).headers(hdrs);
        if let Some(key) = &record.key {
            out = out.key(key.as_slice());
        }
        if let Some(payload) = &record.payload {
            out = out.payload(payload.as_slice());
        }
        self.producer.send(out, Timeout::After(Duration::from_secs(30))).await.map(|_| ()).map_err(|(e, _)| e)
    }
}

/// The original headers of `record` (without the retry machinery's) plus the `dlt-*`
/// headers, naming where the record was first consumed.
#[must_use]
pub fn dlt_headers(record: &Record, group: &str, kind: &str, message: &str, attempts: u32) -> OwnedHeaders {
    let mut hdrs = OwnedHeaders::new_with_capacity(record.headers.len() + 8);
    for (k, v) in record.headers_without_retry() {
        hdrs = hdrs.insert(Header { key: k, value: v.as_deref() });
    }
    let origin = record.origin();
    let partition = origin.partition.to_string();
    let offset = origin.offset.to_string();
    let timestamp = origin.timestamp.map(|t| t.to_string()).unwrap_or_default();
    let attempts = attempts.to_string();
    // Header values are bounded: a very long error message is cut at a character boundary.
    let mut msg_end = message.len().min(2048);
    while !message.is_char_boundary(msg_end) {
        msg_end -= 1;
    }
    for (k, v) in [
        (headers::DLT_ORIGINAL_TOPIC, origin.topic.as_str()),
        (headers::DLT_ORIGINAL_PARTITION, partition.as_str()),
        (headers::DLT_ORIGINAL_OFFSET, offset.as_str()),
        (headers::DLT_ORIGINAL_TIMESTAMP, timestamp.as_str()),
        (headers::DLT_CONSUMER_GROUP, group),
        (headers::DLT_EXCEPTION_KIND, kind),
        (headers::DLT_EXCEPTION_MESSAGE, &message[..msg_end]),
        (headers::DLT_ATTEMPTS, attempts.as_str()),
    ] {
        hdrs = hdrs.insert(Header { key: k, value: Some(v.as_bytes()) });
    }
    hdrs
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn permanent_dlt_errors() {
        use RDKafkaErrorCode as C;
        let produce = |code| KafkaError::MessageProduction(code);
        for code in [
            C::MessageSizeTooLarge,
            C::UnknownPartition,
            C::UnknownTopic,
            C::TopicAuthorizationFailed,
            C::InvalidRecord,
        ] {
            assert!(is_permanent_dlt_error(&produce(code)), "{code:?}");
        }
        for code in [C::MessageTimedOut, C::QueueFull, C::AllBrokersDown, C::NotLeaderForPartition, C::RequestTimedOut]
        {
            assert!(!is_permanent_dlt_error(&produce(code)), "{code:?}");
        }
    }
}
