//! `[outbox]`: the publisher of the transactional outbox.

use super::*;

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct OutboxConfig {
    pub batch_size: i64,
    /// Claim again after this long even without a notification.
    #[serde(rename = "poll_interval_ms", with = "super::duration::ms")]
    pub poll_interval: Duration,
    /// Wake on PostgreSQL LISTEN/NOTIFY.
    pub listen: bool,
    /// How long published rows are kept before deletion.
    #[serde(rename = "retention_secs", with = "super::duration::secs")]
    pub retention: Duration,
    #[serde(rename = "cleanup_interval_secs", with = "super::duration::secs")]
    pub cleanup_interval: Duration,
    /// Longest wait for the broker's acknowledgement of one batch.
    #[serde(rename = "send_timeout_ms", with = "super::duration::ms")]
    pub send_timeout: Duration,
    #[serde(rename = "backoff_initial_ms", with = "super::duration::ms")]
    pub backoff_initial: Duration,
    #[serde(rename = "backoff_max_ms", with = "super::duration::ms")]
    pub backoff_max: Duration,
    /// Publish loops per daemon (each on a disjoint half of the free key shards), each with
    /// a connection of `database.pools.outbox` while it publishes.
    pub concurrency: usize,
    /// First wait before a row the broker refused for good (parked) is tried again; each
    /// further refusal doubles it, up to `parked_retry_max_ms`.
    #[serde(rename = "parked_retry_initial_ms", with = "super::duration::ms")]
    pub parked_retry_initial: Duration,
    #[serde(rename = "parked_retry_max_ms", with = "super::duration::ms")]
    pub parked_retry_max: Duration,
}

impl Default for OutboxConfig {
    fn default() -> Self {
        Self {
            batch_size: 500,
            poll_interval: Duration::from_millis(1_000),
            listen: true,
            retention: Duration::from_secs(24 * 3600),
            cleanup_interval: Duration::from_secs(60),
            send_timeout: Duration::from_millis(10_000),
            backoff_initial: Duration::from_millis(200),
            backoff_max: Duration::from_millis(10_000),
            concurrency: 2,
            parked_retry_initial: Duration::from_secs(5),
            parked_retry_max: Duration::from_secs(300),
        }
    }
}

impl OutboxConfig {
    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        if !(1..=10_000).contains(&self.batch_size) {
            return invalid("outbox.batch_size", "must be between 1 and 10000");
        }
        if self.poll_interval.is_zero() {
            return invalid("outbox.poll_interval_ms", "must be greater than 0");
        }
        if self.send_timeout.is_zero() {
            return invalid("outbox.send_timeout_ms", "must be greater than 0");
        }
        if self.backoff_initial.is_zero() || self.backoff_max < self.backoff_initial {
            return invalid("outbox.backoff_max_ms", "must be at least outbox.backoff_initial_ms (> 0)");
        }
        if !(1..=8).contains(&self.concurrency) {
            return invalid("outbox.concurrency", "must be between 1 and 8");
        }
        if self.parked_retry_initial.is_zero() || self.parked_retry_max < self.parked_retry_initial {
            return invalid("outbox.parked_retry_max_ms", "must be at least outbox.parked_retry_initial_ms (> 0)");
        }
        if self.cleanup_interval.is_zero() {
            return invalid("outbox.cleanup_interval_secs", "must be greater than 0");
        }
        Ok(())
    }
}
