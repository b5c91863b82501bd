//! Supervision: nothing a record carries stops a stage. Hostile records (header names that
//! are not UTF-8, hundreds of headers, tombstones, keys and values that are not what the
//! stage reads) on every consumed topic are dead-lettered once as poison, and every stage
//! keeps handling what comes after them.
//!
//! Broker: the embedded broker (librdkafka's mock cluster, 3 brokers, in this process).
#![allow(clippy::expect_used)] // tests: a failed expectation is a failed test, with its message

use std::collections::BTreeMap;

use serde_json::json;
use tally_integration_tests::hostile::{hostile_records, produce_raw};
use tally_integration_tests::{
    create_account, final_state, json_body, post_transfer, read_topic, spawn_app, wait_until, Deadline, WebhookReceiver,
};
use tally_schema::headers as h;

/// Every topic a stage consumes, with the groups that read it (each dead-letters its own
/// copy of a poison record).
fn consumed_topics(config: &tally_engine::Config) -> Vec<(String, usize)> {
    let t = &config.kafka.topics;
    let mut topics = vec![
        (t.transfers_requested.clone(), 1),
        (t.transfers_analyzed.clone(), 1),
        // The status projection and notifications.
        (t.transfers_settled.clone(), 2),
        (t.transfers_rejected.clone(), 2),
        (t.orders_received.clone(), 1),
    ];
    for delay in config.notifications.delays_ms() {
        for source in [&t.transfers_settled, &t.transfers_rejected] {
            topics.push((tally_schema::topics::retry(source, delay), 1));
        }
    }
    topics
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_records_on_every_consumed_topic_are_dead_lettered_and_every_stage_goes_on() {
    let receiver = WebhookReceiver::start(|_, _| 200).await;
    let (env, app) = spawn_app(|c| {
        c.notifications.webhook_url = tally_engine::config::SecretUrl::new(receiver.url.clone());
        c.notifications.webhook_secret = tally_engine::config::Secret::new("s3cret");
    })
    .await;
    let topics = consumed_topics(&env.config());
    let hostile = hostile_records();
    // Signed as tally signs, so that each reaches the stage's own decoding.
    let keyring = env.keyring();
    let records: Vec<_> = hostile.iter().map(|(_, r)| r.signed(&keyring)).collect();
    for (topic, _) in &topics {
        for partition in 0..2 {
            produce_raw(env.bootstrap(), topic, partition, &records);
        }
    }

    // Every stage still handles what comes after: a transfer settles (antifraud, ledger,
    // projection), its notification is delivered, an order is materialized.
    create_account(&app, "CC-H1", 10_000, "BRL").await;
    create_account(&app, "CC-H2", 0, "BRL").await;
    let id = post_transfer(&app, "CC-H1", "CC-H2", 2_500).await;
    assert_eq!(final_state(&app, id).await["status"], "SETTLED");
    let order = app
        .post_json(
            "/orders",
            &json!({ "externalReference": "EXT-H", "customerId": "CUST-H", "amountCents": 10, "currency": "BRL" }),
        )
        .await;
    assert_eq!(order.status(), 201);
    let order_id: uuid::Uuid = serde_json::from_value(json_body(order).await["id"].clone()).expect("order id");
    wait_until("the order is materialized", Deadline::DEFAULT, || async {
        let n = env.db.scalar_i64("SELECT count(*) FROM received_orders WHERE order_id = $1", &[&order_id]).await;
        if n == 1 {
            Ok(())
        } else {
            Err(format!("{n} rows"))
        }
    })
    .await;
    wait_until("the settlement is notified", Deadline::DEFAULT, || async {
        let calls = receiver.calls();
        if calls.iter().any(|c| c.status == 200 && String::from_utf8_lossy(&c.body).contains(&id.to_string())) {
            Ok(())
        } else {
            Err(format!("{} calls", calls.len()))
        }
    })
    .await;

    // Each hostile record was dead-lettered once per group that reads its topic, as
    // poison: to its topic's DLT, or (retry topics have none) to the dead_letters table.
    let expected: BTreeMap<String, usize> =
        topics.iter().map(|(topic, groups)| (topic.clone(), groups * 2 * hostile.len())).collect();
    let dead = wait_until("every hostile record is dead-lettered", Deadline::DEFAULT, || async {
        let mut dead: BTreeMap<String, usize> = BTreeMap::new();
        for (topic, _) in &topics {
            let dlt = tally_schema::topics::dlt(topic);
            if let Ok(records) = read_topic(env.bootstrap(), &dlt, Deadline::secs(10)).await {
                for r in records {
                    assert_eq!(r.header(h::DLT_EXCEPTION_KIND), Some("poison"), "{dlt}: {r:?}");
                    *dead.entry(r.header(h::DLT_ORIGINAL_TOPIC).unwrap_or_default().to_owned()).or_default() += 1;
                }
            }
        }
        for row in env.db.query("SELECT original_topic, exception_kind FROM dead_letters", &[]).await {
            assert_eq!(row.get::<_, String>(1), "poison");
            *dead.entry(row.get(0)).or_default() += 1;
        }
        if dead == expected {
            Ok(dead)
        } else {
            Err(format!("dead-lettered {dead:?}, expected {expected:?}"))
        }
    })
    .await;
    drop(dead);
    let ready = app.admin_get("/readyz").await;
    assert_eq!(ready.status(), 200, "{}", json_body(ready).await);
    app.stop().await;
}

/// Ends every connection of the stage whose pool is named `tally-<pool>`, so that it
/// connects again and picks up the database's current defaults.
async fn reconnect(db: &tally_integration_tests::TestDb, pool: &str) {
    db.query(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
         WHERE datname = current_database() AND application_name = $1",
        &[&format!("tally-{pool}")],
    )
    .await;
}

/// A database that turns read-only under the ledger (what a failover onto a standby or a
/// demoted primary looks like) is a dependency that is down, not a fault of the transfer
/// in hand: the ledger waits, shows itself degraded, spends none of the record's retries
/// and dead-letters nothing; once the database takes writes again, the transfer settles.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_only_database_degrades_the_ledger_and_dead_letters_nothing() {
    const TOKEN: &str = "admin-t0ken";
    let (env, app) = spawn_app(|c| {
        c.http.admin_token = tally_engine::config::Secret::new(TOKEN);
        c.ledger.retry = tally_engine::config::RetryConfig {
            max_retries: 2,
            initial: std::time::Duration::from_millis(100),
            multiplier: 2.0,
            max: std::time::Duration::from_millis(200),
        };
    })
    .await;
    create_account(&app, "CC-R1", 10_000, "BRL").await;
    create_account(&app, "CC-R2", 0, "BRL").await;
    let admin =
        |path: &str| app.send(reqwest::Client::new().post(format!("{}{path}", app.admin_url)).bearer_auth(TOKEN));
    assert_eq!(admin("/admin/pipelines/ledger/pause").await.status(), 200);
    let id = post_transfer(&app, "CC-R1", "CC-R2", 1_000).await;
    // Analyzed (antifraud writes too): the ledger has the transfer to settle.
    wait_until("the transfer is analyzed", Deadline::DEFAULT, || async {
        let analyzed = read_topic(env.bootstrap(), "transfers.analyzed", Deadline::secs(10)).await;
        match analyzed {
            Ok(records) if records.iter().any(|r| r.payload_json()["transferId"] == id.to_string()) => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    let db = env.db.name().to_owned();
    env.db.execute(&format!("ALTER DATABASE \"{db}\" SET default_transaction_read_only = on"), &[]).await;
    reconnect(&env.db, "ledger").await;
    assert_eq!(admin("/admin/pipelines/ledger/resume").await.status(), 200);

    // Degraded, and waiting well past the record's whole retry budget (3 attempts).
    wait_until("the ledger waits for a writable database", Deadline::DEFAULT, || async {
        let metrics = app.metrics().await;
        let waits =
            tally_integration_tests::metric_value(&metrics, "tally_dependency_waits_total{pipeline=\"ledger\"}")
                .unwrap_or(0.0);
        let ready = app.admin_get("/readyz").await;
        let body = json_body(ready).await.to_string();
        if waits >= 6.0 && body.contains("ledger degraded") {
            Ok(())
        } else {
            Err(format!("{waits} waits; readyz {body}"))
        }
    })
    .await;
    let dlt = read_topic(env.bootstrap(), "transfers.analyzed-dlt", Deadline::secs(10)).await.expect("the DLT");
    assert!(dlt.is_empty(), "dead-lettered while the database was read-only: {dlt:?}");
    assert_eq!(env.db.count("dead_letters").await, 0);

    env.db.execute(&format!("ALTER DATABASE \"{db}\" SET default_transaction_read_only = off"), &[]).await;
    reconnect(&env.db, "ledger").await;
    assert_eq!(final_state(&app, id).await["status"], "SETTLED");
    let dlt = read_topic(env.bootstrap(), "transfers.analyzed-dlt", Deadline::secs(10)).await.expect("the DLT");
    assert!(dlt.is_empty(), "{dlt:?}");
    app.stop().await;
}

/// The probe that blames the dependency: it passes on a writable database (and writes the
/// stage's heartbeat) and fails on one that turned read-only, whatever error the failed
/// statement showed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dependency_probe_fails_on_a_read_only_database() {
    use tally_actors::supervise::{DependencyProbe, PROBE_FRESH};
    let db = tally_integration_tests::TestDb::new().await;
    let pool = || db.pool(1, std::time::Duration::from_secs(5), "tally-probe-test");
    let probe = DependencyProbe::new("ledger", pool());
    assert_eq!(probe.check().await, Ok(()));
    assert_eq!(db.count("heartbeats").await, 1, "the probe wrote its heartbeat");
    let name = db.name().to_owned();
    db.execute(&format!("ALTER DATABASE \"{name}\" SET default_transaction_read_only = on"), &[]).await;
    // A new connection picks the default up; the answer of the first probe is stale by then.
    let probe = DependencyProbe::new("ledger", pool());
    let refused = probe.check().await;
    assert!(refused.as_ref().is_err_and(|e| e.contains("read-only")), "{refused:?}");
    db.execute(&format!("ALTER DATABASE \"{name}\" SET default_transaction_read_only = off"), &[]).await;
    tokio::time::sleep(PROBE_FRESH).await;
    reconnect(&db, "probe-test").await;
    tally_integration_tests::wait_until("the probe passes again", Deadline::DEFAULT, || async { probe.check().await })
        .await;
}

/// A daemon process with the test fault switch `fault` on and `extra` settings, over a
/// migrated database and every topic: its environment, intake and admin addresses and
/// process.
async fn daemon_with_fault(
    fault: &str,
    extra: &[(&str, &str)],
) -> (tally_integration_tests::TestEnv, String, String, tally_integration_tests::TallyProcess) {
    let env = tally_integration_tests::TestEnv::new().await;
    tally_actors::store::migrate::prepare_blocking(env.db.url()).expect("migrate");
    for spec in tally_engine::topics::topic_specs(&tally_engine::Config::default()) {
        env.broker.create_topic_if_missing(&spec.name, spec.partitions, 1).expect("topic");
    }
    let (intake, admin) = (tally_integration_tests::free_addr(), tally_integration_tests::free_addr());
    let mut vars =
        vec![("TALLY_FAULT", fault), ("TALLY__HTTP__INTAKE_ADDR", &intake), ("TALLY__HTTP__ADMIN_ADDR", &admin)];
    vars.extend_from_slice(extra);
    let child = tally_integration_tests::spawn_tally_process(&env, &vars);
    (env, intake, admin, child)
}

/// A stage that panics (a bug, played by the `crash-on-marked-record` fault switch) is
/// restarted from its committed offsets; the record it crashed on twice is dead-lettered
/// as poison (`crashed: ...`) instead of crashing it a third time, and the stage goes on.
/// For the ledger (a pipeline's driver thread) and antifraud (its transactional loop).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crashing_record_restarts_its_stage_twice_then_is_dead_lettered() {
    use tally_integration_tests::hostile::RawRecord;
    let (env, intake, admin, _child) = daemon_with_fault("crash-on-marked-record", &[]).await;
    let http = reqwest::Client::new();
    let marked = RawRecord {
        key: Some(b"CC-C1".to_vec()),
        value: Some(b"{}".to_vec()),
        headers: vec![(tally_actors::faults::CRASH_HEADER.as_bytes().to_vec(), Some(b"1".to_vec()))],
    };
    for topic in ["transfers.analyzed", "transfers.requested"] {
        produce_raw(env.bootstrap(), topic, 0, std::slice::from_ref(&marked));
    }
    let crashed = |dlt: &'static str| {
        let env = &env;
        async move {
            let records = read_topic(env.bootstrap(), dlt, Deadline::secs(10)).await.map_err(|e| e.to_string())?;
            let found = records.iter().any(|r| {
                r.header(h::DLT_EXCEPTION_KIND) == Some("poison")
                    && r.header(h::DLT_EXCEPTION_MESSAGE).is_some_and(|m| m.starts_with("crashed:"))
            });
            if found {
                Ok(records.len())
            } else {
                Err(format!("{} records in {dlt}", records.len()))
            }
        }
    };
    assert_eq!(
        wait_until("the ledger dead-letters the record", Deadline::DEFAULT, || crashed("transfers.analyzed-dlt")).await,
        1
    );
    assert_eq!(
        wait_until("antifraud dead-letters the record", Deadline::DEFAULT, || crashed("transfers.requested-dlt")).await,
        1
    );
    let metrics =
        http.get(format!("http://{admin}/metrics")).send().await.expect("metrics").text().await.expect("text");
    for stage in ["ledger", "antifraud"] {
        let restarts = tally_integration_tests::metric_value(
            &metrics,
            &format!("tally_stage_restarts_total{{stage=\"{stage}\"}}"),
        );
        assert_eq!(restarts, Some(2.0), "{stage}: two crashes, then the record was dead-lettered");
    }
    // Both stages run again: a transfer settles through them.
    for (id, balance) in [("CC-C1", 5_000), ("CC-C2", 0)] {
        let res = http
            .post(format!("http://{intake}/accounts"))
            .json(&json!({ "id": id, "currency": "BRL", "initialBalanceCents": balance }))
            .send()
            .await
            .expect("POST /accounts");
        assert_eq!(res.status(), 201);
    }
    let res = http
        .post(format!("http://{intake}/transfers"))
        .json(
            &json!({ "sourceAccount": "CC-C1", "destinationAccount": "CC-C2", "amountCents": 700, "currency": "BRL" }),
        )
        .send()
        .await
        .expect("POST /transfers");
    let id = json_body(res).await["id"].as_str().expect("id").to_owned();
    tally_integration_tests::wait_settled(&http, &intake, &id).await;
    let ready = http.get(format!("http://{admin}/readyz")).send().await.expect("readyz");
    assert_eq!(ready.status(), 200, "{}", json_body(ready).await);
    let pipelines =
        json_body(http.get(format!("http://{admin}/admin/pipelines")).send().await.expect("pipelines")).await;
    let ledger = pipelines["pipelines"].as_array().and_then(|p| p.iter().find(|p| p["name"] == "ledger")).cloned();
    let restart = ledger.map(|l| l["restart"].clone()).unwrap_or_default();
    assert_eq!(restart["restarts"], 2, "{pipelines}");
    assert!(restart["lastCrash"].as_str().is_some_and(|c| c.contains("test fault")), "{restart}");
}

