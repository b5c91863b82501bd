//! Kafka record header names.

/// The event id (UUID string) of the record's payload.
pub const EVENT_ID: &str = "event-id";
/// The event type name, e.g. `TransferRequested`.
pub const EVENT_TYPE: &str = "event-type";
/// W3C trace context, when known.
pub const TRACEPARENT: &str = "traceparent";

/// Dead-letter headers, added to the original key, value and headers.
pub const DLT_ORIGINAL_TOPIC: &str = "dlt-original-topic";
pub const DLT_ORIGINAL_PARTITION: &str = "dlt-original-partition";
pub const DLT_ORIGINAL_OFFSET: &str = "dlt-original-offset";
pub const DLT_ORIGINAL_TIMESTAMP: &str = "dlt-original-timestamp";
pub const DLT_CONSUMER_GROUP: &str = "dlt-consumer-group";
pub const DLT_EXCEPTION_KIND: &str = "dlt-exception-kind";

/// The values of [`DLT_EXCEPTION_KIND`] (and of `dead_letters.exception_kind`).
pub mod dlt_kind {
    /// The record can never be processed (it does not decode, or breaks a contract).
    pub const POISON: &str = "poison";
    /// Every retry failed.
    pub const EXHAUSTED: &str = "exhausted";
}
pub const DLT_EXCEPTION_MESSAGE: &str = "dlt-exception-message";
pub const DLT_ATTEMPTS: &str = "dlt-attempts";

/// Set on records republished from a DLT.
pub const REPLAYED_FROM: &str = "replayed-from";

/// Non-blocking retry topics: failed attempts so far, where the record first
/// came from, and when it is due for its next attempt (epoch milliseconds).
pub const RETRY_ATTEMPTS: &str = "retry-attempts";
pub const RETRY_ORIGINAL_TOPIC: &str = "retry-original-topic";
pub const RETRY_ORIGINAL_PARTITION: &str = "retry-original-partition";
pub const RETRY_ORIGINAL_OFFSET: &str = "retry-original-offset";
pub const RETRY_ORIGINAL_TIMESTAMP: &str = "retry-original-timestamp";
pub const RETRY_DUE_AT: &str = "retry-due-at";
pub const RETRY_LAST_ERROR: &str = "retry-last-error";
/// Every header the retry machinery adds starts with this.
pub const RETRY_PREFIX: &str = "retry-";
