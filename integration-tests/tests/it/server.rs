//! Running tally on a server: the shipped example configuration (`deploy/tally.toml`), the
//! schema guard against a database newer than the binary, the systemd unit and its
//! readiness protocol, and the Debian package. Real PostgreSQL; broker: librdkafka's mock
//! cluster.
#![allow(clippy::expect_used)] // tests: a failed expectation is a failed test, with its message

use std::path::{Path, PathBuf};
use std::process::Command;

use tally_integration_tests::{
    free_addr, spawn_tally_process, tally_binary, wait_exit, wait_until, Deadline, TallyProcess, TestEnv,
};

fn deploy_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy")
}

/// Runs the built `tally` with `args`; its exit success, standard output and error.
fn tally(args: &[&str]) -> (bool, String, String) {
    let out = Command::new(tally_binary()).args(args).output().expect("run tally");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// A fresh database and broker with tally's topics (a `tally run` child on the mock
/// cluster cannot create them: no Admin API).
async fn env_with_topics() -> TestEnv {
    let env = TestEnv::new().await;
    let config = env.config();
    let specs = tally_engine::kafka::topic_specs(&config);
    tally_engine::kafka::prepare_topics(&config.kafka, &specs, env.bootstrap(), Some(&env.broker), true)
        .await
        .expect("create the topics");
    env
}

/// Waits until the daemon's admin listener at `admin` says ready.
async fn wait_ready(admin: &str, child: &mut TallyProcess) {
    let client = reqwest::Client::new();
    let url = format!("http://{admin}/readyz");
    wait_until("the daemon is ready", Deadline::DEFAULT, || {
        let exited = child.try_wait().ok().flatten();
        let request = client.get(&url).send();
        async move {
            if let Some(status) = exited {
                panic!("the daemon exited before it was ready: {status}");
            }
            match request.await {
                Ok(r) if r.status() == 200 => Ok(()),
                Ok(r) => Err(format!("/readyz {}", r.status())),
                Err(e) => Err(e.to_string()),
            }
        }
    })
    .await;
}

/// SIGTERM, then a clean exit (status 0) within the deadline.
async fn terminate_cleanly(child: &mut TallyProcess) {
    let pid = child.id().to_string();
    assert!(Command::new("kill").args(["-TERM", &pid]).status().expect("kill").success());
    assert!(wait_exit(child, "the daemon drains and exits", Deadline::DEFAULT).await, "exit status not 0");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_shipped_configuration_is_the_generated_one_and_the_daemon_runs_on_it() {
    let shipped_path = deploy_dir().join("tally.toml");
    let shipped = std::fs::read_to_string(&shipped_path).expect("deploy/tally.toml");
    let (ok, generated, err) = tally(&["config", "--example"]);
    assert!(ok, "{err}");
    assert!(
        shipped == generated,
        "deploy/tally.toml differs from `tally config --example`; regenerate it with \
         `cargo run -p tally-engine --bin tally -- config --example > deploy/tally.toml`"
    );
    // It parses and validates as it is.
    let file = shipped_path.to_str().expect("utf-8 path");
    let (ok, effective, err) = tally(&["--config", file, "config"]);
    assert!(ok, "tally --config deploy/tally.toml config: {err}");
    assert!(effective.contains("drain_timeout_ms = 20000"), "{effective}");
    // And the daemon runs on it (the test's database and broker through the environment).
    let env = env_with_topics().await;
    let admin = free_addr();
    let mut child = spawn_tally_process(&env, &[("TALLY_CONFIG", file), ("TALLY__HTTP__ADMIN_ADDR", &admin)]);
    wait_ready(&admin, &mut child).await;
    terminate_cleanly(&mut child).await;
}

/// A version no release has: the binary under test does not know it.
const FUTURE: &str = "29991231000000";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_binary_refuses_a_database_migrated_by_a_newer_release() {
    let env = env_with_topics().await;
    tally_actors::store::migrate::prepare_blocking(env.db.url()).expect("migrate");
    env.db.execute("INSERT INTO __diesel_schema_migrations (version) VALUES ($1)", &[&FUTURE]).await;
    let accounts = env.db.count("accounts").await;
    // `tally migrate` refuses, naming the version.
    let out = Command::new(tally_binary())
        .arg("migrate")
        .env("TALLY__DATABASE__URL", env.db.url())
        .output()
        .expect("run tally migrate");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success(),
        "tally migrate succeeded on a newer schema: {}",
        String::from_utf8_lossy(&out.stdout)
    );
    assert!(stderr.contains(FUTURE) && stderr.contains("newer"), "{stderr}");
    // `tally run` exits at once with the same message, before it serves anything.
    let log = tally_binary().with_file_name("tally-schema-guard.log");
    let stderr_file = std::fs::File::create(&log).expect("log file");
    let mut child = TallyProcess::new(
        Command::new(tally_binary())
            .arg("run")
            .env("TALLY__DATABASE__URL", env.db.url())
            .env("TALLY__KAFKA__BROKERS", env.bootstrap())
            .env("TALLY__KAFKA__CREATE_TOPICS", "false")
            .env("TALLY__HTTP__INTAKE_ADDR", "127.0.0.1:0")
            .env("TALLY__HTTP__ADMIN_ADDR", "127.0.0.1:0")
            .stdout(std::process::Stdio::null())
            .stderr(stderr_file)
            .spawn()
            .expect("start tally run"),
    );
    let ok = wait_exit(&mut child, "tally run refuses the newer schema and exits", Deadline::secs(30)).await;
    let stderr = std::fs::read_to_string(&log).expect("read the log");
    assert!(!ok, "tally run exited 0: {stderr}");
    assert!(stderr.contains(FUTURE) && stderr.contains("newer"), "{stderr}");
    // Nothing was touched: the row is still there and the data as it was.
    let versions =
        env.db.scalar_i64("SELECT count(*) FROM __diesel_schema_migrations WHERE version = $1", &[&FUTURE]).await;
    assert_eq!(versions, 1);
    assert_eq!(env.db.count("accounts").await, accounts);
}
