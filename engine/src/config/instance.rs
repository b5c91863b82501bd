//! `[instance]` (who this daemon is among the instances of one deployment) and `[log]`.

use super::*;

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

impl Default for LogConfig {
    fn default() -> Self {
        Self { format: LogFormat::Pretty, level: "info".into() }
    }
}

impl InstanceConfig {
    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        let id = &self.id;
        if id.is_empty()
            || id.len() > 100
            || !id.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
        {
            return invalid("instance.id", "must be 1 to 100 characters of letters, digits, '.', '_' and '-'");
        }
        Ok(())
    }
}

impl LogConfig {
    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        if tracing_subscriber::EnvFilter::try_new(&self.level).is_err() {
            return invalid("log.level", "is not a valid tracing filter (e.g. \"info\")");
        }
        Ok(())
    }
}
