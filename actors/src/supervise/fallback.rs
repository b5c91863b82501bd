//! The durable fallback of the dead-letter topics: the `dead_letters` table. A record whose
//! DLT write can never succeed (too large once the `dlt-*` headers are added, a partition or
//! topic missing, forbidden) is stored here with the same metadata, so its offset can
//! complete instead of stopping its key and partition for good. `/admin/dlt` lists, browses
//! and replays these rows like the topics.

use base64::Engine as _;
use diesel::sql_types::{BigInt, Bytea, Integer, Jsonb, Nullable, Text};
use diesel_async::{AsyncPgConnection, RunQueryDsl};

use crate::consume::Record;

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
        };
        assert_eq!(
            headers_json(&record),
            serde_json::json!([{ "key": "event-id", "value": "YWJj" }, { "key": "empty", "value": null }])
        );
    }
}
