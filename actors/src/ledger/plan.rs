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
mod tests {
    use super::*;
    use crate::ledger::settle::LedgerTopics;

    fn account(id: &str, balance: i64, currency: &str) -> (String, LockedAccount) {
        (id.into(), LockedAccount { id: id.into(), balance_cents: balance, currency: currency.into() })
    }

    fn transfer(from: &str, to: &str, amount: i64, currency: &str) -> TransferAnalyzed {
        TransferAnalyzed {
            event_id: Uuid::new_v4(),
            transfer_id: Uuid::new_v4(),
            source_account: from.into(),
            destination_account: to.into(),
            amount_cents: amount,
            currency: currency.into(),
            score: 10,
            analyzed_at: Utc::now(),
            client: None,
        }
    }

    const MAX: i64 = 1_000_000;

    #[test]
    fn rules_in_order() {
        let accounts: HashMap<_, _> = [account("A", 100, "BRL"), account("B", 0, "BRL"), account("U", 0, "USD")].into();
        assert_eq!(decide(&accounts, &transfer("A", "B", 100, "BRL"), MAX), Ok((0, 100)));
        assert_eq!(decide(&accounts, &transfer("A", "X", 1, "BRL"), MAX), Err(reason::ACCOUNT_NOT_FOUND));
        assert_eq!(decide(&accounts, &transfer("X", "B", 1, "BRL"), MAX), Err(reason::ACCOUNT_NOT_FOUND));
        assert_eq!(decide(&accounts, &transfer("A", "U", 1, "BRL"), MAX), Err(reason::CURRENCY_MISMATCH));
        assert_eq!(decide(&accounts, &transfer("A", "B", 1, "USD"), MAX), Err(reason::CURRENCY_MISMATCH));
        assert_eq!(decide(&accounts, &transfer("A", "B", 101, "BRL"), MAX), Err(reason::INSUFFICIENT_FUNDS));
    }

    #[test]
    fn arithmetic_is_checked_against_the_ceiling() {
        let accounts: HashMap<_, _> = [account("A", i64::MAX, "BRL"), account("B", i64::MAX, "BRL")].into();
        assert_eq!(
            decide(&accounts, &transfer("A", "B", 1, "BRL"), i64::MAX),
            Err(reason::BALANCE_LIMIT_EXCEEDED),
            "i64::MAX + 1 overflows: a rejection, not a panic or a wrapped balance"
        );
        let accounts: HashMap<_, _> = [account("A", 10, "BRL"), account("B", MAX - 5, "BRL")].into();
        assert_eq!(decide(&accounts, &transfer("A", "B", 5, "BRL"), MAX), Ok((5, MAX)), "up to the ceiling");
        assert_eq!(decide(&accounts, &transfer("A", "B", 6, "BRL"), MAX), Err(reason::BALANCE_LIMIT_EXCEEDED));
    }

    /// What the intake and antifraud hold of `t` when both did their part.
    fn genuine(t: &TransferAnalyzed) -> KnownTransfer {
        KnownTransfer {
            id: t.transfer_id,
            source_account: Some(t.source_account.clone()),
            destination_account: Some(t.destination_account.clone()),
            amount_cents: Some(t.amount_cents),
            currency: Some(t.currency.clone()),
            status: Some(status::PENDING.into()),
            decision: Some(ANALYZED.into()),
            decided_source: Some(t.source_account.clone()),
            decided_destination: Some(t.destination_account.clone()),
            decided_amount_cents: Some(t.amount_cents),
            decided_currency: Some(t.currency.clone()),
        }
    }

    fn known_all(batch: &[SettleRequest]) -> HashMap<Uuid, KnownTransfer> {
        batch.iter().map(|r| (r.transfer.transfer_id, genuine(&r.transfer))).collect()
    }

    #[test]
    fn the_ledger_acts_only_on_what_the_intake_took_and_antifraud_analyzed() {
        let t = transfer("A", "B", 10, "BRL");
        assert_eq!(admits(Some(&genuine(&t)), &t), Ok(()));
        let with = |change: &dyn Fn(&mut KnownTransfer)| {
            let mut k = genuine(&t);
            change(&mut k);
            admits(Some(&k), &t)
        };
        assert_eq!(admits(None, &t), Err(Refusal::UnknownTransfer));
        assert_eq!(with(&|k| k.status = None), Err(Refusal::UnknownTransfer), "a decision alone is not a transfer");
        assert_eq!(with(&|k| k.amount_cents = Some(11)), Err(Refusal::ContradictsTransfer));
        assert_eq!(with(&|k| k.destination_account = Some("C".into())), Err(Refusal::ContradictsTransfer));
        assert_eq!(with(&|k| k.currency = Some("USD".into())), Err(Refusal::ContradictsTransfer));
        assert_eq!(with(&|k| k.status = Some(status::SETTLED.into())), Err(Refusal::NotPending));
        assert_eq!(with(&|k| k.status = Some(status::REJECTED.into())), Err(Refusal::NotPending));
        assert_eq!(with(&|k| k.decision = None), Err(Refusal::NoDecision));
        assert_eq!(with(&|k| k.decision = Some(BLOCKED.into())), Err(Refusal::Blocked));
        assert_eq!(with(&|k| k.decided_amount_cents = Some(9)), Err(Refusal::ContradictsDecision));
        assert_eq!(with(&|k| k.decided_source = Some("X".into())), Err(Refusal::ContradictsDecision));
    }

