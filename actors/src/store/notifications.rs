//! The `notification_deliveries` table: one row per event delivered to the webhook, so a
//! redelivered or retried event is not sent twice once it got through.

use diesel::sql_types::{Integer, Text, Uuid as SqlUuid};
use diesel::QueryableByName;
use diesel_async::{AsyncPgConnection, RunQueryDsl};
use uuid::Uuid;

#[derive(QueryableByName)]
struct Found {
    #[diesel(sql_type = Integer)]
    #[allow(dead_code)]
    one: i32,
}

/// Whether `event_id` was delivered already.
///
/// # Errors
/// Any database error.
pub async fn delivered(conn: &mut AsyncPgConnection, event_id: Uuid) -> Result<bool, diesel::result::Error> {
    let found: Vec<Found> = diesel::sql_query("SELECT 1 AS one FROM notification_deliveries WHERE event_id = $1")
        .bind::<SqlUuid, _>(event_id)
        .load(conn)
        .await?;
    Ok(!found.is_empty())
}

/// One delivery that got through.
#[derive(Debug, Clone, Copy)]
pub struct Delivery<'a> {
    pub event_id: Uuid,
    pub topic: &'a str,
    pub transfer_id: Uuid,
    pub attempt: u32,
    pub response_status: u16,
}

/// Records `delivery`; a row already there for the event is kept.
///
/// # Errors
/// Any database error.
pub async fn remember(conn: &mut AsyncPgConnection, delivery: Delivery<'_>) -> Result<(), diesel::result::Error> {
    diesel::sql_query(
        "INSERT INTO notification_deliveries (event_id, topic, transfer_id, attempts, response_status) \
         VALUES ($1, $2, $3, $4, $5) ON CONFLICT (event_id) DO NOTHING",
    )
    .bind::<SqlUuid, _>(delivery.event_id)
    .bind::<Text, _>(delivery.topic)
    .bind::<SqlUuid, _>(delivery.transfer_id)
    .bind::<Integer, _>(i32::try_from(delivery.attempt).unwrap_or(i32::MAX))
    .bind::<Integer, _>(i32::from(delivery.response_status))
    .execute(conn)
    .await?;
    Ok(())
}
