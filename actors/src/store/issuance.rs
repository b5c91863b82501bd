//! Issuance: money entering the ledger, as a transfer from the issuance account of its
//! currency (`issuance:<CUR>`, whose balance is minus everything issued in it) settled at
//! once with its postings. An opening balance is issued by [`open_account`] (or
//! [`open_funded`], many at once), a top-up by [`issue`]. Each ends in the `tally_issue`
//! function of the migration `2026-12-04-000010_owners_and_issuance`, so the money moves
//! one way only, and writes in the same transaction the `issuance_audit` row that names
//! the client on whose authority it was issued (the ledger check's
//! `issuances_authorized`). Who may issue is [`crate::authority`]'s to say, before this is
//! called.

use chrono::Utc;
use diesel::prelude::*;
use diesel::sql_types::{Array, BigInt, Text, Timestamptz, Uuid as SqlUuid};
use diesel::QueryableByName;
use diesel_async::scoped_futures::ScopedFutureExt;
use diesel_async::{AsyncConnection, AsyncPgConnection, RunQueryDsl};
use tally_schema::models::{status, transfer_kind, Transfer};
use tally_schema::schema::transfers;
use uuid::Uuid;

use crate::authority::{issuance_account, CUSTOMER};

/// A top-up to issue.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TopUp {
    pub destination: String,
    pub amount_cents: i64,
    pub currency: String,
    /// The API client that issues it (holding the `issue` scope).
    pub client: String,
    /// Makes a retry safe: the same request again replays the first, another conflicts.
    pub idempotency_key: String,
    /// No balance may pass this (`ledger.max_balance_cents`).
    pub max_balance_cents: i64,
}

/// What became of a top-up.
#[derive(Debug)]
pub enum Issued {
    /// Issued now: the transfer, SETTLED.
    New(Transfer),
    /// The idempotency key was used for the same top-up: nothing more was issued.
    Replayed(Transfer),
    /// The idempotency key was used for another request: nothing was issued.
    KeyConflict,
    /// Nothing was issued, for this reason.
    Refused(TopUpRefusal),
}

/// Why a top-up is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TopUpRefusal {
    /// No customer account has the destination's id.
    UnknownAccount,
    /// The destination holds another currency.
    CurrencyMismatch,
    /// The credit would take the destination past `ledger.max_balance_cents`.
    BalanceLimit,
}

#[derive(QueryableByName)]
struct Destination {
    #[diesel(sql_type = BigInt)]
    balance_cents: i64,
    #[diesel(sql_type = Text)]
    currency: String,
    #[diesel(sql_type = Text)]
    kind: String,
}

/// Issues `top_up` in one transaction: the destination is locked first (so two requests
/// with one key wait on each other, and the second replays the first), checked, credited,
/// and the issuance account debited with the postings of the transfer.
///
/// # Errors
/// When the database fails; nothing is issued then.
pub async fn issue(conn: &mut AsyncPgConnection, top_up: &TopUp) -> Result<Issued, diesel::result::Error> {
    conn.transaction(|conn| {
        async move {
            let destination: Option<Destination> = diesel::sql_query(
                "SELECT balance_cents, currency::text AS currency, kind::text AS kind FROM accounts \
                 WHERE id = $1 FOR UPDATE",
            )
            .bind::<Text, _>(&top_up.destination)
            .get_result(conn)
            .await
            .optional()?;
            if let Some(existing) = keyed(conn, top_up).await? {
                return Ok(if same(&existing, top_up) { Issued::Replayed(existing) } else { Issued::KeyConflict });
            }
            let refusal = match &destination {
                None => Some(TopUpRefusal::UnknownAccount),
                Some(d) if d.kind != CUSTOMER => Some(TopUpRefusal::UnknownAccount),
                Some(d) if d.currency != top_up.currency => Some(TopUpRefusal::CurrencyMismatch),
                Some(d)
                    if d.balance_cents
                        .checked_add(top_up.amount_cents)
                        .is_none_or(|b| b > top_up.max_balance_cents) =>
                {
                    Some(TopUpRefusal::BalanceLimit)
                }
                Some(_) => None,
            };
            if let Some(refusal) = refusal {
                return Ok(Issued::Refused(refusal));
            }
            let now = Utc::now();
            let row = Transfer {
                id: Uuid::now_v7(),
                source_account: issuance_account(&top_up.currency),
                destination_account: top_up.destination.clone(),
                amount_cents: top_up.amount_cents,
                currency: top_up.currency.clone(),
                status: status::SETTLED.into(),
                rejection_reason: None,
                idempotency_key: Some(top_up.idempotency_key.clone()),
                created_at: now,
                updated_at: now,
                client: top_up.client.clone(),
                kind: transfer_kind::ISSUANCE.into(),
            };
            let inserted: Transfer = diesel::insert_into(transfers::table)
                .values(&row)
                .returning(Transfer::as_returning())
                .get_result(conn)
                .await?;
            diesel::sql_query("UPDATE accounts SET balance_cents = balance_cents + $2 WHERE id = $1")
                .bind::<Text, _>(&top_up.destination)
                .bind::<BigInt, _>(top_up.amount_cents)
                .execute(conn)
                .await?;
            let credit = Credit {
                transfer: inserted.id,
                account: &top_up.destination,
                amount_cents: top_up.amount_cents,
                currency: &top_up.currency,
            };
            issue_credits(conn, &[credit], &top_up.client, now).await?;
            Ok(Issued::New(inserted))
        }
        .scope_boxed()
    })
    .await
}

