//! The `dead_letters` table, the durable fallback of the dead-letter topics. A record whose
//! DLT write can never succeed (too large once the `dlt-*` headers are added, a partition or
//! topic missing, forbidden) is stored here with the same metadata, so its offset can
//! complete instead of stopping its key and partition for good. `/admin/dlt` lists, browses
//! and replays these rows like the topics (`crate::dlt::table` holds that view).

use base64::Engine as _;
use chrono::{DateTime, Utc};
use diesel::sql_types::{Array, BigInt, Bool, Bytea, Integer, Jsonb, Nullable, Text, Timestamptz};
use diesel_async::{AsyncPgConnection, RunQueryDsl};
use serde::Serialize;
use serde_json::Value;

use crate::record::Record;

/// One row of `dead_letters`, before it is written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeadLetterRow<'a> {
    pub record: &'a Record,
    pub group: &'a str,
    /// `poison` or `exhausted`.
    pub kind: &'a str,
    pub message: &'a str,
    pub attempts: u32,
    /// Why the dead-letter topic refused the record.
    pub dlt_error: &'a str,
}

/// The record's headers as stored in `dead_letters.headers`: `[{"key", "value"}]` in
/// order, values base64 (or null), without the retry machinery's own headers.
#[must_use]
pub fn headers_json(record: &Record) -> serde_json::Value {
    let b64 = base64::engine::general_purpose::STANDARD;
    record
        .headers_without_retry()
        .map(|(k, v)| serde_json::json!({ "key": k, "value": v.as_deref().map(|v| b64.encode(v)) }))
        .collect()
}

/// Stores `row`; a row for the same record and group already there is kept (the record
/// was redelivered after it was stored). Returns whether a row was inserted.
///
/// # Errors
/// Any database error.
pub async fn store_dead_letter(
    conn: &mut AsyncPgConnection,
    row: &DeadLetterRow<'_>,
) -> Result<bool, diesel::result::Error> {
    let origin = row.record.origin();
    // PostgreSQL text cannot hold NUL characters; error messages may quote raw input.
    let text = |v: &str| v.replace('\0', "\u{FFFD}");
    let inserted = diesel::sql_query(
        "INSERT INTO dead_letters (original_topic, original_partition, original_offset, original_timestamp, \
         consumer_group, exception_kind, exception_message, attempts, record_key, payload, headers, dlt_error) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12) \
         ON CONFLICT (consumer_group, original_topic, original_partition, original_offset) DO NOTHING",
    )
    .bind::<Text, _>(&origin.topic)
    .bind::<Integer, _>(origin.partition)
    .bind::<BigInt, _>(origin.offset)
    .bind::<Nullable<BigInt>, _>(origin.timestamp)
    .bind::<Text, _>(row.group)
    .bind::<Text, _>(row.kind)
    .bind::<Text, _>(text(row.message))
    .bind::<Integer, _>(i32::try_from(row.attempts).unwrap_or(i32::MAX))
    .bind::<Nullable<Bytea>, _>(row.record.key.as_deref())
    .bind::<Nullable<Bytea>, _>(row.record.payload.as_deref())
    .bind::<Jsonb, _>(headers_json(row.record))
    .bind::<Text, _>(text(row.dlt_error))
    .execute(conn)
    .await?;
    Ok(inserted == 1)
}

/// One row of `dead_letters`.
#[derive(Debug, Clone, diesel::QueryableByName)]
pub struct DeadLetter {
    #[diesel(sql_type = BigInt)]
    pub id: i64,
    #[diesel(sql_type = Text)]
    pub original_topic: String,
    #[diesel(sql_type = Integer)]
    pub original_partition: i32,
    #[diesel(sql_type = BigInt)]
    pub original_offset: i64,
    #[diesel(sql_type = Nullable<BigInt>)]
    pub original_timestamp: Option<i64>,
    #[diesel(sql_type = Text)]
    pub consumer_group: String,
    #[diesel(sql_type = Text)]
    pub exception_kind: String,
    #[diesel(sql_type = Text)]
    pub exception_message: String,
    #[diesel(sql_type = Integer)]
    pub attempts: i32,
    #[diesel(sql_type = Nullable<Bytea>)]
    pub record_key: Option<Vec<u8>>,
    #[diesel(sql_type = Nullable<Bytea>)]
    pub payload: Option<Vec<u8>>,
    #[diesel(sql_type = Jsonb)]
    pub headers: Value,
    #[diesel(sql_type = Text)]
    pub dlt_error: String,
    #[diesel(sql_type = Timestamptz)]
    pub created_at: DateTime<Utc>,
    #[diesel(sql_type = Nullable<Timestamptz>)]
    pub replayed_at: Option<DateTime<Utc>>,
}

const COLUMNS: &str = "id, original_topic, original_partition, original_offset, original_timestamp, consumer_group, \
                       exception_kind, exception_message, attempts, record_key, payload, headers, dlt_error, \
                       created_at, replayed_at";

