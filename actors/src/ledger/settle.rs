//! Settlement, set-based: one database transaction
//! settles a batch of transfers with the same effects as settling them one by one in batch
//! order.
//!
//! Over 400 lines because its unit tests sit beside the rules they check; the bench
//! baseline's one-transfer path lives in `seed.rs`.
//!
//! 1. Inbox: `INSERT INTO processed_transfers ... ON CONFLICT (transfer_id) DO NOTHING
//!    RETURNING transfer_id`; a transfer whose row was not inserted is a duplicate and has
//!    no effect.
//! 2. Lock every account involved, `ORDER BY id FOR UPDATE`: every transaction locks in the
//!    same global order, so concurrent batches (and A->B against B->A) cannot deadlock.
//! 3. Read the intake's own `transfers` rows of the batch, if any: a transfer tally's intake
//!    knows is settled only while its row is PENDING and matches the event (accounts,
//!    amount, currency). A transfer the intake never saw (another service produced its
//!    `TransferAnalyzed`) is settled on the event alone.
//! 4. Rules in memory, in batch order, on running balances, so two transfers of one batch
//!    touching the same account see each other's effect: ACCOUNT_NOT_FOUND,
//!    CURRENCY_MISMATCH, INSUFFICIENT_FUNDS, BALANCE_LIMIT_EXCEEDED (a credit past the
//!    configured ceiling; arithmetic is checked) are committed rejections, not errors.
//! 5. Set-based writes: postings (D and C), balances, outcomes, outbox events.

use std::collections::{HashMap, HashSet};

use chrono::Utc;
use diesel::sql_types::{Array, BigInt, Nullable, Text};
use diesel::QueryableByName;
use diesel_async::scoped_futures::ScopedFutureExt;
use diesel_async::{AsyncConnection, AsyncPgConnection, RunQueryDsl};
use tally_schema::events::{derived_event_id, TransferAnalyzed, TransferRejected, TransferSettled};
use tally_schema::EventType;
use uuid::Uuid;

use crate::antifraud::BLOCKED_BY_ANTIFRAUD;

/// Rejection reasons of the ledger.
pub mod reason {
    pub const ACCOUNT_NOT_FOUND: &str = "ACCOUNT_NOT_FOUND";
    pub const CURRENCY_MISMATCH: &str = "CURRENCY_MISMATCH";
    pub const INSUFFICIENT_FUNDS: &str = "INSUFFICIENT_FUNDS";
    /// The credit would take the destination past the configured balance ceiling.
    pub const BALANCE_LIMIT_EXCEEDED: &str = "BALANCE_LIMIT_EXCEEDED";
    /// The intake's transfer row is no longer PENDING (e.g. antifraud blocked it), yet a
    /// `TransferAnalyzed` arrived for it.
    pub const TRANSFER_NOT_PENDING: &str = "TRANSFER_NOT_PENDING";
    /// The `TransferAnalyzed` disagrees with the intake's transfer row (accounts, amount or
    /// currency).
    pub const TRANSFER_MISMATCH: &str = "TRANSFER_MISMATCH";
}

/// Kinds of the derived event ids.
pub const SETTLED_KIND: &str = "settled";
pub const REJECTED_KIND: &str = "rejected";

/// A transfer to settle, with the trace context of the record that carried it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SettleRequest {
    pub transfer: TransferAnalyzed,
    pub traceparent: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SettleOutcome {
    Settled,
    Rejected(&'static str),
    Duplicate,
}

impl SettleOutcome {
    #[must_use]
    pub fn label(self) -> &'static str {
        match self {
            Self::Settled => "settled",
            Self::Rejected(_) => "rejected",
            Self::Duplicate => "duplicate",
        }
    }
}

/// Output topics and limits of the ledger.
#[derive(Debug, Clone)]
pub struct LedgerTopics {
    pub settled: String,
    pub rejected: String,
    /// No balance may exceed this many cents; a credit past it is BALANCE_LIMIT_EXCEEDED.
    pub max_balance_cents: i64,
}

#[derive(QueryableByName)]
struct InsertedId {
    #[diesel(sql_type = diesel::sql_types::Uuid)]
    transfer_id: Uuid,
}

