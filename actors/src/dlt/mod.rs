//! Dead-letter topics, all in one place: writing a record to its DLT ([`write`], used by
//! supervision), the inventory of the DLTs of this deployment, reading their records, and
//! replaying records to their original topic. (Reading lives here with the error type;
//! writing, the inventory, replay, dry runs and the `dead_letters` table view have files
//! of their own.)
//!
//! Everything here talks to Kafka with blocking librdkafka calls bounded by a deadline;
//! HTTP handlers run it on a blocking thread (`web::block`). Reads use an `assign`ed
//! consumer that never joins a group nor commits, and stop at the high watermarks taken
//! when the request started.
//!
//! Replaying (`replay`) republishes a copy: Kafka cannot delete single records, so a replayed record
//! stays in its DLT (until retention removes it) and may be replayed again. That is safe
//! for the transfer and order pipelines, whose inbox tables (`processed_transfers`,
//! `received_orders`) absorb a second delivery.

use std::time::{Duration, Instant};

mod dry_run;
mod inventory;
mod replay;
pub mod table;
mod write;

pub use dry_run::{newer_processed, DryRun, KeySummary, Origin};
pub use inventory::{inventory, publish, DltScope, PartitionCount, TopicCount};
use inventory::{partitions_of, watermarks};
pub use replay::{prepare_replay, replay, replay_each, republish, send_all, ReplayRequest, Replayed, Republish};
pub use write::{dlt_headers, is_permanent_dlt_error, DeadLetters, Stopping};

use base64::Engine as _;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::message::Message;
use rdkafka::{Offset, TopicPartitionList};
use serde_json::{json, Value};
use tally_schema::headers;

/// Default and maximum number of records of one read (`GET /admin/dlt/{topic}`).
pub const DEFAULT_LIMIT: usize = 100;
pub const MAX_LIMIT: usize = 1000;
/// The most records one replay request may select (by watermarks, before key filtering).
pub const MAX_REPLAY: i64 = 10_000;

/// Why a DLT operation failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DltError {
    /// The Kafka client could not be created (a configuration problem).
    #[error("cannot create the Kafka client: {0}")]
    Client(#[source] KafkaError),
    /// A Kafka request failed.
    #[error("{what}: {source}")]
    Kafka {
        what: String,
        #[source]
        source: KafkaError,
    },
    /// The request deadline passed before Kafka answered everything.
    #[error("deadline of {0:?} passed while {1}")]
    Timeout(Duration, String),
    /// A parameter names something that does not exist or is out of range.
    #[error("{0}")]
    BadSelection(String),
    /// A selected record lacks what a replay needs; nothing was replayed.
    #[error("record {partition}/{offset} cannot be replayed: {reason}")]
    NotReplayable { partition: i32, offset: i64, reason: String },
    /// The `dead_letters` table could not be read or updated.
    #[error("dead_letters table: {0}")]
    Database(String),
    /// Some records were republished and acknowledged, then one failed.
    #[error("replay stopped after {acked} of {selected} records were acknowledged: {source}")]
    Produce {
        acked: usize,
        selected: usize,
        #[source]
        source: KafkaError,
    },
}

impl DltError {
    /// The stable machine-readable code of this error.
    #[must_use]
    pub fn code(&self) -> &'static str {
        match self {
            Self::Client(_) => "kafka_client",
            Self::Kafka { .. } => "kafka_unavailable",
            Self::Timeout(..) => "kafka_timeout",
            Self::BadSelection(_) => "bad_selection",
            Self::NotReplayable { .. } => "dlt_record_not_replayable",
            Self::Produce { .. } => "replay_incomplete",
            Self::Database(_) => "database_unavailable",
        }
    }
}

/// A deadline for a sequence of blocking calls.
#[derive(Debug, Clone, Copy)]
pub struct Deadline {
    started: Instant,
    budget: Duration,
}

impl Deadline {
    #[must_use]
    pub fn after(budget: Duration) -> Self {
        Self { started: Instant::now(), budget }
    }

    fn remaining(&self, doing: &str) -> Result<Duration, DltError> {
        let left = self.budget.saturating_sub(self.started.elapsed());
        if left.is_zero() {
            Err(DltError::Timeout(self.budget, doing.to_owned()))
        } else {
            Ok(left)
        }
    }
}

