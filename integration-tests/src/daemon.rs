//! Daemons under test: the environment that outlives them (database and embedded
//! broker), daemons in this process on port 0, and `tally run` as a child process.

use super::*;

/// What outlives a daemon: the test database and the embedded broker (librdkafka mock
/// cluster). Spawn any number of daemons on it, at once or one after another.
pub struct TestEnv {
    pub db: TestDb,
    pub broker: Arc<EmbeddedBroker>,
    /// The consumer group protocol of every daemon spawned here (`kafka.group_protocol`).
    pub protocol: GroupProtocol,
}

impl std::fmt::Debug for TestEnv {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TestEnv")
            .field("db", &self.db)
            .field("broker", &self.broker)
            .field("protocol", &self.protocol)
            .finish()
    }
}

impl TestEnv {
    /// A fresh database and a fresh embedded broker with the default broker count.
    ///
    /// # Panics
    /// When the database or the broker cannot be created.
    pub async fn new() -> Self {
        Self::under(GroupProtocol::Classic).await
    }

    /// [`TestEnv::new`] whose daemons join their groups under `protocol`.
    ///
    /// # Panics
    /// When the database or the broker cannot be created.
    pub async fn under(protocol: GroupProtocol) -> Self {
        let db = TestDb::new().await;
        let broker = Arc::new(
            EmbeddedBroker::start(Config::default().kafka.embedded_brokers).expect("start the embedded Kafka broker"),
        );
        Self { db, broker, protocol }
    }

    /// The broker's `bootstrap.servers`.
    #[must_use]
    pub fn bootstrap(&self) -> &str {
        self.broker.bootstrap_servers()
    }

    /// The configuration [`TestEnv::spawn`] starts from: listeners on `127.0.0.1:0`, this
    /// environment's database, 1 HTTP worker, small pools ([`test_pools`]), a 50 ms outbox
    /// poll interval and short publisher backoff.
    #[must_use]
    pub fn config(&self) -> Config {
        let mut c = Config::default();
        // Unique per daemon: several daemons of one test are several instances.
        c.instance.id = format!("test-{}", &uuid::Uuid::new_v4().simple().to_string()[..12]);
        c.database.url = SecretUrl::new(self.db.url());
        c.database.pools = test_pools();
        c.kafka.embedded_brokers = self.broker.broker_count();
        c.kafka.group_protocol = self.protocol;
        c.http.intake_addr = ([127, 0, 0, 1], 0).into();
        c.http.admin_addr = ([127, 0, 0, 1], 0).into();
        c.http.workers = 1;
        c.outbox.poll_interval = std::time::Duration::from_millis(50);
        c.outbox.backoff_initial = std::time::Duration::from_millis(50);
        c.outbox.backoff_max = std::time::Duration::from_millis(1_000);
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

/// The database pools of a daemon under test: smaller than the defaults, as tests run
/// several daemons at once on one PostgreSQL. The outbox's follows `outbox.concurrency`.
#[must_use]
pub fn test_pools() -> PoolsConfig {
    let mut pools = PoolsConfig::default();
    for (name, size) in
        [("http", 4), ("ledger", 4), ("antifraud", 2), ("projection", 3), ("orders", 2), ("notifications", 3)]
    {
        pools.set(DbPool::named(name), size);
    }
    pools
}

/// [`test_pools`] as `TALLY__DATABASE__POOLS__*` variables, for `tally run` children.
#[must_use]
pub fn test_pools_env() -> Vec<(String, String)> {
    let pools = test_pools();
    DbPool::all()
        .into_iter()
        .filter_map(|p| {
            pools.get(p).map(|n| (format!("TALLY__DATABASE__POOLS__{}", p.name().to_uppercase()), n.to_string()))
        })
        .collect()
}

/// Runs only the pipelines named in `names` (`outbox`, `ledger`, `antifraud`,
/// `projection`, `orders`, `notifications`); every other one is turned off.
pub fn run_only(c: &mut Config, names: &[&str]) {
    for name in tally_engine::config::PipelinesConfig::names() {
        c.pipelines.set(name, names.contains(&name));
    }
}

/// A fresh [`TestEnv`] and one daemon on it, configured by `configure` (pass `|_| {}` for
/// the defaults). Bind as `let (env, app) = ...` so the daemon stops before the database
/// is dropped.
pub async fn spawn_app(configure: impl FnOnce(&mut Config)) -> (TestEnv, TestApp) {
    spawn_app_under(GroupProtocol::Classic, configure).await
}

/// [`spawn_app`] with the daemon's groups joined under `protocol`.
pub async fn spawn_app_under(protocol: GroupProtocol, configure: impl FnOnce(&mut Config)) -> (TestEnv, TestApp) {
    let env = TestEnv::under(protocol).await;
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
        // A failing test: its logs' last lines, before the daemon's stop adds its own.
        crate::logs::print_tails_on_failure();
        if let Some(handle) = self.handle.take() {
            handle.stop();
        }
    }
}

/// The `tally` binary of this workspace: `TALLY_TEST_BINARY` when set (`make test` sets it
/// to the binary its build just made), else built first when needed, for tests that run
/// the daemon as a separate process (e.g. to kill it). The build is the workspace's, all
/// targets, as the tests' own: the binary then has the features the tests were built with,
/// and after any build of the whole workspace's tests it is a no-op (building
/// `-p tally-engine` alone would resolve other features and rebuild half the workspace).
///
/// # Panics
/// When the build fails or the binary cannot be found.
#[must_use]
pub fn tally_binary() -> std::path::PathBuf {
    static BINARY: std::sync::OnceLock<std::path::PathBuf> = std::sync::OnceLock::new();
    BINARY
        .get_or_init(|| {
            if let Some(binary) = std::env::var_os("TALLY_TEST_BINARY") {
                return std::path::PathBuf::from(binary);
            }
            let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
            let status = std::process::Command::new(cargo)
                .args(["build", "--quiet", "--workspace", "--all-targets"])
                .current_dir(env!("CARGO_MANIFEST_DIR"))
                .status()
                .expect("run cargo build for the tally binary");
            assert!(status.success(), "cargo build --workspace --all-targets failed");
            // This test executable lives in target/<profile>/deps/.
            let exe = std::env::current_exe().expect("current test executable");
            let profile_dir = exe.parent().and_then(std::path::Path::parent).expect("target/<profile>");
            let binary = profile_dir.join("tally");
            assert!(binary.exists(), "{} not found", binary.display());
            binary
        })
        .clone()
}

/// A `tally run` child process, killed (SIGKILL) and reaped when dropped, so that a test
/// that fails half-way leaves no daemon behind. Derefs to its [`std::process::Child`].
#[derive(Debug)]
pub struct TallyProcess(std::process::Child, Option<std::path::PathBuf>);

impl TallyProcess {
    /// Takes charge of `child`: it is killed when this is dropped.
    #[must_use]
    pub fn new(child: std::process::Child) -> Self {
        Self(child, None)
    }