/// A record whose handling never ends (played by the `hang-on-marked-record` fault switch:
/// a call that never returns, the first time the process sees the record) stalls its
/// partition with nothing logged and nothing failing. The stage's watchdog restarts it
/// from the committed offsets once records have waited its stall bound with none
/// finished; the record goes through on redelivery, and the one behind it, handled
/// meanwhile, is not applied twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_record_that_never_finishes_gets_its_stage_restarted_by_the_watchdog() {
    let (env, _intake, admin, _child) = daemon_with_fault(
        "hang-on-marked-record",
        &[
            // The orders stage's bound is then its retry sequence's worst case (one retry
            // after 100 ms, two attempts of at most 1 s) plus 10 s.
            ("TALLY__CONSUMER__STALL_AFTER_MS", "1000"),
            ("TALLY__ORDERS__RETRY__MAX_RETRIES", "1"),
            ("TALLY__ORDERS__RETRY__INITIAL_MS", "100"),
            ("TALLY__ORDERS__RETRY__MAX_MS", "100"),
            ("TALLY__DATABASE__STATEMENT_TIMEOUT_MS", "1000"),
        ],
    )
    .await;
    let http = reqwest::Client::new();
    let ready = || {
        let (http, admin) = (&http, &admin);
        async move {
            let res = http.get(format!("http://{admin}/readyz")).send().await.map_err(|e| e.to_string())?;
            if res.status().is_success() {
                Ok(())
            } else {
                Err(res.text().await.unwrap_or_default())
            }
        }
    };
    wait_until("the daemon is ready", Deadline::DEFAULT, ready).await;
    let order = |id: uuid::Uuid, reference: &str| {
        json!({
            "eventId": uuid::Uuid::new_v4(), "orderId": id, "externalReference": reference,
            "customerId": "CUST-1", "amountCents": 4_990, "currency": "BRL", "receivedAt": "2026-12-01T12:00:00Z",
        })
    };
    let (hung, behind) = (uuid::Uuid::new_v4(), uuid::Uuid::new_v4());
    let (hung_order, behind_order) = (order(hung, "REF-HUNG"), order(behind, "REF-BEHIND"));
    // Orders the intake took, announced in one partition: the marked one first.
    let upstream = env.upstream();
    env.db.record_order(&hung_order).await;
    env.db.record_order(&behind_order).await;
    let marked = [(tally_actors::faults::HANG_HEADER, "1")];
    for (event, extra) in [(&hung_order, &marked[..]), (&behind_order, &[][..])] {
        let (key, payload) = (event["externalReference"].as_str().expect("a reference"), event.to_string());
        upstream.signed_with("orders.received", Some(0), key, payload.as_bytes(), "OrderReceived", extra).await;
    }
    let received = |id: uuid::Uuid| {
        let db = &env.db;
        async move { db.scalar_i64("SELECT count(*) FROM received_orders WHERE order_id = $1", &[&id]).await }
    };
    wait_until("the order behind the hung one is received", Deadline::DEFAULT, || async {
        if received(behind).await == 1 {
            Ok(())
        } else {
            Err("not yet".to_owned())
        }
    })
    .await;
    wait_until("the hung order is received after the stage restarted", Deadline::secs(90), || async {
        match received(hung).await {
            1 => Ok(()),
            n => Err(format!("{n} received_orders rows")),
        }
    })
    .await;
    assert_eq!(received(behind).await, 1, "the order behind, redelivered, is not received twice");
    let pipelines =
        json_body(http.get(format!("http://{admin}/admin/pipelines")).send().await.expect("pipelines")).await;
    let orders = pipelines["pipelines"].as_array().and_then(|p| p.iter().find(|p| p["name"] == "orders")).cloned();
    let restart = orders.map(|o| o["restart"].clone()).unwrap_or_default();
    assert_eq!(restart["restarts"], 1, "{pipelines}");
    assert!(restart["lastCrash"].as_str().is_some_and(|c| c.contains("stalled")), "{restart}");
    let metrics =
        http.get(format!("http://{admin}/metrics")).send().await.expect("metrics").text().await.expect("text");
    let restarts = tally_integration_tests::metric_value(&metrics, "tally_stage_restarts_total{stage=\"orders\"}");
    assert_eq!(restarts, Some(1.0));
    wait_until("the daemon is ready again", Deadline::DEFAULT, ready).await;
}

