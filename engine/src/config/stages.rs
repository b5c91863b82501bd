//! `[projection]` and `[orders]`: the two stages with nothing but a group and a retry
//! policy.

use super::*;

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ProjectionConfig {
    pub group_id: String,
    pub retry: RetryConfig,
}

/// The order materializer: `orders.received` -> `received_orders`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct OrdersConfig {
    pub group_id: String,
    pub retry: RetryConfig,
}

impl Default for ProjectionConfig {
    fn default() -> Self {
        Self { group_id: "tally-projection".into(), retry: RetryConfig::default() }
    }
}

impl Default for OrdersConfig {
    fn default() -> Self {
        Self { group_id: "tally-orders".into(), retry: RetryConfig::default() }
    }
}

impl ProjectionConfig {
    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        validate_group("projection.group_id", &self.group_id)?;
        self.retry.validate("projection.retry")
    }
}

impl OrdersConfig {
    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        validate_group("orders.group_id", &self.group_id)?;
        self.retry.validate("orders.retry")
    }
}
