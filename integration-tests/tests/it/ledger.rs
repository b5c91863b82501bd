//! Black-box tests of the ledger pipeline: partition consumers, keyed workers,
//! group-committed settlement, offset watermarks, supervision (retry, DLT).
//!
//! Broker: the daemon tests run on the embedded broker (librdkafka's mock cluster, 3
//! brokers, in this test process) created by the harness; it outlives daemon restarts and
//! serves the `tally run` child process of the abrupt-stop test over loopback. The
//! settlement batcher and inbox tests need none. Database: a fresh PostgreSQL database per
//! test.
#![allow(clippy::expect_used)] // tests: a failed expectation is a failed test, with its message

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use actix::Actor;
use futures_util::future::{join_all, BoxFuture};
use reqwest::StatusCode;
use serde_json::{json, Value};
use tally_actors::ledger::{
    BatchSettler, LedgerTopics, Settle, SettleError, SettleOutcome, SettleRequest, SettlementBatcher, Settler,
};
use tally_actors::store::accounts::claim_inbox;
use tally_actors::supervise::ErrorClass;
use tally_engine::config::RetryConfig;
use tally_integration_tests::{
    self as harness, json_body, metric_value, read_topic, spawn_app, wait_until, Deadline, TestApp, TestDb, TestEnv,
    Upstream,
};
use tally_schema::events::TransferAnalyzed;
use uuid::Uuid;

const ANALYZED: &str = "transfers.analyzed";
const DLT: &str = "transfers.analyzed-dlt";
const GROUP: &str = "tally-ledger";

fn analyzed(transfer_id: Uuid, from: &str, to: &str, amount: i64, currency: &str) -> Value {
    json!({
        "eventId": Uuid::new_v4(), "transferId": transfer_id, "sourceAccount": from,
        "destinationAccount": to, "amountCents": amount, "currency": currency, "score": 10,
        "analyzedAt": "2026-11-30T00:00:00Z",
    })
}

/// Produces `payload` keyed by `key` to `transfers.analyzed`, signed as antifraud signs,
/// recording nothing.
async fn produce_raw(upstream: &Upstream<'_>, key: &str, payload: &[u8]) -> (i32, i64) {
    upstream.signed(ANALYZED, None, key, payload, "TransferAnalyzed").await
}

async fn wait_committed_past(bootstrap: &str, partition: i32, offset: i64) {
    harness::wait_committed_past(bootstrap, GROUP, ANALYZED, partition, offset).await;
}

/// Produces `event` as antifraud would: the intake's transfer and antifraud's decision
/// recorded, the record signed.
async fn produce(upstream: &Upstream<'_>, event: &Value) -> (i32, i64) {
    upstream.analyzed(event, None).await
}

/// Produces every event of `events` as [`produce`] does, recording them in one go first.
async fn produce_all(upstream: &Upstream<'_>, events: &[Value]) {
    upstream.db().record_analyzed(&events.iter().collect::<Vec<_>>()).await;
    let records: Vec<(String, String)> = events
        .iter()
        .map(|e| (e["sourceAccount"].as_str().expect("sourceAccount").to_owned(), e.to_string()))
        .collect();
    for chunk in records.chunks(500) {
        join_all(chunk.iter().map(|(key, payload)| produce_raw(upstream, key, payload.as_bytes()))).await;
    }
}

async fn accounts(db: &TestDb, rows: &[(&str, i64, &str)]) {
    for (id, balance, currency) in rows {
        db.fund_accounts_in("", currency, &[(id, *balance)]).await;
    }
}

async fn balance(db: &TestDb, id: &str) -> i64 {
    db.scalar_i64("SELECT balance_cents FROM accounts WHERE id = $1", &[&id]).await
}

async fn wait_processed(db: &TestDb, n: i64) {
    wait_until(&format!("{n} transfers processed"), Deadline::DEFAULT, || async {
        let done = db.ledger_finished().await;
        if done >= n {
            Ok(())
        } else {
            Err(format!("{done} processed"))
        }
    })
    .await;
}

async fn outcome(db: &TestDb, transfer: Uuid) -> (String, Option<String>) {
    let rows = db.query("SELECT outcome, reason FROM processed_transfers WHERE transfer_id = $1", &[&transfer]).await;
    let row = rows.first().expect("processed_transfers row");
    (row.get(0), row.get(1))
}

