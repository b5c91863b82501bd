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
    let records: Vec<_> = hostile.iter().map(|(_, r)| r.clone()).collect();
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
