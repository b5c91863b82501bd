//! Black-box tests of issue 5: idempotent `OrderReceived` consumption keyed by
//! the order's identity, and order intake deduplicated by `externalReference`.
//!
//! Broker: every test that touches Kafka runs on the embedded broker, librdkafka's mock
//! cluster (3 brokers, in this test process), one per test, created by the
//! harness so that it outlives daemon restarts. The concurrency test needs no broker: it
//! calls `materialize()` directly. Database: a fresh PostgreSQL database per test.
#![allow(clippy::expect_used)] // tests: a failed expectation is a failed test, with its message

use diesel_async::{AsyncConnection, AsyncPgConnection};
use reqwest::StatusCode;
use serde_json::{json, Value};
use tally_actors::orders::{materialize, Materialized};
use tally_engine::config::RetryConfig;
use tally_engine::Config;
use tally_integration_tests::{
    self as harness, assert_error, json_body, metric_value, read_topic, spawn_app, wait_for_records, wait_until,
    Deadline, TestDb, TestEnv, Upstream,
};
use tally_schema::events::OrderReceived;
use uuid::Uuid;

const RECEIVED: &str = "orders.received";
const DLT: &str = "orders.received-dlt";
const GROUP: &str = "tally-orders";
const TRACEPARENT: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

// ---------------------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------------------

fn order_received(order_id: Uuid, reference: &str) -> Value {
    json!({
        "eventId": Uuid::new_v4(), "orderId": order_id, "externalReference": reference,
        "customerId": "CUST-1", "amountCents": 4_990, "currency": "BRL",
        "receivedAt": "2026-11-30T12:00:00Z",
    })
}

fn order_id(event: &Value) -> Uuid {
    serde_json::from_value(event["orderId"].clone()).expect("orderId is a UUID")
}

/// Produces `payload` keyed by `key` to `orders.received`, on `partition` when given,
/// signed as the outbox publisher signs, recording nothing.
async fn produce_raw(upstream: &Upstream<'_>, key: &str, payload: &[u8], partition: Option<i32>) -> (i32, i64) {
    upstream.signed(RECEIVED, partition, key, payload, "OrderReceived").await
}

/// The orders group's committed offset of `partition` (-1 when nothing is committed).
async fn committed_async(bootstrap: &str, partition: i32) -> i64 {
    let bootstrap = bootstrap.to_owned();
    tokio::task::spawn_blocking(move || harness::committed_offset(&bootstrap, GROUP, RECEIVED, partition))
        .await
        .expect("offset task")
}

async fn wait_committed_past(bootstrap: &str, partition: i32, offset: i64) {
    harness::wait_committed_past(bootstrap, GROUP, RECEIVED, partition, offset).await;
}

/// Produces an `OrderReceived` keyed by its order id (the record contract).
/// Produces `event` as the intake's outbox would: its order recorded, the record signed.
async fn produce(upstream: &Upstream<'_>, event: &Value, partition: Option<i32>) -> (i32, i64) {
    upstream.db().record_order(event).await;
    let key = order_id(event).to_string();
    produce_raw(upstream, &key, event.to_string().as_bytes(), partition).await
}

async fn received_rows(db: &TestDb, order: Uuid) -> i64 {
    db.scalar_i64("SELECT count(*) FROM received_orders WHERE order_id = $1", &[&order]).await
}

async fn wait_received(db: &TestDb, order: Uuid) {
    wait_until(&format!("order {order} materialized"), Deadline::DEFAULT, || async {
        match received_rows(db, order).await {
            0 => Err("no received_orders row yet".to_owned()),
            n => Ok(n),
        }
    })
    .await;
}

fn counter(metrics: &str, series: &str) -> f64 {
    metric_value(metrics, series).unwrap_or(0.0)
}

