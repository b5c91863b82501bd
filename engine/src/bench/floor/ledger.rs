//! The ledger's batch as PostgreSQL alone runs it: the statements of
//! `tally_actors::ledger::settle_batch`, in the same order and one transaction, with the
//! rules reduced to "every new transfer settles" (the balances still come from the locked
//! rows, so they stay exact). What is pure (the batch and its writes) is apart from what
//! talks to the database, and unit-tested.

use std::collections::{HashMap, HashSet};

use chrono::Utc;
use diesel::sql_types::{Array, BigInt, Nullable, Text, Uuid as SqlUuid};
use diesel::QueryableByName;
use diesel_async::scoped_futures::ScopedFutureExt;
use diesel_async::{AsyncConnection, AsyncPgConnection, RunQueryDsl};
use tally_actors::ledger::SETTLED_KIND;
use tally_actors::store::accounts::{LockedAccount, OutcomeColumns, PostingColumns};
use tally_actors::store::outbox::OutboxColumns;
use tally_actors::store::transfers::KnownTransfer;
use tally_schema::events::{derived_event_id, TransferAnalyzed, TransferSettled};
use tally_schema::models::status;
use tally_schema::EventType;
use uuid::Uuid;

use crate::bench::account;
use crate::bench::ledger::Rng;
use crate::bench::sql::floor as sql;

/// `n` transfers over random pairs of distinct accounts out of `accounts` (at least 2),
/// 1 to 1,000 cents each, time-ordered ids, as the ledger bench makes them (without its
/// duplicates and overdrafts: the floor settles every transfer).
#[must_use]
pub(crate) fn transfers(rng: &mut Rng, n: usize, accounts: usize) -> Vec<TransferAnalyzed> {
    (0..n)
        .map(|_| {
            let from = rng.below(accounts);
            let mut to = rng.below(accounts);
            if to == from {
                to = (to + 1) % accounts;
            }
            let transfer_id = Uuid::now_v7();
            TransferAnalyzed {
                event_id: derived_event_id("analyzed", transfer_id),
                transfer_id,
                source_account: account(from),
                destination_account: account(to),
                amount_cents: 1 + rng.below(1_000) as i64,
                currency: "BRL".into(),
                score: 10,
                analyzed_at: Utc::now(),
            }
        })
        .collect()
}

/// The writes of a batch whose new transfers all settle.
#[derive(Debug, Default)]
pub struct Writes {
    pub postings: PostingColumns,
    /// The accounts whose balance changed, and the new balance.
    pub accounts: Vec<String>,
    pub balances: Vec<i64>,
    pub outcomes: OutcomeColumns,
    pub events: OutboxColumns,
}

/// The distinct transfer ids of `batch`, in batch order (what the inbox claims).
#[must_use]
pub fn distinct_ids(batch: &[TransferAnalyzed]) -> Vec<Uuid> {
    let mut seen = HashSet::new();
    batch.iter().map(|t| t.transfer_id).filter(|id| seen.insert(*id)).collect()
}

/// The accounts of the `fresh` transfers of `batch`, sorted and distinct (what is locked).
#[must_use]
pub fn accounts_to_lock(batch: &[TransferAnalyzed], fresh: &HashSet<Uuid>) -> Vec<String> {
    let mut ids: Vec<String> = batch
        .iter()
        .filter(|t| fresh.contains(&t.transfer_id))
        .flat_map(|t| [t.source_account.clone(), t.destination_account.clone()])
        .collect();
    ids.sort_unstable();
    ids.dedup();
    ids
}

