//! The black-box test harness of tally: a fresh PostgreSQL database per test
//! ([`TestDb`]), an embedded Kafka broker that outlives daemon restarts ([`TestEnv`]),
//! whole daemons started on port 0 ([`TestApp`]), Kafka topic readers ([`read_topic`]) and
//! deadline-bounded waits ([`wait_until`]). Test binaries live in `tests/`; nothing else
//! depends on this crate.
//!
//! Conventions every test follows:
//! - Each test owns its database and its broker, so default topic names never collide
//!   between tests running in parallel.
//! - Waiting is done with [`wait_until`] (poll every 50 ms, fail with the last observation
//!   after a deadline), never with a fixed sleep used as an assertion.
//! - The broker is librdkafka's mock cluster; tests say so in a comment.
//!
//! Harness functions panic (with a message) instead of returning errors: a failing set-up
//! is a failing test, and the panic message is the report. Hence `expect` is allowed here.
//!
//! ```no_run
//! # async fn demo() {
//! use tally_integration_tests::{spawn_app, wait_until, Deadline};
//! let (env, app) = spawn_app(|c| c.outbox.batch_size = 10).await;
//! let res = app.post_json("/transfers", &serde_json::json!({})).await;
//! assert_eq!(res.status(), 400);
//! let n = wait_until("nothing", Deadline::DEFAULT, || async { Ok::<_, String>(()) }).await;
//! # drop((env, app, n));
//! # }
//! ```

#![allow(clippy::expect_used)]

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Once};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context};
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::{Headers, Message};
use rdkafka::{ClientConfig, Offset, TopicPartitionList};
use tally_engine::broker::EmbeddedBroker;
use tally_engine::config::SecretUrl;
use tally_engine::{Config, DaemonHandle};
use tokio_postgres::types::ToSql;
use tokio_postgres::{Client, NoTls, Row};

pub mod noida;

pub use tally_engine;

/// The server on which tests create their databases.
pub const DEFAULT_DATABASE_URL: &str = "postgres://postgres@127.0.0.1:5432/postgres";

/// How long a wait may take before the test fails. Generous on purpose: these are
/// failure bounds for a loaded 2-core machine, not performance assertions.
#[derive(Debug, Clone, Copy)]
pub struct Deadline(pub Duration);

impl Deadline {
    /// The default bound of [`wait_until`] and [`read_topic`]: 60 s.
    pub const DEFAULT: Deadline = Deadline(Duration::from_secs(60));

    #[must_use]
    pub const fn secs(secs: u64) -> Self {
        Self(Duration::from_secs(secs))
    }
}

/// Installs the daemon's log subscriber once when `RUST_LOG` is set (e.g.
/// `RUST_LOG=info,tally=debug`); otherwise tests run silently.
pub fn init_logging() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        if let Ok(level) = std::env::var("RUST_LOG") {
            let log = tally_engine::config::LogConfig { level, ..Default::default() };
            tally_engine::telemetry::init(&log);
        }
    });
}

// ---------------------------------------------------------------------------------------
// Database
// ---------------------------------------------------------------------------------------

/// A fresh, uniquely named, fully migrated database on `TALLY_TEST_DATABASE_URL`
/// (default [`DEFAULT_DATABASE_URL`]). Dropping it drops the database (best effort,
/// `DROP DATABASE ... WITH (FORCE)`), even if daemons are still connected.
pub struct TestDb {
    name: String,
    url: String,
    admin_url: String,
    client: Client,
}

impl std::fmt::Debug for TestDb {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TestDb").field("name", &self.name).finish()
    }
}

impl TestDb {
    /// Creates the database, applies tally's migrations, and opens a client on it.
    ///
    /// # Panics
    /// When PostgreSQL is unreachable (run `scripts/ensure-postgres.sh`) or a migration
    /// fails.
    pub async fn new() -> Self {
        init_logging();
        let admin_url = std::env::var("TALLY_TEST_DATABASE_URL").unwrap_or_else(|_| DEFAULT_DATABASE_URL.to_owned());
        let name = format!("tally_test_{}", uuid::Uuid::new_v4().simple());
        let url = with_database(&admin_url, &name);
        let (admin, connection) = tokio_postgres::connect(&admin_url, NoTls).await.unwrap_or_else(|e| {
            panic!("cannot connect to {admin_url} (is PostgreSQL up? scripts/ensure-postgres.sh): {e}")
        });
        let driver = tokio::spawn(connection);
        admin.batch_execute(&format!("CREATE DATABASE \"{name}\"")).await.expect("CREATE DATABASE for the test");
        drop(admin);
        let _ = driver.await;
        let migrate_url = url.clone();
        tokio::task::spawn_blocking(move || tally_engine::database::prepare_blocking(&migrate_url))
            .await
            .expect("migration task")
            .expect("migrations apply to the test database");
        let client = connect(&url).await.expect("connect to the test database");
        Self { name, url, admin_url, client }
    }

    /// The database URL, for `database.url`.
    #[must_use]
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The database name.
    #[must_use]
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The harness's own client (autocommit). Use [`TestDb::connect`] for a connection
    /// that holds a transaction open.
    #[must_use]
    pub fn client(&self) -> &Client {
        &self.client
    }

    /// Opens a new connection to the test database (its driver runs on the current
    /// tokio runtime).
    ///
    /// # Panics
    /// When the connection fails.
    pub async fn connect(&self) -> Client {
        connect(&self.url).await.expect("open a connection to the test database")
    }