fn outcome_series(outcome: &str) -> String {
    format!(r#"tally_records_total{{outcome="{outcome}",pipeline="orders"}}"#)
}

const RETRIES: &str = r#"tally_retries_total{pipeline="orders"}"#;

/// Fast blocking retry for the orders pipeline; lock waits fail after 500 ms (the pool sets
/// `lock_timeout` to `database.statement_timeout_ms`).
fn quick_retry(c: &mut Config, max_retries: u32) {
    c.orders.retry = RetryConfig {
        max_retries,
        initial: std::time::Duration::from_millis(100),
        multiplier: 2.0,
        max: std::time::Duration::from_millis(400),
    };
    c.database.statement_timeout = std::time::Duration::from_millis(500);
}

fn order(reference: &str, amount: i64) -> Value {
    json!({ "externalReference": reference, "customerId": "CUST-9", "amountCents": amount, "currency": "BRL" })
}

async fn assert_counts(db: &TestDb, orders: i64, outbox: i64, case: &str) {
    assert_eq!(db.count("orders").await, orders, "{case}: orders rows");
    assert_eq!(db.count("outbox_events").await, outbox, "{case}: outbox rows");
}

// ---------------------------------------------------------------------------------------
// Consumption
// ---------------------------------------------------------------------------------------

/// The same `OrderReceived` delivered twice, and again after the first delivery
/// was fully processed and its offset committed, leaves one `received_orders` row.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn same_order_delivered_twice_and_after_commit_is_materialized_once() {
    let (env, app) = spawn_app(|c| c.pipelines.set("outbox", false)).await;
    let producer = env.upstream();
    let event = order_received(Uuid::new_v4(), "EXT-DUP-1");
    let id = order_id(&event);
    let (p1, _) = produce(&producer, &event, None).await;
    let (p2, o2) = produce(&producer, &event, None).await;
    assert_eq!(p1, p2, "one key, one partition");
    wait_committed_past(env.bootstrap(), p2, o2).await;
    assert_eq!(received_rows(&env.db, id).await, 1);
    assert_eq!(env.db.count("received_orders").await, 1);

    // Again, after the first deliveries were processed and committed.
    let (p3, o3) = produce(&producer, &event, None).await;
    wait_committed_past(env.bootstrap(), p3, o3).await;
    assert_eq!(env.db.count("received_orders").await, 1, "the late redelivery wrote nothing");

    let rows = env
        .db
        .query(
            "SELECT event_id, external_reference::text, customer_id::text, amount_cents, currency::text, \
             received_at = '2026-11-30T12:00:00Z'::timestamptz FROM received_orders WHERE order_id = $1",
            &[&id],
        )
        .await;
    let row = &rows[0];
    let event_id: Uuid = serde_json::from_value(event["eventId"].clone()).expect("uuid");
    assert_eq!(row.get::<_, Uuid>(0), event_id);
    assert_eq!(row.get::<_, String>(1), "EXT-DUP-1");
    assert_eq!(row.get::<_, String>(2), "CUST-1");
    assert_eq!(row.get::<_, i64>(3), 4_990);
    assert_eq!(row.get::<_, String>(4), "BRL");
    assert!(row.get::<_, bool>(5), "received_at is the event's receivedAt");

    let metrics = app.metrics().await;
    assert_eq!(metric_value(&metrics, &outcome_series("materialized")), Some(1.0), "{metrics}");
    assert_eq!(metric_value(&metrics, &outcome_series("duplicate")), Some(2.0), "{metrics}");
    assert!(read_topic(env.bootstrap(), DLT, Deadline::secs(10)).await.expect("read DLT").is_empty());
}

