//! `[outbox]`: the publisher of the transactional outbox.

use super::*;

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

impl OutboxConfig {
    #[must_use]
    pub fn poll_interval(&self) -> Duration {
        Duration::from_millis(self.poll_interval_ms)
    }
}

impl OutboxConfig {
    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        if !(1..=10_000).contains(&self.batch_size) {
            return invalid("outbox.batch_size", "must be between 1 and 10000");
        }
        if self.poll_interval_ms == 0 {
            return invalid("outbox.poll_interval_ms", "must be greater than 0");
        }
        if self.send_timeout_ms == 0 {
            return invalid("outbox.send_timeout_ms", "must be greater than 0");
        }
        if self.backoff_initial_ms == 0 || self.backoff_max_ms < self.backoff_initial_ms {
            return invalid("outbox.backoff_max_ms", "must be at least outbox.backoff_initial_ms (> 0)");
        }
        if !(1..=8).contains(&self.concurrency) {
            return invalid("outbox.concurrency", "must be between 1 and 8, and below database.pool_size");
        }
        if self.cleanup_interval_secs == 0 {
            return invalid("outbox.cleanup_interval_secs", "must be greater than 0");
        }
        Ok(())
    }
}
