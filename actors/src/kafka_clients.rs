//! Every Kafka client's settings, built in one place. Each client is three layers, in
//! this order, later ones winning:
//!
//! 1. tally's defaults for the role (session and heartbeat, fetch waits, acks, linger,
//!    compression), which an operator may change; under the `consumer` group protocol
//!    (KIP-848) the broker defines session, heartbeat and assignment, so members get none
//!    of those;
//! 2. the operator's pass-through properties: `kafka.common.*` for every client (where
//!    `security.protocol`, `ssl.*` and `sasl.*` belong), then `kafka.consumer.*` or
//!    `kafka.producer.*` by role;
//! 3. what the role needs to be correct (group id, offset storage, idempotence,
//!    `transactional.id`, isolation level, `group.protocol`), which nothing may change:
//!    the role sets them after this builder hands the configuration over.

use std::collections::BTreeMap;
use std::time::Duration;

use rdkafka::config::RDKafkaLogLevel;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::ClientConfig;

/// The consumer group protocol of tally's group members (librdkafka's `group.protocol`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum GroupProtocol {
    /// The protocol every broker speaks: members join, and the group leader assigns
    /// (cooperative-sticky, incremental) after a group-wide join round.
    #[default]
    Classic,
    /// KIP-848 (Kafka 4.0+): the broker's coordinator assigns partitions member by member
    /// through heartbeats, with no group-wide round; session, heartbeat and assignor are
    /// the broker's settings.
    Consumer,
}

impl GroupProtocol {
    /// Its name in librdkafka's `group.protocol`.
    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            Self::Classic => "classic",
            Self::Consumer => "consumer",
        }
    }

    /// `name` as `group.protocol` spells it (`classic` or `consumer`).
    #[must_use]
    pub fn parse(name: &str) -> Option<Self> {
        match name.trim() {
            "classic" => Some(Self::Classic),
            "consumer" => Some(Self::Consumer),
            _ => None,
        }
    }

    /// Consumer properties that do not apply under this protocol, each with what to use
    /// instead: a member refuses to start with them (librdkafka does for `consumer`), so
    /// the configuration check names them first.
    #[must_use]
    pub fn foreign_properties(self) -> &'static [(&'static str, &'static str)] {
        match self {
            Self::Classic => &[("group.remote.assignor", "it applies under the consumer group protocol only")],
            Self::Consumer => &[
                ("session.timeout.ms", "the broker defines it (group.consumer.session.timeout.ms)"),
                ("heartbeat.interval.ms", "the broker defines it (group.consumer.heartbeat.interval.ms)"),
                (
                    "partition.assignment.strategy",
                    "the broker assigns; choose its assignor with \"group.remote.assignor\" (uniform or range)",
                ),
                ("group.protocol.type", "the consumer group protocol has no protocol type"),
            ],
        }
    }
}

/// Where the clients connect and the operator's pass-through properties. `Debug` shows
/// the properties' keys only: their values may be credentials.
///
/// Every Kafka client tally makes takes its settings from one of the methods here (group
/// members, readers, producers, transactional producers, admin clients), so that the
/// connection's security settings reach each of them.
#[derive(Clone, Default)]
pub struct KafkaClients {
    bootstrap: String,
    /// Properties of every client (security settings), under the role's own.
    common: BTreeMap<String, String>,
    consumer: BTreeMap<String, String>,
    producer: BTreeMap<String, String>,
    /// `<instance id>` when consumers join as static members (`group.instance.id`).
    static_member: Option<String>,
    group_protocol: GroupProtocol,
}

impl std::fmt::Debug for KafkaClients {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KafkaClients")
            .field("bootstrap", &self.bootstrap)
            .field("common", &self.common.keys().collect::<Vec<_>>())
            .field("consumer", &self.consumer.keys().collect::<Vec<_>>())
            .field("producer", &self.producer.keys().collect::<Vec<_>>())
            .field("static_member", &self.static_member)
            .field("group_protocol", &self.group_protocol)
            .finish()
    }
}

impl KafkaClients {
    #[must_use]
    pub fn new(bootstrap: &str, consumer: BTreeMap<String, String>, producer: BTreeMap<String, String>) -> Self {
        Self {
            bootstrap: bootstrap.to_owned(),
            common: BTreeMap::new(),
            consumer,
            producer,
            static_member: None,
            group_protocol: GroupProtocol::Classic,
        }
    }