/// Four consumers materialize one order id at the same moment, each
/// on its own connection. A table lock held by a third session parks all of them inside
/// their transactions, at the INSERT; releasing it lets them race. The primary key and
/// `ON CONFLICT` decide: one row, one `New`, the others `Duplicate`, no error surfaced.
/// (An exists -> insert check would let several pass and one would fail on the key.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_materializations_of_one_order_write_one_row_without_error() {
    const RACERS: usize = 4;
    let db = TestDb::new().await;
    let event = OrderReceived {
        event_id: Uuid::new_v4(),
        order_id: Uuid::new_v4(),
        external_reference: "EXT-RACE".into(),
        customer_id: "CUST-R".into(),
        amount_cents: 100,
        currency: "BRL".into(),
        received_at: chrono::Utc::now(),
    };
    // The order the intake took: only such an order is materialised.
    db.execute(
        "INSERT INTO orders (id, external_reference, customer_id, amount_cents, currency) VALUES ($1, $2, $3, $4, $5)",
        &[&event.order_id, &event.external_reference, &event.customer_id, &event.amount_cents, &event.currency],
    )
    .await;
    let mut gate = db.connect().await;
    let gate_tx = gate.transaction().await.expect("begin");
    gate_tx.batch_execute("LOCK TABLE received_orders IN SHARE MODE").await.expect("lock received_orders");

    let mut racers = Vec::new();
    for _ in 0..RACERS {
        let mut conn = AsyncPgConnection::establish(db.url()).await.expect("diesel connection");
        let event = event.clone();
        racers.push(tokio::spawn(async move { materialize(&mut conn, &event).await }));
    }
    wait_until("every racer waits at the INSERT", Deadline::DEFAULT, || async {
        let waiting = db
            .scalar_i64(
                "SELECT count(*) FROM pg_locks WHERE relation = 'received_orders'::regclass AND NOT granted",
                &[],
            )
            .await;
        if waiting == RACERS as i64 {
            Ok(())
        } else {
            Err(format!("{waiting} waiting"))
        }
    })
    .await;
    gate_tx.rollback().await.expect("open the gate");

    let mut outcomes = Vec::new();
    for racer in racers {
        outcomes.push(racer.await.expect("racer task").expect("materialize surfaced no error"));
    }
    assert_eq!(outcomes.iter().filter(|o| **o == Materialized::New).count(), 1, "{outcomes:?}");
    assert_eq!(outcomes.iter().filter(|o| **o == Materialized::Duplicate).count(), RACERS - 1, "{outcomes:?}");
    assert_eq!(received_rows(&db, event.order_id).await, 1);
    assert_eq!(db.count("received_orders").await, 1);
}

/// When `materialize()` fails the record is not acknowledged. The order's row is
/// held by an uncommitted insert elsewhere, so its materialization times out (transient)
/// and retries. A later record of the same partition completes meanwhile, yet the
/// committed offset stays at the failing record, also through a shutdown. After the hold
/// is released a new daemon gets both records again and the end state is one row each.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_materialization_is_not_acknowledged_and_is_redelivered_to_one_row() {
    let env = TestEnv::new().await;
    let configure = |c: &mut Config| {
        quick_retry(c, 100);
        c.pipelines.set("outbox", false);
        c.consumer.drain_timeout = std::time::Duration::from_millis(1_000);
    };
    let first = env.spawn(configure).await;
    let producer = env.upstream();
    const P: i32 = 0;
    let e1 = order_received(Uuid::new_v4(), "EXT-F1");
    let (_, o1) = produce(&producer, &e1, Some(P)).await;
    wait_committed_past(env.bootstrap(), P, o1).await;

    // Hold e2's row: insert it in a transaction that stays open (and is rolled back later).
    let e2 = order_received(Uuid::new_v4(), "EXT-F2");
    let mut holder = env.db.connect().await;
    let hold = holder.transaction().await.expect("begin");
    hold.execute(
        "INSERT INTO received_orders (order_id, event_id, external_reference, customer_id, amount_cents, currency) \
         VALUES ($1, $2, 'held', 'held', 1, 'XXX')",
        &[&order_id(&e2), &Uuid::new_v4()],
    )
    .await
    .expect("hold e2's row");

    let (_, o2) = produce(&producer, &e2, Some(P)).await;
    let e3 = order_received(Uuid::new_v4(), "EXT-F3");
    let (_, o3) = produce(&producer, &e3, Some(P)).await;
    wait_received(&env.db, order_id(&e3)).await;
    // Stop waiting as soon as the commit passes e2, so that bug fails on its own assertion.
    let committed_now = wait_until("e2 retried 3 times, or the commit passed it", Deadline::DEFAULT, || async {
        let retries = counter(&first.metrics().await, RETRIES);
        let committed = committed_async(env.bootstrap(), P).await;
        if retries >= 3.0 || committed > o2 {
            Ok(committed)
        } else {
            Err(format!("{retries} retries, committed {committed}"))
        }
    })
    .await;
    assert_eq!(committed_now, o2, "the commit stops at the unmaterialized record");
    assert_eq!(received_rows(&env.db, order_id(&e2)).await, 0);
    let metrics = first.metrics().await;
    assert_eq!(metric_value(&metrics, &outcome_series("materialized")), Some(2.0), "e1 and e3 only: {metrics}");

    // Shutdown drains (e2 does not finish within the drain timeout) and commits: still o2.
    first.stop().await;
    assert_eq!(committed_async(env.bootstrap(), P).await, o2, "shutdown did not acknowledge e2");

    // The database recovers; a new daemon gets e2 (and e3) again.
    hold.rollback().await.expect("release e2's row");
    let second = env.spawn(configure).await;
    wait_committed_past(env.bootstrap(), P, o3).await;
    assert_eq!(received_rows(&env.db, order_id(&e2)).await, 1, "e2 materialized once");
    assert_eq!(received_rows(&env.db, order_id(&e3)).await, 1, "e3's redelivery was harmless");
    assert_eq!(env.db.count("received_orders").await, 3);
    let rows = env
        .db
        .query("SELECT external_reference::text FROM received_orders WHERE order_id = $1", &[&order_id(&e2)])
        .await;
    assert_eq!(rows[0].get::<_, String>(0), "EXT-F2", "e2's own row, not the rolled-back hold");
    let metrics = second.metrics().await;
    assert_eq!(metric_value(&metrics, &outcome_series("materialized")), Some(1.0), "e2: {metrics}");
    assert_eq!(metric_value(&metrics, &outcome_series("duplicate")), Some(1.0), "e3 redelivered: {metrics}");
    assert!(read_topic(env.bootstrap(), DLT, Deadline::secs(10)).await.expect("read DLT").is_empty());
}

