//! `[notifications]`: webhook delivery with non-blocking retry topics.

use super::*;

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct NotificationsConfig {
    /// Where events are POSTed. Empty: the notifications pipeline does not run. It may
    /// carry credentials (`user:password@`, `?token=`): they never print.
    pub webhook_url: SecretUrl,
    /// HMAC-SHA256 key of the `X-Tally-Signature` header.
    pub webhook_secret: Secret,
    /// A file holding `webhook_secret` (a mounted secret).
    pub webhook_secret_file: String,
    /// PEM file of the roots an `https://` receiver's certificate must chain to; empty:
    /// the system's roots.
    pub webhook_root_cert: String,
    #[serde(rename = "timeout_ms", with = "super::duration::ms")]
    pub timeout: Duration,
    pub group_id: String,
    /// Non-blocking retry topics: first delay, multiplier, longest delay,
    /// and attempts in all (the first plus one per retry topic).
    #[serde(rename = "retry_initial_ms", with = "super::duration::ms")]
    pub retry_initial: Duration,
    pub retry_multiplier: f64,
    #[serde(rename = "retry_max_ms", with = "super::duration::ms")]
    pub retry_max: Duration,
    pub max_attempts: u32,
    /// Blocking retry for the database or broker being unavailable.
    pub retry: RetryConfig,
}

impl Default for NotificationsConfig {
    fn default() -> Self {
        Self {
            webhook_url: SecretUrl::default(),
            webhook_secret: Secret::default(),
            webhook_secret_file: String::new(),
            webhook_root_cert: String::new(),
            timeout: Duration::from_millis(5_000),
            group_id: "tally-notifications".into(),
            retry_initial: Duration::from_millis(1_000),
            retry_multiplier: 2.0,
            retry_max: Duration::from_millis(30_000),
            max_attempts: 4,
            retry: RetryConfig::default(),
        }
    }
}

impl NotificationsConfig {
    /// The PEM roots of `webhook_root_cert`, when set.
    ///
    /// # Errors
    /// When the file cannot be read, as a message naming it.
    pub fn root_certs(&self) -> Result<Option<Vec<u8>>, String> {
        if self.webhook_root_cert.is_empty() {
            return Ok(None);
        }
        std::fs::read(&self.webhook_root_cert)
            .map(Some)
            .map_err(|e| format!("cannot read {}: {e}", self.webhook_root_cert))
    }

    /// The delay of each retry topic, in order.
    #[must_use]
    pub fn delays_ms(&self) -> Vec<u64> {
        let curve = tally_actors::backoff::Backoff {
            initial: self.retry_initial,
            multiplier: self.retry_multiplier,
            max: self.retry_max,
        };
        tally_actors::notify::retry_delays(curve, self.max_attempts)
    }
}

impl NotificationsConfig {
    pub(crate) fn validate(&self) -> Result<(), ConfigError> {
        let url = self.webhook_url.expose();
        if !url.is_empty() && !url.starts_with("http://") && !url.starts_with("https://") {
            return invalid("notifications.webhook_url", "must be an http:// or https:// URL (or empty to disable)");
        }
        match self.root_certs() {
            Err(e) => return invalid("notifications.webhook_root_cert", e),
            Ok(Some(pem)) if reqwest::Certificate::from_pem_bundle(&pem).map_or(true, |c| c.is_empty()) => {
                return invalid("notifications.webhook_root_cert", "holds no PEM certificate");
            }
            Ok(_) => {}
        }
        if !url.is_empty() && self.webhook_secret.is_empty() {
            return invalid("notifications.webhook_secret", "must be set when notifications.webhook_url is");
        }
        if self.timeout.is_zero() || self.retry_initial.is_zero() || self.retry_max < self.retry_initial {
            return invalid(
                "notifications.retry_initial_ms",
                "needs timeout_ms > 0, retry_initial_ms > 0 and retry_max_ms >= retry_initial_ms",
            );
        }
        if !(1.0..=10.0).contains(&self.retry_multiplier) {
            return invalid("notifications.retry_multiplier", "must be between 1 and 10");
        }
        if !(1..=10).contains(&self.max_attempts) {
            return invalid("notifications.max_attempts", "must be between 1 and 10");
        }
        let mut delays = self.delays_ms();
        delays.dedup();
        if delays.len() != self.delays_ms().len() {
            return invalid(
                "notifications.retry_max_ms",
                "caps two retry delays to the same value; retry topics must differ",
            );
        }
        validate_group("notifications.group_id", &self.group_id)?;
        self.retry.validate("notifications.retry")
    }
}
