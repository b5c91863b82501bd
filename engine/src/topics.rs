//! The topics and the broker at start: which topics tally needs (`topic_specs`), their
//! lookup and creation, `tally topics list`, and the check of the consumer group protocol.
//! Every Kafka client's settings are built by `tally_actors::kafka_clients::KafkaClients`.
//!
//! At start tally looks its topics up (one metadata request) and creates only the missing
//! ones, each `-dlt` twin with its source's partition count. A `-dlt` topic with fewer
//! partitions than its source stops the start: a record of a higher partition could not
//! be dead-lettered to its own partition. Creation is bounded by `kafka.admin_timeout_ms`;
//! a broker that does not create them in time (librdkafka's mock cluster never answers
//! CreateTopics) stops the start with an error naming the topics and the setting.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::{bail, Context};
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::{ClientContext, DefaultClientContext};
use rdkafka::config::RDKafkaLogLevel;
use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext};
use rdkafka::error::RDKafkaErrorCode;
use tracing::{info, warn};

use crate::broker::EmbeddedBroker;
use crate::config::{Config, GroupProtocol, KafkaConfig};

/// One topic tally needs, as it would create it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TopicSpec {
    pub name: String,
    pub partitions: i32,
    pub replication_factor: i32,
    /// Topic-level configs sent with CreateTopics.
    pub configs: BTreeMap<String, String>,
    /// The source topic, when this is its `-dlt` twin.
    pub dlt_of: Option<String>,
}

/// Every topic of `config` (sources, `-dlt` twins, notification retry topics) with the
/// configs it is created with: `min.insync.replicas = min(2, replication_factor)` (with
/// `acks=all`, a write survives the loss of a broker once there are 3 replicas),
/// `retention.ms = kafka.retention_ms`, then `kafka.topic_configs` of that topic.
#[must_use]
pub fn topic_specs(config: &Config) -> Vec<TopicSpec> {
    let kafka = &config.kafka;
    let sources = kafka.topics.sources();
    config
        .topics_to_create()
        .into_iter()
        .map(|name| {
            let mut configs = BTreeMap::from([
                ("min.insync.replicas".to_owned(), kafka.replication_factor.min(2).to_string()),
                ("retention.ms".to_owned(), kafka.retention_ms.to_string()),
            ]);
            if let Some(overrides) = kafka.topic_configs.get(&name) {
                configs.extend(overrides.iter().map(|(k, v)| (k.clone(), v.clone())));
            }
            let dlt_of = sources.iter().find(|s| tally_schema::topics::dlt(s) == name).map(|s| (*s).to_owned());
            TopicSpec {
                name,
                partitions: kafka.partitions,
                replication_factor: kafka.replication_factor,
                configs,
                dlt_of,
            }
        })
        .collect()
}

/// Why the topics as they exist cannot be used.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[non_exhaustive]
pub enum TopicError {
    /// `-dlt` topics with fewer partitions than their sources: `(dlt, its partitions,
    /// source, the source's partitions)`.
    #[error(
        "{}: a dead-letter topic needs at least its source's partitions (records keep their partition). \
         Add partitions (e.g. kafka-topics.sh --alter --topic <dlt> --partitions <n>) or delete and recreate them",
        short_dlt_list(.0)
    )]
    ShortDlt(Vec<(String, i32, String, i32)>),
}

fn short_dlt_list(short: &[(String, i32, String, i32)]) -> String {
    short
        .iter()
        .map(|(dlt, n, source, m)| format!("{dlt} has {n} partitions, fewer than {source} has {m}"))
        .collect::<Vec<_>>()
        .join("; ")
}

/// Which of `wanted` to create, given the partition counts of the topics that `existing`
/// lists. A missing `-dlt` twin gets its source's partition count (the existing one, or
/// the one it is about to be created with).
///
/// # Errors
/// [`TopicError::ShortDlt`] naming every `-dlt` topic with fewer partitions than its source.
pub fn plan_topics(wanted: &[TopicSpec], existing: &BTreeMap<String, i32>) -> Result<Vec<TopicSpec>, TopicError> {
    let partitions_of = |name: &str| {
        existing.get(name).copied().or_else(|| wanted.iter().find(|s| s.name == name).map(|s| s.partitions))
    };
    let mut create = Vec::new();
    let mut short = Vec::new();
    for spec in wanted {
        let source_partitions = spec.dlt_of.as_deref().and_then(partitions_of);
        match (existing.get(&spec.name), source_partitions) {
            (Some(&n), Some(m)) if n < m => {
                short.push((spec.name.clone(), n, spec.dlt_of.clone().unwrap_or_default(), m));
            }
            (Some(_), _) => {}
            (None, Some(m)) => create.push(TopicSpec { partitions: m, ..spec.clone() }),
            (None, None) => create.push(spec.clone()),
        }
    }
    if short.is_empty() {
        Ok(create)
    } else {
        Err(TopicError::ShortDlt(short))
    }
}

