//! The status projection: `transfers.settled` and `transfers.rejected` set the transfer's
//! status, rejection reason and `updated_at`. Idempotent and monotonic: only a PENDING
//! transfer moves, so a duplicate or late event never moves a final state.

use std::sync::Arc;

use futures_util::future::BoxFuture;
use tally_schema::events::{TransferRejected, TransferSettled};
use tally_schema::models::status;
use tracing::field::display;
use uuid::Uuid;

use crate::consume::Record;
use crate::store::{transfers, PgPool};
use crate::supervise::{HandlerError, RecordHandler};
use crate::trace;

/// The final state an event asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StatusChange {
    pub transfer_id: Uuid,
    pub status: &'static str,
    pub reason: Option<String>,
}

/// Decodes a record of the settled or rejected topic.
///
/// # Errors
/// A poison [`HandlerError`] for records that do not decode.
pub fn decode(record: &Record, settled_topic: &str) -> Result<StatusChange, HandlerError> {
    let payload = record.payload.as_deref().ok_or_else(|| HandlerError::poison("record has no value"))?;
    if record.topic == settled_topic {
        let e: TransferSettled = serde_json::from_slice(payload)
            .map_err(|e| HandlerError::poison(format!("undecodable TransferSettled: {e}")))?;
        Ok(StatusChange { transfer_id: e.transfer_id, status: status::SETTLED, reason: None })
    } else {
        let e: TransferRejected = serde_json::from_slice(payload)
            .map_err(|e| HandlerError::poison(format!("undecodable TransferRejected: {e}")))?;
        if e.reason.trim().is_empty() {
            return Err(HandlerError::poison("invalid TransferRejected: empty reason"));
        }
        Ok(StatusChange { transfer_id: e.transfer_id, status: status::REJECTED, reason: Some(e.reason) })
    }
}

/// Applies `change`; returns whether a PENDING transfer moved.
///
/// # Errors
/// Any database error.
pub async fn apply(pool: &PgPool, change: &StatusChange) -> Result<bool, HandlerError> {
    let mut conn = pool.get().await.map_err(|e| HandlerError::classified("no database connection", &e))?;
    transfers::finish(&mut conn, change.transfer_id, change.status, change.reason.as_deref())
        .await
        .map_err(|e| HandlerError::classified("database error", &e))
}

/// The projection handler.
pub struct StatusProjector {
    pool: PgPool,
    settled_topic: String,
}

impl StatusProjector {
    #[must_use]
    pub fn new(pool: PgPool, settled_topic: String) -> Self {
        Self { pool, settled_topic }
    }
}

impl RecordHandler for StatusProjector {
    /// Applies the change inside the record's `projection.apply` span.
    fn handle(&self, record: Arc<Record>) -> BoxFuture<'static, Result<&'static str, HandlerError>> {
        let pool = self.pool.clone();
        let span = trace::hop_span!("projection.apply", record.topic.as_str());
        trace::join(&span, record.traceparent());
        let decoded = decode(&record, &self.settled_topic);
        if let Ok(change) = &decoded {
            span.record("transfer.id", display(change.transfer_id));
        }
        trace::handled(span, async move {
            let change = decoded?;
            // Unchanged: a duplicate, a late event after a final state, or a transfer this
            // database does not hold.
            Ok(if apply(&pool, &change).await? { "projected" } else { "unchanged" })
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(topic: &str, payload: &str) -> Record {
        Record {
            topic: topic.into(),
            partition: 0,
            offset: 0,
            key: None,
            payload: Some(payload.as_bytes().to_vec()),
            headers: vec![],
            timestamp: None,
        }
    }

    #[test]
    fn decodes_both_topics_and_refuses_poison() {
        let settled = r#"{"eventId":"00000000-0000-0000-0000-000000000001","transferId":"00000000-0000-0000-0000-000000000002","settledAt":"2026-01-01T00:00:00Z"}"#;
        let rejected = r#"{"eventId":"00000000-0000-0000-0000-000000000001","transferId":"00000000-0000-0000-0000-000000000002","reason":"INSUFFICIENT_FUNDS","rejectedAt":"2026-01-01T00:00:00Z"}"#;
        assert_eq!(decode(&record("s", settled), "s").map(|c| c.status), Ok("SETTLED"));
        let c = decode(&record("r", rejected), "s").unwrap();
        assert_eq!((c.status, c.reason.as_deref()), ("REJECTED", Some("INSUFFICIENT_FUNDS")));
        assert!(decode(&record("s", rejected), "s").is_err(), "a rejection on the settled topic is poison");
        assert!(decode(&record("r", "[]"), "s").is_err());
    }
}