/// Money issued to an account whose balance already holds it.
struct Credit<'a> {
    transfer: Uuid,
    account: &'a str,
    amount_cents: i64,
    currency: &'a str,
}

/// The issuance transfers of `credits` (their postings, the issuance accounts' balances)
/// and their audit rows, naming `client` as the one holding the `issue` scope. Inside the
/// caller's transaction, which has credited the accounts.
async fn issue_credits(
    conn: &mut AsyncPgConnection,
    credits: &[Credit<'_>],
    client: &str,
    at: chrono::DateTime<Utc>,
) -> Result<(), diesel::result::Error> {
    if credits.is_empty() {
        return Ok(());
    }
    let ids: Vec<Uuid> = credits.iter().map(|c| c.transfer).collect();
    diesel::sql_query("SELECT tally_issue($1, $2, $3, $4, $5, $6)")
        .bind::<Array<SqlUuid>, _>(&ids)
        .bind::<Array<Text>, _>(credits.iter().map(|c| c.account).collect::<Vec<_>>())
        .bind::<Array<Text>, _>(credits.iter().map(|c| c.currency).collect::<Vec<_>>())
        .bind::<Array<BigInt>, _>(credits.iter().map(|c| c.amount_cents).collect::<Vec<_>>())
        .bind::<Array<Text>, _>(vec![client; credits.len()])
        .bind::<Array<Timestamptz>, _>(vec![at; credits.len()])
        .execute(conn)
        .await?;
    // During a rolling upgrade tally_issue audits every issuance on tally's connections
    // as the older release's; this release's own take the row over.
    diesel::sql_query(
        "INSERT INTO issuance_audit (transfer_id, client, authority, recorded_at) \
         SELECT t, $2, 'api', $3 FROM unnest($1::uuid[]) AS u(t) \
         ON CONFLICT (transfer_id) DO UPDATE \
         SET client = EXCLUDED.client, authority = EXCLUDED.authority, recorded_at = EXCLUDED.recorded_at",
    )
    .bind::<Array<SqlUuid>, _>(&ids)
    .bind::<Text, _>(client)
    .bind::<Timestamptz, _>(at)
    .execute(conn)
    .await?;
    Ok(())
}

/// An account to open.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Opening {
    pub id: String,
    pub currency: String,
    /// Issued to it as it opens (the caller checked that `owner` may issue when positive).
    pub balance_cents: i64,
    /// The API client that opens it: it owns the account, and issues its balance.
    pub owner: String,
}

/// Opens the account of `opening`, its opening balance issued in the same transaction;
/// `None` when the id is taken, exactly or but for letter case (nothing is issued then).
/// Two requests racing for ids that differ only in case: the second fails on the index
/// `accounts_id_folded` ([`is_folded_id_conflict`]).
///
/// # Errors
/// When the database fails; nothing is opened or issued then.
pub async fn open_account(
    conn: &mut AsyncPgConnection,
    opening: &Opening,
) -> Result<Option<tally_schema::models::Account>, diesel::result::Error> {
    conn.transaction(|conn| {
        async move {
            let folded: Option<i32> =
                diesel::sql_query("SELECT 1 AS one FROM accounts WHERE kind = 'customer' AND lower(id) = lower($1)")
                    .bind::<Text, _>(&opening.id)
                    .get_result::<One>(conn)
                    .await
                    .optional()?
                    .map(|r| r.one);
            if folded.is_some() {
                return Ok(None);
            }
            let Some(mut account) =
                super::accounts::create_account(conn, &opening.id, &opening.currency, &opening.owner).await?
            else {
                return Ok(None);
            };
            if opening.balance_cents > 0 {
                credit(conn, &[(opening.id.as_str(), opening.balance_cents)]).await?;
                let credit = Credit {
                    transfer: Uuid::now_v7(),
                    account: &opening.id,
                    amount_cents: opening.balance_cents,
                    currency: &opening.currency,
                };
                issue_credits(conn, &[credit], &opening.owner, account.created_at).await?;
                account.balance_cents = opening.balance_cents;
            }
            Ok(Some(account))
        }
        .scope_boxed()
    })
    .await
}

