//! Admin endpoints: health, readiness, Prometheus metrics, outbox backlog, ledger check,
//! pipelines, and DLT administration (in `admin_dlt`).
//!
//! Open: `/healthz`, `/readyz`, `/metrics`, and the aggregate views (`/admin/outbox`,
//! `/admin/ledger/check`, `/admin/pipelines`, `/admin/dlt`), which show counts, offsets,
//! states and keys but no record contents. Bearer token (`http.admin_token`): everything
//! that shows record contents (`GET /admin/dlt/{topic}`, `GET /admin/dlt/dead_letters`) or
//! changes state (pause, resume, replay, retrying parked outbox rows).

use std::time::Duration;

use actix_web::{web, HttpResponse};
use rdkafka::producer::Producer;
use serde_json::json;
use tally_actors::consume::PipelineControl;
use tally_actors::outbox;
use tally_actors::store::migrate;

use super::admin_dead_letters;
use super::admin_dlt::{self, dlt_inventory};
use super::auth::Admin;
use super::error::{ApiError, ErrorBody};
use super::AppState;

/// Bound of the DLT gauge refresh inside `/metrics`, which must stay fast.
const DLT_METRICS_DEADLINE: Duration = Duration::from_millis(1_500);

pub fn routes(cfg: &mut web::ServiceConfig) {
    cfg.route("/healthz", web::get().to(healthz))
        .route("/readyz", web::get().to(readyz))
        .route("/metrics", web::get().to(metrics))
        .route("/admin/outbox", web::get().to(outbox_backlog))
        .route("/admin/outbox/parked/retry", web::post().to(outbox_retry_all))
        .route("/admin/outbox/parked/{id}/retry", web::post().to(outbox_retry))
        .route("/admin/ledger/check", web::get().to(ledger_check))
        .route("/admin/pipelines", web::get().to(pipelines))
        .route("/admin/pipelines/{name}/pause", web::post().to(pause))
        .route("/admin/pipelines/{name}/resume", web::post().to(resume))
        .route("/admin/dlt", web::get().to(admin_dlt::dlt_list))
        // Before `{topic}`: the table's name is never a `-dlt` topic's.
        .route("/admin/dlt/dead_letters", web::get().to(admin_dead_letters::dead_letters_read))
        .route("/admin/dlt/dead_letters/replay", web::post().to(admin_dead_letters::dead_letters_replay))
        .route("/admin/dlt/{topic}", web::get().to(admin_dlt::dlt_read))
        .route("/admin/dlt/{topic}/replay", web::post().to(admin_dlt::dlt_replay));
}

/// Liveness: the process serves HTTP.
#[utoipa::path(get, path = "/healthz", tag = "admin", responses((status = 200, description = "`{status: ok}`", body = Object)))]
pub(super) async fn healthz() -> HttpResponse {
    HttpResponse::Ok().json(json!({ "status": "ok" }))
}

/// Readiness: the database answers, every embedded migration is applied, Kafka metadata
/// can be fetched, every pipeline has received its partition assignment (ready means able
/// to process), and no pipeline is degraded (waiting for an unavailable dependency). 503
/// with the reasons otherwise.
#[utoipa::path(get, path = "/readyz", tag = "admin", responses((status = 200, description = "`{status: ready}`", body = Object),
    (status = 503, description = "`{status: not_ready, reasons}`", body = Object)))]
pub(super) async fn readyz(state: web::Data<AppState>) -> HttpResponse {
    let mut problems = unassigned_pipelines(&state.stages);
    match state.pool.get().await {
        Ok(mut conn) => match migrate::applied_versions(&mut conn).await {
            Ok(applied) => {
                let missing: Vec<&String> = state.expected_migrations.iter().filter(|v| !applied.contains(v)).collect();
                if !missing.is_empty() {
                    problems.push(format!("migrations not applied: {missing:?}"));
                }
            }
            Err(e) => problems.push(format!("database query failed: {e}")),
        },
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
        let restart = &status.restart;
        let last = restart.last_crash.as_deref().unwrap_or_default();
        if restart.down {
            problems.push(format!(
                "pipeline {} is down after a crash and restarting ({} restarts; last: {last})",
                status.name, restart.restarts
            ));
        } else if restart.crash_looping {
            problems.push(format!(
                "pipeline {} is crash-looping ({} restarts; last: {last})",
                status.name, restart.restarts
            ));
        }
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

/// A reason per pipeline that has not received its first partition assignment (possibly
/// empty) from its consumer group: until then it cannot process anything.
fn unassigned_pipelines(stages: &[PipelineControl]) -> Vec<String> {
    stages
        .iter()
        .map(PipelineControl::status)
        .filter(|s| !s.assigned)
        .map(|s| format!("pipeline {} has not received its partition assignment from group {} yet", s.name, s.group))
        .collect()
}

/// Prometheus text exposition; the pool gauges are refreshed from the pools, the outbox
/// gauges from the database and the DLT gauges from Kafka first (the latter bounded by a
/// short deadline: on timeout the previous values are served).
#[utoipa::path(get, path = "/metrics", tag = "admin",
    responses((status = 200, description = "Prometheus text exposition.", body = String, content_type = "text/plain")))]
