//! How tally reaches PostgreSQL: a [`PgConnector`] made once from the database URL, used by
//! the pools, the outbox's LISTEN connection and the migrations alike. TLS is rustls, with
//! libpq's `sslmode` meanings:
//!
//! | `sslmode` | TLS | server certificate |
//! |---|---|---|
//! | `disable` | never | - |
//! | `prefer` (the default) | when the server offers it | not checked |
//! | `require` | always | not checked; checked like `verify-ca` when `sslrootcert` is given |
//! | `verify-ca` | always | signed by a root of `sslrootcert` |
//! | `verify-full` | always | signed by a root of `sslrootcert` and naming the host |
//!
//! `sslrootcert` is a PEM file of root certificates, or `system` for the system's store.
//! `sslcert` and `sslkey` (PEM files) present a client certificate. tokio-postgres knows
//! none of these parameters but `sslmode`, and that only up to `require`: they are taken out
//! of the URL here and the rest is handed to it as it is.

use std::fmt;
use std::sync::Arc;

use diesel::ConnectionError;
use diesel_async::AsyncPgConnection;
use rustls::client::WebPkiServerVerifier;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::PrivateKeyDer;
use rustls::ClientConfig;
use tokio_postgres::config::SslMode;
use tokio_postgres::{Client, Connection, Socket};
use tokio_postgres_rustls::MakeRustlsConnect;

use super::tls::{read_certs, root_store, AnyCertificate, AnyName};

/// The TLS stream of a connection ([`PgConnector::connect`]).
pub type TlsStream = <MakeRustlsConnect as tokio_postgres::tls::MakeTlsConnect<Socket>>::Stream;

use super::tls::bad;
pub use super::tls::ConnectConfigError;

/// What `sslmode` asks of the server's certificate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verify {
    /// Any certificate (`disable`, `prefer`, `require` without `sslrootcert`).
    Nothing,
    /// Signed by a trusted root (`verify-ca`, `require` with `sslrootcert`).
    Chain,
    /// Signed by a trusted root and naming the host (`verify-full`).
    ChainAndName,
}

/// Where and how to connect: the URL's parameters for tokio-postgres, and the TLS set-up.
#[derive(Clone)]
pub struct PgConnector {
    config: tokio_postgres::Config,
    tls: MakeRustlsConnect,
    verify: Verify,
}

impl fmt::Debug for PgConnector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PgConnector")
            .field("hosts", &self.config.get_hosts())
            .field("ssl_mode", &self.config.get_ssl_mode())
            .field("verify", &self.verify)
            .finish_non_exhaustive()
    }
}

impl PgConnector {
    /// Parses `url` (a `postgres://` URL) and reads the files it names.
    ///
    /// # Errors
    /// An unknown `sslmode`, a `verify-*` mode without `sslrootcert`, an unreadable or empty
    /// certificate file, or a URL tokio-postgres refuses.
    pub fn from_url(url: &str) -> Result<Self, ConnectConfigError> {
        let (rest, tls) = TlsParams::take(url)?;
        let mut config: tokio_postgres::Config =
            rest.parse().map_err(|e| bad(format!("not a valid PostgreSQL URL: {e}")))?;
        config.ssl_mode(tls.ssl_mode()?);
        let verify = tls.verify()?;
        let client = tls.client_config(verify)?;
        Ok(Self { config, tls: MakeRustlsConnect::new(client), verify })
    }

    /// The parsed connection parameters (host, database, user, ...).
    #[must_use]
    pub fn config(&self) -> &tokio_postgres::Config {
        &self.config
    }

    /// The same server and TLS set-up, database `name`.
    #[must_use]
    pub fn with_dbname(&self, name: &str) -> Self {
        let mut other = self.clone();
        other.config.dbname(name);
        other
    }

    /// What is checked of the server's certificate.
    #[must_use]
    pub fn verify(&self) -> Verify {
        self.verify
    }

    /// Opens a connection; the caller drives the returned [`Connection`].
    ///
    /// # Errors
    /// When the server is unreachable, refuses TLS that the mode requires, presents a
    /// certificate that fails the check, or refuses the login.
    pub async fn connect(&self) -> Result<(Client, Connection<Socket, TlsStream>), tokio_postgres::Error> {
        self.config.connect(self.tls.clone()).await
    }

    /// Opens a diesel connection (driven by a task of the current runtime).
    ///
    /// # Errors
    /// As [`PgConnector::connect`].
    pub async fn establish(&self) -> Result<AsyncPgConnection, ConnectionError> {
        let (client, connection) = self.connect().await.map_err(|e| ConnectionError::BadConnection(e.to_string()))?;
        AsyncPgConnection::try_from_client_and_connection(client, connection).await
    }
}

