//! noida-db: a second, independent Kafka implementation, with real transactions
//! (read_committed hides aborted and open transactions, offsets sent in a transaction
//! commit only with it, a new producer with the same `transactional.id` fences the old
//! one) and static group membership. The librdkafka mock cluster has none of these, so the
//! tests of exactly-once, fencing and restarts run here.
//!
//! What it does not do (so tests do not rely on it): abort a transaction past
//! `transaction.timeout.ms`, expire dead members by `session.timeout.ms`, refuse a
//! stale-generation `TxnOffsetCommit`. A read_committed consumer that is already waiting
//! at an open transaction does not read on when a successor aborts that transaction by
//! fencing (a consumer that starts fetching after the abort does). It answers empty
//! fetches at once, so idle consumers cost CPU: keep the number of consumers in a test
//! small.
//!
//! `scripts/ensure-noida.sh` installs a pinned version under `target/` (once) and prints
//! the broker binary; each [`NoidaBroker`] runs that binary itself (not the Python shim,
//! so the child's PID is the broker's), Kafka only, on a free loopback port with its own
//! data directory.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::ClientConfig;
use tally_engine::config::SecretUrl;
use tally_engine::Config;

use crate::{KafkaRecord, TestApp, TestDb};

/// The noida-db broker binary: `TALLY_NOIDA_BIN`, else what `scripts/ensure-noida.sh`
/// installs (it is idempotent and fetches nothing once installed).
///
/// # Panics
/// When it cannot be installed.
#[must_use]
pub fn binary() -> PathBuf {
    if let Ok(bin) = std::env::var("TALLY_NOIDA_BIN") {
        return PathBuf::from(bin);
    }
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    let out = Command::new(root.join("scripts/ensure-noida.sh"))
        .current_dir(&root)
        .stderr(Stdio::inherit())
        .output()
        .expect("run scripts/ensure-noida.sh");
    assert!(out.status.success(), "scripts/ensure-noida.sh failed: install noida-db (PyPI) to run these tests");
    PathBuf::from(String::from_utf8_lossy(&out.stdout).trim())
}

/// A noida-db broker process on `127.0.0.1:<free port>`, killed and its data removed on
/// drop.
pub struct NoidaBroker {
    child: Child,
    port: u16,
    dir: PathBuf,
    /// The event-signing key of every daemon on this broker, in `keys_dir`.
    pub key: tally_actors::signing::SigningKey,
    pub keys_dir: PathBuf,
}

impl std::fmt::Debug for NoidaBroker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NoidaBroker").field("port", &self.port).field("pid", &self.child.id()).finish()
    }
}

impl NoidaBroker {
    /// Starts a broker and waits until it answers metadata requests.
    ///
    /// # Panics
    /// When it does not start within 30 s.
    #[must_use]
    pub fn start() -> Self {
        let binary = binary();
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
            .expect("a free loopback port");
        let dir = std::env::temp_dir().join(format!("tally-noida-{}", uuid::Uuid::new_v4().simple()));
        std::fs::create_dir_all(&dir).expect("noida data directory");
        let (_, log) = crate::logs::child_log(&format!("noida-{port}.log"));
        let child = Command::new(binary)
            .args(["start", "--host", "127.0.0.1", "--only", "kafka", "--kafka-port", &port.to_string(), "--data-dir"])
            .arg(&dir)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("start noida-db");
        let key = tally_actors::signing::SigningKey::random("noida").expect("a random key");
        let keys_dir = crate::write_keys_dir(&key);
        let broker = Self { child, port, dir, key, keys_dir };
        broker.wait_ready(Duration::from_secs(30));
        broker
    }

    fn wait_ready(&self, within: Duration) {
        let started = Instant::now();
        let consumer: BaseConsumer = ClientConfig::new()
            .set("bootstrap.servers", self.bootstrap())
            .set("log_level", "0")
            .create()
            .expect("metadata client");
        while started.elapsed() < within {
            if consumer.fetch_metadata(None, Duration::from_secs(1)).is_ok_and(|m| !m.brokers().is_empty()) {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        panic!("noida-db did not answer on {} within {within:?}", self.bootstrap());
    }

    /// Its `bootstrap.servers`.
    #[must_use]
    pub fn bootstrap(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }
}

impl Drop for NoidaBroker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
        let _ = std::fs::remove_dir_all(&self.keys_dir);
    }
}

/// The configuration of a daemon on `db` and `broker`: topics created by the daemon (3
/// partitions each, to keep noida's idle fetches cheap), listeners on port 0, a unique
/// instance id.
#[must_use]
pub fn config(db: &TestDb, broker: &NoidaBroker) -> Config {
    let mut c = Config::default();
    c.instance.id = format!("test-{}", &uuid::Uuid::new_v4().simple().to_string()[..12]);
    c.database.url = SecretUrl::new(db.url());
    c.database.pools = crate::test_pools();
    c.kafka.brokers = broker.bootstrap();
    c.signing.keys_dir = broker.keys_dir.display().to_string();
    c.kafka.partitions = 3;
    c.kafka.create_topics = true;
    c.http.intake_addr = ([127, 0, 0, 1], 0).into();
    c.http.admin_addr = ([127, 0, 0, 1], 0).into();
    c.http.workers = 1;
    c.outbox.poll_interval = std::time::Duration::from_millis(50);
    // Eager assignment here: noida-db's group coordinator does not always start the
    // second rebalance of cooperative assignment (a member rejoining after giving a
    // partition up): under CPU load the partition was seen left without an owner. These
    // tests prove transactions and fencing; cooperative rebalancing is proven on the
    // embedded broker (`rebalance::`).
    c.kafka.consumer.insert("partition.assignment.strategy".into(), "range,roundrobin".into());
    c
}

