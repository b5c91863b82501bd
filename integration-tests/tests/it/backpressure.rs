//! Back-pressure on one partition: what librdkafka fetched is kept in a bounded stash
//! while the partition's queue is full, so the partition is paused (and its prefetch
//! dropped and fetched again) about once per half stash, not once per record, and the
//! records in hand stay within their bound.
//!
//! Broker: the embedded broker (librdkafka's mock cluster) of the harness. Database: a fresh
//! PostgreSQL database per test.
#![allow(clippy::expect_used)] // tests: a failed expectation is a failed test, with its message

use std::time::Duration;

use futures_util::future::join_all;
use serde_json::{json, Value};
use tally_integration_tests::{self as harness, json_body, metric_value, spawn_app, wait_until, Deadline, TestApp};
use uuid::Uuid;

const TOKEN: &str = "backpressure-token";
const RECEIVED: &str = "orders.received";
const P: i32 = 0;

async fn orders_partition(app: &TestApp) -> Option<Value> {
    let all = json_body(app.admin_get("/admin/pipelines").await).await;
    let orders = all["pipelines"].as_array()?.iter().find(|p| p["name"] == "orders")?.clone();
    orders["partitions"].as_array()?.iter().find(|p| p["topic"] == RECEIVED && p["partition"] == P).cloned()
}

async fn admin_post(app: &TestApp, path: &str) {
    let res = app.send(app.client.post(format!("{}{path}", app.admin_url)).bearer_auth(TOKEN)).await;
    assert!(res.status().is_success(), "{path}: {}", res.status());
}

/// 2,000 orders under one key wait on one partition of `orders.received`, so they run one
/// at a time while the whole backlog is fetchable at once. With `consumer.max_in_flight`
/// 64 (a queue of 64 and a stash of as many again), every order is materialized once, the
/// partition shows at most 192 records in hand (in flight, queued and stashed), and it is
/// paused at most once per 16 records (each pause takes at least 32 from the stash; about
/// 50 pauses in all).
/// Pausing whenever the queue is full, and fetching again only once the record in hand
/// went, paused 255 times here.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partition_under_back_pressure_keeps_its_prefetch_within_its_bound() {
    const ORDERS: usize = 2_000;
    const MAX_IN_FLIGHT: usize = 64;
    let (env, app) = spawn_app(|c| {
        c.pipelines.set("outbox", false);
        c.consumer.max_in_flight = MAX_IN_FLIGHT;
        c.http.admin_token = tally_engine::config::Secret::new(TOKEN);
    })
    .await;
    wait_until("the orders stage owns the partition", Deadline::DEFAULT, || async {
        orders_partition(&app).await.map(|_| ()).ok_or_else(|| "not assigned yet".to_owned())
    })
    .await;
    admin_post(&app, "/admin/pipelines/orders/pause").await;
    let upstream = env.upstream();
    let sends = (0..ORDERS).map(|i| {
        let upstream = &upstream;
        async move {
            let event = json!({
                "eventId": Uuid::new_v4(), "orderId": Uuid::new_v4(), "externalReference": format!("BP-{i}"),
                "customerId": "CUST-BP", "amountCents": 100, "currency": "BRL", "receivedAt": "2026-11-30T12:00:00Z",
            });
            upstream.db().record_order(&event).await;
            upstream.signed(RECEIVED, Some(P), "one-key", event.to_string().as_bytes(), "OrderReceived").await.1
        }
    });
    let last = join_all(sends).await.into_iter().max().expect("offsets");
    admin_post(&app, "/admin/pipelines/orders/resume").await;

    // The records in hand, sampled while the backlog drains.
    let mut most_in_hand = 0;
    let mut held_seen = false;
    let until = std::time::Instant::now() + Deadline::secs(120).0;
    while harness::committed_offset(env.bootstrap(), "tally-orders", RECEIVED, P) <= last {
        assert!(std::time::Instant::now() < until, "the backlog did not drain in 120 s");
        if let Some(p) = orders_partition(&app).await {
            most_in_hand = most_in_hand.max(p["inFlight"].as_u64().expect("inFlight"));
            held_seen |= p["held"] == true;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(env.db.count("received_orders").await, ORDERS as i64, "every order materialized once");
    let holds = metric_value(&app.metrics().await, r#"tally_partition_holds_total{pipeline="orders"}"#)
        .expect("tally_partition_holds_total of the orders pipeline");
    assert!(holds >= 1.0 || held_seen, "the backlog never filled the queue and stash: nothing was tested");
    assert!(holds <= (ORDERS / 16) as f64, "{holds} pauses for {ORDERS} records");
    assert!(
        most_in_hand <= (3 * MAX_IN_FLIGHT) as u64,
        "{most_in_hand} records in hand, more than {MAX_IN_FLIGHT} each in flight, queued and stashed"
    );
}
