//! `[database]`: where PostgreSQL is and how connections behave. The pools, one per stage,
//! are `[database.pools]` (module `pools`).

use super::*;

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DatabaseConfig {
    /// PostgreSQL URL. The database is created if missing. Its password never prints.
    pub url: SecretUrl,
    /// The older name of `pools.http`, still accepted: it sized the one pool all stages
    /// shared, and now sizes the HTTP pool only (each stage has its own). Not with
    /// `pools.http`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pool_size: Option<usize>,
    #[serde(rename = "statement_timeout_ms", with = "super::duration::ms")]
    pub statement_timeout: Duration,
    /// Longest wait for a connection of a pool, and for a new connection to open.
    #[serde(rename = "connect_timeout_ms", with = "super::duration::ms")]
    pub connect_timeout: Duration,
    pub pools: PoolsConfig,
}

impl Default for DatabaseConfig {
    fn default() -> Self {
        Self {
            url: SecretUrl::new("postgres://postgres@127.0.0.1:5432/tally"),
            pool_size: None,
            statement_timeout: Duration::from_millis(10_000),
            connect_timeout: Duration::from_millis(5_000),
            pools: PoolsConfig::default(),
        }
    }
}

impl DatabaseConfig {
    /// The URL and the timeouts; the pools are checked with the stages they serve
    /// (`pools::validate`).
    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        let url = self.url.expose();
        if !(url.starts_with("postgres://") || url.starts_with("postgresql://")) {
            return invalid("database.url", "must be a postgres:// URL");
        }
        if url.parse::<tokio_postgres::Config>().is_err() {
            return invalid("database.url", "is not a valid PostgreSQL connection URL");
        }
        if self.statement_timeout.is_zero() {
            return invalid("database.statement_timeout_ms", "must be greater than 0");
        }
        Ok(())
    }
}
