//! Admin endpoints: health, readiness, Prometheus metrics, outbox backlog, ledger check,
//! and DLT administration (listing, browsing, replay).

use std::time::Duration;

use actix_web::{web, HttpResponse};
use diesel::sql_types::Text;
use diesel_async::RunQueryDsl;
use rdkafka::producer::Producer;
use serde::Deserialize;
use serde_json::json;
use tally_actors::outbox;

use super::auth::Admin;
use super::error::ApiError;
use super::AppState;
use crate::dlt;

/// Bound of the Kafka calls of a DLT listing or read.
const DLT_DEADLINE: Duration = Duration::from_secs(10);
/// Bound of the DLT gauge refresh inside `/metrics`, which must stay fast.
const DLT_METRICS_DEADLINE: Duration = Duration::from_millis(1_500);
/// Bound of the read of a replay selection.
const REPLAY_READ_DEADLINE: Duration = Duration::from_secs(30);
/// Delivery timeout of a replayed record.
const REPLAY_SEND_TIMEOUT_MS: u64 = 30_000;

pub fn routes(cfg: &mut web::ServiceConfig) {
    cfg.route("/healthz", web::get().to(healthz))
        .route("/readyz", web::get().to(readyz))
        .route("/metrics", web::get().to(metrics))
        .route("/admin/outbox", web::get().to(outbox_backlog))
        .route("/admin/ledger/check", web::get().to(ledger_check))
        .route("/admin/pipelines", web::get().to(pipelines))
        .route("/admin/pipelines/{name}/pause", web::post().to(pause))
        .route("/admin/pipelines/{name}/resume", web::post().to(resume))
        .route("/admin/dlt", web::get().to(dlt_list))
        .route("/admin/dlt/{topic}", web::get().to(dlt_read))
        .route("/admin/dlt/{topic}/replay", web::post().to(dlt_replay));
}

/// Liveness: the process serves HTTP.
async fn healthz() -> HttpResponse {
    HttpResponse::Ok().json(json!({ "status": "ok" }))
}

#[derive(diesel::QueryableByName)]
struct VersionRow {
    #[diesel(sql_type = Text)]
    version: String,
}

/// Readiness: the database answers, every embedded migration is applied, Kafka metadata
/// can be fetched, and no pipeline is degraded (waiting for an unavailable dependency).
/// 503 with the reasons otherwise.
async fn readyz(state: web::Data<AppState>) -> HttpResponse {
    let mut problems = Vec::new();
    match state.pool.get().await {
        Ok(mut conn) => {
            match diesel::sql_query("SELECT version::text AS version FROM __diesel_schema_migrations")
                .load::<VersionRow>(&mut conn)
                .await
            {
                Ok(rows) => {
                    let applied: Vec<String> = rows.into_iter().map(|r| r.version).collect();
                    let missing: Vec<&String> =
                        state.expected_migrations.iter().filter(|v| !applied.contains(v)).collect();
                    if !missing.is_empty() {
                        problems.push(format!("migrations not applied: {missing:?}"));
                    }
                }
                Err(e) => problems.push(format!("database query failed: {e}")),
            }
        }
        Err(e) => problems.push(format!("database unreachable: {e}")),
    }
    let probe = state.kafka_probe.clone();
    let kafka =
        web::block(move || probe.client().fetch_metadata(None, Duration::from_secs(3)).map(|m| m.brokers().len()))
            .await;
    match kafka {
        Ok(Ok(n)) if n > 0 => {}
        Ok(Ok(_)) => problems.push("kafka metadata lists no brokers".into()),
        Ok(Err(e)) => problems.push(format!("kafka metadata unavailable: {e}")),
        Err(e) => problems.push(format!("kafka probe failed: {e}")),
    }
    for status in state.stages.iter().map(tally_actors::consume::PipelineControl::status) {
        if status.degraded {
            let reason = status.degraded_reason.unwrap_or_default();
            problems.push(format!(
                "pipeline {} degraded: {} record(s) waiting for an unavailable dependency ({reason})",
                status.name, status.waiting_for_dependency
            ));
        }
    }
    if problems.is_empty() {
        HttpResponse::Ok().json(json!({ "status": "ready" }))
    } else {
        HttpResponse::ServiceUnavailable().json(json!({ "status": "not_ready", "reasons": problems }))
    }
}

/// Prometheus text exposition; the outbox gauges are refreshed from the database and the
/// DLT gauges from Kafka first (the latter bounded by a short deadline: on timeout the
/// previous values are served).
async fn metrics(state: web::Data<AppState>) -> HttpResponse {
    if let Err(e) = outbox::refresh_gauges(&state.pool, &state.metrics).await {
        tracing::warn!(error = %e, "Cannot refresh outbox gauges.");
    }
    if let Err(e) = dlt_inventory(&state, DLT_METRICS_DEADLINE).await {
        tracing::warn!(error = %e, "Cannot refresh DLT gauges.");
    }
    HttpResponse::Ok().content_type("text/plain; version=0.0.4; charset=utf-8").body(state.metrics.render())
}