    /// Every client also gets `common` (`security.protocol`, `ssl.*`, `sasl.*`, ...),
    /// layered under the role's own pass-through properties.
    #[must_use]
    pub fn with_common(mut self, common: BTreeMap<String, String>) -> Self {
        self.common = common;
        self
    }

    /// Group members join under `protocol` (classic unless set).
    #[must_use]
    pub fn with_group_protocol(mut self, protocol: GroupProtocol) -> Self {
        self.group_protocol = protocol;
        self
    }

    #[must_use]
    pub fn group_protocol(&self) -> GroupProtocol {
        self.group_protocol
    }

    /// Consumers of pipeline `name` join as static member `<instance_id>-<name>`.
    #[must_use]
    pub fn with_static_membership(mut self, instance_id: &str) -> Self {
        self.static_member = Some(instance_id.to_owned());
        self
    }

    #[must_use]
    pub fn bootstrap(&self) -> &str {
        &self.bootstrap
    }

    fn base(&self, client_id: &str) -> ClientConfig {
        let mut c = ClientConfig::new();
        c.set("bootstrap.servers", &self.bootstrap).set("client.id", client_id);
        // Over TLS, the broker's certificate is checked against the system's roots, found
        // at their usual paths: the OpenSSL built into librdkafka looks for them under its
        // own build-time directory, which no distribution uses. Plaintext clients ignore it.
        c.set("ssl.ca.location", "probe");
        c
    }

    /// `c` with the common pass-through properties, then the role's (`pass_through`).
    fn layer(&self, mut c: ClientConfig, pass_through: &BTreeMap<String, String>) -> ClientConfig {
        for (k, v) in self.common.iter().chain(pass_through) {
            c.set(k, v);
        }
        c
    }

    /// A group member of pipeline `name`: offsets committed in the background from what
    /// the pipeline stores (the caller sets `group.id` and `enable.auto.offset.store`).
    #[must_use]
    pub fn group_consumer(&self, name: &str) -> ClientConfig {
        let mut c = self.base(&format!("tally-{name}"));
        c.set("enable.auto.commit", "true")
            .set("auto.commit.interval.ms", "1000")
            .set("auto.offset.reset", "earliest")
            .set("statistics.interval.ms", "5000")
            // Prefetch per partition, bounded; librdkafka 2.x then waits
            // fetch.queue.backoff.ms (default 1 s) before fetching that partition again,
            // which starves a fast pipeline: keep the back-off short.
            .set("queued.min.messages", "10000")
            .set("fetch.queue.backoff.ms", "5")
            // librdkafka waits up to 500 ms for an empty fetch by default; the mock broker
            // does not answer early when data arrives, which adds that wait per hop (the
            // engine lowers it further on its embedded broker).
            .set("fetch.wait.max.ms", "25")
            .set_log_level(RDKafkaLogLevel::Warning);
        if self.group_protocol == GroupProtocol::Classic {
            // Incremental cooperative rebalancing (KIP-429): a rebalance revokes only the
            // partitions that change owner; the others are not drained or re-fetched, and
            // pause fetching only while the moving ones drain. (Eager assignment revokes
            // every partition of every member on each rebalance.) The consumer protocol
            // is incremental by itself, and the broker holds these settings there.
            c.set("session.timeout.ms", "10000")
                .set("heartbeat.interval.ms", "1000")
                .set("partition.assignment.strategy", "cooperative-sticky");
        }
        let mut c = self.layer(c, &self.consumer);
        c.set("group.protocol", self.group_protocol.name());
        // After the pass-through: one id shared by several members would fence them all.
        if let Some(instance) = &self.static_member {
            c.set("group.instance.id", format!("{instance}-{name}"));
        }
        c
    }

    /// An `assign`-only reader: no group membership, never commits, partition EOF events
    /// on. With `group`, it may read that group's committed offsets (which does not join
    /// the group).
    #[must_use]
    pub fn reader(&self, client_id: &str, group: Option<&str>) -> ClientConfig {
        let mut c = self.layer(self.base(client_id), &self.consumer);
        c.set("log_level", "3")
            .set("group.id", group.unwrap_or(client_id))
            .set("enable.auto.commit", "false")
            .set("enable.auto.offset.store", "false")
            .set("enable.partition.eof", "true")
            .set("auto.offset.reset", "earliest");
        c
    }