impl DeadLetter {
    /// The stored headers (`[{"key", "value": base64 | null}]`), decoded.
    #[must_use]
    pub fn original_headers(&self) -> Vec<(String, Option<Vec<u8>>)> {
        let b64 = base64::engine::general_purpose::STANDARD;
        self.headers
            .as_array()
            .map(|all| {
                all.iter()
                    .filter_map(|h| {
                        let key = h["key"].as_str()?.to_owned();
                        let value = h["value"].as_str().and_then(|v| b64.decode(v).ok());
                        Some((key, value))
                    })
                    .collect()
            })
            .unwrap_or_default()
    }
}

/// Row counts per original topic.
#[derive(Debug, Clone, Serialize, diesel::QueryableByName)]
#[serde(rename_all = "camelCase")]
pub struct TopicRows {
    #[diesel(sql_type = Text)]
    pub original_topic: String,
    #[diesel(sql_type = BigInt)]
    pub records: i64,
    #[diesel(sql_type = BigInt)]
    pub not_replayed: i64,
}

/// Row counts per original topic.
///
/// # Errors
/// Any database error.
pub async fn count_by_topic(conn: &mut AsyncPgConnection) -> Result<Vec<TopicRows>, diesel::result::Error> {
    diesel::sql_query(
        "SELECT original_topic, count(*) AS records, count(*) FILTER (WHERE replayed_at IS NULL) AS not_replayed \
         FROM dead_letters GROUP BY original_topic ORDER BY original_topic",
    )
    .load::<TopicRows>(conn)
    .await
}

/// Rows with an id above `after`, by id, at most `limit`, optionally of one original topic.
///
/// # Errors
/// Any database error.
pub async fn browse(
    conn: &mut AsyncPgConnection,
    after: i64,
    limit: i64,
    original_topic: Option<&str>,
) -> Result<Vec<DeadLetter>, diesel::result::Error> {
    diesel::sql_query(format!(
        "SELECT {COLUMNS} FROM dead_letters WHERE id > $1 AND ($2::text IS NULL OR original_topic = $2) \
         ORDER BY id LIMIT $3"
    ))
    .bind::<BigInt, _>(after)
    .bind::<Nullable<Text>, _>(original_topic)
    .bind::<BigInt, _>(limit)
    .load(conn)
    .await
}

/// Which rows a replay takes; every field optional.
#[derive(Debug, Clone, Copy, Default)]
pub struct RowFilter<'a> {
    pub ids: Option<&'a [i64]>,
    pub original_topic: Option<&'a str>,
    pub key: Option<&'a [u8]>,
    pub include_replayed: bool,
}

/// The rows `filter` selects, by id, at most `limit`.
///
/// # Errors
/// Any database error.
pub async fn select(
    conn: &mut AsyncPgConnection,
    filter: RowFilter<'_>,
    limit: i64,
) -> Result<Vec<DeadLetter>, diesel::result::Error> {
    diesel::sql_query(format!(
        "SELECT {COLUMNS} FROM dead_letters \
         WHERE ($1::bigint[] IS NULL OR id = ANY($1)) AND ($2::text IS NULL OR original_topic = $2) \
           AND ($3::bytea IS NULL OR record_key = $3) AND ($4 OR replayed_at IS NULL) \
         ORDER BY id LIMIT $5"
    ))
    .bind::<Nullable<Array<BigInt>>, _>(filter.ids)
    .bind::<Nullable<Text>, _>(filter.original_topic)
    .bind::<Nullable<Bytea>, _>(filter.key)
    .bind::<Bool, _>(filter.include_replayed)
    .bind::<BigInt, _>(limit)
    .load(conn)
    .await
}

/// The rows keyed `key` whose payload names `transfer_id` (a transfer's events are keyed
/// by its source account), replayed or not, by id.
///
/// # Errors
/// Any database error.
pub async fn of_transfer(
    conn: &mut AsyncPgConnection,
    key: &str,
    transfer_id: uuid::Uuid,
) -> Result<Vec<DeadLetter>, diesel::result::Error> {
    diesel::sql_query(format!(
        "SELECT {COLUMNS} FROM dead_letters \
         WHERE record_key = convert_to($1, 'UTF8') AND position(convert_to($2, 'UTF8') IN payload) > 0 \
         ORDER BY id"
    ))
    .bind::<Text, _>(key)
    .bind::<Text, _>(transfer_id.to_string())
    .load(conn)
    .await
}

/// Marks `ids` replayed now.
///
/// # Errors
/// Any database error.
pub async fn mark_replayed(conn: &mut AsyncPgConnection, ids: &[i64]) -> Result<usize, diesel::result::Error> {
    diesel::sql_query("UPDATE dead_letters SET replayed_at = now() WHERE id = ANY($1)")
        .bind::<Array<BigInt>, _>(ids)
        .execute(conn)
        .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headers_keep_order_and_encode_values() {
        let record = Record {
            topic: "t".into(),
            partition: 0,
            offset: 0,
            key: None,
            payload: None,
            headers: vec![
                ("event-id".into(), Some(b"abc".to_vec())),
                ("retry-attempts".into(), Some(b"2".to_vec())),
                ("empty".into(), None),
            ],
            timestamp: None,
            defect: None,
        };
        assert_eq!(
            headers_json(&record),
            serde_json::json!([{ "key": "event-id", "value": "YWJj" }, { "key": "empty", "value": null }])
        );
    }
}
