//! Running tally on a server: the shipped example configuration (`deploy/tally.toml`), the
//! schema guard against a database newer than the binary, the systemd unit and its
//! readiness protocol, the Debian package, and the container and Kubernetes manifests
//! (parsed and checked against a running daemon, not applied). Real PostgreSQL; broker:
//! librdkafka's mock cluster.
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
    let specs = tally_engine::topics::topic_specs(&config);
    tally_engine::topics::prepare_topics(&config.kafka, &specs, env.bootstrap(), Some(&env.broker), true)
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

/// The longest stop of a daemon on the defaults: every pipeline drains at once, each for at
/// most the worst case of its retry sequence, then the outbox stops (one send timeout).
fn longest_drain() -> std::time::Duration {
    let c = tally_engine::Config::default();
    let attempt = c.database.statement_timeout.max(c.notifications.timeout);
    [&c.ledger.retry, &c.projection.retry, &c.orders.retry, &c.notifications.retry, &c.antifraud.retry]
        .iter()
        .map(|r| r.policy().worst_case(attempt))
        .max()
        .expect("pipelines")
        .max(c.consumer.drain_timeout)
        + c.outbox.send_timeout
}

/// The unit's `Key=value` settings named `key`, in order.
fn unit_values<'a>(unit: &'a str, key: &str) -> Vec<&'a str> {
    unit.lines().filter_map(|l| l.strip_prefix(key).and_then(|r| r.strip_prefix('='))).collect()
}

#[test]
fn the_systemd_unit_verifies_and_outlasts_the_drain() {
    let unit =
        std::fs::read_to_string(deploy_dir().join("systemd/tally.service")).expect("deploy/systemd/tally.service");
    const EXEC: &str = "/usr/bin/tally run --config /etc/tally/tally.toml";
    assert_eq!(unit_values(&unit, "ExecStart"), [EXEC]);
    assert_eq!(unit_values(&unit, "Type"), ["notify"]);
    assert_eq!(unit_values(&unit, "Restart"), ["on-failure"]);
    assert_eq!(unit_values(&unit, "User"), ["tally"]);
    for key in ["NoNewPrivileges", "ProtectSystem", "ProtectHome", "PrivateTmp"] {
        assert!(!unit_values(&unit, key).is_empty(), "{key} is not set");
    }
    assert_eq!(unit_values(&unit, "ProtectSystem"), ["strict"]);
    // The stop timeout outlasts the longest drain of the defaults.
    let drain = longest_drain();
    let stop: u64 = unit_values(&unit, "TimeoutStopSec").first().and_then(|v| v.parse().ok()).expect("TimeoutStopSec");
    assert!(std::time::Duration::from_secs(stop) > drain, "TimeoutStopSec={stop} is not above the drain ({drain:?})");
    // `systemd-analyze verify` on the unit as shipped, but for the paths of this build.
    let dir = tempdir("unit");
    let binary = tally_binary();
    let config = deploy_dir().join("tally.toml");
    let local = unit.replace(EXEC, &format!("{} run --config {}", binary.display(), config.display()));
    let path = dir.join("tally.service");
    std::fs::write(&path, local).expect("write the unit copy");
    let out = Command::new("systemd-analyze")
        .arg("verify")
        .arg(&path)
        .output()
        .expect("systemd-analyze (Debian package systemd) is installed");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success() && stderr.trim().is_empty(), "systemd-analyze verify: {stderr}");
}

/// A fresh directory under the target directory, for files a test writes.
fn tempdir(what: &str) -> PathBuf {
    let dir = tally_binary().with_file_name("server-tests").join(format!("{what}-{}", uuid::Uuid::new_v4().simple()));
    std::fs::create_dir_all(&dir).expect("create a test directory");
    dir
}

/// The next datagram on `socket` within `deadline`; `None` on timeout.
fn next_datagram(socket: &std::os::unix::net::UnixDatagram, deadline: std::time::Duration) -> Option<String> {
    socket.set_read_timeout(Some(deadline)).expect("read timeout");
    let mut buf = [0u8; 4096];
    let n = socket.recv(&mut buf).ok()?;
    Some(String::from_utf8_lossy(&buf[..n]).into_owned())
}