pub(super) async fn metrics(state: web::Data<AppState>) -> HttpResponse {
    // First: the refreshes below hold an HTTP connection while they run.
    for (name, pool) in &state.pools {
        tally_actors::store::publish_pool_status(name, pool, &state.metrics);
    }
    if let Err(e) = outbox::refresh_gauges(&state.pool, &state.metrics).await {
        tracing::warn!(error = %e, "Cannot refresh outbox gauges.");
    }
    if let Err(e) = dlt_inventory(&state, DLT_METRICS_DEADLINE).await {
        tracing::warn!(error = %e, "Cannot refresh DLT gauges.");
    }
    HttpResponse::Ok().content_type("text/plain; version=0.0.4; charset=utf-8").body(state.metrics.render())
}

/// Parked rows listed by `GET /admin/outbox` (all are counted).
const PARKED_ROWS_SHOWN: i64 = 100;

/// `GET /admin/outbox`: unpublished rows and the oldest one's age, per topic and in total;
/// the rows the broker refused for good (parked: id, topic, key, reason, since, attempts,
/// next attempt, rows held behind it; never the payload) and the rows held behind them.
#[utoipa::path(get, path = "/admin/outbox", tag = "admin", responses((status = 200, description = "Backlog and parked rows.", body = Object)))]
pub(super) async fn outbox_backlog(state: web::Data<AppState>) -> Result<HttpResponse, ApiError> {
    let unavailable = |e: outbox::OutboxError| ApiError::Unavailable(e.to_string());
    let topics = outbox::refresh_gauges(&state.pool, &state.metrics).await.map_err(unavailable)?;
    let pending: i64 = topics.iter().map(|t| t.pending).sum();
    let oldest = topics.iter().map(|t| t.oldest_age_seconds).fold(0.0, f64::max);
    let parked: i64 = topics.iter().map(|t| t.parked).sum();
    let held: i64 = topics.iter().map(|t| t.held).sum();
    let parked_rows = if parked > 0 {
        outbox::parked_rows(&state.pool, PARKED_ROWS_SHOWN).await.map_err(unavailable)?
    } else {
        vec![]
    };
    Ok(HttpResponse::Ok().json(json!({
        "pending": pending,
        "oldestAgeSeconds": oldest,
        "parked": parked,
        "held": held,
        "parkedRows": parked_rows,
        "topics": topics,
    })))
}

/// `POST /admin/outbox/parked/{id}/retry` (admin token): try parked row `id` again now
/// rather than at its next attempt. 404 when it is not a parked row (never was, or
/// published meanwhile).
#[utoipa::path(post, path = "/admin/outbox/parked/{id}/retry", tag = "admin", params(("id" = String, Path)),
    security(("admin" = [])),
    responses((status = 200, description = "`{retrying}`", body = Object),
        (status = 404, description = "Not a parked row.", body = ErrorBody)))]
pub(super) async fn outbox_retry(
    admin: Admin,
    state: web::Data<AppState>,
    id: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    let id = uuid::Uuid::parse_str(&id)
        .map_err(|e| ApiError::BadRequest(format!("The outbox row id in the path is not a UUID: {e}")))?;
    let due = outbox::retry_parked(&state.pool, Some(id)).await.map_err(|e| ApiError::Unavailable(e.to_string()))?;
    if due.is_empty() {
        return Err(ApiError::NotFound(format!("There is no parked outbox row {id}")));
    }
    admin.audit("outbox_retry", &format!("parked outbox row {id}"));
    Ok(HttpResponse::Ok().json(json!({ "retrying": due })))
}

