//! `[database]`: where PostgreSQL is and how connections behave. The pools, one per stage,
//! are `[database.pools]` (module `pools`).

use super::*;

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DatabaseConfig {
    /// PostgreSQL URL. The database is created if missing. Its password never prints.
    /// TLS follows its `sslmode` and `sslrootcert` parameters (or the keys below).
    pub url: SecretUrl,
    /// The password, when not in the URL (from `password_file` when that is set).
    pub password: Secret,
    /// A file holding the password (a mounted secret); its trailing newline is ignored.
    pub password_file: String,
    /// `disable`, `prefer`, `require`, `verify-ca` or `verify-full`, as libpq; empty: the
    /// URL's `sslmode`, else `prefer`.
    pub sslmode: String,
    /// PEM file of the roots that sign the server's certificate, or `system`; empty: the
    /// URL's `sslrootcert`.
    pub sslrootcert: String,
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
            password: Secret::default(),
            password_file: String::new(),
            sslmode: String::new(),
            sslrootcert: String::new(),
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
        let from_url = match tally_actors::store::PgConnector::from_url(url) {
            Ok(c) => c,
            Err(e) => return invalid("database.url", format!("cannot be used: {e}")),
        };
        let query = url.split_once('?').map_or("", |(_, q)| q);
        let in_url = |name: &str| query.split('&').any(|p| p.split('=').next() == Some(name));
        for (key, name, value) in
            [("database.sslmode", "sslmode", &self.sslmode), ("database.sslrootcert", "sslrootcert", &self.sslrootcert)]
        {
            if !value.is_empty() && in_url(name) {
                return invalid(key, format!("is set, and so is {name} in database.url: set one of them"));
            }
        }
        if !self.password.is_empty() && from_url.config().get_password().is_some() {
            return invalid("database.password", "is set, and database.url has a password too: set one of them");
        }
        if let Err(e) = tally_actors::store::PgConnector::from_url(&self.connect_url()) {
            return invalid("database.sslmode", format!("with database.sslrootcert cannot be used: {e}"));
        }
        if self.statement_timeout.is_zero() {
            return invalid("database.statement_timeout_ms", "must be greater than 0");
        }
        Ok(())
    }
}

impl DatabaseConfig {
    /// The URL to connect with: `url` plus the `sslmode`, `sslrootcert` and `password`
    /// keys, when set, as its parameters. It holds the password: never print it.
    #[must_use]
    pub fn connect_url(&self) -> String {
        let mut url = self.url.expose().to_owned();
        for (name, value) in [
            ("sslmode", self.sslmode.as_str()),
            ("sslrootcert", &self.sslrootcert),
            ("password", self.password.expose()),
        ] {
            if value.is_empty() {
                continue;
            }
            url.push(if url.contains('?') { '&' } else { '?' });
            url.push_str(name);
            url.push('=');
            url.extend(percent_encoding::utf8_percent_encode(value, percent_encoding::NON_ALPHANUMERIC));
        }
        url
    }
}
