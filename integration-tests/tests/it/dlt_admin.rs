//! Black-box tests of DLT administration: `GET /admin/dlt`, `GET /admin/dlt/{topic}`,
//! `POST /admin/dlt/{topic}/replay` (admin token), and the `tally_dlt_topic_records` /
//! `tally_dlt_replayed_total` metrics.
//!
//! Broker: every test runs on the embedded broker (librdkafka's mock cluster, in this test
//! process) created by the harness. Database: a fresh PostgreSQL database per test.
#![allow(clippy::expect_used)] // tests: a failed expectation is a failed test, with its message

use rdkafka::producer::FutureProducer;
use reqwest::StatusCode;
use serde_json::{json, Value};
use tally_engine::config::RetryConfig;
use tally_integration_tests::{
    self as harness, json_body, metric_value, producer, read_topic, spawn_app, wait_until, Deadline, KafkaRecord,
    TestApp, TestDb, Upstream,
};
use uuid::Uuid;

const ANALYZED: &str = "transfers.analyzed";
const DLT: &str = "transfers.analyzed-dlt";
const GROUP: &str = "tally-ledger";
const TOKEN: &str = "dlt-test-token";

fn analyzed(transfer_id: Uuid, from: &str, to: &str, amount: i64) -> Value {
    json!({
        "eventId": Uuid::new_v4(), "transferId": transfer_id, "sourceAccount": from,
        "destinationAccount": to, "amountCents": amount, "currency": "BRL", "score": 10,
        "analyzedAt": "2026-11-30T00:00:00Z",
    })
}

/// Waits until the ledger group committed past `offset` of `partition` (it processed it).
async fn wait_committed_past(bootstrap: &str, partition: i32, offset: i64) {
    harness::wait_committed_past(bootstrap, GROUP, ANALYZED, partition, offset).await;
}

/// Produces to `transfers.analyzed` as antifraud would (event-id, event-type, signed),
/// recording nothing: the tests record the transfers they mean to settle.
async fn produce_analyzed(upstream: &Upstream<'_>, key: &str, payload: &[u8]) -> (i32, i64) {
    upstream.signed(ANALYZED, None, key, payload, "TransferAnalyzed").await
}

async fn accounts(db: &TestDb, rows: &[(&str, i64)]) {
    db.fund_accounts(rows).await;
}

async fn balance(db: &TestDb, id: &str) -> i64 {
    db.scalar_i64("SELECT balance_cents FROM accounts WHERE id = $1", &[&id]).await
}

/// `GET <admin><path>` with the admin token (browsing records needs it).
async fn get_json(app: &TestApp, path: &str) -> (StatusCode, Value) {
    let res = app.send(app.client.get(format!("{}{path}", app.admin_url)).bearer_auth(TOKEN)).await;
    let status = res.status();
    (status, json_body(res).await)
}

async fn replay(app: &TestApp, token: Option<&str>, topic: &str, body: Option<Value>) -> (StatusCode, Value) {
    let mut req = app.client.post(format!("{}/admin/dlt/{topic}/replay", app.admin_url));
    if let Some(t) = token {
        req = req.bearer_auth(t);
    }
    if let Some(b) = body {
        req = req.json(&b);
    }
    let res = app.send(req).await;
    let status = res.status();
    (status, json_body(res).await)
}

/// Waits until `GET /admin/dlt` counts `n` records in `transfers.analyzed-dlt`.
async fn wait_dlt_count(app: &TestApp, n: i64) -> Value {
    wait_until(&format!("{n} records in {DLT}"), Deadline::DEFAULT, || async {
        let (status, body) = get_json(app, "/admin/dlt").await;
        let topic = body["topics"].as_array().and_then(|ts| ts.iter().find(|t| t["topic"] == DLT)).cloned();
        match topic {
            Some(t) if status == StatusCode::OK && t["records"] == n => Ok(body),
            _ => Err(format!("{status}: {body}")),
        }
    })
    .await
}

