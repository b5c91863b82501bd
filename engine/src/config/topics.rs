//! `[kafka.topics]`: the names of the topics tally reads and writes. Each source topic has
//! a `-dlt` twin, and the notifications' sources have retry topics
//! ([`super::Config::topics_to_create`]).

use super::*;

/// The topic names. Every stage's entry (`crate::stages`) reads its inputs and outputs
/// here.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TopicsConfig {
    pub transfers_requested: String,
    pub transfers_analyzed: String,
    pub transfers_rejected: String,
    pub transfers_settled: String,
    pub orders_received: String,
}

impl Default for TopicsConfig {
    fn default() -> Self {
        use tally_schema::topics;
        Self {
            transfers_requested: topics::TRANSFERS_REQUESTED.into(),
            transfers_analyzed: topics::TRANSFERS_ANALYZED.into(),
            transfers_rejected: topics::TRANSFERS_REJECTED.into(),
            transfers_settled: topics::TRANSFERS_SETTLED.into(),
            orders_received: topics::ORDERS_RECEIVED.into(),
        }
    }
}

impl TopicsConfig {
    /// Every source topic, in a fixed order.
    #[must_use]
    pub fn sources(&self) -> Vec<&str> {
        vec![
            &self.transfers_requested,
            &self.transfers_analyzed,
            &self.transfers_rejected,
            &self.transfers_settled,
            &self.orders_received,
        ]
    }

    /// Every topic tally uses: each source topic and its `-dlt` twin.
    #[must_use]
    pub fn all(&self) -> Vec<String> {
        self.sources().into_iter().flat_map(|t| [t.to_owned(), tally_schema::topics::dlt(t)]).collect()
    }
}