/// Partition counts of every topic on the cluster, from one metadata request.
async fn partition_counts(kafka: &KafkaConfig, bootstrap: &str) -> anyhow::Result<BTreeMap<String, i32>> {
    let config = kafka.clients(bootstrap).admin("tally-topics");
    let timeout = kafka.admin_timeout;
    let bootstrap = bootstrap.to_owned();
    tokio::task::spawn_blocking(move || {
        let client: BaseConsumer = config.create().context("cannot create the Kafka metadata client")?;
        let metadata = client.fetch_metadata(None, timeout).with_context(|| {
            format!(
                "cannot look the topics up on {bootstrap} within {} ms (kafka.admin_timeout_ms): is kafka.brokers right \
                 and the cluster up?",
                timeout.as_millis()
            )
        })?;
        Ok(metadata
            .topics()
            .iter()
            .filter(|t| t.error().is_none())
            .map(|t| (t.name().to_owned(), i32::try_from(t.partitions().len()).unwrap_or(i32::MAX)))
            .collect())
    })
    .await
    .context("the topic lookup task failed")?
}

/// `tally topics list`: every topic of `specs` with the partitions it is created with and
/// the partitions it has on the cluster at `bootstrap` (`missing` when it does not exist),
/// one line each under a header; then the topics of the cluster tally does not use, by name.
///
/// # Errors
/// When the cluster cannot be reached.
pub async fn list_topics(kafka: &KafkaConfig, specs: &[TopicSpec], bootstrap: &str) -> anyhow::Result<String> {
    let existing = partition_counts(kafka, bootstrap).await?;
    let width = specs.iter().map(|s| s.name.len()).max().unwrap_or(5).max(5);
    let mut out = format!("{:<width$}  {:>10}  {:>10}  {}\n", "TOPIC", "PARTITIONS", "ON CLUSTER", "ROLE");
    for spec in specs {
        let role = if spec.dlt_of.is_some() {
            "dead letters"
        } else if kafka.topics.sources().contains(&spec.name.as_str()) {
            "source"
        } else {
            "notification retries"
        };
        let found = existing.get(&spec.name).map_or_else(|| "missing".to_owned(), ToString::to_string);
        out.push_str(&format!("{:<width$}  {:>10}  {found:>10}  {role}\n", spec.name, spec.partitions));
    }
    let others: Vec<&str> = existing
        .keys()
        .map(String::as_str)
        .filter(|t| !t.starts_with("__") && !specs.iter().any(|s| s.name == *t))
        .collect();
    if !others.is_empty() {
        out.push_str(&format!("Other topics on the cluster: {}\n", others.join(", ")));
    }
    Ok(out)
}

/// Looks the topics of `specs` up and, when `create` is set, creates the missing ones (on
/// the embedded broker through its own API, elsewhere through the Admin API, bounded by
/// `kafka.admin_timeout_ms`). With `create` unset, missing topics are logged.
///
/// # Errors
/// When the cluster cannot be reached, a `-dlt` topic has fewer partitions than its
/// source, or a missing topic cannot be created in time.
pub async fn prepare_topics(
    kafka: &KafkaConfig,
    specs: &[TopicSpec],
    bootstrap: &str,
    embedded: Option<&EmbeddedBroker>,
    create: bool,
) -> anyhow::Result<()> {
    let existing = partition_counts(kafka, bootstrap).await?;
    let missing = plan_topics(specs, &existing)?;
    if missing.is_empty() {
        info!(topics = specs.len(), "Every topic exists.");
        return Ok(());
    }
    let names = missing.iter().map(|s| s.name.as_str()).collect::<Vec<_>>().join(", ");
    if !create {
        warn!(missing = %names, "Topics are missing and kafka.create_topics is false: create them before traffic arrives.");
        return Ok(());
    }
    if let Some(broker) = embedded {
        for spec in &missing {
            broker.create_topic_if_missing(&spec.name, spec.partitions, spec.replication_factor)?;
        }
        info!(created = missing.len(), existing = specs.len() - missing.len(), "Topics ready on the embedded broker.");
        return Ok(());
    }
    create_through_admin_api(kafka, &missing, bootstrap).await.with_context(|| {
        format!(
            "cannot create the missing topics {names} on {bootstrap}. Create them on the cluster (partitions and \
             configs as `tally config` shows; each -dlt topic with its source's partitions), then start again; or set \
             kafka.create_topics = false (TALLY__KAFKA__CREATE_TOPICS=false) to start without creating them"
        )
    })
}