    #[test]
    fn a_refused_event_writes_nothing_and_undoes_its_inbox_claim() {
        let accounts: HashMap<_, _> = [account("A", 100, "BRL"), account("B", 0, "BRL")].into();
        let t = transfer("A", "B", 10, "BRL");
        let fresh = HashSet::from([t.transfer_id]);
        let mut blocked = genuine(&t);
        blocked.decision = Some(BLOCKED.into());
        for known in [HashMap::new(), HashMap::from([(t.transfer_id, blocked)])] {
            let plan = plan_batch(&[req(&t)], &fresh, &known, accounts.clone(), &topics()).unwrap();
            assert!(matches!(plan.outcomes[..], [SettleOutcome::Refused(_)]), "{:?}", plan.outcomes);
            assert!(plan.effects.postings.transfer_id.is_empty() && plan.effects.events.id.is_empty());
            assert!(plan.effects.outcomes.transfer_id.is_empty(), "no outcome recorded");
            assert_eq!(plan.effects.released, [t.transfer_id], "the inbox claim is undone");
            assert_eq!(plan.changed_balances().count(), 0);
        }
    }

    #[test]
    fn a_forged_event_before_the_genuine_one_in_a_batch_does_not_shadow_it() {
        let accounts: HashMap<_, _> = [account("A", 100, "BRL"), account("B", 0, "BRL")].into();
        let genuine_event = transfer("A", "B", 10, "BRL");
        let mut forged = genuine_event.clone();
        forged.amount_cents = 90;
        let batch = [req(&forged), req(&genuine_event)];
        let fresh = HashSet::from([genuine_event.transfer_id]);
        let known = HashMap::from([(genuine_event.transfer_id, genuine(&genuine_event))]);
        let plan = plan_batch(&batch, &fresh, &known, accounts, &topics()).unwrap();
        assert_eq!(plan.outcomes, [SettleOutcome::Refused(Refusal::ContradictsTransfer), SettleOutcome::Settled]);
        assert!(plan.effects.released.is_empty(), "the genuine event keeps the claim");
        assert_eq!(plan.effects.postings.amount_cents, [10, 10]);
    }

    fn topics() -> LedgerTopics {
        LedgerTopics { settled: "s".into(), rejected: "r".into(), max_balance_cents: MAX }
    }

    fn req(t: &TransferAnalyzed) -> SettleRequest {
        SettleRequest { transfer: t.clone(), traceparent: None }
    }

    #[test]
    fn a_batch_applies_its_transfers_on_running_balances() {
        let accounts: HashMap<_, _> = [account("A", 100, "BRL"), account("B", 0, "BRL"), account("C", 5, "BRL")].into();
        let first = transfer("A", "B", 70, "BRL");
        let overdraws = transfer("A", "C", 40, "BRL");
        let spends_credit = transfer("B", "C", 70, "BRL");
        let batch = [req(&first), req(&overdraws), req(&spends_credit), req(&first)];
        let fresh: HashSet<Uuid> = batch.iter().map(|r| r.transfer.transfer_id).collect();
        let plan = plan_batch(&batch, &fresh, &known_all(&batch), accounts, &topics()).unwrap();
        assert_eq!(
            plan.outcomes,
            [
                SettleOutcome::Settled,
                SettleOutcome::Rejected(reason::INSUFFICIENT_FUNDS),
                SettleOutcome::Settled,
                SettleOutcome::Duplicate
            ],
            "the second sees the first's debit, the third the first's credit, the fourth repeats the first"
        );
        let mut balances: Vec<_> = plan.changed_balances().collect();
        balances.sort();
        assert_eq!(balances, [("A".into(), 30), ("C".into(), 75)], "B's net change is zero: not written");
        assert_eq!(plan.effects.postings.transfer_id.len(), 4, "a debit and a credit per settled transfer");
        assert_eq!(plan.effects.outcomes.outcome, [status::SETTLED, status::REJECTED, status::SETTLED]);
        assert_eq!(plan.effects.events.topic, ["s", "r", "s"], "one event per decided transfer");
        let credits: i64 = plan
            .effects
            .postings
            .amount_cents
            .iter()
            .zip(&plan.effects.postings.kind)
            .map(|(a, k)| if k == "C" { *a } else { -a })
            .sum();
        assert_eq!(credits, 0, "postings balance");
    }

    #[test]
    fn a_transfer_already_in_the_inbox_has_no_effect() {
        let accounts: HashMap<_, _> = [account("A", 100, "BRL"), account("B", 0, "BRL")].into();
        let t = transfer("A", "B", 10, "BRL");
        let plan = plan_batch(&[req(&t)], &HashSet::new(), &known_all(&[req(&t)]), accounts, &topics()).unwrap();
        assert_eq!(plan.outcomes, [SettleOutcome::Duplicate]);
        assert_eq!(plan.changed_balances().count(), 0);
        assert!(plan.effects.outcomes.transfer_id.is_empty() && plan.effects.events.id.is_empty());
    }
}
