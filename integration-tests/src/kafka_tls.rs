//! Kafka over TLS: a TLS-terminating proxy (Debian's socat, installed by
//! `scripts/ensure-socat.sh`) in front of a single-broker embedded cluster (librdkafka's
//! mock) that advertises the proxy's address. A client bootstraps through the proxy and
//! finds the proxy in the metadata, so every connection it makes speaks TLS; one that does
//! not gets nothing from the broker.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::*;
use crate::tls::{path_str, TestCa};

/// socat: `TALLY_SOCAT_BIN`, else what `scripts/ensure-socat.sh` finds or installs (it is
/// idempotent and fetches nothing once socat is there).
///
/// # Panics
/// When it cannot be installed.
#[must_use]
pub fn socat() -> PathBuf {
    if let Ok(bin) = std::env::var("TALLY_SOCAT_BIN") {
        return PathBuf::from(bin);
    }
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    let out = Command::new(root.join("scripts/ensure-socat.sh"))
        .current_dir(&root)
        .stderr(Stdio::inherit())
        .output()
        .expect("run scripts/ensure-socat.sh");
    assert!(out.status.success(), "scripts/ensure-socat.sh failed: install socat (Debian) to run these tests");
    PathBuf::from(String::from_utf8_lossy(&out.stdout).trim())
}

/// Whether the proxy asks clients for a certificate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClientAuth {
    /// Any client that trusts the server's certificate.
    None,
    /// Only clients presenting a certificate the test CA signed (mutual TLS).
    Required,
}

/// A single-broker embedded cluster reachable only through a TLS-terminating proxy on
/// `127.0.0.1`, its certificate (for `127.0.0.1`) signed by `ca`. The proxy is killed on
/// drop; its log (`socat -d -d`: one line per accepted connection and per TLS session) is
/// kept for the test to read.
pub struct TlsBroker {
    pub broker: Arc<EmbeddedBroker>,
    /// Where the proxy listens, and where the broker says it is.
    pub addr: SocketAddr,
    proxy: Child,
    log: PathBuf,
}

impl std::fmt::Debug for TlsBroker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsBroker").field("addr", &self.addr).field("proxy", &self.proxy.id()).finish()
    }
}

impl TlsBroker {
    /// Starts the broker, creates `config`'s topics on it, and starts the proxy in front.
    ///
    /// # Panics
    /// When any of them cannot be started within 30 s.
    #[must_use]
    pub fn start(ca: &TestCa, auth: ClientAuth, config: &Config) -> Self {
        let broker = Arc::new(EmbeddedBroker::start(1).expect("start the embedded Kafka broker"));
        for spec in tally_engine::topics::topic_specs(config) {
            broker.create_topic_if_missing(&spec.name, spec.partitions, 1).expect("create a topic");
        }
        let target: SocketAddr = broker.bootstrap_servers().parse().expect("the mock broker's address");
        let addr: SocketAddr = free_addr().parse().expect("a free loopback address");
        let (cert, key) = ca.write("broker", &ca.sign(&["127.0.0.1"]));
        let mut listen = format!(
            "OPENSSL-LISTEN:{},bind=127.0.0.1,reuseaddr,fork,cert={},key={}",
            addr.port(),
            path_str(&cert),
            path_str(&key)
        );
        match auth {
            ClientAuth::None => listen.push_str(",verify=0"),
            ClientAuth::Required => listen.push_str(&format!(",verify=1,cafile={}", path_str(&ca.cert_path()))),
        }
        let log = std::env::temp_dir().join(format!("tally-tls-proxy-{}.log", uuid::Uuid::new_v4().simple()));
        let stderr = std::fs::File::create(&log).map_or_else(|_| Stdio::null(), Stdio::from);
        let proxy = Command::new(socat())
            .args(["-d", "-d", &listen, &format!("TCP:{target}")])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(stderr)
            .spawn()
            .expect("start socat");
        let started = Instant::now();
        while std::net::TcpStream::connect(addr).is_err() {
            assert!(started.elapsed() < Duration::from_secs(30), "socat did not listen on {addr} within 30 s");
            std::thread::sleep(Duration::from_millis(20));
        }
        broker.advertise(1, addr).expect("advertise the proxy");
        Self { broker, addr, proxy, log }
    }

    /// What the proxy logged so far.
    #[must_use]
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// TLS sessions the proxy established so far (socat logs `SSL connection using
    /// <cipher>` for each).
    #[must_use]
    pub fn tls_sessions(&self) -> usize {
        self.log().matches("SSL connection using").count()
    }
}

impl Drop for TlsBroker {
    fn drop(&mut self) {
        let _ = self.proxy.kill();
        let _ = self.proxy.wait();
        let _ = std::fs::remove_file(&self.log);
    }
}

/// `config` pointed at `tls` (through the proxy), trusting `ca`; with `client`, presenting
/// that certificate and key (mutual TLS). The properties go under `kafka.common`, as an
/// operator sets them.
pub fn use_tls(config: &mut Config, tls: &TlsBroker, ca: &Path, client: Option<(&Path, &Path)>) {
    config.kafka.brokers = tls.addr.to_string();
    // Not the embedded broker's own daemon: its key comes from a file.
    config.signing.keys_dir = crate::write_keys_dir(tls.broker.signing_key()).display().to_string();
    // The mock cluster has no Admin API: the topics were created on it directly.
    config.kafka.create_topics = false;
    let common = &mut config.kafka.common;
    common.insert("security.protocol".into(), "SSL".into());
    common.insert("ssl.ca.location".into(), path_str(ca));
    if let Some((cert, key)) = client {
        common.insert("ssl.certificate.location".into(), path_str(cert));
        common.insert("ssl.key.location".into(), path_str(key));
    }
}

/// Starts a daemon on `env`'s database with `config` as it is (its own Kafka settings, no
/// embedded broker); the start's error, when it fails.
///
/// # Errors
/// The daemon's start error, with its causes.
pub async fn spawn_on_cluster(config: Config) -> Result<TestApp, String> {
    config.validate().map_err(|e| e.to_string())?;
    let spawn_config = config.clone();
    match tokio::task::spawn_blocking(move || tally_engine::spawn(spawn_config, None)).await {
        Ok(Ok(handle)) => Ok(TestApp::new(handle, config)),
        Ok(Err(e)) => Err(format!("{e:#}")),
        Err(e) => Err(format!("the spawn task failed: {e}")),
    }
}