    /// A producer: idempotent, acks=all, lz4, linger 1 ms; a record not acknowledged
    /// within `message_timeout` fails.
    #[must_use]
    pub fn producer(&self, client_id: &str, message_timeout: Duration) -> ClientConfig {
        let mut c = self.producer_defaults(client_id);
        c.set("enable.idempotence", "true").set("message.timeout.ms", message_timeout.as_millis().to_string());
        self.layer(c, &self.producer)
    }

    /// A transactional producer with `transactional_id`; a transaction open longer than
    /// `timeout` is aborted by the coordinator.
    #[must_use]
    pub fn transactional_producer(&self, client_id: &str, transactional_id: &str, timeout: Duration) -> ClientConfig {
        let mut defaults = self.producer_defaults(client_id);
        // A transaction's records are produced in one burst, then committed at once:
        // lingering would only hold the commit back.
        defaults.set("linger.ms", "0");
        let mut c = self.layer(defaults, &self.producer);
        c.set("transactional.id", transactional_id)
            .set("enable.idempotence", "true")
            .set("transaction.timeout.ms", timeout.as_millis().to_string());
        c
    }

    fn producer_defaults(&self, client_id: &str) -> ClientConfig {
        let mut c = self.base(client_id);
        // lz4 rather than zstd: tally's batches are a few small records, and zstd sets up
        // a compression context of its own for each (13-15% of the daemon's CPU per transfer at
        // 1,000 transfers/s); `compression.type` under `[kafka.producer]` chooses another.
        c.set("acks", "all").set("compression.type", "lz4").set("linger.ms", "1");
        c
    }

    /// A client for metadata and the Admin API, with the producer's pass-through
    /// properties.
    #[must_use]
    pub fn admin(&self, client_id: &str) -> ClientConfig {
        self.layer(self.base(client_id), &self.producer)
    }
}

/// Logs an error a group consumer's poll returned. A member whose assignment strategy
/// the group does not share (instances from before cooperative assignment still running)
/// is refused until they are gone: that is said as an error, with what to do.
pub fn log_consumer_error(pipeline: &str, e: &KafkaError) {
    if e.rdkafka_error_code() == Some(RDKafkaErrorCode::InconsistentGroupProtocol) {
        tracing::error!(
            pipeline,
            error = %e,
            "The consumer group refuses this member's partition.assignment.strategy: instances with \
             another strategy (eager assignment, before cooperative-sticky) are still members. Stop them, \
             or set kafka.consumer.\"partition.assignment.strategy\" to the group's strategy on this one."
        );
    } else {
        tracing::warn!(pipeline, error = %e, "Consumer error.");
    }
}

