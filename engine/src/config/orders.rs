//! `[orders]`: the order materializer's group and retry policy.

use super::*;

/// The order materializer: `orders.received` -> `received_orders`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct OrdersConfig {
    pub group_id: String,
    pub retry: RetryConfig,
}

impl Default for OrdersConfig {
    fn default() -> Self {
        Self { group_id: "tally-orders".into(), retry: RetryConfig::default() }
    }
}

impl OrdersConfig {
    pub(crate) fn validate(&self) -> Result<(), ConfigError> {
        validate_group("orders.group_id", &self.group_id)?;
        self.retry.validate("orders.retry")
    }
}
