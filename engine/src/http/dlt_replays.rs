//! The replay log (`dlt_replays`) in the admin API: every replay of a dead letter, from a
//! DLT topic or the `dead_letters` table, is logged once the broker acknowledged it, so
//! that a browse and a dry run can say which records were replayed before (a DLT topic's
//! records cannot be marked: they stay as they are until retention removes them).
//!
//! - `GET /admin/replays?source=&before=&limit=` (open: offsets and keys, no record
//!   contents): the log, newest first.
//! - the DLT handlers (`super::admin_dlt`) call [`prior`] and [`log`].
//!
//! Reading the log is best effort: with the database down, a browse or a dry run still
//! answers, saying that it could not tell (`replayLog: "unavailable"`).

use std::collections::HashMap;

use actix_web::{web, HttpResponse};
use serde::Deserialize;
use serde_json::{json, Value};
use tally_actors::dlt::table::{self, DeadLetter};
use tally_actors::dlt::{DltRecord, Replayed, Republish};
use tally_actors::store::dlt_replays::{self, NewReplay, Prior};

use super::error::{ApiError, ErrorBody};
use super::AppState;

/// Earlier replays by position (partition, offset) in their source.
pub(super) type PriorReplays = HashMap<(Option<i32>, i64), Prior>;

pub const DEFAULT_LIMIT: i64 = 50;
pub const MAX_LIMIT: i64 = 500;

#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub(super) struct LogQuery {
    source: Option<String>,
    before: Option<i64>,
    limit: Option<i64>,
}

/// `GET /admin/replays` (admin token: it shows record keys): `{replays: [{id, source, sourcePartition, sourceOffset,
/// originalTopic, originalPartition, replayedOffset, key, replayedAt}], next}`.
#[utoipa::path(get, path = "/admin/replays", tag = "admin", params(LogQuery), security(("admin" = [])),
    responses((status = 200, description = "`{replays, next}`, newest first.", body = Object),
        (status = 400, description = "A parameter is malformed.", body = ErrorBody)))]
pub(super) async fn list(
    _: super::auth::Admin,
    state: web::Data<AppState>,
    query: web::Query<LogQuery>,
) -> Result<HttpResponse, ApiError> {
    let q = query.into_inner();
    if q.source.as_deref().is_some_and(|s| s.contains('\0')) {
        return Err(ApiError::BadRequest(
            "The parameter source holds a NUL character, which no topic name has.".into(),
        ));
    }
    let limit = q.limit.unwrap_or(DEFAULT_LIMIT);
    if !(1..=MAX_LIMIT).contains(&limit) {
        return Err(ApiError::BadRequest(format!("The limit must be a whole number from 1 to {MAX_LIMIT}.")));
    }
    let mut conn = state.pool.get().await?;
    let rows = dlt_replays::recent(&mut conn, q.source.as_deref(), q.before, limit).await?;
    let next = if rows.len() as i64 == limit { rows.last().map(|r| r.id) } else { None };
    let replays: Vec<Value> = rows
        .iter()
        .map(|r| {
            json!({
                "id": r.id,
                "source": r.source,
                "sourcePartition": r.source_partition,
                "sourceOffset": r.source_offset,
                "originalTopic": r.original_topic,
                "originalPartition": r.original_partition,
                "replayedOffset": r.replayed_offset,
                "key": tally_actors::dlt::bytes_view(r.record_key.as_deref()).0,
                "replayedAt": r.replayed_at,
            })
        })
        .collect();
    Ok(HttpResponse::Ok().json(json!({ "replays": replays, "next": next })))
}

/// The earlier replays of the records of `source` at `positions`, by position; `None`
/// when the log cannot be read (the database is down).
pub(super) async fn prior(state: &AppState, source: &str, positions: &[(Option<i32>, i64)]) -> Option<PriorReplays> {
    let found = async {
        let mut conn = state.pool.get().await.map_err(|e| e.to_string())?;
        dlt_replays::prior(&mut conn, source, positions).await.map_err(|e| e.to_string())
    }
    .await;
    match found {
        Ok(rows) => Some(rows.into_iter().map(|p| ((p.source_partition, p.source_offset), p)).collect()),
        Err(e) => {
            tracing::warn!(source, error = %e, "Cannot read the replay log.");
            None
        }
    }
}

/// `{"times", "lastAt"}` of one record's earlier replays; `null` when never replayed (or
/// when the log could not be read: [`log_state`] says which).
pub(super) fn replayed_before(found: Option<&PriorReplays>, at: (Option<i32>, i64)) -> Value {
    match found.and_then(|f| f.get(&at)) {
        Some(p) => json!({ "times": p.times, "lastAt": p.last_at }),
        None => Value::Null,
    }
}

/// `"ok"` or `"unavailable"`: whether [`prior`] could read the log.
pub(super) fn log_state<T>(found: Option<&T>) -> &'static str {
    if found.is_some() {
        "ok"
    } else {
        "unavailable"
    }
}

/// Logs acknowledged replays; whether they were logged. A failure is logged and answered,
/// not raised: the records were replayed whatever the log says.
pub(super) async fn log(state: &AppState, replays: Vec<NewReplay>) -> bool {
    let written = async {
        let mut conn = state.pool.get().await.map_err(|e| e.to_string())?;
        dlt_replays::record(&mut conn, &replays).await.map_err(|e| e.to_string())
    }
    .await;
    match written {
        Ok(_) => true,
        Err(e) => {
            tracing::error!(replays = replays.len(), error = %e, "Replayed records could not be logged.");
            false
        }
    }
}

/// The log entries of records of DLT topic `topic` replayed as `done` (from `planned`).
pub(super) fn of_topic(topic: &str, planned: &[(DltRecord, Republish)], done: &[Replayed]) -> Vec<NewReplay> {
    let keys: HashMap<(i32, i64), Option<&Vec<u8>>> =
        planned.iter().map(|(r, _)| ((r.partition, r.offset), r.key.as_ref())).collect();
    done.iter()
        .map(|d| NewReplay {
            source: topic.to_owned(),
            source_partition: Some(d.partition),
            source_offset: d.offset,
            original_topic: d.original_topic.clone(),
            original_partition: d.original_partition,
            replayed_offset: d.replayed_offset,
            record_key: keys.get(&(d.partition, d.offset)).copied().flatten().cloned(),
        })
        .collect()
}

/// The log entry of `dead_letters` row `row`, replayed to `partition` at `offset`.
pub(super) fn of_row(row: &DeadLetter, partition: i32, offset: i64) -> NewReplay {
    NewReplay {
        source: table::NAME.to_owned(),
        source_partition: None,
        source_offset: row.id,
        original_topic: row.original_topic.clone(),
        original_partition: partition,
        replayed_offset: offset,
        record_key: row.record_key.clone(),
    }
}