/// One record read from a DLT topic.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DltRecord {
    pub partition: i32,
    pub offset: i64,
    pub timestamp: Option<i64>,
    pub key: Option<Vec<u8>>,
    pub payload: Option<Vec<u8>>,
    pub headers: Vec<(String, Option<Vec<u8>>)>,
}

impl DltRecord {
    /// The first header named `name`, as UTF-8.
    #[must_use]
    pub fn header_str(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .and_then(|(_, v)| v.as_deref())
            .and_then(|v| std::str::from_utf8(v).ok())
    }

    /// The JSON view of `GET /admin/dlt/{topic}`: text stays text, other bytes are base64
    /// (each value says its `encoding`), the payload is JSON when it parses.
    #[must_use]
    pub fn view(&self) -> Value {
        let hdrs: Vec<Value> = self
            .headers
            .iter()
            .map(|(k, v)| {
                let (value, encoding) = bytes_view(v.as_deref());
                json!({ "key": k, "value": value, "encoding": encoding })
            })
            .collect();
        let (key, key_encoding) = bytes_view(self.key.as_deref());
        let (payload, payload_encoding) = match self.payload.as_deref() {
            None => (Value::Null, Value::Null),
            Some(bytes) => match serde_json::from_slice::<Value>(bytes) {
                Ok(v) => (v, json!("json")),
                Err(_) => bytes_view(Some(bytes)),
            },
        };
        let number = |name: &str| self.header_str(name).and_then(|v| v.parse::<i64>().ok());
        json!({
            "partition": self.partition,
            "offset": self.offset,
            "timestampMs": self.timestamp,
            "timestamp": self.timestamp.and_then(rfc3339),
            "key": key,
            "keyEncoding": key_encoding,
            "headers": hdrs,
            "dlt": {
                "originalTopic": self.header_str(headers::DLT_ORIGINAL_TOPIC),
                "originalPartition": number(headers::DLT_ORIGINAL_PARTITION),
                "originalOffset": number(headers::DLT_ORIGINAL_OFFSET),
                "originalTimestampMs": number(headers::DLT_ORIGINAL_TIMESTAMP),
                "consumerGroup": self.header_str(headers::DLT_CONSUMER_GROUP),
                "exceptionKind": self.header_str(headers::DLT_EXCEPTION_KIND),
                "exceptionMessage": self.header_str(headers::DLT_EXCEPTION_MESSAGE),
                "attempts": number(headers::DLT_ATTEMPTS),
            },
            "payload": payload,
            "payloadEncoding": payload_encoding,
        })
    }
}

fn rfc3339(ms: i64) -> Option<String> {
    chrono::DateTime::from_timestamp_millis(ms).map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::Millis, true))
}

/// `(value, encoding)`: UTF-8 text as `"utf8"`, anything else as standard base64 with
/// padding (`"base64"`), absent as `(null, null)`.
#[must_use]
pub fn bytes_view(bytes: Option<&[u8]>) -> (Value, Value) {
    match bytes {
        None => (Value::Null, Value::Null),
        Some(b) => match std::str::from_utf8(b) {
            Ok(s) => (json!(s), json!("utf8")),
            Err(_) => (json!(base64::engine::general_purpose::STANDARD.encode(b)), json!("base64")),
        },
    }
}

/// Which records to read: a partition (default all), a start offset in each selected
/// partition (default its low watermark), an inclusive end offset (default the last
/// record at request time), and at most `limit` records (`None`: no limit).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Selection {
    pub partition: Option<i32>,
    pub from_offset: Option<i64>,
    pub to_offset: Option<i64>,
    pub limit: Option<usize>,
}

/// Records of `topic` within `selection`, by partition then offset, and where to continue
/// (`Some((partition, offset))`) when `limit` cut the read short.
pub struct Page {
    pub records: Vec<DltRecord>,
    pub next: Option<(i32, i64)>,
}

