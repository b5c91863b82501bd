//! What the antifraud stage writes for one input record (plain logic): the decoded
//! request, and the output record built from its stored [`Decision`], or a dead-letter
//! record for input that cannot be decoded; and the record's `antifraud.decide` hop span
//! ([`Hops`]).

use std::collections::HashMap;

use chrono::Datelike;
use rdkafka::message::{Header, OwnedHeaders};
use tally_schema::events::{derived_event_id, TransferAnalyzed, TransferRejected, TransferRequested};
use tally_schema::values::is_valid_traceparent;
use tally_schema::{headers, topics, AccountId, Currency, EventType};
use tracing::field::display;
use tracing::Span;
use uuid::Uuid;

use super::decisions::Decision;
use super::{AntifraudSpec, ANALYZED_KIND, REJECTED_KIND};
use crate::record::Record;
use crate::supervise::dlt_headers;
use crate::trace;

/// One output record of a batch.
pub(super) struct Output {
    pub topic: String,
    pub partition: Option<i32>,
    pub key: Option<Vec<u8>>,
    pub payload: Option<Vec<u8>>,
    pub headers: OwnedHeaders,
    pub outcome: &'static str,
    /// For a dead-letter output: why its input record is poison, so that the record can
    /// fall back to the `dead_letters` table when the DLT refuses it.
    pub dead_letter: Option<String>,
}

/// Decodes and validates a `TransferRequested`; `Err` names why it is poison.
pub(super) fn decode(record: &Record) -> Result<TransferRequested, String> {
    if let Some(defect) = &record.defect {
        return Err(defect.clone());
    }
    let payload = record.payload.as_deref().ok_or("record has no value")?;
    let t: TransferRequested =
        serde_json::from_slice(payload).map_err(|e| format!("undecodable TransferRequested: {e}"))?;
    AccountId::parse("sourceAccount", &t.source_account)
        .and_then(|_| AccountId::parse("destinationAccount", &t.destination_account))
        .and_then(|_| Currency::parse("currency", &t.currency))
        .map_err(|e| format!("invalid TransferRequested: {e}"))?;
    if t.amount_cents <= 0 {
        return Err("invalid TransferRequested: amountCents must be positive".into());
    }
    // Far outside this range chrono and PostgreSQL disagree (or overflow): a decision for
    // such a request could never be stored.
    if !(1970..=9999).contains(&t.requested_at.year()) {
        return Err("invalid TransferRequested: requestedAt must fall between the years 1970 and 9999".into());
    }
    Ok(t)
}

/// The dead-letter output of a poison record.
pub(super) fn poison(record: &Record, spec: &AntifraudSpec, reason: String) -> Output {
    Output {
        topic: topics::dlt(&record.topic),
        partition: Some(record.partition),
        key: record.key.clone(),
        payload: record.payload.clone(),
        headers: dlt_headers(record, &spec.group_id, headers::dlt_kind::POISON, &reason, 1),
        outcome: "dead_lettered",
        dead_letter: Some(reason),
    }
}

