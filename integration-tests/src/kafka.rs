//! Kafka as a test sees it: reading topics back, producing as an upstream stage would,
//! committed offsets, dead-letter topics.

use std::collections::{BTreeMap, HashSet};

use super::*;

/// One Kafka record as read back by a test.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KafkaRecord {
    pub topic: String,
    pub partition: i32,
    pub offset: i64,
    pub key: Option<String>,
    pub payload: Option<Vec<u8>>,
    /// Every header in order, values as bytes (`None` for a null value).
    pub headers: Vec<(String, Option<Vec<u8>>)>,
    /// The record's timestamp in ms since the epoch (the producer's send time, unless the
    /// topic stamps append time).
    pub timestamp_ms: Option<i64>,
}

impl KafkaRecord {
    /// An owned copy of a consumed message, whatever it carries (tally's own total
    /// decoding: header names that are not UTF-8 are kept lossily).
    #[must_use]
    pub fn from_message(m: &rdkafka::message::BorrowedMessage<'_>) -> Self {
        let headers = tally_actors::consume::Record::all_headers(m);
        Self {
            topic: m.topic().to_owned(),
            partition: m.partition(),
            offset: m.offset(),
            key: m.key().map(|k| String::from_utf8_lossy(k).into_owned()),
            payload: m.payload().map(<[u8]>::to_vec),
            headers,
            timestamp_ms: m.timestamp().to_millis(),
        }
    }

    /// The first header named `name`, as UTF-8 text.
    #[must_use]
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .and_then(|(_, v)| v.as_deref())
            .and_then(|v| std::str::from_utf8(v).ok())
    }

    /// Every header value named `name`.
    #[must_use]
    pub fn headers_named(&self, name: &str) -> Vec<Option<&[u8]>> {
        self.headers.iter().filter(|(k, _)| k == name).map(|(_, v)| v.as_deref()).collect()
    }

    /// The payload parsed as JSON.
    ///
    /// # Panics
    /// When the payload is absent or not JSON.
    #[must_use]
    pub fn payload_json(&self) -> serde_json::Value {
        let bytes = self.payload.as_deref().unwrap_or_else(|| panic!("record {self:?} has no payload"));
        serde_json::from_slice(bytes).unwrap_or_else(|e| {
            panic!(
                "payload of {}/{}@{} is not JSON ({e}): {}",
                self.topic,
                self.partition,
                self.offset,
                String::from_utf8_lossy(bytes)
            )
        })
    }
}

/// Reads every record present in `topic` when called, from the beginning of every
/// partition up to its high watermark, sorted by partition and offset. Blocking; see
/// [`read_topic`] for async code.
///
/// # Errors
/// When the topic does not exist, a client call fails, or `deadline` passes first.
pub fn read_topic_blocking(bootstrap: &str, topic: &str, deadline: Deadline) -> anyhow::Result<Vec<KafkaRecord>> {
    let started = Instant::now();
    let remaining = || deadline.0.saturating_sub(started.elapsed()).max(Duration::from_millis(1));
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("group.id", format!("tally-test-reader-{}", uuid::Uuid::new_v4().simple()))
        .set("enable.auto.commit", "false")
        .set("enable.auto.offset.store", "false")
        .set("auto.offset.reset", "earliest")
        .set("log_level", "3")
        .create()
        .context("cannot create the test consumer")?;
    let metadata = consumer
        .fetch_metadata(Some(topic), remaining())
        .with_context(|| format!("cannot fetch metadata of {topic}"))?;
    let meta = metadata
        .topics()
        .iter()
        .find(|t| t.name() == topic)
        .ok_or_else(|| anyhow!("metadata lists no topic {topic}"))?;
    if let Some(err) = meta.error() {
        bail!("topic {topic}: {:?}", rdkafka::error::RDKafkaErrorCode::from(err));
    }
    let mut assignment = TopicPartitionList::new();
    let mut high: HashMap<i32, i64> = HashMap::new();
    for p in meta.partitions() {
        let (low, hi) = consumer
            .fetch_watermarks(topic, p.id(), remaining())
            .with_context(|| format!("cannot fetch watermarks of {topic}/{}", p.id()))?;
        if hi > low {
            assignment.add_partition_offset(topic, p.id(), Offset::Offset(low))?;
            high.insert(p.id(), hi);
        }
    }
    let mut records = Vec::new();
    if high.is_empty() {
        return Ok(records);
    }
    consumer.assign(&assignment).context("cannot assign partitions")?;
    while !high.is_empty() {
        if started.elapsed() >= deadline.0 {
            bail!(
                "deadline of {:?} passed reading {topic}: {} records read, partitions not at their end: {high:?}",
                deadline.0,
                records.len()
            );
        }
        match consumer.poll(Duration::from_millis(100)) {
            None => {}
            Some(Err(e)) => return Err(e).with_context(|| format!("cannot consume {topic}")),
            Some(Ok(m)) => {
                let record = KafkaRecord::from_message(&m);
                if high.get(&record.partition).is_some_and(|hi| record.offset + 1 >= *hi) {
                    high.remove(&record.partition);
                }
                records.push(record);
            }
        }
    }
    records.sort_by_key(|r| (r.partition, r.offset));
    Ok(records)
}

