//! Typed, layered configuration: built-in defaults -> optional TOML file ->
//! `TALLY__SECTION__KEY` environment variables. Validated at start-up; every error names the
//! offending key. Secrets are wrapped in [`Secret`] and never printed.
//!
//! Why one long file: every section, its defaults and its validation still live here
//! together; splitting it into one module per section is the next clean-up of the layout.

use std::collections::BTreeMap;
use std::fmt;
use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use figment::providers::{Env, Format, Serialized, Toml};
use figment::Figment;
use serde::{Deserialize, Serialize};

/// A configuration error that names the key at fault.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    #[error("invalid configuration: {0}")]
    Load(#[from] Box<figment::Error>),
    #[error("invalid configuration: `{key}` {problem}")]
    Invalid { key: &'static str, problem: String },
    #[error("configuration file {0} does not exist")]
    MissingFile(String),
}

/// A secret value (a token, a key): it prints itself as `<redacted>` in `Debug`, `Display`
/// and `Serialize` (so `tally config` and logs never show it), and as an empty string when
/// unset. Only [`Secret::expose`] gives the value, where it is used.
#[derive(Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(transparent)]
pub struct Secret(String);

/// What a set secret prints as.
pub const REDACTED: &str = "<redacted>";

impl Secret {
    #[must_use]
    pub fn new(value: impl Into<String>) -> Self {
        Self(value.into())
    }

    /// The secret itself. Call it only where the value is used, never to log it.
    #[must_use]
    pub fn expose(&self) -> &str {
        &self.0
    }

    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    fn shown(&self) -> &'static str {
        if self.0.is_empty() {
            ""
        } else {
            REDACTED
        }
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Secret({})", self.shown())
    }
}

impl fmt::Display for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.shown())
    }
}

impl Serialize for Secret {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.shown())
    }
}

/// A connection URL that may hold a password (`user:password@`, `?password=`): it prints
/// itself (`Debug`, `Display`, `Serialize`) with the password replaced by `<redacted>`.
/// Only [`SecretUrl::expose`] gives the URL as configured.
#[derive(Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(transparent)]
pub struct SecretUrl(String);

impl SecretUrl {
    #[must_use]
    pub fn new(value: impl Into<String>) -> Self {
        Self(value.into())
    }

    /// The URL with its password. Call it only where the connection is made.
    #[must_use]
    pub fn expose(&self) -> &str {
        &self.0
    }

    /// The URL with any password replaced by `<redacted>`.
    #[must_use]
    pub fn redacted(&self) -> String {
        redact_url_password(&self.0)
    }
}

impl fmt::Debug for SecretUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "SecretUrl({})", self.redacted())
    }
}

impl fmt::Display for SecretUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.redacted())
    }
}

impl Serialize for SecretUrl {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&self.redacted())
    }
}

/// librdkafka properties passed through to a client. Values of properties that hold
/// credentials (`sasl.password`, `ssl.key.password`, `ssl.key.pem`, `*.secret`, JAAS and
/// OAuth configs, ...) print as `<redacted>` in `Debug` and `Serialize`.
#[derive(Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(transparent)]
pub struct ClientProperties(BTreeMap<String, String>);

impl ClientProperties {
    /// Whether librdkafka property `key` holds a credential.
    #[must_use]
    pub fn is_secret_key(key: &str) -> bool {
        let key = key.to_ascii_lowercase();
        ["password", "secret", "ssl.key.pem", "sasl.jaas.config", "sasl.oauthbearer.config", "token"]
            .iter()
            .any(|part| key.contains(part))
    }

    fn shown(&self) -> BTreeMap<&str, &str> {
        self.0.iter().map(|(k, v)| (k.as_str(), if Self::is_secret_key(k) { REDACTED } else { v.as_str() })).collect()
    }
}

impl std::ops::Deref for ClientProperties {
    type Target = BTreeMap<String, String>;

    fn deref(&self) -> &Self::Target {
        &self.0
    }
}

impl std::ops::DerefMut for ClientProperties {
    fn deref_mut(&mut self) -> &mut Self::Target {
        &mut self.0
    }
}

impl<'a> IntoIterator for &'a ClientProperties {
    type Item = (&'a String, &'a String);
    type IntoIter = std::collections::btree_map::Iter<'a, String, String>;

    fn into_iter(self) -> Self::IntoIter {
        self.0.iter()
    }
}

impl fmt::Debug for ClientProperties {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_map().entries(self.shown()).finish()
    }
}

impl Serialize for ClientProperties {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        self.shown().serialize(serializer)
    }
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    pub instance: InstanceConfig,
    pub database: DatabaseConfig,
    pub kafka: KafkaConfig,
    pub http: HttpConfig,
    pub outbox: OutboxConfig,
    pub pipelines: PipelinesConfig,
    pub consumer: ConsumerConfig,
    pub ledger: LedgerConfig,
    pub antifraud: AntifraudConfig,
    pub projection: ProjectionConfig,
    pub orders: OrdersConfig,
    pub notifications: NotificationsConfig,
    pub log: LogConfig,
}