/// `POST /admin/outbox/parked/retry` (admin token): try every parked row again now.
#[utoipa::path(post, path = "/admin/outbox/parked/retry", tag = "admin", security(("admin" = [])),
    responses((status = 200, description = "`{retrying}`", body = Object)))]
pub(super) async fn outbox_retry_all(admin: Admin, state: web::Data<AppState>) -> Result<HttpResponse, ApiError> {
    let due = outbox::retry_parked(&state.pool, None).await.map_err(|e| ApiError::Unavailable(e.to_string()))?;
    admin.audit("outbox_retry", &format!("every parked outbox row ({})", due.len()));
    Ok(HttpResponse::Ok().json(json!({ "retrying": due })))
}

/// `GET /admin/ledger/check`: the ledger invariants (also published as
/// `tally_ledger_invariant_ok` gauges). 200 when all hold, 409 otherwise.
#[utoipa::path(get, path = "/admin/ledger/check", tag = "admin",
    responses((status = 200, description = "Every invariant holds.", body = Object),
        (status = 409, description = "An invariant is broken.", body = Object)))]
pub(super) async fn ledger_check(state: web::Data<AppState>) -> Result<HttpResponse, ApiError> {
    let mut conn = state.pool.get().await?;
    let check = tally_actors::store::invariants::check_ledger(&mut conn).await?;
    tally_actors::store::invariants::publish(&check, &state.metrics);
    Ok(if check.ok { HttpResponse::Ok().json(check) } else { HttpResponse::Conflict().json(check) })
}

/// `GET /admin/pipelines`: per pipeline its group, assigned partitions with committed and
/// stored offsets, lag and in-flight records, whether it is paused, and keys in retry.
#[utoipa::path(get, path = "/admin/pipelines", tag = "admin", responses((status = 200, description = "`{pipelines}`", body = Object)))]
pub(super) async fn pipelines(state: web::Data<AppState>) -> HttpResponse {
    let all: Vec<_> = state.stages.iter().map(tally_actors::consume::PipelineControl::status).collect();
    HttpResponse::Ok().json(json!({ "pipelines": all }))
}

fn stage<'a>(state: &'a AppState, name: &str) -> Result<&'a tally_actors::consume::PipelineControl, ApiError> {
    state
        .stages
        .iter()
        .find(|s| s.name() == name)
        .ok_or_else(|| ApiError::NotFound(format!("No pipeline named {name} runs here")))
}

/// `POST /admin/pipelines/{name}/pause` (admin token): stop fetching; in-flight records
/// finish and lag grows until resumed. Answers once the pipeline applied the pause.
#[utoipa::path(post, path = "/admin/pipelines/{name}/pause", tag = "admin", params(("name" = String, Path)),
    security(("admin" = [])),
    responses((status = 200, description = "Paused.", body = Object), (status = 404, description = "No such pipeline.", body = ErrorBody)))]
pub(super) async fn pause(
    admin: Admin,
    state: web::Data<AppState>,
    name: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    let control = stage(&state, &name)?.clone();
    admin.audit("pause", &format!("pipeline {name}"));
    if !web::block(move || control.pause()).await.unwrap_or(false) {
        return Err(ApiError::Unavailable(format!("Pipeline {name} did not confirm the pause")));
    }
    Ok(HttpResponse::Ok().json(json!({ "pipeline": *name, "paused": true })))
}

/// `POST /admin/pipelines/{name}/resume` (admin token).
#[utoipa::path(post, path = "/admin/pipelines/{name}/resume", tag = "admin", params(("name" = String, Path)),
    security(("admin" = [])),
    responses((status = 200, description = "Resumed.", body = Object), (status = 404, description = "No such pipeline.", body = ErrorBody)))]
pub(super) async fn resume(
    admin: Admin,
    state: web::Data<AppState>,
    name: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    let control = stage(&state, &name)?.clone();
    admin.audit("resume", &format!("pipeline {name}"));
    if !web::block(move || control.resume()).await.unwrap_or(false) {
        return Err(ApiError::Unavailable(format!("Pipeline {name} did not confirm the resume")));
    }
    Ok(HttpResponse::Ok().json(json!({ "pipeline": *name, "paused": false })))
}
