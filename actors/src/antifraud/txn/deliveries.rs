//! The transactional producer's delivery reports. A transaction whose records failed
//! delivery without making it abortable first (the producer learnt from metadata that it
//! may not write a topic, a record timed out) fails its commit with a plain "message(s)
//! failed delivery": only the reports say why, so the codes of the open transaction's
//! failed deliveries are kept here for the loop to read.

use std::sync::{Mutex, PoisonError};

use rdkafka::error::RDKafkaErrorCode;
use rdkafka::producer::{DeliveryResult, ProducerContext};
use rdkafka::ClientContext;

/// Served on the producer's own thread.
#[derive(Default)]
pub(in crate::antifraud) struct TxnContext {
    /// The distinct error codes of deliveries that failed since the transaction began.
    failed: Mutex<Vec<RDKafkaErrorCode>>,
}

impl TxnContext {
    /// A transaction begins: earlier failures are no longer its own.
    pub(super) fn begin(&self) {
        self.failed.lock().unwrap_or_else(PoisonError::into_inner).clear();
    }

    /// The distinct codes of the deliveries that failed in this transaction so far.
    pub(super) fn failed(&self) -> Vec<RDKafkaErrorCode> {
        self.failed.lock().unwrap_or_else(PoisonError::into_inner).clone()
    }

    fn record(&self, code: RDKafkaErrorCode) {
        let mut failed = self.failed.lock().unwrap_or_else(PoisonError::into_inner);
        if !failed.contains(&code) {
            failed.push(code);
        }
    }
}

impl ClientContext for TxnContext {}

impl ProducerContext for TxnContext {
    type DeliveryOpaque = ();

    fn delivery(&self, result: &DeliveryResult<'_>, _: Self::DeliveryOpaque) {
        if let Err((e, _)) = result {
            if let Some(code) = e.rdkafka_error_code() {
                self.record(code);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failures_are_kept_once_each_until_the_next_transaction() {
        let context = TxnContext::default();
        context.record(RDKafkaErrorCode::TopicAuthorizationFailed);
        context.record(RDKafkaErrorCode::TopicAuthorizationFailed);
        context.record(RDKafkaErrorCode::MessageTimedOut);
        assert_eq!(
            context.failed(),
            vec![RDKafkaErrorCode::TopicAuthorizationFailed, RDKafkaErrorCode::MessageTimedOut]
        );
        context.begin();
        assert!(context.failed().is_empty());
    }
}