/// `url` as `postgres://user@host:port/database`, for messages: no password, no parameters.
#[must_use]
pub fn describe(url: &str) -> String {
    let Ok((rest, _)) = TlsParams::take(url) else { return "<invalid url>".into() };
    let Ok(c) = rest.parse::<tokio_postgres::Config>() else { return "<invalid url>".into() };
    let host = match c.get_hosts().first() {
        Some(tokio_postgres::config::Host::Tcp(h)) => h.clone(),
        Some(tokio_postgres::config::Host::Unix(p)) => p.display().to_string(),
        None => String::new(),
    };
    let port = c.get_ports().first().copied().unwrap_or(5432);
    // An IPv6 address is written in brackets, so that its port stays readable.
    let host = if host.contains(':') { format!("[{host}]") } else { host };
    format!("postgres://{}@{host}:{port}/{}", c.get_user().unwrap_or(""), c.get_dbname().unwrap_or(""))
}

/// The TLS parameters of a URL, taken out of it.
#[derive(Debug, Default)]
struct TlsParams {
    mode: Option<String>,
    root_cert: Option<String>,
    cert: Option<String>,
    key: Option<String>,
}

impl TlsParams {
    /// `url` without `sslmode`, `sslrootcert`, `sslcert` and `sslkey`, and their values.
    fn take(url: &str) -> Result<(String, Self), ConnectConfigError> {
        let (before_fragment, fragment) = match url.split_once('#') {
            Some((u, f)) => (u, Some(f)),
            None => (url, None),
        };
        let Some((base, query)) = before_fragment.split_once('?') else { return Ok((url.to_owned(), Self::default())) };
        let mut params = Self::default();
        let mut kept = Vec::new();
        for pair in query.split('&').filter(|p| !p.is_empty()) {
            let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
            let value = percent_encoding::percent_decode_str(value)
                .decode_utf8()
                .map_err(|_| bad(format!("the value of `{key}` is not UTF-8")))?
                .into_owned();
            match key {
                "sslmode" => params.mode = Some(value),
                "sslrootcert" => params.root_cert = Some(value),
                "sslcert" => params.cert = Some(value),
                "sslkey" => params.key = Some(value),
                _ => kept.push(pair),
            }
        }
        let mut rest = if kept.is_empty() { base.to_owned() } else { format!("{base}?{}", kept.join("&")) };
        if let Some(fragment) = fragment {
            rest.push('#');
            rest.push_str(fragment);
        }
        Ok((rest, params))
    }

    fn mode(&self) -> &str {
        self.mode.as_deref().unwrap_or("prefer")
    }

    fn ssl_mode(&self) -> Result<SslMode, ConnectConfigError> {
        match self.mode() {
            "disable" => Ok(SslMode::Disable),
            "prefer" => Ok(SslMode::Prefer),
            "require" | "verify-ca" | "verify-full" => Ok(SslMode::Require),
            other => {
                Err(bad(format!("sslmode `{other}` is not one of disable, prefer, require, verify-ca, verify-full")))
            }
        }
    }

    fn verify(&self) -> Result<Verify, ConnectConfigError> {
        match (self.mode(), &self.root_cert) {
            ("verify-ca" | "verify-full", None) => Err(bad(format!(
                "sslmode {} needs sslrootcert: a PEM file of the roots that sign the server's certificate, or \
                 `system`",
                self.mode()
            ))),
            ("verify-full", Some(_)) => Ok(Verify::ChainAndName),
            // Any certificate a public authority issued, for any name, would pass: as libpq
            // (16+), the system's roots go with verify-full only.
            ("verify-ca" | "require", Some(root)) if root == "system" => Err(bad(format!(
                "sslrootcert=system needs sslmode verify-full (with {}, any publicly issued certificate would pass)",
                self.mode()
            ))),
            ("verify-ca" | "require", Some(_)) => Ok(Verify::Chain),
            // Roots given but a mode that would check nothing (and fall back to plain text):
            // say so rather than let an operator believe the server is verified.
            ("prefer" | "disable", Some(_)) => Err(bad(format!(
                "sslrootcert is set but sslmode is {}, which checks no certificate: set sslmode to verify-full \
                 (or verify-ca)",
                self.mode()
            ))),
            _ => Ok(Verify::Nothing),
        }
    }

