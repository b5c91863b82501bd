//! Certificates the tests make: a certificate authority of their own (rcgen), the server
//! certificates it signs, and rustls configurations that use them. The ring provider is
//! given explicitly, as tally does.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, DnType, IsCa, KeyPair};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

/// A test certificate authority, with its certificate written to a PEM file.
#[derive(Debug)]
pub struct TestCa {
    issuer: CertifiedIssuer<'static, KeyPair>,
    dir: PathBuf,
}

/// A certificate the [`TestCa`] signed, and its key, as PEM.
#[derive(Debug, Clone)]
pub struct Signed {
    pub cert_pem: String,
    pub key_pem: String,
}

impl TestCa {
    /// A new authority named `name`, its files in a new temporary directory.
    ///
    /// # Panics
    /// When the certificate cannot be made or written.
    #[must_use]
    pub fn new(name: &str) -> Self {
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("CA parameters");
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name.push(DnType::CommonName, name);
        let key = KeyPair::generate().expect("a CA key");
        let issuer = CertifiedIssuer::self_signed(params, key).expect("a CA certificate");
        let dir = std::env::temp_dir().join(format!("tally-ca-{}", uuid::Uuid::new_v4().simple()));
        std::fs::create_dir_all(&dir).expect("a directory for the CA");
        std::fs::write(dir.join("ca.pem"), issuer.pem()).expect("write the CA certificate");
        Self { issuer, dir }
    }

    /// The authority's certificate, as a PEM file.
    #[must_use]
    pub fn cert_path(&self) -> PathBuf {
        self.dir.join("ca.pem")
    }

    /// A certificate for `names` (DNS names; the first is the common name) signed by this
    /// authority.
    ///
    /// # Panics
    /// When it cannot be made.
    #[must_use]
    pub fn sign(&self, names: &[&str]) -> Signed {
        let names: Vec<String> = names.iter().map(|n| (*n).to_owned()).collect();
        let mut params = CertificateParams::new(names.clone()).expect("certificate parameters");
        params.distinguished_name.push(DnType::CommonName, names.first().cloned().unwrap_or_default());
        let key = KeyPair::generate().expect("a key");
        let cert = params.signed_by(&key, &self.issuer).expect("a signed certificate");
        Signed { cert_pem: cert.pem(), key_pem: key.serialize_pem() }
    }

    /// Writes `signed` as `<stem>.crt` and `<stem>.key` beside the authority's certificate;
    /// returns both paths.
    ///
    /// # Panics
    /// When the files cannot be written.
    #[must_use]
    pub fn write(&self, stem: &str, signed: &Signed) -> (PathBuf, PathBuf) {
        let (cert, key) = (self.dir.join(format!("{stem}.crt")), self.dir.join(format!("{stem}.key")));
        std::fs::write(&cert, &signed.cert_pem).expect("write the certificate");
        std::fs::write(&key, &signed.key_pem).expect("write the key");
        (cert, key)
    }
}

impl Drop for TestCa {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A rustls server configuration presenting `signed` (no client certificates).
///
/// # Panics
/// When the certificate or key does not parse.
#[must_use]
pub fn server_config(signed: &Signed) -> Arc<rustls::ServerConfig> {
    let chain = vec![CertificateDer::from_pem_slice(signed.cert_pem.as_bytes()).expect("certificate PEM")];
    let key = PrivateKeyDer::from_pem_slice(signed.key_pem.as_bytes()).expect("key PEM");
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    Arc::new(
        rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .expect("protocol versions")
            .with_no_client_auth()
            .with_single_cert(chain, key)
            .expect("a server configuration"),
    )
}

/// `path` as a string, for configuration values.
#[must_use]
pub fn path_str(path: &Path) -> String {
    path.display().to_string()
}
