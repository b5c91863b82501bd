//! Black-box tests of a dependency outage: the database refuses connections for longer than
//! any record's retry budget. Not the records' fault: nothing is dead-lettered, the
//! pipelines say they are degraded and pause, and every transfer ends final once the
//! database is back. A partition revoked while its owner waits for the database is redone
//! by its new owner alone.
//!
//! Broker: the embedded broker (librdkafka's mock cluster) of the harness. Database: a fresh
//! PostgreSQL database per test, made to refuse connections (`ALLOW_CONNECTIONS false` and
//! its backends terminated), or cut off one daemon through a TCP proxy.
#![allow(clippy::expect_used)] // tests: a failed expectation is a failed test, with its message

use std::time::Duration;

use reqwest::StatusCode;
use serde_json::Value;
use tally_engine::config::RetryConfig;
use tally_engine::Config;
use tally_integration_tests::{
    assert_ledger_ok, create_account, final_state, json_body, metric_value, non_empty_dlts, post_transfer, read_topic,
    wait_until, DbProxy, Deadline, TestApp, TestEnv,
};
use uuid::Uuid;

const TOKEN: &str = "outage-token";
const SOURCES: [&str; 4] = ["transfers.requested", "transfers.analyzed", "transfers.settled", "transfers.rejected"];
const DEGRADED: &str = r#"tally_pipeline_degraded{pipeline="ledger"}"#;

/// A short budget, so that the outage outlasts it many times over: 2 retries of 100 ms.
fn short_budget(c: &mut Config) {
    let budget = RetryConfig {
        max_retries: 2,
        initial: std::time::Duration::from_millis(100),
        multiplier: 2.0,
        max: std::time::Duration::from_millis(200),
    };
    c.ledger.retry = budget.clone();
    c.projection.retry = budget.clone();
    c.orders.retry = budget;
    c.http.admin_token = tally_engine::config::Secret::new(TOKEN);
}

async fn admin_post(app: &TestApp, path: &str) -> reqwest::Response {
    app.send(app.client.post(format!("{}{path}", app.admin_url)).bearer_auth(TOKEN)).await
}

async fn pipeline(app: &TestApp, name: &str) -> Value {
    let all = json_body(app.admin_get("/admin/pipelines").await).await;
    all["pipelines"].as_array().expect("pipelines").iter().find(|p| p["name"] == name).expect("pipeline").clone()
}

/// Posts `n` transfers between four accounts while the ledger is paused, and waits until
/// antifraud decided every one (so they wait on `transfers.analyzed` or are rejected).
async fn transfers_waiting_for_the_ledger(app: &TestApp, n: usize) -> Vec<Uuid> {
    let res = admin_post(app, "/admin/pipelines/ledger/pause").await;
    assert_eq!(res.status(), StatusCode::OK, "pause the ledger");
    for (id, balance) in [("O-A", 100_000), ("O-B", 100_000), ("O-C", 0), ("O-D", 0)] {
        create_account(app, id, balance, "BRL").await;
    }
    let pairs = [("O-A", "O-C"), ("O-B", "O-D"), ("O-A", "O-B"), ("O-B", "O-C")];
    let mut ids = Vec::with_capacity(n);
    for i in 0..n {
        let (from, to) = pairs[i % pairs.len()];
        ids.push(post_transfer(app, from, to, 100 + i as i64).await);
    }
    wait_until("antifraud decided every transfer", Deadline::DEFAULT, || async {
        let analyzed =
            read_topic(&app.bootstrap, "transfers.analyzed", Deadline::secs(10)).await.map_or(0, |r| r.len());
        let rejected =
            read_topic(&app.bootstrap, "transfers.rejected", Deadline::secs(10)).await.map_or(0, |r| r.len());
        if analyzed + rejected >= n {
            Ok(())
        } else {
            Err(format!("{analyzed} analyzed, {rejected} rejected"))
        }
    })
    .await;
    ids
}

/// Records the ledger has taken and not finished, over its partitions.
async fn in_flight(app: &TestApp) -> u64 {
    let status = pipeline(app, "ledger").await;
    status["partitions"].as_array().map_or(0, |ps| ps.iter().filter_map(|p| p["inFlight"].as_u64()).sum())
}

