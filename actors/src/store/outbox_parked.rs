//! Parked and held rows of `outbox_events`. A row the broker refused for good is parked:
//! it stays unpublished with its refusal (`park_reason`, `park_error`), a count of
//! `attempts` and the time of its next one (`retry_at`). The later rows of its topic and
//! key are held (`held`) until it is published: the claim does not walk them again, and
//! per-key order holds. Every statement but [`parked_rows`] and [`retry_now`] runs inside
//! the publisher's transaction, under the shard's lock.

use std::time::Duration;

use chrono::{DateTime, Utc};
use diesel::prelude::*;
use diesel::sql_types::{Array, BigInt, Double, Integer, Nullable, Text, Timestamptz};
use diesel_async::{AsyncPgConnection, RunQueryDsl};
use uuid::Uuid;

use super::outbox::ClaimedOutboxEvent;

/// Claims up to `limit` parked rows of `shards` whose `retry_at` has come, in `seq` order
/// (`FOR UPDATE SKIP LOCKED`). Call inside a transaction, with the shards locked.
///
/// # Errors
/// Any database error.
pub async fn claim_due(
    conn: &mut AsyncPgConnection,
    shards: &[i32],
    limit: i64,
) -> Result<Vec<ClaimedOutboxEvent>, diesel::result::Error> {
    diesel::sql_query(
        "SELECT id, seq, topic, key, event_type, payload, traceparent, created_at, attempts, \
                true AS parked, false AS behind_parked, true AS any_parked \
         FROM outbox_events \
         WHERE published_at IS NULL AND parked_at IS NOT NULL AND retry_at <= now() AND shard = ANY($1) \
         ORDER BY seq LIMIT $2 FOR UPDATE SKIP LOCKED",
    )
    .bind::<Array<Integer>, _>(shards)
    .bind::<BigInt, _>(limit)
    .load(conn)
    .await
}

/// One refusal to record: the row, the refusal's code and text, and the wait before the
/// row is tried again.
#[derive(Debug, Clone, PartialEq)]
pub struct Park {
    pub id: Uuid,
    pub reason: &'static str,
    pub error: String,
    pub retry_after: Duration,
}

/// Parks `rows`, or records one more refusal of rows parked already: `attempts` + 1,
/// reason and error replaced, `retry_at` moved on; `parked_at` keeps the first refusal.
///
/// # Errors
/// Any database error.
pub async fn park(conn: &mut AsyncPgConnection, rows: &[Park]) -> Result<(), diesel::result::Error> {
    if rows.is_empty() {
        return Ok(());
    }
    let ids: Vec<Uuid> = rows.iter().map(|r| r.id).collect();
    let reasons: Vec<&str> = rows.iter().map(|r| r.reason).collect();
    let errors: Vec<&str> = rows.iter().map(|r| r.error.as_str()).collect();
    let waits: Vec<f64> = rows.iter().map(|r| r.retry_after.as_secs_f64()).collect();
    diesel::sql_query(
        "UPDATE outbox_events AS o \
         SET attempts = o.attempts + 1, parked_at = COALESCE(o.parked_at, statement_timestamp()), \
             park_reason = r.reason, park_error = r.error, \
             retry_at = statement_timestamp() + make_interval(secs => r.wait) \
         FROM unnest($1::uuid[], $2::text[], $3::text[], $4::float8[]) AS r(id, reason, error, wait) \
         WHERE o.id = r.id",
    )
    .bind::<Array<diesel::sql_types::Uuid>, _>(&ids)
    .bind::<Array<Text>, _>(&reasons)
    .bind::<Array<Text>, _>(&errors)
    .bind::<Array<Double>, _>(&waits)
    .execute(conn)
    .await?;
    Ok(())
}

/// Holds `ids`: they wait behind a parked row of their topic and key, outside the claim's
/// index.
///
/// # Errors
/// Any database error.
pub async fn hold(conn: &mut AsyncPgConnection, ids: &[Uuid]) -> Result<(), diesel::result::Error> {
    if ids.is_empty() {
        return Ok(());
    }
    diesel::sql_query("UPDATE outbox_events SET held = true WHERE id = ANY($1)")
        .bind::<Array<diesel::sql_types::Uuid>, _>(ids)
        .execute(conn)
        .await?;
    Ok(())
}

