//! `[kafka]`: the cluster (or the embedded broker), topic creation, the librdkafka
//! pass-through properties, and the consumer group protocol. Topic names are
//! `[kafka.topics]` (module `topics`).

use super::*;
pub use tally_actors::kafka_clients::GroupProtocol;

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct KafkaConfig {
    /// `"embedded"` (an in-process librdkafka mock cluster) or a bootstrap list.
    pub brokers: String,
    /// Number of brokers of the embedded mock cluster.
    pub embedded_brokers: i32,
    pub partitions: i32,
    pub replication_factor: i32,
    /// Create missing topics (and their `-dlt` twins) when the daemon starts. Topics are
    /// looked up first; only missing ones are created. Off: missing topics are reported.
    pub create_topics: bool,
    /// Bound of the topic lookup and of topic creation at start.
    #[serde(rename = "admin_timeout_ms", with = "super::duration::ms")]
    pub admin_timeout: Duration,
    /// `retention.ms` of every topic tally creates (default 7 days; -1: keep forever).
    pub retention_ms: i64,
    /// Topic-level configs per topic name, applied when tally creates that topic, over
    /// the defaults (`min.insync.replicas = min(2, replication_factor)`, `retention.ms`).
    /// E.g. `[kafka.topic_configs."transfers.requested-dlt"]` `"retention.ms" = "-1"`.
    pub topic_configs: BTreeMap<String, BTreeMap<String, String>>,
    pub topics: TopicsConfig,
    /// librdkafka properties passed through to every client tally makes (consumers,
    /// producers, the transactional producer, admin clients, DLT readers and replays):
    /// `security.protocol`, `ssl.*`, `sasl.*`. `producer` and `consumer` win over them.
    pub common: ClientProperties,
    /// librdkafka properties passed through to every producer (and admin client).
    pub producer: ClientProperties,
    /// librdkafka properties passed through to every consumer (and DLT reader).
    pub consumer: ClientProperties,
    /// The consumer group protocol of every group member tally makes: `classic` (every
    /// broker) or `consumer` (KIP-848, Kafka 4.0+; the broker assigns partitions through
    /// heartbeats). `kafka.consumer."group.protocol"`, librdkafka's name for it, sets it
    /// too.
    pub group_protocol: GroupProtocol,
    /// A file holding the SASL password (a mounted secret): given to every client as
    /// `sasl.password` (through `common`).
    pub sasl_password_file: String,
}

impl Default for KafkaConfig {
    fn default() -> Self {
        Self {
            brokers: "embedded".into(),
            embedded_brokers: 3,
            partitions: 12,
            replication_factor: 1,
            create_topics: true,
            admin_timeout: Duration::from_millis(10_000),
            retention_ms: 7 * 24 * 3600 * 1000,
            topic_configs: BTreeMap::new(),
            topics: TopicsConfig::default(),
            common: ClientProperties::default(),
            producer: ClientProperties::default(),
            consumer: ClientProperties::default(),
            group_protocol: GroupProtocol::Classic,
            sasl_password_file: String::new(),
        }
    }
}

/// librdkafka's name of [`KafkaConfig::group_protocol`].
const GROUP_PROTOCOL_KEY: &str = "group.protocol";

/// `fetch.wait.max.ms` of consumers on the embedded broker (see [`KafkaConfig::clients`]).
pub const EMBEDDED_FETCH_WAIT_MS: &str = "5";

/// librdkafka's name of a consumer's longest wait for an empty fetch.
pub const FETCH_WAIT_KEY: &str = "fetch.wait.max.ms";

impl KafkaConfig {
    /// The builder of every Kafka client's settings, with this configuration's
    /// pass-through properties. On the embedded broker consumers wait at most 5 ms for an
    /// empty fetch (unless passed through otherwise): that broker answers a fetch only
    /// when the wait is over, even when records arrive meanwhile, so the wait is added to
    /// every hop of a record (a Kafka broker answers as soon as records arrive). It costs
    /// the idle daemon about 10% more of a core in fetch requests.
    #[must_use]
    pub fn clients(&self, bootstrap: &str) -> tally_actors::kafka_clients::KafkaClients {
        let mut consumer = (*self.consumer).clone();
        if self.is_embedded() {
            consumer.entry(FETCH_WAIT_KEY.into()).or_insert_with(|| EMBEDDED_FETCH_WAIT_MS.into());
        }
        // Group members get it from the builder; readers, which join no group, stay classic.
        consumer.remove(GROUP_PROTOCOL_KEY);
        tally_actors::kafka_clients::KafkaClients::new(bootstrap, consumer, (*self.producer).clone())
            .with_common((*self.common).clone())
            .with_group_protocol(self.effective_group_protocol())
    }

