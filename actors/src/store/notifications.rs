//! The `notification_deliveries` table: one row per event delivered to the webhook, so a
//! redelivered or retried event is not sent twice once it got through.

use std::collections::HashSet;

use diesel::sql_types::{Array, Integer, Text, Uuid as SqlUuid};
use diesel::QueryableByName;
use diesel_async::{AsyncPgConnection, RunQueryDsl};
use uuid::Uuid;

#[derive(QueryableByName)]
struct Seen {
    #[diesel(sql_type = SqlUuid)]
    event_id: Uuid,
}

/// Whether each event of `event_ids` was delivered already, in order.
///
/// # Errors
/// Any database error.
pub async fn delivered(conn: &mut AsyncPgConnection, event_ids: &[Uuid]) -> Result<Vec<bool>, diesel::result::Error> {
    let found: HashSet<Uuid> =
        diesel::sql_query("SELECT event_id FROM notification_deliveries WHERE event_id = ANY($1)")
            .bind::<Array<SqlUuid>, _>(event_ids)
            .load::<Seen>(conn)
            .await?
            .into_iter()
            .map(|s| s.event_id)
            .collect();
    Ok(event_ids.iter().map(|id| found.contains(id)).collect())
}

/// One delivery that got through.
#[derive(Debug, Clone)]
pub struct Delivery {
    pub event_id: Uuid,
    pub topic: String,
    pub transfer_id: Uuid,
    pub attempt: u32,
    pub response_status: u16,
}

/// Records every delivery of `deliveries` in one statement; a row already there for an
/// event is kept, and so is the first of two deliveries of one event.
///
/// # Errors
/// Any database error; then none is recorded.
pub async fn remember(conn: &mut AsyncPgConnection, deliveries: &[Delivery]) -> Result<(), diesel::result::Error> {
    let mut seen = HashSet::new();
    let mut first: Vec<&Delivery> = deliveries.iter().filter(|d| seen.insert(d.event_id)).collect();
    // In event id order: two statements that share events lock them in one order.
    first.sort_by_key(|d| d.event_id);
    let event_ids: Vec<Uuid> = first.iter().map(|d| d.event_id).collect();
    let topics: Vec<&str> = first.iter().map(|d| d.topic.as_str()).collect();
    let transfer_ids: Vec<Uuid> = first.iter().map(|d| d.transfer_id).collect();
    let attempts: Vec<i32> = first.iter().map(|d| i32::try_from(d.attempt).unwrap_or(i32::MAX)).collect();
    let statuses: Vec<i32> = first.iter().map(|d| i32::from(d.response_status)).collect();
    diesel::sql_query(
        "INSERT INTO notification_deliveries (event_id, topic, transfer_id, attempts, response_status) \
         SELECT * FROM unnest($1::uuid[], $2::text[], $3::uuid[], $4::int[], $5::int[]) \
         ON CONFLICT (event_id) DO NOTHING",
    )
    .bind::<Array<SqlUuid>, _>(&event_ids)
    .bind::<Array<Text>, _>(&topics)
    .bind::<Array<SqlUuid>, _>(&transfer_ids)
    .bind::<Array<Integer>, _>(&attempts)
    .bind::<Array<Integer>, _>(&statuses)
    .execute(conn)
    .await?;
    Ok(())
}
