//! Values that must never print: secrets, URLs with passwords, and librdkafka
//! pass-through properties whose values may be credentials.

use super::*;

/// A secret value (a token, a key): it prints itself as `<redacted>` in `Debug`, `Display`
/// and `Serialize` (so `tally config` and logs never show it), and as an empty string when
/// unset. Only [`Secret::expose`] gives the value, where it is used.
#[derive(Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(transparent)]
pub struct Secret(String);

/// What a set secret prints as.
pub const REDACTED: &str = "<redacted>";

impl Secret {
    #[must_use]
    pub fn new(value: impl Into<String>) -> Self {
        Self(value.into())
    }

    /// The secret itself. Call it only where the value is used, never to log it.
    #[must_use]
    pub fn expose(&self) -> &str {
        &self.0
    }

    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    fn shown(&self) -> &'static str {
        if self.0.is_empty() {
            ""
        } else {
            REDACTED
        }
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Secret({})", self.shown())
    }
}

impl fmt::Display for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.shown())
    }
}

impl Serialize for Secret {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.shown())
    }
}

/// A connection URL that may hold a password (`user:password@`, `?password=`): it prints
/// itself (`Debug`, `Display`, `Serialize`) with the password replaced by `<redacted>`.
/// Only [`SecretUrl::expose`] gives the URL as configured.
#[derive(Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(transparent)]
pub struct SecretUrl(String);

impl SecretUrl {
    #[must_use]
    pub fn new(value: impl Into<String>) -> Self {
        Self(value.into())
    }

    /// The URL with its password. Call it only where the connection is made.
    #[must_use]
    pub fn expose(&self) -> &str {
        &self.0
    }

    /// The URL with any password replaced by `<redacted>`.
    #[must_use]
    pub fn redacted(&self) -> String {
        redact_url_password(&self.0)
    }
}

impl fmt::Debug for SecretUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "SecretUrl({})", self.redacted())
    }
}

impl fmt::Display for SecretUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.redacted())
    }
}

impl Serialize for SecretUrl {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&self.redacted())
    }
}

/// librdkafka properties passed through to a client. Values of properties that hold
/// credentials (`sasl.password`, `ssl.key.password`, `ssl.key.pem`, `*.secret`, JAAS and
/// OAuth configs, ...) print as `<redacted>` in `Debug` and `Serialize`.
#[derive(Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(transparent)]
pub struct ClientProperties(BTreeMap<String, String>);

impl ClientProperties {
    /// Whether librdkafka property `key` holds a credential.
    #[must_use]
    pub fn is_secret_key(key: &str) -> bool {
        let key = key.to_ascii_lowercase();
        ["password", "secret", "ssl.key.pem", "sasl.jaas.config", "sasl.oauthbearer.config", "token"]
            .iter()
            .any(|part| key.contains(part))
    }

    fn shown(&self) -> BTreeMap<&str, &str> {
        self.0.iter().map(|(k, v)| (k.as_str(), if Self::is_secret_key(k) { REDACTED } else { v.as_str() })).collect()
    }
}

impl std::ops::Deref for ClientProperties {
    type Target = BTreeMap<String, String>;

    fn deref(&self) -> &Self::Target {
        &self.0
    }
}

impl std::ops::DerefMut for ClientProperties {
    fn deref_mut(&mut self) -> &mut Self::Target {
        &mut self.0
    }
}

impl<'a> IntoIterator for &'a ClientProperties {
    type Item = (&'a String, &'a String);
    type IntoIter = std::collections::btree_map::Iter<'a, String, String>;

    fn into_iter(self) -> Self::IntoIter {
        self.0.iter()
    }
}

impl fmt::Debug for ClientProperties {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_map().entries(self.shown()).finish()
    }
}

impl Serialize for ClientProperties {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        self.shown().serialize(serializer)
    }
}

pub(super) fn redact_url_password(url: &str) -> String {
    // postgres://user:password@host/db -> postgres://user:<redacted>@host/db
    let mut shown = url.to_owned();
    if let Some((scheme, rest)) = url.split_once("://") {
        let authority_end = rest.find(['/', '?']).unwrap_or(rest.len());
        if let Some(at) = rest[..authority_end].rfind('@') {
            if let Some((user, _)) = rest[..at].split_once(':') {
                shown = format!("{scheme}://{user}:{REDACTED}{}", &rest[at..]);
            }
        }
    }
    // ...?password=secret&... -> ...?password=<redacted>&...
    match shown.split_once('?') {
        Some((base, query)) => {
            let params: Vec<String> = query
                .split('&')
                .map(|p| match p.split_once('=') {
                    Some((k, _)) if k.eq_ignore_ascii_case("password") => format!("{k}={REDACTED}"),
                    _ => p.to_owned(),
                })
                .collect();
            format!("{base}?{}", params.join("&"))
        }
        None => shown,
    }
}