    /// The protocol group members join under: `kafka.consumer."group.protocol"` when it
    /// is set (the validation refuses a value other than `classic` or `consumer`, and a
    /// `classic` there against `kafka.group_protocol = "consumer"`), else
    /// `kafka.group_protocol`.
    #[must_use]
    pub fn effective_group_protocol(&self) -> GroupProtocol {
        self.consumer.get(GROUP_PROTOCOL_KEY).and_then(|v| GroupProtocol::parse(v)).unwrap_or(self.group_protocol)
    }

    #[must_use]
    pub fn is_embedded(&self) -> bool {
        self.brokers == "embedded"
    }

    /// The producers' `message.max.bytes` (librdkafka's default unless passed through);
    /// `None` when the configured value is not a positive integer.
    #[must_use]
    pub fn max_message_bytes(&self) -> Option<usize> {
        match self.producer.get("message.max.bytes") {
            None => Some(DEFAULT_MESSAGE_MAX_BYTES),
            Some(v) => v.trim().parse::<usize>().ok().filter(|n| *n > 0),
        }
    }
}

/// Bytes a record adds to the request body it is built from: the event's own fields (ids,
/// timestamps, score), its headers (`event-id`, `event-type`, `traceparent`) and Kafka's
/// record framing, with room to spare.
pub const RECORD_OVERHEAD_BYTES: usize = 4 * 1024;

/// librdkafka's default `message.max.bytes`.
pub(super) const DEFAULT_MESSAGE_MAX_BYTES: usize = 1_000_000;

pub(super) fn valid_topic_name(name: &str) -> bool {
    (1..=200).contains(&name.len())
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'_' || b == b'-')
}

impl KafkaConfig {
    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        if self.brokers.trim().is_empty() {
            return invalid("kafka.brokers", "must be \"embedded\" or a bootstrap list");
        }
        if !(1..=10).contains(&self.embedded_brokers) {
            return invalid("kafka.embedded_brokers", "must be between 1 and 10");
        }
        if !(1..=1000).contains(&self.partitions) {
            return invalid("kafka.partitions", "must be between 1 and 1000");
        }
        if self.replication_factor < 1 || (self.is_embedded() && self.replication_factor > self.embedded_brokers) {
            return invalid(
                "kafka.replication_factor",
                "must be at least 1 and, for the embedded broker, at most kafka.embedded_brokers",
            );
        }
        if !(Duration::from_secs(1)..=Duration::from_secs(300)).contains(&self.admin_timeout) {
            return invalid("kafka.admin_timeout_ms", "must be between 1000 and 300000");
        }
        if self.retention_ms != -1 && self.retention_ms < 60_000 {
            return invalid("kafka.retention_ms", "must be -1 (keep forever) or at least 60000 (one minute)");
        }
        self.validate_group_protocol()?;
        let topics = self.topics.all();
        if topics.iter().any(|t| !valid_topic_name(t)) {
            return invalid("kafka.topics", "names must be 1..=200 characters of [a-zA-Z0-9._-]");
        }
        let mut unique = topics.clone();
        unique.sort();
        unique.dedup();
        if unique.len() != topics.len() {
            return invalid("kafka.topics", "names must be distinct");
        }
        Ok(())
    }
}