/// The database stays unavailable for `received_orders` (an ACCESS EXCLUSIVE lock) longer
/// than the retries last: the record goes to the DLT as `exhausted`, nothing is written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exhausted_retries_dead_letter_the_order_and_write_nothing() {
    let (env, app) = spawn_app(|c| {
        quick_retry(c, 2);
        c.pipelines.set("outbox", false);
    })
    .await;
    let mut blocker = env.db.connect().await;
    let tx = blocker.transaction().await.expect("begin");
    tx.batch_execute("LOCK TABLE received_orders IN ACCESS EXCLUSIVE MODE").await.expect("lock received_orders");
    let producer = env.upstream();
    let event = order_received(Uuid::new_v4(), "EXT-X");
    let (partition, offset) = produce(&producer, &event, None).await;
    wait_committed_past(env.bootstrap(), partition, offset).await;
    tx.rollback().await.expect("unlock");

    let dlt = read_topic(env.bootstrap(), DLT, Deadline::secs(30)).await.expect("read DLT");
    assert_eq!(dlt.len(), 1);
    assert_eq!(dlt[0].header("dlt-exception-kind"), Some("exhausted"));
    assert_eq!(dlt[0].header("dlt-attempts"), Some("3"), "1 attempt + 2 retries");
    assert_eq!(dlt[0].header("dlt-original-offset"), Some(offset.to_string().as_str()));
    assert_eq!(dlt[0].header("dlt-consumer-group"), Some(GROUP));
    assert_eq!(env.db.count("received_orders").await, 0, "nothing written");
    let metrics = app.metrics().await;
    assert_eq!(metric_value(&metrics, &outcome_series("dead_lettered")), Some(1.0), "{metrics}");
    assert_eq!(metric_value(&metrics, RETRIES), Some(2.0), "{metrics}");
}

