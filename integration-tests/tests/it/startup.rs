//! What a new operator meets in the first ten minutes: secrets that never print, an admin
//! listener that shows no record without the token, `tally run` against `tally broker`
//! with default settings, readiness that means able, a clean stop, a body limit that fits
//! a Kafka record, and `-dlt` topics with at least their source's partitions.
//!
//! Brokers: `tally broker` child processes (the librdkafka mock cluster in its own
//! process), the embedded broker of a `tally run` child, or the harness's embedded broker.
//! Database: a fresh PostgreSQL database per test.
#![allow(clippy::expect_used)] // tests: a failed expectation is a failed test, with its message

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;

use reqwest::StatusCode;
use serde_json::json;
use tally_integration_tests::{
    assert_error, free_addr, json_body, spawn_app, tally_binary, wait_exit, wait_settled, wait_until, Deadline, TestDb,
    TestEnv,
};

/// Every secret of the configuration is set to a value that starts with this.
const MARKER: &str = "zz-marker-7f3a";
const TOKEN: &str = "first-run-token";

/// A child process killed however the test ends; its stderr goes to `log`.
pub(crate) struct Proc {
    pub(crate) child: Child,
    log: PathBuf,
}

impl Proc {
    /// `tally <args>` with `envs`, stdout piped, stderr to `target/<profile>/first-run-<name>.log`.
    pub(crate) fn start(name: &str, args: &[&str], envs: &[(&str, &str)]) -> Self {
        let binary = tally_binary();
        let log = binary.with_file_name(format!("first-run-{name}-{}.log", uuid::Uuid::new_v4().simple()));
        let stderr = std::fs::File::create(&log).expect("child log file");
        // A daemon on a broker of its own signs its events with a key of its own, unless
        // the test names the keys.
        let keys = (args.contains(&"run") && !envs.iter().any(|(k, _)| *k == "TALLY__SIGNING__KEYS_DIR")).then(|| {
            let key = tally_actors::signing::SigningKey::random("test").expect("a random key");
            tally_integration_tests::write_keys_dir(&key)
        });
        let child = Command::new(binary)
            .args(args)
            .envs(envs.iter().copied())
            .envs(keys.iter().map(|dir| ("TALLY__SIGNING__KEYS_DIR", dir)))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(stderr)
            .spawn()
            .expect("start tally");
        Self { child, log }
    }

    pub(crate) fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// SIGTERM, then waits for the exit; whether it exited successfully.
    fn terminate(&mut self) -> bool {
        let _ = Command::new("kill").arg("-TERM").arg(self.child.id().to_string()).status();
        self.child.wait().is_ok_and(|s| s.success())
    }

