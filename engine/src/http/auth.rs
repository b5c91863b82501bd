//! Who asks, on both listeners.
//!
//! The admin listener: bearer-token authorization of the endpoints that show records or
//! change state ([`Admin`]); a missing token is 401, a wrong one 403, compared in constant
//! time. With no token configured those endpoints are refused (403): an admin listener is
//! never open by omission.
//!
//! The intake: its API clients ([`Caller`]). A token or certificate that names no client
//! is 401; with `http.intake_auth` on, so is a request without one. Each caller holds
//! scopes; what it may do with them is `tally_actors::authority`'s to decide.
//!
//! On both, a presented credential that names no one counts against the client's address
//! ([`super::auth_guard`]): past a few, the address waits, answered 429 unread.

use std::net::IpAddr;

use actix_web::dev::Payload;
use actix_web::{FromRequest, HttpRequest};
use futures_util::future::{ready, Ready};
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;
use tally_actors::authority::{Principal, Scope, Scopes};

use super::edge::{client_addr, client_label, state};
use super::error::ApiError;

/// Present in a handler's arguments: the request carried the admin token. Says who (the
/// token's name) and from where, for the audit log.
#[derive(Debug, Clone)]
pub struct Admin {
    /// The admin token's name: `admin` (there is one token, `http.admin_token`).
    pub name: &'static str,
    /// The client's address.
    pub from: String,
}

impl Admin {
    /// Logs `action` (with `detail`) as done by this admin, to the `tally::audit` target.
    pub fn audit(&self, action: &str, detail: &str) {
        tracing::info!(target: "tally::audit", actor = self.name, from = %self.from, action, detail, "Admin action.");
    }
}

impl FromRequest for Admin {
    type Error = ApiError;
    type Future = Ready<Result<Self, ApiError>>;

    fn from_request(req: &HttpRequest, _: &mut Payload) -> Self::Future {
        ready(check(req))
    }
}

/// The request's one `Authorization` header, if any. Two or more are refused (400): which
/// one a proxy or another server would take is anybody's guess, and a credential must not
/// depend on it.
fn authorization(req: &HttpRequest) -> Result<Option<&actix_web::http::header::HeaderValue>, ApiError> {
    let mut all = req.headers().get_all(actix_web::http::header::AUTHORIZATION);
    let first = all.next();
    if all.next().is_some() {
        return Err(ApiError::BadRequest("The request has more than one Authorization header".into()));
    }
    Ok(first)
}

fn check(req: &HttpRequest) -> Result<Admin, ApiError> {
    let state = state(req)?;
    let configured = state.admin_token.expose().as_bytes();
    let presented = authorization(req)?
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .ok_or(ApiError::Unauthorized)?;
    let addr = client_addr(req);
    wait_out(&state.admin_guard, addr, &state.metrics)?;
    if configured.is_empty() {
        return Err(ApiError::Forbidden);
    }
    if bool::from(presented.as_bytes().ct_eq(configured)) {
        state.admin_guard.succeeded(addr);
        Ok(Admin { name: "admin", from: client_label(req) })
    } else {
        state.admin_guard.failed(addr, "admin token", &state.metrics);
        Err(ApiError::Forbidden)
    }
}

/// `Err(429)` while `addr` waits after failed authentications.
fn wait_out(
    guard: &super::auth_guard::AuthGuard,
    addr: Option<IpAddr>,
    metrics: &tally_actors::Metrics,
) -> Result<(), ApiError> {
    guard.check(addr, metrics).map_err(|wait| ApiError::TooManyFailures { retry_after_secs: wait.as_secs().max(1) })
}

/// The intake's API clients: their names and scopes, each token's SHA-256 and whose it is.
#[derive(Debug, Clone, Default)]
pub struct IntakeClients {
    /// Every request must carry a client's token or certificate (`http.intake_auth`).
    pub required: bool,
    clients: Vec<Caller>,
    /// Each token's digest and the index of its client in `clients`.
    digests: Vec<([u8; 32], usize)>,
    /// What anonymous requests may do (`http.anonymous_scopes`).
    anonymous: Scopes,
}

impl IntakeClients {
    #[must_use]
    pub fn new(config: &crate::config::HttpConfig) -> Self {
        let mut clients = Vec::new();
        let mut digests = Vec::new();
        for (index, client) in config.clients.iter().enumerate() {
            let principal = Principal {
                name: client.name.clone(),
                scopes: client.scopes().unwrap_or_default(),
                adopts_anonymous: client.adopts_anonymous,
            };
            clients.push(Caller(principal));
            digests.extend(client.token_digests().unwrap_or_default().into_iter().map(|d| (d, index)));
        }
        Self { required: config.intake_auth, clients, digests, anonymous: config.anonymous_scopes() }
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
        let mut named = self.clients.iter().filter(|c| peer.0.contains(&c.0.name));
        let first = named.next()?;
        named.next().is_none().then_some(first)
    }

