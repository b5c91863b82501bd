//! The Kafka cluster a bench runs on: the embedded broker (librdkafka's mock cluster, in
//! this process; no real transactions: `read_committed` and transactional offsets are
//! accepted but not enforced) or noida-db (a second Kafka implementation with real
//! transactions, run as a child process on a free loopback port with its own data
//! directory, removed at the end). `tally bench e2e` runs the embedded broker in a `tally
//! broker` child process instead ([`Cluster::process`]), so that its CPU is its own.
//!
//! noida-db is installed by `scripts/ensure-noida.sh` (run from the repository root), or
//! taken from `TALLY_NOIDA_BIN`.

use std::io::{BufRead, BufReader};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use serde::Serialize;

use crate::broker::EmbeddedBroker;
use crate::{topics, Config};

/// Which cluster (`--broker`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum ClusterKind {
    /// The in-process librdkafka mock cluster, one broker.
    Embedded,
    /// noida-db as a child process (real transactions).
    Noida,
}

impl ClusterKind {
    /// As `--broker` spells it.
    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            Self::Embedded => "embedded",
            Self::Noida => "noida",
        }
    }
}

/// A running cluster; a noida-db process is stopped and its data removed on drop.
pub enum Cluster {
    /// The embedded broker.
    Embedded(Arc<EmbeddedBroker>),
    /// A noida-db child process.
    Noida(Noida),
    /// The embedded broker in a `tally broker` child process.
    Process(BrokerProcess),
}

impl Cluster {
    /// Starts a fresh cluster of `kind`.
    ///
    /// # Errors
    /// When the broker cannot be started or does not listen within 30 s.
    pub fn start(kind: ClusterKind) -> anyhow::Result<Self> {
        Ok(match kind {
            ClusterKind::Embedded => Self::Embedded(Arc::new(EmbeddedBroker::start(1)?)),
            ClusterKind::Noida => Self::Noida(Noida::start()?),
        })
    }

    /// The embedded broker (one broker) in a `tally broker` child process, its topics
    /// created with `partitions` partitions, its log lines in `log`.
    ///
    /// # Errors
    /// When the process cannot be started or does not announce its address within 30 s.
    pub fn process(partitions: i32, log: &str) -> anyhow::Result<Self> {
        Ok(Self::Process(BrokerProcess::start(partitions, log)?))
    }

    /// Its `bootstrap.servers`.
    #[must_use]
    pub fn bootstrap(&self) -> String {
        match self {
            Self::Embedded(b) => b.bootstrap_servers().to_owned(),
            Self::Noida(n) => n.addr.to_string(),
            Self::Process(p) => p.bootstrap.clone(),
        }
    }

    /// The broker's process id when it runs in a process of its own.
    #[must_use]
    pub fn pid(&self) -> Option<u32> {
        match self {
            Self::Embedded(_) => None,
            Self::Noida(n) => Some(n.child.id()),
            Self::Process(p) => Some(p.child.id()),
        }
    }

    /// Points `config` at this cluster (one broker, replication 1).
    pub fn configure(&self, config: &mut Config) {
        config.kafka.replication_factor = 1;
        match self {
            Self::Embedded(_) => {
                config.kafka.brokers = "embedded".into();
                config.kafka.embedded_brokers = 1;
            }
            Self::Noida(_) | Self::Process(_) => config.kafka.brokers = self.bootstrap(),
        }
    }

    /// For a daemon of its own reaching the embedded broker in a `tally broker` process:
    /// the variable that gives its consumers the fetch wait they get on an embedded broker
    /// in their own process (that broker answers a fetch only when the wait is over, so the
    /// wait is added to every hop; see [`crate::config::KafkaConfig::clients`]), unless
    /// `base` sets one. `None` for any other cluster.
    #[must_use]
    pub fn mock_fetch_wait(&self, base: &Config) -> Option<(String, String)> {
        let chosen = base.kafka.consumer.contains_key(crate::config::FETCH_WAIT_KEY);
        (matches!(self, Self::Process(_)) && !chosen).then(|| {
            let var = format!("TALLY__KAFKA__CONSUMER__{}", crate::config::FETCH_WAIT_KEY.to_uppercase());
            (var, crate::config::EMBEDDED_FETCH_WAIT_MS.to_owned())
        })
    }