/// Starts a daemon on `db` and `broker` (configured by `configure` after [`config`]);
/// returns once it serves HTTP.
///
/// # Panics
/// When the configuration is invalid or the daemon cannot start.
pub async fn spawn(db: &TestDb, broker: &NoidaBroker, configure: impl FnOnce(&mut Config)) -> TestApp {
    let mut config = config(db, broker);
    configure(&mut config);
    config.validate().expect("the test configuration is valid");
    let spawn_config = config.clone();
    let handle = tokio::task::spawn_blocking(move || tally_engine::spawn(spawn_config, None))
        .await
        .expect("daemon spawn task")
        .unwrap_or_else(|e| panic!("the daemon did not start: {e:#}"));
    TestApp::new(handle, config)
}

/// Starts `tally run` as a child process on `db` and `broker` (topics created by the
/// daemon, 3 partitions, listeners on port 0), with extra `TALLY__*` variables. Its logs
/// go to the test's log folder ([`crate::logs`]). Kill it with `Child::kill` (SIGKILL), or
/// drop it.
///
/// # Panics
/// When the process cannot be started.
#[must_use]
pub fn spawn_process(db: &TestDb, broker: &NoidaBroker, extra: &[(&str, &str)]) -> crate::TallyProcess {
    let binary = crate::tally_binary();
    let name = extra.iter().find(|(k, _)| *k == "TALLY__INSTANCE__ID").map_or("noida-child", |(_, id)| *id);
    let (log, stderr) = crate::logs::child_log(&format!("tally-{name}.log"));
    Command::new(binary)
        .arg("run")
        .env("TALLY__DATABASE__URL", db.url())
        .envs(crate::test_pools_env())
        .env("TALLY__KAFKA__BROKERS", broker.bootstrap())
        .env("TALLY__SIGNING__KEYS_DIR", &broker.keys_dir)
        .env("TALLY__KAFKA__PARTITIONS", "3")
        .env("TALLY__HTTP__INTAKE_ADDR", "127.0.0.1:0")
        .env("TALLY__HTTP__ADMIN_ADDR", "127.0.0.1:0")
        .envs(extra.iter().copied())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(stderr)
        .spawn()
        .map(|child| crate::TallyProcess::with_log(child, log))
        .expect("start tally run")
}

/// Every record of `topic` visible to a `read_committed` consumer: read every partition
/// from the start until nothing new arrived for `quiet` (bounded by `within`).
///
/// # Panics
/// When the consumer cannot be created or subscribed.
#[must_use]
pub fn read_committed(bootstrap: &str, topic: &str, quiet: Duration, within: Duration) -> Vec<KafkaRecord> {
    read_committed_from(bootstrap, topic, rdkafka::Offset::Beginning, quiet, within)
}

/// [`read_committed`] from `start` in every partition.
///
/// # Panics
/// When the consumer cannot be created or assigned.
#[must_use]
pub fn read_committed_from(
    bootstrap: &str,
    topic: &str,
    start: rdkafka::Offset,
    quiet: Duration,
    within: Duration,
) -> Vec<KafkaRecord> {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("group.id", format!("tally-test-reader-{}", uuid::Uuid::new_v4().simple()))
        .set("isolation.level", "read_committed")
        .set("enable.auto.commit", "false")
        .set("auto.offset.reset", "earliest")
        .set("log_level", "3")
        .create()
        .expect("read_committed consumer");
    let metadata = consumer.fetch_metadata(Some(topic), Duration::from_secs(10)).expect("topic metadata");
    let mut assignment = rdkafka::TopicPartitionList::new();
    for t in metadata.topics().iter().filter(|t| t.name() == topic) {
        for p in t.partitions() {
            assignment.add_partition_offset(topic, p.id(), start).expect("assignment");
        }
    }
    consumer.assign(&assignment).expect("assign");
    let started = Instant::now();
    let mut last = Instant::now();
    let mut records = Vec::new();
    while started.elapsed() < within && last.elapsed() < quiet {
        if let Some(Ok(m)) = consumer.poll(Duration::from_millis(100)) {
            last = Instant::now();
            records.push(KafkaRecord::from_message(&m));
        }
    }
    records.sort_by_key(|r| (r.partition, r.offset));
    records
}

/// A transactional producer with `transactional.id` `id`, not yet initialised.
///
/// # Panics
/// When it cannot be created.
#[must_use]
pub fn transactional_producer(bootstrap: &str, id: &str) -> rdkafka::producer::BaseProducer {
    ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("transactional.id", id)
        .create()
        .expect("transactional producer")
}
