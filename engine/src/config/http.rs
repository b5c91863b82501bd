//! `[http]`: the intake and admin listeners.

use super::*;

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct HttpConfig {
    pub intake_addr: SocketAddr,
    pub admin_addr: SocketAddr,
    /// Bearer token of the admin endpoints that show record contents or change state.
    /// Empty: those endpoints are refused.
    pub admin_token: Secret,
    /// A file holding `admin_token` (a mounted secret).
    pub admin_token_file: String,
    /// Every intake request must carry the bearer token of an API client (`clients`);
    /// without it, or with a token no client has, the answer is 401 and nothing is
    /// written. Off: requests without a token are taken as anonymous ones (a request with
    /// a token still needs a valid one, and is recorded as its client's).
    pub intake_auth: bool,
    /// The intake's API clients (`[[http.clients]]`).
    pub clients: Vec<IntakeClientConfig>,
    /// HTTPS on the intake listener (`[http.tls]`), with optional client certificates.
    pub tls: ListenerTls,
    /// HTTPS on the admin listener (`[http.admin_tls]`).
    pub admin_tls: AdminTls,
    pub body_limit_bytes: usize,
    pub workers: usize,
    /// Most `POST /transfers` requests written in one database transaction: requests that
    /// arrive while the writers are busy are grouped, up to this many. 1 gives every
    /// request its own transaction.
    pub intake_batch_max: usize,
    /// Intake transactions in flight at once, each on its own connection.
    pub intake_writers: usize,
    /// The scopes of anonymous requests (`intake_auth` off), as one implicit owner holds
    /// every account they open. Unset: every scope when no API client is configured (a
    /// loopback-only development set-up), and every one but `issue` when clients are, so
    /// that only a named client mints money.
    pub anonymous_scopes: Option<Vec<String>>,
    /// Start with `intake_auth` off on an address that is not loopback, where anyone who
    /// reaches it may open accounts, issue money and move it. Refused unless set.
    pub insecure_anonymous_intake: bool,
    /// A request's headers and body must arrive within this, on either listener; past it
    /// the answer is 408 and the connection is closed.
    #[serde(rename = "request_timeout_ms", with = "super::duration::ms")]
    pub request_timeout: Duration,
    /// Open intake connections at most; past it new ones wait in the kernel's backlog.
    pub max_connections: usize,
    /// Open intake connections from one client address at most; past it a new one is
    /// closed at once.
    pub max_connections_per_address: usize,
    /// Open admin connections at most, apart from the intake's: a flooded intake leaves
    /// `/readyz` and `/metrics` answering.
    pub admin_max_connections: usize,
    /// Host names the admin listener answers besides IP literals and `localhost` (a
    /// browser's request under any other name is refused: DNS rebinding).
    pub admin_hosts: Vec<String>,
    /// Addresses (or CIDR blocks) of proxies in front of tally whose `X-Forwarded-For`
    /// names the client: its address then counts for the limits, the log and the backoff
    /// of failed authentication.
    pub trusted_proxies: Vec<String>,
}

impl Default for HttpConfig {
    fn default() -> Self {
        Self {
            intake_addr: SocketAddr::from(([127, 0, 0, 1], 8080)),
            admin_addr: SocketAddr::from(([127, 0, 0, 1], 9090)),
            admin_token: Secret::default(),
            admin_token_file: String::new(),
            intake_auth: false,
            clients: Vec::new(),
            tls: ListenerTls::default(),
            admin_tls: AdminTls::default(),
            body_limit_bytes: 16 * 1024,
            workers: 2,
            intake_batch_max: 128,
            intake_writers: 2,
            anonymous_scopes: None,
            insecure_anonymous_intake: false,
            request_timeout: Duration::from_millis(10_000),
            max_connections: 1_024,
            max_connections_per_address: 64,
            admin_max_connections: 256,
            admin_hosts: Vec::new(),
            trusted_proxies: Vec::new(),
        }
    }
}

impl HttpConfig {
    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        if self.intake_addr == self.admin_addr && self.intake_addr.port() != 0 {
            return invalid("http.admin_addr", "must differ from http.intake_addr");
        }
        if !(1..=16 * 1024 * 1024).contains(&self.body_limit_bytes) {
            return invalid("http.body_limit_bytes", "must be between 1 and 16777216");
        }
        if !(1..=64).contains(&self.workers) {
            return invalid("http.workers", "must be between 1 and 64");
        }
        if !(1..=1000).contains(&self.intake_batch_max) {
            return invalid("http.intake_batch_max", "must be between 1 and 1000");
        }
        if !(1..=64).contains(&self.intake_writers) {
            return invalid("http.intake_writers", "must be between 1 and 64");
        }
        self.tls.validate("http.tls")?;
        self.admin_tls.listener().validate("http.admin_tls")?;
        self.validate_clients()?;
        self.validate_edge()
    }
}

/// HTTPS on one listener: its certificate chain and key (PEM files, read again on SIGHUP
/// and when they change), and on the intake, the roots that client certificates must
/// chain to. No certificate: plain HTTP.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ListenerTls {
    /// PEM certificate chain, the listener's own first. Empty: plain HTTP.
    pub cert_file: String,
    /// PEM private key (PKCS#8, PKCS#1 or SEC1) of the first certificate.
    pub key_file: String,
    /// PEM roots that client certificates must chain to. Empty: none asked for.
    pub client_ca_file: String,
    /// With `client_ca_file`: whether a client without a certificate is refused in the
    /// handshake (`required`) or served (`optional`, and then authenticated otherwise).
    pub client_cert: ClientCert,
}