impl KafkaConfig {
    /// The pass-through `group.protocol` names a protocol and agrees with
    /// `kafka.group_protocol`; no pass-through consumer property is one that the
    /// protocol in effect does not have (librdkafka would refuse to create the consumer).
    fn validate_group_protocol(&self) -> Result<(), ConfigError> {
        if let Some(value) = self.consumer.get(GROUP_PROTOCOL_KEY) {
            match GroupProtocol::parse(value) {
                None => return invalid("kafka.consumer", "\"group.protocol\" must be \"classic\" or \"consumer\""),
                Some(GroupProtocol::Classic) if self.group_protocol == GroupProtocol::Consumer => {
                    return invalid(
                        "kafka.group_protocol",
                        "is \"consumer\" but kafka.consumer.\"group.protocol\" is \"classic\": set one of them",
                    );
                }
                Some(_) => {}
            }
        }
        let protocol = self.effective_group_protocol();
        let foreign: Vec<String> = protocol
            .foreign_properties()
            .iter()
            .filter(|(key, _)| self.consumer.contains_key(*key))
            .map(|(key, why)| format!("\"{key}\" ({why})"))
            .collect();
        if foreign.is_empty() {
            return Ok(());
        }
        invalid(
            "kafka.consumer",
            format!(
                "sets properties that do not apply under the {} group protocol: {}. Remove them, or choose the \
                 other protocol with kafka.group_protocol",
                protocol.name(),
                foreign.join("; ")
            ),
        )
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;

    #[test]
    #[allow(clippy::result_large_err)] // figment::Jail's closure type, not ours
    fn security_settings_under_common_reach_every_client_and_never_print() {
        figment::Jail::expect_with(|jail| {
            jail.create_file(
                "tally.toml",
                "[kafka]\nbrokers = \"k1:9093\"\n[kafka.common]\n\"security.protocol\" = \"SASL_SSL\"\n\
                 \"sasl.mechanism\" = \"SCRAM-SHA-512\"\n\"sasl.username\" = \"tally\"\n\
                 [kafka.consumer]\n\"sasl.username\" = \"tally-reader\"\n",
            )?;
            jail.set_env("TALLY__KAFKA__COMMON__SASL.PASSWORD", "hunter-scram");
            jail.set_env("TALLY__KAFKA__COMMON__SSL.CA.LOCATION", "/etc/kafka/ca.pem");
            let c = Config::load(Some(Path::new("tally.toml"))).map_err(|e| e.to_string())?;
            let clients = c.kafka.clients("k1:9093");
            let timeout = Duration::from_secs(1);
            for (kind, client) in [
                ("group member", clients.group_consumer("ledger")),
                ("reader", clients.reader("tally-dlt-admin", None)),
                ("producer", clients.producer("tally-outbox", timeout)),
                ("transactional producer", clients.transactional_producer("tally-antifraud", "t", timeout)),
                ("admin client", clients.admin("tally-topics")),
            ] {
                assert_eq!(client.get("security.protocol"), Some("SASL_SSL"), "{kind}");
                assert_eq!(client.get("sasl.password"), Some("hunter-scram"), "{kind}");
                assert_eq!(client.get("ssl.ca.location"), Some("/etc/kafka/ca.pem"), "{kind}");
            }
            assert_eq!(clients.group_consumer("ledger").get("sasl.username"), Some("tally-reader"));
            assert_eq!(clients.admin("tally-topics").get("sasl.username"), Some("tally"));
            let shown = c.to_redacted_toml();
            assert!(!shown.contains("hunter") && !format!("{c:?}").contains("hunter"), "{shown}");
            assert!(shown.contains(r#""sasl.password" = "<redacted>""#), "{shown}");
            assert!(shown.contains(r#""security.protocol" = "SASL_SSL""#), "{shown}");
            Ok(())
        });
    }

    #[test]
    #[allow(clippy::result_large_err)] // figment::Jail's closure type, not ours
    fn the_sasl_password_file_is_refused_beside_a_password_anywhere() {
        figment::Jail::expect_with(|jail| {
            jail.create_file("pw", "hunter\n")?;
            for section in ["common", "producer", "consumer"] {
                jail.create_file(
                    "tally.toml",
                    &format!("[kafka]\nsasl_password_file = \"pw\"\n[kafka.{section}]\n\"sasl.password\" = \"x\"\n"),
                )?;
                let e = Config::load(Some(Path::new("tally.toml"))).map(|_| ()).unwrap_err().to_string();
                assert!(e.contains("kafka.sasl_password_file"), "{section}: {e}");
            }
            Ok(())
        });
    }
}
