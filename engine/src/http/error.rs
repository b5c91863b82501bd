//! The HTTP error type: every variant maps to one status and a JSON body
//! `{"error": {"code": "...", "message": "..."}}`.

use actix_web::error::JsonPayloadError;
use actix_web::http::StatusCode;
use actix_web::{HttpRequest, HttpResponse, ResponseError};
use serde_json::json;
use tracing::error;

#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum ApiError {
    /// The body is not valid JSON or does not have the expected shape.
    #[error("{0}")]
    InvalidBody(String),
    /// A field is present but its value breaks a rule.
    #[error("{0}")]
    Validation(String),
    #[error("request body must be JSON (Content-Type: application/json)")]
    UnsupportedMediaType,
    #[error("request body exceeds the limit of {limit} bytes")]
    PayloadTooLarge { limit: usize },
    #[error("{0}")]
    BadRequest(String),
    #[error("{0}")]
    NotFound(String),
    #[error("{message}")]
    Conflict { code: &'static str, message: String },
    #[error("authorization required: send Authorization: Bearer <admin token>")]
    Unauthorized,
    #[error("the admin token is not valid")]
    Forbidden,
    /// The intake's request carried no valid API client token (`http.intake_auth`).
    #[error("authentication required: send Authorization: Bearer <API client token>")]
    ClientUnauthorized,
    #[error("service unavailable: {0}")]
    Unavailable(String),
    /// The write may or may not have committed (the connection was lost during it): retry
    /// only with the same `Idempotency-Key`.
    #[error("the outcome is unknown ({0}): retry only with the same Idempotency-Key")]
    OutcomeUnknown(String),
    #[error("internal error")]
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
            Self::Conflict { code, .. } => code,
            Self::Unauthorized | Self::ClientUnauthorized => "unauthorized",
            Self::Forbidden => "forbidden",
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
            Self::Conflict { .. } => StatusCode::CONFLICT,
            Self::Unauthorized | Self::ClientUnauthorized => StatusCode::UNAUTHORIZED,
            Self::Forbidden => StatusCode::FORBIDDEN,
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
        response.json(json!({ "error": { "code": self.code(), "message": self.to_string() } }))
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
        JsonPayloadError::Deserialize(e) => ApiError::InvalidBody(format!("invalid JSON body: {e}")),
        other => ApiError::InvalidBody(format!("cannot read JSON body: {other}")),
    };
    api.into()
}

/// Maps path-parameter failures (e.g. a malformed UUID) to [`ApiError`].
pub fn path_error(err: actix_web::error::PathError, _: &HttpRequest) -> actix_web::Error {
    ApiError::BadRequest(format!("invalid path parameter: {err}")).into()
}

/// Maps query-string failures to [`ApiError`].
pub fn query_error(err: actix_web::error::QueryPayloadError, _: &HttpRequest) -> actix_web::Error {
    ApiError::BadRequest(format!("invalid query string: {err}")).into()
}

/// The JSON 404 for unknown routes.
pub async fn not_found(req: HttpRequest) -> Result<HttpResponse, ApiError> {
    Err(ApiError::NotFound(format!("no route for {} {}", req.method(), req.path())))
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