/// What tally already knows of a transfer besides the event: the intake's row (when the
/// intake took it) and whether antifraud blocked it.
#[derive(QueryableByName, Clone, Default)]
pub(super) struct KnownTransfer {
    #[diesel(sql_type = diesel::sql_types::Uuid)]
    id: Uuid,
    #[diesel(sql_type = Nullable<Text>)]
    source_account: Option<String>,
    #[diesel(sql_type = Nullable<Text>)]
    destination_account: Option<String>,
    #[diesel(sql_type = Nullable<BigInt>)]
    amount_cents: Option<i64>,
    #[diesel(sql_type = Nullable<Text>)]
    currency: Option<String>,
    /// `None` when the intake never saw the transfer.
    #[diesel(sql_type = Nullable<Text>)]
    status: Option<String>,
    #[diesel(sql_type = diesel::sql_types::Bool)]
    blocked: bool,
}

impl KnownTransfer {
    /// Whether what is known allows settling `t`: never a transfer antifraud blocked (its
    /// rejection may not be projected yet), and a transfer the intake knows only while its
    /// row is PENDING and matches the event.
    fn admits(&self, t: &TransferAnalyzed) -> Result<(), &'static str> {
        if self.blocked {
            return Err(BLOCKED_BY_ANTIFRAUD);
        }
        let Some(status) = &self.status else { return Ok(()) };
        if status != "PENDING" {
            return Err(reason::TRANSFER_NOT_PENDING);
        }
        if self.source_account.as_deref() != Some(t.source_account.as_str())
            || self.destination_account.as_deref() != Some(t.destination_account.as_str())
            || self.amount_cents != Some(t.amount_cents)
            || self.currency.as_deref() != Some(t.currency.as_str())
        {
            return Err(reason::TRANSFER_MISMATCH);
        }
        Ok(())
    }
}

pub(super) async fn load_known(
    conn: &mut AsyncPgConnection,
    ids: &[Uuid],
) -> Result<HashMap<Uuid, KnownTransfer>, diesel::result::Error> {
    if ids.is_empty() {
        return Ok(HashMap::new());
    }
    Ok(diesel::sql_query(
        "SELECT u.id, t.source_account::text AS source_account, t.destination_account::text AS destination_account, \
                t.amount_cents, t.currency::text AS currency, t.status::text AS status, \
                COALESCE(d.outcome = 'BLOCKED', false) AS blocked \
         FROM unnest($1::uuid[]) AS u(id) \
         LEFT JOIN transfers t ON t.id = u.id \
         LEFT JOIN antifraud_decisions d ON d.transfer_id = u.id \
         WHERE t.id IS NOT NULL OR d.outcome = 'BLOCKED'",
    )
    .bind::<Array<diesel::sql_types::Uuid>, _>(ids)
    .load::<KnownTransfer>(conn)
    .await?
    .into_iter()
    .map(|k| (k.id, k))
    .collect())
}

#[derive(QueryableByName, Clone)]
pub(super) struct LockedAccount {
    #[diesel(sql_type = Text)]
    pub(super) id: String,
    #[diesel(sql_type = BigInt)]
    balance_cents: i64,
    #[diesel(sql_type = Text)]
    currency: String,
}

/// The effects of a batch, computed in memory before they are written.
#[derive(Debug, Default)]
pub(super) struct Effects {
    posting_transfer: Vec<Uuid>,
    posting_account: Vec<String>,
    posting_kind: Vec<String>,
    posting_amount: Vec<i64>,
    outcome_id: Vec<Uuid>,
    outcome: Vec<String>,
    outcome_reason: Vec<Option<String>>,
    outbox_id: Vec<Uuid>,
    outbox_topic: Vec<String>,
    outbox_key: Vec<String>,
    outbox_type: Vec<String>,
    outbox_payload: Vec<String>,
    outbox_trace: Vec<Option<String>>,
}

impl Effects {
    pub(super) fn settle(&mut self, topics: &LedgerTopics, req: &SettleRequest) -> Result<(), serde_json::Error> {
        let t = &req.transfer;
        for (account, kind) in [(&t.source_account, "D"), (&t.destination_account, "C")] {
            self.posting_transfer.push(t.transfer_id);
            self.posting_account.push(account.clone());
            self.posting_kind.push(kind.into());
            self.posting_amount.push(t.amount_cents);
        }
        self.outcome_id.push(t.transfer_id);
        self.outcome.push("SETTLED".into());
        self.outcome_reason.push(None);
        let event = TransferSettled {
            event_id: derived_event_id(SETTLED_KIND, t.transfer_id),
            transfer_id: t.transfer_id,
            settled_at: Utc::now(),
        };
        self.event(&topics.settled, req, event.event_id, EventType::TransferSettled, serde_json::to_string(&event)?);
        Ok(())
    }

