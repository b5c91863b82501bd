//! DLT administration (DESIGN.md §4, §6): the inventory of the dead-letter topics of this
//! configuration, reading their records, and replaying records to their original topic.
//!
//! Everything here talks to Kafka with blocking librdkafka calls bounded by a deadline;
//! HTTP handlers run it on a blocking thread (`web::block`). Reads use an `assign`ed
//! consumer that never joins a group nor commits, and stop at the high watermarks taken
//! when the request started.
//!
//! Replaying republishes a copy: Kafka cannot delete single records, so a replayed record
//! stays in its DLT (until retention removes it) and may be replayed again. That is safe
//! for the transfer and order pipelines, whose inbox tables (`processed_transfers`,
//! `received_orders`) absorb a second delivery.

use std::time::{Duration, Instant};

use base64::Engine as _;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{Header, Headers, Message, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::{ClientConfig, Offset, TopicPartitionList};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use tally_schema::{headers, topics};

use crate::config::KafkaConfig;

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
        }
    }
}

/// The DLT topics of this configuration: the `-dlt` twin of every source topic, each with
/// its source.
#[must_use]
pub fn dlt_topics(kafka: &KafkaConfig) -> Vec<(String, String)> {
    kafka.topics.sources().into_iter().map(|s| (topics::dlt(s), s.to_owned())).collect()
}

/// The source topic of `dlt` when `dlt` is a DLT topic of this configuration.
#[must_use]
pub fn source_of(kafka: &KafkaConfig, dlt: &str) -> Option<String> {
    dlt_topics(kafka).into_iter().find(|(d, _)| d == dlt).map(|(_, s)| s)
}

/// An `assign`-only consumer: no group membership, no commits, `partition EOF` events on.
///
/// # Errors
/// [`DltError::Client`] when librdkafka rejects the configuration.
pub fn reader(kafka: &KafkaConfig, bootstrap: &str) -> Result<BaseConsumer, DltError> {
    let mut c = ClientConfig::new();
    c.set("bootstrap.servers", bootstrap).set("client.id", "tally-dlt-admin").set("log_level", "3");
    for (k, v) in &kafka.consumer {
        c.set(k, v);
    }
    // After the pass-through map: this reader must never commit or join a group.
    c.set("group.id", "tally-dlt-admin")
        .set("enable.auto.commit", "false")
        .set("enable.auto.offset.store", "false")
        .set("enable.partition.eof", "true")
        .set("auto.offset.reset", "earliest");
    c.create().map_err(DltError::Client)
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

/// Record count of one partition: `high - low`.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct PartitionCount {
    pub partition: i32,
    pub low: i64,
    pub high: i64,
    pub records: i64,
}

/// Record count of one DLT topic, summed over its partitions.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct TopicCount {
    pub topic: String,
    pub source_topic: String,
    pub records: i64,
    pub partitions: Vec<PartitionCount>,
}

/// The partition ids of `topic`, sorted.
fn partitions_of(consumer: &BaseConsumer, topic: &str, deadline: Deadline) -> Result<Vec<i32>, DltError> {
    let what = format!("fetching metadata of {topic}");
    let metadata = consumer
        .fetch_metadata(Some(topic), deadline.remaining(&what)?)
        .map_err(|source| DltError::Kafka { what: what.clone(), source })?;
    let meta = metadata.topics().iter().find(|t| t.name() == topic).ok_or_else(|| DltError::Kafka {
        what: what.clone(),
        source: KafkaError::MetadataFetch(RDKafkaErrorCode::UnknownTopicOrPartition),
    })?;
    if let Some(err) = meta.error() {
        return Err(DltError::Kafka { what, source: KafkaError::MetadataFetch(err.into()) });
    }
    let mut ids: Vec<i32> = meta.partitions().iter().map(rdkafka::metadata::MetadataPartition::id).collect();
    ids.sort_unstable();
    Ok(ids)
}

fn watermarks(
    consumer: &BaseConsumer,
    topic: &str,
    partition: i32,
    deadline: Deadline,
) -> Result<(i64, i64), DltError> {
    let what = format!("fetching watermarks of {topic}/{partition}");
    consumer
        .fetch_watermarks(topic, partition, deadline.remaining(&what)?)
        .map_err(|source| DltError::Kafka { what, source })
}