/// `GET /admin/outbox`: pending rows and the oldest pending age, per topic and in total.
async fn outbox_backlog(state: web::Data<AppState>) -> Result<HttpResponse, ApiError> {
    let topics =
        outbox::refresh_gauges(&state.pool, &state.metrics).await.map_err(|e| ApiError::Unavailable(e.to_string()))?;
    let pending: i64 = topics.iter().map(|t| t.pending).sum();
    let oldest = topics.iter().map(|t| t.oldest_age_seconds).fold(0.0, f64::max);
    Ok(HttpResponse::Ok().json(json!({
        "pending": pending,
        "oldestAgeSeconds": oldest,
        "topics": topics,
    })))
}

/// `GET /admin/ledger/check`: the ledger invariants of DESIGN.md §8 (also published as
/// `tally_ledger_invariant_ok` gauges). 200 when all hold, 409 otherwise.
async fn ledger_check(state: web::Data<AppState>) -> Result<HttpResponse, ApiError> {
    let mut conn = state.pool.get().await?;
    let check = tally_actors::ledger::check::check_ledger(&mut conn).await?;
    tally_actors::ledger::check::publish(&check, &state.metrics);
    Ok(if check.ok { HttpResponse::Ok().json(check) } else { HttpResponse::Conflict().json(check) })
}

/// `GET /admin/pipelines`: per pipeline its group, assigned partitions with committed and
/// stored offsets, lag and in-flight records, whether it is paused, and keys in retry.
async fn pipelines(state: web::Data<AppState>) -> HttpResponse {
    let all: Vec<_> = state.stages.iter().map(tally_actors::consume::PipelineControl::status).collect();
    HttpResponse::Ok().json(json!({ "pipelines": all }))
}

fn stage<'a>(state: &'a AppState, name: &str) -> Result<&'a tally_actors::consume::PipelineControl, ApiError> {
    state
        .stages
        .iter()
        .find(|s| s.name() == name)
        .ok_or_else(|| ApiError::NotFound(format!("no running pipeline named {name}")))
}

/// `POST /admin/pipelines/{name}/pause` (admin token): stop fetching; in-flight records
/// finish and lag grows until resumed. Answers once the pipeline applied the pause.
async fn pause(
    _: super::auth::Admin,
    state: web::Data<AppState>,
    name: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    let control = stage(&state, &name)?.clone();
    tracing::info!(pipeline = %name, "Pause requested through the admin API.");
    if !web::block(move || control.pause()).await.unwrap_or(false) {
        return Err(ApiError::Unavailable(format!("pipeline {name} did not confirm the pause")));
    }
    Ok(HttpResponse::Ok().json(json!({ "pipeline": *name, "paused": true })))
}

/// `POST /admin/pipelines/{name}/resume` (admin token).
async fn resume(
    _: super::auth::Admin,
    state: web::Data<AppState>,
    name: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    let control = stage(&state, &name)?.clone();
    tracing::info!(pipeline = %name, "Resume requested through the admin API.");
    if !web::block(move || control.resume()).await.unwrap_or(false) {
        return Err(ApiError::Unavailable(format!("pipeline {name} did not confirm the resume")));
    }
    Ok(HttpResponse::Ok().json(json!({ "pipeline": *name, "paused": false })))
}

/// Counts the records of every DLT topic (on a blocking thread) and publishes them as
/// `tally_dlt_topic_records`.
async fn dlt_inventory(state: &web::Data<AppState>, budget: Duration) -> Result<Vec<dlt::TopicCount>, ApiError> {
    let (kafka, probe) = (state.kafka.clone(), std::sync::Arc::clone(&state.dlt_probe));
    let counts = web::block(move || dlt::inventory(&probe, &kafka, dlt::Deadline::after(budget)))
        .await
        .map_err(|e| ApiError::Internal(format!("DLT inventory task failed: {e}")))??;
    dlt::publish(&counts, &state.metrics);
    Ok(counts)
}

/// `GET /admin/dlt`: every DLT topic of this configuration with its record count (high
/// minus low watermark, summed over partitions) and per-partition counts.
async fn dlt_list(state: web::Data<AppState>) -> Result<HttpResponse, ApiError> {
    let topics = dlt_inventory(&state, DLT_DEADLINE).await?;
    let records: i64 = topics.iter().map(|t| t.records).sum();
    Ok(HttpResponse::Ok().json(json!({ "records": records, "topics": topics })))
}

