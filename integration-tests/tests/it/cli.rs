//! What an operator meets at a shell on a bad day: a taken port, a database that cannot be
//! reached, librdkafka credentials from the environment, the topics as the cluster has
//! them, `tally config` and log lines that are meant for a file.
//!
//! Every daemon here is a `tally` child process with stderr in a file. Broker: `tally
//! broker` children (the librdkafka mock cluster in its own process) where one is needed.
//! Database: a fresh PostgreSQL database per test, or none.
#![allow(clippy::expect_used)] // tests: a failed expectation is a failed test, with its message

use std::process::Command;

use tally_integration_tests::{free_addr, tally_binary, TestDb};

use crate::startup::{start_broker, wait_ready, Proc};

/// Lines of `log` that mention start-up work other than binding: the database, the broker,
/// topics, pipelines.
fn start_up_work(log: &str) -> Vec<&str> {
    let words = ["migration", "database", "broker", "topic", "pipeline", "partition", "kafka"];
    log.lines().filter(|l| words.iter().any(|w| l.to_lowercase().contains(w))).collect()
}

/// A port another process holds: `tally run` fails naming it and its key, before it
/// touches the database or the broker, and its log (a file) has no colour codes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_taken_port_fails_the_start_before_anything_else() {
    let db = TestDb::new().await;
    let taken = std::net::TcpListener::bind("127.0.0.1:0").expect("bind a port");
    let taken_addr = taken.local_addr().expect("its address").to_string();
    let mut run = Proc::start(
        "taken-port",
        &["run"],
        &[
            ("TALLY__DATABASE__URL", db.url()),
            ("TALLY__HTTP__INTAKE_ADDR", &free_addr()),
            ("TALLY__HTTP__ADMIN_ADDR", &taken_addr),
        ],
    );
    assert!(!run.exited("tally run exits").await, "a taken port is an error");
    let log = run.log();
    println!("{log}");
    let errors: Vec<&str> = log.lines().filter(|l| l.contains("ERROR")).collect();
    assert_eq!(errors.len(), 1, "one error line: {log}");
    assert!(errors[0].contains(&taken_addr) && errors[0].contains("http.admin_addr"), "{log}");
    let work = start_up_work(&log);
    assert!(work.is_empty(), "nothing else started before the bind failed: {work:?}");
    assert!(!log.contains('\u{1b}'), "no ANSI escape codes in a file: {log:?}");
}

/// A database that does not answer: the error names its URL with the port (and not the
/// password), once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_database_is_named_with_its_port_once() {
    // A port nothing listens on.
    let port = free_addr().rsplit(':').next().expect("a port").to_owned();
    let url = format!("postgres://app:zz-hidden@127.0.0.1:{port}/tally");
    let mut run = Proc::start(
        "no-database",
        &["run"],
        &[
            ("TALLY__DATABASE__URL", &url),
            ("TALLY__HTTP__INTAKE_ADDR", &free_addr()),
            ("TALLY__HTTP__ADMIN_ADDR", &free_addr()),
        ],
    );
    assert!(!run.exited("tally run exits").await, "no database is an error");
    let log = run.log();
    println!("{log}");
    let shown = format!("postgres://app@127.0.0.1:{port}/tally");
    assert_eq!(log.matches(&shown).count(), 1, "the URL with its port, once: {log}");
    assert_eq!(log.lines().filter(|l| l.contains("ERROR")).count(), 1, "{log}");
    assert!(!log.contains("zz-hidden"), "{log}");
    assert!(!log.contains('\u{1b}'), "no ANSI escape codes in a file: {log:?}");
}

