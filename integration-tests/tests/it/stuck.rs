//! Black-box tests that nothing is ever stuck: a record its dead-letter topic can never
//! take is stored in the `dead_letters` table and its partition moves on; `retry-original-*`
//! headers are trusted only on retry topics; one key stuck in retry holds back at most the
//! uncommitted window of its partition.
//!
//! Broker: the embedded broker (librdkafka's mock cluster) of the harness. Database: a fresh
//! PostgreSQL database per test.
#![allow(clippy::expect_used)] // tests: a failed expectation is a failed test, with its message

use std::time::Duration;

use serde_json::{json, Value};
use tally_engine::config::RetryConfig;
use tally_integration_tests::{
    self as harness, metric_value, producer, read_topic, spawn_app, wait_for_records, wait_until, Deadline, TestDb,
};
use tally_schema::headers as h;
use uuid::Uuid;

const ANALYZED: &str = "transfers.analyzed";
const LEDGER: &str = "tally-ledger";

fn analyzed(transfer_id: Uuid, from: &str, to: &str, amount: i64) -> Value {
    json!({
        "eventId": Uuid::new_v4(), "transferId": transfer_id, "sourceAccount": from,
        "destinationAccount": to, "amountCents": amount, "currency": "BRL", "score": 10,
        "analyzedAt": "2026-11-30T00:00:00Z",
    })
}

async fn accounts(db: &TestDb, rows: &[(&str, i64)]) {
    db.fund_accounts(rows).await;
}

async fn processed(db: &TestDb, id: Uuid) -> i64 {
    db.scalar_i64("SELECT count(*) FROM processed_transfers WHERE transfer_id = $1", &[&id]).await
}

/// A 999,900-byte non-JSON value on `transfers.analyzed` is poison for the ledger, and with
/// the `dlt-*` headers added it exceeds the producer's 1 MB `message.max.bytes`: the DLT
/// can never take it. It is stored in `dead_letters` with its metadata, a later record of
/// the same partition and key settles, and the committed offset passes both.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_record_too_large_for_its_dlt_goes_to_the_dead_letters_table_and_its_partition_moves_on() {
    let (env, app) = spawn_app(|c| c.pipelines.set("outbox", false)).await;
    accounts(&env.db, &[("S-A", 1_000), ("S-B", 0)]).await;
    let producer = producer(env.bootstrap());
    const P: i32 = 0;
    let huge = vec![b'x'; 999_900];
    // One short header only: with the usual ones the record would not fit the 1 MB limit.
    let (_, o1) = harness::produce(&producer, ANALYZED, Some(P), "S-A", &huge, &[("h", "1")]).await;
    let later = Uuid::new_v4();
    let event = analyzed(later, "S-A", "S-B", 250);
    let (_, o2) = env.upstream().analyzed(&event, Some(P)).await;

    harness::wait_committed_past(env.bootstrap(), LEDGER, ANALYZED, P, o2).await;
    assert_eq!(processed(&env.db, later).await, 1, "the later record of the same key settled");
    let rows = env
        .db
        .query(
            "SELECT original_topic, original_partition, original_offset, consumer_group, exception_kind, attempts, \
             length(payload) AS size, record_key, headers::text AS headers, dlt_error FROM dead_letters",
            &[],
        )
        .await;
    assert_eq!(rows.len(), 1, "one dead letter");
    let row = &rows[0];
    assert_eq!(row.get::<_, String>("original_topic"), ANALYZED);
    assert_eq!(row.get::<_, i32>("original_partition"), P);
    assert_eq!(row.get::<_, i64>("original_offset"), o1);
    assert_eq!(row.get::<_, String>("consumer_group"), LEDGER);
    assert_eq!(row.get::<_, String>("exception_kind"), "poison");
    // Unsigned, it is refused before any attempt to apply it.
    assert_eq!(row.get::<_, i32>("attempts"), 0);
    assert_eq!(row.get::<_, i32>("size"), 999_900);
    assert_eq!(row.get::<_, Option<Vec<u8>>>("record_key").as_deref(), Some(b"S-A".as_slice()));
    assert_eq!(row.get::<_, String>("headers"), r#"[{"key": "h", "value": "MQ=="}]"#, "the record's headers");
    assert!(row.get::<_, String>("dlt_error").to_lowercase().contains("size"), "{}", row.get::<_, String>("dlt_error"));
    let dlt = read_topic(env.bootstrap(), "transfers.analyzed-dlt", Deadline::secs(10)).await.expect("read the DLT");
    assert!(dlt.is_empty(), "the DLT could not take it: {} records", dlt.len());
    let metrics = app.metrics().await;
    let series = r#"{topic="transfers.analyzed-dlt"}"#;
    assert_eq!(metric_value(&metrics, &format!("tally_dlt_fallback_records_total{series}")), Some(1.0));
    assert_eq!(metric_value(&metrics, &format!("tally_dlt_records_total{series}")), Some(1.0));
}

