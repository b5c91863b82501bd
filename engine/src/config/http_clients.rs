//! `[[http.clients]]`: the intake's API clients, with what each may do (scopes), and the
//! scopes of anonymous requests (`http.anonymous_scopes`).

use tally_actors::authority::{Scope, Scopes};

use super::*;

/// What a list of scopes must be made of, for error messages.
const SCOPES_ARE: &str = "names a scope that does not exist: each must be one of `accounts:open`, \
    `transfers:create`, `orders:create`, `read`, `issue`";

/// The scopes named by `names`; `None` when one is no scope.
fn parse_scopes(names: &[String]) -> Option<Scopes> {
    names.iter().map(|n| Scope::parse(n.trim())).collect::<Option<Vec<_>>>().map(|s| s.into_iter().collect())
}

impl HttpConfig {
    /// The scopes of anonymous requests (when the intake does not authenticate): as
    /// configured, else every one without API clients and every one but `issue` with them.
    #[must_use]
    pub fn anonymous_scopes(&self) -> Scopes {
        match &self.anonymous_scopes {
            Some(names) => parse_scopes(names).unwrap_or_default(),
            None if self.clients.is_empty() => Scopes::all(),
            None => Scopes::ordinary(),
        }
    }

    pub(super) fn validate_clients(&self) -> Result<(), ConfigError> {
        if self.intake_auth && self.clients.is_empty() {
            return invalid("http.intake_auth", "is on, and http.clients names no API client");
        }
        if self.clients.iter().filter(|c| c.adopts_anonymous).count() > 1 {
            return invalid(
                "http.clients.adopts_anonymous",
                "is set on more than one client: anonymous requests were one caller's",
            );
        }
        let mut names = std::collections::HashSet::new();
        for client in &self.clients {
            let name = &client.name;
            let good = (1..=64).contains(&name.len())
                && name.bytes().all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b));
            if !good {
                return invalid(
                    "http.clients.name",
                    format!("`{name}` is not 1 to 64 of A-Z, a-z, 0-9, `.`, `_`, `-`"),
                );
            }
            if !names.insert(name) {
                return invalid("http.clients.name", format!("`{name}` names two clients"));
            }
            if client.token_digests().is_none() {
                return invalid(
                    "http.clients.token_sha256",
                    format!("of client `{name}` must be SHA-256 digests of its tokens, 64 hexadecimal digits each"),
                );
            }
            if client.scopes().is_none() {
                return invalid("http.clients.scopes", format!("of client `{name}` {}", SCOPES_ARE));
            }
            if client.token_sha256.is_empty() && self.tls.client_ca_file.is_empty() {
                return invalid(
                    "http.clients.token_sha256",
                    format!("of client `{name}` is empty: without http.tls.client_ca_file a client needs a token"),
                );
            }
        }
        if self.anonymous_scopes.as_deref().is_some_and(|names| parse_scopes(names).is_none()) {
            return invalid("http.anonymous_scopes", SCOPES_ARE);
        }
        Ok(())
    }
}

/// One API client of the intake: its name, recorded with every transfer and order it
/// creates and scoping its idempotency keys, and the SHA-256 of each of its bearer tokens
/// (the tokens themselves are stored nowhere). Several digests at once let a token be
/// rotated without a gap: add the new one, move the caller, remove the old one. A client
/// may also be known by its TLS client certificate, whose common name or a DNS name of
/// which is the client's `name` (with `http.tls.client_ca_file`).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct IntakeClientConfig {
    pub name: String,
    /// Hexadecimal SHA-256 of the client's bearer token, e.g. from
    /// `printf %s "$TOKEN" | sha256sum`: one, or a list of them.
    #[serde(deserialize_with = "one_or_many")]
    pub token_sha256: Vec<Secret>,
    /// A file holding `token_sha256`, one digest a line (a mounted secret).
    pub token_sha256_file: String,
    /// Requests of this client also replay the transfers and orders that anonymous
    /// requests made with the same `Idempotency-Key` or `externalReference`, and it owns
    /// the accounts anonymous requests opened: turn it on for the caller that sent
    /// anonymous requests before `intake_auth` was turned on, so that its retries across
    /// the cut-over do not apply twice and its accounts stay its own.
    pub adopts_anonymous: bool,
    /// What it may do (`accounts:open`, `transfers:create`, `orders:create`, `read`,
    /// `issue`). Absent: every scope but `issue`, which creates money.
    pub scopes: Option<Vec<String>>,
}

impl IntakeClientConfig {
    /// Its scopes (every one but `issue` when the configuration names none); `None` when a
    /// name is no scope.
    #[must_use]
    pub fn scopes(&self) -> Option<Scopes> {
        self.scopes.as_ref().map_or(Some(Scopes::ordinary()), |names| parse_scopes(names))
    }

    /// The SHA-256 of each token, when every `token_sha256` is 64 hexadecimal digits.
    #[must_use]
    pub fn token_digests(&self) -> Option<Vec<[u8; 32]>> {
        self.token_sha256
            .iter()
            .map(|hex_digest| {
                let mut digest = [0u8; 32];
                hex::decode_to_slice(hex_digest.expose().trim(), &mut digest).ok()?;
                Some(digest)
            })
            .collect()
    }
}

/// A string or a list of strings, as secrets.
fn one_or_many<'de, D: serde::Deserializer<'de>>(deserializer: D) -> Result<Vec<Secret>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum OneOrMany {
        One(String),
        Many(Vec<String>),
    }
    Ok(match OneOrMany::deserialize(deserializer)? {
        OneOrMany::One(one) if one.is_empty() => Vec::new(),
        OneOrMany::One(one) => vec![Secret::new(one)],
        OneOrMany::Many(many) => many.into_iter().map(Secret::new).collect(),
    })
}