/// Record counts of every DLT topic of this configuration.
///
/// # Errors
/// When metadata or watermarks cannot be fetched before `deadline`.
pub fn inventory(
    consumer: &BaseConsumer,
    kafka: &KafkaConfig,
    deadline: Deadline,
) -> Result<Vec<TopicCount>, DltError> {
    let mut out = Vec::new();
    for (topic, source) in dlt_topics(kafka) {
        let mut partitions = Vec::new();
        for partition in partitions_of(consumer, &topic, deadline)? {
            let (low, high) = watermarks(consumer, &topic, partition, deadline)?;
            partitions.push(PartitionCount { partition, low, high, records: (high - low).max(0) });
        }
        let records = partitions.iter().map(|p| p.records).sum();
        out.push(TopicCount { topic, source_topic: source, records, partitions });
    }
    Ok(out)
}

/// Sets `tally_dlt_topic_records` from an inventory.
pub fn publish(counts: &[TopicCount], metrics: &tally_actors::Metrics) {
    for t in counts {
        metrics.dlt_topic_records.with_label_values(&[&t.topic]).set(t.records);
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
fn bytes_view(bytes: Option<&[u8]>) -> (Value, Value) {
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
fn plan(
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
                            headers: m
                                .headers()
                                .map(|h| h.iter().map(|h| (h.key.to_owned(), h.value.map(<[u8]>::to_vec))).collect())
                                .unwrap_or_default(),
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

/// The body of `POST /admin/dlt/{topic}/replay`; every field optional, offsets inclusive.
#[derive(Debug, Clone, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ReplayRequest {
    pub partition: Option<i32>,
    pub from_offset: Option<i64>,
    pub to_offset: Option<i64>,
    /// Only records whose key is exactly this (UTF-8) string.
    pub key: Option<String>,
}

impl ReplayRequest {
    /// Parses an optional JSON body: empty (or blank) means "everything".
    ///
    /// # Errors
    /// [`DltError::BadSelection`] for invalid JSON, unknown fields or inconsistent values.
    pub fn parse(body: &[u8]) -> Result<Self, DltError> {
        if body.iter().all(u8::is_ascii_whitespace) {
            return Ok(Self::default());
        }
        let req: Self =
            serde_json::from_slice(body).map_err(|e| DltError::BadSelection(format!("invalid replay body: {e}")))?;
        req.validate()?;
        Ok(req)
    }

    fn validate(&self) -> Result<(), DltError> {
        if self.partition.is_some_and(|p| p < 0) {
            return Err(DltError::BadSelection("partition must be >= 0".into()));
        }
        if self.from_offset.is_some_and(|o| o < 0) || self.to_offset.is_some_and(|o| o < 0) {
            return Err(DltError::BadSelection("fromOffset and toOffset must be >= 0".into()));
        }
        if let (Some(from), Some(to)) = (self.from_offset, self.to_offset) {
            if from > to {
                return Err(DltError::BadSelection("fromOffset must be <= toOffset".into()));
            }
        }
        Ok(())
    }

    #[must_use]
    pub fn selection(&self) -> Selection {
        Selection { partition: self.partition, from_offset: self.from_offset, to_offset: self.to_offset, limit: None }
    }

    fn matches(&self, record: &DltRecord) -> bool {
        self.key.as_deref().is_none_or(|k| record.key.as_deref() == Some(k.as_bytes()))
    }
}

/// What a replay republishes for one DLT record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Republish {
    pub topic: String,
    pub partition: i32,
    pub key: Option<Vec<u8>>,
    pub payload: Option<Vec<u8>>,
    /// The original headers (every `dlt-*` and any earlier `replayed-from` removed) plus
    /// `replayed-from: <dlt topic>/<partition>/<offset>`.
    pub headers: Vec<(String, Option<Vec<u8>>)>,
}

/// The record to republish for `record` of `dlt`, whose source topic is `source`.
///
/// # Errors
/// [`DltError::NotReplayable`] when the `dlt-original-topic` header is missing or names
/// another topic than `source`, or `dlt-original-partition` is missing or not a partition.
pub fn republish(dlt: &str, source: &str, record: &DltRecord) -> Result<Republish, DltError> {
    let refuse =
        |reason: String| DltError::NotReplayable { partition: record.partition, offset: record.offset, reason };
    let topic = record
        .header_str(headers::DLT_ORIGINAL_TOPIC)
        .ok_or_else(|| refuse(format!("no {} header", headers::DLT_ORIGINAL_TOPIC)))?;
    if topic != source {
        return Err(refuse(format!("{} is {topic}, not {source}", headers::DLT_ORIGINAL_TOPIC)));
    }
    let partition = record
        .header_str(headers::DLT_ORIGINAL_PARTITION)
        .and_then(|p| p.parse::<i32>().ok())
        .filter(|p| *p >= 0)
        .ok_or_else(|| refuse(format!("no valid {} header", headers::DLT_ORIGINAL_PARTITION)))?;
    let mut hdrs: Vec<(String, Option<Vec<u8>>)> =
        record.headers.iter().filter(|(k, _)| !k.starts_with("dlt-") && k != headers::REPLAYED_FROM).cloned().collect();
    hdrs.push((
        headers::REPLAYED_FROM.to_owned(),
        Some(format!("{dlt}/{}/{}", record.partition, record.offset).into_bytes()),
    ));
    Ok(Republish {
        topic: topic.to_owned(),
        partition,
        key: record.key.clone(),
        payload: record.payload.clone(),
        headers: hdrs,
    })
}

/// One replayed record, as answered by the replay endpoint.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct Replayed {
    pub partition: i32,
    pub offset: i64,
    pub original_topic: String,
    pub original_partition: i32,
    /// Where the copy landed.
    pub replayed_offset: i64,
}

/// Reads what `request` selects from `dlt` and the [`Republish`] of each record, in offset
/// order per partition. Nothing is produced.
///
/// # Errors
/// [`DltError::BadSelection`] when the selection covers more than [`MAX_REPLAY`] records;
/// [`DltError::NotReplayable`] when any selected record cannot be replayed; Kafka errors.
pub fn prepare_replay(
    consumer: &BaseConsumer,
    dlt: &str,
    source: &str,
    request: &ReplayRequest,
    deadline: Deadline,
) -> Result<Vec<(DltRecord, Republish)>, DltError> {
    let selection = request.selection();
    let ranges = plan(consumer, dlt, &selection, deadline)?;
    let covered: i64 = ranges.iter().map(|(_, s, e)| e - s).sum();
    if covered > MAX_REPLAY {
        return Err(DltError::BadSelection(format!(
            "the selection covers {covered} records, more than {MAX_REPLAY}: narrow it with partition, fromOffset and toOffset"
        )));
    }
    let page = read(consumer, dlt, &selection, deadline)?;
    page.records
        .into_iter()
        .filter(|r| request.matches(r))
        .map(|r| republish(dlt, source, &r).map(|p| (r, p)))
        .collect()
}

/// Produces every [`Republish`] in order (an idempotent producer keeps per-partition
/// order) and waits for every acknowledgement.
///
/// # Errors
/// [`DltError::Produce`] with the number acknowledged when a send fails.
pub async fn replay(producer: &FutureProducer, planned: &[(DltRecord, Republish)]) -> Result<Vec<Replayed>, DltError> {
    let mut pending = Vec::with_capacity(planned.len());
    for (record, out) in planned {
        let mut hdrs = OwnedHeaders::new_with_capacity(out.headers.len());
        for (k, v) in &out.headers {
            hdrs = hdrs.insert(Header { key: k, value: v.as_deref() });
        }
        let mut fr: FutureRecord<'_, [u8], [u8]> = FutureRecord::to(&out.topic).partition(out.partition).headers(hdrs);
        if let Some(key) = &out.key {
            fr = fr.key(key.as_slice());
        }
        if let Some(payload) = &out.payload {
            fr = fr.payload(payload.as_slice());
        }
        match producer.send_result(fr) {
            Ok(delivery) => pending.push((record, out, delivery)),
            Err((source, _)) => {
                // Let the enqueued ones finish, then report how far it got.
                let acked = await_all(pending).await.len();
                return Err(DltError::Produce { acked, selected: planned.len(), source });
            }
        }
    }
    let total = pending.len();
    let mut done = Vec::with_capacity(total);
    let mut failure = None;
    for (record, out, delivery) in pending {
        match delivery.await {
            Ok(Ok(d)) => done.push(Replayed {
                partition: record.partition,
                offset: record.offset,
                original_topic: out.topic.clone(),
                original_partition: d.partition,
                replayed_offset: d.offset,
            }),
            Ok(Err((e, _))) => failure = failure.or(Some(e)),
            Err(_) => failure = failure.or(Some(KafkaError::Canceled)),
        }
    }
    match failure {
        None => Ok(done),
        Some(source) => Err(DltError::Produce { acked: done.len(), selected: total, source }),
    }
}

async fn await_all(pending: Vec<(&DltRecord, &Republish, rdkafka::producer::DeliveryFuture)>) -> Vec<i64> {
    let mut acked = Vec::new();
    for (_, _, delivery) in pending {
        if let Ok(Ok(d)) = delivery.await {
            acked.push(d.offset);
        }
    }
    acked
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(headers: &[(&str, &[u8])]) -> DltRecord {
        DltRecord {
            partition: 3,
            offset: 7,
            timestamp: Some(1_700_000_000_000),
            key: Some(b"K-1".to_vec()),
            payload: Some(br#"{"a":1}"#.to_vec()),
            headers: headers.iter().map(|(k, v)| ((*k).to_owned(), Some(v.to_vec()))).collect(),
        }
    }

    fn dead(kind: &str) -> DltRecord {
        record(&[
            ("event-id", b"e-1"),
            ("replayed-from", b"old/0/0"),
            (headers::DLT_ORIGINAL_TOPIC, b"transfers.analyzed"),
            (headers::DLT_ORIGINAL_PARTITION, b"3"),
            (headers::DLT_ORIGINAL_OFFSET, b"41"),
            (headers::DLT_EXCEPTION_KIND, kind.as_bytes()),
            (headers::DLT_ATTEMPTS, b"6"),
        ])
    }

    #[test]
    fn republish_strips_dlt_headers_and_marks_the_copy() {
        let out = republish("transfers.analyzed-dlt", "transfers.analyzed", &dead("exhausted")).unwrap();
        assert_eq!(out.topic, "transfers.analyzed");
        assert_eq!(out.partition, 3);
        assert_eq!(out.key.as_deref(), Some(b"K-1".as_slice()));
        let names: Vec<&str> = out.headers.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(names, ["event-id", "replayed-from"]);
        assert_eq!(out.headers[1].1.as_deref(), Some(b"transfers.analyzed-dlt/3/7".as_slice()));
    }

    #[test]
    fn republish_refuses_records_without_or_with_foreign_origin() {
        let e = republish("x-dlt", "x", &record(&[])).unwrap_err();
        assert_eq!(e.code(), "dlt_record_not_replayable");
        let e = republish("x-dlt", "x", &dead("poison")).unwrap_err();
        assert!(e.to_string().contains("not x"), "{e}");
    }

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

    #[test]
    fn replay_request_parsing() {
        assert_eq!(ReplayRequest::parse(b"").unwrap(), ReplayRequest::default());
        assert_eq!(ReplayRequest::parse(b" \n").unwrap(), ReplayRequest::default());
        assert_eq!(ReplayRequest::parse(b"{}").unwrap(), ReplayRequest::default());
        let r = ReplayRequest::parse(br#"{"partition":1,"fromOffset":2,"toOffset":3,"key":"A"}"#).unwrap();
        assert_eq!(
            r.selection(),
            Selection { partition: Some(1), from_offset: Some(2), to_offset: Some(3), limit: None }
        );
        assert!(r.matches(&DltRecord { key: Some(b"A".to_vec()), ..record(&[]) }));
        assert!(!r.matches(&record(&[])));
        for bad in [&b"{"[..], br#"{"partition":-1}"#, br#"{"fromOffset":5,"toOffset":4}"#, br#"{"nope":1}"#] {
            assert_eq!(ReplayRequest::parse(bad).unwrap_err().code(), "bad_selection");
        }
    }
}