/// The output of a decided transfer: `TransferAnalyzed` or `TransferRejected`, keyed by the
/// source account, with an id derived from the transfer id and the decision's own score,
/// reason and time, so every delivery of the transfer publishes the same event.
/// `traceparent` is the one the output carries (see [`Hops::traceparent`]).
pub(super) fn decided(t: &TransferRequested, d: &Decision, spec: &AntifraudSpec, traceparent: Option<&str>) -> Output {
    let (topic, id, kind, payload, outcome) = if d.blocked() {
        let id = derived_event_id(REJECTED_KIND, t.transfer_id);
        let event = TransferRejected {
            event_id: id,
            transfer_id: t.transfer_id,
            reason: d.reason.clone().unwrap_or_else(|| super::BLOCKED_BY_ANTIFRAUD.into()),
            rejected_at: d.decided_at,
        };
        (&spec.rejected, id, EventType::TransferRejected, serde_json::to_vec(&event), "blocked")
    } else {
        let id = derived_event_id(ANALYZED_KIND, t.transfer_id);
        let event = TransferAnalyzed {
            event_id: id,
            transfer_id: t.transfer_id,
            source_account: t.source_account.clone(),
            destination_account: t.destination_account.clone(),
            amount_cents: t.amount_cents,
            currency: t.currency.clone(),
            score: d.score,
            analyzed_at: d.decided_at,
            client: t.client.clone(),
        };
        (&spec.analyzed, id, EventType::TransferAnalyzed, serde_json::to_vec(&event), "analyzed")
    };
    let id = id.to_string();
    let mut hdrs = OwnedHeaders::new_with_capacity(3)
        .insert(Header { key: headers::EVENT_ID, value: Some(id.as_bytes()) })
        .insert(Header { key: headers::EVENT_TYPE, value: Some(kind.as_str().as_bytes()) });
    // Only a valid traceparent travels on: anything else could make the output too large
    // to publish, or too long for the ledger's outbox column.
    if let Some(tp) = traceparent.filter(|tp| is_valid_traceparent(tp)) {
        hdrs = hdrs.insert(Header { key: headers::TRACEPARENT, value: Some(tp) });
    }
    // Serialising tally's own event types cannot fail.
    let payload = payload.unwrap_or_default();
    let key = t.source_account.clone().into_bytes();
    let hdrs = spec.keyring.sign(hdrs, &key, &payload, &id, kind.as_str());
    Output {
        topic: topic.clone(),
        partition: None,
        key: Some(key),
        payload: Some(payload),
        headers: hdrs,
        outcome,
        dead_letter: None,
    }
}

/// The `antifraud.decide` hop spans of one batch, by partition and offset of their input
/// record (the stage reads one topic): each lasts from the batch's decisions until its
/// transaction commits or the stage gives up on it, and ends when the batch is dropped.
/// Only records with a valid traceparent have one.
pub(super) struct Hops(HashMap<(i32, i64), Hop>);

struct Hop {
    span: Span,
    /// What the output carries: the span's own traceparent when traces are exported.
    traceparent: Option<String>,
}

impl Hops {
    pub(super) fn start(batch: &[Record]) -> Self {
        let mut hops = HashMap::new();
        for record in batch {
            let Some(parent) = record.traceparent() else { continue };
            let span = trace::hop_span!("antifraud.decide", record);
            if span.is_disabled() {
                continue;
            }
            let traceparent = trace::join(&span, Some(parent));
            hops.insert((record.partition, record.offset), Hop { span, traceparent });
        }
        Self(hops)
    }

    /// The traceparent the output of `record` carries: its hop's own, else the record's
    /// (when valid).
    pub(super) fn traceparent<'a>(&'a self, record: &'a Record) -> Option<&'a str> {
        self.0
            .get(&(record.partition, record.offset))
            .and_then(|h| h.traceparent.as_deref())
            .or_else(|| record.traceparent())
    }

    /// Records what the stage writes for `record` on its hop span: a poison record's
    /// (`dead_letter` says why) fails its hop, or, when it has none, gets a span of its own
    /// ([`trace::poison`]).
    pub(super) fn decided(
        &self,
        record: &Record,
        transfer_id: Option<Uuid>,
        outcome: &'static str,
        dead_letter: Option<&str>,
    ) {
        let Some(hop) = self.0.get(&(record.partition, record.offset)) else {
            if let Some(reason) = dead_letter {
                trace::poison(super::PIPELINE, record, reason);
            }
            return;
        };
        if let Some(id) = transfer_id {
            hop.span.record("transfer.id", display(id));
        }
        hop.span.record("outcome", outcome);
        if let Some(reason) = dead_letter {
            trace::failed(&hop.span, "poison", reason);
        }
    }
}
