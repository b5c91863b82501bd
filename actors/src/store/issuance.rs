//! Issuance: money entering the ledger, as a transfer from the issuance account of its
//! currency (`issuance:<CUR>`, whose balance is minus everything issued in it) settled at
//! once with its postings. An opening balance is issued by the `accounts_issued` trigger
//! when the account is inserted; a top-up by [`issue`]. Both end in the `tally_issue`
//! function of the migration `2026-12-04-000010_owners_and_issuance`, so the money moves
//! one way only. Who may issue is [`crate::authority`]'s to say, before this is called.

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
            diesel::sql_query("SELECT tally_issue($1, $2, $3, $4, $5, $6)")
                .bind::<Array<SqlUuid>, _>(vec![inserted.id])
                .bind::<Array<Text>, _>(vec![top_up.destination.as_str()])
                .bind::<Array<Text>, _>(vec![top_up.currency.as_str()])
                .bind::<Array<BigInt>, _>(vec![top_up.amount_cents])
                .bind::<Array<Text>, _>(vec![top_up.client.as_str()])
                .bind::<Array<Timestamptz>, _>(vec![now])
                .execute(conn)
                .await?;
            Ok(Issued::New(inserted))
        }
        .scope_boxed()
    })
    .await
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