/// [`read_topic_blocking`] on a blocking thread.
///
/// # Errors
/// As [`read_topic_blocking`].
pub async fn read_topic(bootstrap: &str, topic: &str, deadline: Deadline) -> anyhow::Result<Vec<KafkaRecord>> {
    let (bootstrap, topic) = (bootstrap.to_owned(), topic.to_owned());
    tokio::task::spawn_blocking(move || read_topic_blocking(&bootstrap, &topic, deadline))
        .await
        .context("topic reader task failed")?
}

/// Every antifraud decision published so far, by transfer id: the distinct decisions
/// (topic, event id, score, time). The mock cluster shows the records of aborted
/// transactions too, and a redelivery publishes the same decision again, so a transfer
/// with more than one distinct decision had its decision flipped. The ledger's rejections,
/// which share `transfers.rejected`, and records that are not JSON are left out.
///
/// # Errors
/// As [`read_topic`].
pub async fn antifraud_decisions(
    bootstrap: &str,
    deadline: Deadline,
) -> anyhow::Result<BTreeMap<String, HashSet<String>>> {
    let mut decisions: BTreeMap<String, HashSet<String>> = BTreeMap::new();
    for topic in ["transfers.analyzed", "transfers.rejected"] {
        for r in read_topic(bootstrap, topic, deadline).await? {
            let Some(v) = r.payload.as_deref().and_then(|p| serde_json::from_slice::<serde_json::Value>(p).ok()) else {
                continue;
            };
            if topic == "transfers.rejected" && v["reason"] != "BLOCKED_BY_ANTIFRAUD" {
                continue;
            }
            let Some(id) = v["transferId"].as_str().map(str::to_owned) else { continue };
            let decision =
                format!("{topic} {} score {} at {}{}", v["eventId"], v["score"], v["analyzedAt"], v["rejectedAt"]);
            decisions.entry(id).or_default().insert(decision);
        }
    }
    Ok(decisions)
}

