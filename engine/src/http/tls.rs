//! HTTPS on the listeners (`http.tls`, `http.admin_tls`): rustls with the ring provider,
//! a certificate that is read again on SIGHUP and when its files change, without closing
//! the listener, and on the intake, client certificates that may name an API client.
//!
//! The certificate in use sits behind a lock in a [`ReloadingCert`], the listener's
//! certificate resolver: each handshake takes the current one, and a reload swaps it. A
//! reload that fails (a missing file, a key that does not match) keeps the certificate in
//! use and logs an error.

use std::any::Any;
use std::io;
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, SystemTime};

use actix_tls::accept::rustls_0_23::TlsStream;
use actix_web::dev::Extensions;
use actix_web::rt::net::TcpStream;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::{ClientHello, ResolvesServerCert, WebPkiClientVerifier};
use rustls::sign::CertifiedKey;
use rustls::{RootCertStore, ServerConfig};
use tracing::{error, info};

use crate::config::{ClientCert, ListenerTls};

/// How often the certificate files are looked at for a change.
const WATCH_INTERVAL: Duration = Duration::from_secs(5);

/// The names of a verified client certificate: its subject's common names and its DNS
/// names. Connection data of the intake ([`peer_names`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerNames(pub Vec<String>);

/// The rustls configuration of a listener with `tls`, its certificate watched for
/// changes from now on; `None` without a certificate (plain HTTP). `section` names `tls` in
/// errors (`http.tls`). Must run inside the actix system that serves the listener.
///
/// # Errors
/// When the certificate, its key or the client roots cannot be read or do not fit, naming
/// the key.
pub fn server_tls(tls: &ListenerTls, section: &'static str) -> io::Result<Option<ServerConfig>> {
    if !tls.enabled() {
        return Ok(None);
    }
    let cert = Arc::new(ReloadingCert::load(tls, section).map_err(io::Error::other)?);
    let config = server_config(Arc::clone(&cert), tls, section).map_err(io::Error::other)?;
    cert.watch();
    Ok(Some(config))
}

/// The rustls configuration of a listener: its certificate from `cert`, and client
/// certificates checked against `client_ca_file` when set.
fn server_config(cert: Arc<ReloadingCert>, tls: &ListenerTls, section: &str) -> Result<ServerConfig, String> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = ServerConfig::builder_with_provider(Arc::clone(&provider))
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("{section}: {e}"))?;
    let builder = if tls.client_ca_file.is_empty() {
        builder.with_no_client_auth()
    } else {
        let key = format!("{section}.client_ca_file");
        let mut roots = RootCertStore::empty();
        let certs = tally_actors::store::tls::read_certs(&key, &tls.client_ca_file).map_err(|e| e.to_string())?;
        let (_, ignored) = roots.add_parsable_certificates(certs);
        if roots.is_empty() {
            return Err(format!("{key} {}: no usable certificate ({ignored} ignored)", tls.client_ca_file));
        }
        let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider);
        let verifier = match tls.client_cert {
            ClientCert::Required => verifier,
            ClientCert::Optional => verifier.allow_unauthenticated(),
        };
        builder.with_client_cert_verifier(verifier.build().map_err(|e| format!("{key}: {e}"))?)
    };
    Ok(builder.with_cert_resolver(cert))
}

/// A listener's certificate and key, read from their files, and read again by
/// [`ReloadingCert::reload`]. The listener's certificate resolver.
#[derive(Debug)]
pub struct ReloadingCert {
    section: &'static str,
    cert_file: String,
    key_file: String,
    provider: CryptoProvider,
    current: RwLock<Arc<CertifiedKey>>,
    /// The files' modification times and sizes when they were last read.
    read: Mutex<Option<FileStamp>>,
}

type FileStamp = [(SystemTime, u64); 2];

impl ReloadingCert {
    /// Reads the certificate and key of `tls`.
    ///
    /// # Errors
    /// When they cannot be read, do not parse or do not belong together, naming the key.
    pub fn load(tls: &ListenerTls, section: &'static str) -> Result<Self, String> {
        let provider = rustls::crypto::ring::default_provider();
        let stamp = stamp(&tls.cert_file, &tls.key_file);
        let certified = read_certified(section, &tls.cert_file, &tls.key_file, &provider)?;
        Ok(Self {
            section,
            cert_file: tls.cert_file.clone(),
            key_file: tls.key_file.clone(),
            provider,
            current: RwLock::new(Arc::new(certified)),
            read: Mutex::new(stamp),
        })
    }

    /// Reads the files again and, when they hold a usable certificate and key, serves
    /// those from the next handshake on. On an error the certificate in use stays.
    ///
    /// # Errors
    /// Why the files were not taken.
    pub fn reload(&self) -> Result<(), String> {
        if let Ok(mut read) = self.read.lock() {
            *read = stamp(&self.cert_file, &self.key_file);
        }
        let certified = read_certified(self.section, &self.cert_file, &self.key_file, &self.provider)?;
        let mut current = self.current.write().map_err(|_| "the certificate lock is poisoned".to_owned())?;
        *current = Arc::new(certified);
        Ok(())
    }

