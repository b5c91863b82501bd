//! The `outbox_events` table: rows written in the same transaction as the state they
//! announce, claimed by shard for publishing, marked published after the broker
//! acknowledged them, and deleted after their retention.
//!
//! Per-key order with several publishers: the key space is split into [`SHARDS`] shards (a
//! stored column computed from the key). A publisher claims rows only from shards whose
//! transaction-scoped advisory lock it holds, so one key is published by one publisher at a
//! time, in `seq` order. Late commits are never skipped: there is no cursor, every claim
//! reads all rows still unpublished.
//!
//! Rows the broker refused for good are parked, and the later rows of their topic and key
//! held behind them: the statements for those are in [`super::outbox_parked`].

use std::time::Duration;

use diesel::prelude::*;
use diesel::sql_types::{Array, BigInt, Bool, Double, Integer, Nullable, Text};
use diesel_async::{AsyncPgConnection, RunQueryDsl, SimpleAsyncConnection};
use tally_schema::models::{NewOutboxEvent, PendingOutboxEvent};
use tally_schema::schema::outbox_events;
use uuid::Uuid;

use super::{unit, Sent};

diesel::define_sql_function! {
    /// PostgreSQL's `statement_timestamp()`: when the current statement began.
    fn statement_timestamp() -> diesel::sql_types::Timestamptz;
}

/// First key of the shard advisory locks ("tall"); the second key is the shard number.
const SHARD_LOCK_SPACE: i32 = 0x7461_6c6c;
/// Number of shards, as in the `outbox_events.shard` column definition.
pub const SHARDS: i32 = 64;

/// Writes one outbox row (inside the caller's transaction).
///
/// # Errors
/// Any database error.
pub async fn insert(conn: &mut AsyncPgConnection, row: &NewOutboxEvent) -> Result<(), diesel::result::Error> {
    diesel::insert_into(outbox_events::table).values(row).execute(conn).await?;
    Ok(())
}

/// Outbox rows as columns, for one set-based insert.
#[derive(Debug, Default)]
pub struct OutboxColumns {
    pub id: Vec<Uuid>,
    pub topic: Vec<String>,
    pub key: Vec<String>,
    pub event_type: Vec<String>,
    pub payload: Vec<String>,
    pub traceparent: Vec<Option<String>>,
}

/// Writes every row of `rows` in one statement (inside the caller's transaction).
///
/// # Errors
/// Any database error.
pub fn insert_columns<'a>(conn: &mut AsyncPgConnection, rows: &'a OutboxColumns) -> Sent<'a, ()> {
    let sent = (!rows.id.is_empty()).then(|| {
        diesel::sql_query(
            "INSERT INTO outbox_events (id, topic, key, event_type, payload, traceparent) \
             SELECT * FROM unnest($1::uuid[], $2::text[], $3::text[], $4::text[], $5::text[], $6::text[])",
        )
        .bind::<Array<diesel::sql_types::Uuid>, _>(&rows.id)
        .bind::<Array<Text>, _>(&rows.topic)
        .bind::<Array<Text>, _>(&rows.key)
        .bind::<Array<Text>, _>(&rows.event_type)
        .bind::<Array<Text>, _>(&rows.payload)
        .bind::<Array<Nullable<Text>>, _>(&rows.traceparent)
        .execute(conn)
    });
    unit(sent)
}

#[derive(QueryableByName)]
struct ShardRow {
    #[diesel(sql_type = Integer)]
    shard: i32,
}

/// How many free shards a claim locks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reach {
    /// At most half of them, in random order: several publishers share the key space
    /// instead of one taking all of it, and a lone publisher covers every shard over
    /// consecutive batches.
    Half,
    /// Every shard no other publisher holds: a publisher's claim when it wakes, and the
    /// sweep it makes before it sleeps, so that no committed row waits for the next poll.
    AllFree,
}