async fn ledger_check(app: &TestApp) -> Value {
    let res = app.admin_get("/admin/ledger/check").await;
    let status = res.status();
    let body = json_body(res).await;
    assert_eq!(status, StatusCode::OK, "ledger invariants: {body}");
    assert_eq!(body["ok"], true, "{body}");
    body
}

/// The same TransferAnalyzed delivered twice debits once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn same_transfer_delivered_twice_debits_once() {
    let (env, app) = spawn_app(|_| {}).await;
    accounts(&env.db, &[("CC-001", 100_000, "BRL"), ("CC-002", 0, "BRL")]).await;
    let producer = env.upstream();
    let event = analyzed(Uuid::new_v4(), "CC-001", "CC-002", 30_000, "BRL");
    produce(&producer, &event).await;
    let (partition, offset) = produce(&producer, &event).await;
    wait_committed_past(env.bootstrap(), partition, offset).await;
    assert_eq!(balance(&env.db, "CC-001").await, 70_000);
    assert_eq!(balance(&env.db, "CC-002").await, 30_000);
    assert_eq!(env.db.transfer_postings().await, 2, "exactly one debit and one credit");
    assert_eq!(
        env.db
            .scalar_i64("SELECT count(*) FROM postings WHERE kind = 'D' AND account_id NOT LIKE 'issuance:%'", &[])
            .await,
        1
    );

    // Again, after the first delivery was fully processed and committed.
    let (partition, offset) = produce(&producer, &event).await;
    wait_committed_past(env.bootstrap(), partition, offset).await;
    assert_eq!(balance(&env.db, "CC-001").await, 70_000);
    assert_eq!(balance(&env.db, "CC-002").await, 30_000);
    assert_eq!(env.db.transfer_postings().await, 2);
    let metrics = app.metrics().await;
    assert_eq!(metric_value(&metrics, r#"tally_records_total{outcome="settled",pipeline="ledger"}"#), Some(1.0));
    assert_eq!(metric_value(&metrics, r#"tally_records_total{outcome="duplicate",pipeline="ledger"}"#), Some(2.0));
    // One TransferSettled event, with the derived id, in the outbox.
    let transfer_id: Uuid = serde_json::from_value(event["transferId"].clone()).expect("uuid");
    let settled = env.db.query("SELECT payload FROM outbox_events WHERE topic = 'transfers.settled'", &[]).await;
    assert_eq!(settled.len(), 1);
    let payload: Value = serde_json::from_str(settled[0].get::<_, &str>(0)).expect("json");
    assert_eq!(payload["transferId"], json!(transfer_id));
    assert_eq!(payload["eventId"], json!(tally_schema::derived_event_id("settled", transfer_id)));
    ledger_check(&app).await;
}

/// A->B and B->A at once, many times, on several pairs: no deadlock error surfaces (no
/// retry, no DLT record), and money is conserved.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crossing_transfer_storms_neither_deadlock_nor_lose_money() {
    let (env, app) = spawn_app(|_| {}).await;
    let pairs = [("A1", "B1"), ("A2", "B2"), ("A3", "B3")];
    for (a, b) in pairs {
        accounts(&env.db, &[(a, 50_000, "BRL"), (b, 50_000, "BRL")]).await;
    }
    let producer = env.upstream();
    let mut sends = Vec::new();
    for i in 0..200_i64 {
        for (a, b) in pairs {
            let (from, to) = if i % 2 == 0 { (a, b) } else { (b, a) };
            sends.push(analyzed(Uuid::new_v4(), from, to, 100 + i, "BRL"));
        }
    }
    let total = sends.len() as i64;
    produce_all(&producer, &sends).await;
    wait_processed(&env.db, total).await;
    let sum = env.db.customer_money().await;
    assert_eq!(sum, 300_000, "money conserved");
    let metrics = app.metrics().await;
    assert_eq!(metric_value(&metrics, r#"tally_retries_total{pipeline="ledger"}"#).unwrap_or(0.0), 0.0, "no retries");
    let settled = metric_value(&metrics, r#"tally_records_total{outcome="settled",pipeline="ledger"}"#).unwrap_or(0.0);
    assert_eq!(settled as i64, total, "every crossing transfer settled");
    ledger_check(&app).await;
}

/// Business rejections are committed results with a TransferRejected event, not errors.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rejections_commit_a_result_an_event_and_the_offset() {
    let (env, app) = spawn_app(|_| {}).await;
    accounts(&env.db, &[("R-A", 1_000, "BRL"), ("R-B", 0, "BRL"), ("R-USD", 0, "USD")]).await;
    let producer = env.upstream();
    let cases = [
        (analyzed(Uuid::new_v4(), "R-A", "R-B", 1_001, "BRL"), "INSUFFICIENT_FUNDS"),
        (analyzed(Uuid::new_v4(), "R-A", "R-NOPE", 10, "BRL"), "ACCOUNT_NOT_FOUND"),
        (analyzed(Uuid::new_v4(), "R-A", "R-USD", 10, "BRL"), "CURRENCY_MISMATCH"),
    ];
    let mut last = (0, 0);
    for (event, _) in &cases {
        last = produce(&producer, event).await;
    }
    wait_committed_past(env.bootstrap(), last.0, last.1).await;
    for (event, reason) in &cases {
        let id: Uuid = serde_json::from_value(event["transferId"].clone()).expect("uuid");
        assert_eq!(outcome(&env.db, id).await, ("REJECTED".to_owned(), Some((*reason).to_owned())));
        let rows = env
            .db
            .query("SELECT payload FROM outbox_events WHERE topic = 'transfers.rejected' AND payload::jsonb->>'transferId' = $1", &[&id.to_string()])
            .await;
        assert_eq!(rows.len(), 1, "{reason}: one TransferRejected");
        let payload: Value = serde_json::from_str(rows[0].get::<_, &str>(0)).expect("json");
        assert_eq!(payload["reason"], *reason);
    }
    assert_eq!(env.db.transfer_postings().await, 0, "rejections post nothing");
    assert_eq!(balance(&env.db, "R-A").await, 1_000);
    // The rejections reach transfers.rejected through the outbox.
    let records = read_topic(env.bootstrap(), "transfers.rejected", Deadline::secs(30)).await.expect("read");
    assert!(records.len() >= 3, "{} rejected records", records.len());
    ledger_check(&app).await;
}

/// Poison: undecodable or invalid records go to the DLT at once with the DLT headers; the
/// records after them are processed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn poison_records_are_dead_lettered_and_later_records_processed() {
    let (env, app) = spawn_app(|_| {}).await;
    accounts(&env.db, &[("P-A", 10_000, "BRL"), ("P-B", 0, "BRL")]).await;
    let producer = env.upstream();
    let (p1, o1) = produce_raw(&producer, "P-A", b"{this is not json").await;
    let mut missing = analyzed(Uuid::new_v4(), "P-A", "P-B", 10, "BRL");
    missing.as_object_mut().expect("object").remove("amountCents");
    produce_raw(&producer, "P-A", missing.to_string().as_bytes()).await;
    let good = analyzed(Uuid::new_v4(), "P-A", "P-B", 2_500, "BRL");
    let (p3, o3) = produce(&producer, &good).await;
    assert_eq!(p1, p3, "same key, same partition");
    wait_committed_past(env.bootstrap(), p3, o3).await;
    assert_eq!(balance(&env.db, "P-B").await, 2_500, "the record after the poison ones settled");

    let dlt = read_topic(env.bootstrap(), DLT, Deadline::secs(30)).await.expect("read DLT");
    assert_eq!(dlt.len(), 2, "both poison records dead-lettered");
    let first = dlt.iter().find(|r| r.header("dlt-original-offset") == Some(&o1.to_string())).expect("first poison");
    assert_eq!(first.partition, p1, "same partition as the original");
    assert_eq!(first.key.as_deref(), Some("P-A"));
    assert_eq!(first.payload.as_deref(), Some(b"{this is not json".as_slice()));
    assert_eq!(first.header("dlt-original-topic"), Some(ANALYZED));
    assert_eq!(first.header("dlt-original-partition"), Some(p1.to_string().as_str()));
    assert_eq!(first.header("dlt-consumer-group"), Some(GROUP));
    assert_eq!(first.header("dlt-exception-kind"), Some("poison"));
    assert_eq!(first.header("dlt-attempts"), Some("1"));
    assert!(first.header("dlt-original-timestamp").is_some_and(|t| t.parse::<i64>().is_ok()));
    assert!(first.header("dlt-exception-message").is_some_and(|m| m.contains("undecodable")));
    assert_eq!(first.header("event-type"), Some("TransferAnalyzed"), "original headers kept");
    let metrics = app.metrics().await;
    assert_eq!(metric_value(&metrics, r#"tally_dlt_records_total{topic="transfers.analyzed-dlt"}"#), Some(2.0));
    ledger_check(&app).await;
}

fn quick_retry(c: &mut tally_engine::Config, max_retries: u32) {
    c.ledger.retry = RetryConfig {
        max_retries,
        initial: std::time::Duration::from_millis(100),
        multiplier: 2.0,
        max: std::time::Duration::from_millis(400),
    };
    // Lock waits fail fast: the statement and lock timeouts.
    c.database.statement_timeout = std::time::Duration::from_millis(500);
}

/// A transient database failure (a lock held elsewhere makes the settlement time out):
/// the key retries and succeeds in order; other keys progress while it waits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transient_failures_retry_the_key_in_order_while_other_keys_flow() {
    let (env, app) = spawn_app(|c| quick_retry(c, 30)).await;
    accounts(
        &env.db,
        &[("T-A", 100, "BRL"), ("T-B", 0, "BRL"), ("T-C", 0, "BRL"), ("O-X", 500, "BRL"), ("O-Y", 0, "BRL")],
    )
    .await;
    // Hold T-A's row lock in an open transaction.
    let mut blocker = env.db.connect().await;
    let tx = blocker.transaction().await.expect("begin");
    tx.execute("SELECT 1 FROM accounts WHERE id = 'T-A' FOR UPDATE", &[]).await.expect("lock T-A");

    let producer = env.upstream();
    // In order, T1 takes all of T-A's money, so T2 must be rejected; reordered, T2 would settle.
    let t1 = analyzed(Uuid::new_v4(), "T-A", "T-B", 100, "BRL");
    let t2 = analyzed(Uuid::new_v4(), "T-A", "T-C", 60, "BRL");
    produce(&producer, &t1).await;
    produce(&producer, &t2).await;
    let other = analyzed(Uuid::new_v4(), "O-X", "O-Y", 200, "BRL");
    produce(&producer, &other).await;
    wait_until("the other key settles while T-A is blocked", Deadline::DEFAULT, || async {
        let y = balance(&env.db, "O-Y").await;
        if y == 200 {
            Ok(())
        } else {
            Err(format!("O-Y = {y}"))
        }
    })
    .await;
    wait_until("T-A is retrying", Deadline::DEFAULT, || async {
        let m = app.metrics().await;
        let retries = metric_value(&m, r#"tally_retries_total{pipeline="ledger"}"#).unwrap_or(0.0);
        if retries >= 1.0 {
            Ok(())
        } else {
            Err(format!("{retries} retries"))
        }
    })
    .await;
    assert_eq!(env.db.ledger_finished().await, 1);
    tx.rollback().await.expect("release T-A");
    wait_processed(&env.db, 3).await;
    let id1: Uuid = serde_json::from_value(t1["transferId"].clone()).expect("uuid");
    let id2: Uuid = serde_json::from_value(t2["transferId"].clone()).expect("uuid");
    assert_eq!(outcome(&env.db, id1).await.0, "SETTLED", "T1 first");
    assert_eq!(outcome(&env.db, id2).await, ("REJECTED".into(), Some("INSUFFICIENT_FUNDS".into())), "then T2");
    assert_eq!(balance(&env.db, "T-B").await, 100);
    assert_eq!(balance(&env.db, "T-C").await, 0);
    assert!(read_topic(env.bootstrap(), DLT, Deadline::secs(5)).await.expect("read DLT").is_empty());
    ledger_check(&app).await;
}

/// Retries run out while the failure lasts: the record goes to the DLT as `exhausted` with
/// its attempt count, and its offset completes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exhausted_retries_dead_letter_with_the_attempt_count() {
    let (env, app) = spawn_app(|c| quick_retry(c, 2)).await;
    accounts(&env.db, &[("E-A", 100, "BRL"), ("E-B", 0, "BRL")]).await;
    let mut blocker = env.db.connect().await;
    let tx = blocker.transaction().await.expect("begin");
    tx.execute("SELECT 1 FROM accounts WHERE id = 'E-A' FOR UPDATE", &[]).await.expect("lock E-A");
    let producer = env.upstream();
    let (partition, offset) = produce(&producer, &analyzed(Uuid::new_v4(), "E-A", "E-B", 10, "BRL")).await;
    wait_committed_past(env.bootstrap(), partition, offset).await;
    tx.rollback().await.expect("release");
    let dlt = read_topic(env.bootstrap(), DLT, Deadline::secs(30)).await.expect("read DLT");
    assert_eq!(dlt.len(), 1);
    assert_eq!(dlt[0].header("dlt-exception-kind"), Some("exhausted"));
    assert_eq!(dlt[0].header("dlt-attempts"), Some("3"), "1 attempt + 2 retries");
    assert_eq!(dlt[0].header("dlt-original-offset"), Some(offset.to_string().as_str()));
    assert_eq!(balance(&env.db, "E-A").await, 100, "nothing applied");
    let metrics = app.metrics().await;
    assert_eq!(metric_value(&metrics, r#"tally_records_total{outcome="dead_lettered",pipeline="ledger"}"#), Some(1.0));
    ledger_check(&app).await;
}

/// Produces `n` transfers over `accounts` accounts (funded so that most settle) and
/// returns the transfer ids.
async fn produce_stream(env: &TestEnv, n: usize, accounts_n: usize) -> Vec<Uuid> {
    for i in 0..accounts_n {
        let id = format!("S-{i:03}");
        accounts(&env.db, &[(&id, 1_000_000, "BRL")]).await;
    }
    let producer = env.upstream();
    let mut ids = Vec::with_capacity(n);
    let mut sends = Vec::with_capacity(n);
    for i in 0..n {
        let id = Uuid::new_v4();
        ids.push(id);
        let from = format!("S-{:03}", i % accounts_n);
        let to = format!("S-{:03}", (i * 7 + 3) % accounts_n);
        let to = if to == from { format!("S-{:03}", (i + 1) % accounts_n) } else { to };
        sends.push(analyzed(id, &from, &to, 1 + (i as i64 % 1_000), "BRL"));
    }
    produce_all(&producer, &sends).await;
    ids
}

async fn assert_every_transfer_ended_once(env: &TestEnv, ids: &[Uuid]) {
    // Issuances (the accounts' opening balances) are finished as they are issued.
    let rows = env
        .db
        .query(
            "SELECT p.transfer_id, p.outcome FROM processed_transfers p \
             WHERE NOT EXISTS (SELECT 1 FROM transfers t WHERE t.id = p.transfer_id AND t.kind = 'issuance')",
            &[],
        )
        .await;
    let outcomes: HashMap<Uuid, String> = rows.iter().map(|r| (r.get(0), r.get(1))).collect();
    for id in ids {
        let o = outcomes.get(id).map(String::as_str);
        assert!(matches!(o, Some("SETTLED" | "REJECTED")), "transfer {id} ended {o:?}");
    }
    let settled = outcomes.values().filter(|o| *o == "SETTLED").count() as i64;
    assert_eq!(env.db.transfer_postings().await, 2 * settled, "one D and one C per settled transfer, no more");
}

/// Two daemons in one group; a rebalance mid-stream (the second joins, then the first
/// leaves): every transfer ends settled or rejected, once; invariants hold.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rebalance_mid_stream_keeps_every_transfer_exactly_once_in_effect() {
    let env = TestEnv::new().await;
    let first = env.spawn(|c| c.pipelines.set("outbox", false)).await;
    let ids = produce_stream(&env, 3_000, 40).await;
    wait_until("some transfers processed", Deadline::DEFAULT, || async {
        let n = env.db.ledger_finished().await;
        if n > 0 {
            Ok(())
        } else {
            Err("none yet".to_owned())
        }
    })
    .await;
    let second = env.spawn(|c| c.pipelines.set("outbox", false)).await;
    // Let the group settle on two members, then the first leaves mid-stream.
    tokio::time::sleep(Duration::from_secs(4)).await;
    first.stop().await;
    wait_processed(&env.db, ids.len() as i64).await;
    assert_every_transfer_ended_once(&env, &ids).await;
    ledger_check(&second).await;
}

/// The daemon is killed (SIGKILL) mid-stream while the broker lives on, then restarted:
/// every record ends settled or rejected, no double effects, invariants hold.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn abrupt_stop_mid_stream_then_restart_loses_and_doubles_nothing() {
    let env = TestEnv::new().await;
    tally_actors::store::migrate::prepare_blocking(env.db.url()).expect("migrate");
    let ids = produce_stream(&env, 4_000, 50).await;
    let mut child = tally_integration_tests::spawn_tally_process(&env, &[("TALLY__PIPELINES__OUTBOX", "false")]);
    wait_until("the child settles some transfers", Deadline::DEFAULT, || async {
        let n = env.db.ledger_finished().await;
        if n > 200 {
            Ok(())
        } else {
            Err(format!("{n} processed"))
        }
    })
    .await;
    child.kill().expect("SIGKILL the daemon");
    let _ = child.wait();
    let processed_at_kill = env.db.ledger_finished().await;
    assert!(processed_at_kill < ids.len() as i64, "killed mid-stream ({processed_at_kill} processed)");
    let app = env.spawn(|c| c.pipelines.set("outbox", false)).await;
    wait_processed(&env.db, ids.len() as i64).await;
    assert_every_transfer_ended_once(&env, &ids).await;
    ledger_check(&app).await;
}

/// The daemon's settler, recording the size of every batch it is asked to settle.
struct RecordingSettler {
    inner: BatchSettler,
    sizes: Arc<Mutex<Vec<usize>>>,
}

impl Settler for RecordingSettler {
    fn max_batch(&self) -> usize {
        self.inner.max_batch()
    }

    fn settle<'a>(
        &'a self,
        conn: &'a mut diesel_async::AsyncPgConnection,
        topics: &'a LedgerTopics,
        batch: &'a [SettleRequest],
    ) -> BoxFuture<'a, Result<Vec<SettleOutcome>, diesel::result::Error>> {
        self.sizes.lock().expect("sizes").push(batch.len());
        self.inner.settle(conn, topics, batch)
    }
}

fn settle_request(from: &str, to: &str, amount: i64) -> SettleRequest {
    let transfer = TransferAnalyzed {
        event_id: Uuid::new_v4(),
        transfer_id: Uuid::new_v4(),
        source_account: from.into(),
        destination_account: to.into(),
        amount_cents: amount,
        currency: "BRL".into(),
        score: 10,
        analyzed_at: chrono::Utc::now(),
        client: None,
    };
    SettleRequest { transfer, traceparent: None }
}

/// Records what the intake and antifraud hold of `requests`, so that the ledger acts on them.
async fn record(db: &TestDb, requests: &[SettleRequest]) {
    let events: Vec<Value> = requests.iter().map(|r| serde_json::to_value(&r.transfer).expect("json")).collect();
    db.record_analyzed(&events.iter().collect::<Vec<_>>()).await;
}

/// A batch that fails for a reason no one transfer of it caused (here a lock wait past the
/// lock timeout on an account row another connection holds) fails whole, once: each
/// transfer gets the transient error back (its record's policy retries it) and the batch
/// is not settled again in halves, which would only multiply the waits against a database
/// that is slow or down. Once the lock is gone, every transfer settles.
#[actix::test]
async fn a_batch_that_times_out_fails_whole_and_is_not_split() {
    let db = TestDb::new().await;
    let mut rows = vec![("H-A".to_owned(), 1_000, "BRL"), ("H-B".to_owned(), 0, "BRL")];
    rows.extend((0..7).map(|i| (format!("F-{i}"), 1_000, "BRL")));
    for (id, balance, currency) in &rows {
        accounts(&db, &[(id.as_str(), *balance, *currency)]).await;
    }
    let mut blocker = db.connect().await;
    let tx = blocker.transaction().await.expect("begin");
    tx.execute("SELECT 1 FROM accounts WHERE id = 'H-A' FOR UPDATE", &[]).await.expect("lock H-A");

    let pool = db.pool(4, Duration::from_millis(300), "tally-test-batcher");
    let sizes = Arc::new(Mutex::new(Vec::new()));
    let settler = RecordingSettler { inner: BatchSettler { max_batch: 64 }, sizes: Arc::clone(&sizes) };
    let topics = LedgerTopics { settled: "s".into(), rejected: "r".into(), max_balance_cents: 1_000_000 };
    let metrics = tally_actors::Metrics::new().expect("metrics");
    // One batch at a time: the first request runs alone (and waits on H-A's lock until the
    // lock timeout) while the next eight gather into one batch, one of them from H-A too.
    let batcher = SettlementBatcher::new(pool, topics, metrics, Arc::new(settler), 1, Duration::from_millis(1)).start();
    let mut requests = vec![settle_request("H-A", "H-B", 10), settle_request("H-A", "H-B", 20)];
    requests.extend((0..7).map(|i| settle_request(&format!("F-{i}"), "H-B", 30)));
    record(&db, &requests).await;

    let send_all = |requests: &[SettleRequest]| join_all(requests.iter().map(|r| batcher.send(Settle(r.clone()))));
    let results: Vec<Result<SettleOutcome, SettleError>> =
        send_all(&requests).await.into_iter().map(|r| r.expect("batcher alive")).collect();
    assert_eq!(*sizes.lock().expect("sizes"), [1, 8], "the first alone, then the eight that gathered, unsplit");
    for (i, result) in results.iter().enumerate() {
        let class = result.as_ref().map_err(|e| e.class);
        assert_eq!(class, Err(ErrorClass::Transient), "request {i}: the lock timeout, back to its caller");
    }
    assert_eq!(db.ledger_finished().await, 0, "nothing written");
    assert_eq!(db.transfer_postings().await, 0);

    // The lock goes; the callers' retries settle every transfer.
    tx.rollback().await.expect("release H-A");
    let results = send_all(&requests).await;
    for (i, result) in results.into_iter().enumerate() {
        assert_eq!(result.expect("batcher alive"), Ok(SettleOutcome::Settled), "request {i}");
    }
    assert_eq!(balance(&db, "H-B").await, 10 + 20 + 7 * 30);
}

/// Two settlement transactions claim the same redelivered transfers in the inbox, listed in
/// opposite orders: neither waits for the other while holding what the other waits for, so
/// both commit (no deadlock), and each transfer is claimed by exactly one of them. A third
/// transaction holds the middle id until both claims have started, so that they run
/// together.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inbox_claims_of_the_same_ids_in_opposite_orders_do_not_deadlock() {
    use diesel_async::scoped_futures::ScopedFutureExt;
    use diesel_async::{AsyncConnection, AsyncPgConnection};

    let db = TestDb::new().await;
    let mut ids = [Uuid::new_v4(), Uuid::new_v4(), Uuid::new_v4()];
    ids.sort_unstable();
    let mut holder = db.connect().await;
    let held = holder.transaction().await.expect("begin");
    held.execute("INSERT INTO processed_transfers (transfer_id, outcome) VALUES ($1, 'PROCESSING')", &[&ids[1]])
        .await
        .expect("hold the middle id");

    let claim = |order: Vec<Uuid>| {
        let url = db.url().to_owned();
        tokio::spawn(async move {
            let mut conn = AsyncPgConnection::establish(&url).await.expect("diesel connection");
            conn.transaction(|c| async move { claim_inbox(c, &order).await }.scope_boxed())
                .await
                .map_err(|e| e.to_string())
        })
    };
    let ascending = claim(ids.to_vec());
    let descending = claim(ids.iter().rev().copied().collect());
    db.wait_lock_waiters(2, "both claims wait").await;
    held.rollback().await.expect("release the middle id");

    let ascending = ascending.await.expect("task").expect("the ascending claim commits");
    let descending = descending.await.expect("task").expect("the descending claim commits");
    assert!(ascending.is_disjoint(&descending), "{ascending:?} and {descending:?}");
    let mut claimed: Vec<Uuid> = ascending.union(&descending).copied().collect();
    claimed.sort_unstable();
    assert_eq!(claimed, ids, "every id claimed once");
}

/// The daemon's settler, checking that no two batches it settles at once share an account,
/// and counting how many run at once. Each batch waits a little before its transaction, so
/// that batches overlap in time whenever the batcher lets them.
#[derive(Default)]
struct Running {
    accounts: std::collections::HashSet<String>,
    batches: usize,
    most_at_once: usize,
    shared: Vec<String>,
}

struct ExclusiveSettler {
    inner: BatchSettler,
    running: Arc<Mutex<Running>>,
}

impl Settler for ExclusiveSettler {
    fn max_batch(&self) -> usize {
        self.inner.max_batch()
    }

    fn settle<'a>(
        &'a self,
        conn: &'a mut diesel_async::AsyncPgConnection,
        topics: &'a LedgerTopics,
        batch: &'a [SettleRequest],
    ) -> BoxFuture<'a, Result<Vec<SettleOutcome>, diesel::result::Error>> {
        use futures_util::FutureExt;
        let mine: std::collections::HashSet<String> = batch
            .iter()
            .flat_map(|r| [r.transfer.source_account.clone(), r.transfer.destination_account.clone()])
            .collect();
        {
            let mut running = self.running.lock().expect("running");
            let shared: Vec<String> = running.accounts.intersection(&mine).cloned().collect();
            running.shared.extend(shared);
            running.accounts.extend(mine.iter().cloned());
            running.batches += 1;
            running.most_at_once = running.most_at_once.max(running.batches);
        }
        async move {
            tokio::time::sleep(Duration::from_millis(40)).await;
            let result = self.inner.settle(conn, topics, batch).await;
            let mut running = self.running.lock().expect("running");
            running.accounts.retain(|a| !mine.contains(a));
            running.batches -= 1;
            result
        }
        .boxed()
    }
}