/// Who this daemon is among the instances of one deployment.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct InstanceConfig {
    /// Stable across restarts and unique per running instance (two instances with the same
    /// id fence each other). Antifraud's `transactional.id` is `tally-antifraud-<id>`, so a
    /// restarted instance fences (aborts) its predecessor's open transaction at start.
    /// Default: the host name.
    pub id: String,
    /// Join every consumer group as the static member `<id>-<pipeline>`
    /// (`group.instance.id`): a restarted instance takes its partitions back at once,
    /// without a rebalance; but a static member does not leave its group when it stops, so
    /// an instance stopped for good leaves its partitions idle until `session.timeout.ms`.
    /// Off by default until it is proven on the embedded broker as well.
    pub static_membership: bool,
}

impl Default for InstanceConfig {
    fn default() -> Self {
        let host = std::env::var("HOSTNAME")
            .ok()
            .or_else(|| std::fs::read_to_string("/etc/hostname").ok())
            .map(|h| h.trim().to_owned())
            .filter(|h| !h.is_empty())
            .unwrap_or_else(|| "tally".into());
        Self { id: host, static_membership: false }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DatabaseConfig {
    /// PostgreSQL URL. The database is created if missing. Its password never prints.
    pub url: SecretUrl,
    pub pool_size: usize,
    pub statement_timeout_ms: u64,
    pub connect_timeout_ms: u64,
}

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
    pub admin_timeout_ms: u64,
    /// `retention.ms` of every topic tally creates (default 7 days; -1: keep forever).
    pub retention_ms: i64,
    /// Topic-level configs per topic name, applied when tally creates that topic, over
    /// the defaults (`min.insync.replicas = min(2, replication_factor)`, `retention.ms`).
    /// E.g. `[kafka.topic_configs."transfers.requested-dlt"]` `"retention.ms" = "-1"`.
    pub topic_configs: BTreeMap<String, BTreeMap<String, String>>,
    pub topics: TopicsConfig,
    /// librdkafka properties passed through to every producer.
    pub producer: ClientProperties,
    /// librdkafka properties passed through to every consumer.
    pub consumer: ClientProperties,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TopicsConfig {
    pub transfers_requested: String,
    pub transfers_analyzed: String,
    pub transfers_rejected: String,
    pub transfers_settled: String,
    pub orders_received: String,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct HttpConfig {
    pub intake_addr: SocketAddr,
    pub admin_addr: SocketAddr,
    /// Bearer token of the admin endpoints that show record contents or change state.
    /// Empty: those endpoints are refused.
    pub admin_token: Secret,
    pub body_limit_bytes: usize,
    pub workers: usize,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct OutboxConfig {
    pub batch_size: i64,
    /// Claim again after this long even without a notification.
    pub poll_interval_ms: u64,
    /// Wake on PostgreSQL LISTEN/NOTIFY.
    pub listen: bool,
    /// How long published rows are kept before deletion.
    pub retention_secs: u64,
    pub cleanup_interval_secs: u64,
    /// Longest wait for the broker's acknowledgement of one batch.
    pub send_timeout_ms: u64,
    pub backoff_initial_ms: u64,
    pub backoff_max_ms: u64,
    /// Publish loops per daemon (each on a disjoint half of the free key shards).
    pub concurrency: usize,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PipelinesConfig {
    /// Publish outbox rows to Kafka.
    pub outbox: bool,
    /// Settle `transfers.analyzed` into the double-entry ledger.
    pub ledger: bool,
    /// Score `transfers.requested` inside Kafka transactions.
    pub antifraud: bool,
    /// Project `transfers.settled` / `transfers.rejected` onto the transfer status.
    pub projection: bool,
    /// Materialise `orders.received` into `received_orders`.
    pub orders: bool,
    /// Deliver `transfers.settled` / `transfers.rejected` to `notifications.webhook_url`.
    pub notifications: bool,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct NotificationsConfig {
    /// Where events are POSTed. Empty: the notifications pipeline does not run.
    pub webhook_url: String,
    /// HMAC-SHA256 key of the `X-Tally-Signature` header.
    pub webhook_secret: Secret,
    pub timeout_ms: u64,
    pub group_id: String,
    /// Non-blocking retry topics: first delay, multiplier, longest delay,
    /// and attempts in all (the first plus one per retry topic).
    pub retry_initial_ms: u64,
    pub retry_multiplier: f64,
    pub retry_max_ms: u64,
    pub max_attempts: u32,
    /// Blocking retry for the database or broker being unavailable.
    pub retry: RetryConfig,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AntifraudConfig {
    pub group_id: String,
    /// Transactional id of this instance; must be unique per running instance and stable
    /// across its restarts. Empty: `tally-antifraud-<instance.id>`.
    pub transactional_id: String,
    /// Scores at or above this are blocked (seed: 80).
    pub block_score: i32,
    /// Score of every transfer.
    pub base_score: i32,
    /// `[[min_amount_cents, points], ...]`; the highest matching tier counts.
    pub amount_tiers: Vec<(i64, i32)>,
    pub velocity_window_secs: u64,
    /// More transfers than this from one source account inside the window add
    /// `velocity_points`.
    pub velocity_max: usize,
    pub velocity_points: i32,
    /// Records per Kafka transaction at most.
    pub batch_max_records: usize,
    /// How long a transaction waits for more records after the first.
    pub batch_max_wait_ms: u64,
    /// Broker-side limit of one transaction (`transaction.timeout.ms`).
    pub transaction_timeout_ms: u64,
    /// How long the stage waits in one transaction call (adding offsets, committing)
    /// before it serves its consumer group and makes the call again: a call that outlasts
    /// this is retriable and is resumed, never aborted.
    pub call_timeout_ms: u64,
    /// Backoff between attempts of a failed transaction.
    pub retry: RetryConfig,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ProjectionConfig {
    pub group_id: String,
    pub retry: RetryConfig,
}

/// Consumption limits shared by every pipeline.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ConsumerConfig {
    /// Records in flight per partition; when reached, the partition stops fetching.
    pub max_in_flight: usize,
    /// Offsets at most between a partition's committed watermark and the newest record
    /// taken (records completed behind an unfinished one count); past it the partition
    /// pauses until the head of line completes. At least `max_in_flight`.
    pub max_uncommitted: usize,
    /// Live keyed worker actors per pipeline (least recently used idle ones go first).
    pub max_live_workers: usize,
    /// Keyed workers idle this long are passivated.
    pub idle_after_secs: u64,
    /// Longest wait for in-flight records on revoke and shutdown, at least. Each pipeline
    /// waits at least the worst case of its retry sequence (every backoff plus every
    /// attempt taking `database.statement_timeout_ms`, or the webhook timeout for
    /// notifications), so that a record in retry finishes before its partition is given up;
    /// a drain still times out on records waiting for an unavailable dependency, which give
    /// up at once and stay uncommitted.
    pub drain_timeout_ms: u64,
}

/// Blocking exponential retry of one pipeline.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RetryConfig {
    pub max_retries: u32,
    pub initial_ms: u64,
    pub multiplier: f64,
    pub max_ms: u64,
}

/// The highest `ledger.max_balance_cents` allowed: nine such balances still sum inside an
/// i64, and PostgreSQL sums balances as numeric anyway.
const MAX_BALANCE_CEILING: i64 = 1_000_000_000_000_000_000;

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LedgerConfig {
    pub group_id: String,
    /// Transfers settled per database transaction at most.
    pub batch_size: usize,
    /// Settlement transactions running at once.
    pub max_concurrent_batches: usize,
    /// How long a partial batch waits for more transfers while another batch runs.
    pub linger_ms: u64,
    /// The ceiling of every balance and amount, in cents. Intake refuses a larger opening
    /// balance or amount (422); settlement rejects a credit that would pass it
    /// (BALANCE_LIMIT_EXCEEDED). Keeps every sum far from 64-bit overflow.
    pub max_balance_cents: i64,
    pub retry: RetryConfig,
}

/// The order materializer: `orders.received` -> `received_orders`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct OrdersConfig {
    pub group_id: String,
    pub retry: RetryConfig,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    Pretty,
    Json,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LogConfig {
    pub format: LogFormat,
    /// A `tracing` filter directive, e.g. `info,tally=debug`.
    pub level: String,
}

impl Default for DatabaseConfig {
    fn default() -> Self {
        Self {
            url: SecretUrl::new("postgres://postgres@127.0.0.1:5432/tally"),
            pool_size: 16,
            statement_timeout_ms: 10_000,
            connect_timeout_ms: 5_000,
        }
    }
}

impl Default for KafkaConfig {
    fn default() -> Self {
        Self {
            brokers: "embedded".into(),
            embedded_brokers: 3,
            partitions: 12,
            replication_factor: 1,
            create_topics: true,
            admin_timeout_ms: 10_000,
            retention_ms: 7 * 24 * 3600 * 1000,
            topic_configs: BTreeMap::new(),
            topics: TopicsConfig::default(),
            producer: ClientProperties::default(),
            consumer: ClientProperties::default(),
        }
    }
}

impl Default for TopicsConfig {
    fn default() -> Self {
        use tally_schema::topics;
        Self {
            transfers_requested: topics::TRANSFERS_REQUESTED.into(),
            transfers_analyzed: topics::TRANSFERS_ANALYZED.into(),
            transfers_rejected: topics::TRANSFERS_REJECTED.into(),
            transfers_settled: topics::TRANSFERS_SETTLED.into(),
            orders_received: topics::ORDERS_RECEIVED.into(),
        }
    }
}

impl Default for HttpConfig {
    fn default() -> Self {
        Self {
            intake_addr: SocketAddr::from(([127, 0, 0, 1], 8080)),
            admin_addr: SocketAddr::from(([127, 0, 0, 1], 9090)),
            admin_token: Secret::default(),
            body_limit_bytes: 16 * 1024,
            workers: 2,
        }
    }
}

impl Default for OutboxConfig {
    fn default() -> Self {
        Self {
            batch_size: 500,
            poll_interval_ms: 1_000,
            listen: true,
            retention_secs: 24 * 3600,
            cleanup_interval_secs: 60,
            send_timeout_ms: 10_000,
            backoff_initial_ms: 200,
            backoff_max_ms: 10_000,
            concurrency: 2,
        }
    }
}

impl Default for PipelinesConfig {
    fn default() -> Self {
        Self { outbox: true, ledger: true, antifraud: true, projection: true, orders: true, notifications: true }
    }
}

impl Default for ConsumerConfig {
    fn default() -> Self {
        Self {
            max_in_flight: 512,
            max_uncommitted: 10_000,
            max_live_workers: 20_000,
            idle_after_secs: 60,
            drain_timeout_ms: 20_000,
        }
    }
}

impl Default for RetryConfig {
    fn default() -> Self {
        Self { max_retries: 5, initial_ms: 500, multiplier: 2.0, max_ms: 15_000 }
    }
}

impl Default for LedgerConfig {
    fn default() -> Self {
        Self {
            group_id: "tally-ledger".into(),
            batch_size: 200,
            max_concurrent_batches: 4,
            linger_ms: 2,
            max_balance_cents: 1_000_000_000_000_000,
            retry: RetryConfig::default(),
        }
    }
}

impl Default for AntifraudConfig {
    fn default() -> Self {
        Self {
            group_id: "tally-antifraud".into(),
            transactional_id: String::new(),
            block_score: 80,
            base_score: 5,
            amount_tiers: vec![(1_000_000, 25), (5_000_000, 50), (10_000_000, 80)],
            velocity_window_secs: 60,
            velocity_max: 20,
            velocity_points: 40,
            batch_max_records: 500,
            batch_max_wait_ms: 10,
            transaction_timeout_ms: 30_000,
            call_timeout_ms: 5_000,
            retry: RetryConfig { max_retries: 10, initial_ms: 200, multiplier: 2.0, max_ms: 10_000 },
        }
    }
}

impl Default for ProjectionConfig {
    fn default() -> Self {
        Self { group_id: "tally-projection".into(), retry: RetryConfig::default() }
    }
}

impl Default for NotificationsConfig {
    fn default() -> Self {
        Self {
            webhook_url: String::new(),
            webhook_secret: Secret::default(),
            timeout_ms: 5_000,
            group_id: "tally-notifications".into(),
            retry_initial_ms: 1_000,
            retry_multiplier: 2.0,
            retry_max_ms: 30_000,
            max_attempts: 4,
            retry: RetryConfig::default(),
        }
    }
}

impl NotificationsConfig {
    /// The delay of each retry topic, in order.
    #[must_use]
    pub fn delays_ms(&self) -> Vec<u64> {
        tally_actors::notify::retry_delays(
            self.retry_initial_ms,
            self.retry_multiplier,
            self.retry_max_ms,
            self.max_attempts,
        )
    }
}

impl Config {
    /// Every topic to create: the source topics, their `-dlt` twins, and the notification
    /// retry topics.
    #[must_use]
    pub fn topics_to_create(&self) -> Vec<String> {
        let mut all = self.kafka.topics.all();
        let t = &self.kafka.topics;
        for delay in self.notifications.delays_ms() {
            for source in [&t.transfers_settled, &t.transfers_rejected] {
                all.push(tally_schema::topics::retry(source, delay));
            }
        }
        all.dedup();
        all
    }
}

impl Default for OrdersConfig {
    fn default() -> Self {
        Self { group_id: "tally-orders".into(), retry: RetryConfig::default() }
    }
}

impl RetryConfig {
    fn validate(&self, key: &'static str) -> Result<(), ConfigError> {
        if self.initial_ms == 0
            || self.max_ms < self.initial_ms
            || !(1.0..=10.0).contains(&self.multiplier)
            || self.max_retries > 100
        {
            return Err(ConfigError::Invalid {
                key,
                problem: "needs initial_ms > 0, max_ms >= initial_ms, multiplier in 1..=10 and max_retries <= 100"
                    .into(),
            });
        }
        Ok(())
    }
}

impl Default for LogConfig {
    fn default() -> Self {
        Self { format: LogFormat::Pretty, level: "info".into() }
    }
}

impl TopicsConfig {
    /// Every source topic, in a fixed order.
    #[must_use]
    pub fn sources(&self) -> Vec<&str> {
        vec![
            &self.transfers_requested,
            &self.transfers_analyzed,
            &self.transfers_rejected,
            &self.transfers_settled,
            &self.orders_received,
        ]
    }

    /// Every topic tally uses: each source topic and its `-dlt` twin.
    #[must_use]
    pub fn all(&self) -> Vec<String> {
        self.sources().into_iter().flat_map(|t| [t.to_owned(), tally_schema::topics::dlt(t)]).collect()
    }
}

impl KafkaConfig {
    /// The builder of every Kafka client's settings, with this configuration's
    /// pass-through properties.
    #[must_use]
    pub fn clients(&self, bootstrap: &str) -> tally_actors::kafka::KafkaClients {
        tally_actors::kafka::KafkaClients::new(bootstrap, (*self.consumer).clone(), (*self.producer).clone())
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

impl OutboxConfig {
    #[must_use]
    pub fn poll_interval(&self) -> Duration {
        Duration::from_millis(self.poll_interval_ms)
    }
}

impl Config {
    /// Loads defaults, then `file` (if given), then `TALLY__*` environment variables, and
    /// validates the result.
    ///
    /// # Errors
    /// A [`ConfigError`] naming the key that is missing, mistyped, unknown or out of range.
    pub fn load(file: Option<&Path>) -> Result<Self, ConfigError> {
        let mut figment = Figment::from(Serialized::defaults(Config::default()));
        if let Some(path) = file {
            if !path.exists() {
                return Err(ConfigError::MissingFile(path.display().to_string()));
            }
            figment = figment.merge(Toml::file_exact(path));
        }
        figment = figment.merge(Env::prefixed("TALLY__").split("__"));
        Self::from_figment(&figment)
    }

    /// Extracts and validates a configuration from `figment`.
    ///
    /// # Errors
    /// As [`Config::load`].
    pub fn from_figment(figment: &Figment) -> Result<Self, ConfigError> {
        let config: Config = figment.extract().map_err(Box::new)?;
        config.validate()?;
        Ok(config)
    }

    /// Checks ranges and relations that types cannot express.
    ///
    /// # Errors
    /// [`ConfigError::Invalid`] naming the first key at fault.
    pub fn validate(&self) -> Result<(), ConfigError> {
        fn invalid(key: &'static str, problem: impl Into<String>) -> Result<(), ConfigError> {
            Err(ConfigError::Invalid { key, problem: problem.into() })
        }
        let id = &self.instance.id;
        if id.is_empty()
            || id.len() > 100
            || !id.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
        {
            return invalid("instance.id", "must be 1 to 100 characters of letters, digits, '.', '_' and '-'");
        }
        let url = self.database.url.expose();
        if !(url.starts_with("postgres://") || url.starts_with("postgresql://")) {
            return invalid("database.url", "must be a postgres:// URL");
        }
        if url.parse::<tokio_postgres::Config>().is_err() {
            return invalid("database.url", "is not a valid PostgreSQL connection URL");
        }
        if !(1..=1000).contains(&self.database.pool_size) {
            return invalid("database.pool_size", "must be between 1 and 1000");
        }
        if self.database.statement_timeout_ms == 0 {
            return invalid("database.statement_timeout_ms", "must be greater than 0");
        }
        if self.kafka.brokers.trim().is_empty() {
            return invalid("kafka.brokers", "must be \"embedded\" or a bootstrap list");
        }
        if !(1..=10).contains(&self.kafka.embedded_brokers) {
            return invalid("kafka.embedded_brokers", "must be between 1 and 10");
        }
        if !(1..=1000).contains(&self.kafka.partitions) {
            return invalid("kafka.partitions", "must be between 1 and 1000");
        }
        if self.kafka.replication_factor < 1
            || (self.kafka.is_embedded() && self.kafka.replication_factor > self.kafka.embedded_brokers)
        {
            return invalid(
                "kafka.replication_factor",
                "must be at least 1 and, for the embedded broker, at most kafka.embedded_brokers",
            );
        }
        if !(1_000..=300_000).contains(&self.kafka.admin_timeout_ms) {
            return invalid("kafka.admin_timeout_ms", "must be between 1000 and 300000");
        }
        if self.kafka.retention_ms != -1 && self.kafka.retention_ms < 60_000 {
            return invalid("kafka.retention_ms", "must be -1 (keep forever) or at least 60000 (one minute)");
        }
        let created = self.topics_to_create();
        if let Some(unknown) = self.kafka.topic_configs.keys().find(|t| !created.contains(t)) {
            return invalid("kafka.topic_configs", format!("names {unknown}, which is not a topic tally creates"));
        }
        let topics = self.kafka.topics.all();
        if topics.iter().any(|t| !valid_topic_name(t)) {
            return invalid("kafka.topics", "names must be 1..=200 characters of [a-zA-Z0-9._-]");
        }
        let mut unique = topics.clone();
        unique.sort();
        unique.dedup();
        if unique.len() != topics.len() {
            return invalid("kafka.topics", "names must be distinct");
        }
        if self.http.intake_addr == self.http.admin_addr && self.http.intake_addr.port() != 0 {
            return invalid("http.admin_addr", "must differ from http.intake_addr");
        }
        if !(1..=16 * 1024 * 1024).contains(&self.http.body_limit_bytes) {
            return invalid("http.body_limit_bytes", "must be between 1 and 16777216");
        }
        let Some(max_message) = self.kafka.max_message_bytes() else {
            return invalid("kafka.producer", "\"message.max.bytes\" must be a positive integer");
        };
        if self.http.body_limit_bytes.saturating_add(RECORD_OVERHEAD_BYTES) > max_message {
            return invalid(
                "http.body_limit_bytes",
                format!(
                    "is {} bytes: a record built from such a body (plus {RECORD_OVERHEAD_BYTES} bytes of event \
                     fields and headers) would exceed the producer's message.max.bytes ({max_message}); lower \
                     http.body_limit_bytes or raise kafka.producer.\"message.max.bytes\" (and the topics' \
                     max.message.bytes)",
                    self.http.body_limit_bytes
                ),
            );
        }
        if !(1..=64).contains(&self.http.workers) {
            return invalid("http.workers", "must be between 1 and 64");
        }
        if !(1..=10_000).contains(&self.outbox.batch_size) {
            return invalid("outbox.batch_size", "must be between 1 and 10000");
        }
        if self.outbox.poll_interval_ms == 0 {
            return invalid("outbox.poll_interval_ms", "must be greater than 0");
        }
        if self.outbox.send_timeout_ms == 0 {
            return invalid("outbox.send_timeout_ms", "must be greater than 0");
        }
        if self.outbox.backoff_initial_ms == 0 || self.outbox.backoff_max_ms < self.outbox.backoff_initial_ms {
            return invalid("outbox.backoff_max_ms", "must be at least outbox.backoff_initial_ms (> 0)");
        }
        if !(1..=8).contains(&self.outbox.concurrency) || self.outbox.concurrency >= self.database.pool_size {
            return invalid("outbox.concurrency", "must be between 1 and 8, and below database.pool_size");
        }
        if self.outbox.cleanup_interval_secs == 0 {
            return invalid("outbox.cleanup_interval_secs", "must be greater than 0");
        }
        if !(1..=100_000).contains(&self.consumer.max_in_flight) {
            return invalid("consumer.max_in_flight", "must be between 1 and 100000");
        }
        if self.consumer.max_uncommitted < self.consumer.max_in_flight || self.consumer.max_uncommitted > 10_000_000 {
            return invalid("consumer.max_uncommitted", "must be between consumer.max_in_flight and 10000000");
        }
        if self.consumer.max_live_workers == 0 {
            return invalid("consumer.max_live_workers", "must be greater than 0");
        }
        if self.consumer.drain_timeout_ms == 0 {
            return invalid("consumer.drain_timeout_ms", "must be greater than 0");
        }
        if self.ledger.group_id.trim().is_empty() {
            return invalid("ledger.group_id", "must not be empty");
        }
        if !(1..=5_000).contains(&self.ledger.batch_size) {
            return invalid("ledger.batch_size", "must be between 1 and 5000");
        }
        if self.ledger.max_concurrent_batches == 0 || self.ledger.max_concurrent_batches > self.database.pool_size {
            return invalid("ledger.max_concurrent_batches", "must be between 1 and database.pool_size");
        }
        if !(1..=MAX_BALANCE_CEILING).contains(&self.ledger.max_balance_cents) {
            return invalid("ledger.max_balance_cents", "must be between 1 and 1000000000000000000 (10^18)");
        }
        self.ledger.retry.validate("ledger.retry")?;
        let af = &self.antifraud;
        if af.group_id.trim().is_empty() {
            return invalid("antifraud.group_id", "must not be empty");
        }
        if !(1..=100).contains(&af.block_score) {
            return invalid("antifraud.block_score", "must be between 1 and 100");
        }
        if af.amount_tiers.iter().any(|(min, points)| *min <= 0 || !(0..=100).contains(points)) {
            return invalid("antifraud.amount_tiers", "needs positive amounts and points between 0 and 100");
        }
        if af.velocity_window_secs == 0 {
            return invalid("antifraud.velocity_window_secs", "must be greater than 0");
        }
        if !(1..=10_000).contains(&af.batch_max_records) {
            return invalid("antifraud.batch_max_records", "must be between 1 and 10000");
        }
        if af.transaction_timeout_ms < 1_000 {
            return invalid("antifraud.transaction_timeout_ms", "must be at least 1000");
        }
        if af.call_timeout_ms == 0 || af.call_timeout_ms > af.transaction_timeout_ms {
            return invalid(
                "antifraud.call_timeout_ms",
                "must be positive and at most antifraud.transaction_timeout_ms",
            );
        }
        af.retry.validate("antifraud.retry")?;
        if self.projection.group_id.trim().is_empty() {
            return invalid("projection.group_id", "must not be empty");
        }
        self.projection.retry.validate("projection.retry")?;
        if self.orders.group_id.trim().is_empty() {
            return invalid("orders.group_id", "must not be empty");
        }
        if self.orders.group_id == self.ledger.group_id {
            return invalid("orders.group_id", "must differ from ledger.group_id");
        }
        self.orders.retry.validate("orders.retry")?;
        let n = &self.notifications;
        let http_url = n.webhook_url.starts_with("http://") || n.webhook_url.starts_with("https://");
        if !n.webhook_url.is_empty() && !http_url {
            return invalid("notifications.webhook_url", "must be an http:// or https:// URL (or empty to disable)");
        }
        if !n.webhook_url.is_empty() && n.webhook_secret.is_empty() {
            return invalid("notifications.webhook_secret", "must be set when notifications.webhook_url is");
        }
        if n.timeout_ms == 0 || n.retry_initial_ms == 0 || n.retry_max_ms < n.retry_initial_ms {
            return invalid(
                "notifications.retry_initial_ms",
                "needs timeout_ms > 0, retry_initial_ms > 0 and retry_max_ms >= retry_initial_ms",
            );
        }
        if !(1.0..=10.0).contains(&n.retry_multiplier) {
            return invalid("notifications.retry_multiplier", "must be between 1 and 10");
        }
        if !(1..=10).contains(&n.max_attempts) {
            return invalid("notifications.max_attempts", "must be between 1 and 10");
        }
        let mut delays = n.delays_ms();
        delays.dedup();
        if delays.len() != n.delays_ms().len() {
            return invalid(
                "notifications.retry_max_ms",
                "caps two retry delays to the same value; retry topics must differ",
            );
        }
        if n.group_id.trim().is_empty() {
            return invalid("notifications.group_id", "must not be empty");
        }
        n.retry.validate("notifications.retry")?;
        if tracing_subscriber::EnvFilter::try_new(&self.log.level).is_err() {
            return invalid("log.level", "is not a valid tracing filter (e.g. \"info\")");
        }
        Ok(())
    }

    /// The effective configuration as TOML (`tally config`). Every secret type prints
    /// itself redacted, so nothing here needs to know which fields are secret.
    #[must_use]
    pub fn to_redacted_toml(&self) -> String {
        toml::to_string_pretty(self).unwrap_or_else(|e| format!("# cannot render: {e}"))
    }
}

/// Bytes a record adds to the request body it is built from: the event's own fields (ids,
/// timestamps, score), its headers (`event-id`, `event-type`, `traceparent`) and Kafka's
/// record framing, with room to spare.
pub const RECORD_OVERHEAD_BYTES: usize = 4 * 1024;

/// librdkafka's default `message.max.bytes`.
const DEFAULT_MESSAGE_MAX_BYTES: usize = 1_000_000;

fn redact_url_password(url: &str) -> String {
    // postgres://user:password@host/db -> postgres://user:<redacted>@host/db
    let mut shown = url.to_owned();
    if let Some((scheme, rest)) = url.split_once("://") {
        let authority_end = rest.find(['/', '?']).unwrap_or(rest.len());
        if let Some(at) = rest[..authority_end].rfind('@') {
            if let Some((user, _)) = rest[..at].split_once(':') {
                shown = format!("{scheme}://{user}:{REDACTED}{}", &rest[at..]);
            }
        }
    }
    // ...?password=secret&... -> ...?password=<redacted>&...
    match shown.split_once('?') {
        Some((base, query)) => {
            let params: Vec<String> = query
                .split('&')
                .map(|p| match p.split_once('=') {
                    Some((k, _)) if k.eq_ignore_ascii_case("password") => format!("{k}={REDACTED}"),
                    _ => p.to_owned(),
                })
                .collect();
            format!("{base}?{}", params.join("&"))
        }
        None => shown,
    }
}

fn valid_topic_name(name: &str) -> bool {
    (1..=200).contains(&name.len())
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'_' || b == b'-')
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with(toml: &str) -> Result<Config, ConfigError> {
        let figment = Figment::from(Serialized::defaults(Config::default())).merge(Toml::string(toml));
        Config::from_figment(&figment)
    }

    #[test]
    fn defaults_are_valid_and_match_design() {
        let c = with("").unwrap();
        assert_eq!(c.http.intake_addr.to_string(), "127.0.0.1:8080");
        assert_eq!(c.http.admin_addr.to_string(), "127.0.0.1:9090");
        assert_eq!(c.database.url.expose(), "postgres://postgres@127.0.0.1:5432/tally");
        assert!(c.kafka.is_embedded());
        assert_eq!(c.kafka.partitions, 12);
    }

    #[test]
    fn errors_name_the_key() {
        let e = with("[database]\npool_size = 0").unwrap_err().to_string();
        assert!(e.contains("database.pool_size"), "{e}");
        let e = with("[outbox]\nbatch_size = \"many\"").unwrap_err().to_string();
        assert!(e.contains("batch_size"), "{e}");
        let e = with("[http]\nintake_adr = \"127.0.0.1:1\"").unwrap_err().to_string();
        assert!(e.contains("intake_adr"), "{e}");
        let e = with("[database]\nurl = \"mysql://x\"").unwrap_err().to_string();
        assert!(e.contains("database.url"), "{e}");
    }

    #[test]
    fn the_uncommitted_window_is_validated_against_max_in_flight() {
        let c = with("").unwrap();
        assert_eq!(c.consumer.max_uncommitted, 10_000);
        let e = with("[consumer]\nmax_in_flight = 64\nmax_uncommitted = 63").unwrap_err().to_string();
        assert!(e.contains("consumer.max_uncommitted") && e.contains("consumer.max_in_flight"), "{e}");
        assert!(with("[consumer]\nmax_in_flight = 64\nmax_uncommitted = 64").is_ok());
    }

    #[test]
    fn a_transaction_call_waits_at_most_the_transaction_timeout() {
        let e = with("[antifraud]\ntransaction_timeout_ms = 2000\ncall_timeout_ms = 2001").unwrap_err().to_string();
        assert!(e.contains("antifraud.call_timeout_ms"), "{e}");
        assert!(with("[antifraud]\ncall_timeout_ms = 0").is_err());
        assert!(with("[antifraud]\ntransaction_timeout_ms = 2000\ncall_timeout_ms = 2000").is_ok());
    }

    #[test]
    fn orders_pipeline_is_on_by_default_and_validated() {
        let c = with("").unwrap();
        assert!(c.pipelines.orders);
        assert_eq!(c.orders.group_id, "tally-orders");
        assert_eq!(c.orders.retry.max_retries, 5);
        let c =
            with("[pipelines]\norders = false\n[orders]\ngroup_id = \"g\"\n[orders.retry]\nmax_retries = 2").unwrap();
        assert!(!c.pipelines.orders);
        assert_eq!((c.orders.group_id.as_str(), c.orders.retry.max_retries), ("g", 2));
        let e = with("[orders]\ngroup_id = \" \"").unwrap_err().to_string();
        assert!(e.contains("orders.group_id"), "{e}");
        let e = with("[orders]\ngroup_id = \"tally-ledger\"").unwrap_err().to_string();
        assert!(e.contains("orders.group_id"), "{e}");
        let e = with("[orders.retry]\ninitial_ms = 0").unwrap_err().to_string();
        assert!(e.contains("orders.retry"), "{e}");
    }

    #[test]
    #[allow(clippy::result_large_err)] // figment::Jail's closure type, not ours
    fn environment_overrides_file() {
        figment::Jail::expect_with(|jail| {
            jail.create_file("tally.toml", "[outbox]\nbatch_size = 7\n[kafka]\nbrokers = \"a:1\"")?;
            jail.set_env("TALLY__OUTBOX__BATCH_SIZE", "9");
            jail.set_env("TALLY__HTTP__ADMIN_TOKEN", "s3cret");
            let c = Config::load(Some(Path::new("tally.toml"))).map_err(|e| e.to_string())?;
            assert_eq!(c.outbox.batch_size, 9);
            assert_eq!(c.kafka.brokers, "a:1");
            assert_eq!(c.http.admin_token.expose(), "s3cret");
            Ok(())
        });
    }

    #[test]
    fn secrets_never_print() {
        let mut c = Config::default();
        c.http.admin_token = Secret::new("s3cret-token");
        c.database.url = SecretUrl::new("postgres://app:hunter2@db:5432/tally?sslmode=require&password=hunter3");
        c.notifications.webhook_secret = Secret::new("s3cret-hook");
        c.kafka.producer.insert("sasl.password".into(), "s3cret-sasl".into());
        c.kafka.consumer.insert("ssl.key.pem".into(), "s3cret-pem".into());
        c.kafka.producer.insert("linger.ms".into(), "7".into());
        let shown = c.to_redacted_toml();
        let debug = format!("{c:?}");
        for secret in ["s3cret", "hunter2", "hunter3"] {
            assert!(!shown.contains(secret), "{shown}");
            assert!(!debug.contains(secret), "{debug}");
        }
        assert!(
            shown.contains("postgres://app:<redacted>@db:5432/tally?sslmode=require&password=<redacted>"),
            "{shown}"
        );
        assert!(shown.contains("\"linger.ms\" = \"7\""), "{shown}");
        assert_eq!(c.notifications.webhook_secret.to_string(), "<redacted>");
        assert_eq!(Secret::default().to_string(), "", "an unset secret shows as unset");
    }

    #[test]
    fn defaults_survive_the_redacting_serialisation() {
        // Figment layers the defaults through `Serialize`: an unset secret stays unset and a
        // URL without a password stays usable.
        let c = with("").unwrap();
        assert!(c.http.admin_token.is_empty());
        assert_eq!(c.database.url.expose(), "postgres://postgres@127.0.0.1:5432/tally");
    }

    #[test]
    fn the_body_limit_must_fit_a_record() {
        let e = with("[http]\nbody_limit_bytes = 2000000").unwrap_err().to_string();
        assert!(e.contains("http.body_limit_bytes") && e.contains("message.max.bytes"), "{e}");
        with("[http]\nbody_limit_bytes = 2000000\n[kafka.producer]\n\"message.max.bytes\" = \"3000000\"").unwrap();
        let e = with("[kafka.producer]\n\"message.max.bytes\" = \"lots\"").unwrap_err().to_string();
        assert!(e.contains("kafka.producer"), "{e}");
    }

    #[test]
    fn topic_configs_name_known_topics() {
        with("[kafka.topic_configs.\"transfers.requested-dlt\"]\n\"retention.ms\" = \"-1\"").unwrap();
        let e = with("[kafka.topic_configs.\"nope\"]\n\"retention.ms\" = \"1\"").unwrap_err().to_string();
        assert!(e.contains("kafka.topic_configs") && e.contains("nope"), "{e}");
        let e = with("[kafka]\nretention_ms = 5").unwrap_err().to_string();
        assert!(e.contains("kafka.retention_ms"), "{e}");
    }
}
