//! Default topic names. Every name is configurable; these are the defaults.

pub const TRANSFERS_REQUESTED: &str = "transfers.requested";
pub const TRANSFERS_ANALYZED: &str = "transfers.analyzed";
pub const TRANSFERS_REJECTED: &str = "transfers.rejected";
pub const TRANSFERS_SETTLED: &str = "transfers.settled";
pub const ORDERS_RECEIVED: &str = "orders.received";

/// The dead-letter twin of `topic`.
#[must_use]
pub fn dlt(topic: &str) -> String {
    format!("{topic}-dlt")
}

/// The non-blocking retry topic of `topic` for a delay of `delay_ms`.
#[must_use]
pub fn retry(topic: &str, delay_ms: u64) -> String {
    format!("{topic}-retry-{delay_ms}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn derived_topic_names() {
        assert_eq!(dlt(TRANSFERS_ANALYZED), "transfers.analyzed-dlt");
        assert_eq!(retry(TRANSFERS_SETTLED, 1000), "transfers.settled-retry-1000");
    }
}