    /// Whether the files changed since they were last read.
    fn changed(&self) -> bool {
        let now = stamp(&self.cert_file, &self.key_file);
        self.read.lock().map(|read| *read != now).unwrap_or(false)
    }

    /// Reloads on SIGHUP and when the files change, logging the outcome, until the actix
    /// system stops.
    fn watch(self: &Arc<Self>) {
        let this = Arc::clone(self);
        actix_web::rt::spawn(async move {
            let mut hangup = hangups();
            let mut ticks = tokio::time::interval(WATCH_INTERVAL);
            ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                let why = tokio::select! {
                    Some(()) = next_hangup(&mut hangup) => "SIGHUP",
                    _ = ticks.tick() => {
                        if !this.changed() {
                            continue;
                        }
                        "the files changed"
                    }
                };
                this.reload_and_log(why);
            }
        });
    }

    fn reload_and_log(&self, why: &str) {
        let section = self.section;
        match self.reload() {
            Ok(()) => {
                let serial = self.current.read().ok().and_then(|c| serial_of(&c)).unwrap_or_default();
                info!(listener = section, serial, why, "Reloaded the TLS certificate.");
            }
            Err(e) => {
                error!(listener = section, error = %e, why, "Cannot reload the TLS certificate; serving the previous one.")
            }
        }
    }
}

impl ResolvesServerCert for ReloadingCert {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        self.current.read().ok().map(|c| Arc::clone(&c))
    }
}

#[cfg(unix)]
type Hangups = Option<tokio::signal::unix::Signal>;
#[cfg(not(unix))]
type Hangups = Option<()>;

fn hangups() -> Hangups {
    #[cfg(unix)]
    {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()) {
            Ok(signal) => Some(signal),
            Err(e) => {
                error!(error = %e, "Cannot listen for SIGHUP; TLS certificates reload when their files change only.");
                None
            }
        }
    }
    #[cfg(not(unix))]
    None
}

/// The next SIGHUP; never, without a handler.
async fn next_hangup(hangups: &mut Hangups) -> Option<()> {
    #[cfg(unix)]
    if let Some(signal) = hangups {
        return signal.recv().await;
    }
    std::future::pending().await
}

fn stamp(cert_file: &str, key_file: &str) -> Option<FileStamp> {
    let one = |path: &str| std::fs::metadata(path).ok().and_then(|m| Some((m.modified().ok()?, m.len())));
    Some([one(cert_file)?, one(key_file)?])
}

fn read_certified(
    section: &str,
    cert_file: &str,
    key_file: &str,
    provider: &CryptoProvider,
) -> Result<CertifiedKey, String> {
    let chain =
        tally_actors::store::tls::read_certs(&format!("{section}.cert_file"), cert_file).map_err(|e| e.to_string())?;
    let key = PrivateKeyDer::from_pem_file(key_file).map_err(|e| format!("{section}.key_file {key_file}: {e}"))?;
    CertifiedKey::from_der(chain, key, provider)
        .map_err(|e| format!("{section}.cert_file {cert_file} with {section}.key_file {key_file}: {e}"))
}

/// The serial number of the certificate in use, in hexadecimal, for the log.
fn serial_of(certified: &CertifiedKey) -> Option<String> {
    let end = certified.cert.first()?;
    let (_, cert) = x509_parser::parse_x509_certificate(end).ok()?;
    Some(cert.raw_serial_as_string())
}

/// `HttpServer::on_connect` of the listeners: keeps the names of a verified client
/// certificate with the connection ([`PeerNames`]). rustls shows a peer certificate only
/// once it has been verified against `client_ca_file`.
pub fn peer_names(connection: &dyn Any, data: &mut Extensions) {
    let Some(tls) = connection.downcast_ref::<TlsStream<TcpStream>>() else { return };
    let (_, session) = tls.get_ref();
    if let Some(names) = session.peer_certificates().and_then(|chain| chain.first()).map(names_of) {
        data.insert(PeerNames(names));
    }
}

/// The common names and DNS names of a certificate; none when it does not parse.
fn names_of(cert: &CertificateDer<'_>) -> Vec<String> {
    let Ok((_, cert)) = x509_parser::parse_x509_certificate(cert) else { return Vec::new() };
    let mut names: Vec<String> =
        cert.subject().iter_common_name().filter_map(|cn| cn.as_str().ok()).map(str::to_owned).collect();
    if let Ok(Some(alt)) = cert.subject_alternative_name() {
        for name in &alt.value.general_names {
            if let x509_parser::extensions::GeneralName::DNSName(dns) = name {
                names.push((*dns).to_owned());
            }
        }
    }
    names
}