/// Poison records (undecodable, missing or invalid field) go to `orders.received-dlt` at
/// once with the DLT headers; the record after them is materialized.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn poison_records_are_dead_lettered_and_later_records_processed() {
    let (env, app) = spawn_app(|c| c.pipelines.set("outbox", false)).await;
    let producer = env.upstream();
    const P: i32 = 3;
    let key = Uuid::new_v4().to_string();
    let (_, o1) = produce_raw(&producer, &key, b"{this is not json", Some(P)).await;
    let mut missing = order_received(Uuid::new_v4(), "EXT-P2");
    missing.as_object_mut().expect("object").remove("orderId");
    let (_, o2) = produce_raw(&producer, &key, missing.to_string().as_bytes(), Some(P)).await;
    let mut invalid = order_received(Uuid::new_v4(), "EXT-P3");
    invalid["amountCents"] = json!(0);
    produce_raw(&producer, &key, invalid.to_string().as_bytes(), Some(P)).await;
    let good = order_received(Uuid::new_v4(), "EXT-P4");
    let (_, o4) = produce(&producer, &good, Some(P)).await;
    wait_committed_past(env.bootstrap(), P, o4).await;
    assert_eq!(received_rows(&env.db, order_id(&good)).await, 1, "the record after the poison ones");
    assert_eq!(env.db.count("received_orders").await, 1, "poison wrote nothing");

    let dlt = read_topic(env.bootstrap(), DLT, Deadline::secs(30)).await.expect("read DLT");
    assert_eq!(dlt.len(), 3, "every poison record dead-lettered");
    let first = dlt.iter().find(|r| r.header("dlt-original-offset") == Some(&o1.to_string())).expect("first poison");
    assert_eq!(first.partition, P, "same partition as the original");
    assert_eq!(first.key.as_deref(), Some(key.as_str()), "original key kept");
    assert_eq!(first.payload.as_deref(), Some(b"{this is not json".as_slice()), "original value kept");
    assert_eq!(first.header("dlt-original-topic"), Some(RECEIVED));
    assert_eq!(first.header("dlt-original-partition"), Some(P.to_string().as_str()));
    assert_eq!(first.header("dlt-consumer-group"), Some(GROUP));
    assert_eq!(first.header("dlt-exception-kind"), Some("poison"));
    assert_eq!(first.header("dlt-attempts"), Some("1"));
    assert!(first.header("dlt-original-timestamp").is_some_and(|t| t.parse::<i64>().is_ok()));
    assert!(first.header("dlt-exception-message").is_some_and(|m| m.contains("undecodable")));
    assert_eq!(first.header("event-type"), Some("OrderReceived"), "original headers kept");
    let second = dlt.iter().find(|r| r.header("dlt-original-offset") == Some(&o2.to_string())).expect("second");
    assert!(second.header("dlt-exception-message").is_some_and(|m| m.contains("orderId")), "{second:?}");
    assert!(dlt.iter().all(|r| r.header("dlt-exception-kind") == Some("poison")));

    let metrics = app.metrics().await;
    assert_eq!(metric_value(&metrics, r#"tally_dlt_records_total{topic="orders.received-dlt"}"#), Some(3.0));
    assert_eq!(metric_value(&metrics, &outcome_series("dead_lettered")), Some(3.0));
    assert_eq!(metric_value(&metrics, &outcome_series("materialized")), Some(1.0));
    assert_eq!(counter(&metrics, RETRIES), 0.0, "poison is never retried");
}

// ---------------------------------------------------------------------------------------
// Intake
// ---------------------------------------------------------------------------------------

/// `externalReference` is the business idempotency key of reception: the same request
/// again answers the existing order (200) and writes nothing; a different request with
/// the same reference is a 409. The order and its `OrderReceived` outbox row commit
/// together.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn external_reference_replays_the_same_order_and_refuses_a_different_one() {
    // Publisher off: the outbox rows stay countable; the test is about HTTP and rows.
    let (env, app) = spawn_app(|c| c.pipelines.set("outbox", false)).await;
    let mut body = order("EXT-100", 12_345);
    body["lines"] = json!([{ "sku": "SKU-1", "qty": 2, "price": 1.5 }]);
    let res = app
        .send(app.client.post(format!("{}/orders", app.intake_url)).header("traceparent", TRACEPARENT).json(&body))
        .await;
    assert_eq!(res.status(), StatusCode::CREATED);
    let location = res.headers().get("location").and_then(|v| v.to_str().ok()).map(str::to_owned);
    let created = json_body(res).await;
    let id = created["id"].as_str().expect("order id").to_owned();
    assert_eq!(location.as_deref(), Some(format!("/orders/{id}").as_str()));
    assert_eq!(created["externalReference"], "EXT-100");
    assert_eq!(created["customerId"], "CUST-9");
    assert_eq!(created["amountCents"], 12_345);
    assert_eq!(created["currency"], "BRL");
    assert_eq!(created["lines"], body["lines"]);
    assert!(created["createdAt"].as_str().is_some_and(|t| chrono::DateTime::parse_from_rfc3339(t).is_ok()));
    assert_counts(&env.db, 1, 1, "after the first POST").await;

    // The outbox row: topic, key = order id, type, traceparent, payload.
    let rows = env
        .db
        .query(
            "SELECT id, topic::text, key::text, event_type::text, payload, traceparent::text FROM outbox_events",
            &[],
        )
        .await;
    let row = &rows[0];
    assert_eq!(row.get::<_, String>(1), RECEIVED);
    assert_eq!(row.get::<_, String>(2), id);
    assert_eq!(row.get::<_, String>(3), "OrderReceived");
    assert_eq!(row.get::<_, Option<String>>(5).as_deref(), Some(TRACEPARENT));
    let payload: Value = serde_json::from_str(&row.get::<_, String>(4)).expect("payload is JSON");
    assert_eq!(payload["eventId"], json!(row.get::<_, Uuid>(0)));
    assert_eq!(payload["orderId"], id.as_str());
    assert_eq!(payload["externalReference"], "EXT-100");
    assert_eq!(payload["customerId"], "CUST-9");
    assert_eq!(payload["amountCents"], 12_345);
    assert_eq!(payload["currency"], "BRL");
    assert_eq!(payload["receivedAt"], created["createdAt"]);

    // Replay: the same order, even with the lines' keys in another order.
    let mut replay_body = order("EXT-100", 12_345);
    replay_body["lines"] = serde_json::from_str(r#"[{"price":1.5,"qty":2,"sku":"SKU-1"}]"#).expect("json");
    let res = app.post_json("/orders", &replay_body).await;
    assert_eq!(res.status(), StatusCode::OK, "replay of the same order");
    let location = res.headers().get("location").and_then(|v| v.to_str().ok()).map(str::to_owned);
    assert_eq!(location.as_deref(), Some(format!("/orders/{id}").as_str()));
    assert_eq!(json_body(res).await, created, "a replay answers the existing order");
    assert_counts(&env.db, 1, 1, "after the replay").await;

    // Conflicts: same reference, another order.
    let mut other_lines = body.clone();
    other_lines["lines"] = json!([{ "sku": "SKU-1", "qty": 3, "price": 1.5 }]);
    let mut no_lines = body.clone();
    no_lines.as_object_mut().expect("object").remove("lines");
    let mut other_customer = body.clone();
    other_customer["customerId"] = json!("CUST-10");
    let mut other_currency = body.clone();
    other_currency["currency"] = json!("USD");
    let mut other_amount = body.clone();
    other_amount["amountCents"] = json!(12_346);
    for (case, conflicting) in [
        ("different amount", other_amount),
        ("different customer", other_customer),
        ("different currency", other_currency),
        ("different lines", other_lines),
        ("lines left out", no_lines),
    ] {
        let res = app.post_json("/orders", &conflicting).await;
        assert_error(res, StatusCode::CONFLICT, "external_reference_conflict", case).await;
    }
    assert_counts(&env.db, 1, 1, "after the conflicts").await;

    // GET answers the same order; another reference is another order.
    let res = app.get(&format!("/orders/{id}")).await;
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(json_body(res).await, created);
    let res = app.post_json("/orders", &order("EXT-101", 12_345)).await;
    assert_eq!(res.status(), StatusCode::CREATED);
    let other = json_body(res).await;
    assert_ne!(other["id"], created["id"]);
    assert!(other.get("lines").is_none(), "no lines, no field: {other}");
    assert_counts(&env.db, 2, 2, "after a second reference").await;
}

/// Concurrent POSTs with one reference: the unique constraint decides, one order is
/// created, the others answer it with 200.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_posts_of_one_reference_create_one_order() {
    let (env, app) = spawn_app(|c| c.pipelines.set("outbox", false)).await;
    let body = order("EXT-CONC", 700);
    let responses = futures_util::future::join_all((0..6).map(|_| app.post_json("/orders", &body))).await;
    let mut created = 0;
    let mut ids = Vec::new();
    for res in responses {
        match res.status() {
            StatusCode::CREATED => created += 1,
            StatusCode::OK => {}
            other => panic!("unexpected status {other}"),
        }
        ids.push(json_body(res).await["id"].clone());
    }
    assert_eq!(created, 1, "exactly one 201");
    assert!(ids.iter().all(|i| *i == ids[0]), "every answer is the same order: {ids:?}");
    assert_counts(&env.db, 1, 1, "after concurrent POSTs").await;
}