    /// The embedded broker, for [`crate::spawn`] (`None` for noida-db: the daemon connects
    /// to `kafka.brokers`).
    #[must_use]
    pub fn embedded(&self) -> Option<Arc<EmbeddedBroker>> {
        match self {
            Self::Embedded(b) => Some(Arc::clone(b)),
            Self::Noida(_) | Self::Process(_) => None,
        }
    }

    /// Creates every topic `config`'s daemon would create, as it would, so that records can
    /// be produced before it starts.
    ///
    /// # Errors
    /// When the cluster refuses or does not answer.
    pub async fn create_topics(&self, config: &Config) -> anyhow::Result<()> {
        let embedded = self.embedded();
        let specs = topics::topic_specs(config);
        topics::prepare_topics(&config.kafka, &specs, &self.bootstrap(), embedded.as_deref(), true).await
    }
}

/// A noida-db process serving Kafka on `addr`.
pub struct Noida {
    child: Child,
    addr: SocketAddr,
    dir: PathBuf,
}

impl Noida {
    fn start() -> anyhow::Result<Self> {
        let binary = noida_binary()?;
        let addr = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .context("no free loopback port for noida-db")?;
        let dir = std::env::temp_dir().join(format!("tally-bench-noida-{}", uuid::Uuid::new_v4().simple()));
        std::fs::create_dir_all(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
        let log = std::fs::File::create(dir.with_extension("log")).map_or_else(|_| Stdio::null(), Stdio::from);
        let child = Command::new(&binary)
            .args(["start", "--host", "127.0.0.1", "--only", "kafka", "--kafka-port", &addr.port().to_string()])
            .arg("--data-dir")
            .arg(&dir)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .with_context(|| format!("cannot start {}", binary.display()))?;
        let mut noida = Self { child, addr, dir };
        noida.wait_listening(Duration::from_secs(30))?;
        Ok(noida)
    }

    fn wait_listening(&mut self, within: Duration) -> anyhow::Result<()> {
        let started = Instant::now();
        while started.elapsed() < within {
            if let Some(status) = self.child.try_wait()? {
                bail!("noida-db exited at start ({status}); its log: {}", self.dir.with_extension("log").display());
            }
            if TcpStream::connect_timeout(&self.addr, Duration::from_millis(200)).is_ok() {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        bail!("noida-db did not listen on {} within {within:?}", self.addr)
    }
}

impl Drop for Noida {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
        let _ = std::fs::remove_file(self.dir.with_extension("log"));
    }
}

/// `tally broker` as a child process (one broker on a random port), killed on drop.
pub struct BrokerProcess {
    child: Child,
    bootstrap: String,
}

impl BrokerProcess {
    fn start(partitions: i32, log: &str) -> anyhow::Result<Self> {
        let env = [
            ("TALLY__KAFKA__EMBEDDED_BROKERS", "1".to_owned()),
            ("TALLY__KAFKA__REPLICATION_FACTOR", "1".to_owned()),
            ("TALLY__KAFKA__PARTITIONS", partitions.to_string()),
        ]
        .map(|(k, v)| (k.to_owned(), v));
        let mut child = super::child::tally_child(&["broker", "--listen", "127.0.0.1:0"], env, log, Stdio::piped())?;
        let stdout = child.stdout.take().context("no stdout from tally broker")?;
        // It prints `bootstrap.servers=<list>` once its topics are ready; the thread reads
        // its stdout to the end so that it never blocks on a full pipe.
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if let Some(bootstrap) = line.strip_prefix("bootstrap.servers=") {
                    let _ = tx.send(bootstrap.to_owned());
                }
            }
        });
        let mut broker = Self { child, bootstrap: String::new() };
        broker.bootstrap = rx
            .recv_timeout(Duration::from_secs(30))
            .with_context(|| format!("tally broker announced no address within 30 s; its log: {log}"))?;
        Ok(broker)
    }
}

impl Drop for BrokerProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `TALLY_NOIDA_BIN`, else what `scripts/ensure-noida.sh` installs (idempotent).
fn noida_binary() -> anyhow::Result<PathBuf> {
    if let Ok(bin) = std::env::var("TALLY_NOIDA_BIN") {
        return Ok(PathBuf::from(bin));
    }
    let out = Command::new("scripts/ensure-noida.sh").stderr(Stdio::inherit()).output().context(
        "cannot run scripts/ensure-noida.sh: run the bench from the repository root, or set TALLY_NOIDA_BIN",
    )?;
    if !out.status.success() {
        bail!("scripts/ensure-noida.sh failed ({})", out.status);
    }
    Ok(PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()))
}
