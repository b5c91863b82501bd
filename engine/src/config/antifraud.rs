//! `[antifraud]`: the risk rules and the transactional stage.

use super::*;

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AntifraudConfig {
    pub group_id: String,
    /// Transactional id of this instance; must be unique per running instance and stable
    /// across its restarts. Empty: `tally-antifraud-<instance.id>`.
    pub transactional_id: String,
    /// Scores at or above this are blocked (seed: 80).
    pub block_score: i32,
    /// Score of every transfer.
    pub base_score: i32,
    /// `[[min_amount_cents, points], ...]`; the highest matching tier counts.
    pub amount_tiers: Vec<(i64, i32)>,
    pub velocity_window_secs: u64,
    /// More transfers than this from one source account inside the window add
    /// `velocity_points`.
    pub velocity_max: usize,
    pub velocity_points: i32,
    /// Records per Kafka transaction at most.
    pub batch_max_records: usize,
    /// How long a transaction waits for more records after the first.
    pub batch_max_wait_ms: u64,
    /// Broker-side limit of one transaction (`transaction.timeout.ms`).
    pub transaction_timeout_ms: u64,
    /// How long the stage waits in one transaction call (adding offsets, committing)
    /// before it serves its consumer group and makes the call again: a call that outlasts
    /// this is retriable and is resumed, never aborted.
    pub call_timeout_ms: u64,
    /// Backoff between attempts of a failed transaction.
    pub retry: RetryConfig,
}

impl Default for AntifraudConfig {
    fn default() -> Self {
        Self {
            group_id: "tally-antifraud".into(),
            transactional_id: String::new(),
            block_score: 80,
            base_score: 5,
            amount_tiers: vec![(1_000_000, 25), (5_000_000, 50), (10_000_000, 80)],
            velocity_window_secs: 60,
            velocity_max: 20,
            velocity_points: 40,
            batch_max_records: 500,
            batch_max_wait_ms: 10,
            transaction_timeout_ms: 30_000,
            call_timeout_ms: 5_000,
            retry: RetryConfig { max_retries: 10, initial_ms: 200, multiplier: 2.0, max_ms: 10_000 },
        }
    }
}

impl AntifraudConfig {
    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        validate_group("antifraud.group_id", &self.group_id)?;
        if !(1..=100).contains(&self.block_score) {
            return invalid("antifraud.block_score", "must be between 1 and 100");
        }
        if self.amount_tiers.iter().any(|(min, points)| *min <= 0 || !(0..=100).contains(points)) {
            return invalid("antifraud.amount_tiers", "needs positive amounts and points between 0 and 100");
        }
        if self.velocity_window_secs == 0 {
            return invalid("antifraud.velocity_window_secs", "must be greater than 0");
        }
        if !(1..=10_000).contains(&self.batch_max_records) {
            return invalid("antifraud.batch_max_records", "must be between 1 and 10000");
        }
        if self.transaction_timeout_ms < 1_000 {
            return invalid("antifraud.transaction_timeout_ms", "must be at least 1000");
        }
        if self.call_timeout_ms == 0 || self.call_timeout_ms > self.transaction_timeout_ms {
            return invalid(
                "antifraud.call_timeout_ms",
                "must be positive and at most antifraud.transaction_timeout_ms",
            );
        }
        self.retry.validate("antifraud.retry")
    }
}