/// Batches that run at once never share an account: a transfer whose account a running
/// batch holds waits for the next batch instead of joining one that would wait in
/// PostgreSQL for that batch's row locks (holding a connection and every lock it took
/// before). Batches on other accounts still run alongside, and every transfer settles.
#[actix::test]
async fn batches_that_run_at_once_share_no_account() {
    let db = TestDb::new().await;
    let ids: Vec<String> = (0..6).map(|i| format!("X-{i}")).collect();
    for id in &ids {
        accounts(&db, &[(id.as_str(), 1_000_000, "BRL")]).await;
    }
    let pool = db.pool(4, Duration::from_secs(10), "tally-test-batcher");
    let running = Arc::new(Mutex::new(Running::default()));
    let settler = ExclusiveSettler { inner: BatchSettler { max_batch: 16 }, running: Arc::clone(&running) };
    let topics = LedgerTopics { settled: "s".into(), rejected: "r".into(), max_balance_cents: i64::MAX / 4 };
    let metrics = tally_actors::Metrics::new().expect("metrics");
    let batcher = SettlementBatcher::new(pool, topics, metrics, Arc::new(settler), 4, Duration::from_millis(1)).start();
    // Two groups of three accounts; transfers stay inside their group, where they meet.
    let requests: Vec<SettleRequest> = (0..120)
        .map(|n| {
            let (group, k) = (n % 2 * 3, n / 2);
            settle_request(&ids[group + k % 3], &ids[group + (k + 1) % 3], 1 + (n % 7) as i64)
        })
        .collect();
    record(&db, &requests).await;
    let all = join_all(requests.iter().map(|r| batcher.send(Settle(r.clone()))));
    let results = tokio::time::timeout(Duration::from_secs(60), all).await.expect("every request answered");
    for (i, result) in results.into_iter().enumerate() {
        assert_eq!(result.expect("batcher alive"), Ok(SettleOutcome::Settled), "request {i}");
    }
    let (shared, most_at_once) = {
        let running = running.lock().expect("running");
        (running.shared.clone(), running.most_at_once)
    };
    assert!(shared.is_empty(), "batches ran at once on accounts {shared:?}");
    assert!(most_at_once >= 2, "batches on other accounts run alongside ({most_at_once} at most)");
    let mut expected: HashMap<&str, i64> = ids.iter().map(|id| (id.as_str(), 1_000_000)).collect();
    for r in &requests {
        *expected.get_mut(r.transfer.source_account.as_str()).expect("source") -= r.transfer.amount_cents;
        *expected.get_mut(r.transfer.destination_account.as_str()).expect("destination") += r.transfer.amount_cents;
    }
    for id in &ids {
        assert_eq!(balance(&db, id).await, expected[id.as_str()], "{id}");
    }
}