    /// Waits (bounded) for the process to exit on its own; its success.
    pub(crate) async fn exited(&mut self, what: &str) -> bool {
        wait_exit(&mut self.child, what, Deadline::secs(120)).await
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `tally broker` on a free port, once it printed its bootstrap address.
pub(crate) async fn start_broker() -> (Proc, String) {
    let listen = free_addr();
    let mut broker = Proc::start("broker", &["broker", "--listen", &listen], &[("TALLY__LOG__LEVEL", "warn")]);
    let stdout = broker.child.stdout.take().expect("stdout");
    let first = tokio::task::spawn_blocking(move || {
        let mut line = String::new();
        BufReader::new(stdout).read_line(&mut line).map(|_| line)
    })
    .await
    .expect("read task")
    .expect("the broker prints its bootstrap address");
    assert_eq!(first.trim(), format!("bootstrap.servers={listen}"));
    (broker, listen)
}

/// Waits until `GET http://<admin>/readyz` answers 200.
pub(crate) async fn wait_ready(admin: &str, child: &Proc) {
    let client = reqwest::Client::new();
    let url = format!("http://{admin}/readyz");
    wait_until("the child is ready", Deadline::secs(120), || async {
        match client.get(&url).send().await {
            Ok(r) if r.status() == StatusCode::OK => Ok(()),
            Ok(r) => Err(format!("{}: {}", r.status(), r.text().await.unwrap_or_default())),
            Err(e) => Err(format!("{e}; log tail: {}", tail(&child.log()))),
        }
    })
    .await;
}

fn tail(log: &str) -> String {
    let lines: Vec<&str> = log.lines().collect();
    lines[lines.len().saturating_sub(5)..].join("\n")
}

fn error_lines(log: &str) -> Vec<&str> {
    log.lines().filter(|l| l.contains("ERROR")).collect()
}

/// Every secret set to a marker: `tally config`, a debug-level log of a `tally run` child
/// (start, requests, stop) and every `/admin/*` response show none of them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn secrets_appear_in_no_output_log_or_admin_response() {
    let db = TestDb::new().await;
    let url = db.url().replacen("postgres@", &format!("postgres:{MARKER}-db-password@"), 1);
    assert!(url.contains(MARKER), "{url}");
    let file = tally_binary().with_file_name(format!("first-run-{}.toml", uuid::Uuid::new_v4().simple()));
    std::fs::write(&file, format!("[kafka.producer]\n\"sasl.password\" = \"{MARKER}-kafka\"\n")).expect("config file");
    let (admin, intake) = (free_addr(), free_addr());
    let token = format!("{MARKER}-token");
    let secret = format!("{MARKER}-webhook");
    let hook = format!("http://hook-user:{MARKER}-hook-password@127.0.0.1:9/hook?token={MARKER}-hook-token&x=1");
    let envs = [
        ("TALLY__DATABASE__URL", url.as_str()),
        ("TALLY__HTTP__ADMIN_TOKEN", token.as_str()),
        ("TALLY__NOTIFICATIONS__WEBHOOK_URL", hook.as_str()),
        ("TALLY__NOTIFICATIONS__WEBHOOK_SECRET", secret.as_str()),
        ("TALLY__HTTP__ADMIN_ADDR", admin.as_str()),
        ("TALLY__HTTP__INTAKE_ADDR", intake.as_str()),
        ("TALLY__KAFKA__EMBEDDED_BROKERS", "1"),
        ("TALLY__LOG__LEVEL", "debug"),
    ];
    let file_arg = file.display().to_string();

    let shown =
        Command::new(tally_binary()).args(["--config", &file_arg, "config"]).envs(envs).output().expect("tally config");
    let stdout = String::from_utf8_lossy(&shown.stdout);
    assert!(shown.status.success(), "tally config: {stdout} {}", String::from_utf8_lossy(&shown.stderr));
    let shown_hook = "webhook_url = \"http://hook-user:<redacted>@127.0.0.1:9/hook?token=<redacted>&x=1\"";
    assert!(stdout.contains(shown_hook), "{stdout}");
    assert!(stdout.contains("<redacted>"), "{stdout}");
    assert!(!stdout.contains(MARKER), "tally config prints a secret:\n{stdout}");

    let mut run = Proc::start("secrets", &["--config", &file_arg, "run"], &envs);
    wait_ready(&admin, &run).await;
    let client = reqwest::Client::new();
    for path in [
        "/healthz",
        "/readyz",
        "/metrics",
        "/admin/pipelines",
        "/admin/outbox",
        "/admin/ledger/check",
        "/admin/dlt",
        "/admin/dlt/transfers.analyzed-dlt",
        "/admin/dlt/dead_letters",
    ] {
        for auth in [Some(token.as_str()), Some("wrong"), None] {
            let mut req = client.get(format!("http://{admin}{path}"));
            if let Some(t) = auth {
                req = req.bearer_auth(t);
            }
            let res = req.send().await.expect("admin request");
            let body = res.text().await.expect("body");
            assert!(!body.contains(MARKER), "GET {path} shows a secret: {body}");
        }
    }
    assert!(run.terminate(), "tally run stops cleanly: {}", tail(&run.log()));
    let log = run.log();
    assert!(log.contains("DEBUG"), "the child logged at debug level: {}", tail(&log));
    assert!(log.contains("Shutdown complete"), "{}", tail(&log));
    let leaks: Vec<&str> = log.lines().filter(|l| l.contains(MARKER)).collect();
    assert!(leaks.is_empty(), "the log shows a secret: {leaks:#?}");
    let _ = std::fs::remove_file(&file);
}

/// Admin endpoints that show record contents or change state need the bearer token
/// (401 without, 403 with a wrong one); `/healthz`, `/readyz`, `/metrics` and the
/// aggregate views stay open.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_endpoints_showing_records_or_changing_state_need_the_token() {
    let (_env, app) = spawn_app(|c| c.http.admin_token = tally_engine::config::Secret::new(TOKEN)).await;
    let protected = [
        ("GET", "/admin/dlt/transfers.analyzed-dlt"),
        ("GET", "/admin/dlt/dead_letters"),
        ("POST", "/admin/dlt/transfers.analyzed-dlt/replay"),
        ("POST", "/admin/dlt/dead_letters/replay"),
        ("POST", "/admin/pipelines/ledger/pause"),
        ("POST", "/admin/pipelines/ledger/resume"),
        ("POST", "/admin/outbox/parked/retry"),
    ];
    for (method, path) in protected {
        let url = format!("{}{path}", app.admin_url);
        let request = |token: Option<&str>| {
            let mut r = if method == "GET" { app.client.get(&url) } else { app.client.post(&url) };
            if let Some(t) = token {
                r = r.bearer_auth(t);
            }
            r
        };
        let case = format!("{method} {path}");
        assert_error(app.send(request(None)).await, StatusCode::UNAUTHORIZED, "unauthorized", &case).await;
        assert_error(app.send(request(Some("wrong"))).await, StatusCode::FORBIDDEN, "forbidden", &case).await;
        let res = app.send(request(Some(TOKEN))).await;
        assert_eq!(res.status(), StatusCode::OK, "{case} with the token: {}", res.text().await.unwrap_or_default());
    }
    for path in ["/healthz", "/metrics", "/admin/dlt", "/admin/outbox", "/admin/pipelines", "/admin/ledger/check"] {
        let res = app.admin_get(path).await;
        assert_eq!(res.status(), StatusCode::OK, "GET {path} is open");
    }
    let res = app.admin_get("/readyz").await;
    assert!(res.status() == StatusCode::OK || res.status() == StatusCode::SERVICE_UNAVAILABLE, "/readyz is open");
}