/// A record on a topic that is not a retry topic carrying a forged `retry-original-topic`
/// (and partition, offset) dead-letters to its own topic's DLT with its own coordinates.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forged_retry_origin_dead_letters_to_the_records_own_topic() {
    let (env, _app) = spawn_app(|c| c.pipelines.set("outbox", false)).await;
    let producer = producer(env.bootstrap());
    let forged = [
        (h::RETRY_ORIGINAL_TOPIC, "transfers.settled"),
        (h::RETRY_ORIGINAL_PARTITION, "5"),
        (h::RETRY_ORIGINAL_OFFSET, "77"),
        ("event-id", "forged-1"),
    ];
    let (p, o) = harness::produce(&producer, ANALYZED, Some(2), "F-A", b"not json", &forged).await;
    let records = wait_for_records(env.bootstrap(), "transfers.analyzed-dlt", Deadline::DEFAULT, |r| {
        if r.is_empty() {
            Err("nothing dead-lettered yet".into())
        } else {
            Ok(())
        }
    })
    .await;
    assert_eq!(records.len(), 1);
    let r = &records[0];
    assert_eq!(r.partition, p, "the record's own partition");
    assert_eq!(r.header(h::DLT_ORIGINAL_TOPIC), Some(ANALYZED));
    assert_eq!(r.header(h::DLT_ORIGINAL_PARTITION), Some(p.to_string().as_str()));
    assert_eq!(r.header(h::DLT_ORIGINAL_OFFSET), Some(o.to_string().as_str()));
    assert_eq!(r.header(h::DLT_EXCEPTION_KIND), Some("poison"));
    let settled_dlt = read_topic(env.bootstrap(), "transfers.settled-dlt", Deadline::secs(10)).await.expect("read");
    assert!(settled_dlt.is_empty(), "nothing went to the forged topic's DLT");
    harness::wait_committed_past(env.bootstrap(), LEDGER, ANALYZED, p, o).await;
}

/// One order stuck in retry (its row is held by an open transaction) at the head of its
/// partition: with `consumer.max_uncommitted = 10`, at most 9 later records of that
/// partition are taken and materialized while it is stuck; once it is released everything
/// completes and the commit passes the last record.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_stuck_key_holds_back_at_most_the_uncommitted_window() {
    const WINDOW: usize = 10;
    let (env, _app) = spawn_app(|c| {
        c.pipelines.set("outbox", false);
        c.consumer.max_in_flight = 4;
        c.consumer.max_uncommitted = WINDOW;
        c.orders.retry = RetryConfig {
            max_retries: 100,
            initial: std::time::Duration::from_millis(100),
            multiplier: 2.0,
            max: std::time::Duration::from_millis(400),
        };
        c.database.statement_timeout = std::time::Duration::from_millis(500);
    })
    .await;
    const RECEIVED: &str = "orders.received";
    const P: i32 = 0;
    let order = |reference: &str| {
        json!({
            "eventId": Uuid::new_v4(), "orderId": Uuid::new_v4(), "externalReference": reference,
            "customerId": "CUST-1", "amountCents": 4_990, "currency": "BRL", "receivedAt": "2026-11-30T12:00:00Z",
        })
    };
    let stuck = order("EXT-STUCK");
    let stuck_id: Uuid = serde_json::from_value(stuck["orderId"].clone()).expect("uuid");
    let mut holder = env.db.connect().await;
    let hold = holder.transaction().await.expect("begin");
    hold.execute(
        "INSERT INTO received_orders (order_id, event_id, external_reference, customer_id, amount_cents, currency) \
         VALUES ($1, $2, 'held', 'held', 1, 'XXX')",
        &[&stuck_id, &Uuid::new_v4()],
    )
    .await
    .expect("hold the stuck order's row");

    let upstream = env.upstream();
    let produce = |event: Value| {
        let upstream = &upstream;
        async move {
            upstream.db().record_order(&event).await;
            let key = event["orderId"].as_str().expect("orderId").to_owned();
            upstream.signed(RECEIVED, Some(P), &key, event.to_string().as_bytes(), "OrderReceived").await
        }
    };
    produce(stuck).await;
    let mut last = 0;
    for i in 0..(3 * WINDOW) {
        last = produce(order(&format!("EXT-{i}"))).await.1;
    }
    let count = || async { env.db.count("received_orders").await };
    wait_until("the window's records materialized", Deadline::DEFAULT, || async {
        match count().await {
            n if n >= (WINDOW - 1) as i64 => Ok(()),
            n => Err(format!("{n} materialized")),
        }
    })
    .await;
    // Given time, an unbounded partition would take and finish all 30 others.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(count().await, (WINDOW - 1) as i64, "the stuck record and 9 others fill the window");
    assert!(harness::committed_offset(env.bootstrap(), "tally-orders", RECEIVED, P) <= 0, "nothing passes the head");

    hold.rollback().await.expect("release the stuck order");
    harness::wait_committed_past(env.bootstrap(), "tally-orders", RECEIVED, P, last).await;
    assert_eq!(count().await, (3 * WINDOW + 1) as i64, "every order materialized once");
}