/// The partitions `selection` covers with their `[start, end)` offset ranges, by
/// watermarks taken now.
///
/// # Errors
/// [`DltError::BadSelection`] for a partition the topic does not have; Kafka errors.
pub(crate) fn plan(
    consumer: &BaseConsumer,
    topic: &str,
    selection: &Selection,
    deadline: Deadline,
) -> Result<Vec<(i32, i64, i64)>, DltError> {
    let all = partitions_of(consumer, topic, deadline)?;
    let chosen = match selection.partition {
        Some(p) if all.contains(&p) => vec![p],
        Some(p) => {
            return Err(DltError::BadSelection(format!(
                "partition {p} does not exist: {topic} has partitions 0..{}",
                all.len()
            )))
        }
        None => all,
    };
    let mut ranges = Vec::new();
    for p in chosen {
        let (low, high) = watermarks(consumer, topic, p, deadline)?;
        let start = selection.from_offset.map_or(low, |o| o.max(low));
        let end = selection.to_offset.map_or(high, |o| o.saturating_add(1).min(high));
        if start < end {
            ranges.push((p, start, end));
        }
    }
    Ok(ranges)
}

/// Reads the records of `topic` that `selection` covers.
///
/// # Errors
/// [`DltError::BadSelection`], Kafka errors, or [`DltError::Timeout`].
pub fn read(consumer: &BaseConsumer, topic: &str, selection: &Selection, deadline: Deadline) -> Result<Page, DltError> {
    let ranges = plan(consumer, topic, selection, deadline)?;
    let mut records = Vec::new();
    let mut next = None;
    for (partition, start, end) in ranges {
        if selection.limit.is_some_and(|l| records.len() >= l) {
            next = Some((partition, start));
            break;
        }
        let mut tpl = TopicPartitionList::new();
        tpl.add_partition_offset(topic, partition, Offset::Offset(start))
            .map_err(|source| DltError::Kafka { what: format!("assigning {topic}/{partition}"), source })?;
        consumer
            .assign(&tpl)
            .map_err(|source| DltError::Kafka { what: format!("assigning {topic}/{partition}"), source })?;
        let doing = format!("reading {topic}/{partition} from {start} to {end}");
        loop {
            if selection.limit.is_some_and(|l| records.len() >= l) {
                let last = records.last().map_or(start, |r: &DltRecord| r.offset + 1);
                if last < end {
                    next = Some((partition, last));
                }
                break;
            }
            let wait = deadline.remaining(&doing)?.min(Duration::from_millis(200));
            match consumer.poll(wait) {
                None => {}
                Some(Err(KafkaError::PartitionEOF(p))) if p == partition => break,
                Some(Err(KafkaError::PartitionEOF(_))) => {}
                Some(Err(source)) => return Err(DltError::Kafka { what: doing, source }),
                // A prefetched record of the previous assignment.
                Some(Ok(m)) if m.partition() != partition => {}
                Some(Ok(m)) => {
                    if m.offset() >= end {
                        break;
                    }
                    if m.offset() >= start {
                        records.push(DltRecord {
                            partition,
                            offset: m.offset(),
                            timestamp: m.timestamp().to_millis(),
                            key: m.key().map(<[u8]>::to_vec),
                            payload: m.payload().map(<[u8]>::to_vec),
                            // Read as consumed records are: anyone may write to a DLT.
                            headers: crate::record::Record::all_headers(&m),
                        });
                    }
                    if m.offset() + 1 >= end {
                        break;
                    }
                }
            }
        }
        if next.is_some() {
            break;
        }
    }
    let _ = consumer.unassign();
    Ok(Page { records, next })
}

#[cfg(test)]
pub(crate) mod fixtures;

#[cfg(test)]
mod tests {
    use super::*;

    use super::fixtures::dead;

    #[test]
    fn view_decodes_headers_and_payload() {
        let mut r = dead("poison");
        r.headers.push(("bin".into(), Some(vec![0xff, 0x00])));
        let v = r.view();
        assert_eq!(v["payload"], json!({"a": 1}));
        assert_eq!(v["payloadEncoding"], "json");
        assert_eq!(v["dlt"]["exceptionKind"], "poison");
        assert_eq!(v["dlt"]["originalOffset"], 41);
        assert_eq!(v["timestamp"], "2023-11-14T22:13:20.000Z");
        let bin = v["headers"].as_array().unwrap().iter().find(|h| h["key"] == "bin").unwrap();
        assert_eq!(bin["value"], "/wA=");
        assert_eq!(bin["encoding"], "base64");
        r.payload = Some(b"{not json".to_vec());
        assert_eq!(r.view()["payload"], "{not json");
        assert_eq!(r.view()["payloadEncoding"], "utf8");
        r.payload = Some(vec![0xc3, 0x28]);
        assert_eq!(r.view()["payloadEncoding"], "base64");
    }
}