/// The README's second-daemon example: `tally broker`, then `tally run` with nothing but
/// the broker address (and this test's database and ports). It reaches readiness and
/// settles a transfer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tally_run_with_defaults_works_against_tally_broker() {
    run_against_tally_broker_settles_a_transfer("defaults", None).await;
}

/// The consumer group protocol (KIP-848) as the seed's services set it, through
/// librdkafka's own property in the configuration file: `tally run` against `tally broker`
/// (whose mock cluster speaks it) checks the broker at start, joins every group under it,
/// and settles a transfer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tally_run_with_the_seeds_group_protocol_setting_settles_transfers() {
    let file = tally_binary().with_file_name(format!("first-run-{}.toml", uuid::Uuid::new_v4().simple()));
    std::fs::write(&file, "[kafka.consumer]\n\"group.protocol\" = \"consumer\"\n").expect("config file");
    run_against_tally_broker_settles_a_transfer("group-protocol", Some(&file)).await;
}

/// `tally [--config <file>] run` against `tally broker`, with nothing else but the broker
/// address (and this test's database and ports): it reaches readiness and settles a
/// transfer.
async fn run_against_tally_broker_settles_a_transfer(name: &str, config: Option<&std::path::Path>) {
    let db = TestDb::new().await;
    let (_broker, bootstrap) = start_broker().await;
    let (admin, intake) = (free_addr(), free_addr());
    let file = config.map(|f| f.display().to_string());
    let mut args: Vec<&str> = file.as_deref().map(|f| vec!["--config", f]).unwrap_or_default();
    args.push("run");
    let run = Proc::start(
        name,
        &args,
        &[
            ("TALLY__DATABASE__URL", db.url()),
            ("TALLY__KAFKA__BROKERS", &bootstrap),
            ("TALLY__HTTP__ADMIN_ADDR", &admin),
            ("TALLY__HTTP__INTAKE_ADDR", &intake),
        ],
    );
    wait_ready(&admin, &run).await;
    let client = reqwest::Client::new();
    for (id, balance) in [("FR-A", 10_000), ("FR-B", 0)] {
        let res = client
            .post(format!("http://{intake}/accounts"))
            .json(&json!({"id": id, "currency": "BRL", "initialBalanceCents": balance}))
            .send()
            .await
            .expect("POST /accounts");
        assert_eq!(res.status(), StatusCode::CREATED);
    }
    let res = client
        .post(format!("http://{intake}/transfers"))
        .json(&json!({"sourceAccount": "FR-A", "destinationAccount": "FR-B", "amountCents": 2_500, "currency": "BRL"}))
        .send()
        .await
        .expect("POST /transfers");
    assert_eq!(res.status(), StatusCode::CREATED);
    let id = json_body(res).await["id"].as_str().expect("id").to_owned();
    wait_settled(&client, &intake, &id).await;
}

