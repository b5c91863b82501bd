//! `[antifraud]`: the risk rules and the transactional stage.

use super::*;
use tally_actors::antifraud::RiskRules;

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
    #[serde(rename = "velocity_window_secs", with = "super::duration::secs")]
    pub velocity_window: Duration,
    /// More transfers than this from one source account inside the window add
    /// `velocity_points`.
    pub velocity_max: usize,
    pub velocity_points: i32,
    /// Records per Kafka transaction at most.
    pub batch_max_records: usize,
    /// How long a transaction waits for more records after the first.
    #[serde(rename = "batch_max_wait_ms", with = "super::duration::ms")]
    pub batch_max_wait: Duration,
    /// Broker-side limit of one transaction (`transaction.timeout.ms`).
    #[serde(rename = "transaction_timeout_ms", with = "super::duration::ms")]
    pub transaction_timeout: Duration,
    /// How long the stage waits in one transaction call (adding offsets, committing)
    /// before it serves its consumer group and makes the call again: a call that outlasts
    /// this is retriable and is resumed, never aborted.
    #[serde(rename = "call_timeout_ms", with = "super::duration::ms")]
    pub call_timeout: Duration,
    /// Backoff between attempts of a failed transaction.
    pub retry: RetryConfig,
}

impl Default for AntifraudConfig {
    /// The risk rules' defaults are [`RiskRules::default`]: one source for them.
    fn default() -> Self {
        let rules = RiskRules::default();
        Self {
            group_id: "tally-antifraud".into(),
            transactional_id: String::new(),
            block_score: 80,
            base_score: rules.base,
            amount_tiers: rules.amount_tiers,
            velocity_window: rules.velocity_window,
            velocity_max: rules.velocity_max,
            velocity_points: rules.velocity_points,
            batch_max_records: 500,
            batch_max_wait: Duration::from_millis(10),
            transaction_timeout: Duration::from_millis(30_000),
            call_timeout: Duration::from_millis(5_000),
            retry: RetryConfig {
                max_retries: 10,
                initial: Duration::from_millis(200),
                multiplier: 2.0,
                max: Duration::from_millis(10_000),
            },
        }
    }
}

impl AntifraudConfig {
    pub(crate) fn validate(&self) -> Result<(), ConfigError> {
        validate_group("antifraud.group_id", &self.group_id)?;
        if !(1..=100).contains(&self.block_score) {
            return invalid("antifraud.block_score", "must be between 1 and 100");
        }
        if self.amount_tiers.iter().any(|(min, points)| *min <= 0 || !(0..=100).contains(points)) {
            return invalid("antifraud.amount_tiers", "needs positive amounts and points between 0 and 100");
        }
        if self.velocity_window.is_zero() {
            return invalid("antifraud.velocity_window_secs", "must be greater than 0");
        }
        if !(1..=10_000).contains(&self.batch_max_records) {
            return invalid("antifraud.batch_max_records", "must be between 1 and 10000");
        }
        if self.transaction_timeout < Duration::from_secs(1) {
            return invalid("antifraud.transaction_timeout_ms", "must be at least 1000");
        }
        if self.call_timeout.is_zero() || self.call_timeout > self.transaction_timeout {
            return invalid(
                "antifraud.call_timeout_ms",
                "must be positive and at most antifraud.transaction_timeout_ms",
            );
        }
        self.retry.validate("antifraud.retry")
    }
}
