//! `dlt_replays`: the log of every replay of a dead letter, from a DLT topic or from the
//! `dead_letters` table. A DLT topic's records cannot be marked as replayed (Kafka records
//! are immutable), so a replay writes here once the broker acknowledged each copy, and a
//! dry run or a browse looks here to say which records were replayed before.
//!
//! A record is addressed by its `source` (the DLT topic, or `dead_letters`), its partition
//! in that topic (`None` for a table row) and its offset (the table row's id).

use chrono::{DateTime, Utc};
use diesel::sql_types::{Array, BigInt, Bytea, Integer, Nullable, Text, Timestamptz};
use diesel_async::{AsyncPgConnection, RunQueryDsl};

/// One acknowledged replay, before it is logged.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewReplay {
    pub source: String,
    pub source_partition: Option<i32>,
    pub source_offset: i64,
    pub original_topic: String,
    pub original_partition: i32,
    pub replayed_offset: i64,
    pub record_key: Option<Vec<u8>>,
}

/// Logs `replays` in one statement; returns the number of rows written.
///
/// # Errors
/// Any database error.
pub async fn record(conn: &mut AsyncPgConnection, replays: &[NewReplay]) -> Result<usize, diesel::result::Error> {
    if replays.is_empty() {
        return Ok(0);
    }
    let column = |f: fn(&NewReplay) -> String| replays.iter().map(f).collect::<Vec<_>>();
    diesel::sql_query(
        "INSERT INTO dlt_replays (source, source_partition, source_offset, original_topic, original_partition, \
         replayed_offset, record_key) \
         SELECT * FROM UNNEST($1::varchar[], $2::int[], $3::bigint[], $4::varchar[], $5::int[], $6::bigint[], $7::bytea[])",
    )
    .bind::<Array<Text>, _>(column(|r| r.source.clone()))
    .bind::<Array<Nullable<Integer>>, _>(replays.iter().map(|r| r.source_partition).collect::<Vec<_>>())
    .bind::<Array<BigInt>, _>(replays.iter().map(|r| r.source_offset).collect::<Vec<_>>())
    .bind::<Array<Text>, _>(column(|r| r.original_topic.clone()))
    .bind::<Array<Integer>, _>(replays.iter().map(|r| r.original_partition).collect::<Vec<_>>())
    .bind::<Array<BigInt>, _>(replays.iter().map(|r| r.replayed_offset).collect::<Vec<_>>())
    .bind::<Array<Nullable<Bytea>>, _>(replays.iter().map(|r| r.record_key.clone()).collect::<Vec<_>>())
    .execute(conn)
    .await
}

/// One logged replay.
#[derive(Debug, Clone, PartialEq, Eq, diesel::QueryableByName)]
pub struct Replay {
    #[diesel(sql_type = BigInt)]
    pub id: i64,
    #[diesel(sql_type = Text)]
    pub source: String,
    #[diesel(sql_type = Nullable<Integer>)]
    pub source_partition: Option<i32>,
    #[diesel(sql_type = BigInt)]
    pub source_offset: i64,
    #[diesel(sql_type = Text)]
    pub original_topic: String,
    #[diesel(sql_type = Integer)]
    pub original_partition: i32,
    #[diesel(sql_type = BigInt)]
    pub replayed_offset: i64,
    #[diesel(sql_type = Nullable<Bytea>)]
    pub record_key: Option<Vec<u8>>,
    #[diesel(sql_type = Timestamptz)]
    pub replayed_at: DateTime<Utc>,
}

/// The latest replays, newest first: of `source` when given, with an id below `before`
/// when given, at most `limit`.
///
/// # Errors
/// Any database error.
pub async fn recent(
    conn: &mut AsyncPgConnection,
    source: Option<&str>,
    before: Option<i64>,
    limit: i64,
) -> Result<Vec<Replay>, diesel::result::Error> {
    diesel::sql_query(
        "SELECT id, source, source_partition, source_offset, original_topic, original_partition, replayed_offset, \
         record_key, replayed_at FROM dlt_replays \
         WHERE ($1::varchar IS NULL OR source = $1) AND ($2::bigint IS NULL OR id < $2) \
         ORDER BY id DESC LIMIT $3",
    )
    .bind::<Nullable<Text>, _>(source)
    .bind::<Nullable<BigInt>, _>(before)
    .bind::<BigInt, _>(limit)
    .load(conn)
    .await
}

/// How often one record was replayed before, and when last.
#[derive(Debug, Clone, PartialEq, Eq, diesel::QueryableByName)]
pub struct Prior {
    #[diesel(sql_type = Nullable<Integer>)]
    pub source_partition: Option<i32>,
    #[diesel(sql_type = BigInt)]
    pub source_offset: i64,
    #[diesel(sql_type = BigInt)]
    pub times: i64,
    #[diesel(sql_type = Timestamptz)]
    pub last_at: DateTime<Utc>,
}

/// The earlier replays of the records of `source` at `positions` (partition, offset; the
/// partition `None` for table rows); records never replayed are left out.
///
/// # Errors
/// Any database error.
pub async fn prior(
    conn: &mut AsyncPgConnection,
    source: &str,
    positions: &[(Option<i32>, i64)],
) -> Result<Vec<Prior>, diesel::result::Error> {
    if positions.is_empty() {
        return Ok(vec![]);
    }
    diesel::sql_query(
        "SELECT r.source_partition, r.source_offset, count(*) AS times, max(r.replayed_at) AS last_at \
         FROM dlt_replays r JOIN (SELECT DISTINCT * FROM UNNEST($2::int[], $3::bigint[])) AS p(part, off) \
           ON r.source_partition IS NOT DISTINCT FROM p.part AND r.source_offset = p.off \
         WHERE r.source = $1 GROUP BY r.source_partition, r.source_offset",
    )
    .bind::<Text, _>(source)
    .bind::<Array<Nullable<Integer>>, _>(positions.iter().map(|(p, _)| *p).collect::<Vec<_>>())
    .bind::<Array<BigInt>, _>(positions.iter().map(|(_, o)| *o).collect::<Vec<_>>())
    .load(conn)
    .await
}
