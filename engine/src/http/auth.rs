//! Bearer-token authorization of state-changing admin endpoints: a missing token is 401,
//! a wrong one 403, compared in constant time. With no token configured those endpoints
//! are refused (403): an admin listener is never open by omission.
//!
//! And the intake's API clients ([`Caller`]): a token that no client has is 401; with
//! `http.intake_auth` on, so is a request without one.

use actix_web::dev::Payload;
use actix_web::{web, FromRequest, HttpRequest};
use futures_util::future::{ready, Ready};
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use super::error::ApiError;
use super::AppState;

/// Present in a handler's arguments: the request carried the admin token.
#[derive(Debug)]
pub struct Admin;

impl FromRequest for Admin {
    type Error = ApiError;
    type Future = Ready<Result<Self, ApiError>>;

    fn from_request(req: &HttpRequest, _: &mut Payload) -> Self::Future {
        ready(check(req))
    }
}

fn check(req: &HttpRequest) -> Result<Admin, ApiError> {
    let state =
        req.app_data::<web::Data<AppState>>().ok_or_else(|| ApiError::Internal("admin state missing".into()))?;
    let configured = state.admin_token.expose().as_bytes();
    let presented = req
        .headers()
        .get(actix_web::http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .ok_or(ApiError::Unauthorized)?;
    if configured.is_empty() {
        return Err(ApiError::Forbidden);
    }
    if bool::from(presented.as_bytes().ct_eq(configured)) {
        Ok(Admin)
    } else {
        Err(ApiError::Forbidden)
    }
}

/// The intake's API clients: each token's SHA-256 and the client's name.
#[derive(Debug, Clone, Default)]
pub struct IntakeClients {
    /// Every request must carry a client's token (`http.intake_auth`).
    pub required: bool,
    digests: Vec<([u8; 32], String)>,
}

impl IntakeClients {
    #[must_use]
    pub fn new(config: &crate::config::HttpConfig) -> Self {
        let digests = config.clients.iter().filter_map(|c| Some((c.token_digest()?, c.name.clone()))).collect();
        Self { required: config.intake_auth, digests }
    }

    /// The client whose token is `token`. Every digest is compared, in constant time, so
    /// that the time taken tells nothing of which client came close.
    fn identify(&self, token: &str) -> Option<&str> {
        let presented: [u8; 32] = Sha256::digest(token.as_bytes()).into();
        let mut found = None;
        for (digest, name) in &self.digests {
            if bool::from(presented.ct_eq(digest)) {
                found = Some(name.as_str());
            }
        }
        found
    }
}

/// Present in an intake handler's arguments: who asks. The name of the API client whose
/// token the request carried, or empty for an anonymous request (allowed only when
/// `http.intake_auth` is off). Extracted before the body, so a refused request reads and
/// writes nothing.
#[derive(Debug)]
pub struct Caller(pub String);

impl FromRequest for Caller {
    type Error = ApiError;
    type Future = Ready<Result<Self, ApiError>>;

    fn from_request(req: &HttpRequest, _: &mut Payload) -> Self::Future {
        ready(identify(req))
    }
}

fn identify(req: &HttpRequest) -> Result<Caller, ApiError> {
    let state =
        req.app_data::<web::Data<AppState>>().ok_or_else(|| ApiError::Internal("intake state missing".into()))?;
    let clients = &state.clients;
    match req.headers().get(actix_web::http::header::AUTHORIZATION) {
        // No clients configured: the intake does not authenticate at all.
        _ if clients.digests.is_empty() && !clients.required => Ok(Caller(String::new())),
        None if !clients.required => Ok(Caller(String::new())),
        None => Err(ApiError::ClientUnauthorized),
        Some(value) => value
            .to_str()
            .ok()
            .and_then(|v| v.strip_prefix("Bearer "))
            .and_then(|token| clients.identify(token))
            .map(|name| Caller(name.to_owned()))
            .ok_or(ApiError::ClientUnauthorized),
    }
}

impl Caller {
    /// Whether this caller may see a record created by `client`: each caller sees its own
    /// records only, and an anonymous caller (no token, with `intake_auth` off) those made
    /// without one. (Seeing every record, it could read any client's transfers by the ids
    /// that `GET /accounts/{id}` lists.)
    #[must_use]
    pub fn may_see(&self, client: &str) -> bool {
        self.0 == client
    }
}