/// Waits (blocking, bounded) for a datagram with the line `line`; every datagram seen.
async fn wait_datagram(socket: &std::sync::Arc<std::os::unix::net::UnixDatagram>, line: &'static str) -> Vec<String> {
    let socket = std::sync::Arc::clone(socket);
    tokio::task::spawn_blocking(move || {
        let until = std::time::Instant::now() + Deadline::DEFAULT.0;
        let mut seen = Vec::new();
        while let Some(left) = until.checked_duration_since(std::time::Instant::now()) {
            match next_datagram(&socket, left.max(std::time::Duration::from_millis(1))) {
                Some(d) if d.lines().any(|l| l == line) => {
                    seen.push(d);
                    return seen;
                }
                Some(d) => seen.push(d),
                None => break,
            }
        }
        panic!("no {line} from the daemon; it sent {seen:?}");
    })
    .await
    .expect("the datagram reader")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_daemon_tells_its_service_manager_when_it_is_ready_and_when_it_stops() {
    let env = env_with_topics().await;
    let dir = tempdir("notify");
    let path = dir.join("notify.sock");
    let socket = std::sync::Arc::new(std::os::unix::net::UnixDatagram::bind(&path).expect("bind NOTIFY_SOCKET"));
    let admin = free_addr();
    let socket_path = path.to_str().expect("utf-8 path");
    let mut child = spawn_tally_process(&env, &[("NOTIFY_SOCKET", socket_path), ("TALLY__HTTP__ADMIN_ADDR", &admin)]);
    let before = wait_datagram(&socket, "READY=1").await;
    // READY=1 means /readyz says ready: it does now, without waiting.
    let res = reqwest::get(format!("http://{admin}/readyz")).await.expect("GET /readyz");
    assert_eq!(res.status(), 200, "READY=1 came before /readyz said ready; sent before it: {before:?}");
    let pid = child.id().to_string();
    assert!(Command::new("kill").args(["-TERM", &pid]).status().expect("kill").success());
    wait_datagram(&socket, "STOPPING=1").await;
    assert!(wait_exit(&mut child, "the daemon drains and exits", Deadline::DEFAULT).await, "exit status not 0");
}

/// Runs `program args`, asserting success; its standard output.
fn run_ok(program: &str, args: &[&str]) -> String {
    let out = Command::new(program).args(args).output().unwrap_or_else(|e| panic!("run {program}: {e}"));
    assert!(
        out.status.success(),
        "{program} {args:?}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Purges the package when the test ends, passed or not, and deletes the `tally` user
/// when the package created it: the machine is left as found.
struct Installed {
    user_existed: bool,
}

impl Drop for Installed {
    fn drop(&mut self) {
        let _ = Command::new("dpkg").args(["--purge", "tally"]).output();
        if !self.user_existed {
            let _ = Command::new("userdel").arg("tally").output();
        }
    }
}

/// The Debian package, built from this build's (dev profile) binary: the release build
/// `make package` makes costs minutes; the package's contents are the same.
fn build_package() -> PathBuf {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let cargo_deb = run_ok(root.join("scripts/ensure-cargo-deb.sh").to_str().expect("utf-8 path"), &[]);
    // The manual page, next to the binary as `make package` writes it.
    let binary = tally_binary();
    let man = Command::new(&binary).arg("man").output().expect("tally man");
    assert!(
        man.status.success() && man.stdout.starts_with(b".ie"),
        "tally man: {}",
        String::from_utf8_lossy(&man.stderr)
    );
    std::fs::write(binary.with_file_name("tally.1"), &man.stdout).expect("write tally.1");
    // One directory, emptied each time: the packages do not pile up.
    let out = binary.with_file_name("server-tests").join("deb");
    let _ = std::fs::remove_dir_all(&out);
    std::fs::create_dir_all(&out).expect("create the package directory");
    let out_arg = out.to_str().expect("utf-8 path");
    let deb = run_ok(
        cargo_deb.trim(),
        &[
            "--manifest-path",
            root.join("Cargo.toml").to_str().expect("utf-8 path"),
            "-p",
            "tally-engine",
            "--profile",
            "dev",
            "--no-build",
            "--strip",
            "--fast",
            "--quiet",
            "-o",
            out_arg,
        ],
    );
    let deb = PathBuf::from(deb.trim());
    assert!(deb.exists(), "cargo deb wrote no package: {}", deb.display());
    deb
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_package_installs_runs_a_transfer_and_removes_without_touching_the_data() {
    assert_eq!(run_ok("id", &["-u"]).trim(), "0", "installing a package needs root");
    let status = Command::new("dpkg-query").args(["-W", "-f=${Status}", "tally"]).output().expect("dpkg-query");
    let status = String::from_utf8_lossy(&status.stdout);
    assert!(
        status.split_whitespace().last() != Some("installed"),
        "a tally package is installed on this machine ({status}); this test would replace and purge it"
    );
    let deb = build_package();
    let user_existed = Command::new("id").arg("tally").output().is_ok_and(|o| o.status.success());
    let _installed = Installed { user_existed };
    run_ok("dpkg", &["-i", deb.to_str().expect("utf-8 path")]);
    // What it installed: the binary, the unit, the configuration as a conffile readable by
    // the service's user, and that user.
    assert_eq!(
        run_ok("dpkg-query", &["-W", "-f=${Conffiles}", "tally"]).split_whitespace().next(),
        Some("/etc/tally/tally.toml")
    );
    let shipped = std::fs::read_to_string(deploy_dir().join("tally.toml")).expect("deploy/tally.toml");
    assert_eq!(std::fs::read_to_string("/etc/tally/tally.toml").expect("installed config"), shipped);
    assert_eq!(run_ok("stat", &["-c", "%U:%G %a", "/etc/tally/tally.toml"]).trim(), "root:tally 640");
    assert!(Path::new("/lib/systemd/system/tally.service").exists());
    let page = std::fs::read_to_string("/usr/share/man/man1/tally.1").expect("the manual page");
    assert!(page.contains("tally\\-run") && page.contains("TALLY_CONFIG"), "tally.1:\n{page}");
    let uid: u32 = run_ok("id", &["-u", "tally"]).trim().parse().expect("uid of tally");
    let gid: u32 = run_ok("id", &["-g", "tally"]).trim().parse().expect("gid of tally");
    assert!(uid != 0 && gid != 0, "tally is a system user of its own");

    // The installed binary, as the service runs it (user tally, the installed
    // configuration), on a test database and broker given through the environment.
    let env = env_with_topics().await;
    let (intake, admin) = (free_addr(), free_addr());
    let log = tempdir("installed").join("tally.log");
    let stderr = std::fs::File::create(&log).expect("log file");
    let mut child = {
        use std::os::unix::process::CommandExt;
        TallyProcess::new(
            Command::new("/usr/bin/tally")
                .args(["run", "--config", "/etc/tally/tally.toml"])
                .env_clear()
                .env("TALLY__DATABASE__URL", env.db.url())
                .envs(tally_integration_tests::test_pools_env())
                .env("TALLY__KAFKA__BROKERS", env.bootstrap())
                .env("TALLY__KAFKA__CREATE_TOPICS", "false")
                .env("TALLY__SIGNING__KEYS_DIR", env.keys_dir())
                .env("TALLY__HTTP__INTAKE_ADDR", &intake)
                .env("TALLY__HTTP__ADMIN_ADDR", &admin)
                .env("TALLY__INSTANCE__ID", "installed")
                .uid(uid)
                .gid(gid)
                .current_dir("/")
                .stdout(std::process::Stdio::null())
                .stderr(stderr)
                .spawn()
                .expect("start /usr/bin/tally"),
        )
    };
    wait_ready(&admin, &mut child).await;
    let http = reqwest::Client::new();
    for (id, balance) in [("PKG-A", 10_000), ("PKG-B", 0)] {
        let body = serde_json::json!({ "id": id, "currency": "BRL", "initialBalanceCents": balance });
        let res = http.post(format!("http://{intake}/accounts")).json(&body).send().await.expect("POST /accounts");
        assert_eq!(res.status(), 201, "create {id}");
    }
    let body = serde_json::json!({ "sourceAccount": "PKG-A", "destinationAccount": "PKG-B", "amountCents": 2_500, "currency": "BRL" });
    let res = http.post(format!("http://{intake}/transfers")).json(&body).send().await.expect("POST /transfers");
    assert_eq!(res.status(), 201, "POST /transfers");
    let view: serde_json::Value = res.json().await.expect("transfer JSON");
    let id = view["id"].as_str().expect("transfer id").to_owned();
    tally_integration_tests::wait_settled(&http, &intake, &id).await;
    terminate_cleanly(&mut child).await;
    let text = std::fs::read_to_string(&log).expect("read the log");
    assert!(text.contains("Shutdown complete"), "no clean drain in the log:\n{text}");

    // Removing the package leaves the data alone (and the edited configuration, a
    // conffile, until a purge).
    let before = data(&env).await;
    assert_eq!(before, (2, 2, 10_000), "two accounts, one settled transfer (two postings), no money created");
    run_ok("dpkg", &["-r", "tally"]);
    assert!(!Path::new("/usr/bin/tally").exists(), "the binary is removed");
    assert!(Path::new("/etc/tally/tally.toml").exists(), "a removed package keeps its conffile");
    assert_eq!(data(&env).await, before, "the database changed when the package was removed");
    let b = env.db.scalar_i64("SELECT balance_cents FROM accounts WHERE id = 'PKG-B'", &[]).await;
    assert_eq!(b, 2_500);
}

/// Customer accounts, postings of transfers between them, and the money they hold.
async fn data(env: &TestEnv) -> (i64, i64, i64) {
    (
        env.db.scalar_i64("SELECT count(*) FROM accounts WHERE kind = 'customer'", &[]).await,
        env.db.transfer_postings().await,
        env.db.customer_money().await,
    )
}

/// Every document of a multi-document YAML file.
fn yaml_documents(text: &str) -> Vec<serde_yaml::Value> {
    use serde::Deserialize;
    serde_yaml::Deserializer::from_str(text).map(|d| serde_yaml::Value::deserialize(d).expect("valid YAML")).collect()
}

/// The one document of `kind`.
fn of_kind<'a>(docs: &'a [serde_yaml::Value], kind: &str) -> &'a serde_yaml::Value {
    let found: Vec<_> = docs.iter().filter(|d| d["kind"] == kind).collect();
    assert_eq!(found.len(), 1, "one {kind} in the manifests");
    found[0]
}

/// The number of a container port given by name or number.
fn port_number(port: &serde_yaml::Value, ports: &[serde_yaml::Value]) -> u64 {
    port.as_u64().unwrap_or_else(|| {
        let name = port.as_str().expect("a port is a name or a number");
        let found = ports.iter().find(|p| p["name"] == name).unwrap_or_else(|| panic!("no port named {name}"));
        found["containerPort"].as_u64().expect("containerPort")
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_kubernetes_manifests_probe_what_the_daemon_serves() {
    let text = std::fs::read_to_string(deploy_dir().join("kubernetes/statefulset.yaml")).expect("the manifests");
    let docs = yaml_documents(&text);
    let sts = of_kind(&docs, "StatefulSet");
    let pod = &sts["spec"]["template"]["spec"];
    let container = &pod["containers"][0];
    let env: Vec<serde_yaml::Value> = container["env"].as_sequence().expect("env").clone();
    let var =
        |name: &str| env.iter().find(|e| e["name"] == name).unwrap_or_else(|| panic!("{name} is not set")).clone();
    // instance.id is the pod's stable name, and with it the static member and the
    // transactional ids.
    assert_eq!(var("TALLY__INSTANCE__ID")["valueFrom"]["fieldRef"]["fieldPath"], "metadata.name");
    assert_eq!(var("TALLY__INSTANCE__STATIC_MEMBERSHIP")["value"], "true");
    let admin: std::net::SocketAddr =
        var("TALLY__HTTP__ADMIN_ADDR")["value"].as_str().expect("admin addr").parse().expect("an address");
    // Every probe asks the admin listener for one of its routes.
    let ports = container["ports"].as_sequence().expect("ports").clone();
    let mut paths = Vec::new();
    for probe in ["readinessProbe", "livenessProbe", "startupProbe"] {
        let get = &container[probe]["httpGet"];
        assert_eq!(port_number(&get["port"], &ports), u64::from(admin.port()), "{probe} port");
        paths.push((probe, get["path"].as_str().expect("probe path").to_owned()));
    }
    assert_eq!(paths[0].1, "/readyz", "readiness is /readyz");
    // The ServiceMonitor scrapes /metrics through the Service's admin port.
    let service = of_kind(&docs, "Service");
    let monitor = &of_kind(&docs, "ServiceMonitor")["spec"]["endpoints"][0];
    let service_port = service["spec"]["ports"]
        .as_sequence()
        .expect("service ports")
        .iter()
        .find(|p| p["name"] == monitor["port"])
        .expect("the monitored port is a port of the Service")
        .clone();
    assert_eq!(port_number(&service_port["targetPort"], &ports), u64::from(admin.port()), "metrics port");
    paths.push(("ServiceMonitor", monitor["path"].as_str().expect("metrics path").to_owned()));
    assert!(of_kind(&docs, "PodDisruptionBudget")["spec"]["maxUnavailable"].as_u64().is_some());
    // Pods get longer than a drain to stop.
    let grace = pod["terminationGracePeriodSeconds"].as_u64().expect("terminationGracePeriodSeconds");
    assert!(std::time::Duration::from_secs(grace) > longest_drain(), "grace {grace} s is below the drain");
    // The image runs the same command as the unit, as a user that is not root.
    let dockerfile = std::fs::read_to_string(deploy_dir().join("Dockerfile")).expect("deploy/Dockerfile");
    let user = dockerfile.lines().filter_map(|l| l.strip_prefix("USER ")).next_back().expect("a USER");
    assert!(!user.starts_with("root") && !user.starts_with('0'), "the image runs as {user}");
    let args: Vec<&str> = container["args"].as_sequence().expect("args").iter().filter_map(|a| a.as_str()).collect();
    assert_eq!(args, ["run", "--config", "/etc/tally/tally.toml"]);
    assert!(dockerfile.contains(r#"CMD ["run", "--config", "/etc/tally/tally.toml"]"#), "the image's command");
    // The image's runtime has the shared OpenSSL the binary links against.
    let linked = run_ok("ldd", &[tally_binary().to_str().expect("utf-8 path")]);
    if linked.contains("libssl.so.3") {
        let runtime = dockerfile.rsplit("FROM ").next().unwrap_or_default();
        assert!(
            runtime.contains("libssl3"),
            "the binary links libssl.so.3; the image's runtime stage installs no libssl3"
        );
    }
    // The configuration validates with the manifest's values.
    let mut tally_config = Command::new(tally_binary());
    tally_config.args(["--config", deploy_dir().join("tally.toml").to_str().expect("utf-8 path"), "config"]);
    // What the secrets hold, as an operator would fill them.
    let keys = tally_integration_tests::write_keys_dir(
        &tally_actors::signing::SigningKey::random("k1").expect("a random key"),
    );
    let secret = |key: &str| match key {
        "http-clients" => format!(r#"[{{name = "shop", token_sha256 = "{}"}}]"#, "ab".repeat(32)),
        other => panic!("the test does not know the secret key {other}"),
    };
    for e in &env {
        let name = e["name"].as_str().expect("a name");
        if let Some(value) = e["value"].as_str() {
            let value = if name == "TALLY__SIGNING__KEYS_DIR" { keys.to_str().expect("utf-8 path") } else { value };
            tally_config.env(name, value);
        } else if let Some(key) = e["valueFrom"]["secretKeyRef"]["key"].as_str() {
            tally_config.env(name, secret(key));
        }
    }
    let out = tally_config.output().expect("tally config");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    // And a running daemon answers every probed path with 200 on its admin listener.
    let (_env, app) = tally_integration_tests::spawn_app(|_| {}).await;
    for (what, path) in paths {
        let status = wait_until(&format!("{what}: GET {path} answers 200"), Deadline::DEFAULT, || async {
            match app.admin_get(&path).await.status().as_u16() {
                200 => Ok(200),
                s => Err(format!("{s}")),
            }
        })
        .await;
        assert_eq!(status, 200);
    }
}
