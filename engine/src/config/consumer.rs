//! `[pipelines]` (which stages run here), `[consumer]` (limits shared by every
//! pipeline) and the `retry` section every consuming stage has.

use super::*;
use tally_actors::supervise::RetryPolicy;

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PipelinesConfig {
    /// Publish outbox rows to Kafka.
    pub outbox: bool,
    /// Settle `transfers.analyzed` into the double-entry ledger.
    pub ledger: bool,
    /// Score `transfers.requested` inside Kafka transactions.
    pub antifraud: bool,
    /// Project `transfers.settled` / `transfers.rejected` onto the transfer status.
    pub projection: bool,
    /// Materialise `orders.received` into `received_orders`.
    pub orders: bool,
    /// Deliver `transfers.settled` / `transfers.rejected` to `notifications.webhook_url`.
    pub notifications: bool,
}

/// Consumption limits shared by every pipeline.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ConsumerConfig {
    /// Records in flight per partition; when reached, the partition stops fetching.
    pub max_in_flight: usize,
    /// Offsets at most between a partition's committed watermark and the newest record
    /// taken (records completed behind an unfinished one count); past it the partition
    /// pauses until the head of line completes. At least `max_in_flight`.
    pub max_uncommitted: usize,
    /// Live keyed worker actors per pipeline (least recently used idle ones go first).
    pub max_live_workers: usize,
    /// Keyed workers idle this long are passivated.
    #[serde(rename = "idle_after_secs", with = "super::duration::secs")]
    pub idle_after: Duration,
    /// Longest wait for in-flight records on revoke and shutdown, at least. Each pipeline
    /// waits at least the worst case of its retry sequence (every backoff plus every
    /// attempt taking `database.statement_timeout_ms`, or the webhook timeout for
    /// notifications), so that a record in retry finishes before its partition is given up;
    /// a drain still times out on records waiting for an unavailable dependency, which give
    /// up at once and stay uncommitted.
    #[serde(rename = "drain_timeout_ms", with = "super::duration::ms")]
    pub drain_timeout: Duration,
}

/// Blocking exponential retry of one pipeline.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RetryConfig {
    pub max_retries: u32,
    #[serde(rename = "initial_ms", with = "super::duration::ms")]
    pub initial: Duration,
    pub multiplier: f64,
    #[serde(rename = "max_ms", with = "super::duration::ms")]
    pub max: Duration,
}

impl Default for PipelinesConfig {
    fn default() -> Self {
        Self { outbox: true, ledger: true, antifraud: true, projection: true, orders: true, notifications: true }
    }
}

impl Default for ConsumerConfig {
    fn default() -> Self {
        Self {
            max_in_flight: 512,
            max_uncommitted: 10_000,
            max_live_workers: 20_000,
            idle_after: Duration::from_secs(60),
            drain_timeout: Duration::from_millis(20_000),
        }
    }
}

impl Default for RetryConfig {
    /// The policy's own default ([`RetryPolicy::default`]): one source for it.
    fn default() -> Self {
        let p = RetryPolicy::default();
        Self { max_retries: p.max_retries, initial: p.initial, multiplier: p.multiplier, max: p.max }
    }
}

impl RetryConfig {
    #[must_use]
    pub fn policy(&self) -> RetryPolicy {
        RetryPolicy { max_retries: self.max_retries, initial: self.initial, multiplier: self.multiplier, max: self.max }
    }

    pub(super) fn validate(&self, key: &'static str) -> Result<(), ConfigError> {
        if self.initial.is_zero()
            || self.max < self.initial
            || !(1.0..=10.0).contains(&self.multiplier)
            || self.max_retries > 100
        {
            return Err(ConfigError::Invalid {
                key,
                problem: "needs initial_ms > 0, max_ms >= initial_ms, multiplier in 1..=10 and max_retries <= 100"
                    .into(),
            });
        }
        Ok(())
    }
}

impl ConsumerConfig {
    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        if !(1..=100_000).contains(&self.max_in_flight) {
            return invalid("consumer.max_in_flight", "must be between 1 and 100000");
        }
        if self.max_uncommitted < self.max_in_flight || self.max_uncommitted > 10_000_000 {
            return invalid("consumer.max_uncommitted", "must be between consumer.max_in_flight and 10000000");
        }
        if self.max_live_workers == 0 {
            return invalid("consumer.max_live_workers", "must be greater than 0");
        }
        if self.drain_timeout.is_zero() {
            return invalid("consumer.drain_timeout_ms", "must be greater than 0");
        }
        Ok(())
    }
}

/// `key` (a consumer group id) is not blank.
pub(super) fn validate_group(key: &'static str, group_id: &str) -> Result<(), ConfigError> {
    if group_id.trim().is_empty() {
        return invalid(key, "must not be empty");
    }
    Ok(())
}