async fn wait_degraded(app: &TestApp, degraded: bool) -> Value {
    wait_until(&format!("the ledger reports degraded = {degraded}"), Deadline::DEFAULT, || async {
        let status = pipeline(app, "ledger").await;
        let gauge = metric_value(&app.metrics().await, DEGRADED).unwrap_or(0.0);
        if status["degraded"] == degraded && (gauge == 1.0) == degraded {
            Ok(status)
        } else {
            Err(format!("status {status}, gauge {gauge}"))
        }
    })
    .await
}

/// Every transfer final, the ledger consistent, nothing dead-lettered anywhere.
async fn assert_everything_final(env: &TestEnv, app: &TestApp, ids: &[Uuid]) {
    for id in ids {
        let state = final_state(app, *id).await;
        assert!(state["status"] == "SETTLED" || state["status"] == "REJECTED", "{state}");
        let postings = env.db.scalar_i64("SELECT count(*) FROM postings WHERE transfer_id = $1", &[id]).await;
        assert_eq!(postings, if state["status"] == "SETTLED" { 2 } else { 0 }, "{state}");
    }
    assert_ledger_ok(app).await;
    assert_eq!(non_empty_dlts(&app.bootstrap, &SOURCES).await, vec![], "no dead-letter topic holds a record");
    assert_eq!(env.db.count("dead_letters").await, 0, "no record went to the dead_letters table");
}

