//! Committed offsets against effects: after quiescence every consumer group of tally has
//! committed past the last record of each partition it consumes, so nothing is left
//! behind for a later start to redo or lose.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::{ClientConfig, Offset, TopicPartitionList};
use tally_integration_tests::{read_topic, Deadline, TestEnv};
use tally_schema::topics;

use super::checks::Check;

/// The groups and the topics each consumes, from tally's default configuration. Antifraud
/// is not among them: it commits its offsets inside its transactions, and the embedded
/// broker answers `TxnOffsetCommit` without storing the offsets (its output is checked
/// instead: one decision per transfer).
pub(super) fn groups() -> Vec<(String, Vec<String>)> {
    let c = tally_engine::Config::default();
    let t = &c.kafka.topics;
    let outcomes = vec![t.transfers_settled.clone(), t.transfers_rejected.clone()];
    let mut groups = vec![
        (c.ledger.group_id.clone(), vec![t.transfers_analyzed.clone()]),
        (c.projection.group_id.clone(), outcomes.clone()),
        (c.orders.group_id.clone(), vec![t.orders_received.clone()]),
        (c.notifications.group_id.clone(), outcomes.clone()),
    ];
    for delay in c.notifications.delays_ms() {
        let retries = outcomes.iter().map(|o| topics::retry(o, delay)).collect();
        groups.push((format!("{}-retry-{delay}", c.notifications.group_id), retries));
    }
    groups
}

/// Waits up to 30 s (consumers commit every few seconds) for every group to be at the end
/// of its partitions, then reports those that are not.
pub(super) async fn at_the_end(env: &TestEnv) -> Check {
    let groups = groups();
    // The offset after each partition's last record (control records of transactions
    // may follow it: a committed offset between the two is at the end).
    let mut ends: HashMap<(String, i32), i64> = HashMap::new();
    for topic in groups.iter().flat_map(|(_, t)| t).collect::<std::collections::HashSet<_>>() {
        for r in read_topic(env.bootstrap(), topic, Deadline::secs(30)).await.expect("read a consumed topic") {
            let end = ends.entry((topic.clone(), r.partition)).or_default();
            *end = (*end).max(r.offset + 1);
        }
    }
    let checked = groups.iter().map(|(_, t)| t.len()).sum();
    let started = Instant::now();
    loop {
        let (bootstrap, groups, ends) = (env.bootstrap().to_owned(), groups.clone(), ends.clone());
        let violations =
            tokio::task::spawn_blocking(move || behind(&bootstrap, &groups, &ends)).await.expect("offsets task");
        if violations.is_empty() || started.elapsed() > Duration::from_secs(30) {
            return Check { name: "every group's committed offsets at the end of its topics", checked, violations };
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// The partitions whose committed offset is before the end, as violations.
fn behind(bootstrap: &str, groups: &[(String, Vec<String>)], ends: &HashMap<(String, i32), i64>) -> Vec<String> {
    let mut violations = Vec::new();
    for (group, topics) in groups {
        let consumer: BaseConsumer = match ClientConfig::new()
            .set("bootstrap.servers", bootstrap)
            .set("group.id", group)
            .set("enable.auto.commit", "false")
            .create()
        {
            Ok(c) => c,
            Err(e) => {
                violations.push(format!("group {group}: {e}"));
                continue;
            }
        };
        let mut wanted = TopicPartitionList::new();
        for ((topic, partition), _) in ends.iter().filter(|((t, _), _)| topics.contains(t)) {
            wanted.add_partition(topic, *partition);
        }
        if wanted.count() == 0 {
            continue;
        }
        let committed = match consumer.committed_offsets(wanted, Duration::from_secs(10)) {
            Ok(c) => c,
            Err(e) => {
                violations.push(format!("group {group}: committed offsets unreadable: {e}"));
                continue;
            }
        };
        for e in committed.elements() {
            let end = ends.get(&(e.topic().to_owned(), e.partition())).copied().unwrap_or(0);
            let at = match e.offset() {
                Offset::Offset(o) => o,
                _ => -1,
            };
            if at < end {
                violations.push(format!(
                    "group {group}: {}/{} committed at {at}, its end is {end}",
                    e.topic(),
                    e.partition()
                ));
            }
        }
    }
    violations
}