/// What librdkafka logs (debug `cgrp`) when the broker lacks ConsumerGroupHeartbeat: it
/// marks the coordinator dead and looks it up again, forever, without an error to the
/// application.
const NO_HEARTBEAT_API: &str = "ConsumerGroupHeartbeatRequest not supported by broker";

/// The group protocol check's consumer context: notices [`NO_HEARTBEAT_API`] in the
/// client's log (and keeps its debug lines out of tally's).
#[derive(Default)]
struct ProtocolCheck {
    unsupported: AtomicBool,
}

impl ClientContext for ProtocolCheck {
    fn log(&self, _: RDKafkaLogLevel, _: &str, line: &str) {
        if line.contains(NO_HEARTBEAT_API) {
            self.unsupported.store(true, Ordering::Relaxed);
        }
    }
}

impl ConsumerContext for ProtocolCheck {}

/// Under the consumer group protocol, finds out whether the broker speaks it before any
/// stage joins a group: a throwaway member of group `tally-group-protocol-<instance>`
/// subscribes to `topic` and waits for its assignment (the broker answered its
/// heartbeats). A broker before Kafka 4.0 does not list ConsumerGroupHeartbeat in its
/// ApiVersions; librdkafka then never sends one and reports nothing to the application
/// (its consumers would wait for an assignment forever), only a debug line, which the
/// check watches for. Bounded by `kafka.admin_timeout_ms`; with no answer either way it
/// warns and lets the start go on. Under the classic protocol it does nothing.
///
/// # Errors
/// When the broker does not speak the consumer group protocol, with what to set instead.
pub async fn check_group_protocol(
    kafka: &KafkaConfig,
    bootstrap: &str,
    topic: &str,
    instance: &str,
) -> anyhow::Result<()> {
    if kafka.effective_group_protocol() != GroupProtocol::Consumer {
        return Ok(());
    }
    let mut config = kafka.clients(bootstrap).group_consumer("group-protocol-check");
    config
        .set("group.id", format!("tally-group-protocol-{instance}"))
        .set("enable.auto.commit", "false")
        .set("debug", "cgrp")
        .set_log_level(RDKafkaLogLevel::Debug);
    let timeout = kafka.admin_timeout;
    let topic = topic.to_owned();
    let bootstrap = bootstrap.to_owned();
    let answered = tokio::task::spawn_blocking(move || -> anyhow::Result<bool> {
        let refused = |why: &str| {
            anyhow::anyhow!(
                "kafka.group_protocol is \"consumer\" but {bootstrap} refused it: {why}. The consumer group \
                 protocol (KIP-848) needs Kafka 4.0 or later with group.coordinator.rebalance.protocols including \
                 consumer; set kafka.group_protocol = \"classic\" (and leave kafka.consumer.\"group.protocol\" out)"
            )
        };
        let member: BaseConsumer<ProtocolCheck> = config
            .create_with_context(ProtocolCheck::default())
            .context("cannot create the group protocol check's consumer")?;
        member.subscribe(&[&topic]).context("cannot subscribe the group protocol check's consumer")?;
        let deadline = std::time::Instant::now() + timeout;
        while std::time::Instant::now() < deadline {
            let _ = member.poll(Duration::from_millis(100));
            if member.context().unsupported.load(Ordering::Relaxed) {
                return Err(refused("its ApiVersions lists no ConsumerGroupHeartbeat"));
            }
            if let Some(fatal) = tally_actors::kafka_clients::fatal_consumer_error(member.client()) {
                return Err(refused(&fatal));
            }
            if member.assignment().is_ok_and(|a| a.count() > 0) {
                member.unsubscribe();
                return Ok(true);
            }
        }
        Ok(false)
    })
    .await
    .context("the group protocol check failed")??;
    if !answered {
        warn!(
            timeout_ms = timeout.as_millis() as u64,
            "Cannot tell whether the broker speaks the consumer group protocol (no assignment within \
             kafka.admin_timeout_ms); the stages join under it anyway."
        );
    }
    Ok(())
}