/// The database refuses connections for seconds while the ledger has 24 transfers to
/// settle under a 300 ms retry budget: the ledger says it is degraded (status, gauge,
/// `/readyz`) and pauses; once the database is back every transfer settles or is
/// rejected, the ledger check holds and nothing was dead-lettered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_database_outage_longer_than_the_retry_budget_dead_letters_nothing() {
    let mut env = TestEnv::new().await;
    let app = env.spawn(short_budget).await;
    let ids = transfers_waiting_for_the_ledger(&app, 24).await;

    env.db.refuse_connections().await;
    let res = admin_post(&app, "/admin/pipelines/ledger/resume").await;
    assert_eq!(res.status(), StatusCode::OK, "resume the ledger into the outage");
    let status = wait_degraded(&app, true).await;
    assert!(status["waitingForDependency"].as_u64().unwrap_or(0) >= 1, "{status}");
    assert!(status["degradedReason"].as_str().is_some_and(|r| !r.is_empty()), "{status}");
    let ready = app.admin_get("/readyz").await;
    assert_eq!(ready.status(), StatusCode::SERVICE_UNAVAILABLE);
    let body = json_body(ready).await;
    assert!(body["reasons"].to_string().contains("pipeline ledger degraded"), "{body}");
    let intake = app
        .post_json("/accounts", &serde_json::json!({ "id": "O-Z", "currency": "BRL", "initialBalanceCents": 1 }))
        .await;
    assert_eq!(intake.status(), StatusCode::SERVICE_UNAVAILABLE, "the intake fails while the database is down");
    // Many times the retry budget: every record would have been dead-lettered by now.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(pipeline(&app, "ledger").await["degraded"], true, "still waiting, not given up");

    env.db.allow_connections().await;
    assert_everything_final(&env, &app, &ids).await;
    wait_degraded(&app, false).await;
    assert_eq!(app.admin_get("/readyz").await.status(), StatusCode::OK);
    let metrics = app.metrics().await;
    assert!(metric_value(&metrics, r#"tally_dependency_waits_total{pipeline="ledger"}"#).unwrap_or(0.0) >= 1.0);
    // Initialised at 0 from the start: it must still be 0.
    assert_eq!(
        metric_value(&metrics, r#"tally_records_total{outcome="dead_lettered",pipeline="ledger"}"#).unwrap_or(0.0),
        0.0
    );
}

/// An admin pause outlasts a degradation: the pipeline paused by an operator during the
/// outage stays paused after the database is back (transfers posted then stay PENDING),
/// and resumes only when told.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_admin_pause_survives_the_end_of_a_degradation() {
    let mut env = TestEnv::new().await;
    let app = env.spawn(short_budget).await;
    let mut ids = transfers_waiting_for_the_ledger(&app, 4).await;
    env.db.refuse_connections().await;
    assert_eq!(admin_post(&app, "/admin/pipelines/ledger/resume").await.status(), StatusCode::OK);
    wait_degraded(&app, true).await;
    assert_eq!(admin_post(&app, "/admin/pipelines/ledger/pause").await.status(), StatusCode::OK);
    let taken = in_flight(&app).await;
    env.db.allow_connections().await;
    let status = wait_degraded(&app, false).await;
    assert_eq!(status["paused"], true, "{status}");
    // What the ledger had taken before the pause finishes while it stays paused. (A
    // degraded pipeline pauses its partitions, so records of partitions not fetched before
    // the first failure are not taken: they wait for the resume with the later transfers.)
    wait_until("the records taken before the pause finish", Deadline::DEFAULT, || async {
        match in_flight(&app).await {
            0 => Ok(()),
            n => Err(format!("{n} in flight")),
        }
    })
    .await;
    let mut finished = 0;
    for id in &ids {
        let state = json_body(app.get(&format!("/transfers/{id}")).await).await;
        finished += u64::from(state["status"] != "PENDING");
    }
    assert!(finished >= taken, "{taken} records were in flight at the pause, {finished} transfers finished");
    let later = vec![post_transfer(&app, "O-A", "O-C", 7).await, post_transfer(&app, "O-B", "O-D", 9).await];
    wait_until("antifraud decided the later transfers", Deadline::DEFAULT, || async {
        let analyzed =
            read_topic(&app.bootstrap, "transfers.analyzed", Deadline::secs(10)).await.map_or(0, |r| r.len());
        if analyzed >= ids.len() + later.len() {
            Ok(())
        } else {
            Err(format!("{analyzed} analyzed"))
        }
    })
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    for id in &later {
        let state = json_body(app.get(&format!("/transfers/{id}")).await).await;
        assert_eq!(state["status"], "PENDING", "the ledger stays paused: {state}");
    }
    assert_eq!(admin_post(&app, "/admin/pipelines/ledger/resume").await.status(), StatusCode::OK);
    ids.extend(later);
    assert_everything_final(&env, &app, &ids).await;
}

/// Antifraud waits out a database outage three times longer than `max.poll.interval.ms`
/// without leaving its group: it keeps polling with its partitions paused, so the group
/// never rebalances (an expelled member would lose and re-take its partitions), and every
/// transfer is decided once the database is back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn antifraud_keeps_its_partitions_through_a_database_outage() {
    let mut env = TestEnv::new().await;
    let app = env
        .spawn(|c| {
            short_budget(c);
            for (k, v) in [("session.timeout.ms", "3000"), ("max.poll.interval.ms", "3000")] {
                c.kafka.consumer.insert(k.into(), v.into());
            }
            c.antifraud.retry = RetryConfig {
                max_retries: 2,
                initial: std::time::Duration::from_millis(100),
                multiplier: 2.0,
                max: std::time::Duration::from_millis(500),
            };
        })
        .await;
    for (id, balance) in [("K-A", 100_000), ("K-B", 0)] {
        create_account(&app, id, balance, "BRL").await;
    }
    assert_eq!(admin_post(&app, "/admin/pipelines/antifraud/pause").await.status(), StatusCode::OK);
    let mut ids = Vec::new();
    for i in 0..8 {
        ids.push(post_transfer(&app, "K-A", "K-B", 100 + i).await);
    }
    env.db.wait_outbox_published().await;
    const REVOKED: &str = r#"tally_rebalances_total{event="revoked",pipeline="antifraud"}"#;
    let revoked_before = metric_value(&app.metrics().await, REVOKED).unwrap_or(0.0);

    env.db.refuse_connections().await;
    assert_eq!(admin_post(&app, "/admin/pipelines/antifraud/resume").await.status(), StatusCode::OK);
    tokio::time::sleep(Duration::from_secs(9)).await;
    // Admin commands are served while the stage waits: pause, then resume after the outage.
    assert_eq!(admin_post(&app, "/admin/pipelines/antifraud/pause").await.status(), StatusCode::OK);
    assert_eq!(pipeline(&app, "antifraud").await["paused"], true);
    env.db.allow_connections().await;
    assert_eq!(admin_post(&app, "/admin/pipelines/antifraud/resume").await.status(), StatusCode::OK);

    assert_everything_final(&env, &app, &ids).await;
    let metrics = app.metrics().await;
    assert!(metric_value(&metrics, r#"tally_retries_total{pipeline="antifraud"}"#).unwrap_or(0.0) >= 1.0);
    assert_eq!(
        metric_value(&metrics, REVOKED).unwrap_or(0.0),
        revoked_before,
        "antifraud lost no partition: it stayed in its group through the outage"
    );
}

fn analyzed(from: &str, to: &str, amount: i64) -> (Uuid, Value) {
    let id = Uuid::new_v4();
    let event = serde_json::json!({
        "eventId": Uuid::new_v4(), "transferId": id, "sourceAccount": from,
        "destinationAccount": to, "amountCents": amount, "currency": "BRL", "score": 10,
        "analyzedAt": "2026-11-30T00:00:00Z",
    });
    (id, event)
}

/// Two daemons in one ledger group. The first owns every partition and is cut off its
/// database (through a proxy) with 40 transfers to settle: it is degraded and its records
/// wait. The second joins (its database is up): on the rebalance the first gives its
/// partitions up at once (a record waiting for the database cannot finish, so it stays
/// uncommitted) and is silent for them from then on; the second settles what it got.
/// When the first gets its database back it settles what it kept. Every transfer settles
/// exactly once and neither daemon ever meets a transfer already settled (`duplicate`),
/// which is what an old owner still working on a revoked partition would cause.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partition_revoked_while_its_owner_waits_for_the_database_is_redone_by_the_new_owner_alone() {
    let env = TestEnv::new().await;
    let proxy = DbProxy::start(&env.db).await;
    let proxy_url = proxy.url.clone();
    let first = env
        .spawn(|c| {
            short_budget(c);
            c.pipelines.set("outbox", false);
            c.database.url = tally_engine::config::SecretUrl::new(&proxy_url);
        })
        .await;
    let sources: Vec<String> = (0..8).map(|i| format!("R-{i}")).collect();
    let mut rows: Vec<(&str, i64)> = sources.iter().map(|id| (id.as_str(), 100_000)).collect();
    rows.push(("R-SINK", 0));
    env.db.fund_accounts(&rows).await;
    wait_until("the first daemon owns the ledger's partitions", Deadline::DEFAULT, || async {
        let n = pipeline(&first, "ledger").await["partitions"].as_array().map_or(0, Vec::len);
        if n > 0 {
            Ok(())
        } else {
            Err("no partitions yet".to_owned())
        }
    })
    .await;

    proxy.cut();
    let upstream = env.upstream();
    let mut ids = Vec::new();
    for i in 0..40 {
        let from = &sources[i % sources.len()];
        let (id, event) = analyzed(from, "R-SINK", 10 + i as i64);
        upstream.analyzed(&event, None).await;
        ids.push(id);
    }
    wait_degraded(&first, true).await;

    let second = env
        .spawn(|c| {
            short_budget(c);
            c.pipelines.set("outbox", false);
        })
        .await;
    wait_until("the second daemon settles the partitions it got", Deadline::DEFAULT, || async {
        let n = env.db.ledger_finished().await;
        let owned = pipeline(&second, "ledger").await["partitions"].as_array().map_or(0, Vec::len);
        if n > 0 && owned > 0 {
            Ok(())
        } else {
            Err(format!("{n} processed, the second owns {owned} partitions"))
        }
    })
    .await;
    proxy.restore();
    wait_until("every transfer processed", Deadline::DEFAULT, || async {
        match env.db.ledger_finished().await {
            40 => Ok(()),
            n => Err(format!("{n} processed")),
        }
    })
    .await;
    // Whatever the first daemon still had in hand is done with (settled or given up).
    wait_degraded(&first, false).await;
    for id in &ids {
        let postings = env.db.scalar_i64("SELECT count(*) FROM postings WHERE transfer_id = $1", &[id]).await;
        assert_eq!(postings, 2, "transfer {id} settled once");
    }
    let total: i64 = (0..40).map(|i| 10 + i).sum();
    assert_eq!(env.db.scalar_i64("SELECT balance_cents FROM accounts WHERE id = 'R-SINK'", &[]).await, total);
    let duplicate = r#"tally_records_total{outcome="duplicate",pipeline="ledger"}"#;
    for (name, app) in [("first", &first), ("second", &second)] {
        let metrics = app.metrics().await;
        assert_eq!(metric_value(&metrics, duplicate).unwrap_or(0.0), 0.0, "{name} met an already settled transfer");
        // Initialised at 0 from the start: it must still be 0.
        assert_eq!(
            metric_value(&metrics, r#"tally_records_total{outcome="dead_lettered",pipeline="ledger"}"#).unwrap_or(0.0),
            0.0
        );
    }
    assert_eq!(non_empty_dlts(env.bootstrap(), &["transfers.analyzed"]).await, vec![]);
    assert_eq!(env.db.count("dead_letters").await, 0);
    assert_ledger_ok(&second).await;
}
