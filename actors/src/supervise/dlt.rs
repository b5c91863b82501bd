//! `DeadLetters`: writes a record to `<topic>-dlt` on the same partition, keeping its key,
//! value and headers and adding the `dlt-*` headers of DESIGN.md §4. The record's offset
//! completes only after the broker acknowledged the DLT write.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use rdkafka::error::KafkaError;
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::util::Timeout;
use tally_schema::{headers, topics};
use tracing::{error, warn};

use crate::consume::Record;
use crate::metrics::Metrics;

/// Why a record was not dead-lettered.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the pipeline is stopping; the record stays uncommitted and will be redelivered")]
pub struct Stopping;

pub struct DeadLetters {
    producer: FutureProducer,
    group: String,
    metrics: Metrics,
    stopping: Arc<AtomicBool>,
}

impl DeadLetters {
    #[must_use]
    pub fn new(producer: FutureProducer, group: String, metrics: Metrics, stopping: Arc<AtomicBool>) -> Self {
        Self { producer, group, metrics, stopping }
    }

    /// Writes `record` to its DLT, retrying with capped backoff until the broker
    /// acknowledges it: a record that cannot reach the DLT is never dropped. Gives up only
    /// when the pipeline stops, leaving the offset uncommitted.
    ///
    /// # Errors
    /// [`Stopping`] when the pipeline stops before the write was acknowledged.
    pub async fn publish(&self, record: &Record, kind: &str, message: &str, attempts: u32) -> Result<(), Stopping> {
        // A record read from a retry topic goes to its original topic's DLT.
        let origin = record.origin();
        let dlt = topics::dlt(&origin.topic);
        let mut wait = Duration::from_millis(200);
        loop {
            match self.try_publish(&dlt, record, kind, message, attempts).await {
                Ok(()) => {
                    self.metrics.dlt_records_total.with_label_values(&[&dlt]).inc();
                    error!(topic = %origin.topic, partition = origin.partition, offset = origin.offset, kind, attempts,
                           reason = message, "Record dead-lettered.");
                    return Ok(());
                }
                Err(e) => {
                    warn!(topic = %dlt, error = %e, "DLT write failed; retrying.");
                    if self.stopping.load(Ordering::Relaxed) {
                        return Err(Stopping);
                    }
                    tokio::time::sleep(wait).await;
                    wait = (wait * 2).min(Duration::from_secs(30));
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
/// headers of DESIGN.md §4, naming where the record was first consumed.
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