/// Settles every `fresh` transfer of `batch` once, on the `locked` balances: a debit and a
/// credit each, its SETTLED outcome and its `TransferSettled` event to `topic`; the
/// balances whose net change is not zero.
///
/// # Errors
/// When an event does not serialize.
pub fn writes(
    batch: &[TransferAnalyzed],
    fresh: &HashSet<Uuid>,
    locked: &HashMap<String, LockedAccount>,
    topic: &str,
) -> Result<Writes, serde_json::Error> {
    let mut w = Writes::default();
    let mut delta: HashMap<&str, i64> = HashMap::new();
    let mut once = HashSet::new();
    for t in batch.iter().filter(|t| fresh.contains(&t.transfer_id) && once.insert(t.transfer_id)) {
        for (account, kind, change) in
            [(&t.source_account, "D", -t.amount_cents), (&t.destination_account, "C", t.amount_cents)]
        {
            w.postings.transfer_id.push(t.transfer_id);
            w.postings.account_id.push(account.clone());
            w.postings.kind.push(kind.into());
            w.postings.amount_cents.push(t.amount_cents);
            *delta.entry(account.as_str()).or_default() += change;
        }
        w.outcomes.transfer_id.push(t.transfer_id);
        w.outcomes.outcome.push(status::SETTLED.into());
        w.outcomes.reason.push(None);
        let event = TransferSettled {
            event_id: derived_event_id(SETTLED_KIND, t.transfer_id),
            transfer_id: t.transfer_id,
            settled_at: Utc::now(),
        };
        w.events.id.push(event.event_id);
        w.events.topic.push(topic.into());
        w.events.key.push(t.source_account.clone());
        w.events.event_type.push(EventType::TransferSettled.as_str().into());
        w.events.payload.push(serde_json::to_string(&event)?);
        w.events.traceparent.push(None);
    }
    let mut changed: Vec<(&str, i64)> = delta.into_iter().filter(|(_, d)| *d != 0).collect();
    changed.sort_unstable();
    for (id, d) in changed {
        if let Some(a) = locked.get(id) {
            w.accounts.push(id.to_owned());
            w.balances.push(a.balance_cents + d);
        }
    }
    Ok(w)
}

#[derive(QueryableByName)]
struct Claimed {
    #[diesel(sql_type = SqlUuid)]
    transfer_id: Uuid,
}

/// Settles `batch` in one transaction with the ledger's statements; returns how many
/// transfers were new (settled).
///
/// # Errors
/// Any database error; the transaction is rolled back.
pub async fn settle(
    conn: &mut AsyncPgConnection,
    batch: &[TransferAnalyzed],
    topic: &str,
) -> Result<usize, diesel::result::Error> {
    conn.transaction(|conn| {
        async move {
            let ids = distinct_ids(batch);
            let fresh: HashSet<Uuid> = diesel::sql_query(sql::CLAIM_INBOX)
                .bind::<Array<SqlUuid>, _>(&ids)
                .load::<Claimed>(conn)
                .await?
                .into_iter()
                .map(|c| c.transfer_id)
                .collect();
            let to_lock = accounts_to_lock(batch, &fresh);
            let locked: HashMap<String, LockedAccount> = if to_lock.is_empty() {
                HashMap::new()
            } else {
                diesel::sql_query(sql::LOCK_ACCOUNTS)
                    .bind::<Array<Text>, _>(&to_lock)
                    .load::<LockedAccount>(conn)
                    .await?
                    .into_iter()
                    .map(|a| (a.id.clone(), a))
                    .collect()
            };
            let fresh_ids: Vec<Uuid> = ids.iter().copied().filter(|id| fresh.contains(id)).collect();
            if !fresh_ids.is_empty() {
                // Read as the ledger reads it; the floor's rule does not look at it.
                let _known: Vec<KnownTransfer> =
                    diesel::sql_query(sql::LOAD_KNOWN).bind::<Array<SqlUuid>, _>(&fresh_ids).load(conn).await?;
            }
            let w = writes(batch, &fresh, &locked, topic)
                .map_err(|e| diesel::result::Error::SerializationError(Box::new(e)))?;
            if !w.postings.transfer_id.is_empty() {
                diesel::sql_query(sql::INSERT_POSTINGS)
                    .bind::<Array<SqlUuid>, _>(&w.postings.transfer_id)
                    .bind::<Array<Text>, _>(&w.postings.account_id)
                    .bind::<Array<Text>, _>(&w.postings.kind)
                    .bind::<Array<BigInt>, _>(&w.postings.amount_cents)
                    .execute(conn)
                    .await?;
            }
            if !w.accounts.is_empty() {
                diesel::sql_query(sql::SET_BALANCES)
                    .bind::<Array<Text>, _>(&w.accounts)
                    .bind::<Array<BigInt>, _>(&w.balances)
                    .execute(conn)
                    .await?;
            }
            if !w.outcomes.transfer_id.is_empty() {
                diesel::sql_query(sql::SET_OUTCOMES)
                    .bind::<Array<SqlUuid>, _>(&w.outcomes.transfer_id)
                    .bind::<Array<Text>, _>(&w.outcomes.outcome)
                    .bind::<Array<Nullable<Text>>, _>(&w.outcomes.reason)
                    .execute(conn)
                    .await?;
            }
            insert_outbox(conn, &w.events).await?;
            Ok(fresh.len())
        }
        .scope_boxed()
    })
    .await
}

