//! The status projection: `transfers.settled` and `transfers.rejected` set the transfer's
//! status, rejection reason and `updated_at`. Idempotent and monotonic: only a PENDING
//! transfer moves, so a duplicate or late event never moves a final state. An event moves
//! nothing the system of record does not confirm ([`Recorded::confirms`]): SETTLED only
//! what the ledger settled, with its postings; REJECTED only with the reason the ledger or
//! antifraud stored. Any other event (an unknown transfer, a forged or stray outcome) is
//! poison and changes nothing.

use std::sync::Arc;

use diesel_async::AsyncPgConnection;
use futures_util::future::BoxFuture;
use futures_util::FutureExt;
use tally_schema::events::{derived_event_id, TransferRejected, TransferSettled};
use tally_schema::models::status;
use tracing::field::display;
use uuid::Uuid;

use crate::ledger::{REJECTED_KIND, SETTLED_KIND};
use crate::metrics::Metrics;
use crate::record::Record;
use crate::store::group_commit::{Batch, GroupCommit, GroupCommitSettings, Refusal};
use crate::store::outcomes::{self, Recorded};
use crate::store::transfers::{self, Finish};
use crate::store::PgPool;
use crate::supervise::{ErrorClass, HandlerError, RecordHandler};
use crate::trace;

/// The final state an event asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StatusChange {
    pub transfer_id: Uuid,
    pub status: &'static str,
    pub reason: Option<String>,
    /// The event as tally writes it (its fields, in its order): what a receiver is sent,
    /// whatever else the record's bytes carried.
    pub canonical: Vec<u8>,
}

/// Decodes a record of the settled or rejected topic.
///
/// # Errors
/// A poison [`HandlerError`] for records that do not decode.
pub fn decode(record: &Record, settled_topic: &str) -> Result<StatusChange, HandlerError> {
    let payload = record.payload.as_deref().ok_or_else(|| HandlerError::poison("record has no value"))?;
    decode_change(payload, record.topic == settled_topic)
}

/// Decodes the payload of a `TransferSettled` (`settled`) or `TransferRejected` event. Its
/// event id must be the one tally derives from the transfer id for that outcome: one
/// outcome has one event id, so a second event under another id is no outcome of tally's.
///
/// # Errors
/// A poison [`HandlerError`] for payloads that do not decode, or an event id tally would
/// not have given it.
pub fn decode_change(payload: &[u8], settled: bool) -> Result<StatusChange, HandlerError> {
    let canonical = |e: Result<Vec<u8>, serde_json::Error>| {
        e.map_err(|e| HandlerError::poison(format!("cannot write the event back: {e}")))
    };
    if settled {
        let e: TransferSettled = serde_json::from_slice(payload)
            .map_err(|e| HandlerError::poison(format!("undecodable TransferSettled: {e}")))?;
        if e.event_id != derived_event_id(SETTLED_KIND, e.transfer_id) {
            return Err(HandlerError::poison("invalid TransferSettled: not the event id of its transfer's settlement"));
        }
        let canonical = canonical(serde_json::to_vec(&e))?;
        Ok(StatusChange { transfer_id: e.transfer_id, status: status::SETTLED, reason: None, canonical })
    } else {
        let e: TransferRejected = serde_json::from_slice(payload)
            .map_err(|e| HandlerError::poison(format!("undecodable TransferRejected: {e}")))?;
        if e.reason.trim().is_empty() {
            return Err(HandlerError::poison("invalid TransferRejected: empty reason"));
        }
        let ids = [REJECTED_KIND, crate::antifraud::REJECTED_KIND].map(|kind| derived_event_id(kind, e.transfer_id));
        if !ids.contains(&e.event_id) {
            return Err(HandlerError::poison("invalid TransferRejected: not the event id of its transfer's rejection"));
        }
        let canonical = canonical(serde_json::to_vec(&e))?;
        Ok(StatusChange { transfer_id: e.transfer_id, status: status::REJECTED, reason: Some(e.reason), canonical })
    }
}

/// What became of one status move.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Projected {
    Moved,
    /// A duplicate or a late event: the transfer was final already.
    Unchanged,
    /// The system of record does not confirm it: the record is poison, for this reason.
    Refused(String),
}

/// The projection's writes for [`GroupCommit`]: status moves of records handled while the
/// writers are busy share one read of what is recorded and one statement.
pub struct StatusBatch;

impl Batch for StatusBatch {
    type Item = Finish;
    type Outcome = Projected;
    type Error = HandlerError;