    fn client_config(&self, verify: Verify) -> Result<ClientConfig, ConnectConfigError> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = ClientConfig::builder_with_provider(Arc::clone(&provider))
            .with_safe_default_protocol_versions()
            .map_err(|e| bad(format!("TLS set-up: {e}")))?;
        let builder = match (verify, &self.root_cert) {
            (Verify::Nothing, _) | (_, None) => {
                builder.dangerous().with_custom_certificate_verifier(Arc::new(AnyCertificate(provider)))
            }
            (Verify::ChainAndName, Some(roots)) => builder.with_root_certificates(root_store(roots)?),
            (Verify::Chain, Some(roots)) => {
                let inner = WebPkiServerVerifier::builder_with_provider(Arc::new(root_store(roots)?), provider)
                    .build()
                    .map_err(|e| bad(format!("sslrootcert {roots}: {e}")))?;
                builder.dangerous().with_custom_certificate_verifier(Arc::new(AnyName(inner)))
            }
        };
        match (&self.cert, &self.key) {
            (None, None) => Ok(builder.with_no_client_auth()),
            (Some(cert), Some(key)) => {
                let chain = read_certs("sslcert", cert)?;
                let key = PrivateKeyDer::from_pem_file(key).map_err(|e| bad(format!("sslkey {key}: {e}")))?;
                builder.with_client_auth_cert(chain, key).map_err(|e| bad(format!("sslcert/sslkey: {e}")))
            }
            _ => Err(bad("sslcert and sslkey go together")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tls_parameters_leave_the_url_and_the_rest_stays() {
        let (rest, p) = TlsParams::take(
            "postgres://u:p@h:5433/db?sslmode=verify-ca&application_name=x&sslrootcert=%2Fetc%2Fca.pem",
        )
        .unwrap();
        assert_eq!(rest, "postgres://u:p@h:5433/db?application_name=x");
        assert_eq!(p.mode.as_deref(), Some("verify-ca"));
        assert_eq!(p.root_cert.as_deref(), Some("/etc/ca.pem"));
        let (rest, p) = TlsParams::take("postgres://h/db?sslmode=disable").unwrap();
        assert_eq!(rest, "postgres://h/db");
        assert_eq!(p.ssl_mode().unwrap(), SslMode::Disable);
    }

    #[test]
    fn descriptions_keep_the_port_and_drop_the_password() {
        assert_eq!(
            describe("postgres://app:pw@db.example:6432/tally?sslmode=verify-full&sslrootcert=/ca.pem"),
            "postgres://app@db.example:6432/tally"
        );
        assert_eq!(describe("postgres://app@db/tally"), "postgres://app@db:5432/tally");
    }

    #[test]
    fn modes_check_what_libpq_checks() {
        for (url, verify) in [
            ("postgres://h/db", Verify::Nothing),
            ("postgres://h/db?sslmode=require", Verify::Nothing),
            ("postgres://h/db?sslmode=require&sslrootcert=/ca.pem", Verify::Chain),
            ("postgres://h/db?sslmode=verify-ca&sslrootcert=/ca.pem", Verify::Chain),
            ("postgres://h/db?sslmode=verify-full&sslrootcert=system", Verify::ChainAndName),
        ] {
            let (_, p) = TlsParams::take(url).unwrap();
            assert_eq!(p.verify().unwrap(), verify, "{url}");
        }
        // The system's roots vouch for any publicly issued name: verify-full only. Roots
        // with a mode that checks nothing are refused rather than ignored.
        for url in [
            "postgres://h/db?sslmode=require&sslrootcert=system",
            "postgres://h/db?sslmode=verify-ca&sslrootcert=system",
            "postgres://h/db?sslrootcert=/ca.pem",
            "postgres://h/db?sslmode=disable&sslrootcert=/ca.pem",
        ] {
            let (_, p) = TlsParams::take(url).unwrap();
            assert!(p.verify().is_err(), "{url}");
        }
        let e = PgConnector::from_url("postgres://h/db?sslmode=verify-full").unwrap_err().to_string();
        assert!(e.contains("needs sslrootcert"), "{e}");
        let e = PgConnector::from_url("postgres://h/db?sslmode=allow").unwrap_err().to_string();
        assert!(e.contains("is not one of"), "{e}");
        let e = PgConnector::from_url("postgres://h/db?sslmode=verify-ca&sslrootcert=/nonexistent.pem")
            .unwrap_err()
            .to_string();
        assert!(e.contains("/nonexistent.pem"), "{e}");
    }
}
