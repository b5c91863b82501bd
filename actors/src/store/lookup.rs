//! Read-only: everything the tables know of one transfer, for the operator console's
//! transfer lookup. Each query but one goes through a primary key or an index: outbox rows
//! by their ids (every event of a transfer has an id derived from the transfer's),
//! postings through `(transfer_id, kind)`, notification deliveries through their
//! `transfer_id` index. Dead letters are matched on key and payload over the
//! `dead_letters` table, which holds only records whose DLT write failed.

use chrono::{DateTime, Utc};
use diesel::sql_types::{BigInt, Integer, Nullable, Text, Timestamptz, Uuid as SqlUuid};
use diesel::QueryableByName;
use diesel_async::{AsyncPgConnection, RunQueryDsl};
use tally_schema::models::Transfer;
use uuid::Uuid;

use super::dead_letters::{self, DeadLetter};
use super::decisions::{self, Decision};
use super::transfers;

/// One transfer as the tables know it.
#[derive(Debug, Clone)]
pub struct TransferStory {
    pub transfer: Transfer,
    pub decision: Option<Decision>,
    pub settlement: Option<Settlement>,
    pub postings: Vec<PostingRow>,
    pub outbox: Vec<OutboxRow>,
    pub deliveries: Vec<DeliveryRow>,
    pub dead_letters: Vec<DeadLetter>,
}

/// The ledger's inbox row: how and when the ledger settled the transfer.
#[derive(Debug, Clone, QueryableByName)]
pub struct Settlement {
    #[diesel(sql_type = Text)]
    pub outcome: String,
    #[diesel(sql_type = Nullable<Text>)]
    pub reason: Option<String>,
    #[diesel(sql_type = Timestamptz)]
    pub processed_at: DateTime<Utc>,
}

#[derive(Debug, Clone, QueryableByName)]
pub struct PostingRow {
    #[diesel(sql_type = Text)]
    pub account_id: String,
    /// `D` (debit) or `C` (credit).
    #[diesel(sql_type = Text)]
    pub kind: String,
    #[diesel(sql_type = BigInt)]
    pub amount_cents: i64,
    #[diesel(sql_type = Timestamptz)]
    pub created_at: DateTime<Utc>,
}

/// An outbox row about the transfer (written by intake or by the ledger); gone once
/// published longer ago than the outbox retention.
#[derive(Debug, Clone, QueryableByName)]
pub struct OutboxRow {
    #[diesel(sql_type = Text)]
    pub topic: String,
    #[diesel(sql_type = Text)]
    pub event_type: String,
    #[diesel(sql_type = Timestamptz)]
    pub created_at: DateTime<Utc>,
    #[diesel(sql_type = Nullable<Timestamptz>)]
    pub published_at: Option<DateTime<Utc>>,
}

#[derive(Debug, Clone, QueryableByName)]
pub struct DeliveryRow {
    #[diesel(sql_type = Text)]
    pub topic: String,
    #[diesel(sql_type = Integer)]
    pub attempts: i32,
    #[diesel(sql_type = Integer)]
    pub response_status: i32,
    #[diesel(sql_type = Timestamptz)]
    pub delivered_at: DateTime<Utc>,
}

/// Everything the tables hold about transfer `id`, or `None` when there is no such
/// transfer. `event_ids` are the ids its events would have (derived from `id`): their
/// outbox rows, while the outbox keeps them.
///
/// # Errors
/// Any database error.
pub async fn transfer_story(
    conn: &mut AsyncPgConnection,
    id: Uuid,
    event_ids: &[Uuid],
) -> Result<Option<TransferStory>, diesel::result::Error> {
    let Some(transfer) = transfers::find_transfer(conn, id).await? else {
        return Ok(None);
    };
    let decision = decisions::load(conn, &[id]).await?.into_values().next();
    let settlement =
        diesel::sql_query("SELECT outcome, reason, processed_at FROM processed_transfers WHERE transfer_id = $1")
            .bind::<SqlUuid, _>(id)
            .get_result::<Settlement>(conn)
            .await
            .map(Some)
            .or_else(not_found_is_none)?;
    let postings = diesel::sql_query(
        "SELECT account_id, kind::text AS kind, amount_cents, created_at FROM postings \
         WHERE account_id IN ($2, $3) AND transfer_id = $1 ORDER BY id",
    )
    .bind::<SqlUuid, _>(id)
    .bind::<Text, _>(&transfer.source_account)
    .bind::<Text, _>(&transfer.destination_account)
    .load::<PostingRow>(conn)
    .await?;
    let outbox = diesel::sql_query(
        "SELECT topic, event_type, created_at, published_at FROM outbox_events \
         WHERE id = ANY($1) ORDER BY seq",
    )
    .bind::<diesel::sql_types::Array<SqlUuid>, _>(event_ids)
    .load::<OutboxRow>(conn)
    .await?;
    let deliveries = diesel::sql_query(
        "SELECT topic, attempts, response_status, delivered_at FROM notification_deliveries \
         WHERE transfer_id = $1 ORDER BY delivered_at",
    )
    .bind::<SqlUuid, _>(id)
    .load::<DeliveryRow>(conn)
    .await?;
    let dead_letters = dead_letters::of_transfer(conn, &transfer.source_account, id).await?;
    Ok(Some(TransferStory { transfer, decision, settlement, postings, outbox, deliveries, dead_letters }))
}

fn not_found_is_none<T>(e: diesel::result::Error) -> Result<Option<T>, diesel::result::Error> {
    match e {
        diesel::result::Error::NotFound => Ok(None),
        e => Err(e),
    }
}