    /// Runs `sql` and returns every row.
    ///
    /// # Panics
    /// When the query fails; the message holds the SQL.
    pub async fn query(&self, sql: &str, params: &[&(dyn ToSql + Sync)]) -> Vec<Row> {
        self.client.query(sql, params).await.unwrap_or_else(|e| panic!("query failed: {sql}: {e}"))
    }

    /// Runs `sql` (one statement with parameters) and returns the number of rows affected.
    ///
    /// # Panics
    /// When the statement fails.
    pub async fn execute(&self, sql: &str, params: &[&(dyn ToSql + Sync)]) -> u64 {
        self.client.execute(sql, params).await.unwrap_or_else(|e| panic!("statement failed: {sql}: {e}"))
    }

    /// Runs several statements without parameters (e.g. a `BEGIN; ...; COMMIT`).
    ///
    /// # Panics
    /// When a statement fails.
    pub async fn batch(&self, sql: &str) {
        self.client.batch_execute(sql).await.unwrap_or_else(|e| panic!("batch failed: {sql}: {e}"));
    }

    /// The first column of the single row of `sql`, as `i64` (cast in SQL: `count(*)` is
    /// already `bigint`).
    ///
    /// # Panics
    /// When the query fails or does not return exactly one row.
    pub async fn scalar_i64(&self, sql: &str, params: &[&(dyn ToSql + Sync)]) -> i64 {
        self.client
            .query_one(sql, params)
            .await
            .unwrap_or_else(|e| panic!("query failed: {sql}: {e}"))
            .try_get(0)
            .unwrap_or_else(|e| panic!("first column of {sql} is not a bigint: {e}"))
    }

    /// `SELECT count(*) FROM <table>`.
    ///
    /// # Panics
    /// When the query fails.
    pub async fn count(&self, table: &str) -> i64 {
        self.scalar_i64(&format!("SELECT count(*) FROM {table}"), &[]).await
    }

    /// Number of outbox rows with `published_at` still NULL.
    pub async fn pending_outbox(&self) -> i64 {
        self.scalar_i64("SELECT count(*) FROM outbox_events WHERE published_at IS NULL", &[]).await
    }

    /// Waits until every outbox row is published.
    ///
    /// # Panics
    /// When that does not happen within [`Deadline::DEFAULT`].
    pub async fn wait_outbox_published(&self) {
        wait_until("every outbox row is published", Deadline::DEFAULT, || async {
            match self.pending_outbox().await {
                0 => Ok(()),
                pending => Err(format!("{pending} pending")),
            }
        })
        .await;
    }
}

impl Drop for TestDb {
    fn drop(&mut self) {
        let admin_url = self.admin_url.clone();
        let name = self.name.clone();
        // Drop may run inside a tokio runtime: do the async work on a thread of its own.
        let dropped = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().ok()?;
            runtime.block_on(async move {
                let (admin, connection) = tokio_postgres::connect(&admin_url, NoTls).await.ok()?;
                let driver = tokio::spawn(connection);
                let result = admin.batch_execute(&format!("DROP DATABASE IF EXISTS \"{name}\" WITH (FORCE)")).await;
                drop(admin);
                let _ = driver.await;
                result.ok()
            })
        })
        .join();
        if !matches!(dropped, Ok(Some(()))) {
            eprintln!("warning: could not drop test database {}", self.name);
        }
    }
}

async fn connect(url: &str) -> Result<Client, tokio_postgres::Error> {
    let (client, connection) = tokio_postgres::connect(url, NoTls).await?;
    tokio::spawn(async move {
        // Ends when the client is dropped or the database is dropped under it.
        let _ = connection.await;
    });
    Ok(client)
}

/// `url` with its database name replaced by `name` (query string kept).
fn with_database(url: &str, name: &str) -> String {
    let (base, query) = match url.split_once('?') {
        Some((b, q)) => (b, Some(q)),
        None => (url, None),
    };
    let scheme_end = base.find("://").map_or(0, |i| i + 3);
    let prefix = match base[scheme_end..].find('/') {
        Some(i) => &base[..scheme_end + i],
        None => base,
    };
    match query {
        Some(q) => format!("{prefix}/{name}?{q}"),
        None => format!("{prefix}/{name}"),
    }
}

// ---------------------------------------------------------------------------------------
// Environment and daemons
// ---------------------------------------------------------------------------------------

/// What outlives a daemon: the test database and the embedded broker (librdkafka mock
/// cluster). Spawn any number of daemons on it, at once or one after another.
pub struct TestEnv {
    pub db: TestDb,
    pub broker: Arc<EmbeddedBroker>,
}

impl std::fmt::Debug for TestEnv {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TestEnv").field("db", &self.db).field("broker", &self.broker).finish()
    }
}

impl TestEnv {
    /// A fresh database and a fresh embedded broker with the default broker count.
    ///
    /// # Panics
    /// When the database or the broker cannot be created.
    pub async fn new() -> Self {
        let db = TestDb::new().await;
        let broker = Arc::new(
            EmbeddedBroker::start(Config::default().kafka.embedded_brokers).expect("start the embedded Kafka broker"),
        );
        Self { db, broker }
    }

    /// The broker's `bootstrap.servers`.
    #[must_use]
    pub fn bootstrap(&self) -> &str {
        self.broker.bootstrap_servers()
    }