    /// The log line of each client at start: its name, scopes and token fingerprints (the
    /// first 8 hexadecimal digits of each digest), so that a token rotation shows in the
    /// audit log.
    pub fn log(&self) {
        for (index, caller) in self.clients.iter().enumerate() {
            let tokens: Vec<String> =
                self.digests.iter().filter(|(_, i)| *i == index).map(|(d, _)| hex::encode(&d[..4])).collect();
            tracing::info!(target: "tally::audit", client = %caller.0.name, scopes = ?caller.0.scopes.names(),
                           tokens = ?tokens, "API client configured.");
        }
    }
}

/// Present in an intake handler's arguments: who asks. The API client whose token the
/// request carried, or whose certificate the connection presented; or the anonymous scope
/// (an empty name), allowed only when `http.intake_auth` is off. Extracted before the
/// body, so a refused request reads and writes nothing.
#[derive(Debug, Clone)]
pub struct Caller(pub Principal);

impl std::ops::Deref for Caller {
    type Target = Principal;

    fn deref(&self) -> &Principal {
        &self.0
    }
}

impl FromRequest for Caller {
    type Error = ApiError;
    type Future = Ready<Result<Self, ApiError>>;

    fn from_request(req: &HttpRequest, _: &mut Payload) -> Self::Future {
        ready(identify(req))
    }
}

fn identify(req: &HttpRequest) -> Result<Caller, ApiError> {
    let state = state(req)?;
    let token = authorization(req)?;
    let clients = &state.clients;
    let anonymous = Caller(Principal::anonymous(clients.anonymous));
    // No clients configured: the intake does not authenticate at all.
    if clients.clients.is_empty() && !clients.required {
        return Ok(anonymous);
    }
    let addr = client_addr(req);
    let certificate = req.conn_data::<super::tls::PeerNames>();
    if token.is_some() || certificate.is_some() {
        wait_out(&state.intake_guard, addr, &state.metrics)?;
    }
    let failed = |what: &str| {
        state.intake_guard.failed(addr, what, &state.metrics);
        ApiError::ClientUnauthorized
    };
    let by_token = match token {
        None => None,
        Some(value) => Some(
            value
                .to_str()
                .ok()
                .and_then(|v| v.strip_prefix("Bearer "))
                .and_then(|token| clients.by_token(token))
                .ok_or_else(|| failed("client token"))?,
        ),
    };
    // A verified certificate that names no client (or two) is refused, not taken for an
    // anonymous caller: a renewed certificate with another name would otherwise move its
    // retries into the anonymous scope, where their keys are new.
    let by_certificate = match certificate {
        None => None,
        Some(peer) => Some(clients.by_certificate(peer).ok_or_else(|| failed("client certificate"))?),
    };
    let caller = match (by_token, by_certificate) {
        // A token of one client over a connection of another: neither is believed.
        (Some(token), Some(cert)) if token.0.name != cert.0.name => return Err(failed("token and certificate")),
        (Some(caller), _) | (None, Some(caller)) => caller.clone(),
        (None, None) if clients.required => return Err(ApiError::ClientUnauthorized),
        (None, None) => return Ok(anonymous),
    };
    state.intake_guard.succeeded(addr);
    Ok(caller)
}

impl Caller {
    /// `Ok` when the caller holds `scope`; else 403 naming it.
    ///
    /// # Errors
    /// [`ApiError::Refused`] with code `scope_missing`.
    pub fn require(&self, scope: Scope) -> Result<(), ApiError> {
        if self.may(scope) {
            Ok(())
        } else {
            Err(ApiError::Refused {
                code: "scope_missing",
                message: format!("This needs the `{scope}` scope, which {} does not hold", self.who()),
            })
        }
    }

    /// Whether this caller may see a record created by `client` (an order, or a transfer
    /// by its creator alone): its own, and an adopting client also the anonymous ones.
    #[must_use]
    pub fn may_see(&self, client: &str) -> bool {
        self.owns(client)
    }

    /// The caller for messages and the audit log: `client <name>`, or `the anonymous
    /// caller`.
    #[must_use]
    pub fn who(&self) -> String {
        if self.0.name.is_empty() {
            "the anonymous caller".to_owned()
        } else {
            format!("client {}", self.0.name)
        }
    }
}