/// Bad order requests get JSON errors (as for transfers) and write nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_order_requests_get_json_errors_and_write_nothing() {
    let (env, app) = spawn_app(|c| c.pipelines.set("outbox", false)).await;
    let json = "application/json";
    let valid = r#""externalReference":"EXT-1","customerId":"C-1","currency":"BRL""#;
    let cases: Vec<(&str, String, StatusCode, &str)> = vec![
        ("malformed JSON", r#"{"externalReference": "x","#.into(), StatusCode::BAD_REQUEST, "invalid_body"),
        ("not an object", "[1,2,3]".into(), StatusCode::BAD_REQUEST, "invalid_body"),
        ("missing amount", format!("{{{valid}}}"), StatusCode::BAD_REQUEST, "invalid_body"),
        (
            "missing reference",
            r#"{"customerId":"C-1","currency":"BRL","amountCents":1}"#.into(),
            StatusCode::BAD_REQUEST,
            "invalid_body",
        ),
        (
            "unknown field",
            format!(r#"{{{valid},"amountCents":1,"memo":"x"}}"#),
            StatusCode::BAD_REQUEST,
            "invalid_body",
        ),
        ("amount as a string", format!(r#"{{{valid},"amountCents":"1"}}"#), StatusCode::BAD_REQUEST, "invalid_body"),
        ("amount 0", format!(r#"{{{valid},"amountCents":0}}"#), StatusCode::UNPROCESSABLE_ENTITY, "validation_failed"),
        (
            "amount negative",
            format!(r#"{{{valid},"amountCents":-1}}"#),
            StatusCode::UNPROCESSABLE_ENTITY,
            "validation_failed",
        ),
        (
            "amount fractional",
            format!(r#"{{{valid},"amountCents":1.5}}"#),
            StatusCode::UNPROCESSABLE_ENTITY,
            "validation_failed",
        ),
        (
            "amount above i64::MAX",
            format!(r#"{{{valid},"amountCents":9223372036854775808}}"#),
            StatusCode::UNPROCESSABLE_ENTITY,
            "validation_failed",
        ),
        (
            "lines not an array",
            format!(r#"{{{valid},"amountCents":1,"lines":{{"sku":"A"}}}}"#),
            StatusCode::UNPROCESSABLE_ENTITY,
            "validation_failed",
        ),
    ];
    for (case, body, status, code) in cases {
        let res = app.post_raw("/orders", json, body).await;
        assert_error(res, status, code, case).await;
    }
    let long_ref = "r".repeat(129);
    let long_customer = "c".repeat(65);
    let json_cases: Vec<(&str, Value)> = vec![
        ("empty reference", json!({"externalReference": "", "customerId": "C", "amountCents": 1, "currency": "BRL"})),
        ("blank reference", json!({"externalReference": "  ", "customerId": "C", "amountCents": 1, "currency": "BRL"})),
        (
            "reference of 129 characters",
            json!({"externalReference": long_ref, "customerId": "C", "amountCents": 1, "currency": "BRL"}),
        ),
        (
            "reference with a control character",
            json!({"externalReference": "a\u{1}", "customerId": "C", "amountCents": 1, "currency": "BRL"}),
        ),
        ("empty customer", json!({"externalReference": "R", "customerId": "", "amountCents": 1, "currency": "BRL"})),
        (
            "customer of 65 characters",
            json!({"externalReference": "R", "customerId": long_customer, "amountCents": 1, "currency": "BRL"}),
        ),
        (
            "currency lowercase",
            json!({"externalReference": "R", "customerId": "C", "amountCents": 1, "currency": "brl"}),
        ),
        (
            "currency of 4 letters",
            json!({"externalReference": "R", "customerId": "C", "amountCents": 1, "currency": "BRLX"}),
        ),
        (
            "lines a string",
            json!({"externalReference": "R", "customerId": "C", "amountCents": 1, "currency": "BRL", "lines": "x"}),
        ),
    ];
    for (case, body) in json_cases {
        let res = app.post_json("/orders", &body).await;
        assert_error(res, StatusCode::UNPROCESSABLE_ENTITY, "validation_failed", case).await;
    }
    // The bounds themselves are accepted (and this is the only order written).
    let edge = json!({"externalReference": "r".repeat(128), "customerId": "c".repeat(64), "amountCents": 1, "currency": "BRL"});
    assert_eq!(app.post_json("/orders", &edge).await.status(), StatusCode::CREATED, "128/64 characters");
    assert_counts(&env.db, 1, 1, "after the edge case").await;
    env.db.batch("DELETE FROM outbox_events; DELETE FROM orders").await;

    let res = app.post_raw("/orders", "text/plain", order("R", 1).to_string()).await;
    assert_error(res, StatusCode::UNSUPPORTED_MEDIA_TYPE, "unsupported_media_type", "text/plain body").await;
    let limit = app.config.http.body_limit_bytes;
    let oversized = order(&"a".repeat(limit + 1024), 1).to_string();
    let res = app.post_raw("/orders", json, oversized).await;
    assert_error(res, StatusCode::PAYLOAD_TOO_LARGE, "payload_too_large", "body over http.body_limit_bytes").await;

    let res = app.get("/orders/not-a-uuid").await;
    assert_error(res, StatusCode::BAD_REQUEST, "bad_request", "malformed order id").await;
    let res = app.get(&format!("/orders/{}", Uuid::new_v4())).await;
    assert_error(res, StatusCode::NOT_FOUND, "not_found", "unknown order").await;
    assert_counts(&env.db, 0, 0, "after every bad request").await;
}

// ---------------------------------------------------------------------------------------
// End to end
// ---------------------------------------------------------------------------------------

/// POST /orders -> outbox -> `orders.received` (keyed by the order id, with headers) ->
/// the orders pipeline -> one `received_orders` row; the offset is committed after it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn posted_order_flows_through_outbox_and_kafka_into_received_orders() {
    let (env, app) = spawn_app(|_| {}).await;
    let res = app
        .send(
            app.client
                .post(format!("{}/orders", app.intake_url))
                .header("traceparent", TRACEPARENT)
                .json(&order("EXT-E2E", 2_500)),
        )
        .await;
    assert_eq!(res.status(), StatusCode::CREATED);
    let created = json_body(res).await;
    let id: Uuid = serde_json::from_value(created["id"].clone()).expect("order id");
    wait_received(&env.db, id).await;

    let records = wait_for_records(env.bootstrap(), RECEIVED, Deadline::DEFAULT, |records| {
        if records.is_empty() {
            Err("no record yet".to_owned())
        } else {
            Ok(())
        }
    })
    .await;
    let record = &records[0];
    // The outbox is at-least-once: a republished record would carry the same event id.
    assert!(records.iter().all(|r| r.header("event-id") == record.header("event-id")), "{records:?}");
    assert_eq!(record.key.as_deref(), Some(id.to_string().as_str()), "keyed by the order id");
    assert_eq!(record.header("event-type"), Some("OrderReceived"));
    assert_eq!(record.header("traceparent"), Some(TRACEPARENT));
    let payload = record.payload_json();
    assert_eq!(record.header("event-id"), payload["eventId"].as_str());
    wait_committed_past(env.bootstrap(), record.partition, record.offset).await;

    let rows = env
        .db
        .query(
            "SELECT r.event_id::text, r.external_reference::text, r.customer_id::text, r.amount_cents, r.currency::text, \
             r.received_at = o.created_at FROM received_orders r JOIN orders o ON o.id = r.order_id",
            &[],
        )
        .await;
    assert_eq!(rows.len(), 1);
    let row = &rows[0];
    assert_eq!(Some(row.get::<_, String>(0).as_str()), payload["eventId"].as_str());
    assert_eq!(row.get::<_, String>(1), "EXT-E2E");
    assert_eq!(row.get::<_, String>(2), "CUST-9");
    assert_eq!(row.get::<_, i64>(3), 2_500);
    assert_eq!(row.get::<_, String>(4), "BRL");
    assert!(row.get::<_, bool>(5), "received_at is the order's reception time");
    assert_eq!(env.db.pending_outbox().await, 0);
    let metrics = app.metrics().await;
    assert_eq!(metric_value(&metrics, &outcome_series("materialized")), Some(1.0), "{metrics}");
}
