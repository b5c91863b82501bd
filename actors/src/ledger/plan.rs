//! The rules of a settlement batch, applied in memory (no database): given which transfers
//! are new to the inbox, what the intake and antifraud know of them, and the locked
//! accounts, [`plan_batch`] decides each transfer in batch order on running balances (two
//! transfers of one batch touching the same account see each other's effect) and gathers
//! the writes. ACCOUNT_NOT_FOUND, CURRENCY_MISMATCH, INSUFFICIENT_FUNDS and
//! BALANCE_LIMIT_EXCEEDED (a credit past the configured ceiling; arithmetic is checked) are
//! committed rejections, not errors.

use std::collections::{HashMap, HashSet};

use chrono::Utc;
use tally_schema::events::{derived_event_id, TransferAnalyzed, TransferRejected, TransferSettled};
use tally_schema::models::status;
use tally_schema::EventType;
use uuid::Uuid;

use super::settle::{reason, LedgerTopics, SettleOutcome, SettleRequest, REJECTED_KIND, SETTLED_KIND};
use crate::antifraud::BLOCKED_BY_ANTIFRAUD;
use crate::store::accounts::{LockedAccount, OutcomeColumns, PostingColumns};
use crate::store::outbox::OutboxColumns;
use crate::store::transfers::KnownTransfer;

/// The writes of a batch, computed in memory before they are written.
#[derive(Debug, Default)]
pub struct Effects {
    pub postings: PostingColumns,
    pub outcomes: OutcomeColumns,
    pub events: OutboxColumns,
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
/// inbox row existed) or that repeats an earlier request of the batch is a duplicate.
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
    let mut settled_once = HashSet::new();
    for req in batch {
        let t = &req.transfer;
        if !fresh.contains(&t.transfer_id) || !settled_once.insert(t.transfer_id) {
            outcomes.push(SettleOutcome::Duplicate);
            continue;
        }
        match verdict(known, &accounts, t, topics.max_balance_cents) {
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
            // Its outcome was published already (antifraud blocked it, or it is no longer
            // PENDING): the refusal is recorded in the inbox, and no second outcome event
            // tells its client "rejected" again.
            Err(reason) if outcome_published(known, t) => {
                effects.outcome(t.transfer_id, status::REJECTED, Some(reason));
                outcomes.push(SettleOutcome::Rejected(reason));
            }
            Err(reason) => {
                effects.reject(topics, req, reason)?;
                outcomes.push(SettleOutcome::Rejected(reason));
            }
        }
    }
    Ok(Plan { outcomes, effects, accounts, opening })
}

/// Whether an outcome of `t` was published before this event reached the ledger:
/// antifraud's rejection of a blocked transfer, or the one that moved its status on from
/// PENDING.
fn outcome_published(known: &HashMap<Uuid, KnownTransfer>, t: &TransferAnalyzed) -> bool {
    known.get(&t.transfer_id).is_some_and(|k| k.blocked || k.status.as_deref().is_some_and(|s| s != status::PENDING))
}

/// Whether what is known allows settling `t`: never a transfer antifraud blocked (its
/// rejection may not be projected yet), and a transfer the intake knows only while its
/// row is PENDING and matches the event.
fn admits(known: &KnownTransfer, t: &TransferAnalyzed) -> Result<(), &'static str> {
    if known.blocked {
        return Err(BLOCKED_BY_ANTIFRAUD);
    }
    let Some(status) = &known.status else { return Ok(()) };
    if status != status::PENDING {
        return Err(reason::TRANSFER_NOT_PENDING);
    }
    if known.source_account.as_deref() != Some(t.source_account.as_str())
        || known.destination_account.as_deref() != Some(t.destination_account.as_str())
        || known.amount_cents != Some(t.amount_cents)
        || known.currency.as_deref() != Some(t.currency.as_str())
    {
        return Err(reason::TRANSFER_MISMATCH);
    }
    Ok(())
}

