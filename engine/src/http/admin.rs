//! Admin endpoints: health, readiness, Prometheus metrics, outbox backlog.

use std::time::Duration;

use actix_web::{web, HttpResponse};
use diesel::sql_types::Text;
use diesel_async::RunQueryDsl;
use rdkafka::producer::Producer;
use serde_json::json;
use tally_actors::outbox;

use super::error::ApiError;
use super::AppState;

pub fn routes(cfg: &mut web::ServiceConfig) {
    cfg.route("/healthz", web::get().to(healthz))
        .route("/readyz", web::get().to(readyz))
        .route("/metrics", web::get().to(metrics))
        .route("/admin/outbox", web::get().to(outbox_backlog))
        .route("/admin/ledger/check", web::get().to(ledger_check))
        .route("/admin/pipelines", web::get().to(pipelines))
        .route("/admin/pipelines/{name}/pause", web::post().to(pause))
        .route("/admin/pipelines/{name}/resume", web::post().to(resume));
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

/// Readiness: the database answers, every embedded migration is applied, and Kafka
/// metadata can be fetched. 503 with the reasons otherwise.
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
    if problems.is_empty() {
        HttpResponse::Ok().json(json!({ "status": "ready" }))
    } else {
        HttpResponse::ServiceUnavailable().json(json!({ "status": "not_ready", "reasons": problems }))
    }
}

/// Prometheus text exposition; the outbox gauges are refreshed from the database first.
async fn metrics(state: web::Data<AppState>) -> HttpResponse {
    if let Err(e) = outbox::refresh_gauges(&state.pool, &state.metrics).await {
        tracing::warn!(error = %e, "Cannot refresh outbox gauges.");
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
