//! Black-box tests of the outbox publisher facing a broker that refuses a row for good:
//! the row is parked (kept, counted, shown, retried), the rest of its shard goes on, and
//! later rows of its topic and key wait behind it.
//!
//! Broker: the embedded mock cluster (librdkafka's), one per test. A refused topic is one
//! whose metadata carries `TOPIC_AUTHORIZATION_FAILED` (`EmbeddedBroker::set_topic_error`),
//! which the producer takes as a refusal of every record for it, until the test clears it.

use std::time::Duration;

use rdkafka::types::RDKafkaRespErr;
use reqwest::StatusCode;
use serde_json::Value;
use tally_integration_tests::{metric_value, read_topic, run_only, wait_until, Deadline, TestApp, TestDb, TestEnv};

const TOKEN: &str = "outbox-admin-token";

const REFUSED: &str = "audit.refused";
const OPEN: &str = "transfers.requested";

/// A key other than `key` in the same one of the outbox's 64 shards (the shard column's
/// formula), so that one claim holds both.
async fn key_in_the_shard_of(db: &TestDb, key: &str) -> String {
    let rows = db
        .query(
            "SELECT k FROM (SELECT 'acct-' || n AS k FROM generate_series(1, 100000) AS n) AS s \
             WHERE (hashtext(k) & 2147483647) % 64 = (hashtext($1) & 2147483647) % 64 AND k <> $1 LIMIT 1",
            &[&key],
        )
        .await;
    rows.first().map(|r| r.get(0)).expect("a key in the same shard")
}

/// Writes one outbox row per `(topic, key, n, pad)`, in this order (increasing `seq`), in
/// one transaction; returns their ids. The payload is `{"key", "n", "pad"}`, `pad` being
/// that many `x`.
async fn write_rows(db: &TestDb, rows: &[(&str, &str, i32, i32)]) -> Vec<String> {
    let topics: Vec<&str> = rows.iter().map(|r| r.0).collect();
    let keys: Vec<&str> = rows.iter().map(|r| r.1).collect();
    let ns: Vec<i32> = rows.iter().map(|r| r.2).collect();
    let pads: Vec<i32> = rows.iter().map(|r| r.3).collect();
    db.query(
        "INSERT INTO outbox_events (id, topic, key, event_type, payload) \
         SELECT gen_random_uuid(), t, k, 'TransferRequested', \
                json_build_object('key', k, 'n', n, 'pad', repeat('x', pad))::text \
         FROM unnest($1::text[], $2::text[], $3::int[], $4::int[]) WITH ORDINALITY AS r(t, k, n, pad, i) \
         ORDER BY i RETURNING id::text",
        &[&topics, &keys, &ns, &pads],
    )
    .await
    .iter()
    .map(|r| r.get(0))
    .collect()
}

/// Whether each row of `ids` is marked published, in the order of `ids`.
async fn published(db: &TestDb, ids: &[String]) -> Vec<bool> {
    let mut out = Vec::with_capacity(ids.len());
    for id in ids {
        let rows = db.query("SELECT published_at IS NOT NULL FROM outbox_events WHERE id::text = $1", &[id]).await;
        out.push(rows.first().is_some_and(|r| r.get(0)));
    }
    out
}

/// `(key, n)` of every record on `topic`, in log order per partition.
async fn keys_and_ns(bootstrap: &str, topic: &str) -> Vec<(String, i64)> {
    read_topic(bootstrap, topic, Deadline::DEFAULT)
        .await
        .expect("read the topic")
        .iter()
        .map(|r| {
            let p: Value = r.payload_json();
            (p["key"].as_str().unwrap_or_default().to_owned(), p["n"].as_i64().unwrap_or(-1))
        })
        .collect()
}