    /// The configuration [`TestEnv::spawn`] starts from: listeners on `127.0.0.1:0`, this
    /// environment's database, 1 HTTP worker, a small pool, a 50 ms outbox poll interval
    /// and short publisher backoff.
    #[must_use]
    pub fn config(&self) -> Config {
        let mut c = Config::default();
        // Unique per daemon: several daemons of one test are several instances.
        c.instance.id = format!("test-{}", &uuid::Uuid::new_v4().simple().to_string()[..12]);
        c.database.url = SecretUrl::new(self.db.url());
        c.database.pool_size = 4;
        c.kafka.embedded_brokers = self.broker.broker_count();
        c.http.intake_addr = ([127, 0, 0, 1], 0).into();
        c.http.admin_addr = ([127, 0, 0, 1], 0).into();
        c.http.workers = 1;
        c.outbox.poll_interval_ms = 50;
        c.outbox.backoff_initial_ms = 50;
        c.outbox.backoff_max_ms = 1_000;
        c
    }

    /// Starts a daemon on this environment (same database, same broker), after
    /// `configure` adjusted [`TestEnv::config`]; returns once it serves HTTP.
    ///
    /// # Panics
    /// When the configuration is invalid or the daemon cannot start.
    pub async fn spawn(&self, configure: impl FnOnce(&mut Config)) -> TestApp {
        let mut config = self.config();
        configure(&mut config);
        config.validate().expect("the test configuration is valid");
        let broker = Arc::clone(&self.broker);
        let spawn_config = config.clone();
        let handle = tokio::task::spawn_blocking(move || tally_engine::spawn(spawn_config, Some(broker)))
            .await
            .expect("daemon spawn task")
            .unwrap_or_else(|e| panic!("the daemon did not start: {e:#}"));
        TestApp::new(handle, config)
    }
}

/// Runs only the pipelines named in `names` (`outbox`, `ledger`, `antifraud`,
/// `projection`, `orders`, `notifications`); every other one is turned off.
pub fn run_only(c: &mut Config, names: &[&str]) {
    let p = &mut c.pipelines;
    for (name, on) in [
        ("outbox", &mut p.outbox),
        ("ledger", &mut p.ledger),
        ("antifraud", &mut p.antifraud),
        ("projection", &mut p.projection),
        ("orders", &mut p.orders),
        ("notifications", &mut p.notifications),
    ] {
        *on = names.contains(&name);
    }
}

/// A fresh [`TestEnv`] and one daemon on it, configured by `configure` (pass `|_| {}` for
/// the defaults). Bind as `let (env, app) = ...` so the daemon stops before the database
/// is dropped.
pub async fn spawn_app(configure: impl FnOnce(&mut Config)) -> (TestEnv, TestApp) {
    let env = TestEnv::new().await;
    let app = env.spawn(configure).await;
    (env, app)
}

/// One running daemon with an HTTP client. Dropping it (or [`TestApp::stop`]) shuts the
/// daemon down in order and waits for it.
pub struct TestApp {
    /// `http://127.0.0.1:<port>` of the intake listener.
    pub intake_url: String,
    /// `http://127.0.0.1:<port>` of the admin listener.
    pub admin_url: String,
    /// The Kafka bootstrap list the daemon uses.
    pub bootstrap: String,
    /// The configuration the daemon runs with.
    pub config: Config,
    pub client: reqwest::Client,
    handle: Option<DaemonHandle>,
}

impl std::fmt::Debug for TestApp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TestApp").field("intake_url", &self.intake_url).field("admin_url", &self.admin_url).finish()
    }
}

impl TestApp {
    pub(crate) fn new(handle: DaemonHandle, config: Config) -> Self {
        let client =
            reqwest::Client::builder().timeout(Duration::from_secs(30)).build().expect("build the HTTP client");
        Self {
            intake_url: format!("http://{}", handle.intake_addr),
            admin_url: format!("http://{}", handle.admin_addr),
            bootstrap: handle.bootstrap.clone(),
            config,
            client,
            handle: Some(handle),
        }
    }

    /// Shuts the daemon down in order and waits for its thread.
    pub async fn stop(mut self) {
        if let Some(handle) = self.handle.take() {
            tokio::task::spawn_blocking(move || handle.stop()).await.expect("daemon stop task");
        }
    }

    /// `POST <intake><path>` with a JSON body.
    ///
    /// # Panics
    /// When the request cannot be sent.
    pub async fn post_json(&self, path: &str, body: &serde_json::Value) -> reqwest::Response {
        self.send(self.client.post(format!("{}{path}", self.intake_url)).json(body)).await
    }

    /// `GET <intake><path>`.
    ///
    /// # Panics
    /// When the request cannot be sent.
    pub async fn get(&self, path: &str) -> reqwest::Response {
        self.send(self.client.get(format!("{}{path}", self.intake_url))).await
    }

    /// `GET <admin><path>`.
    ///
    /// # Panics
    /// When the request cannot be sent.
    pub async fn admin_get(&self, path: &str) -> reqwest::Response {
        self.send(self.client.get(format!("{}{path}", self.admin_url))).await
    }

    /// Sends any request built from [`TestApp::client`].
    ///
    /// # Panics
    /// When the request cannot be sent.
    pub async fn send(&self, request: reqwest::RequestBuilder) -> reqwest::Response {
        request.send().await.unwrap_or_else(|e| panic!("HTTP request failed: {e}"))
    }

    /// The Prometheus text of `GET /metrics`.
    ///
    /// # Panics
    /// When the endpoint does not answer 200.
    /// POSTs `body` verbatim with `content_type` to the intake listener.
    pub async fn post_raw(&self, path: &str, content_type: &str, body: impl Into<reqwest::Body>) -> reqwest::Response {
        self.send(
            self.client
                .post(format!("{}{path}", self.intake_url))
                .header(reqwest::header::CONTENT_TYPE, content_type)
                .body(body),
        )
        .await
    }