/// Locks free shards (transaction-scoped advisory locks) in random order, as many as
/// `reach` says. The Limit node stops pulling rows, so no further locks are taken. Call
/// inside a transaction.
///
/// # Errors
/// Any database error.
pub async fn lock_free_shards(conn: &mut AsyncPgConnection, reach: Reach) -> Result<Vec<i32>, diesel::result::Error> {
    Ok(diesel::sql_query(
        "SELECT shard FROM (SELECT shard FROM generate_series(0, $1 - 1) AS shard \
                            ORDER BY random()) AS s \
         WHERE pg_try_advisory_xact_lock($2, shard) LIMIT $3",
    )
    .bind::<Integer, _>(SHARDS)
    .bind::<Integer, _>(SHARD_LOCK_SPACE)
    .bind::<Integer, _>(if reach == Reach::Half { SHARDS / 2 } else { SHARDS })
    .load::<ShardRow>(conn)
    .await?
    .into_iter()
    .map(|r| r.shard)
    .collect())
}

/// A row a claim took: the event, how often the broker refused it already, whether it is a
/// parked row taken for its retry, whether it waits behind a parked row of its topic and
/// key (then the publisher holds it instead of producing it), and whether any row was
/// parked at all when it was claimed (if none, no parked row can be due either).
#[derive(Debug, Clone, PartialEq, Eq, QueryableByName)]
pub struct ClaimedOutboxEvent {
    #[diesel(embed)]
    pub event: PendingOutboxEvent,
    #[diesel(sql_type = Integer)]
    pub attempts: i32,
    #[diesel(sql_type = Bool)]
    pub parked: bool,
    #[diesel(sql_type = Bool)]
    pub behind_parked: bool,
    #[diesel(sql_type = Bool)]
    pub any_parked: bool,
}

/// Claims up to `limit` publishable rows of `shards` in `seq` order (`FOR UPDATE SKIP
/// LOCKED`): unpublished, neither parked nor held. Each says whether a parked row of its
/// topic and key exists (`behind_parked`); that probe runs only while some row is parked
/// at all (the uncorrelated sub-select is evaluated once, and `AND` stops at its `false`).
/// Call inside a transaction.
///
/// The claim walks the pending index in `seq` order, never a bitmap of it. Every published
/// row leaves a dead entry in that index until a vacuum; a plain index scan marks each one
/// dead as it passes (once no open transaction can see the row), so later claims step over
/// it without reading the row, whereas a bitmap scan reads every dead row again at every
/// claim. The planner picks the bitmap where its statistics are missing or stale (a table
/// never analyzed, a backlog just drained): after 100,000 rows were drained, 9 ms a claim
/// instead of 0.2, and commit-to-publish at 1,000/s several times slower until autovacuum
/// came by. The setting lasts to the end of the transaction, so `mark_published` runs under
/// it too (its `id = ANY(..)` takes the primary key's index either way). Parked and held
/// rows are outside that index, so however many wait behind a refused row, the walk does
/// not read them.
///
/// # Errors
/// Any database error.
pub async fn claim_pending(
    conn: &mut AsyncPgConnection,
    shards: &[i32],
    limit: i64,
) -> Result<Vec<ClaimedOutboxEvent>, diesel::result::Error> {
    conn.batch_execute("SET LOCAL enable_bitmapscan = off").await?;
    diesel::sql_query(
        "SELECT o.id, o.seq, o.topic, o.key, o.event_type, o.payload, o.traceparent, o.created_at, \
                o.attempts, false AS parked, \
                (SELECT EXISTS (SELECT 1 FROM outbox_events AS a \
                                WHERE a.published_at IS NULL AND a.parked_at IS NOT NULL)) \
                AND EXISTS (SELECT 1 FROM outbox_events AS p \
                            WHERE p.published_at IS NULL AND p.parked_at IS NOT NULL \
                              AND p.key = o.key AND p.topic = o.topic) AS behind_parked, \
                (SELECT EXISTS (SELECT 1 FROM outbox_events AS a \
                                WHERE a.published_at IS NULL AND a.parked_at IS NOT NULL)) AS any_parked \
         FROM outbox_events AS o \
         WHERE o.published_at IS NULL AND o.parked_at IS NULL AND NOT o.held AND o.shard = ANY($1) \
         ORDER BY o.seq LIMIT $2 FOR UPDATE OF o SKIP LOCKED",
    )
    .bind::<Array<Integer>, _>(shards)
    .bind::<BigInt, _>(limit)
    .load(conn)
    .await
}