/// Topics that are missing and cannot be created (the mock cluster never answers
/// CreateTopics): `tally run` exits with an error naming them and the setting to change.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn missing_topics_that_cannot_be_created_stop_the_start_with_their_names() {
    let db = TestDb::new().await;
    let (_broker, bootstrap) = start_broker().await;
    let mut run = Proc::start(
        "missing",
        &["run"],
        &[
            ("TALLY__DATABASE__URL", db.url()),
            ("TALLY__KAFKA__BROKERS", &bootstrap),
            ("TALLY__KAFKA__TOPICS__ORDERS_RECEIVED", "orders.custom"),
            ("TALLY__HTTP__ADMIN_ADDR", &free_addr()),
            ("TALLY__HTTP__INTAKE_ADDR", &free_addr()),
        ],
    );
    let success = run.exited("tally run gives up").await;
    let log = run.log();
    assert!(!success, "{log}");
    assert!(
        log.contains("orders.custom, orders.custom-dlt") || log.contains("orders.custom orders.custom-dlt"),
        "{log}"
    );
    assert!(!log.contains("transfers.requested,"), "only the missing topics are named: {log}");
    assert!(log.contains("kafka.create_topics"), "{log}");
}

/// `/readyz` answers 200 only once every pipeline has received its assignment: at the
/// first 200, `/admin/pipelines` shows every pipeline assigned.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ready_means_every_pipeline_has_its_assignment() {
    let (_env, app) = spawn_app(|_| {}).await;
    wait_until("/readyz answers 200", Deadline::DEFAULT, || async {
        let res = app.admin_get("/readyz").await;
        if res.status() == StatusCode::OK {
            Ok(())
        } else {
            Err(json_body(res).await.to_string())
        }
    })
    .await;
    let pipelines = json_body(app.admin_get("/admin/pipelines").await).await;
    let all = pipelines["pipelines"].as_array().expect("pipelines");
    assert!(!all.is_empty(), "{pipelines}");
    for p in all {
        assert_eq!(p["assigned"], true, "ready, yet {} has no assignment: {p}", p["name"]);
    }
}

/// A `tally run` child on its embedded broker, stopped with SIGTERM after some work,
/// exits 0 and logs no ERROR line (its Kafka clients stop before the broker).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clean_stop_on_the_embedded_broker_logs_no_error() {
    let db = TestDb::new().await;
    let (admin, intake) = (free_addr(), free_addr());
    let mut run = Proc::start(
        "clean-stop",
        &["run"],
        &[
            ("TALLY__DATABASE__URL", db.url()),
            ("TALLY__HTTP__ADMIN_ADDR", &admin),
            ("TALLY__HTTP__INTAKE_ADDR", &intake),
            // One broker, as `make bench` runs it: its clients see "1/1 brokers are down".
            ("TALLY__KAFKA__EMBEDDED_BROKERS", "1"),
        ],
    );
    wait_ready(&admin, &run).await;
    let client = reqwest::Client::new();
    let res = client
        .post(format!("http://{intake}/accounts"))
        .json(&json!({"id": "CS-A", "currency": "BRL", "initialBalanceCents": 100}))
        .send()
        .await
        .expect("POST /accounts");
    assert_eq!(res.status(), StatusCode::CREATED);
    assert!(run.terminate(), "exit status 0: {}", tail(&run.log()));
    let log = run.log();
    assert!(log.contains("Shutdown complete"), "{}", tail(&log));
    assert!(error_lines(&log).is_empty(), "ERROR lines on a clean stop: {:#?}", error_lines(&log));
}

