//! The bench's own SQL against PostgreSQL: the account ids it writes in SQL are the ids its
//! clients use, at every size (a million accounts included); the per-hop breakdown reads
//! the stages' times right; `tally bench stages` runs every stage and reports each;
//! `tally bench soak` reports every window with a rate and the daemon's RSS; `tally bench
//! e2e` reports the CPU time of its daemon and broker processes per transfer; `tally bench
//! outbox` reports both modes; `tally bench floor` settles every transfer of both floors
//! and leaves the ledger whole; every run writes its JSON, plots and log lines under its
//! stamp, and keeps the log lines off stderr.
#![allow(clippy::expect_used)] // tests: a failed expectation is a failed test, with its message

use tally_engine::bench::cluster::ClusterKind;
use tally_engine::bench::{account, stages, ACCOUNT_ID_SQL};
use tally_engine::config::SecretUrl;
use tally_engine::Config;
use tally_integration_tests::{tally_binary, TestDb, DEFAULT_DATABASE_URL};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn account_ids_in_sql_match_the_clients_ids_past_five_digits() {
    let db = TestDb::new().await;
    for i in [0_i64, 7, 99_999, 100_000, 999_999, 1_234_567] {
        let sql = format!("SELECT {ACCOUNT_ID_SQL} FROM (SELECT $1::bigint AS i) AS x");
        let rows = db.query(&sql, &[&i]).await;
        let in_sql: String = rows[0].get(0);
        assert_eq!(in_sql, account(usize::try_from(i).expect("small")), "account {i}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_hop_breakdown_reads_each_stages_time() {
    let db = TestDb::new().await;
    // Two settled transfers whose stages took known times (ms after t0), and one pending.
    let setup = "INSERT INTO accounts (id, balance_cents, currency) VALUES ('H-A', 0, 'BRL'), ('H-B', 0, 'BRL');
        CREATE TEMP TABLE plan (id uuid, k int);
        INSERT INTO plan VALUES (gen_random_uuid(), 1), (gen_random_uuid(), 2), (gen_random_uuid(), 3);
        INSERT INTO transfers (id, source_account, destination_account, amount_cents, currency, status, created_at, updated_at)
          SELECT id, 'H-A', 'H-B', 1, 'BRL', CASE WHEN k < 3 THEN 'SETTLED' ELSE 'PENDING' END,
                 timestamptz '2026-01-01' , timestamptz '2026-01-01' + make_interval(secs => 0.5 * k) FROM plan;
        INSERT INTO antifraud_decisions (transfer_id, source_account, destination_account, amount_cents, currency,
                                         outcome, score, requested_at, decided_at)
          SELECT id, 'H-A', 'H-B', 1, 'BRL', 'ANALYZED', 5, timestamptz '2026-01-01',
                 timestamptz '2026-01-01' + make_interval(secs => 0.1 * k) FROM plan;
        INSERT INTO processed_transfers (transfer_id, outcome, processed_at)
          SELECT id, 'SETTLED', timestamptz '2026-01-01' + make_interval(secs => 0.2 * k) FROM plan WHERE k < 3;
        INSERT INTO outbox_events (id, topic, key, event_type, payload, created_at, published_at)
          SELECT gen_random_uuid(), 'transfers.requested', 'H-A', 'TransferRequested',
                 json_build_object('transferId', id)::text, timestamptz '2026-01-01',
                 timestamptz '2026-01-01' + make_interval(secs => 0.05 * k) FROM plan
          UNION ALL
          SELECT gen_random_uuid(), 'transfers.settled', 'H-A', 'TransferSettled',
                 json_build_object('transferId', id)::text, timestamptz '2026-01-01',
                 timestamptz '2026-01-01' + make_interval(secs => 0.3 * k) FROM plan WHERE k < 3;";
    db.batch(setup).await;
    let client = db.connect().await;
    let hops = tally_engine::bench::hops::breakdown(&client, 0.0).await.expect("the breakdown");
    let seen: Vec<(&str, usize, Option<f64>, Option<f64>)> =
        hops.iter().map(|h| (h.name, h.samples, h.p50_ms.map(f64::round), h.p99_ms.map(f64::round))).collect();
    // Transfer k: published at 50k ms, decided at 100k, settled at 200k, announced at
    // 300k, final at 500k. Only the settled ones (k = 1, 2) count.
    assert_eq!(
        seen,
        [
            ("intake -> publish", 2, Some(50.0), Some(100.0)),
            ("publish -> decision", 2, Some(50.0), Some(100.0)),
            ("decision -> settlement", 2, Some(100.0), Some(200.0)),
            ("settlement -> publish", 2, Some(100.0), Some(200.0)),
            ("publish -> final status", 2, Some(200.0), Some(400.0)),
        ]
    );
}

/// Every stage alone (the intake first), e2e and e2e in the seed configuration, at tiny sizes on the embedded
/// broker (librdkafka's mock cluster): each is in the report with records done and a rate.
/// Timings are never asserted.
#[test]
fn the_stages_bench_reports_every_stage() {
    let server = std::env::var("TALLY_TEST_DATABASE_URL").unwrap_or_else(|_| DEFAULT_DATABASE_URL.to_owned());
    let mut base = Config::default();
    base.database.url = SecretUrl::new(server.clone());
    base.database.pools = tally_integration_tests::test_pools();
    base.http.workers = 1;
    let prefix = format!("tally_test_stages_{}", &uuid::Uuid::new_v4().simple().to_string()[..12]);
    let args = stages::Args {
        records: 40,
        e2e_transfers: 30,
        seed_transfers: 10,
        seconds: 20,
        clients: 4,
        accounts: 50,
        partitions: 2,
        broker: ClusterKind::Embedded,
        database_prefix: prefix.clone(),
    };
    let measured = stages::measure(&base, &args);
    drop_databases(&server, &prefix);
    let report = serde_json::to_value(measured.expect("the stages bench runs")).expect("the report is JSON");
    let rows = report["stages"].as_array().expect("a list of stages");
    let names: Vec<&str> = rows.iter().map(|r| r["stage"].as_str().unwrap_or("?")).collect();
    assert_eq!(
        names,
        [
            "intake",
            "outbox drain",
            "antifraud",
            "ledger",
            "projection",
            "notifications",
            "e2e",
            "e2e, seed configuration"
        ]
    );
    for row in rows {
        let records = row["records"].as_u64().unwrap_or(0);
        let rate = row["recordsPerSecond"].as_f64().unwrap_or(0.0);
        assert!(records > 0 && rate > 0.0, "{row}");
    }
    let ratios = &report["ratios"];
    assert!(ratios["e2eOverSeed"].is_number() && ratios["e2eOverSharedBound"].is_number(), "{ratios}");
    assert!(ratios["ledgerOverFloor"].is_number() && ratios["e2eOverLifecycleFloor"].is_number(), "{ratios}");
    for floor in ["ledger", "lifecycle"] {
        // The floors run five times the stages' records.
        assert_eq!(report["floors"][floor]["transfers"].as_u64(), Some(5 * 40), "{}", report["floors"]);
        assert!(report["floors"][floor]["connections"].as_u64().is_some_and(|n| n >= 1), "{}", report["floors"]);
    }
    // The shared-machine bound is below every stage's rate alone (a sum of their costs).
    let bound = ratios["sharedBoundPerSecond"].as_f64().unwrap_or(0.0);
    let mut path = rows.iter().take(5).map(|r| r["recordsPerSecond"].as_f64().unwrap_or(0.0));
    assert!(path.all(|rate| bound > 0.0 && bound < rate), "{ratios}");
}

/// `tally bench soak` at a tiny size through the binary (the daemon a child of it, as in
/// `make soak`), in a directory of its own: the JSON has one window per 1,000 records, each
/// with a rate and the daemon's RSS, and both plots are drawn, named by the run's stamp as
/// the JSON is. Timings are never asserted.
#[test]
fn the_soak_bench_reports_every_window_with_a_rate_and_the_daemons_rss() {
    let run = Bench::run("soak", &["--transfers", "3000", "--accounts", "2000", "--window", "1000"], "warn");
    let report = run.report();
    let windows = report["windows"].as_array().expect("a list of windows");
    assert_eq!(windows.len(), 3, "{report}");
    for w in windows {
        let rate = w["recordsPerSecond"].as_f64().unwrap_or(0.0);
        let rss = w["rssMaxMib"].as_f64().unwrap_or(0.0);
        assert!(rate > 0.0 && rss > 0.0, "{w}");
    }
    assert_eq!(windows.last().map(|w| w["records"].clone()), Some(serde_json::json!(3000)));
    assert!(report["maxRssMib"].as_f64().unwrap_or(0.0) > 0.0, "{report}");
    run.assert_drawn(&["soak-throughput", "soak-rss"]);
    run.assert_logs_apart();
}

/// `tally bench e2e` at a tiny size through the binary (the daemon and the broker child
/// processes of it, as in `make bench`): every phase reports the CPU time per final
/// transfer of the daemon, the broker and the bench, and the daemon's threads; the idle
/// time before them, the cores each kept busy. The daemons' log lines stay off stderr.
/// Timings are never asserted.
#[test]
fn the_e2e_bench_reports_the_cpu_of_each_process_per_transfer() {
    let args = "--rate 20 --rate-seconds 2 --max-seconds 2 --idle-seconds 1 --clients 4 --accounts 50";
    let run = Bench::run("e2e", &args.split(' ').collect::<Vec<_>>(), "warn");
    let report = run.report();
    let idle = &report["idleCpu"];
    assert!(idle["daemon"]["cores"].is_number() && idle["daemon"]["msPerTransfer"].is_null(), "{idle}");
    let phases = report["phases"].as_array().expect("a list of phases");
    assert_eq!(phases.len(), 2, "{report}");
    for phase in phases {
        assert!(phase["finished"].as_i64().unwrap_or(0) > 0, "{phase}");
        let cpu = &phase["cpu"];
        for process in ["daemon", "broker", "bench"] {
            let used = &cpu[process];
            assert!(used["ms"].as_f64().is_some_and(|ms| ms >= 0.0), "{process}: {cpu}");
            assert!(used["msPerTransfer"].is_number() && used["cores"].is_number(), "{process}: {cpu}");
        }
        assert!(cpu["daemon"]["ms"].as_f64().unwrap_or(0.0) > 0.0, "the daemon worked: {cpu}");
        assert!(cpu["wallSeconds"].as_f64().unwrap_or(0.0) > 0.0, "{cpu}");
        assert!(!cpu["daemonThreads"].as_array().expect("threads").is_empty(), "{cpu}");
    }
    assert_eq!(report["ledgerInvariantsOk"], true, "{report}");
    run.assert_logs_apart();
}

/// `tally bench outbox` at a tiny size through the binary: both modes reported, the drain
/// throughput and the commit -> publish CDF drawn with the run's stamp, and the daemons'
/// log lines in the run's log file, not on stderr among the progress lines.
#[test]
fn the_outbox_bench_draws_its_plots_and_keeps_the_daemons_logs_in_a_file() {
    let run = Bench::run("outbox", &["--rows", "1000", "--rate", "50", "--seconds", "2"], "info");
    let report = run.report();
    let modes: Vec<&str> =
        report["modes"].as_array().expect("modes").iter().map(|m| m["mode"].as_str().unwrap_or("?")).collect();
    assert_eq!(modes, ["tally", "classic-relay"], "{report}");
    for m in report["modes"].as_array().expect("modes") {
        assert_eq!(m["published"].as_i64(), Some(100), "{m}");
        assert!(m["drainRowsPerSecond"].as_f64().unwrap_or(0.0) > 0.0, "{m}");
    }
    run.assert_drawn(&["outbox-throughput", "outbox-latency-cdf"]);
    let log = run.assert_logs_apart();
    assert!(log.contains("HTTP listeners started."), "the daemons' lines are in the log file: {log}");
}

/// `tally bench floor` at a tiny size through the binary: both floors take every transfer to
/// its end (the lifecycle's to its final status), and the ledger invariants hold after each
/// (balances sum to the opening, every settled transfer has its debit and credit). Timings
/// are never asserted.
#[test]
fn the_floor_bench_settles_every_transfer_and_keeps_the_ledger_whole() {
    let run = Bench::run("floor", &["--transfers", "2000", "--clients", "2", "--accounts", "500"], "warn");
    let report = run.report();
    for floor in ["ledger", "lifecycle"] {
        let f = &report[floor];
        assert_eq!(f["transfers"].as_u64(), Some(2000), "{f}");
        assert!(f["transfersPerSecond"].as_f64().unwrap_or(0.0) > 0.0, "{f}");
        assert_eq!(f["invariantsOk"], true, "{f}");
    }
    let steps = report["lifecycleSteps"].as_array().expect("the lifecycle's steps");
    for s in steps.iter().filter(|s| s["step"] != "outbox") {
        assert_eq!(s["rows"].as_u64(), Some(2000), "each step took every transfer once: {s}");
    }
    let outbox = steps.iter().find(|s| s["step"] == "outbox").expect("the outbox step");
    assert_eq!(outbox["rows"].as_u64(), Some(4000), "requested and settled, each published once: {outbox}");
}

/// One `tally bench <scenario>` run in a directory of its own, on databases of its own
/// (`--database`), dropped after it.
struct Bench {
    dir: std::path::PathBuf,
    scenario: &'static str,
    stderr: String,
    /// The run's stamp, from its JSON's name.
    stamp: String,
}

impl Bench {
    fn run(scenario: &'static str, args: &[&str], log_level: &str) -> Self {
        let server = std::env::var("TALLY_TEST_DATABASE_URL").unwrap_or_else(|_| DEFAULT_DATABASE_URL.to_owned());
        let prefix = format!("tally_test_{scenario}_{}", &uuid::Uuid::new_v4().simple().to_string()[..12]);
        let dir = std::env::temp_dir().join(&prefix);
        std::fs::create_dir_all(&dir).expect("a directory");
        let output = std::process::Command::new(tally_binary())
            .args(["bench", scenario])
            .args(args)
            .args(["--database", &format!("{prefix}_db")])
            .env("TALLY__DATABASE__URL", &server)
            .env("TALLY__LOG__LEVEL", log_level)
            .env_remove("RUST_LOG")
            .current_dir(&dir)
            .output()
            .expect("run tally bench");
        drop_databases(&server, &prefix);
        let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
        let stdout = String::from_utf8_lossy(&output.stdout);
        assert!(output.status.success(), "tally bench {scenario} failed:\n{stdout}\n{stderr}");
        let json = std::fs::read_dir(dir.join("target/bench"))
            .expect("target/bench")
            .filter_map(Result::ok)
            .filter_map(|e| e.file_name().into_string().ok())
            .find(|n| n.starts_with(&format!("{scenario}-")) && n.ends_with(".json"))
            .expect("the JSON report");
        let stamp = json.trim_start_matches(&format!("{scenario}-")).trim_end_matches(".json").to_owned();
        Self { dir, scenario, stderr, stamp }
    }

    fn file(&self, name: &str) -> std::path::PathBuf {
        self.dir.join("target/bench").join(name)
    }

    fn report(&self) -> serde_json::Value {
        let json = std::fs::read(self.file(&format!("{}-{}.json", self.scenario, self.stamp))).expect("the report");
        serde_json::from_slice(&json).expect("JSON")
    }

    /// Each plot `<name>-<stamp>.svg` exists and is an SVG.
    fn assert_drawn(&self, plots: &[&str]) {
        for plot in plots {
            let svg = std::fs::read_to_string(self.file(&format!("{plot}-{}.svg", self.stamp)));
            assert!(svg.is_ok_and(|s| s.starts_with("<svg")), "{plot}-{}.svg drawn", self.stamp);
        }
    }

    /// The log lines go to `<scenario>-<stamp>.log`, whose path stderr names at the end,
    /// and none to stderr; returns the log.
    fn assert_logs_apart(&self) -> String {
        let name = format!("{}-{}.log", self.scenario, self.stamp);
        let log = std::fs::read_to_string(self.file(&name)).expect("the log file");
        let levels = ["TRACE", "DEBUG", "INFO", "WARN", "ERROR"];
        let lines: Vec<&str> = self.stderr.lines().filter(|l| levels.iter().any(|level| l.contains(level))).collect();
        assert!(lines.is_empty(), "log lines on stderr: {lines:#?}");
        let last = self.stderr.lines().last().unwrap_or_default();
        assert_eq!(last, format!("log: target/bench/{name}"), "stderr ends with the log's path:\n{}", self.stderr);
        log
    }
}

impl Drop for Bench {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Drops the databases the bench made (`<prefix>_*`).
fn drop_databases(server: &str, prefix: &str) {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("a runtime");
    runtime.block_on(async {
        let (admin, connection) = tokio_postgres::connect(server, tokio_postgres::NoTls).await.expect("PostgreSQL");
        let driver = tokio::spawn(connection);
        let pattern = format!("{prefix}\\_%");
        let rows =
            admin.query("SELECT datname FROM pg_database WHERE datname LIKE $1", &[&pattern]).await.expect("list");
        for row in rows {
            let name: String = row.get(0);
            admin.batch_execute(&format!("DROP DATABASE IF EXISTS \"{name}\" WITH (FORCE)")).await.expect("drop");
        }
        drop(admin);
        let _ = driver.await;
    });
}
