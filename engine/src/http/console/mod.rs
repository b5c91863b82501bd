//! The operator console: a single page served at `/` of the admin listener, built from
//! plain HTML, CSS and JavaScript embedded in the binary (no build step, no Node.js). It
//! calls the admin API from the browser; the token, when the operator gives it, travels as
//! a Bearer header like any other client's.
//!
//! Also here, the endpoints only the console needs:
//! - `GET /admin/token` (admin token): whether a token is accepted;
//! - `GET /admin/token/status` (open): whether this daemon has an admin token at all;
//! - `GET /admin/throughput` (open): the throughput history (`crate::throughput`);
//! - `GET /admin/transfers` (admin token): the transfer list (`super::transfer_list`);
//! - `GET /admin/transfers/{id}` (admin token): one transfer's story ([`story`]);
//! - `GET /admin/replays` (open): the replay log (`super::dlt_replays`).

pub(super) mod story;

use actix_web::http::header::{self, HeaderValue};
use actix_web::{web, HttpResponse};
use serde_json::json;

use super::auth::Admin;
use super::AppState;

const INDEX_HTML: &str = include_str!("../../../assets/console/index.html");
const APP_JS: &str = include_str!("../../../assets/console/app.js");
const APP_CSS: &str = include_str!("../../../assets/console/app.css");
const FAVICON_SVG: &str = include_str!("../../../assets/console/favicon.svg");

/// Scripts and styles only from this origin, no inline script, no framing: the page
/// handles the admin token.
const CSP: &str = "default-src 'self'; img-src 'self' data:; style-src 'self'; script-src 'self'; \
                   connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'none'";

pub fn routes(cfg: &mut web::ServiceConfig) {
    cfg.route("/", web::get().to(index))
        .route("/console/app.js", web::get().to(app_js))
        .route("/console/app.css", web::get().to(app_css))
        .route("/console/favicon.svg", web::get().to(favicon))
        // Where browsers and tools look without being told.
        .route("/favicon.ico", web::get().to(favicon_ico))
        .route("/admin/transfers", web::get().to(super::transfer_list::list))
        .route("/admin/transfers/{id}", web::get().to(story::transfer))
        .route("/admin/token", web::get().to(token))
        .route("/admin/token/status", web::get().to(token_status))
        .route("/admin/throughput", web::get().to(throughput))
        .route("/admin/replays", web::get().to(super::dlt_replays::list));
}

fn asset(content_type: &'static str, body: &'static str) -> HttpResponse {
    HttpResponse::Ok()
        .content_type(content_type)
        .insert_header((header::CACHE_CONTROL, HeaderValue::from_static("no-cache")))
        .insert_header((header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff")))
        .insert_header((header::CONTENT_SECURITY_POLICY, HeaderValue::from_static(CSP)))
        .insert_header((header::REFERRER_POLICY, HeaderValue::from_static("no-referrer")))
        .body(body)
}

#[utoipa::path(get, path = "/", tag = "console",
    responses((status = 200, description = "The operator console.", body = String, content_type = "text/html")))]
pub(in crate::http) async fn index() -> HttpResponse {
    asset("text/html; charset=utf-8", INDEX_HTML)
}

#[utoipa::path(get, path = "/console/app.js", tag = "console",
    responses((status = 200, description = "The console's script.", body = String, content_type = "text/javascript")))]
pub(in crate::http) async fn app_js() -> HttpResponse {
    asset("text/javascript; charset=utf-8", APP_JS)
}

#[utoipa::path(get, path = "/console/app.css", tag = "console",
    responses((status = 200, description = "The console's styles.", body = String, content_type = "text/css")))]
pub(in crate::http) async fn app_css() -> HttpResponse {
    asset("text/css; charset=utf-8", APP_CSS)
}

#[utoipa::path(get, path = "/console/favicon.svg", tag = "console",
    responses((status = 200, description = "The console's icon.", body = String, content_type = "image/svg+xml")))]
pub(in crate::http) async fn favicon() -> HttpResponse {
    asset("image/svg+xml", FAVICON_SVG)
}

/// `GET /favicon.ico`: the same icon, where browsers look for one by default.
#[utoipa::path(get, path = "/favicon.ico", tag = "console",
    responses((status = 200, description = "The console's icon (SVG).", body = String, content_type = "image/svg+xml")))]
pub(in crate::http) async fn favicon_ico() -> HttpResponse {
    favicon().await
}

/// `GET /admin/token` (admin token): 200 when the request carries the admin token. Touches
/// neither the database nor Kafka, so the console can take the token while they are down.
#[utoipa::path(get, path = "/admin/token", tag = "console", security(("admin" = [])),
    responses((status = 200, description = "`{ok: true}`: the token is right.", body = Object)))]
pub(in crate::http) async fn token(_: Admin) -> HttpResponse {
    HttpResponse::Ok().json(json!({ "ok": true }))
}

/// `GET /admin/token/status` (open): `{"configured": bool}`, whether this daemon has an
/// admin token (`http.admin_token`). Without one every token is refused; the console says
/// so, and how to set one, rather than "not accepted". Tells nothing else of the token.
#[utoipa::path(get, path = "/admin/token/status", tag = "console",
    responses((status = 200, description = "`{configured}`: whether an admin token is configured.", body = Object)))]
pub(in crate::http) async fn token_status(state: web::Data<AppState>) -> HttpResponse {
    let configured = !state.admin_token.is_empty();
    HttpResponse::Ok().json(json!({ "configured": configured }))
}

/// `GET /admin/throughput` (open): `{intervalSeconds, capacity, series, points: [{end,
/// counts: {series: n}}]}`, oldest first: records completed per pipeline and transfers
/// accepted (`intake`) in each whole interval the daemon kept (see `crate::throughput`).
#[utoipa::path(get, path = "/admin/throughput", tag = "console",
    responses((status = 200, description = "`{intervalSeconds, capacity, series, points}`, oldest first.", body = Object)))]
pub(in crate::http) async fn throughput(state: web::Data<AppState>) -> HttpResponse {
    let (series, points) = state.throughput.with(|ring| (ring.series(), ring.points()));
    HttpResponse::Ok().json(json!({
        "intervalSeconds": crate::throughput::INTERVAL.as_secs(),
        "capacity": crate::throughput::CAPACITY,
        "series": series,
        "points": points,
    }))
}
