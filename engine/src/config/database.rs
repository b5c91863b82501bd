//! `[database]`: where PostgreSQL is and how connections behave.

use super::*;

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DatabaseConfig {
    /// PostgreSQL URL. The database is created if missing. Its password never prints.
    pub url: SecretUrl,
    pub pool_size: usize,
    #[serde(rename = "statement_timeout_ms", with = "super::duration::ms")]
    pub statement_timeout: Duration,
    #[serde(rename = "connect_timeout_ms", with = "super::duration::ms")]
    pub connect_timeout: Duration,
}

impl Default for DatabaseConfig {
    fn default() -> Self {
        Self {
            url: SecretUrl::new("postgres://postgres@127.0.0.1:5432/tally"),
            pool_size: 16,
            statement_timeout: Duration::from_millis(10_000),
            connect_timeout: Duration::from_millis(5_000),
        }
    }
}

impl DatabaseConfig {
    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        let url = self.url.expose();
        if !(url.starts_with("postgres://") || url.starts_with("postgresql://")) {
            return invalid("database.url", "must be a postgres:// URL");
        }
        if url.parse::<tokio_postgres::Config>().is_err() {
            return invalid("database.url", "is not a valid PostgreSQL connection URL");
        }
        if !(1..=1000).contains(&self.pool_size) {
            return invalid("database.pool_size", "must be between 1 and 1000");
        }
        if self.statement_timeout.is_zero() {
            return invalid("database.statement_timeout_ms", "must be greater than 0");
        }
        Ok(())
    }
}