fn header<'a>(record: &'a Value, name: &str) -> Option<&'a Value> {
    record["headers"].as_array()?.iter().find(|h| h["key"] == name)
}

fn offsets(body: &Value) -> Vec<(i64, i64)> {
    body["records"]
        .as_array()
        .expect("records")
        .iter()
        .map(|r| (r["partition"].as_i64().expect("partition"), r["offset"].as_i64().expect("offset")))
        .collect()
}

fn error_code(body: &Value) -> &str {
    body["error"]["code"].as_str().unwrap_or_else(|| panic!("not a JSON error: {body}"))
}

/// Poison records land in the DLT; the listing counts them (and the gauge shows it), the
/// browser decodes their headers and payloads, pages with offset/limit, and refuses
/// unknown topics (404) and bad parameters (400).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dlt_listing_and_browsing_show_dead_lettered_records() {
    let (env, app) = spawn_app(|c| c.http.admin_token = tally_engine::config::Secret::new(TOKEN)).await;
    accounts(&env.db, &[("P-A", 10_000), ("P-B", 0)]).await;
    let producer = env.upstream();
    let (p, o1) = produce_analyzed(&producer, "P-A", b"{this is not json").await;
    let mut missing = analyzed(Uuid::new_v4(), "P-A", "P-B", 10);
    missing.as_object_mut().expect("object").remove("amountCents");
    let (_, o2) = produce_analyzed(&producer, "P-A", missing.to_string().as_bytes()).await;
    let (_, o3) = produce_analyzed(&producer, "P-A", &[0xff, 0xfe, 0x00]).await;
    let good = analyzed(Uuid::new_v4(), "P-A", "P-B", 2_500);
    env.db.record_analyzed(&[&good]).await;
    let (p4, o4) = produce_analyzed(&producer, "P-A", good.to_string().as_bytes()).await;
    assert_eq!(p, p4, "one key, one partition");
    wait_committed_past(env.bootstrap(), p4, o4).await;
    assert_eq!(balance(&env.db, "P-B").await, 2_500, "the good record settled");

    // Listing: every DLT topic of the configuration, with counts per partition.
    let listing = wait_dlt_count(&app, 3).await;
    let names: Vec<&str> =
        listing["topics"].as_array().expect("topics").iter().filter_map(|t| t["topic"].as_str()).collect();
    assert_eq!(
        names,
        [
            "transfers.requested-dlt",
            "transfers.analyzed-dlt",
            "transfers.rejected-dlt",
            "transfers.settled-dlt",
            "orders.received-dlt"
        ]
    );
    assert_eq!(listing["records"], 3, "{listing}");
    let analyzed_dlt = listing["topics"].as_array().expect("topics").iter().find(|t| t["topic"] == DLT).expect("dlt");
    assert_eq!(analyzed_dlt["sourceTopic"], ANALYZED);
    let parts = analyzed_dlt["partitions"].as_array().expect("partitions");
    assert_eq!(parts.len(), app.config.kafka.partitions as usize);
    for part in parts {
        let expected = if part["partition"] == p { 3 } else { 0 };
        assert_eq!(part["records"], expected, "{part}");
    }
    let metrics = app.metrics().await;
    assert_eq!(metric_value(&metrics, r#"tally_dlt_topic_records{topic="transfers.analyzed-dlt"}"#), Some(3.0));
    assert_eq!(metric_value(&metrics, r#"tally_dlt_topic_records{topic="orders.received-dlt"}"#), Some(0.0));

    // Browsing: every record, decoded.
    let (status, body) = get_json(&app, &format!("/admin/dlt/{DLT}")).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["count"], 3);
    assert_eq!(body["next"], Value::Null);
    let records = body["records"].as_array().expect("records");
    let originals: Vec<i64> = records.iter().map(|r| r["dlt"]["originalOffset"].as_i64().expect("offset")).collect();
    assert_eq!(originals, [o1, o2, o3]);
    for r in records {
        assert_eq!(r["partition"], p);
        assert_eq!(r["key"], "P-A");
        assert_eq!(r["keyEncoding"], "utf8");
        assert_eq!(r["dlt"]["originalTopic"], ANALYZED);
        assert_eq!(r["dlt"]["originalPartition"], p);
        assert_eq!(r["dlt"]["exceptionKind"], "poison");
        assert_eq!(r["dlt"]["consumerGroup"], GROUP);
        assert_eq!(r["dlt"]["attempts"], 1);
        assert!(r["dlt"]["originalTimestampMs"].is_i64(), "{r}");
        assert!(r["timestamp"].as_str().is_some_and(|t| t.ends_with('Z')), "{r}");
        assert_eq!(
            header(r, "dlt-exception-kind"),
            Some(&json!({"key": "dlt-exception-kind", "value": "poison", "encoding": "utf8"}))
        );
        assert_eq!(
            header(r, "dlt-original-offset").map(|h| &h["value"]),
            Some(&json!(r["dlt"]["originalOffset"].to_string()))
        );
        assert_eq!(
            header(r, "event-type").map(|h| &h["value"]),
            Some(&json!("TransferAnalyzed")),
            "original headers kept"
        );
    }
    assert_eq!(records[0]["payload"], "{this is not json");
    assert_eq!(records[0]["payloadEncoding"], "utf8");
    assert!(
        records[0]["dlt"]["exceptionMessage"].as_str().is_some_and(|m| m.contains("undecodable")),
        "{}",
        records[0]
    );
    assert_eq!(records[1]["payload"], missing, "JSON payloads are JSON");
    assert_eq!(records[1]["payloadEncoding"], "json");
    assert_eq!(records[2]["payload"], "//4A", "binary payloads are base64");
    assert_eq!(records[2]["payloadEncoding"], "base64");

    // Paging: one at a time, following `next`.
    let first = records[0]["offset"].as_i64().expect("offset");
    let (status, page1) = get_json(&app, &format!("/admin/dlt/{DLT}?partition={p}&limit=2")).await;
    assert_eq!(status, StatusCode::OK, "{page1}");
    assert_eq!(offsets(&page1), [(i64::from(p), first), (i64::from(p), first + 1)]);
    assert_eq!(page1["next"], json!({"partition": p, "offset": first + 2}));
    let (_, page2) = get_json(&app, &format!("/admin/dlt/{DLT}?partition={p}&offset={}&limit=2", first + 2)).await;
    assert_eq!(offsets(&page2), [(i64::from(p), first + 2)]);
    assert_eq!(page2["next"], Value::Null);
    let (_, mid) = get_json(&app, &format!("/admin/dlt/{DLT}?offset={}&limit=1", first + 1)).await;
    assert_eq!(offsets(&mid), [(i64::from(p), first + 1)]);
    assert_eq!(mid["records"][0]["payload"], missing);
    let (_, past) = get_json(&app, &format!("/admin/dlt/{DLT}?partition={p}&offset=1000")).await;
    assert_eq!(past["count"], 0, "{past}");
    let other = (p + 1) % app.config.kafka.partitions;
    let (_, empty) = get_json(&app, &format!("/admin/dlt/{DLT}?partition={other}")).await;
    assert_eq!(empty["count"], 0, "{empty}");

    // Only DLT topics of this configuration.
    for path in [format!("/admin/dlt/{ANALYZED}"), "/admin/dlt/unknown-dlt".to_owned()] {
        let (status, body) = get_json(&app, &path).await;
        assert_eq!(status, StatusCode::NOT_FOUND, "{path}: {body}");
        assert_eq!(error_code(&body), "not_found");
    }
    for query in
        ["limit=0", "limit=1001", "offset=-1", "partition=-1", "partition=abc", "partition=999", "limit=x", "foo=1"]
    {
        let (status, body) = get_json(&app, &format!("/admin/dlt/{DLT}?{query}")).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{query}: {body}");
        assert_eq!(error_code(&body), "bad_request", "{query}");
    }
}

fn quick_retry(c: &mut tally_engine::Config) {
    c.ledger.retry = RetryConfig {
        max_retries: 2,
        initial: std::time::Duration::from_millis(100),
        multiplier: 2.0,
        max: std::time::Duration::from_millis(400),
    };
    // Lock waits fail fast: the statement and lock timeouts.
    c.database.statement_timeout = std::time::Duration::from_millis(500);
    c.http.admin_token = tally_engine::config::Secret::new(TOKEN);
}

/// A transfer exhausts its retries while its source account is locked and is
/// dead-lettered; after the lock is released, replaying it settles it exactly once, the
/// copy carries `replayed-from` and no `dlt-*` header, and a second replay is absorbed by
/// the ledger inbox.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exhausted_transfer_replays_and_settles_exactly_once() {
    let (env, app) = spawn_app(quick_retry).await;
    accounts(&env.db, &[("E-A", 100), ("E-B", 0)]).await;
    let mut blocker = env.db.connect().await;
    let tx = blocker.transaction().await.expect("begin");
    tx.execute("SELECT 1 FROM accounts WHERE id = 'E-A' FOR UPDATE", &[]).await.expect("lock E-A");
    let producer = env.upstream();
    let event = analyzed(Uuid::new_v4(), "E-A", "E-B", 10);
    env.db.record_analyzed(&[&event]).await;
    let (partition, offset) = produce_analyzed(&producer, "E-A", event.to_string().as_bytes()).await;
    wait_committed_past(env.bootstrap(), partition, offset).await;
    tx.rollback().await.expect("release E-A");
    wait_dlt_count(&app, 1).await;
    let (_, body) = get_json(&app, &format!("/admin/dlt/{DLT}")).await;
    let dead = &body["records"][0];
    assert_eq!(dead["dlt"]["exceptionKind"], "exhausted", "{dead}");
    assert_eq!(dead["dlt"]["attempts"], 3);
    assert_eq!(dead["dlt"]["originalOffset"], offset);
    assert_eq!(balance(&env.db, "E-A").await, 100, "nothing applied yet");
    assert_eq!(env.db.transfer_postings().await, 0);
    let dlt_offset = dead["offset"].as_i64().expect("offset");
    let dlt_partition = dead["partition"].as_i64().expect("partition");

    let (status, replayed) = replay(&app, Some(TOKEN), DLT, None).await;
    assert_eq!(status, StatusCode::OK, "{replayed}");
    assert_eq!(replayed["replayed"], 1, "{replayed}");
    let r = &replayed["records"][0];
    assert_eq!((r["partition"].as_i64(), r["offset"].as_i64()), (Some(dlt_partition), Some(dlt_offset)));
    assert_eq!(r["originalTopic"], ANALYZED);
    assert_eq!(r["originalPartition"], partition, "back to the original partition");
    let copy_offset = r["replayedOffset"].as_i64().expect("replayedOffset");
    wait_committed_past(env.bootstrap(), partition, copy_offset).await;
    assert_eq!(balance(&env.db, "E-A").await, 90);
    assert_eq!(balance(&env.db, "E-B").await, 10);
    assert_eq!(env.db.transfer_postings().await, 2, "one debit, one credit");

    // The copy on transfers.analyzed: original key, value and headers, replayed-from, no dlt-*.
    let records = read_topic(env.bootstrap(), ANALYZED, Deadline::secs(30)).await.expect("read transfers.analyzed");
    let original: &KafkaRecord =
        records.iter().find(|k| k.offset == offset && k.partition == partition).expect("original");
    let copy: &KafkaRecord =
        records.iter().find(|k| k.offset == copy_offset && k.partition == partition).expect("copy");
    assert_eq!(copy.key.as_deref(), Some("E-A"));
    assert_eq!(copy.payload, original.payload);
    assert_eq!(copy.header("event-id"), original.header("event-id"));
    assert_eq!(copy.header("event-type"), Some("TransferAnalyzed"));
    assert_eq!(copy.header("replayed-from"), Some(format!("{DLT}/{dlt_partition}/{dlt_offset}").as_str()));
    assert!(copy.headers.iter().all(|(k, _)| !k.starts_with("dlt-")), "{:?}", copy.headers);

    // Replaying again: the DLT still holds the record; the ledger inbox absorbs the copy.
    wait_dlt_count(&app, 1).await;
    let (status, again) = replay(&app, Some(TOKEN), DLT, Some(json!({}))).await;
    assert_eq!(status, StatusCode::OK, "{again}");
    assert_eq!(again["replayed"], 1);
    let second = again["records"][0]["replayedOffset"].as_i64().expect("replayedOffset");
    wait_committed_past(env.bootstrap(), partition, second).await;
    assert_eq!(env.db.transfer_postings().await, 2, "settled once");
    assert_eq!(balance(&env.db, "E-A").await, 90);
    assert_eq!(balance(&env.db, "E-B").await, 10);
    let metrics = app.metrics().await;
    assert_eq!(metric_value(&metrics, r#"tally_dlt_replayed_total{topic="transfers.analyzed-dlt"}"#), Some(2.0));
    assert_eq!(metric_value(&metrics, r#"tally_records_total{outcome="duplicate",pipeline="ledger"}"#), Some(1.0));
    let (status, check) = get_json(&app, "/admin/ledger/check").await;
    assert_eq!(status, StatusCode::OK, "{check}");
}

/// Replay is a state-changing admin operation: 401 without a token, 403 with a wrong one,
/// 200 with the right one; with no token configured it is refused (403).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replay_requires_the_admin_token() {
    let (env, app) = spawn_app(|c| c.http.admin_token = tally_engine::config::Secret::new(TOKEN)).await;
    let (status, body) = replay(&app, None, DLT, None).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED, "{body}");
    assert_eq!(error_code(&body), "unauthorized");
    let (status, body) = replay(&app, Some("wrong-token"), DLT, None).await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{body}");
    assert_eq!(error_code(&body), "forbidden");
    let (status, body) = replay(&app, Some(TOKEN), DLT, None).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body, json!({"replayed": 0, "records": [], "logged": true}));
    // Authorized, but not a DLT topic of this configuration / not a valid body.
    let (status, body) = replay(&app, Some(TOKEN), ANALYZED, None).await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{body}");
    let (status, body) = replay(&app, Some(TOKEN), DLT, Some(json!({"fromOffset": 5, "toOffset": 1}))).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    let (status, body) = replay(&app, Some(TOKEN), DLT, Some(json!({"partitions": 1}))).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    app.stop().await;

    let open = env.spawn(|_| {}).await;
    let (status, body) = replay(&open, Some(TOKEN), DLT, None).await;
    assert_eq!(status, StatusCode::FORBIDDEN, "no token configured: {body}");
    assert_eq!(error_code(&body), "forbidden");
    let (status, _) = replay(&open, None, DLT, None).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
}

/// DLT records as the supervisor writes them, placed directly on the DLT.
async fn dead_letter(producer: &FutureProducer, partition: i32, key: &str, original_offset: i64) -> i64 {
    let (original_partition, offset) = (partition.to_string(), original_offset.to_string());
    let payload = format!("{{\"n\":{original_offset}}}");
    harness::produce(
        producer,
        DLT,
        Some(partition),
        key,
        payload.as_bytes(),
        &[
            ("event-type", "TransferAnalyzed"),
            ("dlt-original-topic", ANALYZED),
            ("dlt-original-partition", &original_partition),
            ("dlt-original-offset", &offset),
            ("dlt-original-timestamp", "1700000000000"),
            ("dlt-consumer-group", GROUP),
            ("dlt-exception-kind", "poison"),
            ("dlt-exception-message", "test"),
            ("dlt-attempts", "1"),
        ],
    )
    .await
    .1
}

fn replayed_from(records: &[KafkaRecord]) -> Vec<String> {
    records.iter().filter_map(|r| r.header("replayed-from").map(str::to_owned)).collect()
}

/// A replay body selects by partition and inclusive offset range, or by key; only those
/// records are republished, in offset order. A selection holding a record without its
/// origin headers replays nothing (409).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replay_selects_by_partition_offsets_and_key() {
    // No ledger: the copies stay on transfers.analyzed for inspection.
    let (env, app) = spawn_app(|c| {
        c.pipelines.set("ledger", false);
        c.http.admin_token = tally_engine::config::Secret::new(TOKEN);
    })
    .await;
    let producer = producer(env.bootstrap());
    for i in 0..5 {
        let key = if i % 2 == 0 { "K-1" } else { "K-2" };
        dead_letter(&producer, 0, key, 100 + i).await;
    }
    dead_letter(&producer, 1, "K-3", 200).await;
    dead_letter(&producer, 1, "K-3", 201).await;

    let (status, body) =
        replay(&app, Some(TOKEN), DLT, Some(json!({"partition": 0, "fromOffset": 1, "toOffset": 3}))).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["replayed"], 3);
    assert_eq!(offsets(&body), [(0, 1), (0, 2), (0, 3)]);
    let copies = read_topic(env.bootstrap(), ANALYZED, Deadline::secs(30)).await.expect("read");
    assert_eq!(replayed_from(&copies), [format!("{DLT}/0/1"), format!("{DLT}/0/2"), format!("{DLT}/0/3")]);
    assert!(copies.iter().all(|c| c.partition == 0), "original partition kept");
    let payloads: Vec<Value> = copies.iter().map(KafkaRecord::payload_json).collect();
    assert_eq!(payloads, [json!({"n": 101}), json!({"n": 102}), json!({"n": 103})]);

    let (status, body) = replay(&app, Some(TOKEN), DLT, Some(json!({"key": "K-3"}))).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(offsets(&body), [(1, 0), (1, 1)]);
    let (status, body) = replay(&app, Some(TOKEN), DLT, Some(json!({"fromOffset": 4}))).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(offsets(&body), [(0, 4)], "fromOffset applies to every partition");
    let (status, body) = replay(&app, Some(TOKEN), DLT, Some(json!({"key": "K-2", "toOffset": 2}))).await;
    assert_eq!(offsets(&body), [(0, 1)], "{status} {body}");
    let copies = read_topic(env.bootstrap(), ANALYZED, Deadline::secs(30)).await.expect("read");
    assert_eq!(copies.len(), 7);
    assert_eq!(
        replayed_from(&copies.iter().filter(|c| c.partition == 1).cloned().collect::<Vec<_>>()),
        [format!("{DLT}/1/0"), format!("{DLT}/1/1")]
    );

    // A record that lacks its origin: nothing of that selection is replayed.
    harness::produce(&producer, DLT, Some(2), "K-4", b"{}", &[]).await;
    dead_letter(&producer, 2, "K-4", 300).await;
    let (status, body) = replay(&app, Some(TOKEN), DLT, Some(json!({"partition": 2}))).await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    assert_eq!(error_code(&body), "dlt_record_not_replayable");
    let copies = read_topic(env.bootstrap(), ANALYZED, Deadline::secs(30)).await.expect("read");
    assert_eq!(copies.len(), 7, "nothing replayed");
    let metrics = app.metrics().await;
    assert_eq!(metric_value(&metrics, r#"tally_dlt_replayed_total{topic="transfers.analyzed-dlt"}"#), Some(7.0));
}

async fn replay_query(app: &TestApp, topic: &str, query: &str, body: Option<Value>) -> (StatusCode, Value) {
    let mut req = app.client.post(format!("{}/admin/dlt/{topic}/replay{query}", app.admin_url)).bearer_auth(TOKEN);
    if let Some(b) = body {
        req = req.json(&b);
    }
    let res = app.send(req).await;
    let status = res.status();
    (status, json_body(res).await)
}

/// A dry run reports what a replay would republish and, per key, how many newer records
/// of that key the consumer group already processed (the replayed copy is applied after
/// them); it produces nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replay_dry_run_reports_newer_processed_records_per_key_and_produces_nothing() {
    let (env, app) = spawn_app(|c| c.http.admin_token = tally_engine::config::Secret::new(TOKEN)).await;
    accounts(&env.db, &[("DR-A", 10_000), ("DR-B", 10_000), ("DR-Z", 0)]).await;
    let producer = env.upstream();
    let (p, poison) = produce_analyzed(&producer, "DR-A", b"{not json").await;
    let on_p = |key: &'static str, amount: i64| {
        let producer = &producer;
        async move {
            let event = analyzed(Uuid::new_v4(), key, "DR-Z", amount);
            producer.analyzed(&event, Some(p)).await.1
        }
    };
    on_p("DR-A", 10).await;
    on_p("DR-B", 20).await;
    let last = on_p("DR-A", 30).await;
    wait_committed_past(env.bootstrap(), p, last).await;
    wait_dlt_count(&app, 1).await;
    // Paused: a later record of the key is not processed, so it is not counted.
    let res =
        app.send(app.client.post(format!("{}/admin/pipelines/ledger/pause", app.admin_url)).bearer_auth(TOKEN)).await;
    assert_eq!(res.status(), StatusCode::OK);
    on_p("DR-A", 40).await;

    let (status, body) = replay_query(&app, DLT, "?dryRun=true", None).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["dryRun"], true, "{body}");
    assert_eq!(body["replayed"], 0, "{body}");
    assert_eq!(body["wouldReplay"], 1, "{body}");
    let record = &body["records"][0];
    assert_eq!(record["originalTopic"], ANALYZED, "{body}");
    assert_eq!(record["originalPartition"], p, "{body}");
    assert_eq!(record["originalOffset"], poison, "{body}");
    assert_eq!(record["key"], "DR-A", "{body}");
    assert_eq!(record["newerProcessedOfKey"], 2, "{body}");
    assert_eq!(
        body["keys"],
        json!([{"originalTopic": ANALYZED, "originalPartition": p, "key": "DR-A", "records": 1,
                "newerProcessed": 2, "consumerGroup": GROUP, "committedOffset": last + 1}]),
        "{body}"
    );
    let copies = read_topic(env.bootstrap(), ANALYZED, Deadline::secs(30)).await.expect("read");
    assert!(copies.iter().all(|c| c.header("replayed-from").is_none()), "a dry run produces nothing");
    let (status, body) = replay_query(&app, DLT, "?dryRun=false", None).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["replayed"], 1, "{body}");
    let (status, body) = replay_query(&app, DLT, "?dryRun=maybe", None).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
}