/// Why a consumer is unusable, when librdkafka gave it up after a fatal error: the
/// stage then starts a new one (after a backoff). Under the consumer group protocol the
/// likely causes are named with what to do.
#[must_use]
pub fn fatal_consumer_error<C: rdkafka::ClientContext>(client: &rdkafka::client::Client<C>) -> Option<String> {
    let (code, reason) = client.fatal_error()?;
    let advice = match code {
        RDKafkaErrorCode::UnsupportedVersion | RDKafkaErrorCode::UnsupportedFeature => {
            ": the broker does not speak the consumer group protocol (KIP-848 needs Kafka 4.0 or later with \
             group.coordinator.rebalance.protocols including consumer); set kafka.group_protocol = \"classic\""
        }
        RDKafkaErrorCode::UnreleasedInstanceId => {
            ": under the consumer group protocol the broker refuses a static member whose group.instance.id \
             another member still holds (an instance restarted before the broker expired its predecessor, after \
             group.consumer.session.timeout.ms); a new consumer tries again"
        }
        _ => "",
    };
    Some(format!("the consumer failed fatally: {reason}{advice}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn clients() -> KafkaClients {
        let consumer = BTreeMap::from([("session.timeout.ms".into(), "45000".into()), ("group.id".into(), "x".into())]);
        let producer =
            BTreeMap::from([("linger.ms".into(), "7".into()), ("enable.idempotence".into(), "false".into())]);
        KafkaClients::new("b:9092", consumer, producer)
    }

    #[test]
    fn the_operator_overrides_defaults_but_not_what_the_role_needs() {
        let c = clients().group_consumer("ledger");
        assert_eq!(c.get("group.id"), Some("x"), "the role sets its own group id after this");
        assert_eq!(c.get("session.timeout.ms"), Some("45000"));
        assert_eq!(c.get("client.id"), Some("tally-ledger"));
        assert_eq!(c.get("group.instance.id"), None);
        assert_eq!(c.get("partition.assignment.strategy"), Some("cooperative-sticky"));
        let p = clients().producer("tally-outbox", Duration::from_secs(30));
        assert_eq!((p.get("linger.ms"), p.get("acks")), (Some("7"), Some("all")));
        assert_eq!(p.get("enable.idempotence"), Some("false"), "the operator's word");
        assert_eq!(p.get("message.timeout.ms"), Some("30000"));
        let t = clients().transactional_producer("tally-antifraud", "tid", Duration::from_secs(10));
        assert_eq!((t.get("transactional.id"), t.get("transaction.timeout.ms")), (Some("tid"), Some("10000")));
        assert_eq!(t.get("enable.idempotence"), Some("true"), "transactions need it, whatever the operator says");
        assert_eq!(t.get("linger.ms"), Some("7"), "the operator's word");
        let plain = KafkaClients::new("b:9092", BTreeMap::new(), BTreeMap::new());
        let t = plain.transactional_producer("tally-antifraud", "tid", Duration::from_secs(10));
        assert_eq!(t.get("linger.ms"), Some("0"), "nothing lingers before a commit");
        assert_eq!(plain.producer("tally-outbox", Duration::from_secs(30)).get("linger.ms"), Some("1"));
        let r = clients().reader("tally-dlt-admin", None);
        assert_eq!((r.get("group.id"), r.get("enable.auto.commit")), (Some("tally-dlt-admin"), Some("false")));
    }

    #[test]
    fn every_kind_of_client_gets_the_common_properties_under_its_own() {
        let common = BTreeMap::from([
            ("security.protocol".into(), "SASL_SSL".into()),
            ("sasl.mechanism".into(), "SCRAM-SHA-512".into()),
            ("ssl.ca.location".into(), "/etc/ca.pem".into()),
            ("linger.ms".into(), "3".into()),
        ]);
        let clients = clients().with_common(common);
        let timeout = Duration::from_secs(10);
        for (kind, c) in [
            ("group member", clients.group_consumer("ledger")),
            ("reader", clients.reader("tally-dlt-admin", Some("g"))),
            ("producer", clients.producer("tally-outbox", timeout)),
            ("transactional producer", clients.transactional_producer("tally-antifraud", "tid", timeout)),
            ("admin client", clients.admin("tally-topics")),
        ] {
            assert_eq!(c.get("security.protocol"), Some("SASL_SSL"), "{kind}");
            assert_eq!(c.get("sasl.mechanism"), Some("SCRAM-SHA-512"), "{kind}");
            assert_eq!(c.get("ssl.ca.location"), Some("/etc/ca.pem"), "{kind}");
            assert_eq!(c.get("bootstrap.servers"), Some("b:9092"), "{kind}");
        }
        let p = clients.producer("tally-outbox", timeout);
        assert_eq!(p.get("linger.ms"), Some("7"), "the producer's own property wins over the common one");
        let plain = KafkaClients::new("b:9092", BTreeMap::new(), BTreeMap::new());
        assert_eq!(plain.admin("tally-topics").get("ssl.ca.location"), Some("probe"), "the system's roots");
    }

    #[test]
    fn debug_shows_no_property_values() {
        let secret = BTreeMap::from([("sasl.password".into(), "s3cret".into())]);
        let shown = format!("{:?}", KafkaClients::new("b:9092", secret.clone(), secret.clone()).with_common(secret));
        assert!(shown.contains("sasl.password") && !shown.contains("s3cret"), "{shown}");
    }

    #[test]
    fn static_members_are_named_per_pipeline() {
        let mut shared = clients();
        shared.consumer.insert("group.instance.id".into(), "same-for-all".into());
        let c = shared.with_static_membership("node-1").group_consumer("ledger");
        assert_eq!(c.get("group.instance.id"), Some("node-1-ledger"), "not the pass-through's");
    }
}