    fn write<'a>(
        &'a self,
        conn: &'a mut AsyncPgConnection,
        items: &'a [Finish],
    ) -> BoxFuture<'a, Result<Vec<Projected>, HandlerError>> {
        async move {
            let db = |e: diesel::result::Error| HandlerError::classified("database error", &e);
            let ids: Vec<Uuid> = items.iter().map(|m| m.id).collect();
            let recorded = outcomes::recorded(conn, &ids).await.map_err(db)?;
            let verdicts: Vec<Result<(), String>> = items
                .iter()
                .map(|m| {
                    recorded.get(&m.id).map_or_else(
                        || Recorded::default().confirms(m.status, None),
                        |r| r.confirms(m.status, m.reason.as_deref()),
                    )
                })
                .collect();
            let admitted: Vec<Finish> =
                items.iter().zip(&verdicts).filter(|(_, v)| v.is_ok()).map(|(m, _)| m.clone()).collect();
            let mut moved = transfers::finish_all(conn, &admitted).await.map_err(db)?.into_iter();
            Ok(verdicts
                .into_iter()
                .map(|verdict| match verdict {
                    Err(reason) => Projected::Refused(reason),
                    Ok(()) if moved.next() == Some(true) => Projected::Moved,
                    Ok(()) => Projected::Unchanged,
                })
                .collect())
        }
        .boxed()
    }

    fn refused(&self, why: Refusal<'_>) -> HandlerError {
        refused("projection", why)
    }

    /// Only for a poison record (bad data): it then fails alone, and the others move.
    fn split(&self, error: &HandlerError) -> bool {
        error.class == ErrorClass::Poison
    }
}

/// A refused group commit item as a handler error. A database too slow to take it, or
/// writers stopping, are `Unavailable`, like a pool timeout: the record waits without
/// spending its retries. A broken write is transient.
pub(crate) fn refused(stage: &str, why: Refusal<'_>) -> HandlerError {
    let unavailable = |message: String| HandlerError { class: ErrorClass::Unavailable, message };
    match why {
        Refusal::NoConnection(e) => HandlerError::classified("no database connection", e),
        Refusal::Overloaded => unavailable(format!("the {stage}'s database writes are overloaded")),
        Refusal::Stopped => unavailable(format!("the {stage}'s database writers have stopped")),
        Refusal::Broken => HandlerError::transient(format!("the {stage}'s database write failed")),
    }
}

/// The projection handler.
pub struct StatusProjector {
    writes: GroupCommit<StatusBatch>,
    settled_topic: String,
}

impl StatusProjector {
    /// Starts the group commit of its writes (on the current actix system) over `pool`.
    #[must_use]
    pub fn new(pool: PgPool, settled_topic: String, settings: GroupCommitSettings, metrics: &Metrics) -> Self {
        let writes = GroupCommit::start("projection", StatusBatch, pool, settings, metrics);
        Self { writes, settled_topic }
    }
}

impl RecordHandler for StatusProjector {
    /// Applies the change inside the record's `projection.apply` span.
    fn handle(&self, record: Arc<Record>) -> BoxFuture<'static, Result<&'static str, HandlerError>> {
        let writes = self.writes.clone();
        let span = trace::hop_span!("projection.apply", &record);
        trace::join(&span, record.traceparent());
        let decoded = decode(&record, &self.settled_topic);
        if let Ok(change) = &decoded {
            span.record("transfer.id", display(change.transfer_id));
        }
        trace::handled(span, async move {
            let change = decoded?;
            match writes.submit(Finish { id: change.transfer_id, status: change.status, reason: change.reason }).await?
            {
                Projected::Moved => Ok("projected"),
                Projected::Unchanged => Ok("unchanged"),
                Projected::Refused(reason) => Err(HandlerError::poison(reason)),
            }
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
            defect: None,
        }
    }

    #[test]
    fn decodes_both_topics_and_refuses_poison() {
        let transfer = Uuid::from_u128(2);
        let settled = serde_json::json!({ "eventId": derived_event_id(SETTLED_KIND, transfer), "transferId": transfer,
                                          "settledAt": "2026-01-01T00:00:00Z", "extra": "dropped" })
        .to_string();
        let rejected = |kind: &str| {
            serde_json::json!({ "eventId": derived_event_id(kind, transfer), "transferId": transfer,
                                "reason": "INSUFFICIENT_FUNDS", "rejectedAt": "2026-01-01T00:00:00Z" })
            .to_string()
        };
        let c = decode(&record("s", &settled), "s").unwrap();
        assert_eq!(c.status, "SETTLED");
        assert!(
            !String::from_utf8_lossy(&c.canonical).contains("extra"),
            "the canonical event drops what tally never wrote"
        );
        for kind in [REJECTED_KIND, crate::antifraud::REJECTED_KIND] {
            let c = decode(&record("r", &rejected(kind)), "s").unwrap();
            assert_eq!((c.status, c.reason.as_deref()), ("REJECTED", Some("INSUFFICIENT_FUNDS")), "{kind}");
        }
        assert!(
            decode(&record("s", &rejected(REJECTED_KIND)), "s").is_err(),
            "a rejection on the settled topic is poison"
        );
        assert!(decode(&record("r", "[]"), "s").is_err());
        let other_id =
            settled.replace(&derived_event_id(SETTLED_KIND, transfer).to_string(), &Uuid::from_u128(9).to_string());
        let e = decode(&record("s", &other_id), "s").unwrap_err();
        assert!(e.message.contains("not the event id"), "{e:?}");
        assert!(decode(&record("r", &rejected("settled")), "s").is_err(), "a settled event's id on a rejection");
    }
}
