//! The ledger pipeline: `transfers.analyzed` -> keyed workers (one per source account) ->
//! group-committed settlement -> outbox (`transfers.settled` / `transfers.rejected`).

mod batcher;
pub mod plan;
pub mod policy;
mod settle;

pub use crate::store::invariants;

use std::sync::Arc;

use actix::Addr;
use futures_util::future::BoxFuture;
use tally_schema::events::TransferAnalyzed;
use tally_schema::{headers, AccountId, Currency};
use tracing::field::display;

pub use batcher::{BatchSettler, Settle, SettleError, SettlementBatcher, Settler};
pub use policy::{FlushPolicy, OnRequest};
pub use settle::{
    reason, settle_batch, write_outcomes_and_events, LedgerTopics, SettleOutcome, SettleRequest, REJECTED_KIND,
    SETTLED_KIND,
};

use crate::record::Record;
use crate::supervise::{HandlerError, RecordHandler};
use crate::trace;

/// The ledger's record handler: one instance, shared by every account's
/// [`crate::consume::KeyedWorker`] (keyed by source account), which
/// calls it one record at a time. It decodes the `TransferAnalyzed` (poison when it cannot
/// be), then settles it through the batcher.
pub struct LedgerHandler {
    batcher: Addr<SettlementBatcher>,
}

impl LedgerHandler {
    #[must_use]
    pub fn new(batcher: Addr<SettlementBatcher>) -> Self {
        Self { batcher }
    }
}

/// Decodes and validates a `TransferAnalyzed` record.
///
/// # Errors
/// A poison [`HandlerError`] naming what is wrong.
pub fn decode_analyzed(record: &Record) -> Result<SettleRequest, HandlerError> {
    Ok(SettleRequest { transfer: decode_transfer(record)?, traceparent: valid_traceparent(record) })
}

fn decode_transfer(record: &Record) -> Result<TransferAnalyzed, HandlerError> {
    let payload = record.payload.as_deref().ok_or_else(|| HandlerError::poison("record has no value"))?;
    let transfer: TransferAnalyzed = serde_json::from_slice(payload)
        .map_err(|e| HandlerError::poison(format!("undecodable TransferAnalyzed: {e}")))?;
    AccountId::parse("sourceAccount", &transfer.source_account)
        .and_then(|_| AccountId::parse("destinationAccount", &transfer.destination_account))
        .and_then(|_| Currency::parse("currency", &transfer.currency))
        .map_err(|e| HandlerError::poison(format!("invalid TransferAnalyzed: {e}")))?;
    if transfer.amount_cents <= 0 {
        return Err(HandlerError::poison("invalid TransferAnalyzed: amountCents must be positive"));
    }
    if transfer.source_account == transfer.destination_account {
        return Err(HandlerError::poison("invalid TransferAnalyzed: source and destination are the same account"));
    }
    Ok(transfer)
}

/// The record's `traceparent` when it is a valid W3C one; anything else (too long for the
/// outbox column, malformed) is ignored with a warning rather than failing the record.
fn valid_traceparent(record: &Record) -> Option<String> {
    let valid = record.traceparent();
    if valid.is_none() {
        if let Some(value) = record.header(headers::TRACEPARENT) {
            tracing::warn!(topic = %record.topic, partition = record.partition, offset = record.offset,
                           length = value.len(), "Ignoring an invalid traceparent header.");
        }
    }
    valid.map(str::to_owned)
}

impl RecordHandler for LedgerHandler {
    /// Settles inside the record's `ledger.settle` span, which covers the wait for a batch
    /// and the batch's transaction; the span's traceparent goes on the outcome event.
    fn handle(&self, record: Arc<Record>) -> BoxFuture<'static, Result<&'static str, HandlerError>> {
        let batcher = self.batcher.clone();
        let span = trace::hop_span!("ledger.settle", &record);
        let traceparent = trace::join(&span, valid_traceparent(&record).as_deref());
        let request = decode_transfer(&record).map(|transfer| SettleRequest { transfer, traceparent });
        if let Ok(r) = &request {
            span.record("transfer.id", display(r.transfer.transfer_id));
        }
        trace::handled(span, async move {
            match batcher.send(Settle(request?)).await {
                Ok(Ok(outcome)) => Ok(outcome.label()),
                Ok(Err(e)) => Err(HandlerError { class: e.class, message: e.to_string() }),
                Err(e) => Err(HandlerError::transient(format!("settlement batcher unavailable: {e}"))),
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(payload: &str) -> Record {
        Record {
            topic: "transfers.analyzed".into(),
            partition: 0,
            offset: 0,
            key: Some(b"A".to_vec()),
            payload: Some(payload.as_bytes().to_vec()),
            headers: vec![],
            timestamp: None,
            defect: None,
        }
    }

    #[test]
    fn poison_records_are_classified() {
        use crate::supervise::ErrorClass;
        let ok = r#"{"eventId":"00000000-0000-0000-0000-000000000001","transferId":"00000000-0000-0000-0000-000000000002","sourceAccount":"A","destinationAccount":"B","amountCents":5,"currency":"BRL","score":1,"analyzedAt":"2026-01-01T00:00:00Z"}"#;
        assert!(decode_analyzed(&record(ok)).is_ok());
        for bad in [
            "{not json",
            r#"{"eventId":"00000000-0000-0000-0000-000000000001"}"#,
            &ok.replace("\"amountCents\":5", "\"amountCents\":0"),
            &ok.replace("\"BRL\"", "\"brl\""),
            &ok.replace("\"destinationAccount\":\"B\"", "\"destinationAccount\":\"A\""),
        ] {
            let err = decode_analyzed(&record(bad)).expect_err(bad);
            assert_eq!(err.class, ErrorClass::Poison, "{bad}");
        }
    }
}
