//! The `accounts`, `postings` and `processed_transfers` tables: account creation and
//! lookups, and the statements of a settlement batch (inbox claim, account locks in one
//! global order, set-based postings and balances, outcomes).

use std::collections::{HashMap, HashSet};

use chrono::Utc;
use diesel::prelude::*;
use diesel::sql_types::{Array, BigInt, Nullable, Text, Uuid as SqlUuid};
use diesel::QueryableByName;
use diesel_async::{AsyncPgConnection, RunQueryDsl};
use futures_util::FutureExt;
use tally_schema::models::{Account, Posting};
use tally_schema::schema::{accounts, postings};
use uuid::Uuid;

use super::{unit, Sent};

/// Opens customer account `id` of `owner`, empty; `None` when the id is taken. An opening
/// balance is issued by [`crate::store::issuance::open_account`], which calls this.
///
/// # Errors
/// When the database fails.
pub async fn create_account(
    conn: &mut AsyncPgConnection,
    id: &str,
    currency: &str,
    owner: &str,
) -> Result<Option<Account>, diesel::result::Error> {
    let row = Account {
        id: id.to_owned(),
        balance_cents: 0,
        currency: currency.to_owned(),
        created_at: Utc::now(),
        owner: owner.to_owned(),
        kind: crate::authority::CUSTOMER.to_owned(),
    };
    diesel::insert_into(accounts::table)
        .values(&row)
        .on_conflict(accounts::id)
        .do_nothing()
        .returning(Account::as_returning())
        .get_result(conn)
        .await
        .optional()
}

#[derive(QueryableByName)]
struct AccountRow {
    #[diesel(sql_type = Text)]
    id: String,
    #[diesel(sql_type = Text)]
    owner: String,
    #[diesel(sql_type = Text)]
    kind: String,
}

/// The owner and kind of each account of `ids` that exists, by id (for
/// [`crate::authority`]; neither ever changes).
///
/// # Errors
/// When the database fails.
pub async fn refs(
    conn: &mut AsyncPgConnection,
    ids: &[&str],
) -> Result<HashMap<String, (String, String)>, diesel::result::Error> {
    if ids.is_empty() {
        return Ok(HashMap::new());
    }
    Ok(diesel::sql_query(
        "SELECT id::text AS id, owner::text AS owner, kind::text AS kind FROM accounts WHERE id = ANY($1)",
    )
    .bind::<Array<Text>, _>(ids)
    .load::<AccountRow>(conn)
    .await?
    .into_iter()
    .map(|r| (r.id, (r.owner, r.kind)))
    .collect())
}

/// # Errors
/// When the database fails.
pub async fn find_account(conn: &mut AsyncPgConnection, id: &str) -> Result<Option<Account>, diesel::result::Error> {
    accounts::table.find(id).select(Account::as_select()).first(conn).await.optional()
}

/// Postings of `account_id`, newest first, with ids below `before` when given.
///
/// # Errors
/// When the database fails.
pub async fn postings_page(
    conn: &mut AsyncPgConnection,
    account_id: &str,
    before: Option<i64>,
    limit: i64,
) -> Result<Vec<Posting>, diesel::result::Error> {
    let mut query = postings::table
        .filter(postings::account_id.eq(account_id))
        .select(Posting::as_select())
        .order(postings::id.desc())
        .limit(limit)
        .into_boxed();
    if let Some(before) = before {
        query = query.filter(postings::id.lt(before));
    }
    query.load(conn).await
}

/// An account locked for a settlement batch.
#[derive(Debug, QueryableByName, Clone, PartialEq, Eq)]
pub struct LockedAccount {
    #[diesel(sql_type = Text)]
    pub id: String,
    #[diesel(sql_type = BigInt)]
    pub balance_cents: i64,
    #[diesel(sql_type = Text)]
    pub currency: String,
}

#[derive(QueryableByName)]
struct InsertedId {
    #[diesel(sql_type = SqlUuid)]
    transfer_id: Uuid,
}

/// The inbox: inserts a `processed_transfers` row (outcome PROCESSING) for each of `ids`
/// and returns those that were inserted; a transfer whose row exists is a duplicate.
///
/// The rows are inserted in id order, whatever the order of `ids`: an insert that meets a
/// key another open transaction inserted waits for it, so two batches holding the same
/// redelivered transfers in different orders would otherwise each wait for a key the
/// other holds (a deadlock). In one global order the later one waits, never in a cycle.
///
/// # Errors
/// Any database error.
pub fn claim_inbox<'a>(conn: &mut AsyncPgConnection, ids: &'a [Uuid]) -> Sent<'a, HashSet<Uuid>> {
    let sent = diesel::sql_query(
        "INSERT INTO processed_transfers (transfer_id, outcome) \
         SELECT id, 'PROCESSING' FROM unnest($1::uuid[]) AS id ORDER BY id \
         ON CONFLICT (transfer_id) DO NOTHING RETURNING transfer_id",
    )
    .bind::<Array<SqlUuid>, _>(ids)
    .load::<InsertedId>(conn);
    async move { Ok(sent.await?.into_iter().map(|r| r.transfer_id).collect()) }.boxed()
}

