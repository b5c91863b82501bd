//! The HTTP error type: every variant maps to one status and a JSON body
//! `{"error": {"code": "...", "message": "..."}}` ([`ErrorBody`]) whose message is a
//! sentence; actix's own refusals (a path, query or body that cannot be read, a method a
//! route does not take) are worded the same way.

use actix_web::body::{BoxBody, MessageBody};
use actix_web::dev::{ServiceRequest, ServiceResponse};
use actix_web::error::JsonPayloadError;
use actix_web::http::{header, StatusCode};
use actix_web::middleware::Next;
use actix_web::{HttpRequest, HttpResponse, ResponseError};
use serde::Serialize;
use tracing::error;

/// Every error answer of both listeners.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct ErrorBody {
    pub error: ErrorDetail,
}

/// What went wrong: a stable code for programs, a sentence for people.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct ErrorDetail {
    /// Stable and machine-readable, e.g. `validation_failed`, `not_found`.
    #[schema(example = "validation_failed")]
    pub code: String,
    /// What was refused and why, as a sentence.
    #[schema(example = "currency must be 3 uppercase letters (ISO 4217), e.g. \"BRL\".")]
    pub message: String,
}

impl ErrorBody {
    fn new(code: &str, message: &str) -> Self {
        Self { error: ErrorDetail { code: code.to_owned(), message: sentence(message) } }
    }
}

/// `message` ending as a sentence does.
fn sentence(message: &str) -> String {
    let message = message.trim_end();
    if message.ends_with(['.', '?', '!']) {
        message.to_owned()
    } else {
        format!("{message}.")
    }
}

#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum ApiError {
    /// The body is not valid JSON or does not have the expected shape.
    #[error("{0}")]
    InvalidBody(String),
    /// A field is present but its value breaks a rule.
    #[error("{0}")]
    Validation(String),
    #[error("The request body must be JSON, sent with Content-Type: application/json")]
    UnsupportedMediaType,
    #[error("The request body is larger than the limit of {limit} bytes")]
    PayloadTooLarge { limit: usize },
    #[error("{0}")]
    BadRequest(String),
    #[error("{0}")]
    NotFound(String),
    /// The path is a route's, but not with this method: `allowed` lists those it takes.
    #[error("{method} {path} is not served; this path takes {allowed}")]
    MethodNotAllowed { method: String, path: String, allowed: String },
    #[error("{message}")]
    Conflict { code: &'static str, message: String },
    #[error("This needs the admin token: send Authorization: Bearer <http.admin_token>")]
    Unauthorized,
    #[error("The admin token is not valid, or none is configured (http.admin_token)")]
    Forbidden,
    /// The intake's request carried no valid API client token (`http.intake_auth`).
    #[error("This needs an API client's token: send Authorization: Bearer <client token>")]
    ClientUnauthorized,
    /// The client is known, and this is not its to do: a scope it lacks, an account that
    /// is not its own to debit.
    #[error("{message}")]
    Refused { code: &'static str, message: String },
    /// Too many failed authentications from this address: it waits before the next try.
    #[error("Too many failed authentications from this address: try again in {retry_after_secs} s")]
    TooManyFailures { retry_after_secs: u64 },
    /// The request's body did not arrive within `http.request_timeout_ms`.
    #[error("The request did not arrive within {0} ms")]
    RequestTimeout(u64),
    /// The admin listener does not answer this host name (`http.admin_hosts`).
    #[error(
        "This listener does not answer the host name {0:?}; it answers IP addresses, localhost and http.admin_hosts"
    )]
    MisdirectedHost(String),
    #[error("The service is unavailable: {0}")]
    Unavailable(String),
    /// The write may or may not have committed (the connection was lost during it): retry
    /// only with the same `Idempotency-Key`.
    #[error("The outcome is unknown ({0}): retry only with the same Idempotency-Key")]
    OutcomeUnknown(String),
    #[error("Something went wrong inside the server; the log says what")]
    Internal(String),
}

