//! The OpenAPI 3.1 documents of both listeners, derived by `utoipa` from the handlers'
//! `#[utoipa::path]` attributes and the body types, so they cannot drift from the code.
//! Each listener serves the document of its own paths at `GET /openapi.json`: the intake
//! its transfers, accounts and orders; the admin its operations and the console. What
//! depends on the configuration (the ceiling of amounts, whether the intake demands an API
//! client's token) is filled in from the running daemon's.

use std::sync::OnceLock;

use actix_web::{web, HttpRequest, HttpResponse};
use serde_json::{json, Value};
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityRequirement, SecurityScheme};
use utoipa::openapi::{ContentBuilder, Ref, ResponseBuilder};
use utoipa::{Modify, OpenApi};

use super::error::ApiError;
use super::{
    accounts, admin, admin_dead_letters, admin_dlt, console, dlt_replays, intake, issuances, orders, transfer_list,
    AppState,
};

/// The intake listener's document.
#[derive(OpenApi)]
#[openapi(
    info(title = "tally intake", description = "Transfers, accounts and orders. Every error is \
        `{\"error\": {\"code\", \"message\"}}` and writes nothing."),
    paths(
        intake::create_transfer,
        intake::get_transfer,
        accounts::create_account,
        accounts::get_account,
        issuances::create_issuance,
        orders::create_order,
        orders::get_order,
        intake_document,
    ),
    modifiers(&INTAKE),
    tags((name = "intake", description = "What clients call: `http.intake_addr`."))
)]
pub struct IntakeApi;

/// The admin listener's document.
#[derive(OpenApi)]
#[openapi(
    info(title = "tally admin", description = "Health, metrics and operations, and the \
        operator console. Endpoints that show record contents or change state need the \
        admin token (`http.admin_token`)."),
    paths(
        admin::healthz,
        admin::readyz,
        admin::metrics,
        admin::outbox_backlog,
        admin::outbox_retry_all,
        admin::outbox_retry,
        admin::ledger_check,
        admin::pipelines,
        admin::pause,
        admin::resume,
        admin_dlt::dlt_list,
        admin_dead_letters::dead_letters_read,
        admin_dead_letters::dead_letters_replay,
        admin_dlt::dlt_read,
        admin_dlt::dlt_replay,
        console::index,
        console::app_js,
        console::app_css,
        console::favicon,
        console::favicon_ico,
        console::story::transfer,
        console::token,
        console::token_status,
        console::throughput,
        transfer_list::list,
        dlt_replays::list,
        admin_document,
    ),
    modifiers(&ADMIN),
    tags(
        (name = "admin", description = "Health, metrics and operations: `http.admin_addr`."),
        (name = "console", description = "The operator console and what only it calls."),
    )
)]
pub struct AdminApi;

const INTAKE: Listener = Listener::Intake;
const ADMIN: Listener = Listener::Admin;

/// Which listener a document describes: what every operation of it may answer besides
/// its own statuses, and how it authenticates.
enum Listener {
    Intake,
    Admin,
}

impl Modify for Listener {
    fn modify(&self, api: &mut utoipa::openapi::OpenApi) {
        let (scheme, about) = match self {
            Self::Intake => ("client", "An API client's token (`http.clients`), required with `http.intake_auth`."),
            Self::Admin => ("admin", "The admin token (`http.admin_token`)."),
        };
        let bearer = HttpBuilder::new().scheme(HttpAuthScheme::Bearer).description(Some(about)).build();
        api.components.get_or_insert_with(Default::default).add_security_scheme(scheme, SecurityScheme::Http(bearer));
        for item in api.paths.paths.values_mut() {
            for (has_body, op) in [(false, &mut item.get), (true, &mut item.post)]
                .into_iter()
                .filter_map(|(has_body, op)| op.as_mut().map(|op| (has_body, op)))
            {
                // `security(())`: open on purpose (the document itself); none given: the
                // listener's scheme.
                let declared = op.security.as_ref().map(|s| serde_json::to_value(s).unwrap_or_default());
                let open = declared.as_ref().is_some_and(|s| *s == json!([{}]));
                let mut errors = vec![
                    ("400", "The path, query, a header or the body cannot be read."),
                    ("503", "The database or Kafka is unavailable, or the intake is overloaded."),
                ];
                if has_body {
                    errors.push(("413", "The body is larger than `http.body_limit_bytes`."));
                    errors.push(("415", "The body is not sent as application/json."));
                }
                match self {
                    Self::Intake if !open => {
                        errors.push(("401", "No valid API client token."));
                        op.security = Some(vec![SecurityRequirement::default(), client_requirement()]);
                    }
                    Self::Admin if declared.is_some() && !open => {
                        errors.push(("401", "No admin token was sent."));
                        errors.push(("403", "The admin token is wrong, or none is configured."));
                    }
                    Self::Intake | Self::Admin => {}
                }
                for (status, description) in errors {
                    op.responses.responses.entry(status.to_owned()).or_insert_with(|| error_response(description));
                }
            }
        }
    }
}

