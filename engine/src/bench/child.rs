//! What the multi-process benches (`scale`, `soak`) share: `tally run` child processes
//! running only the ledger pipeline on the bench's embedded broker and database, and the
//! stream of `TransferAnalyzed` records they settle, produced to known partitions.

use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use rdkafka::config::ClientConfig;
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord};
use uuid::Uuid;

use super::{account, http_get, pair, Progress};
use crate::broker::EmbeddedBroker;
use crate::config::Config;
use tally_schema::events::TransferAnalyzed;
use tally_schema::EventType;

/// A `tally run` child, killed when dropped.
pub(super) struct Daemon {
    pub(super) child: Child,
    /// Its admin listener, `http://host:port`.
    pub(super) admin: String,
}

impl Daemon {
    /// Starts `tally run` with the variables `env` (`TALLY__*`, over those this process
    /// has), its admin listener on a free loopback port, its log lines (stderr) in `log`.
    pub(super) fn spawn(env: &[(String, String)], log: &str) -> anyhow::Result<Self> {
        let admin = free_addr()?;
        let child = tally_child(
            &["run"],
            env.iter().cloned().chain([("TALLY__HTTP__ADMIN_ADDR".into(), admin.clone())]),
            log,
            Stdio::null(),
        )?;
        Ok(Self { child, admin: format!("http://{admin}") })
    }

    /// Its process id (for `/proc/<pid>/status`).
    pub(super) fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Waits until its `/readyz` answers, for up to `within`.
    ///
    /// # Errors
    /// When it exits first or is not ready in time.
    pub(super) async fn ready(&mut self, within: Duration, log: &str) -> anyhow::Result<()> {
        let started = Instant::now();
        while started.elapsed() < within {
            if let Some(status) = self.child.try_wait()? {
                bail!("tally run exited at start ({status}); its log: {log}");
            }
            if http_get(&format!("{}/readyz", self.admin)).await.is_ok() {
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        bail!("tally run was not ready within {within:?}; its log: {log}")
    }
}

/// Starts `tally <args>` (this executable) with the variables `env` over those this process
/// has, stdin closed, stdout to `stdout`, stderr (its log lines) to the file `log`.
pub(super) fn tally_child(
    args: &[&str],
    env: impl IntoIterator<Item = (String, String)>,
    log: &str,
    stdout: Stdio,
) -> anyhow::Result<Child> {
    let exe = std::env::current_exe().context("cannot find the tally executable")?;
    std::fs::create_dir_all("target/bench").context("cannot create target/bench")?;
    let log = std::fs::File::create(log).with_context(|| format!("cannot create {log}"))?;
    Command::new(&exe)
        .args(args)
        .envs(env)
        .stdin(Stdio::null())
        .stdout(stdout)
        .stderr(log)
        .spawn()
        .with_context(|| format!("cannot start tally {}", args.join(" ")))
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Where the children run: the runtime, the broker, the database and the base settings.
pub(super) struct Site<'a> {
    pub(super) base: &'a Config,
    pub(super) runtime: tokio::runtime::Runtime,
    pub(super) broker: Arc<EmbeddedBroker>,
    /// The database URL.
    pub(super) url: String,
    /// Partitions of every topic.
    pub(super) partitions: i32,
    pub(super) accounts: usize,
}

impl<'a> Site<'a> {
    /// A fresh database `database` with `accounts` accounts, and a fresh embedded broker.
    ///
    /// # Errors
    /// When the database or the broker cannot be created.
    pub(super) fn new(base: &'a Config, database: &str, accounts: usize) -> anyhow::Result<Self> {
        let runtime = super::runtime()?;
        let url = runtime.block_on(super::fresh_database(base, database, accounts))?;
        let broker = Arc::new(EmbeddedBroker::start(1)?);
        Ok(Self { base, runtime, broker, url, partitions: base.kafka.partitions, accounts })
    }
    /// The ledger's input topic and group of run `name` of bench `scenario`, topics created:
    /// every run reads its own records.
    pub(super) fn prepare(&self, scenario: &str, name: &str) -> anyhow::Result<(String, String)> {
        let topic = format!("{}.{name}", self.base.kafka.topics.transfers_analyzed);
        let mut config = self.base.clone();
        config.kafka.topics.transfers_analyzed.clone_from(&topic);
        config.kafka.replication_factor = 1;
        for spec in crate::topics::topic_specs(&config) {
            self.broker.create_topic_if_missing(&spec.name, spec.partitions, 1)?;
        }
        Ok((topic, format!("bench-{scenario}-{name}")))
    }

    /// Starts `n` daemons running only the ledger on `topic` in `group` (with the `extra`
    /// `TALLY__*` variables), their logs in `target/bench/<group>-<i>.log`, and waits until
    /// each holds a share of the partitions.
    pub(super) fn start(
        &self,
        n: usize,
        topic: &str,
        group: &str,
        extra: &[(&str, &str)],
    ) -> anyhow::Result<Vec<Daemon>> {
        let daemons = (0..n).map(|i| self.spawn(i, topic, group, extra)).collect::<anyhow::Result<Vec<_>>>()?;
        self.wait_shared(daemons)
    }

    /// Starts daemon `i` of `group` (see [`Site::start`]) without waiting for it to join.
    pub(super) fn spawn(&self, i: usize, topic: &str, group: &str, extra: &[(&str, &str)]) -> anyhow::Result<Daemon> {
        let instance = format!("{group}-{i}");
        let mut env: Vec<(String, String)> = [
            ("TALLY__DATABASE__URL", self.url.as_str()),
            ("TALLY__SIGNING__KEYS_DIR", super::KEYS_DIR),
            ("TALLY__KAFKA__BROKERS", self.broker.bootstrap_servers()),
            ("TALLY__KAFKA__CREATE_TOPICS", "false"),
            ("TALLY__KAFKA__TOPICS__TRANSFERS_ANALYZED", topic),
            ("TALLY__LEDGER__GROUP_ID", group),
            ("TALLY__INSTANCE__ID", instance.as_str()),
            ("TALLY__HTTP__INTAKE_ADDR", "127.0.0.1:0"),
            ("TALLY__LOG__LEVEL", "warn"),
            ("TALLY__KAFKA__GROUP_PROTOCOL", self.base.kafka.effective_group_protocol().name()),
        ]
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .into();
        env.extend(
            ["OUTBOX", "ANTIFRAUD", "PROJECTION", "ORDERS", "NOTIFICATIONS"]
                .map(|p| (format!("TALLY__PIPELINES__{p}"), "false".to_owned())),
        );
        env.extend(extra.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())));
        Daemon::spawn(&env, &format!("target/bench/{group}-{i}.log"))
    }