/// The business rules on running balances. `Ok` carries the new (source, destination)
/// balances.
fn decide(
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

/// The verdict on `t`: the intake's row (when it has one) must admit it, then the rules.
pub fn verdict(
    known: &HashMap<Uuid, KnownTransfer>,
    accounts: &HashMap<String, LockedAccount>,
    t: &TransferAnalyzed,
    max_balance: i64,
) -> Result<(i64, i64), &'static str> {
    if let Some(k) = known.get(&t.transfer_id) {
        admits(k, t)?;
    }
    decide(accounts, t, max_balance)
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

    #[test]
    fn a_known_transfer_settles_only_while_pending_and_matching() {
        let accounts: HashMap<_, _> = [account("A", 100, "BRL"), account("B", 0, "BRL")].into();
        let t = transfer("A", "B", 10, "BRL");
        let row = |status: &str, amount: i64| KnownTransfer {
            id: t.transfer_id,
            source_account: Some("A".into()),
            destination_account: Some("B".into()),
            amount_cents: Some(amount),
            currency: Some("BRL".into()),
            status: Some(status.into()),
            blocked: false,
        };
        let known = |k: KnownTransfer| HashMap::from([(k.id, k)]);
        assert_eq!(verdict(&HashMap::new(), &accounts, &t, MAX), Ok((90, 10)), "unknown to the intake");
        assert_eq!(verdict(&known(row("PENDING", 10)), &accounts, &t, MAX), Ok((90, 10)));
        assert_eq!(verdict(&known(row("REJECTED", 10)), &accounts, &t, MAX), Err(reason::TRANSFER_NOT_PENDING));
        assert_eq!(verdict(&known(row("PENDING", 11)), &accounts, &t, MAX), Err(reason::TRANSFER_MISMATCH));
        let blocked = KnownTransfer { id: t.transfer_id, blocked: true, ..KnownTransfer::default() };
        assert_eq!(
            verdict(&known(blocked), &accounts, &t, MAX),
            Err(BLOCKED_BY_ANTIFRAUD),
            "blocked, though the intake never saw it or its rejection is not projected yet"
        );
    }

    #[test]
    fn a_transfer_whose_outcome_was_published_is_refused_without_a_second_event() {
        let accounts: HashMap<_, _> = [account("A", 100, "BRL"), account("B", 0, "BRL")].into();
        let t = transfer("A", "B", 10, "BRL");
        let fresh = HashSet::from([t.transfer_id]);
        let known_as = |k: KnownTransfer| HashMap::from([(t.transfer_id, k)]);
        let blocked = KnownTransfer { id: t.transfer_id, blocked: true, ..KnownTransfer::default() };
        let rejected = KnownTransfer { id: t.transfer_id, status: Some("REJECTED".into()), ..KnownTransfer::default() };
        for (known, reason) in
            [(known_as(blocked), BLOCKED_BY_ANTIFRAUD), (known_as(rejected), reason::TRANSFER_NOT_PENDING)]
        {
            let plan = plan_batch(&[req(&t)], &fresh, &known, accounts.clone(), &topics()).unwrap();
            assert_eq!(plan.outcomes, [SettleOutcome::Rejected(reason)]);
            assert_eq!(plan.effects.outcomes.transfer_id, [t.transfer_id], "the inbox records the refusal");
            assert!(plan.effects.events.id.is_empty(), "{reason}: no second outcome event");
        }
        // A refusal of the ledger's own still tells the client.
        let poor: HashMap<_, _> = [account("A", 1, "BRL"), account("B", 0, "BRL")].into();
        let plan = plan_batch(&[req(&t)], &fresh, &HashMap::new(), poor, &topics()).unwrap();
        assert_eq!(plan.effects.events.id.len(), 1, "INSUFFICIENT_FUNDS is published");
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
        let plan = plan_batch(&batch, &fresh, &HashMap::new(), accounts, &topics()).unwrap();
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
        let plan = plan_batch(&[req(&t)], &HashSet::new(), &HashMap::new(), accounts, &topics()).unwrap();
        assert_eq!(plan.outcomes, [SettleOutcome::Duplicate]);
        assert_eq!(plan.changed_balances().count(), 0);
        assert!(plan.effects.outcomes.transfer_id.is_empty() && plan.effects.events.id.is_empty());
    }
}