    pub async fn metrics(&self) -> String {
        let res = self.admin_get("/metrics").await;
        assert_eq!(res.status(), 200, "GET /metrics");
        res.text().await.expect("read /metrics")
    }

    /// How many partitions pipeline `name` holds now (`GET /admin/pipelines`); 0 when it
    /// does not run here.
    pub async fn partitions_of(&self, name: &str) -> usize {
        let all = json_body(self.admin_get("/admin/pipelines").await).await;
        let pipelines = all["pipelines"].as_array().cloned().unwrap_or_default();
        let pipeline = pipelines.iter().find(|p| p["name"] == name).cloned().unwrap_or_default();
        pipeline["partitions"].as_array().map_or(0, Vec::len)
    }

    /// Waits until every daemon in `apps` holds at least one partition of pipeline `name`
    /// and together they hold `total`.
    ///
    /// # Panics
    /// When that does not happen within [`Deadline::DEFAULT`].
    pub async fn wait_for_shares(apps: &[&Self], name: &str, total: usize) {
        wait_until(
            &format!("{} instances share the {total} partitions of {name}", apps.len()),
            Deadline::DEFAULT,
            || async {
                let mut shares = Vec::with_capacity(apps.len());
                for app in apps {
                    shares.push(app.partitions_of(name).await);
                }
                if shares.iter().all(|s| *s > 0) && shares.iter().sum::<usize>() == total {
                    Ok(())
                } else {
                    Err(format!("shares {shares:?}"))
                }
            },
        )
        .await;
    }

    /// The JSON of `GET /admin/outbox`.
    ///
    /// # Panics
    /// When the endpoint does not answer 200 with JSON.
    pub async fn outbox_backlog(&self) -> serde_json::Value {
        let res = self.admin_get("/admin/outbox").await;
        assert_eq!(res.status(), 200, "GET /admin/outbox");
        res.json().await.expect("/admin/outbox answers JSON")
    }
}

impl Drop for TestApp {
    fn drop(&mut self) {
        if let Some(handle) = self.handle.take() {
            handle.stop();
        }
    }
}

/// Reads a JSON response body, failing with the status and raw body when it is not JSON.
///
/// # Panics
/// When the body cannot be read or is not JSON.
pub async fn json_body(res: reqwest::Response) -> serde_json::Value {
    let status = res.status();
    let text = res.text().await.expect("read the response body");
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("response {status} is not JSON ({e}): {text}"))
}

/// The value of the sample `series` in Prometheus text (`name` or `name{labels}` exactly as
/// exposed, labels sorted by name); `None` when absent.
#[must_use]
pub fn metric_value(metrics: &str, series: &str) -> Option<f64> {
    metrics.lines().filter(|l| !l.starts_with('#')).find_map(|line| {
        let (name, value) = line.rsplit_once(' ')?;
        (name == series).then(|| value.parse().ok()).flatten()
    })
}

// ---------------------------------------------------------------------------------------
// Waiting
// ---------------------------------------------------------------------------------------