/// Waits until `topic` holds records that satisfy `done` (called with every record read
/// from the beginning), and returns them. `done` returns `Err(observation)` while not yet
/// satisfied.
///
/// # Panics
/// When `deadline` passes.
pub async fn wait_for_records<F>(bootstrap: &str, topic: &str, deadline: Deadline, mut done: F) -> Vec<KafkaRecord>
where
    F: FnMut(&[KafkaRecord]) -> Result<(), String>,
{
    let started = Instant::now();
    loop {
        let observation = match read_topic(bootstrap, topic, Deadline::secs(10)).await {
            Ok(records) => match done(&records) {
                Ok(()) => return records,
                Err(observation) => observation,
            },
            Err(e) => format!("{e:#}"),
        };
        if started.elapsed() >= deadline.0 {
            panic!(
                "timed out after {:?} waiting for the expected records on {topic}; last observation: {observation}",
                deadline.0
            );
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// An idempotent producer (acks=all) for tests that play an upstream stage.
///
/// # Panics
/// When the producer cannot be created.
pub fn producer(bootstrap: &str) -> rdkafka::producer::FutureProducer {
    rdkafka::config::ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("enable.idempotence", "true")
        .set("acks", "all")
        .create()
        .expect("test producer")
}

/// Produces one record (to `partition` when given, else by key) with `headers`; returns
/// its (partition, offset).
///
/// # Panics
/// When the broker does not acknowledge it.
pub async fn produce(
    producer: &rdkafka::producer::FutureProducer,
    topic: &str,
    partition: Option<i32>,
    key: &str,
    payload: &[u8],
    headers: &[(&str, &str)],
) -> (i32, i64) {
    use rdkafka::message::{Header, OwnedHeaders};
    let mut hdrs = OwnedHeaders::new_with_capacity(headers.len());
    for (k, v) in headers {
        hdrs = hdrs.insert(Header { key: k, value: Some(v.as_bytes()) });
    }
    let mut record = rdkafka::producer::FutureRecord::to(topic).key(key).payload(payload).headers(hdrs);
    if let Some(p) = partition {
        record = record.partition(p);
    }
    producer
        .send(record, Duration::from_secs(10))
        .await
        .map(|d| (d.partition, d.offset))
        .map_err(|(e, _)| e)
        .expect("produce")
}

/// Produces `payload` keyed by `key` to `topic` as an upstream stage would: with a fresh
/// `event-id` and `event-type` headers; returns its (partition, offset).
pub async fn produce_event(
    producer: &rdkafka::producer::FutureProducer,
    topic: &str,
    partition: Option<i32>,
    key: &str,
    payload: &[u8],
    event_type: &str,
) -> (i32, i64) {
    let event_id = uuid::Uuid::new_v4().to_string();
    produce(producer, topic, partition, key, payload, &[("event-id", &event_id), ("event-type", event_type)]).await
}

/// The committed offset (the next one to read) of `group` on `topic`/`partition`, or -1.
/// Reads without joining the group.
///
/// # Panics
/// When the offsets cannot be fetched.
#[must_use]
pub fn committed_offset(bootstrap: &str, group: &str, topic: &str, partition: i32) -> i64 {
    use rdkafka::consumer::Consumer;
    let consumer: rdkafka::consumer::BaseConsumer = rdkafka::config::ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("group.id", group)
        .create()
        .expect("offset reader");
    let mut tpl = rdkafka::TopicPartitionList::new();
    tpl.add_partition(topic, partition);
    let committed = consumer.committed_offsets(tpl, Duration::from_secs(5)).expect("committed offsets");
    match committed.find_partition(topic, partition).map(|e| e.offset()) {
        Some(rdkafka::Offset::Offset(o)) => o,
        _ => -1,
    }
}

/// Waits until `group` committed past `offset` of `topic`/`partition` (it finished it).
pub async fn wait_committed_past(bootstrap: &str, group: &str, topic: &str, partition: i32, offset: i64) {
    let (bootstrap, group, topic) = (bootstrap.to_owned(), group.to_owned(), topic.to_owned());
    wait_until(&format!("{group}: offset {offset} of {topic}/{partition} committed"), Deadline::DEFAULT, || {
        let (bootstrap, group, topic) = (bootstrap.clone(), group.clone(), topic.clone());
        async move {
            let c = tokio::task::spawn_blocking(move || committed_offset(&bootstrap, &group, &topic, partition))
                .await
                .expect("offset task");
            if c > offset {
                Ok(c)
            } else {
                Err(format!("committed {c}"))
            }
        }
    })
    .await;
}

/// The dead-letter topics of `topics` that hold records, with their record counts.
///
/// # Panics
/// When a dead-letter topic cannot be read (e.g. it does not exist).
pub async fn non_empty_dlts(bootstrap: &str, topics: &[&str]) -> Vec<(String, usize)> {
    let mut found = Vec::new();
    for topic in topics {
        let dlt = format!("{topic}-dlt");
        let records =
            read_topic(bootstrap, &dlt, Deadline::secs(10)).await.unwrap_or_else(|e| panic!("read {dlt}: {e:#}"));
        if !records.is_empty() {
            found.push((dlt, records.len()));
        }
    }
    found
}
