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

/// The intake's API clients: their names, each token's SHA-256 and whose it is.
#[derive(Debug, Clone, Default)]
pub struct IntakeClients {
    /// Every request must carry a client's token or certificate (`http.intake_auth`).
    pub required: bool,
    clients: Vec<Caller>,
    /// Each token's digest and the index of its client in `clients`.
    digests: Vec<([u8; 32], usize)>,
}

impl IntakeClients {
    #[must_use]
    pub fn new(config: &crate::config::HttpConfig) -> Self {
        let mut clients = Vec::new();
        let mut digests = Vec::new();
        for (index, client) in config.clients.iter().enumerate() {
            clients.push(Caller { name: client.name.clone(), adopts_anonymous: client.adopts_anonymous });
            digests.extend(client.token_digests().unwrap_or_default().into_iter().map(|d| (d, index)));
        }
        Self { required: config.intake_auth, clients, digests }
    }

    /// The client whose token is `token`. Every digest is compared, in constant time, so
    /// that the time taken tells nothing of which client came close.
    fn by_token(&self, token: &str) -> Option<&Caller> {
        let presented: [u8; 32] = Sha256::digest(token.as_bytes()).into();
        let mut found = None;
        for (digest, index) in &self.digests {
            if bool::from(presented.ct_eq(digest)) {
                found = self.clients.get(*index);
            }
        }
        found
    }

    /// The client named by a verified client certificate (its common name or one of its
    /// DNS names); none when it names no client, or more than one (which would depend on
    /// the order of the configuration).
    fn by_certificate(&self, peer: &super::tls::PeerNames) -> Option<&Caller> {
        let mut named = self.clients.iter().filter(|c| peer.0.contains(&c.name));
        let first = named.next()?;
        named.next().is_none().then_some(first)
    }
}

/// Present in an intake handler's arguments: who asks. The API client whose token the
/// request carried, or whose certificate the connection presented; or anonymous (an empty
/// name), allowed only when `http.intake_auth` is off. Extracted before the body, so a
/// refused request reads and writes nothing.
#[derive(Debug, Clone)]
pub struct Caller {
    pub name: String,
    /// Its idempotency keys also match those of anonymous requests (`adopts_anonymous`).
    pub adopts_anonymous: bool,
}

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
    let anonymous = Caller { name: String::new(), adopts_anonymous: false };
    // No clients configured: the intake does not authenticate at all.
    if clients.clients.is_empty() && !clients.required {
        return Ok(anonymous);
    }
    let by_token = match req.headers().get(actix_web::http::header::AUTHORIZATION) {
        None => None,
        Some(value) => Some(
            value
                .to_str()
                .ok()
                .and_then(|v| v.strip_prefix("Bearer "))
                .and_then(|token| clients.by_token(token))
                .ok_or(ApiError::ClientUnauthorized)?,
        ),
    };
    // A verified certificate that names no client (or two) is refused, not taken for an
    // anonymous caller: a renewed certificate with another name would otherwise move its
    // retries into the anonymous scope, where their keys are new.
    let by_certificate = match req.conn_data::<super::tls::PeerNames>() {
        None => None,
        Some(peer) => Some(clients.by_certificate(peer).ok_or(ApiError::ClientUnauthorized)?),
    };
    match (by_token, by_certificate) {
        // A token of one client over a connection of another: neither is believed.
        (Some(token), Some(cert)) if token.name != cert.name => Err(ApiError::ClientUnauthorized),
        (Some(caller), _) | (None, Some(caller)) => Ok(caller.clone()),
        (None, None) if clients.required => Err(ApiError::ClientUnauthorized),
        (None, None) => Ok(anonymous),
    }
}

impl Caller {
    /// Whether this caller may see a record created by `client`: each caller sees its own
    /// records only, and an anonymous caller (no token, with `intake_auth` off) those made
    /// without one; so does a client that adopts anonymous requests. (Seeing every record,
    /// it could read any client's transfers by the ids that `GET /accounts/{id}` lists.)
    #[must_use]
    pub fn may_see(&self, client: &str) -> bool {
        self.name == client || (self.adopts_anonymous && client.is_empty())
    }
}