    /// Takes charge of `child`, whose stderr goes to the file at `log`.
    #[must_use]
    pub fn with_log(child: std::process::Child, log: std::path::PathBuf) -> Self {
        Self(child, Some(log))
    }

    /// What the process has logged so far (empty when its log is not known).
    #[must_use]
    pub fn log_text(&self) -> String {
        self.1.as_ref().and_then(|p| std::fs::read_to_string(p).ok()).unwrap_or_default()
    }

    /// Sends the signal named `name` (`TERM`, `STOP`, `CONT`, ...) with kill(1); whether
    /// it was delivered.
    #[must_use]
    pub fn signal(&self, name: &str) -> bool {
        std::process::Command::new("kill")
            .arg(format!("-{name}"))
            .arg(self.0.id().to_string())
            .status()
            .is_ok_and(|s| s.success())
    }
}

impl std::ops::Deref for TallyProcess {
    type Target = std::process::Child;
    fn deref(&self) -> &Self::Target {
        &self.0
    }
}

impl std::ops::DerefMut for TallyProcess {
    fn deref_mut(&mut self) -> &mut Self::Target {
        &mut self.0
    }
}

impl Drop for TallyProcess {
    fn drop(&mut self) {
        crate::logs::print_tails_on_failure();
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts `tally run` as a child process on `env` (its database, and its embedded broker
/// as an external cluster), listeners on port 0, with extra `TALLY__*` variables. Its logs
/// go to `tally-<instance id>.log` in the test's log folder ([`crate::logs`]), appended
/// across restarts under one id. Kill it with `Child::kill`, or drop it.
///
/// # Panics
/// When the process cannot be started.
#[must_use]
pub fn spawn_tally_process(env: &TestEnv, extra: &[(&str, &str)]) -> TallyProcess {
    let binary = tally_binary();
    let instance = extra.iter().find(|(k, _)| *k == "TALLY__INSTANCE__ID").map_or_else(
        || format!("test-child-{}", &uuid::Uuid::new_v4().simple().to_string()[..12]),
        |(_, id)| (*id).to_owned(),
    );
    let (log, stderr) = crate::logs::child_log(&format!("tally-{instance}.log"));
    std::process::Command::new(binary)
        .arg("run")
        .env("TALLY__DATABASE__URL", env.db.url())
        .envs(test_pools_env())
        .env("TALLY__KAFKA__BROKERS", env.bootstrap())
        .env("TALLY__SIGNING__KEYS_DIR", env.keys_dir())
        // The mock cluster has no Admin API; the harness created the topics.
        .env("TALLY__KAFKA__CREATE_TOPICS", "false")
        .env("TALLY__HTTP__INTAKE_ADDR", "127.0.0.1:0")
        .env("TALLY__HTTP__ADMIN_ADDR", "127.0.0.1:0")
        .env("TALLY__INSTANCE__ID", &instance)
        .env("TALLY__KAFKA__GROUP_PROTOCOL", env.protocol.name())
        .envs(extra.iter().copied())
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(stderr)
        .spawn()
        .map(|child| TallyProcess::with_log(child, log))
        .expect("start tally run")
}

/// `127.0.0.1:<port>` of a port free a moment ago, for a child process's listener (it may
/// be taken in between: a test then fails to start its daemon, visibly).
#[must_use]
pub fn free_addr() -> String {
    let port = std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).expect("free port").port();
    format!("127.0.0.1:{port}")
}

/// Waits (bounded by `deadline`) for `child` to exit on its own; whether it exited 0.
///
/// # Panics
/// When the deadline passes.
pub async fn wait_exit(child: &mut std::process::Child, what: &str, deadline: Deadline) -> bool {
    wait_until(what, deadline, || {
        let status = child.try_wait();
        async move {
            match status {
                Ok(Some(s)) => Ok(s.success()),
                Ok(None) => Err("still running".to_owned()),
                Err(e) => Err(e.to_string()),
            }
        }
    })
    .await
}
