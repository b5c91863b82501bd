//! The `dead_letters` table's endpoints (records no DLT topic would take): browse
//! (`GET /admin/dlt/dead_letters`) and replay (`POST /admin/dlt/dead_letters/replay`), with
//! the checks and dry run of the DLT topics' endpoints (`admin_dlt`).

use actix_web::{web, HttpResponse};
use serde::Deserialize;
use serde_json::{json, Value};

use super::admin_dlt::*;
use super::auth::Admin;
use super::dlt_replays;
use super::error::{ApiError, ErrorBody};
use super::AppState;
use crate::dlt::{self, table};

#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
#[into_params(parameter_in = Query)]
pub(super) struct TableQuery {
    after: Option<i64>,
    #[param(minimum = 1, maximum = 1000)]
    limit: Option<usize>,
    original_topic: Option<String>,
}

/// `GET /admin/dlt/dead_letters?after=&limit=&originalTopic=` (admin token): rows of the
/// `dead_letters` table by id, after id `after` (default: from the first), at most `limit`
/// (default 100, max 1000), each viewed like a DLT topic record (its `partition` and
/// `offset` are the original ones) plus `id`, `dltError`, `createdAt`, `replayedAt`.
/// `next` is the `after` of the following page (null: nothing left).
#[utoipa::path(get, path = "/admin/dlt/dead_letters", tag = "admin", params(TableQuery), security(("admin" = [])),
    responses((status = 200, description = "`{table, count, records, next}`", body = Object)))]
pub(super) async fn dead_letters_read(
    _: Admin,
    state: web::Data<AppState>,
    query: web::Query<TableQuery>,
) -> Result<HttpResponse, ApiError> {
    let q = query.into_inner();
    let limit = check_limit(q.limit)?;
    no_nul("originalTopic", q.original_topic.as_deref())?;
    let mut conn = state.pool.get().await?;
    let rows = table::browse(&mut conn, q.after.unwrap_or(0), limit as i64, q.original_topic.as_deref()).await?;
    let next = if rows.len() == limit { rows.last().map(|r| r.id) } else { None };
    let records: Vec<Value> = rows.iter().map(table::DeadLetterView::view).collect();
    Ok(HttpResponse::Ok().json(json!({
        "table": table::NAME,
        "count": records.len(),
        "records": records,
        "next": next,
    })))
}

/// `POST /admin/dlt/dead_letters/replay[?dryRun=true]` (admin token): produces the selected
/// rows to their original topic and partition (original key, payload and headers, plus
/// `replayed-from: dead_letters/<id>`), marks each acknowledged row `replayed_at`, and
/// answers `{replayed, records: [{id, originalTopic, originalPartition, replayedOffset}]}`.
/// The optional body `{ids?, originalTopic?, key?, includeReplayed?}` narrows the
/// selection; by default every row not yet replayed. A row whose topic is not one of this
/// configuration's is refused (409) and nothing is replayed. `dryRun=true` answers like
/// the topics' dry run, each record with its `id`.
#[utoipa::path(post, path = "/admin/dlt/dead_letters/replay", tag = "admin", params(ReplayQuery),
    request_body(content = Option<dlt::table::TableReplayRequest>, description = "Optional: narrows the selection."),
    security(("admin" = [])),
    responses((status = 200, description = "`{replayed, records}`, or the dry run.", body = Object),
        (status = 409, description = "A row names a topic this configuration does not use.", body = ErrorBody)))]
pub(super) async fn dead_letters_replay(
    admin: Admin,
    state: web::Data<AppState>,
    query: web::Query<ReplayQuery>,
    body: web::Bytes,
) -> Result<HttpResponse, ApiError> {
    let request = table::TableReplayRequest::parse(&body)?;
    no_nul("originalTopic", request.original_topic.as_deref())?;
    no_nul("key", request.key.as_deref())?;
    let rows = {
        let mut conn = state.pool.get().await?;
        table::select(&mut conn, &request).await?
    };
    if let Some(row) = rows.iter().find(|r| !state.known_topics.contains(&r.original_topic)) {
        return Err(dlt::DltError::NotReplayable {
            partition: row.original_partition,
            offset: row.original_offset,
            reason: format!("row {} names topic {}, which this configuration does not use", row.id, row.original_topic),
        }
        .into());
    }
    if query.dry_run == Some(true) {
        let report = dry_run(&state, rows.iter().map(table::DeadLetterView::origin).collect()).await?;
        let positions: Vec<_> = rows.iter().map(|r| (None, r.id)).collect();
        let prior = dlt_replays::prior(&state, table::NAME, &positions).await;
        let records = rows
            .iter()
            .zip(&report.newer_of_each)
            .map(|(row, newer)| {
                let view = json!({
                    "id": row.id,
                    "originalTopic": row.original_topic,
                    "originalPartition": row.original_partition,
                    "originalOffset": row.original_offset,
                    "key": dlt::bytes_view(row.record_key.as_deref()).0,
                    "newerProcessedOfKey": newer,
                });
                with_prior(view, prior.as_ref(), (None, row.id))
            })
            .collect();
        return Ok(HttpResponse::Ok().json(dry_run_body(records, report, prior.as_ref())));
    }
    let outs: Vec<dlt::Republish> = rows.iter().map(table::DeadLetterView::republish).collect();
    let results = dlt::send_all(&replay_producer(&state)?, &outs.iter().collect::<Vec<_>>()).await;
    let mut done = Vec::new();
    let mut failure = None;
    for (row, result) in rows.iter().zip(results) {
        match result {
            Ok((partition, offset)) => done.push((row, partition, offset)),
            Err(e) => failure = failure.or(Some(e)),
        }
    }
    let ids: Vec<i64> = done.iter().map(|(row, _, _)| row.id).collect();
    dlt_replays::log(&state, done.iter().map(|(row, p, o)| dlt_replays::of_row(row, *p, *o)).collect()).await;
    if !ids.is_empty() {
        let mut conn = state.pool.get().await?;
        table::mark_replayed(&mut conn, &ids).await?;
    }
    state.metrics.dlt_replayed_total.with_label_values(&[table::NAME]).inc_by(ids.len() as u64);
    if let Some(source) = failure {
        return Err(dlt::DltError::Produce { acked: ids.len(), selected: rows.len(), source }.into());
    }
    admin.audit("replay", &format!("rows {ids:?} of the dead_letters table"));
    let records: Vec<Value> = done
        .iter()
        .map(|(row, partition, offset)| {
            json!({
                "id": row.id,
                "originalTopic": row.original_topic,
                "originalPartition": partition,
                "replayedOffset": offset,
            })
        })
        .collect();
    Ok(HttpResponse::Ok().json(json!({ "replayed": ids.len(), "records": records })))
}
