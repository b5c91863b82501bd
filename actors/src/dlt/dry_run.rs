//! Dry runs of a replay: what would be republished, and for each dead letter how many
//! newer records of its key its consumer group already processed. A replayed record is
//! applied after those: for a transfer, after later transfers of the same account.
//!
//! For a dead letter of topic T, partition P, offset O, key K and group G: the records of
//! T/P with an offset above O and below G's committed offset whose key is K.

use std::collections::BTreeMap;

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::{Offset, TopicPartitionList};
use serde::Serialize;
use serde_json::Value;

use super::{bytes_view, read, Deadline, DltError, DltScope, Selection};

/// Records of a source partition scanned at most per dry run and partition; beyond it the
/// counts are lower bounds (`scanTruncated`).
pub const MAX_SCAN: usize = 20_000;

/// Where a dead letter came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Origin {
    pub topic: String,
    pub partition: i32,
    pub offset: Option<i64>,
    pub key: Option<Vec<u8>>,
    pub group: Option<String>,
}

/// Per original partition and key: the dead letters selected and the newer records of
/// that key already processed (after the oldest selected one).
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct KeySummary {
    pub original_topic: String,
    pub original_partition: i32,
    pub key: Value,
    pub records: usize,
    pub newer_processed: i64,
    pub consumer_group: Option<String>,
    /// The group's committed offset of the partition (`null`: none, nothing counted).
    pub committed_offset: Option<i64>,
}

/// The outcome of a dry run: per input, in order, the newer processed records of its key,
/// and the per-key summary.
#[derive(Debug, Clone, Default)]
pub struct DryRun {
    pub newer_of_each: Vec<i64>,
    pub keys: Vec<KeySummary>,
    pub scan_truncated: bool,
}

fn committed_offset(
    scope: &DltScope,
    group: &str,
    topic: &str,
    partition: i32,
    deadline: Deadline,
) -> Result<Option<i64>, DltError> {
    // Never subscribes: reading the group's committed offsets does not join the group.
    let c = scope.clients.reader("tally-dlt-dry-run", Some(group));
    let consumer: BaseConsumer = c.create().map_err(DltError::Client)?;
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition(topic, partition);
    let what = format!("fetching the committed offset of {group} on {topic}/{partition}");
    let committed = consumer
        .committed_offsets(tpl, deadline.remaining(&what)?)
        .map_err(|source| DltError::Kafka { what, source })?;
    Ok(match committed.find_partition(topic, partition).map(|e| e.offset()) {
        Some(Offset::Offset(o)) => Some(o),
        _ => None,
    })
}

/// Counts, for every origin, the processed records of its key newer than it.
///
/// # Errors
/// Kafka errors or [`DltError::Timeout`].
pub fn newer_processed(
    consumer: &BaseConsumer,
    scope: &DltScope,
    origins: &[Origin],
    deadline: Deadline,
) -> Result<DryRun, DltError> {
    // One scan per (topic, partition, group), from the oldest selected offset.
    let mut groups: BTreeMap<(String, i32, Option<String>), Vec<usize>> = BTreeMap::new();
    for (i, o) in origins.iter().enumerate() {
        groups.entry((o.topic.clone(), o.partition, o.group.clone())).or_default().push(i);
    }
    let mut out = DryRun { newer_of_each: vec![0; origins.len()], ..DryRun::default() };
    for ((topic, partition, group), members) in groups {
        let committed = match &group {
            Some(g) => committed_offset(scope, g, &topic, partition, deadline)?,
            None => None,
        };
        let oldest = members.iter().filter_map(|i| origins[*i].offset).min();
        let mut scanned: Vec<(i64, Option<Vec<u8>>)> = Vec::new();
        if let (Some(oldest), Some(committed)) = (oldest, committed) {
            if committed > oldest + 1 {
                let selection = Selection {
                    partition: Some(partition),
                    from_offset: Some(oldest + 1),
                    to_offset: Some(committed - 1),
                    limit: Some(MAX_SCAN),
                };
                let page = read(consumer, &topic, &selection, deadline)?;
                out.scan_truncated |= page.next.is_some();
                scanned = page.records.into_iter().map(|r| (r.offset, r.key)).collect();
            }
        }
        let newer = |offset: Option<i64>, key: &Option<Vec<u8>>| -> i64 {
            offset.map_or(0, |o| scanned.iter().filter(|(s, k)| *s > o && k == key).count() as i64)
        };
        let mut by_key: BTreeMap<Option<Vec<u8>>, (usize, Option<i64>)> = BTreeMap::new();
        for i in &members {
            let o = &origins[*i];
            out.newer_of_each[*i] = newer(o.offset, &o.key);
            let entry = by_key.entry(o.key.clone()).or_insert((0, o.offset));
            entry.0 += 1;
            entry.1 = match (entry.1, o.offset) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            };
        }
        for (key, (records, oldest_of_key)) in by_key {
            out.keys.push(KeySummary {
                original_topic: topic.clone(),
                original_partition: partition,
                key: bytes_view(key.as_deref()).0,
                records,
                newer_processed: newer(oldest_of_key, &key),
                consumer_group: group.clone(),
                committed_offset: committed,
            });
        }
    }
    Ok(out)
}