    pub(super) fn reject(
        &mut self,
        topics: &LedgerTopics,
        req: &SettleRequest,
        reason: &str,
    ) -> Result<(), serde_json::Error> {
        let t = &req.transfer;
        self.outcome_id.push(t.transfer_id);
        self.outcome.push("REJECTED".into());
        self.outcome_reason.push(Some(reason.into()));
        let event = TransferRejected {
            event_id: derived_event_id(REJECTED_KIND, t.transfer_id),
            transfer_id: t.transfer_id,
            reason: reason.into(),
            rejected_at: Utc::now(),
        };
        self.event(&topics.rejected, req, event.event_id, EventType::TransferRejected, serde_json::to_string(&event)?);
        Ok(())
    }

    fn event(&mut self, topic: &str, req: &SettleRequest, id: Uuid, kind: EventType, payload: String) {
        self.outbox_id.push(id);
        self.outbox_topic.push(topic.into());
        self.outbox_key.push(req.transfer.source_account.clone());
        self.outbox_type.push(kind.as_str().into());
        self.outbox_payload.push(payload);
        self.outbox_trace.push(req.traceparent.clone());
    }
}

/// The business rules on running balances (plain logic, unit-tested). `Ok` carries the
/// new (source, destination) balances.
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
pub(super) fn verdict(
    known: &HashMap<Uuid, KnownTransfer>,
    accounts: &HashMap<String, LockedAccount>,
    t: &TransferAnalyzed,
    max_balance: i64,
) -> Result<(i64, i64), &'static str> {
    if let Some(k) = known.get(&t.transfer_id) {
        k.admits(t)?;
    }
    decide(accounts, t, max_balance)
}

/// Settles `batch` in one transaction. The outcomes are in batch order.
///
/// # Errors
/// Any database error; the transaction is rolled back and nothing is written.
pub async fn settle_batch(
    conn: &mut AsyncPgConnection,
    topics: &LedgerTopics,
    batch: &[SettleRequest],
) -> Result<Vec<SettleOutcome>, diesel::result::Error> {
    conn.transaction(|conn| {
        async move {
            // Inbox rows for the distinct transfer ids of the batch.
            let mut seen = HashSet::new();
            let ids: Vec<Uuid> = batch.iter().map(|r| r.transfer.transfer_id).filter(|id| seen.insert(*id)).collect();
            let fresh: HashSet<Uuid> = diesel::sql_query(
                "INSERT INTO processed_transfers (transfer_id, outcome) \
                 SELECT id, 'PROCESSING' FROM unnest($1::uuid[]) AS id \
                 ON CONFLICT (transfer_id) DO NOTHING RETURNING transfer_id",
            )
            .bind::<Array<diesel::sql_types::Uuid>, _>(&ids)
            .load::<InsertedId>(conn)
            .await?
            .into_iter()
            .map(|r| r.transfer_id)
            .collect();
            // Broken on purpose (test builds only): every transfer counts as new.
            let fresh: HashSet<Uuid> = if crate::faults::is_on(crate::faults::Fault::SkipInbox) {
                ids.iter().copied().collect()
            } else {
                fresh
            };

            let mut account_ids: Vec<String> = batch
                .iter()
                .filter(|r| fresh.contains(&r.transfer.transfer_id))
                .flat_map(|r| [r.transfer.source_account.clone(), r.transfer.destination_account.clone()])
                .collect();
            account_ids.sort_unstable();
            account_ids.dedup();
            let mut accounts: HashMap<String, LockedAccount> = if account_ids.is_empty() {
                HashMap::new()
            } else {
                diesel::sql_query(
                    "SELECT id::text AS id, balance_cents, currency::text AS currency FROM accounts \
                     WHERE id = ANY($1) ORDER BY id FOR UPDATE",
                )
                .bind::<Array<Text>, _>(&account_ids)
                .load::<LockedAccount>(conn)
                .await?
                .into_iter()
                .map(|a| (a.id.clone(), a))
                .collect()
            };
            let opening: HashMap<String, i64> = accounts.iter().map(|(k, a)| (k.clone(), a.balance_cents)).collect();
            let fresh_ids: Vec<Uuid> = ids.iter().copied().filter(|id| fresh.contains(id)).collect();
            let known = load_known(conn, &fresh_ids).await?;

            let mut effects = Effects::default();
            let mut outcomes = Vec::with_capacity(batch.len());
            let mut settled_once = HashSet::new();
            let to_db = |e: serde_json::Error| diesel::result::Error::SerializationError(Box::new(e));
            for req in batch {
                let t = &req.transfer;
                if !fresh.contains(&t.transfer_id) || !settled_once.insert(t.transfer_id) {
                    outcomes.push(SettleOutcome::Duplicate);
                    continue;
                }
                match verdict(&known, &accounts, t, topics.max_balance_cents) {
                    Ok((source_after, destination_after)) => {
                        if let Some(a) = accounts.get_mut(&t.source_account) {
                            a.balance_cents = source_after;
                        }
                        if let Some(a) = accounts.get_mut(&t.destination_account) {
                            a.balance_cents = destination_after;
                        }
                        effects.settle(topics, req).map_err(to_db)?;
                        outcomes.push(SettleOutcome::Settled);
                    }
                    Err(reason) => {
                        effects.reject(topics, req, reason).map_err(to_db)?;
                        outcomes.push(SettleOutcome::Rejected(reason));
                    }
                }
            }
            write_effects(conn, &effects, &accounts, &opening).await?;
            Ok(outcomes)
        }
        .scope_boxed()
    })
    .await
}

