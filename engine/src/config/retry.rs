//! The `retry` section every consuming stage has, and the check of a stage's consumer
//! group.

use super::*;
use tally_actors::supervise::RetryPolicy;

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

/// `key` (a consumer group id) is not blank.
pub(super) fn validate_group(key: &'static str, group_id: &str) -> Result<(), ConfigError> {
    if group_id.trim().is_empty() {
        return invalid(key, "must not be empty");
    }
    Ok(())
}
