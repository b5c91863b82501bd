//! The `dead_letters` table: the durable fallback of the DLT topics (records whose DLT
//! write could never succeed). Listed, browsed and replayed by `/admin/dlt` like the
//! topics, under the name `dead_letters` (`/admin/dlt/dead_letters`,
//! `/admin/dlt/dead_letters/replay`), which no `-dlt` topic can have. Rows are addressed
//! by their `id`. A replay produces each row to its original topic and partition with
//! `replayed-from: dead_letters/<id>` and sets `replayed_at` once the broker acknowledged
//! it; rows already replayed are left out unless asked for.

use diesel_async::AsyncPgConnection;
use serde::Deserialize;
use serde_json::{json, Value};
use tally_schema::headers;

use crate::store::dead_letters;
pub use crate::store::dead_letters::{browse, mark_replayed, DeadLetter, TopicRows};

use super::{DltError, DltRecord, Origin, Republish, MAX_REPLAY};

/// The name of the table in `/admin/dlt` paths and `replayed-from` headers.
pub const NAME: &str = "dead_letters";

/// What the admin API makes of a stored row.
pub trait DeadLetterView {
    /// The JSON view of `GET /admin/dlt/dead_letters`: the view of a DLT topic record
    /// (its `partition`/`offset` are the original ones) plus `id`, `dltError`,
    /// `createdAt` and `replayedAt`.
    fn view(&self) -> Value;
    /// What a replay produces: the original topic, partition, key, payload and headers
    /// (any earlier `replayed-from` removed) plus `replayed-from: dead_letters/<id>`.
    fn republish(&self) -> Republish;
    /// Where the record came from.
    fn origin(&self) -> Origin;
}

impl DeadLetterView for DeadLetter {
    fn view(&self) -> Value {
        let mut v = as_record(self).view();
        if let Some(obj) = v.as_object_mut() {
            obj.insert("id".into(), json!(self.id));
            obj.insert("dltError".into(), json!(self.dlt_error));
            obj.insert("createdAt".into(), json!(self.created_at));
            obj.insert("replayedAt".into(), json!(self.replayed_at));
        }
        v
    }

    fn republish(&self) -> Republish {
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

    fn origin(&self) -> Origin {
        Origin {
            topic: self.original_topic.clone(),
            partition: self.original_partition,
            offset: Some(self.original_offset),
            key: self.record_key.clone(),
            group: Some(self.consumer_group.clone()),
        }
    }
}

/// The row as a DLT record would carry it: original headers plus the `dlt-*` ones.
fn as_record(row: &DeadLetter) -> DltRecord {
    let mut hdrs = row.original_headers();
    let text = |k: &str, v: String| (k.to_owned(), Some(v.into_bytes()));
    hdrs.push(text(headers::DLT_ORIGINAL_TOPIC, row.original_topic.clone()));
    hdrs.push(text(headers::DLT_ORIGINAL_PARTITION, row.original_partition.to_string()));
    hdrs.push(text(headers::DLT_ORIGINAL_OFFSET, row.original_offset.to_string()));
    if let Some(ts) = row.original_timestamp {
        hdrs.push(text(headers::DLT_ORIGINAL_TIMESTAMP, ts.to_string()));
    }
    hdrs.push(text(headers::DLT_CONSUMER_GROUP, row.consumer_group.clone()));
    hdrs.push(text(headers::DLT_EXCEPTION_KIND, row.exception_kind.clone()));
    hdrs.push(text(headers::DLT_EXCEPTION_MESSAGE, row.exception_message.clone()));
    hdrs.push(text(headers::DLT_ATTEMPTS, row.attempts.to_string()));
    DltRecord {
        partition: row.original_partition,
        offset: row.original_offset,
        timestamp: row.original_timestamp,
        key: row.record_key.clone(),
        payload: row.payload.clone(),
        headers: hdrs,
    }
}

/// The `deadLetters` entry of `GET /admin/dlt`.
///
/// # Errors
/// Any database error.
pub async fn summary(conn: &mut AsyncPgConnection) -> Result<Value, diesel::result::Error> {
    let by_topic = dead_letters::count_by_topic(conn).await?;
    let records: i64 = by_topic.iter().map(|t| t.records).sum();
    let not_replayed: i64 = by_topic.iter().map(|t| t.not_replayed).sum();
    Ok(json!({ "table": NAME, "records": records, "notReplayed": not_replayed, "byTopic": by_topic }))
}

/// The body of `POST /admin/dlt/dead_letters/replay`; every field optional.
#[derive(Debug, Clone, Default, Deserialize, PartialEq, Eq, utoipa::ToSchema)]
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
    let filter = dead_letters::RowFilter {
        ids: request.ids.as_deref(),
        original_topic: request.original_topic.as_deref(),
        key: request.key.as_deref().map(str::as_bytes),
        include_replayed: request.include_replayed,
    };
    let rows =
        dead_letters::select(conn, filter, MAX_REPLAY + 1).await.map_err(|e| DltError::Database(e.to_string()))?;
    if rows.len() as i64 > MAX_REPLAY {
        return Err(DltError::BadSelection(format!(
            "the selection covers more than {MAX_REPLAY} rows: narrow it with ids, originalTopic or key"
        )));
    }
    Ok(rows)
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::Utc;

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
