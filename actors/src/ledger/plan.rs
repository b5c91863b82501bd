//! The rules of a settlement batch, applied in memory (no database): given which transfers
//! are new to the inbox, what the intake and antifraud hold of them, and the locked
//! accounts, [`plan_batch`] decides each transfer in batch order on running balances (two
//! transfers of one batch touching the same account see each other's effect) and gathers
//! the writes.
//!
//! First the system of record ([`admits`]): the ledger acts only on a transfer the intake
//! took, still PENDING, whose stored antifraud decision is ANALYZED, with the accounts,
//! amount and currency of both. Anything else is a [`Refusal`]: the record is poison,
//! nothing is written for it (its inbox claim is undone) and the genuine transfer waits for
//! its real event. Then the business rules: ACCOUNT_NOT_FOUND, CURRENCY_MISMATCH,
//! INSUFFICIENT_FUNDS and BALANCE_LIMIT_EXCEEDED (a credit past the configured ceiling;
//! arithmetic is checked) are committed rejections, not errors.

use std::collections::{HashMap, HashSet};

use chrono::Utc;
use tally_schema::events::{derived_event_id, TransferAnalyzed, TransferRejected, TransferSettled};
use tally_schema::models::status;
use tally_schema::EventType;
use uuid::Uuid;

use super::settle::{reason, LedgerTopics, SettleOutcome, SettleRequest, REJECTED_KIND, SETTLED_KIND};
use crate::store::accounts::{LockedAccount, OutcomeColumns, PostingColumns};
use crate::store::decisions::{ANALYZED, BLOCKED};
use crate::store::known::KnownTransfer;
use crate::store::outbox::OutboxColumns;

/// The writes of a batch, computed in memory before they are written.
#[derive(Debug, Default)]
pub struct Effects {
    pub postings: PostingColumns,
    pub outcomes: OutcomeColumns,
    pub events: OutboxColumns,
    /// Transfers claimed in the inbox and then refused: their claim is undone, so that
    /// their genuine event is still new when it comes.
    pub released: Vec<Uuid>,
}

impl Effects {
    /// The postings, outcome and `TransferSettled` event of a settled transfer.
    ///
    /// # Errors
    /// When the event does not serialize.
    pub fn settle(&mut self, topics: &LedgerTopics, req: &SettleRequest) -> Result<(), serde_json::Error> {
        let t = &req.transfer;
        for (account, kind) in [(&t.source_account, "D"), (&t.destination_account, "C")] {
            self.postings.transfer_id.push(t.transfer_id);
            self.postings.account_id.push(account.clone());
            self.postings.kind.push(kind.into());
            self.postings.amount_cents.push(t.amount_cents);
        }
        self.outcome(t.transfer_id, status::SETTLED, None);
        let event = TransferSettled {
            event_id: derived_event_id(SETTLED_KIND, t.transfer_id),
            transfer_id: t.transfer_id,
            settled_at: Utc::now(),
        };
        self.event(&topics.settled, req, event.event_id, EventType::TransferSettled, serde_json::to_string(&event)?);
        Ok(())
    }

    /// The outcome and `TransferRejected` event of a rejected transfer.
    ///
    /// # Errors
    /// When the event does not serialize.
    pub fn reject(
        &mut self,
        topics: &LedgerTopics,
        req: &SettleRequest,
        reason: &str,
    ) -> Result<(), serde_json::Error> {
        let t = &req.transfer;
        self.outcome(t.transfer_id, status::REJECTED, Some(reason));
        let event = TransferRejected {
            event_id: derived_event_id(REJECTED_KIND, t.transfer_id),
            transfer_id: t.transfer_id,
            reason: reason.into(),
            rejected_at: Utc::now(),
        };
        self.event(&topics.rejected, req, event.event_id, EventType::TransferRejected, serde_json::to_string(&event)?);
        Ok(())
    }

    fn outcome(&mut self, id: Uuid, outcome: &str, reason: Option<&str>) {
        self.outcomes.transfer_id.push(id);
        self.outcomes.outcome.push(outcome.into());
        self.outcomes.reason.push(reason.map(str::to_owned));
    }

    fn event(&mut self, topic: &str, req: &SettleRequest, id: Uuid, kind: EventType, payload: String) {
        self.events.id.push(id);
        self.events.topic.push(topic.into());
        self.events.key.push(req.transfer.source_account.clone());
        self.events.event_type.push(kind.as_str().into());
        self.events.payload.push(payload);
        self.events.traceparent.push(req.traceparent.clone());
    }
}

/// What a batch does: an outcome per request (batch order), the writes, and the accounts
/// with their opening and closing balances.
#[derive(Debug)]
pub struct Plan {
    pub outcomes: Vec<SettleOutcome>,
    pub effects: Effects,
    accounts: HashMap<String, LockedAccount>,
    opening: HashMap<String, i64>,
}

impl Plan {
    /// The accounts whose balance the batch changes, with the new balance.
    pub fn changed_balances(&self) -> impl Iterator<Item = (String, i64)> + '_ {
        self.accounts
            .values()
            .filter(|a| self.opening.get(&a.id) != Some(&a.balance_cents))
            .map(|a| (a.id.clone(), a.balance_cents))
    }
}