/// Polls `check` every 50 ms until it returns `Ok`, and returns that value. `check`
/// returns `Err(observation)` while the condition does not hold; when `deadline` passes,
/// the test fails with `what` and the last observation.
///
/// # Panics
/// When the deadline passes.
pub async fn wait_until<T, F, Fut>(what: &str, deadline: Deadline, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, String>>,
{
    let started = Instant::now();
    loop {
        match check().await {
            Ok(value) => return value,
            Err(observation) => {
                if started.elapsed() >= deadline.0 {
                    panic!("timed out after {:?} waiting until {what}; last observation: {observation}", deadline.0);
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

// ---------------------------------------------------------------------------------------
// Kafka
// ---------------------------------------------------------------------------------------

/// One Kafka record as read back by a test.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KafkaRecord {
    pub topic: String,
    pub partition: i32,
    pub offset: i64,
    pub key: Option<String>,
    pub payload: Option<Vec<u8>>,
    /// Every header in order, values as bytes (`None` for a null value).
    pub headers: Vec<(String, Option<Vec<u8>>)>,
}

impl KafkaRecord {
    /// An owned copy of a consumed message.
    #[must_use]
    pub fn from_message(m: &rdkafka::message::BorrowedMessage<'_>) -> Self {
        let headers = m
            .headers()
            .map(|hs| hs.iter().map(|h| (h.key.to_owned(), h.value.map(<[u8]>::to_vec))).collect())
            .unwrap_or_default();
        Self {
            topic: m.topic().to_owned(),
            partition: m.partition(),
            offset: m.offset(),
            key: m.key().map(|k| String::from_utf8_lossy(k).into_owned()),
            payload: m.payload().map(<[u8]>::to_vec),
            headers,
        }
    }

    /// The first header named `name`, as UTF-8 text.
    #[must_use]
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .and_then(|(_, v)| v.as_deref())
            .and_then(|v| std::str::from_utf8(v).ok())
    }

    /// Every header value named `name`.
    #[must_use]
    pub fn headers_named(&self, name: &str) -> Vec<Option<&[u8]>> {
        self.headers.iter().filter(|(k, _)| k == name).map(|(_, v)| v.as_deref()).collect()
    }

    /// The payload parsed as JSON.
    ///
    /// # Panics
    /// When the payload is absent or not JSON.
    #[must_use]
    pub fn payload_json(&self) -> serde_json::Value {
        let bytes = self.payload.as_deref().unwrap_or_else(|| panic!("record {self:?} has no payload"));
        serde_json::from_slice(bytes).unwrap_or_else(|e| {
            panic!(
                "payload of {}/{}@{} is not JSON ({e}): {}",
                self.topic,
                self.partition,
                self.offset,
                String::from_utf8_lossy(bytes)
            )
        })
    }
}

/// Reads every record present in `topic` when called, from the beginning of every
/// partition up to its high watermark, sorted by partition and offset. Blocking; see
/// [`read_topic`] for async code.
///
/// # Errors
/// When the topic does not exist, a client call fails, or `deadline` passes first.
pub fn read_topic_blocking(bootstrap: &str, topic: &str, deadline: Deadline) -> anyhow::Result<Vec<KafkaRecord>> {
    let started = Instant::now();
    let remaining = || deadline.0.saturating_sub(started.elapsed()).max(Duration::from_millis(1));
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("group.id", format!("tally-test-reader-{}", uuid::Uuid::new_v4().simple()))
        .set("enable.auto.commit", "false")
        .set("enable.auto.offset.store", "false")
        .set("auto.offset.reset", "earliest")
        .set("log_level", "3")
        .create()
        .context("cannot create the test consumer")?;
    let metadata = consumer
        .fetch_metadata(Some(topic), remaining())
        .with_context(|| format!("cannot fetch metadata of {topic}"))?;
    let meta = metadata
        .topics()
        .iter()
        .find(|t| t.name() == topic)
        .ok_or_else(|| anyhow!("metadata lists no topic {topic}"))?;
    if let Some(err) = meta.error() {
        bail!("topic {topic}: {:?}", rdkafka::error::RDKafkaErrorCode::from(err));
    }
    let mut assignment = TopicPartitionList::new();
    let mut high: HashMap<i32, i64> = HashMap::new();
    for p in meta.partitions() {
        let (low, hi) = consumer
            .fetch_watermarks(topic, p.id(), remaining())
            .with_context(|| format!("cannot fetch watermarks of {topic}/{}", p.id()))?;
        if hi > low {
            assignment.add_partition_offset(topic, p.id(), Offset::Offset(low))?;
            high.insert(p.id(), hi);
        }
    }
    let mut records = Vec::new();
    if high.is_empty() {
        return Ok(records);
    }
    consumer.assign(&assignment).context("cannot assign partitions")?;
    while !high.is_empty() {
        if started.elapsed() >= deadline.0 {
            bail!(
                "deadline of {:?} passed reading {topic}: {} records read, partitions not at their end: {high:?}",
                deadline.0,
                records.len()
            );
        }
        match consumer.poll(Duration::from_millis(100)) {
            None => {}
            Some(Err(e)) => return Err(e).with_context(|| format!("cannot consume {topic}")),
            Some(Ok(m)) => {
                let record = KafkaRecord::from_message(&m);
                if high.get(&record.partition).is_some_and(|hi| record.offset + 1 >= *hi) {
                    high.remove(&record.partition);
                }
                records.push(record);
            }
        }
    }
    records.sort_by_key(|r| (r.partition, r.offset));
    Ok(records)
}

/// [`read_topic_blocking`] on a blocking thread.
///
/// # Errors
/// As [`read_topic_blocking`].
pub async fn read_topic(bootstrap: &str, topic: &str, deadline: Deadline) -> anyhow::Result<Vec<KafkaRecord>> {
    let (bootstrap, topic) = (bootstrap.to_owned(), topic.to_owned());
    tokio::task::spawn_blocking(move || read_topic_blocking(&bootstrap, &topic, deadline))
        .await
        .context("topic reader task failed")?
}

/// Waits until `topic` holds records that satisfy `done` (called with every record read
/// from the beginning), and returns them. `done` returns `Err(observation)` while not yet
/// satisfied.
///
/// # Panics
/// When `deadline` passes.
pub async fn wait_for_records<F>(bootstrap: &str, topic: &str, deadline: Deadline, mut done: F) -> Vec<KafkaRecord>
where
    F: FnMut(&[KafkaRecord]) -> Result<(), String>,
{
    let started = Instant::now();
    loop {
        let observation = match read_topic(bootstrap, topic, Deadline::secs(10)).await {
            Ok(records) => match done(&records) {
                Ok(()) => return records,
                Err(observation) => observation,
            },
            Err(e) => format!("{e:#}"),
        };
        if started.elapsed() >= deadline.0 {
            panic!(
                "timed out after {:?} waiting for the expected records on {topic}; last observation: {observation}",
                deadline.0
            );
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The `tally` binary of this workspace, built first when needed (a no-op when it is up to
/// date), for tests that run the daemon as a separate process (e.g. to kill it).
///
/// # Panics
/// When the build fails or the binary cannot be found.
#[must_use]
pub fn tally_binary() -> std::path::PathBuf {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let status = std::process::Command::new(cargo)
        .args(["build", "--quiet", "-p", "tally-engine", "--bin", "tally"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .status()
        .expect("run cargo build for the tally binary");
    assert!(status.success(), "cargo build -p tally-engine --bin tally failed");
    // This test executable lives in target/<profile>/deps/.
    let exe = std::env::current_exe().expect("current test executable");
    let profile_dir = exe.parent().and_then(std::path::Path::parent).expect("target/<profile>");
    let binary = profile_dir.join("tally");
    assert!(binary.exists(), "{} not found", binary.display());
    binary
}

/// Starts `tally run` as a child process on `env` (its database, and its embedded broker
/// as an external cluster), listeners on port 0, with extra `TALLY__*` variables. Its logs
/// go to `target/<profile>/tally-child.log`, or `tally-child-<instance id>.log` when
/// `extra` names the instance (appended across restarts), for post-mortems. Kill it with
/// `Child::kill`.
///
/// # Panics
/// When the process cannot be started.
#[must_use]
pub fn spawn_tally_process(env: &TestEnv, extra: &[(&str, &str)]) -> std::process::Child {
    let binary = tally_binary();
    let log = match extra.iter().find(|(k, _)| *k == "TALLY__INSTANCE__ID") {
        Some((_, id)) => binary.with_file_name(format!("tally-child-{id}.log")),
        None => binary.with_file_name("tally-child.log"),
    };
    let stderr = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&log)
        .map_or_else(|_| std::process::Stdio::null(), std::process::Stdio::from);
    std::process::Command::new(binary)
        .arg("run")
        .env("TALLY__DATABASE__URL", env.db.url())
        .env("TALLY__DATABASE__POOL_SIZE", "4")
        .env("TALLY__KAFKA__BROKERS", env.bootstrap())
        // The mock cluster has no Admin API; the harness created the topics.
        .env("TALLY__KAFKA__CREATE_TOPICS", "false")
        .env("TALLY__HTTP__INTAKE_ADDR", "127.0.0.1:0")
        .env("TALLY__HTTP__ADMIN_ADDR", "127.0.0.1:0")
        .env("TALLY__INSTANCE__ID", format!("test-child-{}", &uuid::Uuid::new_v4().simple().to_string()[..12]))
        .envs(extra.iter().copied())
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(stderr)
        .spawn()
        .expect("start tally run")
}

/// One request received by a [`WebhookReceiver`].
#[derive(Debug, Clone)]
pub struct ReceivedCall {
    pub at: std::time::SystemTime,
    pub headers: std::collections::HashMap<String, String>,
    pub body: Vec<u8>,
    /// The status answered.
    pub status: u16,
}

/// A local HTTP server playing a webhook receiver: it records every request and answers
/// with the status `respond` chooses (given the request body and how many calls came
/// before). Each answer closes the connection.
pub struct WebhookReceiver {
    pub url: String,
    calls: Arc<std::sync::Mutex<Vec<ReceivedCall>>>,
    task: tokio::task::JoinHandle<()>,
}

impl std::fmt::Debug for WebhookReceiver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WebhookReceiver").field("url", &self.url).finish()
    }
}

type Responder = dyn Fn(&[u8], usize) -> u16 + Send + Sync;

impl WebhookReceiver {
    /// Starts the receiver on a free loopback port.
    ///
    /// # Panics
    /// When no port can be bound.
    pub async fn start(respond: impl Fn(&[u8], usize) -> u16 + Send + Sync + 'static) -> Self {
        use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind the webhook receiver");
        let url = format!("http://{}/hook", listener.local_addr().expect("local addr"));
        let calls: Arc<std::sync::Mutex<Vec<ReceivedCall>>> = Arc::default();
        let respond: Arc<Responder> = Arc::new(respond);
        let recorded = Arc::clone(&calls);
        let task = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let (recorded, respond) = (Arc::clone(&recorded), Arc::clone(&respond));
                tokio::spawn(async move {
                    let mut reader = BufReader::new(stream);
                    let mut line = String::new();
                    if reader.read_line(&mut line).await.unwrap_or(0) == 0 {
                        return;
                    }
                    let mut headers = std::collections::HashMap::new();
                    loop {
                        line.clear();
                        if reader.read_line(&mut line).await.unwrap_or(0) == 0 {
                            return;
                        }
                        let trimmed = line.trim_end();
                        if trimmed.is_empty() {
                            break;
                        }
                        if let Some((k, v)) = trimmed.split_once(':') {
                            headers.insert(k.trim().to_ascii_lowercase(), v.trim().to_owned());
                        }
                    }
                    let len: usize = headers.get("content-length").and_then(|v| v.parse().ok()).unwrap_or(0);
                    let mut body = vec![0; len];
                    if reader.read_exact(&mut body).await.is_err() {
                        return;
                    }
                    let status = {
                        let mut calls = recorded.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
                        let status = respond(&body, calls.len());
                        calls.push(ReceivedCall { at: std::time::SystemTime::now(), headers, body, status });
                        status
                    };
                    let reply = format!("HTTP/1.1 {status} X\r\ncontent-length: 0\r\nconnection: close\r\n\r\n");
                    let mut stream = reader.into_inner();
                    let _ = stream.write_all(reply.as_bytes()).await;
                    let _ = stream.shutdown().await;
                });
            }
        });
        Self { url, calls, task }
    }

    /// Every call so far, in arrival order.
    #[must_use]
    pub fn calls(&self) -> Vec<ReceivedCall> {
        self.calls.lock().unwrap_or_else(std::sync::PoisonError::into_inner).clone()
    }
}

impl Drop for WebhookReceiver {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// An idempotent producer (acks=all) for tests that play an upstream stage.
///
/// # Panics
/// When the producer cannot be created.
pub fn producer(bootstrap: &str) -> rdkafka::producer::FutureProducer {
    rdkafka::config::ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("enable.idempotence", "true")
        .set("acks", "all")
        .create()
        .expect("test producer")
}

/// Produces one record (to `partition` when given, else by key) with `headers`; returns
/// its (partition, offset).
///
/// # Panics
/// When the broker does not acknowledge it.
pub async fn produce(
    producer: &rdkafka::producer::FutureProducer,
    topic: &str,
    partition: Option<i32>,
    key: &str,
    payload: &[u8],
    headers: &[(&str, &str)],
) -> (i32, i64) {
    use rdkafka::message::{Header, OwnedHeaders};
    let mut hdrs = OwnedHeaders::new_with_capacity(headers.len());
    for (k, v) in headers {
        hdrs = hdrs.insert(Header { key: k, value: Some(v.as_bytes()) });
    }
    let mut record = rdkafka::producer::FutureRecord::to(topic).key(key).payload(payload).headers(hdrs);
    if let Some(p) = partition {
        record = record.partition(p);
    }
    producer
        .send(record, Duration::from_secs(10))
        .await
        .map(|d| (d.partition, d.offset))
        .map_err(|(e, _)| e)
        .expect("produce")
}

/// Produces `payload` keyed by `key` to `topic` as an upstream stage would: with a fresh
/// `event-id` and `event-type` headers; returns its (partition, offset).
pub async fn produce_event(
    producer: &rdkafka::producer::FutureProducer,
    topic: &str,
    partition: Option<i32>,
    key: &str,
    payload: &[u8],
    event_type: &str,
) -> (i32, i64) {
    let event_id = uuid::Uuid::new_v4().to_string();
    produce(producer, topic, partition, key, payload, &[("event-id", &event_id), ("event-type", event_type)]).await
}

/// The committed offset (the next one to read) of `group` on `topic`/`partition`, or -1.
/// Reads without joining the group.
///
/// # Panics
/// When the offsets cannot be fetched.
#[must_use]
pub fn committed_offset(bootstrap: &str, group: &str, topic: &str, partition: i32) -> i64 {
    use rdkafka::consumer::Consumer;
    let consumer: rdkafka::consumer::BaseConsumer = rdkafka::config::ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("group.id", group)
        .create()
        .expect("offset reader");
    let mut tpl = rdkafka::TopicPartitionList::new();
    tpl.add_partition(topic, partition);
    let committed = consumer.committed_offsets(tpl, Duration::from_secs(5)).expect("committed offsets");
    match committed.find_partition(topic, partition).map(|e| e.offset()) {
        Some(rdkafka::Offset::Offset(o)) => o,
        _ => -1,
    }
}

/// Waits until `group` committed past `offset` of `topic`/`partition` (it finished it).
pub async fn wait_committed_past(bootstrap: &str, group: &str, topic: &str, partition: i32, offset: i64) {
    let (bootstrap, group, topic) = (bootstrap.to_owned(), group.to_owned(), topic.to_owned());
    wait_until(&format!("{group}: offset {offset} of {topic}/{partition} committed"), Deadline::DEFAULT, || {
        let (bootstrap, group, topic) = (bootstrap.clone(), group.clone(), topic.clone());
        async move {
            let c = tokio::task::spawn_blocking(move || committed_offset(&bootstrap, &group, &topic, partition))
                .await
                .expect("offset task");
            if c > offset {
                Ok(c)
            } else {
                Err(format!("committed {c}"))
            }
        }
    })
    .await;
}

/// Asserts an error response: `status`, a JSON content type, and exactly the body
/// `{"error":{"code": code, "message": <non-empty>}}`.
///
/// # Panics
/// When the response is not that error.
pub async fn assert_error(res: reqwest::Response, status: reqwest::StatusCode, code: &str, case: &str) {
    assert_eq!(res.status(), status, "{case}: status");
    let content_type =
        res.headers().get(reqwest::header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).unwrap_or("").to_owned();
    assert!(content_type.starts_with("application/json"), "{case}: content type {content_type:?}");
    let body = json_body(res).await;
    assert_eq!(body["error"]["code"], code, "{case}: error code in {body}");
    let message = body["error"]["message"].as_str().unwrap_or("");
    assert!(!message.is_empty(), "{case}: error message in {body}");
    assert_eq!(body.as_object().map(|o| o.len()), Some(1), "{case}: only `error` at the top level of {body}");
}

// ---------------------------------------------------------------------------------------
// The transfer flow as a client sees it
// ---------------------------------------------------------------------------------------

/// `POST /accounts`; asserts 201.
///
/// # Panics
/// When the account is not created.
pub async fn create_account(app: &TestApp, id: &str, balance: i64, currency: &str) {
    let res = app
        .post_json("/accounts", &serde_json::json!({ "id": id, "currency": currency, "initialBalanceCents": balance }))
        .await;
    assert_eq!(res.status(), reqwest::StatusCode::CREATED, "create account {id}");
}

/// `POST /transfers` in BRL; asserts 201 and returns the transfer id.
///
/// # Panics
/// When the transfer is not accepted.
pub async fn post_transfer(app: &TestApp, from: &str, to: &str, amount: i64) -> uuid::Uuid {
    let res = app
        .post_json(
            "/transfers",
            &serde_json::json!({ "sourceAccount": from, "destinationAccount": to, "amountCents": amount, "currency": "BRL" }),
        )
        .await;
    assert_eq!(res.status(), reqwest::StatusCode::CREATED, "POST /transfers");
    serde_json::from_value(json_body(res).await["id"].clone()).expect("transfer id")
}

/// Waits until the transfer leaves PENDING and returns its view.
pub async fn final_state(app: &TestApp, id: uuid::Uuid) -> serde_json::Value {
    wait_until(&format!("transfer {id} reaches a final status"), Deadline::DEFAULT, || async {
        let body = json_body(app.get(&format!("/transfers/{id}")).await).await;
        if body["status"] == "PENDING" {
            Err(body.to_string())
        } else {
            Ok(body)
        }
    })
    .await
}

/// The number of postings of a transfer.
pub async fn postings_of(db: &TestDb, id: uuid::Uuid) -> i64 {
    db.scalar_i64("SELECT count(*) FROM postings WHERE transfer_id = $1", &[&id]).await
}

/// An account's balance, through `GET /accounts/{id}`.
///
/// # Panics
/// When the answer has no balance.
pub async fn balance_of(app: &TestApp, id: &str) -> i64 {
    json_body(app.get(&format!("/accounts/{id}")).await).await["balanceCents"].as_i64().expect("balanceCents")
}

/// `/admin/ledger/check`, asserted ok (every invariant named in the message otherwise).
pub async fn assert_ledger_ok(app: &TestApp) -> serde_json::Value {
    let check = json_body(app.admin_get("/admin/ledger/check").await).await;
    assert_eq!(check["ok"], true, "{check}");
    check
}

// ---------------------------------------------------------------------------------------
// Database outages
// ---------------------------------------------------------------------------------------

impl TestDb {
    /// Starts an outage of this database: it refuses new connections and every open one
    /// (the daemon's pooled connections and this handle's own client) is terminated.
    ///
    /// # Panics
    /// When the server cannot be reached.
    pub async fn refuse_connections(&self) {
        self.admin(&format!(
            "ALTER DATABASE \"{0}\" ALLOW_CONNECTIONS false; \
             SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
             WHERE datname = '{0}' AND pid <> pg_backend_pid();",
            self.name
        ))
        .await;
    }

    /// Starts or ends an outage for tally's processes only: the database refuses new
    /// connections and tally's open ones (application names `tally*`) are terminated,
    /// while this handle's own connection lives on.
    ///
    /// # Panics
    /// When the server cannot be reached.
    pub async fn refuse_tally(&self, refuse: bool) {
        let allow = if refuse { "false" } else { "true" };
        let mut sql = format!("ALTER DATABASE \"{}\" ALLOW_CONNECTIONS {allow};", self.name);
        if refuse {
            sql.push_str(&format!(
                " SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
                 WHERE datname = '{}' AND application_name LIKE 'tally%';",
                self.name
            ));
        }
        self.admin(&sql).await;
    }

    /// Ends the outage of [`TestDb::refuse_connections`] and reconnects this handle.
    ///
    /// # Panics
    /// When the server cannot be reached.
    pub async fn allow_connections(&mut self) {
        self.admin(&format!("ALTER DATABASE \"{}\" ALLOW_CONNECTIONS true", self.name)).await;
        self.client = connect(&self.url).await.expect("reconnect to the test database");
    }

    async fn admin(&self, sql: &str) {
        let (admin, connection) = tokio_postgres::connect(&self.admin_url, NoTls).await.expect("connect as admin");
        let driver = tokio::spawn(connection);
        admin.batch_execute(sql).await.expect("admin statement");
        drop(admin);
        let _ = driver.await;
    }
}

/// A TCP forwarder to PostgreSQL for one daemon, so that a test can cut that daemon off
/// its database while others keep theirs.
pub struct DbProxy {
    /// The test database's URL through the proxy.
    pub url: String,
    up: Arc<std::sync::atomic::AtomicBool>,
    cut: tokio::sync::watch::Sender<u64>,
    task: tokio::task::JoinHandle<()>,
}

impl std::fmt::Debug for DbProxy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DbProxy").field("url", &self.url).finish()
    }
}

impl DbProxy {
    /// Forwards a loopback port to the server of `db` (127.0.0.1:5432 unless its URL says
    /// otherwise).
    ///
    /// # Panics
    /// When no port can be bound or the URL has no `host:port`.
    pub async fn start(db: &TestDb) -> Self {
        use std::sync::atomic::Ordering;
        let rest = db.url().split_once('@').map(|(_, r)| r).expect("user@host in the URL");
        let target = rest.split_once('/').map(|(h, _)| h).expect("host/db in the URL").to_owned();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind the proxy");
        let port = listener.local_addr().expect("proxy address").port();
        let url = db.url().replacen(&target, &format!("127.0.0.1:{port}"), 1);
        let up = Arc::new(std::sync::atomic::AtomicBool::new(true));
        let (cut, cuts) = tokio::sync::watch::channel(0_u64);
        let accepting = Arc::clone(&up);
        let task = tokio::spawn(async move {
            while let Ok((mut inbound, _)) = listener.accept().await {
                if !accepting.load(Ordering::Acquire) {
                    continue; // dropped: the connection is refused
                }
                let target = target.clone();
                let mut cuts = cuts.clone();
                // Only a cut after this connection was accepted ends it.
                cuts.borrow_and_update();
                tokio::spawn(async move {
                    let Ok(mut outbound) = tokio::net::TcpStream::connect(&target).await else { return };
                    tokio::select! {
                        _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound) => {}
                        _ = cuts.changed() => {}
                    }
                });
            }
        });
        Self { url, up, cut, task }
    }

    /// Cuts every forwarded connection and refuses new ones.
    pub fn cut(&self) {
        self.up.store(false, std::sync::atomic::Ordering::Release);
        self.cut.send_modify(|n| *n += 1);
    }

    /// Forwards new connections again.
    pub fn restore(&self) {
        self.up.store(true, std::sync::atomic::Ordering::Release);
    }
}

impl Drop for DbProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The dead-letter topics of `topics` that hold records, with their record counts.
///
/// # Panics
/// When a dead-letter topic cannot be read (e.g. it does not exist).
pub async fn non_empty_dlts(bootstrap: &str, topics: &[&str]) -> Vec<(String, usize)> {
    let mut found = Vec::new();
    for topic in topics {
        let dlt = format!("{topic}-dlt");
        let records =
            read_topic(bootstrap, &dlt, Deadline::secs(10)).await.unwrap_or_else(|e| panic!("read {dlt}: {e:#}"));
        if !records.is_empty() {
            found.push((dlt, records.len()));
        }
    }
    found
}