/// Whether the intake's TLS handshake requires a client certificate.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ClientCert {
    #[default]
    Optional,
    Required,
}

impl ListenerTls {
    /// Whether the listener serves HTTPS.
    #[must_use]
    pub fn enabled(&self) -> bool {
        !self.cert_file.is_empty()
    }

    fn validate(&self, section: &'static str) -> Result<(), ConfigError> {
        let key = |field: &str| -> &'static str {
            match (section, field) {
                ("http.tls", "cert_file") => "http.tls.cert_file",
                ("http.tls", "key_file") => "http.tls.key_file",
                ("http.tls", _) => "http.tls.client_ca_file",
                (_, "cert_file") => "http.admin_tls.cert_file",
                _ => "http.admin_tls.key_file",
            }
        };
        if self.cert_file.is_empty() != self.key_file.is_empty() {
            let missing = if self.cert_file.is_empty() { "cert_file" } else { "key_file" };
            return invalid(key(missing), "must be set with the other of cert_file and key_file");
        }
        if !self.enabled() && !self.client_ca_file.is_empty() {
            return invalid(key("client_ca_file"), "needs cert_file and key_file: client certificates need TLS");
        }
        Ok(())
    }
}

/// HTTPS on the admin listener: its certificate chain and key (PEM files, read again on
/// SIGHUP and when they change). No certificate: plain HTTP.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AdminTls {
    /// PEM certificate chain, the listener's own first. Empty: plain HTTP.
    pub cert_file: String,
    /// PEM private key (PKCS#8, PKCS#1 or SEC1) of the first certificate.
    pub key_file: String,
}

impl AdminTls {
    /// Whether the listener serves HTTPS.
    #[must_use]
    pub fn enabled(&self) -> bool {
        !self.cert_file.is_empty()
    }

    /// As a listener's TLS settings, without client certificates.
    #[must_use]
    pub fn listener(&self) -> ListenerTls {
        ListenerTls { cert_file: self.cert_file.clone(), key_file: self.key_file.clone(), ..ListenerTls::default() }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use figment::providers::{Format, Serialized, Toml};
    use figment::Figment;

    fn with(toml: &str) -> Result<Config, ConfigError> {
        let figment = Figment::from(Serialized::defaults(Config::default())).merge(Toml::string(toml));
        Config::from_figment(&figment)
    }

    #[test]
    fn intake_clients_are_validated_by_key() {
        let digest = "0".repeat(64);
        let client =
            |name: &str, digest: &str| format!("[[http.clients]]\nname = \"{name}\"\ntoken_sha256 = \"{digest}\"\n");
        with(&format!("[http]\nintake_auth = true\n{}", client("shop", &digest))).unwrap();
        // Several digests (a rotation), or none for a client known by its certificate.
        let c = with(&format!(
            "[http]\nintake_auth = true\n[http.tls]\ncert_file = \"c.pem\"\nkey_file = \"k.pem\"\n\
             client_ca_file = \"ca.pem\"\nclient_cert = \"required\"\n\
             [[http.clients]]\nname = \"shop\"\ntoken_sha256 = [\"{digest}\", \"{}\"]\nadopts_anonymous = true\n\
             [[http.clients]]\nname = \"market\"",
            "1".repeat(64)
        ))
        .unwrap();
        assert_eq!(c.http.clients[0].token_digests().map(|d| d.len()), Some(2));
        assert!(c.http.clients[0].adopts_anonymous);
        assert_eq!(c.http.tls.client_cert, ClientCert::Required);
        let shown = c.to_redacted_toml();
        for key in [
            "[http.tls]",
            "cert_file = \"c.pem\"",
            "client_ca_file = \"ca.pem\"",
            "client_cert = \"required\"",
            "[http.admin_tls]",
            "adopts_anonymous = true",
        ] {
            assert!(shown.contains(key), "`tally config` shows {key}: {shown}");
        }
        for (toml, key) in [
            ("[http]\nintake_auth = true".to_owned(), "http.intake_auth"),
            (client("sh op", &digest), "http.clients.name"),
            (format!("{}{}", client("shop", &digest), client("shop", &digest)), "http.clients.name"),
            (client("shop", "not-hex"), "http.clients.token_sha256"),
            (client("shop", &"0".repeat(63)), "http.clients.token_sha256"),
            (
                format!("[[http.clients]]\nname = \"shop\"\ntoken_sha256 = [\"{digest}\", \"x\"]"),
                "http.clients.token_sha256",
            ),
            // No token and no client certificates: a client no one can be.
            ("[[http.clients]]\nname = \"shop\"".to_owned(), "http.clients.token_sha256"),
            (
                format!(
                    "[[http.clients]]\nname = \"a\"\ntoken_sha256 = \"{digest}\"\nadopts_anonymous = true\n\
                     [[http.clients]]\nname = \"b\"\ntoken_sha256 = \"{digest}\"\nadopts_anonymous = true"
                ),
                "http.clients.adopts_anonymous",
            ),
            ("[http.tls]\ncert_file = \"c.pem\"".to_owned(), "http.tls.key_file"),
            ("[http.admin_tls]\nkey_file = \"k.pem\"".to_owned(), "http.admin_tls.cert_file"),
            ("[http.tls]\nclient_ca_file = \"ca.pem\"".to_owned(), "http.tls.client_ca_file"),
            ("[http.tls]\nclient_cert = \"sometimes\"".to_owned(), "client_cert"),
        ] {
            let e = with(&toml).unwrap_err().to_string();
            assert!(e.contains(key), "{toml}: {e}");
        }
    }
}