/// Applies the rules to `batch` in order. A request whose transfer is not in `fresh` (its
/// inbox row existed) or that repeats an earlier decided request of the batch is a
/// duplicate; one the system of record refuses is [`SettleOutcome::Refused`].
///
/// # Errors
/// When an event does not serialize.
pub fn plan_batch(
    batch: &[SettleRequest],
    fresh: &HashSet<Uuid>,
    known: &HashMap<Uuid, KnownTransfer>,
    mut accounts: HashMap<String, LockedAccount>,
    topics: &LedgerTopics,
) -> Result<Plan, serde_json::Error> {
    let opening: HashMap<String, i64> = accounts.iter().map(|(k, a)| (k.clone(), a.balance_cents)).collect();
    let mut effects = Effects::default();
    let mut outcomes = Vec::with_capacity(batch.len());
    let mut decided = HashSet::new();
    let mut refused = Vec::new();
    for req in batch {
        let t = &req.transfer;
        if !fresh.contains(&t.transfer_id) || decided.contains(&t.transfer_id) {
            outcomes.push(SettleOutcome::Duplicate);
            continue;
        }
        // A refused event decides nothing: a later one of the batch with the same id (the
        // genuine one) is judged on its own.
        if let Err(refusal) = admits(known.get(&t.transfer_id), t) {
            refused.push(t.transfer_id);
            outcomes.push(SettleOutcome::Refused(refusal));
            continue;
        }
        decided.insert(t.transfer_id);
        match decide(&accounts, t, topics.max_balance_cents) {
            Ok((source_after, destination_after)) => {
                if let Some(a) = accounts.get_mut(&t.source_account) {
                    a.balance_cents = source_after;
                }
                if let Some(a) = accounts.get_mut(&t.destination_account) {
                    a.balance_cents = destination_after;
                }
                effects.settle(topics, req)?;
                outcomes.push(SettleOutcome::Settled);
            }
            Err(reason) => {
                effects.reject(topics, req, reason)?;
                outcomes.push(SettleOutcome::Rejected(reason));
            }
        }
    }
    effects.released =
        refused.into_iter().filter(|id| !decided.contains(id)).collect::<HashSet<_>>().into_iter().collect();
    Ok(Plan { outcomes, effects, accounts, opening })
}

/// Why the ledger will not act on a `TransferAnalyzed`: what it says contradicts the
/// system of record it shares with the intake and antifraud. The record is poison.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// The intake never took a transfer with this id.
    UnknownTransfer,
    /// The intake took other accounts, amount or currency under this id.
    ContradictsTransfer,
    /// The transfer is final already (settled, or rejected by antifraud or the ledger).
    NotPending,
    /// Antifraud has stored no decision for it.
    NoDecision,
    /// Antifraud's stored decision blocked it.
    Blocked,
    /// Antifraud analyzed other accounts, amount or currency under this id.
    ContradictsDecision,
}

impl Refusal {
    /// The dead letter's reason.
    #[must_use]
    pub fn reason(self) -> &'static str {
        match self {
            Self::UnknownTransfer => "unknown transfer: the intake never took it",
            Self::ContradictsTransfer => {
                "contradicts the transfer: other accounts, amount or currency than the intake took"
            }
            Self::NotPending => "contradicts the transfer: it is no longer PENDING",
            Self::NoDecision => "no decision: antifraud has not analyzed this transfer",
            Self::Blocked => "contradicts the decision: antifraud blocked this transfer",
            Self::ContradictsDecision => {
                "contradicts the decision: other accounts, amount or currency than antifraud analyzed"
            }
        }
    }
}

/// Whether the system of record lets the ledger act on `t`: the intake took it (same
/// accounts, amount and currency), it is still PENDING, and antifraud's stored decision
/// analyzed (did not block) that same transfer.
///
/// # Errors
/// The [`Refusal`] that stops it.
pub fn admits(known: Option<&KnownTransfer>, t: &TransferAnalyzed) -> Result<(), Refusal> {
    let Some(k) = known.filter(|k| k.status.is_some()) else { return Err(Refusal::UnknownTransfer) };
    let same =
        |source: &Option<String>, destination: &Option<String>, amount: Option<i64>, currency: &Option<String>| {
            source.as_deref() == Some(t.source_account.as_str())
                && destination.as_deref() == Some(t.destination_account.as_str())
                && amount == Some(t.amount_cents)
                && currency.as_deref() == Some(t.currency.as_str())
        };
    if !same(&k.source_account, &k.destination_account, k.amount_cents, &k.currency) {
        return Err(Refusal::ContradictsTransfer);
    }
    if k.status.as_deref() != Some(status::PENDING) {
        return Err(Refusal::NotPending);
    }
    match k.decision.as_deref() {
        None => Err(Refusal::NoDecision),
        Some(BLOCKED) => Err(Refusal::Blocked),
        Some(ANALYZED)
            if same(&k.decided_source, &k.decided_destination, k.decided_amount_cents, &k.decided_currency) =>
        {
            Ok(())
        }
        Some(_) => Err(Refusal::ContradictsDecision),
    }
}

/// The business rules on running balances. `Ok` carries the new (source, destination)
/// balances.
///
/// # Errors
/// The rejection reason.
pub fn decide(
    accounts: &HashMap<String, LockedAccount>,
    t: &TransferAnalyzed,
    max_balance: i64,
) -> Result<(i64, i64), &'static str> {
    let (Some(source), Some(destination)) = (accounts.get(&t.source_account), accounts.get(&t.destination_account))
    else {
        return Err(reason::ACCOUNT_NOT_FOUND);
    };
    if source.currency != t.currency || destination.currency != t.currency {
        return Err(reason::CURRENCY_MISMATCH);
    }
    let source_after = source.balance_cents.checked_sub(t.amount_cents).filter(|b| *b >= 0);
    let Some(source_after) = source_after else {
        return Err(reason::INSUFFICIENT_FUNDS);
    };
    let destination_after = destination.balance_cents.checked_add(t.amount_cents).filter(|b| *b <= max_balance);
    let Some(destination_after) = destination_after else {
        return Err(reason::BALANCE_LIMIT_EXCEEDED);
    };
    Ok((source_after, destination_after))
}

#[cfg(test)]
mod tests;