/// `tally` run to completion with `envs`: its exit success, stdout and stderr.
fn tally(args: &[&str], envs: &[(&str, &str)]) -> (bool, String, String) {
    let out = Command::new(tally_binary()).args(args).envs(envs.iter().copied()).output().expect("run tally");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// librdkafka properties with dots in their names come from `TALLY__KAFKA__PRODUCER__*`
/// too, and `tally config` shows them (credentials redacted) and its tables of tiers
/// indented like every other array.
#[test]
fn tally_config_takes_librdkafka_properties_from_the_environment() {
    let (ok, out, err) = tally(
        &["config"],
        &[
            ("TALLY__KAFKA__PRODUCER__SASL.PASSWORD", "zz-env-secret"),
            ("TALLY__KAFKA__PRODUCER__SASL.MECHANISM", "PLAIN"),
            ("TALLY__KAFKA__CONSUMER__FETCH.MIN.BYTES", "2"),
        ],
    );
    assert!(ok, "tally config: {err}");
    println!("{out}");
    assert!(out.contains(r#""sasl.password" = "<redacted>""#), "{out}");
    assert!(out.contains(r#""sasl.mechanism" = "PLAIN""#), "{out}");
    assert!(out.contains(r#""fetch.min.bytes" = "2""#), "{out}");
    assert!(!out.contains("zz-env-secret"), "{out}");
    // Every line of a multi-line array is indented under its key, nested ones too.
    let tiers = out.lines().skip_while(|l| !l.starts_with("amount_tiers")).skip(1).take_while(|l| *l != "]");
    let tiers: Vec<&str> = tiers.collect();
    assert!(!tiers.is_empty(), "amount_tiers spans lines: {out}");
    assert!(tiers.iter().all(|l| l.starts_with("    [")), "each tier on its own indented line: {tiers:#?}");
}

/// `tally topics list` against a cluster: every topic tally uses, with the partitions it
/// is created with and the partitions the cluster has (or `missing`), its role, and the
/// cluster's topics tally does not use. (The mock cluster answers no CreateTopics, so
/// `tally topics create` is not run here.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tally_topics_list_shows_the_topics_as_the_cluster_has_them() {
    let (_broker, bootstrap) = start_broker().await;
    let env = [("TALLY__KAFKA__BROKERS", bootstrap.as_str()), ("TALLY__KAFKA__TOPICS__ORDERS_RECEIVED", "ops.orders")];
    let (ok, before, err) = tally(&["topics", "list"], &env);
    assert!(ok, "tally topics list: {err}");
    println!("{before}");
    let line = |listing: &str, topic: &str| {
        listing.lines().find(|l| l.split_whitespace().next() == Some(topic)).map(str::to_owned).unwrap_or_default()
    };
    assert!(before.starts_with("TOPIC"), "{before}");
    assert!(line(&before, "ops.orders").contains("missing"), "{before}");
    assert!(line(&before, "transfers.requested").contains("source"), "the broker made the others: {before}");
    assert!(line(&before, "transfers.requested-dlt").contains("dead letters"), "{before}");
    let others = before.lines().find(|l| l.starts_with("Other topics on the cluster:")).unwrap_or_default();
    assert!(others.contains("orders.received"), "the topic tally no longer uses: {before}");
    assert!(!others.contains("transfers."), "{before}");
}

/// The migration runner's NOTICE (its table exists already) is not logged on every start.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_migrate_logs_no_notice() {
    let db = TestDb::new().await;
    for round in ["first", "second"] {
        let (ok, out, err) = tally(&["migrate"], &[("TALLY__DATABASE__URL", db.url())]);
        assert!(ok, "{round} tally migrate: {err}");
        println!("{round}: {out}{err}");
        assert!(!err.contains("NOTICE") && !err.contains("already exists"), "{round}: {err}");
    }
}

/// A daemon on `tally broker`, with a webhook: once ready, a notification's delivery is
/// not logged at INFO (one line per webhook is DEBUG).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delivered_webhook_is_not_an_info_line() {
    let db = TestDb::new().await;
    let webhook = tally_integration_tests::WebhookReceiver::start(|_, _| 200).await;
    let (_broker, bootstrap) = start_broker().await;
    let (admin, intake) = (free_addr(), free_addr());
    let run = Proc::start(
        "webhook-info",
        &["run"],
        &[
            ("TALLY__DATABASE__URL", db.url()),
            ("TALLY__KAFKA__BROKERS", &bootstrap),
            ("TALLY__HTTP__ADMIN_ADDR", &admin),
            ("TALLY__HTTP__INTAKE_ADDR", &intake),
            ("TALLY__NOTIFICATIONS__WEBHOOK_URL", &webhook.url),
            ("TALLY__NOTIFICATIONS__WEBHOOK_SECRET", "s"),
        ],
    );
    wait_ready(&admin, &run).await;
    let http = reqwest::Client::new();
    for (id, balance) in [("OP-A", 10_000), ("OP-B", 0)] {
        let body = serde_json::json!({"id": id, "currency": "BRL", "initialBalanceCents": balance});
        let res = http.post(format!("http://{intake}/accounts")).json(&body).send().await.expect("POST /accounts");
        assert_eq!(res.status(), 201);
    }
    let body =
        serde_json::json!({"sourceAccount": "OP-A", "destinationAccount": "OP-B", "amountCents": 5, "currency": "BRL"});
    let res = http.post(format!("http://{intake}/transfers")).json(&body).send().await.expect("POST /transfers");
    assert_eq!(res.status(), 201);
    tally_integration_tests::wait_until(
        "the delivery is counted",
        tally_integration_tests::Deadline::DEFAULT,
        || async {
            let metrics = http.get(format!("http://{admin}/metrics")).send().await.map_err(|e| e.to_string())?;
            let metrics = metrics.text().await.map_err(|e| e.to_string())?;
            if metrics.contains(r#"tally_notification_deliveries_total{outcome="delivered"} 1"#) {
                Ok(())
            } else {
                Err("not delivered yet".to_owned())
            }
        },
    )
    .await;
    assert!(webhook.calls().iter().any(|c| c.status == 200), "the webhook was called");
    let log = run.log();
    assert!(!log.contains("Notification delivered"), "{log}");
    assert!(!log.contains('\u{1b}'), "no ANSI escape codes in a file");
}

/// Several instances starting at once on a database that does not exist yet (a fresh
/// deployment's first rollout): each creates it or finds it created, none fails. The
/// sessions that lose the race meet either 42P04 or, while the winner's CREATE DATABASE
/// still runs, a unique violation on the catalog (23505).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_first_starts_create_the_database_once_and_all_go_on() {
    let server = std::env::var("TALLY_TEST_DATABASE_URL")
        .unwrap_or_else(|_| tally_integration_tests::DEFAULT_DATABASE_URL.to_owned());
    let (admin, connection) = tokio_postgres::connect(&server, tokio_postgres::NoTls).await.expect("connect");
    tokio::spawn(connection);
    for round in 0..5 {
        let name = format!("tally_test_race_{}", uuid::Uuid::new_v4().simple());
        let base = server.rsplit_once('/').map_or(server.as_str(), |(base, _)| base);
        let url = format!("{base}/{name}");
        let starts = (0..4).map(|_| tally_actors::store::migrate::create_database_if_missing(&url));
        let results = futures_util::future::join_all(starts).await;
        admin.batch_execute(&format!("DROP DATABASE IF EXISTS \"{name}\" WITH (FORCE)")).await.expect("drop");
        for result in results {
            if let Err(e) = result {
                panic!("round {round}: a start failed: {e:#}");
            }
        }
    }
}
