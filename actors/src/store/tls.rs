//! The rustls pieces of [`super::connect`]: root stores from PEM files (or the system's),
//! and the two certificate checks libpq has that webpki alone has not: none at all
//! (`prefer`, `require`) and the chain without the host name (`verify-ca`).

use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::WebPkiServerVerifier;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{CertificateError, DigitallySignedStruct, RootCertStore, SignatureScheme};

/// A URL that cannot be used: a bad `sslmode`, an unreadable `sslrootcert`, ...
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct ConnectConfigError(String);

pub(super) fn bad(message: impl Into<String>) -> ConnectConfigError {
    ConnectConfigError(message.into())
}

/// The roots of `sslrootcert`: a PEM file, or `system` for the system's store.
///
/// # Errors
/// When the file cannot be read or holds no certificate.
pub fn root_store(source: &str) -> Result<RootCertStore, ConnectConfigError> {
    let mut store = RootCertStore::empty();
    if source == "system" {
        let found = rustls_native_certs::load_native_certs();
        store.add_parsable_certificates(found.certs);
    } else {
        let (_, ignored) = store.add_parsable_certificates(read_certs("sslrootcert", source)?);
        if ignored > 0 && store.is_empty() {
            return Err(bad(format!("sslrootcert {source}: no usable certificate")));
        }
    }
    if store.is_empty() {
        return Err(bad(format!("sslrootcert {source}: no certificate found")));
    }
    Ok(store)
}

/// The certificates of PEM file `path`, at least one.
///
/// # Errors
/// When the file cannot be read or holds no certificate.
pub fn read_certs(key: &str, path: &str) -> Result<Vec<CertificateDer<'static>>, ConnectConfigError> {
    let certs = CertificateDer::pem_file_iter(path)
        .and_then(Iterator::collect::<Result<Vec<_>, _>>)
        .map_err(|e| bad(format!("{key} {path}: {e}")))?;
    if certs.is_empty() {
        return Err(bad(format!("{key} {path}: no certificate found")));
    }
    Ok(certs)
}

/// `prefer` and `require` without roots: encryption without authentication of the server,
/// as libpq does. The handshake's signatures are still checked.
#[derive(Debug)]
pub(super) struct AnyCertificate(pub(super) Arc<CryptoProvider>);

impl ServerCertVerifier for AnyCertificate {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.0.signature_verification_algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.0.signature_verification_algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

/// `verify-ca`: the chain is checked, the host name is not. webpki checks the chain before
/// the name, so a name error means the chain passed.
#[derive(Debug)]
pub(super) struct AnyName(pub(super) Arc<WebPkiServerVerifier>);

impl ServerCertVerifier for AnyName {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        match self.0.verify_server_cert(end_entity, intermediates, server_name, ocsp_response, now) {
            Err(rustls::Error::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            )) => Ok(ServerCertVerified::assertion()),
            other => other,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.supported_verify_schemes()
    }
}
