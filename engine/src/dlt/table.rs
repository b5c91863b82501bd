//! The `dead_letters` table: the durable fallback of the DLT topics (records whose DLT
//! write could never succeed). Listed, browsed and replayed by `/admin/dlt` like the
//! topics, under the name `dead_letters` (`/admin/dlt/dead_letters`,
//! `/admin/dlt/dead_letters/replay`), which no `-dlt` topic can have. Rows are addressed
//! by their `id`. A replay produces each row to its original topic and partition with
//! `replayed-from: dead_letters/<id>` and sets `replayed_at` once the broker acknowledged
//! it; rows already replayed are left out unless asked for.

use base64::Engine as _;
use chrono::{DateTime, Utc};
use diesel::sql_types::{Array, BigInt, Bool, Bytea, Integer, Jsonb, Nullable, Text, Timestamptz};
use diesel_async::{AsyncPgConnection, RunQueryDsl};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use tally_schema::headers;

use super::{DltError, DltRecord, Origin, Republish, MAX_REPLAY};

/// The name of the table in `/admin/dlt` paths and `replayed-from` headers.
pub const NAME: &str = "dead_letters";

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

    /// The row as a DLT record would carry it: original headers plus the `dlt-*` ones.
    fn as_record(&self) -> DltRecord {
        let mut hdrs = self.original_headers();
        let text = |k: &str, v: String| (k.to_owned(), Some(v.into_bytes()));
        hdrs.push(text(headers::DLT_ORIGINAL_TOPIC, self.original_topic.clone()));
        hdrs.push(text(headers::DLT_ORIGINAL_PARTITION, self.original_partition.to_string()));
        hdrs.push(text(headers::DLT_ORIGINAL_OFFSET, self.original_offset.to_string()));
        if let Some(ts) = self.original_timestamp {
            hdrs.push(text(headers::DLT_ORIGINAL_TIMESTAMP, ts.to_string()));
        }
        hdrs.push(text(headers::DLT_CONSUMER_GROUP, self.consumer_group.clone()));
        hdrs.push(text(headers::DLT_EXCEPTION_KIND, self.exception_kind.clone()));
        hdrs.push(text(headers::DLT_EXCEPTION_MESSAGE, self.exception_message.clone()));
        hdrs.push(text(headers::DLT_ATTEMPTS, self.attempts.to_string()));
        DltRecord {
            partition: self.original_partition,
            offset: self.original_offset,
            timestamp: self.original_timestamp,
            key: self.record_key.clone(),
            payload: self.payload.clone(),
            headers: hdrs,
        }
    }

    /// The JSON view of `GET /admin/dlt/dead_letters`: the view of a DLT topic record
    /// (its `partition`/`offset` are the original ones) plus `id`, `dltError`,
    /// `createdAt` and `replayedAt`.
    #[must_use]
    pub fn view(&self) -> Value {
        let mut v = self.as_record().view();
        if let Some(obj) = v.as_object_mut() {
            obj.insert("id".into(), json!(self.id));
            obj.insert("dltError".into(), json!(self.dlt_error));
            obj.insert("createdAt".into(), json!(self.created_at));
            obj.insert("replayedAt".into(), json!(self.replayed_at));
        }
        v
    }

    /// What a replay produces: the original topic, partition, key, payload and headers
    /// (any earlier `replayed-from` removed) plus `replayed-from: dead_letters/<id>`.
    #[must_use]
    pub fn republish(&self) -> Republish {
        let mut hdrs: Vec<(String, Option<Vec<u8>>)> =
            self.original_headers().into_iter().filter(|(k, _)| k != headers::REPLAYED_FROM).collect();
        hdrs.push((headers::REPLAYED_FROM.to_owned(), Some(format!("{NAME}/{}", self.id).into_bytes())));
        Republish {
            topic: self.original_topic.clone(),
            partition: self.original_partition,
            key: self.record_key.clone(),
            payload: self.payload.clone(),
            headers: hdrs,
        }
    }

    #[must_use]
    pub fn origin(&self) -> Origin {
        Origin {
            topic: self.original_topic.clone(),
            partition: self.original_partition,
            offset: Some(self.original_offset),
            key: self.record_key.clone(),
            group: Some(self.consumer_group.clone()),
        }
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

/// The `deadLetters` entry of `GET /admin/dlt`.
///
/// # Errors
/// Any database error.
pub async fn summary(conn: &mut AsyncPgConnection) -> Result<Value, diesel::result::Error> {
    let by_topic = diesel::sql_query(
        "SELECT original_topic, count(*) AS records, count(*) FILTER (WHERE replayed_at IS NULL) AS not_replayed \
         FROM dead_letters GROUP BY original_topic ORDER BY original_topic",
    )
    .load::<TopicRows>(conn)
    .await?;
    let records: i64 = by_topic.iter().map(|t| t.records).sum();
    let not_replayed: i64 = by_topic.iter().map(|t| t.not_replayed).sum();
    Ok(json!({ "table": NAME, "records": records, "notReplayed": not_replayed, "byTopic": by_topic }))
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

/// The body of `POST /admin/dlt/dead_letters/replay`; every field optional.
#[derive(Debug, Clone, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct TableReplayRequest {
    /// Only these rows.
    pub ids: Option<Vec<i64>>,
    /// Only rows of this original topic.
    pub original_topic: Option<String>,
    /// Only rows whose key is exactly this (UTF-8) string.
    pub key: Option<String>,
    /// Rows already replayed too (default: only rows never replayed).
    #[serde(default)]
    pub include_replayed: bool,
}

impl TableReplayRequest {
    /// Parses an optional JSON body: empty (or blank) means "every row not yet replayed".
    ///
    /// # Errors
    /// [`DltError::BadSelection`] for invalid JSON or unknown fields.
    pub fn parse(body: &[u8]) -> Result<Self, DltError> {
        if body.iter().all(u8::is_ascii_whitespace) {
            return Ok(Self::default());
        }
        serde_json::from_slice(body).map_err(|e| DltError::BadSelection(format!("invalid replay body: {e}")))
    }
}

/// The rows `request` selects, by id.
///
/// # Errors
/// [`DltError::BadSelection`] when more than [`MAX_REPLAY`] rows match; database errors
/// as [`DltError::Database`].
pub async fn select(conn: &mut AsyncPgConnection, request: &TableReplayRequest) -> Result<Vec<DeadLetter>, DltError> {
    let rows: Vec<DeadLetter> = diesel::sql_query(format!(
        "SELECT {COLUMNS} FROM dead_letters \
         WHERE ($1::bigint[] IS NULL OR id = ANY($1)) AND ($2::text IS NULL OR original_topic = $2) \
           AND ($3::bytea IS NULL OR record_key = $3) AND ($4 OR replayed_at IS NULL) \
         ORDER BY id LIMIT $5"
    ))
    .bind::<Nullable<Array<BigInt>>, _>(request.ids.as_deref())
    .bind::<Nullable<Text>, _>(request.original_topic.as_deref())
    .bind::<Nullable<Bytea>, _>(request.key.as_deref().map(str::as_bytes))
    .bind::<Bool, _>(request.include_replayed)
    .bind::<BigInt, _>(MAX_REPLAY + 1)
    .load(conn)
    .await
    .map_err(|e| DltError::Database(e.to_string()))?;
    if rows.len() as i64 > MAX_REPLAY {
        return Err(DltError::BadSelection(format!(
            "the selection covers more than {MAX_REPLAY} rows: narrow it with ids, originalTopic or key"
        )));
    }
    Ok(rows)
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

    fn row() -> DeadLetter {
        DeadLetter {
            id: 7,
            original_topic: "transfers.analyzed".into(),
            original_partition: 3,
            original_offset: 41,
            original_timestamp: Some(1_700_000_000_000),
            consumer_group: "tally-ledger".into(),
            exception_kind: "poison".into(),
            exception_message: "undecodable".into(),
            attempts: 1,
            record_key: Some(b"K".to_vec()),
            payload: Some(b"{}".to_vec()),
            headers: json!([{"key": "event-type", "value": "WA=="}, {"key": "replayed-from", "value": "eA=="},
                            {"key": "empty", "value": null}]),
            dlt_error: "Message size too large".into(),
            created_at: Utc::now(),
            replayed_at: None,
        }
    }

    #[test]
    fn a_row_replays_to_its_origin_marked_with_its_id() {
        let out = row().republish();
        assert_eq!((out.topic.as_str(), out.partition), ("transfers.analyzed", 3));
        assert_eq!(
            out.headers,
            [
                ("event-type".to_owned(), Some(b"X".to_vec())),
                ("empty".to_owned(), None),
                ("replayed-from".to_owned(), Some(b"dead_letters/7".to_vec()))
            ]
        );
    }

    #[test]
    fn a_row_views_like_a_dlt_record() {
        let v = row().view();
        assert_eq!(v["id"], 7);
        assert_eq!(v["dlt"]["originalOffset"], 41);
        assert_eq!(v["dlt"]["consumerGroup"], "tally-ledger");
        assert_eq!(v["headers"][0], json!({"key": "event-type", "value": "X", "encoding": "utf8"}));
        assert_eq!(v["dltError"], "Message size too large");
        assert_eq!(v["replayedAt"], Value::Null);
    }
}