fn client_requirement() -> SecurityRequirement {
    SecurityRequirement::new("client", Vec::<String>::new())
}

fn error_response(description: &str) -> utoipa::openapi::RefOr<utoipa::openapi::Response> {
    let content = ContentBuilder::new().schema(Some(Ref::from_schema_name("ErrorBody"))).build();
    ResponseBuilder::new().description(description).content("application/json", content).build().into()
}

/// The intake's document as this daemon serves it: amounts capped at
/// `ledger.max_balance_cents`, and the client token required with `http.intake_auth`.
#[must_use]
pub fn intake_doc(max_balance_cents: i64, auth_required: bool) -> Value {
    let mut doc = serde_json::to_value(IntakeApi::openapi()).unwrap_or_else(|_| json!({}));
    for (schema, field) in [("CreateTransferBody", "amountCents"), ("CreateAccountBody", "initialBalanceCents")] {
        if let Some(property) = doc.pointer_mut(&format!("/components/schemas/{schema}/properties/{field}")) {
            property["maximum"] = json!(max_balance_cents);
        }
    }
    if auth_required {
        let required = serde_json::to_value(vec![client_requirement()]).unwrap_or_else(|_| json!([]));
        if let Some(paths) = doc.get_mut("paths").and_then(Value::as_object_mut) {
            for op in paths.values_mut().filter_map(Value::as_object_mut).flat_map(|item| item.values_mut()) {
                if op.get("security").is_some_and(|s| *s != json!([{}])) {
                    op["security"] = required.clone();
                }
            }
        }
    }
    doc
}

/// The admin listener's document.
#[must_use]
pub fn admin_doc() -> Value {
    serde_json::to_value(AdminApi::openapi()).unwrap_or_else(|_| json!({}))
}

/// `GET /openapi.json` of the intake listener.
#[utoipa::path(get, path = "/openapi.json", tag = "intake", security(()),
    responses((status = 200, description = "This document (OpenAPI 3.1).", body = Object)))]
pub(super) async fn intake_document(state: web::Data<AppState>) -> HttpResponse {
    HttpResponse::Ok().json(intake_doc(state.max_balance_cents, state.clients.required))
}

/// `GET /openapi.json` of the admin listener.
#[utoipa::path(get, path = "/openapi.json", tag = "admin",
    responses((status = 200, description = "This document (OpenAPI 3.1).", body = Object)))]
pub(super) async fn admin_document() -> HttpResponse {
    HttpResponse::Ok().json(admin_doc())
}

/// Every `(METHOD, path template)` of a document.
fn operations(doc: &Value) -> Vec<(String, String)> {
    let paths = doc.get("paths").and_then(Value::as_object).into_iter().flatten();
    paths
        .flat_map(|(path, item)| {
            let methods = item.as_object().into_iter().flat_map(|m| m.keys());
            methods.map(move |method| (method.to_uppercase(), path.clone()))
        })
        .collect()
}

/// Whether `path` fits `template` as actix matches it: `{name}` takes one non-empty segment.
fn fits(template: &str, path: &str) -> bool {
    let (template, path): (Vec<&str>, Vec<&str>) = (template.split('/').collect(), path.split('/').collect());
    template.len() == path.len()
        && template.iter().zip(&path).all(|(t, p)| if t.starts_with('{') { !p.is_empty() } else { t == p })
}

/// What a request no route takes gets: 405 with `Allow` when its path is a route's under
/// other methods, else 404.
fn fallback(req: &HttpRequest, operations: &[(String, String)]) -> Result<HttpResponse, ApiError> {
    let mut allowed: Vec<&str> =
        operations.iter().filter(|(_, template)| fits(template, req.path())).map(|(m, _)| m.as_str()).collect();
    if allowed.is_empty() {
        return Err(ApiError::NotFound(format!("There is no route for {} {}", req.method(), req.path())));
    }
    allowed.sort_unstable();
    allowed.dedup();
    Err(ApiError::MethodNotAllowed {
        method: req.method().to_string(),
        path: req.path().to_owned(),
        allowed: allowed.join(", "),
    })
}

/// The intake listener's default service: 405 or 404 ([`fallback`]).
pub(super) async fn intake_fallback(req: HttpRequest) -> Result<HttpResponse, ApiError> {
    static OPERATIONS: OnceLock<Vec<(String, String)>> = OnceLock::new();
    fallback(&req, OPERATIONS.get_or_init(|| operations(&intake_doc(0, false))))
}

/// The admin listener's default service: 405 or 404 ([`fallback`]).
pub(super) async fn admin_fallback(req: HttpRequest) -> Result<HttpResponse, ApiError> {
    static OPERATIONS: OnceLock<Vec<(String, String)>> = OnceLock::new();
    fallback(&req, OPERATIONS.get_or_init(|| operations(&admin_doc())))
}

#[cfg(test)]
mod tests;
