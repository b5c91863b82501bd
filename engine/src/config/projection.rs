//! `[projection]`: the status projection's group, retry policy and batching.

use super::*;

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ProjectionConfig {
    pub group_id: String,
    pub retry: RetryConfig,
    /// Most status moves written in one statement: records handled while the writers are
    /// busy are grouped, up to this many. 1 gives every record its own statement.
    pub batch_max: usize,
    /// Status statements in flight at once, each on a connection of the projection's pool.
    pub writers: usize,
}

impl Default for ProjectionConfig {
    fn default() -> Self {
        Self { group_id: "tally-projection".into(), retry: RetryConfig::default(), batch_max: 256, writers: 2 }
    }
}

impl ProjectionConfig {
    pub(crate) fn validate(&self) -> Result<(), ConfigError> {
        validate_group("projection.group_id", &self.group_id)?;
        if !(1..=10_000).contains(&self.batch_max) {
            return invalid("projection.batch_max", "must be between 1 and 10000");
        }
        if !(1..=64).contains(&self.writers) {
            return invalid("projection.writers", "must be between 1 and 64");
        }
        self.retry.validate("projection.retry")
    }
}