/// Releases the held rows of each `(topic, key)`, whose parked row was just published:
/// back in the claim's index, they are claimed next, in `seq` order.
///
/// # Errors
/// Any database error.
pub async fn release(
    conn: &mut AsyncPgConnection,
    topic_keys: &[(String, String)],
) -> Result<usize, diesel::result::Error> {
    if topic_keys.is_empty() {
        return Ok(0);
    }
    let (topics, keys): (Vec<&str>, Vec<&str>) = topic_keys.iter().map(|(t, k)| (t.as_str(), k.as_str())).unzip();
    diesel::sql_query(
        "UPDATE outbox_events AS o SET held = false \
         FROM unnest($1::text[], $2::text[]) AS r(topic, key) \
         WHERE o.held AND o.key = r.key AND o.topic = r.topic",
    )
    .bind::<Array<Text>, _>(&topics)
    .bind::<Array<Text>, _>(&keys)
    .execute(conn)
    .await
}

/// Releases held rows whose topic and key have no parked row left (its row was deleted or
/// marked by hand); returns how many. Releasing is always safe: a claim holds again any
/// row it finds behind a parked one.
///
/// # Errors
/// Any database error.
pub async fn release_orphans(conn: &mut AsyncPgConnection) -> Result<usize, diesel::result::Error> {
    diesel::sql_query(
        "UPDATE outbox_events AS h SET held = false \
         WHERE h.held AND NOT EXISTS (SELECT 1 FROM outbox_events AS p \
                                      WHERE p.published_at IS NULL AND p.parked_at IS NOT NULL \
                                        AND p.key = h.key AND p.topic = h.topic)",
    )
    .execute(conn)
    .await
}

/// A parked row as the admin API shows it (no payload).
#[derive(Debug, Clone, PartialEq, QueryableByName, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ParkedRow {
    #[diesel(sql_type = diesel::sql_types::Uuid)]
    pub id: Uuid,
    #[diesel(sql_type = Text)]
    pub topic: String,
    #[diesel(sql_type = Text)]
    pub key: String,
    #[diesel(sql_type = Text)]
    pub reason: String,
    #[diesel(sql_type = Text)]
    pub error: String,
    /// When the broker first refused it.
    #[diesel(sql_type = Timestamptz)]
    pub since: DateTime<Utc>,
    #[diesel(sql_type = Integer)]
    pub attempts: i32,
    #[diesel(sql_type = Timestamptz)]
    pub next_attempt_at: DateTime<Utc>,
    /// Rows of its topic and key waiting behind it.
    #[diesel(sql_type = BigInt)]
    pub held: i64,
}

/// The first `limit` parked rows, oldest refusal first.
///
/// # Errors
/// Any database error.
pub async fn parked_rows(conn: &mut AsyncPgConnection, limit: i64) -> Result<Vec<ParkedRow>, diesel::result::Error> {
    diesel::sql_query(
        "SELECT p.id, p.topic::text AS topic, p.key::text AS key, COALESCE(p.park_reason, '')::text AS reason, \
                COALESCE(p.park_error, '') AS error, p.parked_at AS since, p.attempts, \
                COALESCE(p.retry_at, p.parked_at) AS next_attempt_at, \
                (SELECT count(*) FROM outbox_events AS h \
                 WHERE h.held AND h.key = p.key AND h.topic = p.topic) AS held \
         FROM outbox_events AS p \
         WHERE p.published_at IS NULL AND p.parked_at IS NOT NULL \
         ORDER BY p.parked_at, p.seq LIMIT $1",
    )
    .bind::<BigInt, _>(limit)
    .load(conn)
    .await
}

#[derive(QueryableByName)]
struct Id {
    #[diesel(sql_type = diesel::sql_types::Uuid)]
    id: Uuid,
}

/// Makes parked rows due now (`id`, or every parked row when `None`) and notifies the
/// publishers (`channel`, delivered at commit); returns the ids made due.
///
/// # Errors
/// Any database error.
pub async fn retry_now(
    conn: &mut AsyncPgConnection,
    id: Option<Uuid>,
    channel: &str,
) -> Result<Vec<Uuid>, diesel::result::Error> {
    let ids: Vec<Uuid> = diesel::sql_query(
        "WITH due AS (UPDATE outbox_events SET retry_at = statement_timestamp() \
                      WHERE published_at IS NULL AND parked_at IS NOT NULL AND ($1::uuid IS NULL OR id = $1) \
                      RETURNING id) \
         SELECT id FROM due ORDER BY id",
    )
    .bind::<Nullable<diesel::sql_types::Uuid>, _>(id)
    .load::<Id>(conn)
    .await?
    .into_iter()
    .map(|r| r.id)
    .collect();
    if !ids.is_empty() {
        diesel::sql_query("SELECT pg_notify($1, '')").bind::<Text, _>(channel).execute(conn).await?;
    }
    Ok(ids)
}
