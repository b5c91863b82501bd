//! The DLT topics of this deployment and their record counts (`GET /admin/dlt`, and the
//! `tally_dlt_topic_records` gauges).

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use serde::Serialize;
use tally_schema::topics;

use super::{Deadline, DltError};
use crate::kafka_clients::KafkaClients;

/// What the DLT administration works on: the Kafka clients of this deployment and the
/// source topics whose dead letters it manages.
#[derive(Debug, Clone)]
pub struct DltScope {
    pub clients: KafkaClients,
    pub sources: Vec<String>,
}

impl DltScope {
    /// The DLT topics: the `-dlt` twin of every source topic, each with its source.
    #[must_use]
    pub fn dlt_topics(&self) -> Vec<(String, String)> {
        self.sources.iter().map(|s| (topics::dlt(s), s.clone())).collect()
    }

    /// The source topic of `dlt` when `dlt` is one of this scope's DLT topics.
    #[must_use]
    pub fn source_of(&self, dlt: &str) -> Option<String> {
        self.dlt_topics().into_iter().find(|(d, _)| d == dlt).map(|(_, s)| s)
    }

    /// An `assign`-only consumer: no group membership, no commits, `partition EOF` events
    /// on.
    ///
    /// # Errors
    /// [`DltError::Client`] when librdkafka rejects the configuration.
    pub fn reader(&self) -> Result<BaseConsumer, DltError> {
        self.clients.reader("tally-dlt-admin", None).create().map_err(DltError::Client)
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
pub(super) fn partitions_of(consumer: &BaseConsumer, topic: &str, deadline: Deadline) -> Result<Vec<i32>, DltError> {
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

pub(super) fn watermarks(
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
pub fn inventory(consumer: &BaseConsumer, scope: &DltScope, deadline: Deadline) -> Result<Vec<TopicCount>, DltError> {
    let mut out = Vec::new();
    for (topic, source) in scope.dlt_topics() {
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
pub fn publish(counts: &[TopicCount], metrics: &crate::Metrics) {
    for t in counts {
        metrics.dlt_topic_records.with_label_values(&[&t.topic]).set(t.records);
    }
}