#[derive(QueryableByName)]
struct One {
    #[diesel(sql_type = diesel::sql_types::Integer)]
    one: i32,
}

/// Whether `e` is the refusal of an account id that differs from an existing one only in
/// letter case (the unique index `accounts_id_folded`).
#[must_use]
pub fn is_folded_id_conflict(e: &diesel::result::Error) -> bool {
    matches!(e, diesel::result::Error::DatabaseError(diesel::result::DatabaseErrorKind::UniqueViolation, info)
        if info.constraint_name() == Some("accounts_id_folded"))
}

/// Opens every account of `rows` (id, opening balance) in `currency` for `owner` in one
/// transaction, each balance issued as [`open_account`] issues it: for the bench and the
/// tests, which fund thousands of accounts at once.
///
/// # Errors
/// When an id is taken or the database fails; nothing is opened then.
pub async fn open_funded(
    conn: &mut AsyncPgConnection,
    owner: &str,
    currency: &str,
    rows: &[(String, i64)],
) -> Result<(), diesel::result::Error> {
    conn.transaction(|conn| {
        async move {
            let now = Utc::now();
            diesel::sql_query(
                "INSERT INTO accounts (id, balance_cents, currency, owner, kind, created_at) \
                 SELECT id, 0, $2, $3, 'customer', $4 FROM unnest($1::text[]) AS u(id)",
            )
            .bind::<Array<Text>, _>(rows.iter().map(|(id, _)| id.as_str()).collect::<Vec<_>>())
            .bind::<Text, _>(currency)
            .bind::<Text, _>(owner)
            .bind::<Timestamptz, _>(now)
            .execute(conn)
            .await?;
            let funded: Vec<(&str, i64)> =
                rows.iter().filter(|(_, cents)| *cents > 0).map(|(id, cents)| (id.as_str(), *cents)).collect();
            credit(conn, &funded).await?;
            let credits: Vec<Credit<'_>> = funded
                .iter()
                .map(|(id, cents)| Credit { transfer: Uuid::now_v7(), account: id, amount_cents: *cents, currency })
                .collect();
            issue_credits(conn, &credits, owner, now).await
        }
        .scope_boxed()
    })
    .await
}

/// Adds each amount to its account's balance.
async fn credit(conn: &mut AsyncPgConnection, amounts: &[(&str, i64)]) -> Result<(), diesel::result::Error> {
    if amounts.is_empty() {
        return Ok(());
    }
    diesel::sql_query(
        "UPDATE accounts AS a SET balance_cents = a.balance_cents + u.cents \
         FROM unnest($1::text[], $2::bigint[]) AS u(id, cents) WHERE a.id = u.id",
    )
    .bind::<Array<Text>, _>(amounts.iter().map(|(id, _)| *id).collect::<Vec<_>>())
    .bind::<Array<BigInt>, _>(amounts.iter().map(|(_, cents)| *cents).collect::<Vec<_>>())
    .execute(conn)
    .await?;
    Ok(())
}

/// The transfer of `top_up`'s client under its idempotency key, if any.
async fn keyed(conn: &mut AsyncPgConnection, top_up: &TopUp) -> Result<Option<Transfer>, diesel::result::Error> {
    let key = &top_up.idempotency_key;
    transfers::table
        .filter(transfers::client.eq(&top_up.client))
        .filter(transfers::idempotency_key.eq(key))
        .select(Transfer::as_select())
        .first(conn)
        .await
        .optional()
}

/// Whether `existing` is the issuance `top_up` asks for.
fn same(existing: &Transfer, top_up: &TopUp) -> bool {
    existing.kind == transfer_kind::ISSUANCE
        && existing.destination_account == top_up.destination
        && existing.amount_cents == top_up.amount_cents
        && existing.currency == top_up.currency
}
