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
        Ok(())
    }
}