/// Undoes this transaction's inbox claims of `ids` (transfers the ledger refused): their
/// genuine event is then new when it comes.
///
/// # Errors
/// Any database error.
pub fn release_inbox<'a>(conn: &mut AsyncPgConnection, ids: &'a [Uuid]) -> Sent<'a, ()> {
    let sent = (!ids.is_empty()).then(|| {
        diesel::sql_query("DELETE FROM processed_transfers WHERE transfer_id = ANY($1) AND outcome = 'PROCESSING'")
            .bind::<Array<SqlUuid>, _>(ids)
            .execute(conn)
    });
    unit(sent)
}

/// Locks `ids` (`ORDER BY id FOR UPDATE`): every transaction locks in the same global
/// order, so concurrent batches (and A->B against B->A) cannot deadlock. Accounts that do
/// not exist are absent from the map.
///
/// # Errors
/// Any database error.
pub fn lock<'a>(conn: &mut AsyncPgConnection, ids: &'a [String]) -> Sent<'a, HashMap<String, LockedAccount>> {
    let sent = (!ids.is_empty()).then(|| {
        diesel::sql_query(
            "SELECT id::text AS id, balance_cents, currency::text AS currency FROM accounts \
             WHERE id = ANY($1) ORDER BY id FOR UPDATE",
        )
        .bind::<Array<Text>, _>(ids)
        .load::<LockedAccount>(conn)
    });
    async move {
        let Some(sent) = sent else { return Ok(HashMap::new()) };
        Ok(sent.await?.into_iter().map(|a| (a.id.clone(), a)).collect())
    }
    .boxed()
}

/// Postings as columns, for one set-based insert.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct PostingColumns {
    pub transfer_id: Vec<Uuid>,
    pub account_id: Vec<String>,
    /// `D` (debit) or `C` (credit).
    pub kind: Vec<String>,
    pub amount_cents: Vec<i64>,
}

/// Writes `postings` in one statement.
///
/// # Errors
/// Any database error.
pub fn insert_postings<'a>(conn: &mut AsyncPgConnection, postings: &'a PostingColumns) -> Sent<'a, ()> {
    let sent = (!postings.transfer_id.is_empty()).then(|| {
        diesel::sql_query(
            "INSERT INTO postings (transfer_id, account_id, kind, amount_cents) \
             SELECT * FROM unnest($1::uuid[], $2::text[], $3::text[], $4::bigint[])",
        )
        .bind::<Array<SqlUuid>, _>(&postings.transfer_id)
        .bind::<Array<Text>, _>(&postings.account_id)
        .bind::<Array<Text>, _>(&postings.kind)
        .bind::<Array<BigInt>, _>(&postings.amount_cents)
        .execute(conn)
    });
    unit(sent)
}

/// Sets each account's balance, in one statement.
///
/// # Errors
/// Any database error.
pub fn set_balances<'a>(conn: &mut AsyncPgConnection, ids: &'a [String], balances: &'a [i64]) -> Sent<'a, ()> {
    let sent = (!ids.is_empty()).then(|| {
        diesel::sql_query(
            "UPDATE accounts AS a SET balance_cents = v.balance \
             FROM unnest($1::text[], $2::bigint[]) AS v(id, balance) WHERE a.id = v.id",
        )
        .bind::<Array<Text>, _>(ids)
        .bind::<Array<BigInt>, _>(balances)
        .execute(conn)
    });
    unit(sent)
}

/// Outcomes of the inbox rows as columns, for one set-based update.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct OutcomeColumns {
    pub transfer_id: Vec<Uuid>,
    /// `SETTLED` or `REJECTED`.
    pub outcome: Vec<String>,
    pub reason: Vec<Option<String>>,
}

/// Sets the outcome of each claimed inbox row, in one statement.
///
/// # Errors
/// Any database error.
pub fn set_outcomes<'a>(conn: &mut AsyncPgConnection, outcomes: &'a OutcomeColumns) -> Sent<'a, ()> {
    let sent = (!outcomes.transfer_id.is_empty()).then(|| {
        diesel::sql_query(
            "UPDATE processed_transfers AS p SET outcome = v.outcome, reason = v.reason \
             FROM unnest($1::uuid[], $2::text[], $3::text[]) AS v(id, outcome, reason) \
             WHERE p.transfer_id = v.id",
        )
        .bind::<Array<SqlUuid>, _>(&outcomes.transfer_id)
        .bind::<Array<Text>, _>(&outcomes.outcome)
        .bind::<Array<Nullable<Text>>, _>(&outcomes.reason)
        .execute(conn)
    });
    unit(sent)
}
