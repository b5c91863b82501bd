//! `[consumer]`: consumption limits shared by every pipeline.

use super::*;

/// Consumption limits shared by every pipeline.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ConsumerConfig {
    /// Records in flight per partition. As many again (at least 64) queue for them, and as
    /// many again are stashed, before the partition stops fetching.
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
    /// How long a pipeline's records may wait with none finished (or its consumer stay out
    /// of a steady group) before its stage restarts from the committed offsets. Each
    /// pipeline waits at least the worst case of its retry sequence plus
    /// [`ConsumerConfig::STALL_MARGIN`], the longest a record may rightly hold up its
    /// partition.
    #[serde(rename = "stall_after_ms", with = "super::duration::ms")]
    pub stall_after: Duration,
}

impl Default for ConsumerConfig {
    fn default() -> Self {
        Self {
            max_in_flight: 512,
            max_uncommitted: 10_000,
            max_live_workers: 20_000,
            idle_after: Duration::from_secs(60),
            drain_timeout: Duration::from_millis(20_000),
            stall_after: Duration::from_millis(120_000),
        }
    }
}

impl ConsumerConfig {
    /// Added to the worst case of a pipeline's retry sequence for its least stall bound.
    pub const STALL_MARGIN: Duration = Duration::from_secs(10);

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
        if self.stall_after.is_zero() {
            return invalid("consumer.stall_after_ms", "must be greater than 0");
        }
        Ok(())
    }
}
