//! DLT administration: the dead-letter topics of this configuration and the
//! `dead_letters` table (their durable fallback), listed, browsed and replayed.
//!
//! - `GET /admin/dlt` (open): record counts per DLT topic and partition, and of the table.
//! - `GET /admin/dlt/{topic}` and `GET /admin/dlt/dead_letters` (token): record contents.
//! - `POST /admin/dlt/{topic}/replay` and `POST /admin/dlt/dead_letters/replay` (token;
//!   the table's two are in `admin_dead_letters`):
//!   republish to the original topic and partition; `?dryRun=true` reports what would be
//!   republished and, per key, how many newer records of that key were already processed,
//!   and produces nothing.

use std::sync::Arc;
use std::time::Duration;

use actix_web::{web, HttpResponse};
use serde::Deserialize;
use serde_json::{json, Value};

use super::auth::Admin;
use super::dlt_replays;
use super::error::{ApiError, ErrorBody};
use super::AppState;
use crate::dlt::{self, table};

/// Bound of the Kafka calls of a DLT listing or read.
pub(super) const DLT_DEADLINE: Duration = Duration::from_secs(10);
/// Bound of the reads of a replay selection (and of a dry run's scans).
pub(super) const REPLAY_READ_DEADLINE: Duration = Duration::from_secs(30);
/// Delivery timeout of a replayed record.
pub(super) const REPLAY_SEND_TIMEOUT: Duration = Duration::from_secs(30);

/// Counts the records of every DLT topic (on a blocking thread) and publishes them as
/// `tally_dlt_topic_records`.
pub(super) async fn dlt_inventory(
    state: &web::Data<AppState>,
    budget: Duration,
) -> Result<Vec<dlt::TopicCount>, ApiError> {
    let (scope, probe) = (state.dlt.clone(), Arc::clone(&state.dlt_probe));
    let counts = web::block(move || dlt::inventory(&probe, &scope, dlt::Deadline::after(budget)))
        .await
        .map_err(|e| ApiError::Internal(format!("DLT inventory task failed: {e}")))??;
    dlt::publish(&counts, &state.metrics);
    Ok(counts)
}

/// `GET /admin/dlt`: every DLT topic of this configuration with its record count (high
/// minus low watermark, summed over partitions) and per-partition counts, and the
/// `dead_letters` table's rows (`deadLetters`: in all, not yet replayed, per topic).
#[utoipa::path(get, path = "/admin/dlt", tag = "admin", responses((status = 200, description = "`{records, topics, deadLetters}`", body = Object)))]
pub(super) async fn dlt_list(state: web::Data<AppState>) -> Result<HttpResponse, ApiError> {
    let topics = dlt_inventory(&state, DLT_DEADLINE).await?;
    let records: i64 = topics.iter().map(|t| t.records).sum();
    let mut conn = state.pool.get().await?;
    let dead_letters = table::summary(&mut conn).await?;
    Ok(HttpResponse::Ok().json(json!({ "records": records, "topics": topics, "deadLetters": dead_letters })))
}

/// The source topic of `topic`, or 404 when `topic` is not a DLT topic of this
/// configuration.
fn known_dlt(state: &AppState, topic: &str) -> Result<String, ApiError> {
    state
        .dlt
        .source_of(topic)
        .ok_or_else(|| ApiError::NotFound(format!("{topic} is not a DLT topic of this configuration")))
}

#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub(super) struct ReadQuery {
    #[param(minimum = 0)]
    partition: Option<i32>,
    #[param(minimum = 0)]
    offset: Option<i64>,
    #[param(minimum = 1, maximum = 1000)]
    limit: Option<usize>,
}

/// PostgreSQL's text cannot hold U+0000: a value with one selects nothing, so it is refused
/// before any query.
pub(super) fn no_nul(field: &str, value: Option<&str>) -> Result<(), ApiError> {
    if value.is_some_and(|v| v.contains('\0')) {
        return Err(ApiError::BadRequest(format!("{field} must not contain the NUL character (U+0000)")));
    }
    Ok(())
}

pub(super) fn check_limit(limit: Option<usize>) -> Result<usize, ApiError> {
    let limit = limit.unwrap_or(dlt::DEFAULT_LIMIT);
    if (1..=dlt::MAX_LIMIT).contains(&limit) {
        Ok(limit)
    } else {
        Err(ApiError::BadRequest(format!("The limit parameter must be between 1 and {}", dlt::MAX_LIMIT)))
    }
}