async fn write_effects(
    conn: &mut AsyncPgConnection,
    effects: &Effects,
    accounts: &HashMap<String, LockedAccount>,
    opening: &HashMap<String, i64>,
) -> Result<(), diesel::result::Error> {
    write_postings_and_balances(conn, effects, accounts, opening).await?;
    write_outcomes_and_events(conn, effects).await
}

async fn write_postings_and_balances(
    conn: &mut AsyncPgConnection,
    effects: &Effects,
    accounts: &HashMap<String, LockedAccount>,
    opening: &HashMap<String, i64>,
) -> Result<(), diesel::result::Error> {
    if !effects.posting_transfer.is_empty() {
        diesel::sql_query(
            "INSERT INTO postings (transfer_id, account_id, kind, amount_cents) \
             SELECT * FROM unnest($1::uuid[], $2::text[], $3::text[], $4::bigint[])",
        )
        .bind::<Array<diesel::sql_types::Uuid>, _>(&effects.posting_transfer)
        .bind::<Array<Text>, _>(&effects.posting_account)
        .bind::<Array<Text>, _>(&effects.posting_kind)
        .bind::<Array<BigInt>, _>(&effects.posting_amount)
        .execute(conn)
        .await?;
        let (ids, balances): (Vec<String>, Vec<i64>) = accounts
            .values()
            .filter(|a| opening.get(&a.id) != Some(&a.balance_cents))
            .map(|a| (a.id.clone(), a.balance_cents))
            .unzip();
        diesel::sql_query(
            "UPDATE accounts AS a SET balance_cents = v.balance \
             FROM unnest($1::text[], $2::bigint[]) AS v(id, balance) WHERE a.id = v.id",
        )
        .bind::<Array<Text>, _>(&ids)
        .bind::<Array<BigInt>, _>(&balances)
        .execute(conn)
        .await?;
    }
    Ok(())
}

pub(super) async fn write_outcomes_and_events(
    conn: &mut AsyncPgConnection,
    effects: &Effects,
) -> Result<(), diesel::result::Error> {
    if !effects.outcome_id.is_empty() {
        diesel::sql_query(
            "UPDATE processed_transfers AS p SET outcome = v.outcome, reason = v.reason \
             FROM unnest($1::uuid[], $2::text[], $3::text[]) AS v(id, outcome, reason) \
             WHERE p.transfer_id = v.id",
        )
        .bind::<Array<diesel::sql_types::Uuid>, _>(&effects.outcome_id)
        .bind::<Array<Text>, _>(&effects.outcome)
        .bind::<Array<Nullable<Text>>, _>(&effects.outcome_reason)
        .execute(conn)
        .await?;
        diesel::sql_query(
            "INSERT INTO outbox_events (id, topic, key, event_type, payload, traceparent) \
             SELECT * FROM unnest($1::uuid[], $2::text[], $3::text[], $4::text[], $5::text[], $6::text[])",
        )
        .bind::<Array<diesel::sql_types::Uuid>, _>(&effects.outbox_id)
        .bind::<Array<Text>, _>(&effects.outbox_topic)
        .bind::<Array<Text>, _>(&effects.outbox_key)
        .bind::<Array<Text>, _>(&effects.outbox_type)
        .bind::<Array<Text>, _>(&effects.outbox_payload)
        .bind::<Array<Nullable<Text>>, _>(&effects.outbox_trace)
        .execute(conn)
        .await?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