/// Sets `published_at` on `ids` to the time of this statement, which the publisher runs
/// after the broker acknowledged every record: not `now()`, the claiming transaction's
/// start, which comes before the records were even sent.
///
/// # Errors
/// Any database error.
pub async fn mark_published(conn: &mut AsyncPgConnection, ids: &[Uuid]) -> Result<(), diesel::result::Error> {
    diesel::update(outbox_events::table.filter(outbox_events::id.eq_any(ids)))
        .set(outbox_events::published_at.eq(statement_timestamp().nullable()))
        .execute(conn)
        .await?;
    Ok(())
}

/// Deletes rows published longer than `retention` ago, in chunks of `chunk` rows; returns
/// the number deleted.
///
/// # Errors
/// Any database error.
pub async fn delete_published(conn: &mut AsyncPgConnection, retention: Duration) -> Result<u64, diesel::result::Error> {
    const CHUNK: i64 = 10_000;
    let mut total = 0_u64;
    loop {
        let n = diesel::sql_query(
            "DELETE FROM outbox_events WHERE id IN ( \
               SELECT id FROM outbox_events \
               WHERE published_at IS NOT NULL AND published_at < now() - make_interval(secs => $1) \
               LIMIT $2)",
        )
        .bind::<Double, _>(retention.as_secs_f64())
        .bind::<BigInt, _>(CHUNK)
        .execute(conn)
        .await?;
        total += n as u64;
        if (n as i64) < CHUNK {
            return Ok(total);
        }
    }
}

/// Unpublished rows of one topic: how many, the age of the oldest, and how many of them
/// are parked (refused by the broker) or held (waiting behind a parked row).
#[derive(Debug, Clone, PartialEq, QueryableByName, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PendingStats {
    #[diesel(sql_type = Text)]
    pub topic: String,
    #[diesel(sql_type = BigInt)]
    pub pending: i64,
    #[diesel(sql_type = Double)]
    pub oldest_age_seconds: f64,
    #[diesel(sql_type = BigInt)]
    pub parked: i64,
    #[diesel(sql_type = BigInt)]
    pub held: i64,
}

/// Unpublished rows per topic. The three kinds (publishable, parked, held) are counted
/// apart, each through its own partial index, as no index covers them all.
///
/// # Errors
/// Any database error.
pub async fn pending_by_topic(conn: &mut AsyncPgConnection) -> Result<Vec<PendingStats>, diesel::result::Error> {
    diesel::sql_query(
        "SELECT topic::text AS topic, count(*)::bigint AS pending, \
                COALESCE(extract(epoch FROM now() - min(created_at)), 0)::float8 AS oldest_age_seconds, \
                count(*) FILTER (WHERE kind = 'parked')::bigint AS parked, \
                count(*) FILTER (WHERE kind = 'held')::bigint AS held \
         FROM (SELECT topic, created_at, 'pending' AS kind FROM outbox_events \
               WHERE published_at IS NULL AND parked_at IS NULL AND NOT held \
               UNION ALL \
               SELECT topic, created_at, 'parked' FROM outbox_events \
               WHERE published_at IS NULL AND parked_at IS NOT NULL \
               UNION ALL \
               SELECT topic, created_at, 'held' FROM outbox_events \
               WHERE held AND published_at IS NULL AND parked_at IS NULL) AS unpublished \
         GROUP BY topic ORDER BY topic",
    )
    .load(conn)
    .await
}