/// `http.body_limit_bytes` must leave a body's record under the producer's
/// `message.max.bytes`: checked at start, naming both; larger bodies get a JSON 413.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_body_limit_must_fit_a_kafka_record() {
    let mut run = Proc::start("body-limit", &["run"], &[("TALLY__HTTP__BODY_LIMIT_BYTES", "2000000")]);
    assert!(!run.exited("tally run refuses the body limit").await);
    let log = run.log();
    assert!(log.contains("http.body_limit_bytes") && log.contains("message.max.bytes"), "{log}");

    let file = tally_binary().with_file_name(format!("first-run-{}.toml", uuid::Uuid::new_v4().simple()));
    std::fs::write(
        &file,
        "[http]\nbody_limit_bytes = 2000000\n[kafka.producer]\n\"message.max.bytes\" = \"3000000\"\n",
    )
    .expect("config file");
    let shown = Command::new(tally_binary())
        .args(["--config", &file.display().to_string(), "config"])
        .output()
        .expect("config");
    assert!(shown.status.success(), "{}", String::from_utf8_lossy(&shown.stderr));
    let _ = std::fs::remove_file(&file);

    let (_env, app) = spawn_app(|c| c.http.body_limit_bytes = 1_024).await;
    let big = json!({"sourceAccount": "A", "destinationAccount": "B", "amountCents": 1, "currency": "BRL",
                     "padding": "x".repeat(2_000)});
    let res = app.post_json("/transfers", &big).await;
    assert_error(res, StatusCode::PAYLOAD_TOO_LARGE, "payload_too_large", "a body over the limit").await;
}

/// A `-dlt` topic with fewer partitions than its source stops the start with an error
/// naming both; a missing one is created with its source's partition count.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dlt_topics_have_at_least_their_sources_partitions() {
    let env = TestEnv::new().await;
    env.broker.create_topic("transfers.analyzed", 12, 1).expect("source");
    env.broker.create_topic("transfers.analyzed-dlt", 2, 1).expect("short dlt");
    let config = env.config();
    let broker = Arc::clone(&env.broker);
    let started = tokio::task::spawn_blocking(move || tally_engine::spawn(config, Some(broker)).map(drop))
        .await
        .expect("spawn task");
    let e = format!("{:#}", started.expect_err("a short -dlt topic stops the start"));
    assert!(e.contains("transfers.analyzed-dlt has 2 partitions") && e.contains("transfers.analyzed has 12"), "{e}");

    let env = TestEnv::new().await;
    env.broker.create_topic("orders.received", 16, 1).expect("a wide source");
    let app = env.spawn(|_| {}).await;
    let bootstrap = app.bootstrap.clone();
    let partitions = tokio::task::spawn_blocking(move || {
        use rdkafka::consumer::{BaseConsumer, Consumer};
        let consumer: BaseConsumer =
            rdkafka::ClientConfig::new().set("bootstrap.servers", &bootstrap).create().expect("consumer");
        let md =
            consumer.fetch_metadata(Some("orders.received-dlt"), std::time::Duration::from_secs(10)).expect("metadata");
        md.topics().first().map_or(0, |t| t.partitions().len())
    })
    .await
    .expect("metadata task");
    assert_eq!(partitions, 16, "orders.received-dlt is created with its source's partitions");
}

/// `tally status` against a running daemon: its pipelines, outbox, dead letters and ledger
/// check on one screen, exit 0 while healthy; a daemon that does not answer is an error
/// that names the address, exit 1.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tally_status_summarises_a_running_daemon() {
    let (_env, app) = spawn_app(|_| {}).await;
    wait_until("ready", Deadline::DEFAULT, || async {
        match app.admin_get("/readyz").await.status() {
            StatusCode::OK => Ok(()),
            s => Err(s.to_string()),
        }
    })
    .await;
    let admin = app.admin_url.clone();
    let out = tokio::task::spawn_blocking(move || {
        Command::new(tally_binary()).args(["status", "--admin", &admin]).output().expect("tally status")
    })
    .await
    .expect("task");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "exit {:?}: {text}{}", out.status, String::from_utf8_lossy(&out.stderr));
    assert!(text.contains(": ready"), "{text}");
    for pipeline in ["ledger", "antifraud", "projection", "orders"] {
        let row = |l: &&str| l.split_whitespace().take(2).collect::<Vec<_>>() == [pipeline, "running"];
        assert!(text.lines().any(|l| row(&l)), "{pipeline} is not a running row: {text}");
    }
    assert!(text.contains("outbox: 0 pending"), "{text}");
    assert!(text.contains("dead letters: 0 in topics"), "{text}");
    assert!(text.contains("ledger check: ok"), "{text}");

    let out = Command::new(tally_binary()).args(["status", "--admin", "http://127.0.0.1:9"]).output().expect("run");
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("no answer from http://127.0.0.1:9/readyz"), "{err}");
}
