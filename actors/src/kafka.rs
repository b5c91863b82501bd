//! Every Kafka client's settings, built in one place. Each client is three layers, in
//! this order, later ones winning:
//!
//! 1. tally's defaults for the role (session and heartbeat, fetch waits, acks, linger,
//!    compression), which an operator may change;
//! 2. the operator's pass-through properties (`kafka.consumer.*`, `kafka.producer.*`);
//! 3. what the role needs to be correct (group id, offset storage, idempotence,
//!    `transactional.id`, isolation level), which nothing may change: the role sets them
//!    after this builder hands the configuration over.

use std::collections::BTreeMap;
use std::time::Duration;

use rdkafka::config::RDKafkaLogLevel;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::ClientConfig;

/// Where the clients connect and the operator's pass-through properties. `Debug` shows
/// the properties' keys only: their values may be credentials.
#[derive(Clone, Default)]
pub struct KafkaClients {
    bootstrap: String,
    consumer: BTreeMap<String, String>,
    producer: BTreeMap<String, String>,
    /// `<instance id>` when consumers join as static members (`group.instance.id`).
    static_member: Option<String>,
}

impl std::fmt::Debug for KafkaClients {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KafkaClients")
            .field("bootstrap", &self.bootstrap)
            .field("consumer", &self.consumer.keys().collect::<Vec<_>>())
            .field("producer", &self.producer.keys().collect::<Vec<_>>())
            .field("static_member", &self.static_member)
            .finish()
    }
}

impl KafkaClients {
    #[must_use]
    pub fn new(bootstrap: &str, consumer: BTreeMap<String, String>, producer: BTreeMap<String, String>) -> Self {
        Self { bootstrap: bootstrap.to_owned(), consumer, producer, static_member: None }
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
        c
    }

    fn layer(mut c: ClientConfig, pass_through: &BTreeMap<String, String>) -> ClientConfig {
        for (k, v) in pass_through {
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
            .set("session.timeout.ms", "10000")
            .set("heartbeat.interval.ms", "1000")
            // Prefetch per partition, bounded; librdkafka 2.x then waits
            // fetch.queue.backoff.ms (default 1 s) before fetching that partition again,
            // which starves a fast pipeline: keep the back-off short.
            .set("queued.min.messages", "10000")
            .set("fetch.queue.backoff.ms", "5")
            // librdkafka waits up to 500 ms for an empty fetch by default; the mock broker
            // does not answer early when data arrives, which adds that wait per hop (the
            // engine lowers it further on its embedded broker).
            .set("fetch.wait.max.ms", "25")
            // Incremental cooperative rebalancing (KIP-429): a rebalance revokes only the
            // partitions that change owner; the others are not drained or re-fetched, and
            // pause fetching only while the moving ones drain. (Eager assignment revokes
            // every partition of every member on each rebalance.)
            .set("partition.assignment.strategy", "cooperative-sticky")
            .set_log_level(RDKafkaLogLevel::Warning);
        let mut c = Self::layer(c, &self.consumer);
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
        let mut c = Self::layer(self.base(client_id), &self.consumer);
        c.set("log_level", "3")
            .set("group.id", group.unwrap_or(client_id))
            .set("enable.auto.commit", "false")
            .set("enable.auto.offset.store", "false")
            .set("enable.partition.eof", "true")
            .set("auto.offset.reset", "earliest");
        c
    }

    /// A producer: idempotent, acks=all, zstd, linger 1 ms; a record not acknowledged
    /// within `message_timeout` fails.
    #[must_use]
    pub fn producer(&self, client_id: &str, message_timeout: Duration) -> ClientConfig {
        let mut c = self.producer_defaults(client_id);
        c.set("enable.idempotence", "true").set("message.timeout.ms", message_timeout.as_millis().to_string());
        Self::layer(c, &self.producer)
    }

    /// A transactional producer with `transactional_id`; a transaction open longer than
    /// `timeout` is aborted by the coordinator.
    #[must_use]
    pub fn transactional_producer(&self, client_id: &str, transactional_id: &str, timeout: Duration) -> ClientConfig {
        let mut defaults = self.producer_defaults(client_id);
        // A transaction's records are produced in one burst, then committed at once:
        // lingering would only hold the commit back.
        defaults.set("linger.ms", "0");
        let mut c = Self::layer(defaults, &self.producer);
        c.set("transactional.id", transactional_id)
            .set("enable.idempotence", "true")
            .set("transaction.timeout.ms", timeout.as_millis().to_string());
        c
    }

    fn producer_defaults(&self, client_id: &str) -> ClientConfig {
        let mut c = self.base(client_id);
        c.set("acks", "all").set("compression.type", "zstd").set("linger.ms", "1");
        c
    }

    /// A client for metadata and the Admin API, with the producer's pass-through
    /// properties (security settings live there).
    #[must_use]
    pub fn admin(&self, client_id: &str) -> ClientConfig {
        Self::layer(self.base(client_id), &self.producer)
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
    fn debug_shows_no_property_values() {
        let secret = BTreeMap::from([("sasl.password".into(), "s3cret".into())]);
        let shown = format!("{:?}", KafkaClients::new("b:9092", secret.clone(), secret));
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
