//! The `transfers` table: the intake's rows (created with their outbox row in one
//! transaction), lookups, the status projection's one-way move out of PENDING, and what
//! the ledger reads of the intake's rows before it settles.

use std::collections::HashMap;

use chrono::Utc;
use diesel::prelude::*;
use diesel::sql_types::{Array, BigInt, Nullable, Text, Uuid as SqlUuid};
use diesel::QueryableByName;
use diesel_async::scoped_futures::ScopedFutureExt;
use diesel_async::{AsyncConnection, AsyncPgConnection, RunQueryDsl};
use tally_schema::events::{derived_event_id, TransferRequested};
use tally_schema::models::{status, NewOutboxEvent, Transfer};
use tally_schema::schema::transfers;
use tally_schema::EventType;
use uuid::Uuid;

use super::outbox;

/// A validated transfer request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TransferRequest {
    pub source_account: String,
    pub destination_account: String,
    pub amount_cents: i64,
    pub currency: String,
}

impl TransferRequest {
    fn matches(&self, t: &Transfer) -> bool {
        self.source_account == t.source_account
            && self.destination_account == t.destination_account
            && self.amount_cents == t.amount_cents
            && self.currency == t.currency
    }
}

/// What happened to a transfer request.
#[derive(Debug)]
pub enum Created {
    /// A new transfer (and its outbox row) was written.
    New(Transfer),
    /// The idempotency key was seen with the same request: nothing was written.
    Replayed(Transfer),
    /// The idempotency key was seen with a different request: nothing was written.
    KeyConflict,
}

/// Kind of a `TransferRequested` event id: derived from the transfer id like every other
/// event of a transfer, so its outbox row is found by primary key.
pub const REQUESTED_KIND: &str = "requested";

/// Inserts the transfer (PENDING) and its `TransferRequested` outbox row in one
/// transaction, honouring `idempotency_key`.
///
/// # Errors
/// When the database fails; nothing is written then.
pub async fn create_transfer(
    conn: &mut AsyncPgConnection,
    req: &TransferRequest,
    idempotency_key: Option<&str>,
    topic: &str,
    traceparent: Option<String>,
) -> Result<Created, diesel::result::Error> {
    conn.transaction(|conn| {
        async move {
            let now = Utc::now();
            let row = Transfer {
                id: Uuid::now_v7(),
                source_account: req.source_account.clone(),
                destination_account: req.destination_account.clone(),
                amount_cents: req.amount_cents,
                currency: req.currency.clone(),
                status: status::PENDING.into(),
                rejection_reason: None,
                idempotency_key: idempotency_key.map(str::to_owned),
                created_at: now,
                updated_at: now,
            };
            let inserted: Option<Transfer> = diesel::insert_into(transfers::table)
                .values(&row)
                .on_conflict(transfers::idempotency_key)
                .do_nothing()
                .returning(Transfer::as_returning())
                .get_result(conn)
                .await
                .optional()?;
            let Some(transfer) = inserted else {
                let existing: Transfer = transfers::table
                    .filter(transfers::idempotency_key.eq(idempotency_key))
                    .select(Transfer::as_select())
                    .first(conn)
                    .await?;
                return Ok(if req.matches(&existing) { Created::Replayed(existing) } else { Created::KeyConflict });
            };
            let event = TransferRequested {
                event_id: derived_event_id(REQUESTED_KIND, transfer.id),
                transfer_id: transfer.id,
                source_account: transfer.source_account.clone(),
                destination_account: transfer.destination_account.clone(),
                amount_cents: transfer.amount_cents,
                currency: transfer.currency.clone(),
                requested_at: transfer.created_at,
            };
            let outbox = NewOutboxEvent::new(
                event.event_id,
                topic,
                &transfer.source_account,
                EventType::TransferRequested,
                &event,
                traceparent,
            )
            .map_err(|e| diesel::result::Error::SerializationError(Box::new(e)))?;
            outbox::insert(conn, &outbox).await?;
            Ok(Created::New(transfer))
        }
        .scope_boxed()
    })
    .await
}

/// # Errors
/// When the database fails.
pub async fn find_transfer(conn: &mut AsyncPgConnection, id: Uuid) -> Result<Option<Transfer>, diesel::result::Error> {
    transfers::table.find(id).select(Transfer::as_select()).first(conn).await.optional()
}

/// Moves a PENDING transfer to its final `status` (with `reason` for a rejection); returns
/// whether it moved. Idempotent and monotonic: a final transfer never moves again.
///
/// # Errors
/// Any database error.
pub async fn finish(
    conn: &mut AsyncPgConnection,
    id: Uuid,
    status: &str,
    reason: Option<&str>,
) -> Result<bool, diesel::result::Error> {
    let moved = diesel::sql_query(
        "UPDATE transfers SET status = $2, rejection_reason = $3, updated_at = now() \
         WHERE id = $1 AND status = 'PENDING'",
    )
    .bind::<SqlUuid, _>(id)
    .bind::<Text, _>(status)
    .bind::<Nullable<Text>, _>(reason)
    .execute(conn)
    .await?;
    Ok(moved == 1)
}

/// What tally already knows of a transfer besides the event: the intake's row (when the
/// intake took it) and whether antifraud blocked it.
#[derive(QueryableByName, Clone, Default)]
pub struct KnownTransfer {
    #[diesel(sql_type = diesel::sql_types::Uuid)]
    pub id: Uuid,
    #[diesel(sql_type = Nullable<Text>)]
    pub source_account: Option<String>,
    #[diesel(sql_type = Nullable<Text>)]
    pub destination_account: Option<String>,
    #[diesel(sql_type = Nullable<BigInt>)]
    pub amount_cents: Option<i64>,
    #[diesel(sql_type = Nullable<Text>)]
    pub currency: Option<String>,
    /// `None` when the intake never saw the transfer.
    #[diesel(sql_type = Nullable<Text>)]
    pub status: Option<String>,
    #[diesel(sql_type = diesel::sql_types::Bool)]
    pub blocked: bool,
}

/// What is known of `ids` besides their events: the intake's rows and antifraud's blocks.
///
/// # Errors
/// Any database error.
pub async fn load_known(
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