/// The outbox rows `rows`, in one statement (inside the caller's transaction).
///
/// # Errors
/// Any database error.
pub async fn insert_outbox(conn: &mut AsyncPgConnection, rows: &OutboxColumns) -> Result<(), diesel::result::Error> {
    if rows.id.is_empty() {
        return Ok(());
    }
    diesel::sql_query(sql::INSERT_OUTBOX)
        .bind::<Array<SqlUuid>, _>(&rows.id)
        .bind::<Array<Text>, _>(&rows.topic)
        .bind::<Array<Text>, _>(&rows.key)
        .bind::<Array<Text>, _>(&rows.event_type)
        .bind::<Array<Text>, _>(&rows.payload)
        .bind::<Array<Nullable<Text>>, _>(&rows.traceparent)
        .execute(conn)
        .await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn locked(id: &str, balance: i64) -> (String, LockedAccount) {
        (id.into(), LockedAccount { id: id.into(), balance_cents: balance, currency: "BRL".into() })
    }

    #[test]
    fn a_batch_is_distinct_pairs_within_the_accounts() {
        let batch = transfers(&mut Rng(7), 500, 3);
        assert_eq!(batch.len(), 500);
        assert_eq!(distinct_ids(&batch).len(), 500);
        for t in &batch {
            assert_ne!(t.source_account, t.destination_account);
            assert!((1..=1_000).contains(&t.amount_cents));
            assert!([account(0), account(1), account(2)].contains(&t.destination_account));
        }
    }

    #[test]
    fn the_writes_of_a_batch_balance_and_skip_what_is_not_new() {
        let mut batch = transfers(&mut Rng(11), 4, 3);
        batch.push(batch[0].clone());
        let old = batch[1].transfer_id;
        let fresh: HashSet<Uuid> = distinct_ids(&batch).into_iter().filter(|id| *id != old).collect();
        let lock = accounts_to_lock(&batch, &fresh);
        assert!(lock.windows(2).all(|w| w[0] < w[1]), "sorted and distinct: {lock:?}");
        let accounts: HashMap<_, _> =
            [locked(&account(0), 5_000), locked(&account(1), 5_000), locked(&account(2), 5_000)].into();
        let w = writes(&batch, &fresh, &accounts, "settled").unwrap();
        assert_eq!(w.outcomes.transfer_id.len(), 3, "the repeat and the one already in the inbox are left out");
        assert_eq!(w.postings.transfer_id.len(), 6, "a debit and a credit each");
        assert_eq!(w.events.id.len(), 3);
        assert!(w.events.payload.iter().all(|p| p.contains("transferId") && p.contains("settledAt")));
        let net: i64 =
            w.postings.amount_cents.iter().zip(&w.postings.kind).map(|(a, k)| if k == "C" { *a } else { -a }).sum();
        assert_eq!(net, 0, "postings balance");
        let after: i64 = w.balances.iter().sum::<i64>()
            + accounts.values().filter(|a| !w.accounts.contains(&a.id)).map(|a| a.balance_cents).sum::<i64>();
        assert_eq!(after, 15_000, "the sum of balances is unchanged");
    }
}
