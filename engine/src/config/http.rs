//! `[http]`: the intake and admin listeners.

use super::*;

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct HttpConfig {
    pub intake_addr: SocketAddr,
    pub admin_addr: SocketAddr,
    /// Bearer token of the admin endpoints that show record contents or change state.
    /// Empty: those endpoints are refused.
    pub admin_token: Secret,
    /// A file holding `admin_token` (a mounted secret).
    pub admin_token_file: String,
    /// Every intake request must carry the bearer token of an API client (`clients`);
    /// without it, or with a token no client has, the answer is 401 and nothing is
    /// written. Off: requests without a token are taken as anonymous ones (a request with
    /// a token still needs a valid one, and is recorded as its client's).
    pub intake_auth: bool,
    /// The intake's API clients (`[[http.clients]]`).
    pub clients: Vec<IntakeClientConfig>,
    pub body_limit_bytes: usize,
    pub workers: usize,
    /// Most `POST /transfers` requests written in one database transaction: requests that
    /// arrive while the writers are busy are grouped, up to this many. 1 gives every
    /// request its own transaction.
    pub intake_batch_max: usize,
    /// Intake transactions in flight at once, each on its own connection.
    pub intake_writers: usize,
}

impl Default for HttpConfig {
    fn default() -> Self {
        Self {
            intake_addr: SocketAddr::from(([127, 0, 0, 1], 8080)),
            admin_addr: SocketAddr::from(([127, 0, 0, 1], 9090)),
            admin_token: Secret::default(),
            admin_token_file: String::new(),
            intake_auth: false,
            clients: Vec::new(),
            body_limit_bytes: 16 * 1024,
            workers: 2,
            intake_batch_max: 128,
            intake_writers: 2,
        }
    }
}

impl HttpConfig {
    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        if self.intake_addr == self.admin_addr && self.intake_addr.port() != 0 {
            return invalid("http.admin_addr", "must differ from http.intake_addr");
        }
        if !(1..=16 * 1024 * 1024).contains(&self.body_limit_bytes) {
            return invalid("http.body_limit_bytes", "must be between 1 and 16777216");
        }
        if !(1..=64).contains(&self.workers) {
            return invalid("http.workers", "must be between 1 and 64");
        }
        if !(1..=1000).contains(&self.intake_batch_max) {
            return invalid("http.intake_batch_max", "must be between 1 and 1000");
        }
        if !(1..=64).contains(&self.intake_writers) {
            return invalid("http.intake_writers", "must be between 1 and 64");
        }
        self.validate_clients()
    }

    fn validate_clients(&self) -> Result<(), ConfigError> {
        if self.intake_auth && self.clients.is_empty() {
            return invalid("http.intake_auth", "is on, and http.clients names no API client");
        }
        let mut names = std::collections::HashSet::new();
        for client in &self.clients {
            let name = &client.name;
            let good = (1..=64).contains(&name.len())
                && name.bytes().all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b));
            if !good {
                return invalid(
                    "http.clients.name",
                    format!("`{name}` is not 1 to 64 of A-Z, a-z, 0-9, `.`, `_`, `-`"),
                );
            }
            if !names.insert(name) {
                return invalid("http.clients.name", format!("`{name}` names two clients"));
            }
            if client.token_digest().is_none() {
                return invalid(
                    "http.clients.token_sha256",
                    format!("of client `{name}` must be the SHA-256 of its token, 64 hexadecimal digits"),
                );
            }
        }
        Ok(())
    }
}

/// One API client of the intake: its name, recorded with every transfer and order it
/// creates, and the SHA-256 of its bearer token (the token itself is stored nowhere).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct IntakeClientConfig {
    pub name: String,
    /// Hexadecimal SHA-256 of the client's bearer token, e.g. from
    /// `printf %s "$TOKEN" | sha256sum`.
    pub token_sha256: Secret,
    /// A file holding `token_sha256` (a mounted secret).
    pub token_sha256_file: String,
}

impl IntakeClientConfig {
    /// The token's SHA-256, when `token_sha256` is 64 hexadecimal digits.
    #[must_use]
    pub fn token_digest(&self) -> Option<[u8; 32]> {
        let mut digest = [0u8; 32];
        hex::decode_to_slice(self.token_sha256.expose().trim(), &mut digest).ok()?;
        Some(digest)
    }
}
