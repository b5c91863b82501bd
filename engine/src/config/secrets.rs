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

/// A URL that may hold credentials (`user:password@`, `?password=`, `?token=`): it prints
/// itself (`Debug`, `Display`, `Serialize`) with them replaced by `<redacted>`
/// ([`SecretUrl::redacted`]). Only [`SecretUrl::expose`] gives the URL as configured.
#[derive(Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(transparent)]
pub struct SecretUrl(String);

impl SecretUrl {
    #[must_use]
    pub fn new(value: impl Into<String>) -> Self {
        Self(value.into())
    }

    /// The URL with its credentials. Call it only where the connection is made.
    #[must_use]
    pub fn expose(&self) -> &str {
        &self.0
    }

    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The URL with the password of its userinfo and the value of every query parameter
    /// whose name looks like a credential (holds `pass`, `pwd`, `secret`, `token`, `key`,
    /// `sig`, `auth` or `cred`, in any case) replaced by `<redacted>`; the user name, host,
    /// path and other parameters stay readable.
    #[must_use]
    pub fn redacted(&self) -> String {
        redact_url(&self.0)
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
///
/// Dotted names may also come nested (`TALLY__KAFKA__PRODUCER__SASL.PASSWORD` reaches the
/// loader as `sasl = { password = ... }`), and numbers or booleans unquoted: both are taken
/// as the dotted name and the value's text.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct ClientProperties(BTreeMap<String, String>);

impl<'de> Deserialize<'de> for ClientProperties {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Property {
            Text(String),
            Bool(bool),
            Int(i64),
            Float(f64),
            Nested(BTreeMap<String, Property>),
        }
        fn flatten(prefix: Option<&str>, map: BTreeMap<String, Property>, out: &mut BTreeMap<String, String>) {
            for (name, value) in map {
                let key = prefix.map_or_else(|| name.clone(), |p| format!("{p}.{name}"));
                let text = match value {
                    Property::Text(s) => s,
                    Property::Bool(b) => b.to_string(),
                    Property::Int(i) => i.to_string(),
                    Property::Float(f) => f.to_string(),
                    Property::Nested(inner) => {
                        flatten(Some(&key), inner, out);
                        continue;
                    }
                };
                out.insert(key, text);
            }
        }
        let mut out = BTreeMap::new();
        flatten(None, BTreeMap::deserialize(deserializer)?, &mut out);
        Ok(Self(out))
    }
}

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

/// Whether a URL query parameter named `name` looks like it holds a credential:
/// `password`, `sslpassword`, `token`, `access_token`, `api_key`, `key`, `sig`,
/// `signature`, `secret`, `auth`, `credentials`, ... (case-insensitive). It errs on the side
/// of hiding: `sslkey`, a file path, is hidden too.
fn is_secret_parameter(name: &str) -> bool {
    let name = name.to_ascii_lowercase();
    ["pass", "pwd", "secret", "token", "key", "sig", "auth", "cred"].iter().any(|part| name.contains(part))
}

fn redact_url(url: &str) -> String {
    // http://user:password@host/path -> http://user:<redacted>@host/path
    let mut shown = url.to_owned();
    if let Some((scheme, rest)) = url.split_once("://") {
        let authority_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
        if let Some(at) = rest[..authority_end].rfind('@') {
            if let Some((user, _)) = rest[..at].split_once(':') {
                shown = format!("{scheme}://{user}:{REDACTED}{}", &rest[at..]);
            }
        }
    }
    // ...?sslmode=require&password=secret#top -> ...?sslmode=require&password=<redacted>#top
    let (before_fragment, fragment) = match shown.split_once('#') {
        Some((url, fragment)) => (url, Some(fragment)),
        None => (shown.as_str(), None),
    };
    let Some((base, query)) = before_fragment.split_once('?') else { return shown };
    let params: Vec<String> = query
        .split('&')
        .map(|p| match p.split_once('=') {
            Some((k, _)) if is_secret_parameter(k) => format!("{k}={REDACTED}"),
            _ => p.to_owned(),
        })
        .collect();
    let mut redacted = format!("{base}?{}", params.join("&"));
    if let Some(fragment) = fragment {
        redacted.push('#');
        redacted.push_str(fragment);
    }
    redacted
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_show_everything_but_their_credentials() {
        for (url, shown) in [
            ("postgres://postgres@127.0.0.1:5432/tally", "postgres://postgres@127.0.0.1:5432/tally"),
            ("postgres://app:pw@db/tally?sslmode=require", "postgres://app:<redacted>@db/tally?sslmode=require"),
            (
                "postgres://app@db/tally?password=pw&sslmode=require",
                "postgres://app@db/tally?password=<redacted>&sslmode=require",
            ),
            ("http://u:p@ss@h:8080/hook", "http://u:<redacted>@h:8080/hook"),
            ("http://h/hook?token=t&x=1&API_KEY=k", "http://h/hook?token=<redacted>&x=1&API_KEY=<redacted>"),
            ("http://h/hook?sig=s#token=t", "http://h/hook?sig=<redacted>#token=t"),
            ("http://h/hook?flag", "http://h/hook?flag"),
            ("", ""),
        ] {
            assert_eq!(SecretUrl::new(url).redacted(), shown, "{url}");
        }
    }
}