async fn create_through_admin_api(kafka: &KafkaConfig, missing: &[TopicSpec], bootstrap: &str) -> anyhow::Result<()> {
    let config = kafka.clients(bootstrap).admin("tally-topics");
    let admin: AdminClient<DefaultClientContext> = config.create().context("cannot create the Kafka admin client")?;
    let new_topics: Vec<NewTopic<'_>> = missing
        .iter()
        .map(|s| {
            s.configs.iter().fold(
                NewTopic::new(&s.name, s.partitions, TopicReplication::Fixed(s.replication_factor)),
                |t, (k, v)| t.set(k, v),
            )
        })
        .collect();
    let timeout = kafka.admin_timeout;
    let options = AdminOptions::new().operation_timeout(Some(timeout)).request_timeout(Some(timeout));
    let results = tokio::time::timeout(timeout + Duration::from_secs(1), admin.create_topics(&new_topics, &options))
        .await
        .map_err(|_| anyhow::anyhow!("no answer within {} ms (kafka.admin_timeout_ms)", timeout.as_millis()))?
        .map_err(|e| anyhow::anyhow!("no answer within {} ms (kafka.admin_timeout_ms): {e}", timeout.as_millis()))?;
    let mut refused = Vec::new();
    for result in results {
        match result {
            Ok(topic) => info!(topic, "Created topic."),
            Err((topic, RDKafkaErrorCode::TopicAlreadyExists)) => info!(topic, "Topic exists."),
            Err((topic, code)) => refused.push(format!("{topic}: {code}")),
        }
    }
    if !refused.is_empty() {
        bail!("the cluster refused {}", refused.join("; "));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec<'a>(specs: &'a [TopicSpec], name: &str) -> &'a TopicSpec {
        specs.iter().find(|s| s.name == name).unwrap()
    }

    #[test]
    fn topics_are_created_as_durable_as_configured() {
        let mut config = Config::default();
        config.kafka.replication_factor = 3;
        config
            .kafka
            .topic_configs
            .insert("transfers.requested-dlt".into(), BTreeMap::from([("retention.ms".into(), "-1".into())]));
        let specs = topic_specs(&config);
        let requested = spec(&specs, "transfers.requested");
        assert_eq!(requested.replication_factor, 3);
        assert_eq!(requested.configs["min.insync.replicas"], "2");
        assert_eq!(requested.configs["retention.ms"], "604800000");
        assert_eq!(requested.dlt_of, None);
        let dlt = spec(&specs, "transfers.requested-dlt");
        assert_eq!(dlt.configs["retention.ms"], "-1", "per-topic override");
        assert_eq!(dlt.dlt_of.as_deref(), Some("transfers.requested"));
        assert!(specs.iter().any(|s| s.name == "transfers.settled-retry-1000"));
        config.kafka.replication_factor = 1;
        assert_eq!(spec(&topic_specs(&config), "orders.received").configs["min.insync.replicas"], "1");
    }

    #[test]
    fn only_missing_topics_are_planned_and_dlt_twins_follow_their_source() {
        let specs = topic_specs(&Config::default());
        let mut existing: BTreeMap<String, i32> = specs.iter().map(|s| (s.name.clone(), 12)).collect();
        assert_eq!(plan_topics(&specs, &existing).unwrap(), Vec::<TopicSpec>::new());
        existing.remove("orders.received-dlt");
        existing.insert("orders.received".into(), 16);
        let planned = plan_topics(&specs, &existing).unwrap();
        assert_eq!(planned.len(), 1);
        assert_eq!((planned[0].name.as_str(), planned[0].partitions), ("orders.received-dlt", 16));
        existing.insert("orders.received-dlt".into(), 16);
        existing.insert("transfers.analyzed-dlt".into(), 2);
        let e = plan_topics(&specs, &existing).unwrap_err().to_string();
        assert!(e.contains("transfers.analyzed-dlt has 2 partitions, fewer than transfers.analyzed has 12"), "{e}");
    }
}