/// `GET /admin/dlt/{topic}?partition=&offset=&limit=` (admin token): the records of a DLT
/// topic, by partition then offset, from `offset` (default: the beginning) of `partition`
/// (default: every partition), at most `limit` (default 100, max 1000). Header values,
/// keys and payloads are UTF-8 text when they are, else base64 (`encoding`); payloads that
/// parse as JSON are JSON. `next` says where the following page starts (null: nothing
/// left as of this request).
#[utoipa::path(get, path = "/admin/dlt/{topic}", tag = "admin", params(("topic" = String, Path), ReadQuery),
    security(("admin" = [])),
    responses((status = 200, description = "`{topic, count, records, next}`", body = Object),
        (status = 404, description = "Not a DLT topic of this configuration.", body = ErrorBody)))]
pub(super) async fn dlt_read(
    _: Admin,
    state: web::Data<AppState>,
    topic: web::Path<String>,
    query: web::Query<ReadQuery>,
) -> Result<HttpResponse, ApiError> {
    let topic = topic.into_inner();
    known_dlt(&state, &topic)?;
    let q = query.into_inner();
    if q.partition.is_some_and(|p| p < 0) {
        return Err(ApiError::BadRequest("The partition parameter must be 0 or more".into()));
    }
    if q.offset.is_some_and(|o| o < 0) {
        return Err(ApiError::BadRequest("The offset parameter must be 0 or more".into()));
    }
    let limit = check_limit(q.limit)?;
    let selection =
        dlt::Selection { partition: q.partition, from_offset: q.offset, to_offset: None, limit: Some(limit) };
    let (scope, name) = (state.dlt.clone(), topic.clone());
    let page = web::block(move || {
        let deadline = dlt::Deadline::after(DLT_DEADLINE);
        let consumer = scope.reader()?;
        dlt::read(&consumer, &name, &selection, deadline)
    })
    .await
    .map_err(|e| ApiError::Internal(format!("DLT read task failed: {e}")))??;
    let positions: Vec<_> = page.records.iter().map(|r| (Some(r.partition), r.offset)).collect();
    let prior = dlt_replays::prior(&state, &topic, &positions).await;
    let records: Vec<Value> =
        page.records.iter().zip(&positions).map(|(r, at)| with_prior(r.view(), prior.as_ref(), *at)).collect();
    Ok(HttpResponse::Ok().json(json!({
        "topic": topic,
        "count": records.len(),
        "records": records,
        "replayLog": dlt_replays::log_state(prior.as_ref()),
        "next": page.next.map(|(partition, offset)| json!({ "partition": partition, "offset": offset })),
    })))
}

#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub(super) struct ReplayQuery {
    #[serde(rename = "dryRun")]
    pub(super) dry_run: Option<bool>,
}

/// Counts newer processed records of each origin's key (on a blocking thread).
pub(super) async fn dry_run(state: &web::Data<AppState>, origins: Vec<dlt::Origin>) -> Result<dlt::DryRun, ApiError> {
    let scope = state.dlt.clone();
    web::block(move || {
        let deadline = dlt::Deadline::after(REPLAY_READ_DEADLINE);
        let consumer = scope.reader()?;
        dlt::newer_processed(&consumer, &scope, &origins, deadline)
    })
    .await
    .map_err(|e| ApiError::Internal(format!("DLT dry-run task failed: {e}")))?
    .map_err(ApiError::from)
}

/// `view` with `replayedBefore` (see [`dlt_replays::replayed_before`]).
pub(super) fn with_prior(mut view: Value, prior: Option<&dlt_replays::PriorReplays>, at: (Option<i32>, i64)) -> Value {
    if let Some(obj) = view.as_object_mut() {
        obj.insert("replayedBefore".into(), dlt_replays::replayed_before(prior, at));
    }
    view
}

pub(super) fn dry_run_body(
    records: Vec<Value>,
    report: dlt::DryRun,
    prior: Option<&dlt_replays::PriorReplays>,
) -> Value {
    let already = records.iter().filter(|r| !r["replayedBefore"].is_null()).count();
    json!({
        "dryRun": true,
        "replayed": 0,
        "wouldReplay": records.len(),
        "alreadyReplayed": already,
        "replayLog": dlt_replays::log_state(prior),
        "records": records,
        "keys": report.keys,
        "scanTruncated": report.scan_truncated,
    })
}

pub(super) fn replay_producer(state: &AppState) -> Result<rdkafka::producer::FutureProducer, ApiError> {
    state
        .kafka
        .clients(&state.bootstrap)
        .producer("tally-dlt-replay", REPLAY_SEND_TIMEOUT)
        .create()
        .map_err(|e| ApiError::Internal(format!("cannot create the replay producer: {e}")))
}