// Broker: embedded mock cluster; REFUSED refuses every record until the test clears it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_row_is_parked_its_key_waits_and_the_rest_of_its_shard_is_published() {
    let env = TestEnv::new().await;
    env.broker.create_topic(REFUSED, 3, 1).expect("create the refused topic");
    env.broker
        .set_topic_error(REFUSED, RDKafkaRespErr::RD_KAFKA_RESP_ERR_TOPIC_AUTHORIZATION_FAILED)
        .expect("refuse the topic");
    let app = env
        .spawn(|c| {
            run_only(c, &["outbox"]);
            c.outbox.parked_retry_initial = Duration::from_millis(200);
            c.outbox.parked_retry_max = Duration::from_millis(1_000);
        })
        .await;

    // Published at 0 from the start, so that an alert on their increase sees the first one.
    let metrics = app.metrics().await;
    assert_eq!(metric_value(&metrics, "tally_outbox_parked_rows"), Some(0.0), "{metrics}");
    let first = format!(r#"tally_outbox_refused_total{{reason="topic_authorization_failed",topic="{OPEN}"}}"#);
    assert_eq!(metric_value(&metrics, &first), Some(0.0), "{metrics}");
    assert!(metrics.contains("# HELP tally_outbox_refused_total "), "help text");

    let open_key = "acct-open";
    let parked_key = key_in_the_shard_of(&env.db, open_key).await;
    let ids = write_rows(
        &env.db,
        &[
            (OPEN, open_key, 1, 0),
            (REFUSED, &parked_key, 1, 0), // refused: parked
            (OPEN, open_key, 2, 0),
            (REFUSED, &parked_key, 2, 0), // behind the parked row: held
            (OPEN, &parked_key, 3, 0),    // same key, another topic (another partition log): goes on
            (OPEN, open_key, 3, 0),
        ],
    )
    .await;
    let (parked, behind) = (ids[1].clone(), ids[3].clone());
    let goes_on = [ids[0].clone(), ids[2].clone(), ids[4].clone(), ids[5].clone()];

    // The rest of the shard is published while the refused row is not.
    wait_until("every row but the refused key's on the refused topic is published", Deadline::DEFAULT, || async {
        match published(&env.db, &goes_on).await {
            p if p.iter().all(|x| *x) => Ok(()),
            p => Err(format!("published: {p:?} (the refused row's shard is stuck behind it)")),
        }
    })
    .await;
    assert_eq!(published(&env.db, &[parked.clone(), behind.clone()]).await, [false, false]);
    let open: Vec<(String, i64)> = keys_and_ns(&app.bootstrap, OPEN).await;
    let of = |key: &str| -> Vec<i64> { open.iter().filter(|(k, _)| k == key).map(|(_, n)| *n).collect() };
    assert_eq!(of(open_key), [1, 2, 3], "the other key, in order, once each: {open:?}");
    assert_eq!(of(&parked_key), [3], "the refused key's row on another topic: {open:?}");

    // Shown and counted.
    let backlog = app.outbox_backlog().await;
    assert_eq!(backlog["parked"], 1, "{backlog}");
    let row = &backlog["parkedRows"][0];
    assert_eq!(row["id"], parked.as_str(), "{backlog}");
    assert_eq!(row["topic"], REFUSED, "{backlog}");
    assert_eq!(row["key"], parked_key.as_str(), "{backlog}");
    assert_eq!(row["reason"], "topic_authorization_failed", "{backlog}");
    assert!(row["since"].is_string() && row["attempts"].as_i64() >= Some(1), "{backlog}");
    assert_eq!(row["held"], 1, "the row behind it: {backlog}");
    assert_eq!(backlog["held"], 1, "{backlog}");
    let metrics = app.metrics().await;
    assert_eq!(metric_value(&metrics, "tally_outbox_parked_rows"), Some(1.0), "{metrics}");
    assert_eq!(metric_value(&metrics, "tally_outbox_held_rows"), Some(1.0), "{metrics}");
    let refused = format!(r#"tally_outbox_refused_total{{reason="topic_authorization_failed",topic="{REFUSED}"}}"#);
    assert!(metric_value(&metrics, &refused) >= Some(1.0), "{metrics}");

    // The broker accepts again: the parked row and the one behind it are published, in order.
    env.broker.set_topic_error(REFUSED, RDKafkaRespErr::RD_KAFKA_RESP_ERR_NO_ERROR).expect("accept the topic");
    wait_until("the parked row and the one behind it are published", Deadline::DEFAULT, || async {
        match published(&env.db, &[parked.clone(), behind.clone()]).await {
            p if p.iter().all(|x| *x) => Ok(()),
            p => Err(format!("published: {p:?}")),
        }
    })
    .await;
    let refused_records = keys_and_ns(&app.bootstrap, REFUSED).await;
    assert_eq!(refused_records, [(parked_key.clone(), 1), (parked_key.clone(), 2)], "in order, once each");
    assert_eq!(app.outbox_backlog().await["parked"], 0);
    assert_eq!(metric_value(&app.metrics().await, "tally_outbox_parked_rows"), Some(0.0));
}

/// `POST <admin><path>` with the admin token when `token` is set.
async fn admin_post(app: &TestApp, path: &str, token: bool) -> reqwest::Response {
    let request = app.client.post(format!("{}{path}", app.admin_url));
    app.send(if token { request.bearer_auth(TOKEN) } else { request }).await
}

/// The parked row `id` as `GET /admin/outbox` lists it (`Null` when it is not listed).
async fn parked_row(app: &TestApp, id: &str) -> Value {
    let backlog = app.outbox_backlog().await;
    let rows = backlog["parkedRows"].as_array().cloned().unwrap_or_default();
    rows.into_iter().find(|r| r["id"] == id).unwrap_or(Value::Null)
}

// Broker: embedded mock cluster; the first daemon's producer refuses records over 10,000
// bytes (`message.max.bytes`), the second one's takes them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_row_too_large_is_parked_until_an_operator_retries_it_on_a_daemon_that_takes_it() {
    let env = TestEnv::new().await;
    let configure = |c: &mut tally_integration_tests::tally_engine::Config| {
        run_only(c, &["outbox"]);
        c.http.admin_token = tally_integration_tests::tally_engine::config::Secret::new(TOKEN);
        // Only an operator makes a parked row due within this test.
        c.outbox.parked_retry_initial = Duration::from_secs(3_600);
        c.outbox.parked_retry_max = Duration::from_secs(3_600);
        // And only rings get rows out: the row released from behind the retried one too.
        c.outbox.poll_interval = Duration::from_secs(600);
    };
    let small = env
        .spawn(|c| {
            configure(c);
            c.kafka.producer.insert("message.max.bytes".into(), "10000".into());
            // The intake's bound on what fits a record follows the producer's limit.
            c.http.body_limit_bytes = 4_000;
        })
        .await;
    let big_key = "acct-big";
    let other_key = key_in_the_shard_of(&env.db, big_key).await;
    let ids = write_rows(
        &env.db,
        &[(OPEN, big_key, 1, 20_000), (OPEN, &other_key, 1, 0), (OPEN, big_key, 2, 0), (OPEN, &other_key, 2, 0)],
    )
    .await;
    let (big, behind) = (ids[0].clone(), ids[2].clone());

    wait_until("the other key's rows are published and the large row is parked", Deadline::DEFAULT, || async {
        let others = published(&env.db, &[ids[1].clone(), ids[3].clone()]).await;
        let row = parked_row(&small, &big).await;
        if others == [true, true] && row["reason"] == "message_too_large" {
            Ok(row)
        } else {
            Err(format!("others published: {others:?}, parked row: {row}"))
        }
    })
    .await;
    assert_eq!(published(&env.db, &[big.clone(), behind.clone()]).await, [false, false]);
    assert_eq!(parked_row(&small, &big).await["attempts"], 1);

    // Retrying needs the token, and a row that is parked.
    let path = format!("/admin/outbox/parked/{big}/retry");
    assert_eq!(admin_post(&small, &path, false).await.status(), StatusCode::UNAUTHORIZED);
    let unknown = format!("/admin/outbox/parked/{}/retry", uuid::Uuid::new_v4());
    assert_eq!(admin_post(&small, &unknown, true).await.status(), StatusCode::NOT_FOUND);
    // The same producer refuses it again: one more attempt, an hour before the next.
    assert_eq!(admin_post(&small, &path, true).await.status(), StatusCode::OK);
    wait_until("the retried row is refused again", Deadline::DEFAULT, || async {
        match parked_row(&small, &big).await {
            row if row["attempts"] == 2 => Ok(()),
            row => Err(format!("{row}")),
        }
    })
    .await;
    assert_eq!(published(&env.db, &[big.clone(), behind.clone()]).await, [false, false]);
    small.stop().await;

    // A daemon whose producer takes the record: published on the operator's word, then the
    // row behind it, in order.
    let large = env.spawn(configure).await;
    assert_eq!(admin_post(&large, "/admin/outbox/parked/retry", true).await.status(), StatusCode::OK);
    wait_until("the parked row and the one behind it are published", Deadline::DEFAULT, || async {
        match published(&env.db, &[big.clone(), behind.clone()]).await {
            p if p == [true, true] => Ok(()),
            p => Err(format!("published: {p:?}")),
        }
    })
    .await;
    let records = keys_and_ns(&large.bootstrap, OPEN).await;
    let of = |key: &str| -> Vec<i64> { records.iter().filter(|(k, _)| k == key).map(|(_, n)| *n).collect() };
    assert_eq!(of(big_key), [1, 2], "in order, once each: {records:?}");
    assert_eq!(of(&other_key), [1, 2], "{records:?}");
    let backlog = large.outbox_backlog().await;
    assert_eq!((backlog["parked"].as_i64(), backlog["held"].as_i64()), (Some(0), Some(0)), "{backlog}");
}