impl ApiError {
    /// The stable machine-readable code of this error.
    #[must_use]
    pub fn code(&self) -> &'static str {
        match self {
            Self::InvalidBody(_) => "invalid_body",
            Self::Validation(_) => "validation_failed",
            Self::UnsupportedMediaType => "unsupported_media_type",
            Self::PayloadTooLarge { .. } => "payload_too_large",
            Self::BadRequest(_) => "bad_request",
            Self::NotFound(_) => "not_found",
            Self::MethodNotAllowed { .. } => "method_not_allowed",
            Self::Conflict { code, .. } => code,
            Self::Unauthorized | Self::ClientUnauthorized => "unauthorized",
            Self::Forbidden => "forbidden",
            Self::Refused { code, .. } => code,
            Self::TooManyFailures { .. } => "too_many_failures",
            Self::RequestTimeout(_) => "request_timeout",
            Self::MisdirectedHost(_) => "misdirected_host",
            Self::Unavailable(_) => "unavailable",
            Self::OutcomeUnknown(_) => "outcome_unknown",
            Self::Internal(_) => "internal",
        }
    }
}

impl ResponseError for ApiError {
    fn status_code(&self) -> StatusCode {
        match self {
            Self::InvalidBody(_) | Self::BadRequest(_) => StatusCode::BAD_REQUEST,
            Self::Validation(_) => StatusCode::UNPROCESSABLE_ENTITY,
            Self::UnsupportedMediaType => StatusCode::UNSUPPORTED_MEDIA_TYPE,
            Self::PayloadTooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            Self::NotFound(_) => StatusCode::NOT_FOUND,
            Self::MethodNotAllowed { .. } => StatusCode::METHOD_NOT_ALLOWED,
            Self::Conflict { .. } => StatusCode::CONFLICT,
            Self::Unauthorized | Self::ClientUnauthorized => StatusCode::UNAUTHORIZED,
            Self::Forbidden | Self::Refused { .. } => StatusCode::FORBIDDEN,
            Self::TooManyFailures { .. } => StatusCode::TOO_MANY_REQUESTS,
            Self::RequestTimeout(_) => StatusCode::REQUEST_TIMEOUT,
            Self::MisdirectedHost(_) => StatusCode::MISDIRECTED_REQUEST,
            Self::Unavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
            Self::Internal(_) | Self::OutcomeUnknown(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    fn error_response(&self) -> HttpResponse {
        if let Self::Internal(detail) = self {
            error!(detail, "Internal error while serving a request.");
        }
        let mut response = HttpResponse::build(self.status_code());
        if matches!(self, Self::Unauthorized | Self::ClientUnauthorized) {
            response.insert_header((actix_web::http::header::WWW_AUTHENTICATE, "Bearer"));
        }
        if let Self::MethodNotAllowed { allowed, .. } = self {
            response.insert_header((header::ALLOW, allowed.as_str()));
        }
        if let Self::TooManyFailures { retry_after_secs } = self {
            response.insert_header((header::RETRY_AFTER, retry_after_secs.to_string()));
        }
        if matches!(self, Self::RequestTimeout(_)) {
            response.force_close();
        }
        response.json(ErrorBody::new(self.code(), &self.to_string()))
    }
}

impl From<tally_schema::ValueError> for ApiError {
    fn from(e: tally_schema::ValueError) -> Self {
        Self::Validation(e.to_string())
    }
}

impl From<diesel::result::Error> for ApiError {
    fn from(e: diesel::result::Error) -> Self {
        use diesel::result::{DatabaseErrorKind, Error};
        match &e {
            Error::DatabaseError(DatabaseErrorKind::ClosedConnection | DatabaseErrorKind::UnableToSendCommand, _) => {
                Self::Unavailable("database connection lost".into())
            }
            _ => Self::Internal(e.to_string()),
        }
    }
}

impl From<diesel_async::pooled_connection::deadpool::PoolError> for ApiError {
    fn from(e: diesel_async::pooled_connection::deadpool::PoolError) -> Self {
        Self::Unavailable(format!("database unavailable: {e}"))
    }
}

/// Maps actix's JSON extractor failures to [`ApiError`] (wired into `JsonConfig`).
pub fn json_error(err: JsonPayloadError, _: &HttpRequest) -> actix_web::Error {
    let api = match err {
        JsonPayloadError::ContentType => ApiError::UnsupportedMediaType,
        JsonPayloadError::OverflowKnownLength { limit, .. } | JsonPayloadError::Overflow { limit } => {
            ApiError::PayloadTooLarge { limit }
        }
        JsonPayloadError::Deserialize(e) if e.is_data() => {
            ApiError::InvalidBody(format!("The request body does not have the expected fields: {e}"))
        }
        JsonPayloadError::Deserialize(e) => ApiError::InvalidBody(format!("The request body is not valid JSON: {e}")),
        JsonPayloadError::Payload(actix_web::error::PayloadError::Io(e))
            if e.kind() == std::io::ErrorKind::TimedOut =>
        {
            ApiError::RequestTimeout(super::edge::timeout_ms(&e))
        }
        other => ApiError::InvalidBody(format!("The request body could not be read: {other}")),
    };
    api.into()
}

/// Maps path-parameter failures (e.g. a malformed UUID) to [`ApiError`], naming the
/// parameter by the route: "The transfer id in the path is not a UUID: ...".
pub fn path_error(err: actix_web::error::PathError, req: &HttpRequest) -> actix_web::Error {
    let actix_web::error::PathError::Deserialize(detail) = &err else {
        return ApiError::BadRequest(format!("The path could not be read: {err}")).into();
    };
    let what = req.match_pattern().map_or_else(|| "parameter".to_owned(), |p| path_parameter(&p));
    let detail = detail.to_string();
    ApiError::BadRequest(match detail.strip_prefix("UUID parsing failed: ") {
        Some(why) => format!("The {what} in the path is not a UUID (like 0192f0c4-5b6e-7d8f-9a0b-1c2d3e4f5a6b): {why}"),
        None => format!("The {what} in the path could not be read: {detail}"),
    })
    .into()
}

/// What the first parameter of route `pattern` names: `/orders/{id}` -> "order id".
fn path_parameter(pattern: &str) -> String {
    let segments: Vec<&str> = pattern.split('/').filter(|s| !s.is_empty()).collect();
    let Some(at) = segments.iter().position(|s| s.starts_with('{')) else { return "parameter".into() };
    let name = segments[at].trim_matches(['{', '}']);
    match at.checked_sub(1).map(|i| segments[i]) {
        Some(thing) => format!("{} {name}", thing.strip_suffix('s').unwrap_or(thing).replace('_', " ")),
        None => name.to_owned(),
    }
}

/// Maps query-string failures to [`ApiError`].
pub fn query_error(err: actix_web::error::QueryPayloadError, _: &HttpRequest) -> actix_web::Error {
    let detail = match &err {
        actix_web::error::QueryPayloadError::Deserialize(e) => e.to_string(),
        other => other.to_string(),
    };
    ApiError::BadRequest(format!(
        "The query string could not be read ({detail}): check each parameter's name and that numbers are integers"
    ))
    .into()
}

/// Gives every error answer that is not JSON yet (a method the route does not take,
/// anything actix refuses before a handler runs) the JSON body of [`ErrorBody`], keeping
/// its status and headers (`Allow`, `WWW-Authenticate`).
///
/// # Errors
/// Those of the wrapped service.
pub async fn json_errors(
    req: ServiceRequest,
    next: Next<impl MessageBody + 'static>,
) -> Result<ServiceResponse<BoxBody>, actix_web::Error> {
    let res = next.call(req).await?;
    let status = res.status();
    let json = res
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/json"));
    if !(status.is_client_error() || status.is_server_error()) || json {
        return Ok(res.map_into_boxed_body());
    }
    let (req, old) = res.into_parts();
    let (code, message) = match status {
        StatusCode::METHOD_NOT_ALLOWED => {
            let allowed = old.headers().get(header::ALLOW).and_then(|v| v.to_str().ok()).unwrap_or("other methods");
            ("method_not_allowed", format!("{} {} is not served; this path takes {allowed}", req.method(), req.path()))
        }
        StatusCode::PAYLOAD_TOO_LARGE => ("payload_too_large", "The request body is too large".to_owned()),
        s if s.is_server_error() => {
            ("internal", "Something went wrong inside the server; the log says what".to_owned())
        }
        s => ("bad_request", format!("The request was refused ({s})")),
    };
    let mut new = HttpResponse::build(status);
    for (name, value) in old.headers() {
        if name != header::CONTENT_TYPE && name != header::CONTENT_LENGTH {
            new.append_header((name.clone(), value.clone()));
        }
    }
    Ok(ServiceResponse::new(req, new.json(ErrorBody::new(code, &message))))
}

impl From<crate::dlt::DltError> for ApiError {
    fn from(e: crate::dlt::DltError) -> Self {
        use crate::dlt::DltError;
        match e {
            DltError::BadSelection(m) => Self::BadRequest(m),
            DltError::NotReplayable { .. } => Self::Conflict { code: e.code(), message: e.to_string() },
            DltError::Client(_) => Self::Internal(e.to_string()),
            other => Self::Unavailable(other.to_string()),
        }
    }
}