/// `POST /admin/dlt/{topic}/replay[?dryRun=true]` (admin token): republishes the selected
/// records of a DLT topic to their original topic and partition, with the original key,
/// value and headers (every `dlt-*` header removed) plus `replayed-from:
/// <dlt>/<partition>/<offset>`, in offset order per partition, with an idempotent producer
/// (acks=all), and answers once every copy is acknowledged: `{replayed, records:
/// [{partition, offset, originalTopic, originalPartition, replayedOffset}], logged}`
/// (`logged`: whether the replay log took them; see `super::dlt_replays`).
///
/// The optional JSON body `{partition?, fromOffset?, toOffset?, key?}` (offsets inclusive)
/// narrows the selection; no body means every record present when the request started.
/// If any selected record lacks its origin headers, nothing is replayed (409).
///
/// `dryRun=true` produces nothing and answers `{dryRun, replayed: 0, wouldReplay, records:
/// [{partition, offset, originalTopic, originalPartition, originalOffset, key,
/// newerProcessedOfKey}], keys: [{originalTopic, originalPartition, key, records,
/// newerProcessed, consumerGroup, committedOffset}], scanTruncated}`: for each record, the
/// records of its key in its original partition after it that its consumer group already
/// processed (committed); a replayed copy is applied after them. Each record also says
/// `replayedBefore` (`{times, lastAt}` or null), and the answer `alreadyReplayed` and
/// `replayLog` (`ok`, or `unavailable` when the log could not be read).
///
/// Replaying does not delete the DLT records: Kafka cannot delete single records, so
/// they stay until retention removes them, and replaying them again republishes them
/// again. The consumers' inbox tables absorb such duplicates.
#[utoipa::path(post, path = "/admin/dlt/{topic}/replay", tag = "admin", params(("topic" = String, Path), ReplayQuery),
    request_body(content = Option<dlt::ReplayRequest>, description = "Optional: narrows the selection."),
    security(("admin" = [])),
    responses((status = 200, description = "`{replayed, records}`, or the dry run.", body = Object),
        (status = 404, description = "Not a DLT topic of this configuration.", body = ErrorBody),
        (status = 409, description = "A record lacks its origin: nothing replayed.", body = ErrorBody)))]
pub(super) async fn dlt_replay(
    admin: Admin,
    state: web::Data<AppState>,
    topic: web::Path<String>,
    query: web::Query<ReplayQuery>,
    body: web::Bytes,
) -> Result<HttpResponse, ApiError> {
    let topic = topic.into_inner();
    let source = known_dlt(&state, &topic)?;
    let request = dlt::ReplayRequest::parse(&body)?;
    let (scope, name) = (state.dlt.clone(), topic.clone());
    let planned = web::block(move || {
        let deadline = dlt::Deadline::after(REPLAY_READ_DEADLINE);
        let consumer = scope.reader()?;
        dlt::prepare_replay(&consumer, &name, &source, &request, deadline)
    })
    .await
    .map_err(|e| ApiError::Internal(format!("DLT replay read task failed: {e}")))??;
    if query.dry_run == Some(true) {
        let origins: Vec<dlt::Origin> = planned
            .iter()
            .map(|(record, out)| dlt::Origin {
                topic: out.topic.clone(),
                partition: out.partition,
                offset: record.header_str(tally_schema::headers::DLT_ORIGINAL_OFFSET).and_then(|o| o.parse().ok()),
                key: record.key.clone(),
                group: record.header_str(tally_schema::headers::DLT_CONSUMER_GROUP).map(str::to_owned),
            })
            .collect();
        let report = dry_run(&state, origins.clone()).await?;
        let positions: Vec<_> = planned.iter().map(|(r, _)| (Some(r.partition), r.offset)).collect();
        let prior = dlt_replays::prior(&state, &topic, &positions).await;
        let records = planned
            .iter()
            .zip(&origins)
            .zip(&report.newer_of_each)
            .map(|(((record, _), origin), newer)| {
                let view = json!({
                    "partition": record.partition,
                    "offset": record.offset,
                    "originalTopic": origin.topic,
                    "originalPartition": origin.partition,
                    "originalOffset": origin.offset,
                    "key": dlt::bytes_view(record.key.as_deref()).0,
                    "newerProcessedOfKey": newer,
                });
                with_prior(view, prior.as_ref(), (Some(record.partition), record.offset))
            })
            .collect();
        return Ok(HttpResponse::Ok().json(dry_run_body(records, report, prior.as_ref())));
    }
    let (done, failure) = dlt::replay_each(&replay_producer(&state)?, &planned).await;
    // Every acknowledged copy, also of a replay that failed part-way.
    let logged = dlt_replays::log(&state, dlt_replays::of_topic(&topic, &planned, &done)).await;
    state.metrics.dlt_replayed_total.with_label_values(&[&topic]).inc_by(done.len() as u64);
    if let Some(source) = failure {
        return Err(dlt::DltError::Produce { acked: done.len(), selected: planned.len(), source }.into());
    }
    admin.audit("replay", &format!("{} records of {topic}", done.len()));
    Ok(HttpResponse::Ok().json(json!({ "replayed": done.len(), "records": done, "logged": logged })))
}
