//! Typed, layered configuration: built-in defaults -> optional TOML file ->
//! `TALLY__SECTION__KEY` environment variables. Validated at start-up; every error names the
//! offending key. Secrets are wrapped in [`Secret`] and never printed.
//!
//! One module per section, each with its defaults and its own `validate`; this module
//! holds the whole (`Config`), its loading, and the checks that span sections.

use std::collections::BTreeMap;
use std::fmt;
use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use figment::providers::{Env, Format, Serialized, Toml};
use figment::Figment;
use serde::{Deserialize, Serialize};

mod antifraud;
mod consumer;
mod database;
mod duration;
mod example;
mod files;
mod http;
mod http_clients;
mod http_edge;
mod instance;
mod kafka;
mod ledger;
mod notifications;
mod orders;
mod outbox;
mod pipelines;
mod pools;
mod projection;
mod retry;
mod secrets;
mod signing;
mod telemetry;
mod topics;

pub use antifraud::AntifraudConfig;
pub use consumer::ConsumerConfig;
pub use database::DatabaseConfig;
pub use example::example_toml;
pub use http::{AdminTls, ClientCert, HttpConfig, ListenerTls};
pub use http_clients::IntakeClientConfig;
pub use instance::{InstanceConfig, LogConfig, LogFormat};
pub use kafka::{GroupProtocol, KafkaConfig, EMBEDDED_FETCH_WAIT_MS, FETCH_WAIT_KEY, RECORD_OVERHEAD_BYTES};
pub use ledger::LedgerConfig;
pub use notifications::NotificationsConfig;
pub use orders::OrdersConfig;
pub use outbox::OutboxConfig;
pub use pipelines::{PipelinesConfig, OUTBOX};
pub use pools::{DbPool, PoolRule, PoolsConfig};
pub use projection::ProjectionConfig;
use retry::validate_group;
pub use retry::RetryConfig;
pub use secrets::{ClientProperties, Secret, SecretUrl};
pub use signing::SigningConfig;
pub use telemetry::TelemetryConfig;
pub use topics::TopicsConfig;

/// A configuration error that names the key at fault.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    #[error("invalid configuration: {0}")]
    Load(#[from] Box<figment::Error>),
    #[error("invalid configuration: `{key}` {problem}")]
    Invalid { key: &'static str, problem: String },
    /// A problem across keys, each named in the text.
    #[error("invalid configuration: {0}")]
    Conflict(String),
    #[error("configuration file {0} does not exist")]
    MissingFile(String),
}

/// A failed check of `key`.
fn invalid(key: &'static str, problem: impl Into<String>) -> Result<(), ConfigError> {
    Err(ConfigError::Invalid { key, problem: problem.into() })
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
    pub signing: SigningConfig,
    pub log: LogConfig,
    pub telemetry: TelemetryConfig,
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
        let mut config: Config = figment.extract().map_err(Box::new)?;
        config.read_secret_files()?;
        config.validate()?;
        Ok(config)
    }

    /// Checks ranges and relations that types cannot express.
    ///
    /// # Errors
    /// [`ConfigError::Invalid`] naming the first key at fault.
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.instance.validate()?;
        self.database.validate()?;
        self.kafka.validate()?;
        let created = self.topics_to_create();
        if let Some(unknown) = self.kafka.topic_configs.keys().find(|t| !created.contains(t)) {
            return invalid("kafka.topic_configs", format!("names {unknown}, which is not a topic tally creates"));
        }
        self.http.validate()?;
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
        self.outbox.validate()?;
        self.consumer.validate()?;
        self.pipelines.validate()?;
        crate::stages::validate(self)?;
        pools::validate(self)?;
        self.signing.validate()?;
        self.log.validate()?;
        self.telemetry.validate()?;
        Ok(())
    }

    /// The effective configuration as TOML (`tally config`), every pool size spelled out.
    /// Every secret type prints itself redacted, so nothing here needs to know which fields
    /// are secret.
    #[must_use]
    pub fn to_redacted_toml(&self) -> String {
        match toml::to_string_pretty(&self.with_pools_resolved()) {
            Ok(text) => render::tidy(&text),
            Err(e) => format!("# cannot render: {e}"),
        }
    }
}

mod render;
#[cfg(test)]
mod tests;
