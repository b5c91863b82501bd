//! Unit tests of the settlement rules.
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