/// Rows as `store_dead_letter` writes them (the durable fallback of the DLT topics).
async fn insert_dead_letter(db: &TestDb, partition: i32, offset: i64, key: &str, payload: &Value) -> i64 {
    let headers = json!([{"key": "event-type", "value": "VHJhbnNmZXJBbmFseXplZA=="}, {"key": "empty", "value": null}]);
    let row = db
        .query(
            "INSERT INTO dead_letters (original_topic, original_partition, original_offset, original_timestamp, \
             consumer_group, exception_kind, exception_message, attempts, record_key, payload, headers, dlt_error) \
             VALUES ($1, $2, $3, 1700000000000, $4, 'poison', 'undecodable', 1, $5, $6, $7::text::jsonb, 'Broker: Message size too large') \
             RETURNING id",
            &[&ANALYZED, &partition, &offset, &GROUP, &key.as_bytes(), &payload.to_string().into_bytes(), &headers.to_string()],
        )
        .await;
    row[0].get(0)
}

/// The `dead_letters` table is listed, browsed and replayed like the DLT topics, at
/// `/admin/dlt/dead_letters`: a replay produces to the original topic and partition with
/// `replayed-from: dead_letters/<id>` and marks the row replayed; replayed rows are left
/// out of later replays unless asked for.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dead_letters_table_is_listed_browsed_and_replayed() {
    let (env, app) = spawn_app(|c| {
        c.pipelines.set("ledger", false);
        c.http.admin_token = tally_engine::config::Secret::new(TOKEN);
    })
    .await;
    let first = insert_dead_letter(&env.db, 3, 41, "DL-1", &json!({"n": 1})).await;
    let second = insert_dead_letter(&env.db, 5, 42, "DL-2", &json!({"n": 2})).await;

    let (status, listing) = get_json(&app, "/admin/dlt").await;
    assert_eq!(status, StatusCode::OK, "{listing}");
    assert_eq!(
        listing["deadLetters"],
        json!({"table": "dead_letters", "records": 2, "notReplayed": 2,
               "byTopic": [{"originalTopic": ANALYZED, "records": 2, "notReplayed": 2}]}),
        "{listing}"
    );

    let res = app.send(app.client.get(format!("{}/admin/dlt/dead_letters", app.admin_url)).bearer_auth(TOKEN)).await;
    assert_eq!(res.status(), StatusCode::OK);
    let page = json_body(res).await;
    assert_eq!(page["count"], 2, "{page}");
    let r = &page["records"][0];
    assert_eq!(r["id"], first, "{page}");
    assert_eq!(r["key"], "DL-1");
    assert_eq!(r["payload"], json!({"n": 1}));
    assert_eq!(r["payloadEncoding"], "json");
    assert_eq!(r["dlt"]["originalTopic"], ANALYZED);
    assert_eq!(r["dlt"]["originalPartition"], 3);
    assert_eq!(r["dlt"]["originalOffset"], 41);
    assert_eq!(r["dlt"]["exceptionKind"], "poison");
    assert_eq!(r["dlt"]["consumerGroup"], GROUP);
    assert_eq!(r["dltError"], "Broker: Message size too large");
    assert_eq!(r["replayedAt"], Value::Null);
    assert_eq!(r["headers"][0], json!({"key": "event-type", "value": "TransferAnalyzed", "encoding": "utf8"}));
    let res = app
        .send(app.client.get(format!("{}/admin/dlt/dead_letters?after={first}", app.admin_url)).bearer_auth(TOKEN))
        .await;
    let page = json_body(res).await;
    assert_eq!(page["records"].as_array().map(Vec::len), Some(1), "{page}");
    assert_eq!(page["records"][0]["id"], second);

    let (status, body) = replay_query(&app, "dead_letters", "?dryRun=true", Some(json!({"ids": [first]}))).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["wouldReplay"], 1, "{body}");
    let (status, body) = replay_query(&app, "dead_letters", "", Some(json!({"ids": [first]}))).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["replayed"], 1, "{body}");
    assert_eq!(body["records"][0]["id"], first, "{body}");
    let copies = read_topic(env.bootstrap(), ANALYZED, Deadline::secs(30)).await.expect("read");
    assert_eq!(copies.len(), 1);
    let copy = &copies[0];
    assert_eq!(copy.partition, 3, "the original partition");
    assert_eq!(copy.payload_json(), json!({"n": 1}));
    assert_eq!(copy.header("event-type"), Some("TransferAnalyzed"));
    assert_eq!(copy.header("replayed-from"), Some(format!("dead_letters/{first}").as_str()));
    let replayed_at = env
        .db
        .scalar_i64("SELECT count(*) FROM dead_letters WHERE replayed_at IS NOT NULL AND id = $1", &[&first])
        .await;
    assert_eq!(replayed_at, 1, "the row is marked replayed");

    // Everything not yet replayed: only the second row.
    let (status, body) = replay_query(&app, "dead_letters", "", None).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["replayed"], 1, "{body}");
    assert_eq!(body["records"][0]["id"], second, "{body}");
    let (_, listing) = get_json(&app, "/admin/dlt").await;
    assert_eq!(listing["deadLetters"]["notReplayed"], 0, "{listing}");
    let (status, body) = replay_query(&app, "dead_letters", "", Some(json!({"includeReplayed": true}))).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["replayed"], 2, "{body}");
}