/// The source topic of `topic`, or 404 when `topic` is not a DLT topic of this
/// configuration.
fn known_dlt(state: &AppState, topic: &str) -> Result<String, ApiError> {
    dlt::source_of(&state.kafka, topic)
        .ok_or_else(|| ApiError::NotFound(format!("{topic} is not a DLT topic of this configuration")))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ReadQuery {
    partition: Option<i32>,
    offset: Option<i64>,
    limit: Option<usize>,
}

/// `GET /admin/dlt/{topic}?partition=&offset=&limit=`: the records of a DLT topic, by
/// partition then offset, from `offset` (default: the beginning) of `partition` (default:
/// every partition), at most `limit` (default 100, max 1000). Header values, keys and
/// payloads are UTF-8 text when they are, else base64 (`encoding`); payloads that parse
/// as JSON are JSON. `next` says where the following page starts (null: nothing left as
/// of this request).
async fn dlt_read(
    state: web::Data<AppState>,
    topic: web::Path<String>,
    query: web::Query<ReadQuery>,
) -> Result<HttpResponse, ApiError> {
    let topic = topic.into_inner();
    known_dlt(&state, &topic)?;
    let q = query.into_inner();
    if q.partition.is_some_and(|p| p < 0) {
        return Err(ApiError::BadRequest("partition must be >= 0".into()));
    }
    if q.offset.is_some_and(|o| o < 0) {
        return Err(ApiError::BadRequest("offset must be >= 0".into()));
    }
    let limit = q.limit.unwrap_or(dlt::DEFAULT_LIMIT);
    if !(1..=dlt::MAX_LIMIT).contains(&limit) {
        return Err(ApiError::BadRequest(format!("limit must be between 1 and {}", dlt::MAX_LIMIT)));
    }
    let selection =
        dlt::Selection { partition: q.partition, from_offset: q.offset, to_offset: None, limit: Some(limit) };
    let (kafka, bootstrap, name) = (state.kafka.clone(), state.bootstrap.clone(), topic.clone());
    let page = web::block(move || {
        let deadline = dlt::Deadline::after(DLT_DEADLINE);
        let consumer = dlt::reader(&kafka, &bootstrap)?;
        dlt::read(&consumer, &name, &selection, deadline)
    })
    .await
    .map_err(|e| ApiError::Internal(format!("DLT read task failed: {e}")))??;
    let records: Vec<serde_json::Value> = page.records.iter().map(dlt::DltRecord::view).collect();
    Ok(HttpResponse::Ok().json(json!({
        "topic": topic,
        "count": records.len(),
        "records": records,
        "next": page.next.map(|(partition, offset)| json!({ "partition": partition, "offset": offset })),
    })))
}

/// `POST /admin/dlt/{topic}/replay` (admin token): republishes the selected records of a
/// DLT topic to their original topic and partition, with the original key, value and
/// headers (every `dlt-*` header removed) plus `replayed-from: <dlt>/<partition>/<offset>`,
/// in offset order per partition, with an idempotent producer (acks=all), and answers
/// once every copy is acknowledged: `{replayed, records: [{partition, offset,
/// originalTopic, originalPartition, replayedOffset}]}`.
///
/// The optional JSON body `{partition?, fromOffset?, toOffset?, key?}` (offsets inclusive)
/// narrows the selection; no body means every record present when the request started.
/// If any selected record lacks its origin headers, nothing is replayed (409).
///
/// Replaying does not delete the DLT records: Kafka cannot delete single records, so
/// they stay until retention removes them, and replaying them again republishes them
/// again. The consumers' inbox tables absorb such duplicates.
async fn dlt_replay(
    _: Admin,
    state: web::Data<AppState>,
    topic: web::Path<String>,
    body: web::Bytes,
) -> Result<HttpResponse, ApiError> {
    let topic = topic.into_inner();
    let source = known_dlt(&state, &topic)?;
    let request = dlt::ReplayRequest::parse(&body)?;
    let (kafka, bootstrap, name) = (state.kafka.clone(), state.bootstrap.clone(), topic.clone());
    let planned = web::block(move || {
        let deadline = dlt::Deadline::after(REPLAY_READ_DEADLINE);
        let consumer = dlt::reader(&kafka, &bootstrap)?;
        dlt::prepare_replay(&consumer, &name, &source, &request, deadline)
    })
    .await
    .map_err(|e| ApiError::Internal(format!("DLT replay read task failed: {e}")))??;
    let producer: rdkafka::producer::FutureProducer =
        crate::kafka::producer_config(&state.kafka, &state.bootstrap, "tally-dlt-replay", REPLAY_SEND_TIMEOUT_MS)
            .create()
            .map_err(|e| ApiError::Internal(format!("cannot create the replay producer: {e}")))?;
    let result = dlt::replay(&producer, &planned).await;
    let acked = match &result {
        Ok(done) => done.len(),
        Err(dlt::DltError::Produce { acked, .. }) => *acked,
        Err(_) => 0,
    };
    state.metrics.dlt_replayed_total.with_label_values(&[&topic]).inc_by(acked as u64);
    let done = result?;
    tracing::info!(topic = %topic, replayed = done.len(), "Replayed DLT records.");
    Ok(HttpResponse::Ok().json(json!({ "replayed": done.len(), "records": done })))
}