/// A stage whose stop never comes back (played by the `hang-on-stop` fault switch: each
/// driver thread, told to stop, never returns) does not hold the daemon: each stop is given up after its
/// stage's bound (the drain or transaction bound, plus a margin), and the daemon exits
/// non-zero, saying which stages it gave up, well before a service manager would kill it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stop_that_never_comes_back_is_given_up_and_the_exit_says_so() {
    let instance = format!("test-hang-stop-{}", &uuid::Uuid::new_v4().simple().to_string()[..8]);
    let (_env, _intake, admin, mut child) = daemon_with_fault(
        "hang-on-stop",
        &[
            ("TALLY__INSTANCE__ID", &instance),
            ("TALLY__CONSUMER__DRAIN_TIMEOUT_MS", "1000"),
            ("TALLY__ANTIFRAUD__TRANSACTION_TIMEOUT_MS", "2000"),
            ("TALLY__ANTIFRAUD__CALL_TIMEOUT_MS", "1000"),
            // Each pipeline's drain is at least its retry sequence's worst case: short.
            ("TALLY__DATABASE__STATEMENT_TIMEOUT_MS", "1000"),
            ("TALLY__NOTIFICATIONS__TIMEOUT_MS", "1000"),
            ("TALLY__LEDGER__RETRY__MAX_RETRIES", "1"),
            ("TALLY__PROJECTION__RETRY__MAX_RETRIES", "1"),
            ("TALLY__ORDERS__RETRY__MAX_RETRIES", "1"),
            ("TALLY__NOTIFICATIONS__RETRY__MAX_RETRIES", "1"),
        ],
    )
    .await;
    let http = reqwest::Client::new();
    wait_until("the daemon is ready", Deadline::DEFAULT, || async {
        let res = http.get(format!("http://{admin}/readyz")).send().await.map_err(|e| e.to_string())?;
        if res.status().is_success() {
            Ok(())
        } else {
            Err(res.status().to_string())
        }
    })
    .await;
    assert!(child.signal("TERM"), "kill -TERM");
    // The longest stage bound is 42 s (antifraud: 2 x 2 s + 3 x 1 s + 20 s for its
    // database call and flush + the 15 s margin); a daemon that waits on the hung threads
    // never exits.
    let status = wait_until("the daemon exits", Deadline::secs(120), || {
        let exited = child.try_wait().map_err(|e| e.to_string()).and_then(|s| s.ok_or_else(|| "running".to_owned()));
        async move { exited }
    })
    .await;
    assert!(!status.success(), "a stop that was given up is no clean exit: {status}");
    let log = child.log_text();
    assert!(log.contains("stop was given up"), "{log}");
    assert!(!log.contains("The stop did not finish in time"), "each stage's bound, not the last resort: {log}");
    for stage in ["tally-antifraud", "tally-ledger"] {
        let named = log.lines().any(|l| l.contains("stopped without draining every stage") && l.contains(stage));
        assert!(named, "the exit names {stage}: {log}");
    }
}