    fn wait_shared(&self, daemons: Vec<Daemon>) -> anyhow::Result<Vec<Daemon>> {
        let n = daemons.len();
        let started = Instant::now();
        let mut progress = Progress::bar("partitions shared", self.partitions as u64);
        loop {
            let shares = self.runtime.block_on(shares(&daemons));
            let held: usize = shares.iter().map(Vec::len).sum();
            if shares.iter().all(|s| !s.is_empty()) && held == self.partitions as usize {
                progress.update(held as u64, String::new);
                progress.finish();
                return Ok(daemons);
            }
            progress.update(held as u64, || format!("{n} daemon(s) joining: {shares:?}"));
            if started.elapsed() > Duration::from_secs(120) {
                bail!("{n} daemons did not share the partitions within 2 minutes: {shares:?}");
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// A producer to the broker, records sent within 5 ms.
    pub(super) fn producer(&self) -> anyhow::Result<FutureProducer> {
        Ok(ClientConfig::new()
            .set("bootstrap.servers", self.broker.bootstrap_servers())
            .set("linger.ms", "5")
            .set("queue.buffering.max.messages", "1000000")
            .create()?)
    }
}

/// Transfers whose source account decides the partition (`account % partitions`), so that
/// each account stays on one partition and every record's partition is known. Source
/// accounts follow [`pair`]: spread over every account.
pub(super) struct Stream {
    accounts: usize,
    partitions: i32,
    next: usize,
    keyring: tally_actors::signing::Keyring,
}

pub(super) type Delivery = rdkafka::producer::DeliveryFuture;

/// One record handed to the producer.
pub(super) struct Sent {
    pub(super) transfer_id: Uuid,
    pub(super) partition: i32,
    /// When it was produced, ms since the Unix epoch.
    pub(super) at_ms: f64,
    pub(super) delivery: Delivery,
}

impl Stream {
    pub(super) fn new(accounts: usize, partitions: i32) -> anyhow::Result<Self> {
        Ok(Self { accounts, partitions, next: 0, keyring: super::bench_keys()?.1 })
    }

    /// Sends the next transfer to `topic`.
    pub(super) fn send(&mut self, producer: &FutureProducer, topic: &str) -> anyhow::Result<Sent> {
        let n = self.next;
        self.next += 1;
        let (from, to) = pair(n, self.accounts);
        let partition = (from % self.partitions as usize) as i32;
        // Time-ordered, as the intake makes them.
        let transfer_id = Uuid::now_v7();
        let at_ms = epoch_ms();
        let event = serde_json::to_string(&TransferAnalyzed {
            event_id: tally_schema::derived_event_id("analyzed", transfer_id),
            transfer_id,
            source_account: account(from),
            destination_account: account(to),
            amount_cents: 1 + (n % 500) as i64,
            currency: "BRL".into(),
            score: 10,
            analyzed_at: chrono::Utc::now(),
            client: None,
        })?;
        let key = account(from);
        let kind = EventType::TransferAnalyzed.as_str();
        let event_id = tally_schema::derived_event_id("analyzed", transfer_id).to_string();
        let headers = OwnedHeaders::new()
            .insert(Header { key: "event-id", value: Some(&event_id) })
            .insert(Header { key: "event-type", value: Some(kind) });
        let headers = self.keyring.sign(headers, key.as_bytes(), event.as_bytes(), &event_id, kind);
        let record = FutureRecord::to(topic).key(&key).payload(&event).partition(partition).headers(headers);
        let delivery = producer.send_result(record).map_err(|(e, _)| e)?;
        Ok(Sent { transfer_id, partition, at_ms, delivery })
    }
}

/// Now, in ms since the Unix epoch (as the database's times are read).
pub(super) fn epoch_ms() -> f64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0.0, |d| d.as_secs_f64() * 1000.0)
}

/// The partitions of the ledger each daemon holds now (empty when it does not answer).
pub(super) async fn shares(daemons: &[Daemon]) -> Vec<Vec<i32>> {
    let mut all = Vec::with_capacity(daemons.len());
    for d in daemons {
        let held = http_get(&format!("{}/admin/pipelines", d.admin))
            .await
            .ok()
            .and_then(|body| serde_json::from_str::<serde_json::Value>(&body).ok())
            .and_then(|v| {
                v["pipelines"].as_array()?.iter().find(|p| p["name"] == "ledger").map(|p| {
                    p["partitions"]
                        .as_array()
                        .map(|ps| ps.iter().filter_map(|e| e["partition"].as_i64()).map(|p| p as i32).collect())
                        .unwrap_or_default()
                })
            })
            .unwrap_or_default();
        all.push(held);
    }
    all
}

/// A free loopback address, `127.0.0.1:port`.
pub(super) fn free_addr() -> anyhow::Result<String> {
    let port = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
    Ok(format!("127.0.0.1:{port}"))
}
