//! Black-box tests of the intake: transfers and accounts written with their outbox row in
//! one transaction, idempotency keys, bad requests that write nothing, and the health,
//! readiness and metrics endpoints. The publishing of the outbox is `outbox`'s.
//!
//! Broker: every test runs on the embedded broker, librdkafka's mock cluster (3 brokers,
//! in this process), one per test, created by the harness so that it outlives
//! daemon restarts. Database: a fresh PostgreSQL database per test.
#![allow(clippy::expect_used)] // tests: a failed expectation is a failed test, with its message

use reqwest::StatusCode;
use serde_json::{json, Value};
use std::collections::HashSet;
use tally_integration_tests::{
    assert_error, json_body, metric_value, spawn_app, wait_for_records, wait_until, Deadline, KafkaRecord, TestApp,
    TestDb, TestEnv,
};

pub(crate) const TOPIC: &str = "transfers.requested";
pub(crate) const TRACEPARENT: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

pub(crate) fn transfer(source: &str, destination: &str, amount: i64) -> Value {
    json!({ "sourceAccount": source, "destinationAccount": destination, "amountCents": amount, "currency": "BRL" })
}

/// POSTs a valid transfer and returns its JSON body (asserting 201).
pub(crate) async fn create_transfer(app: &TestApp, source: &str, destination: &str, amount: i64) -> Value {
    let res = app.post_json("/transfers", &transfer(source, destination, amount)).await;
    assert_eq!(res.status(), StatusCode::CREATED, "POST /transfers");
    json_body(res).await
}

/// No transfer request was written (an opening balance's issuance may have been).
async fn assert_no_transfer_rows(db: &TestDb, case: &str) {
    assert_eq!(
        db.scalar_i64("SELECT count(*) FROM transfers WHERE kind = 'transfer'", &[]).await,
        0,
        "{case}: transfers rows"
    );
    assert_eq!(db.count("outbox_events").await, 0, "{case}: outbox rows");
}

/// A W3C trace context `traceparent` (version 00): `00-<32 hex>-<16 hex>-<2 hex>`,
/// lowercase, ids not all zero.
pub(crate) fn is_w3c_traceparent(v: &str) -> bool {
    let parts: Vec<&str> = v.split('-').collect();
    let hex = |s: &str, n: usize| s.len() == n && s.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
    parts.len() == 4
        && parts[0] == "00"
        && hex(parts[1], 32)
        && parts[1].bytes().any(|b| b != b'0')
        && hex(parts[2], 16)
        && parts[2].bytes().any(|b| b != b'0')
        && hex(parts[3], 2)
}

pub(crate) async fn wait_until_no_pending(db: &TestDb, deadline: Deadline) {
    wait_until("every outbox row is marked published", deadline, || async {
        match db.pending_outbox().await {
            0 => Ok(()),
            n => Err(format!("{n} rows pending")),
        }
    })
    .await;
}

/// Waits until `topic` holds a record for every event id of `ids` (duplicates allowed).
pub(crate) async fn wait_for_event_ids(bootstrap: &str, ids: &HashSet<String>, deadline: Deadline) -> Vec<KafkaRecord> {
    wait_for_records(bootstrap, TOPIC, deadline, |records| {
        let seen: HashSet<&str> = records.iter().filter_map(|r| r.header("event-id")).collect();
        let missing = ids.iter().filter(|id| !seen.contains(id.as_str())).count();
        if missing == 0 {
            Ok(())
        } else {
            Err(format!("{missing} of {} event ids not on {TOPIC} yet ({} records)", ids.len(), records.len()))
        }
    })
    .await
}

// Broker: embedded mock cluster, shared by both daemons of the test (restart).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transfer_and_outbox_row_commit_together_and_stay_pending_until_a_publisher_runs() {
    let env = TestEnv::new().await;
    let app = env.spawn(|c| c.pipelines.set("outbox", false)).await;
    env.db.open_accounts(&["acc-a"]).await;

    let res = app.post_json("/transfers", &transfer("acc-a", "acc-b", 1234)).await;
    assert_eq!(res.status(), StatusCode::CREATED);
    let location = res.headers().get("location").and_then(|v| v.to_str().ok()).map(str::to_owned);
    let created = json_body(res).await;
    let id = created["id"].as_str().expect("transfer id").to_owned();
    assert_eq!(location.as_deref(), Some(format!("/transfers/{id}").as_str()));
    assert_eq!(created["status"], "PENDING");
    assert_eq!(created["sourceAccount"], "acc-a");
    assert_eq!(created["destinationAccount"], "acc-b");
    assert_eq!(created["amountCents"], 1234);
    assert_eq!(created["currency"], "BRL");
    assert_eq!(created["rejectionReason"], Value::Null);

    // Both rows exist, once each, and the outbox row describes the transfer.
    assert_eq!(env.db.count("transfers").await, 1);
    assert_eq!(env.db.count("outbox_events").await, 1);
    let rows = env
        .db
        .query(
            "SELECT id::text, topic::text, key::text, event_type::text, payload, published_at IS NULL FROM outbox_events",
            &[],
        )
        .await;
    let row = &rows[0];
    let event_id: String = row.get(0);
    assert_eq!(row.get::<_, String>(1), TOPIC);
    assert_eq!(row.get::<_, String>(2), "acc-a");
    assert_eq!(row.get::<_, String>(3), "TransferRequested");
    let payload: Value = serde_json::from_str(&row.get::<_, String>(4)).expect("outbox payload is JSON");
    assert_eq!(payload["eventId"], event_id.as_str());
    assert_eq!(payload["transferId"], id.as_str());
    assert_eq!(payload["sourceAccount"], "acc-a");
    assert_eq!(payload["destinationAccount"], "acc-b");
    assert_eq!(payload["amountCents"], 1234);
    assert_eq!(payload["currency"], "BRL");
    assert!(row.get::<_, bool>(5), "published_at is set although the publisher is disabled");

    // GET answers the same transfer.
    let res = app.get(&format!("/transfers/{id}")).await;
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(json_body(res).await, created);

    // With the publisher disabled the row stays pending, and the admin endpoint says so.
    let backlog = app.outbox_backlog().await;
    assert_eq!(backlog["pending"], 1, "{backlog}");
    let topics = backlog["topics"].as_array().expect("topics array");
    assert!(topics.iter().any(|t| t["topic"] == TOPIC && t["pending"] == 1), "{backlog}");
    assert_eq!(env.db.pending_outbox().await, 1);
    app.stop().await;

    // Restart with the publisher on: same database, same broker.
    let app = env.spawn(|_| {}).await;
    wait_until_no_pending(&env.db, Deadline::DEFAULT).await;
    let records = wait_for_event_ids(&app.bootstrap, &HashSet::from([event_id.clone()]), Deadline::DEFAULT).await;
    let record = records.iter().find(|r| r.header("event-id") == Some(event_id.as_str())).expect("the record");
    assert_eq!(record.payload_json()["transferId"], id.as_str());
    assert_eq!(app.outbox_backlog().await["pending"], 0);
}

// Broker: embedded mock cluster (publisher disabled: the test is about HTTP and rows).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idempotency_key_replays_the_same_request_and_refuses_a_different_one() {
    let (env, app) = spawn_app(|c| c.pipelines.set("outbox", false)).await;
    let post = |body: Value, key: &'static str| {
        app.send(app.client.post(format!("{}/transfers", app.intake_url)).header("Idempotency-Key", key).json(&body))
    };
    env.db.open_accounts(&["acc-a"]).await;

    let res = post(transfer("acc-a", "acc-b", 500), "key-1").await;
    assert_eq!(res.status(), StatusCode::CREATED);
    let first = json_body(res).await;

    let res = post(transfer("acc-a", "acc-b", 500), "key-1").await;
    assert_eq!(res.status(), StatusCode::OK, "replay of the same request");
    let replay = json_body(res).await;
    assert_eq!(replay["id"], first["id"]);
    assert_eq!(replay, first, "a replay answers the original transfer");
    assert_eq!(env.db.count("transfers").await, 1);
    assert_eq!(env.db.count("outbox_events").await, 1);

    let res = post(transfer("acc-a", "acc-b", 501), "key-1").await;
    assert_error(res, StatusCode::CONFLICT, "idempotency_key_conflict", "same key, different amount").await;
    let res = post(transfer("acc-a", "acc-c", 500), "key-1").await;
    assert_error(res, StatusCode::CONFLICT, "idempotency_key_conflict", "same key, different destination").await;
    assert_eq!(env.db.count("transfers").await, 1);
    assert_eq!(env.db.count("outbox_events").await, 1);

    // Another key is another transfer.
    let res = post(transfer("acc-a", "acc-b", 500), "key-2").await;
    assert_eq!(res.status(), StatusCode::CREATED);
    assert_ne!(json_body(res).await["id"], first["id"]);
    assert_eq!(env.db.count("transfers").await, 2);
    assert_eq!(env.db.count("outbox_events").await, 2);
}

// Broker: embedded mock cluster (not exercised: nothing valid is written).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_transfer_requests_get_json_errors_and_write_nothing() {
    let (env, app) = spawn_app(|_| {}).await;
    let json = "application/json";
    let valid = r#""sourceAccount":"acc-a","destinationAccount":"acc-b","currency":"BRL""#;

    let cases: Vec<(&str, String, StatusCode, &str)> = vec![
        ("malformed JSON", r#"{"sourceAccount": "acc-a","#.into(), StatusCode::BAD_REQUEST, "invalid_body"),
        ("not an object", "[1,2,3]".into(), StatusCode::BAD_REQUEST, "invalid_body"),
        (
            "missing field",
            r#"{"sourceAccount":"acc-a","destinationAccount":"acc-b","amountCents":100}"#.into(),
            StatusCode::BAD_REQUEST,
            "invalid_body",
        ),
        (
            "unknown field",
            format!(r#"{{{valid},"amountCents":100,"memo":"x"}}"#),
            StatusCode::BAD_REQUEST,
            "invalid_body",
        ),
        ("amount 0", format!(r#"{{{valid},"amountCents":0}}"#), StatusCode::UNPROCESSABLE_ENTITY, "validation_failed"),
        (
            "amount negative",
            format!(r#"{{{valid},"amountCents":-5}}"#),
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
        ("amount as a string", format!(r#"{{{valid},"amountCents":"100"}}"#), StatusCode::BAD_REQUEST, "invalid_body"),
    ];
    for (case, body, status, code) in cases {
        let res = app.post_raw("/transfers", json, body).await;
        assert_error(res, status, code, case).await;
    }

    let long = "a".repeat(33);
    let json_cases: Vec<(&str, Value)> = vec![
        (
            "currency lowercase",
            json!({"sourceAccount":"acc-a","destinationAccount":"acc-b","amountCents":1,"currency":"brl"}),
        ),
        (
            "currency of 2 letters",
            json!({"sourceAccount":"acc-a","destinationAccount":"acc-b","amountCents":1,"currency":"BR"}),
        ),
        ("source equals destination", transfer("acc-a", "acc-a", 1)),
        ("source of 33 characters", transfer(&long, "acc-b", 1)),
        ("destination of 33 characters", transfer("acc-a", &long, 1)),
        ("empty source", transfer("", "acc-b", 1)),
        ("empty destination", transfer("acc-a", "", 1)),
    ];
    for (case, body) in json_cases {
        let res = app.post_json("/transfers", &body).await;
        assert_error(res, StatusCode::UNPROCESSABLE_ENTITY, "validation_failed", case).await;
    }

    let body = transfer("acc-a", "acc-b", 1).to_string();
    let res = app.post_raw("/transfers", "text/plain", body).await;
    assert_error(res, StatusCode::UNSUPPORTED_MEDIA_TYPE, "unsupported_media_type", "text/plain body").await;

    let limit = app.config.http.body_limit_bytes;
    let oversized = transfer(&"a".repeat(limit + 1024), "acc-b", 1).to_string();
    assert!(oversized.len() > limit);
    let res = app.post_raw("/transfers", json, oversized).await;
    assert_error(res, StatusCode::PAYLOAD_TOO_LARGE, "payload_too_large", "body over http.body_limit_bytes").await;

    let res = app.get("/transfers/not-a-uuid").await;
    assert_error(res, StatusCode::BAD_REQUEST, "bad_request", "malformed transfer id").await;
    let res = app.get(&format!("/transfers/{}", uuid::Uuid::new_v4())).await;
    assert_error(res, StatusCode::NOT_FOUND, "not_found", "unknown transfer").await;
    let res = app.get("/no-such-route").await;
    assert_error(res, StatusCode::NOT_FOUND, "not_found", "unknown route").await;
    // The path of `GET /transfers/{id}`, with another method: 405 with `Allow`.
    let res = app.post_raw("/transfers/extra", json, transfer("acc-a", "acc-b", 1).to_string()).await;
    assert_eq!(res.headers().get("allow").and_then(|v| v.to_str().ok()), Some("GET"), "Allow");
    assert_error(res, StatusCode::METHOD_NOT_ALLOWED, "method_not_allowed", "POST to a transfer's path").await;
    let res = app.post_raw("/transfers/extra/more", json, "{}").await;
    assert_error(res, StatusCode::NOT_FOUND, "not_found", "unknown route under /transfers").await;

    assert_no_transfer_rows(&env.db, "after every bad request").await;
}

// Broker: embedded mock cluster (not exercised).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn accounts_are_validated_unique_and_readable() {
    let (env, app) = spawn_app(|_| {}).await;

    let res =
        app.post_json("/accounts", &json!({"id": "acc-1", "currency": "BRL", "initialBalanceCents": 10_000})).await;
    assert_eq!(res.status(), StatusCode::CREATED);
    assert_eq!(
        res.headers().get("location").and_then(|v| v.to_str().ok()),
        Some("/accounts/acc-1"),
        "Location of the new account"
    );
    assert_eq!(
        json_body(res).await,
        json!({"id": "acc-1", "currency": "BRL", "balanceCents": 10_000, "owner": null}),
        "opened by the anonymous caller"
    );

    let res = app.post_json("/accounts", &json!({"id": "acc-1", "currency": "BRL", "initialBalanceCents": 5})).await;
    assert_error(res, StatusCode::CONFLICT, "account_exists", "duplicate account").await;

    let long = "a".repeat(33);
    let invalid: Vec<(&str, Value, StatusCode, &str)> = vec![
        (
            "id of 33 characters",
            json!({"id": long, "currency": "BRL", "initialBalanceCents": 1}),
            StatusCode::UNPROCESSABLE_ENTITY,
            "validation_failed",
        ),
        (
            "empty id",
            json!({"id": "", "currency": "BRL", "initialBalanceCents": 1}),
            StatusCode::UNPROCESSABLE_ENTITY,
            "validation_failed",
        ),
        (
            "lowercase currency",
            json!({"id": "acc-2", "currency": "usd", "initialBalanceCents": 1}),
            StatusCode::UNPROCESSABLE_ENTITY,
            "validation_failed",
        ),
        (
            "negative balance",
            json!({"id": "acc-2", "currency": "BRL", "initialBalanceCents": -1}),
            StatusCode::UNPROCESSABLE_ENTITY,
            "validation_failed",
        ),
        (
            "fractional balance",
            json!({"id": "acc-2", "currency": "BRL", "initialBalanceCents": 1.5}),
            StatusCode::UNPROCESSABLE_ENTITY,
            "validation_failed",
        ),
        ("missing balance", json!({"id": "acc-2", "currency": "BRL"}), StatusCode::BAD_REQUEST, "invalid_body"),
        (
            "unknown field",
            json!({"id": "acc-2", "currency": "BRL", "initialBalanceCents": 1, "owner": "x"}),
            StatusCode::BAD_REQUEST,
            "invalid_body",
        ),
    ];
    for (case, body, status, code) in invalid {
        let res = app.post_json("/accounts", &body).await;
        assert_error(res, status, code, case).await;
    }
    let res =
        app.post_raw("/accounts", "text/plain", r#"{"id":"acc-2","currency":"BRL","initialBalanceCents":1}"#).await;
    assert_error(res, StatusCode::UNSUPPORTED_MEDIA_TYPE, "unsupported_media_type", "text/plain account").await;
    assert_eq!(
        env.db.scalar_i64("SELECT count(*) FROM accounts WHERE kind = 'customer'", &[]).await,
        1,
        "only the first account was written"
    );

    // A zero balance is allowed.
    let res = app.post_json("/accounts", &json!({"id": "acc-0", "currency": "USD", "initialBalanceCents": 0})).await;
    assert_eq!(res.status(), StatusCode::CREATED);

    let res = app.get("/accounts/acc-1").await;
    assert_eq!(res.status(), StatusCode::OK);
    let detail = json_body(res).await;
    assert_eq!(detail["id"], "acc-1");
    assert_eq!(detail["currency"], "BRL");
    assert_eq!(detail["balanceCents"], 10_000, "the duplicate did not change the balance");
    // The opening balance was issued: one credit, of the issuance transfer.
    let postings = detail["postings"].as_array().expect("postings");
    assert_eq!(postings.len(), 1, "{detail}");
    assert_eq!((postings[0]["kind"].as_str(), postings[0]["amountCents"].as_i64()), (Some("C"), Some(10_000)));
    let issuance = app.get(&format!("/transfers/{}", postings[0]["transferId"].as_str().expect("id"))).await;
    let issuance = json_body(issuance).await;
    assert_eq!(
        (issuance["kind"].as_str(), issuance["sourceAccount"].as_str(), issuance["status"].as_str()),
        (Some("issuance"), Some("issuance:BRL"), Some("SETTLED")),
        "{issuance}"
    );

    let res = app.get("/accounts/nobody").await;
    assert_error(res, StatusCode::NOT_FOUND, "not_found", "unknown account").await;
    let res = app.get("/accounts/acc-1?limit=0").await;
    assert_error(res, StatusCode::BAD_REQUEST, "bad_request", "limit 0").await;
    assert_no_transfer_rows(&env.db, "accounts only").await;
}

// Broker: embedded mock cluster.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_readiness_and_metrics() {
    // No antifraud: the one transfer's outbox row stays the only one (once every pipeline
    // is ready, the ledger would otherwise add its TransferRejected row while the gauges
    // are checked).
    let (env, app) = spawn_app(|c| c.pipelines.set("antifraud", false)).await;
    env.db.open_accounts(&["acc-m"]).await;

    let res = app.admin_get("/healthz").await;
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(json_body(res).await["status"], "ok");
    // Ready once every pipeline has its partition assignment (the groups join first).
    let ready = wait_until("readiness with the database and broker up", Deadline::DEFAULT, || async {
        let res = app.admin_get("/readyz").await;
        let status = res.status();
        let body = json_body(res).await;
        if status == StatusCode::OK {
            Ok(body)
        } else {
            Err(format!("{status}: {body}"))
        }
    })
    .await;
    assert_eq!(ready["status"], "ready");

    create_transfer(&app, "acc-m", "acc-n", 1).await;
    let res = app.get("/nowhere").await;
    assert_eq!(res.status(), StatusCode::NOT_FOUND);

    let metrics = app.metrics().await;
    for family in [
        "tally_outbox_pending",
        "tally_outbox_oldest_pending_age_seconds",
        "tally_outbox_published_total",
        "tally_outbox_publish_failures_total",
    ] {
        assert!(metric_value(&metrics, family).is_some(), "{family} missing from /metrics:\n{metrics}");
        assert!(metrics.contains(&format!("# HELP {family} ")), "help text of {family}");
    }
    let created = metric_value(&metrics, r#"tally_http_requests_total{route="/transfers",status="201"}"#);
    assert_eq!(created, Some(1.0), "POST /transfers counted by route and status:\n{metrics}");
    assert!(
        metrics.lines().any(|l| l.starts_with("tally_http_requests_total{") && l.contains(r#"status="404""#)),
        "the 404 is counted:\n{metrics}"
    );
    assert!(metrics.lines().any(|l| l.starts_with("process_")), "process metrics in /metrics:\n{metrics}");

    // The outbox is drained, and the gauges say so.
    wait_until("the outbox gauges show nothing pending", Deadline::DEFAULT, || async {
        let metrics = app.metrics().await;
        match metric_value(&metrics, "tally_outbox_pending") {
            Some(0.0) => Ok(()),
            other => Err(format!("tally_outbox_pending = {other:?}")),
        }
    })
    .await;
    let metrics = app.metrics().await;
    assert_eq!(metric_value(&metrics, "tally_outbox_published_total"), Some(1.0));
    assert_eq!(metric_value(&metrics, "tally_outbox_oldest_pending_age_seconds"), Some(0.0));
}

#[test]
fn traceparent_check_accepts_only_w3c_values() {
    assert!(is_w3c_traceparent(TRACEPARENT));
    assert!(!is_w3c_traceparent("00-00000000000000000000000000000000-00f067aa0ba902b7-01"));
    assert!(!is_w3c_traceparent("00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01"));
    assert!(!is_w3c_traceparent("not a traceparent"));
}

#[test]
fn prometheus_sample_lookup() {
    let text = "# HELP a x\n# TYPE a counter\na 3\nb{route=\"/x\",status=\"200\"} 2\n";
    assert_eq!(metric_value(text, "a"), Some(3.0));
    assert_eq!(metric_value(text, r#"b{route="/x",status="200"}"#), Some(2.0));
    assert_eq!(metric_value(text, "c"), None);
}

/// Sends `head` (a request line and headers, without the blank line) and `body` as one raw
/// HTTP/1.1 request on a new connection, and returns the status code and the body of the
/// answer: for bytes a well-behaved client refuses to send.
async fn raw_http(addr: &str, head: &[u8], body: &str) -> (u16, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(addr).await.expect("connect to the intake");
    let mut request = head.to_vec();
    request
        .extend_from_slice(format!("\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}", body.len()).as_bytes());
    stream.write_all(&request).await.expect("send the raw request");
    let mut answer = Vec::new();
    stream.read_to_end(&mut answer).await.expect("read the raw answer");
    let answer = String::from_utf8_lossy(&answer).into_owned();
    let status = answer.split(' ').nth(1).and_then(|s| s.parse().ok()).unwrap_or(0);
    let body = answer.split_once("\r\n\r\n").map(|(_, b)| b.to_owned()).unwrap_or_default();
    (status, body)
}

// Broker: embedded mock cluster (not exercised: nothing is written).
/// PostgreSQL's text and jsonb cannot hold U+0000: a NUL in any string of an intake body
/// (a field, or a string or key anywhere inside an order's `lines`) is a 422 naming the
/// field, never a 500 from the database, and writes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_nul_in_any_string_of_an_intake_body_is_a_422_naming_the_field() {
    let (env, app) = spawn_app(|c| c.pipelines.set("outbox", false)).await;
    let nul = "A\u{0}B";
    let transfer =
        json!({"sourceAccount": "acc-a", "destinationAccount": "acc-b", "amountCents": 1, "currency": "BRL"});
    let account = json!({"id": "acc-1", "currency": "BRL", "initialBalanceCents": 1});
    let order = json!({"externalReference": "R-1", "customerId": "C-1", "amountCents": 1, "currency": "BRL"});
    let mut cases: Vec<(&str, &str, Value)> = Vec::new();
    for (path, valid) in [("/transfers", &transfer), ("/accounts", &account), ("/orders", &order)] {
        for field in valid.as_object().expect("an object").keys().filter(|k| valid[k.as_str()].is_string()) {
            let mut body = valid.clone();
            body[field.as_str()] = json!(nul);
            cases.push((path, field, body));
        }
    }
    let with_lines = |lines: Value| {
        let mut body = order.clone();
        body["lines"] = lines;
        body
    };
    cases.push(("/orders", "lines", with_lines(json!([{"sku": nul, "qty": 1}]))));
    cases.push(("/orders", "lines", with_lines(json!([{"sku": "A", "note\u{0}": "x"}]))));
    cases.push(("/orders", "lines", with_lines(json!([nul]))));
    cases.push(("/orders", "lines", with_lines(json!([{"sku": "A", "parts": [{"tags": ["ok", nul]}]}]))));
    for (path, field, body) in cases {
        let case = format!("{path} with a NUL in {field}: {body}");
        let res = app.post_json(path, &body).await;
        let status = res.status();
        let answer = json_body(res).await;
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{case}: status, answer {answer}");
        assert_eq!(answer["error"]["code"], "validation_failed", "{case}: {answer}");
        let message = answer["error"]["message"].as_str().unwrap_or("");
        assert!(message.contains(field), "{case}: the message names the field: {message:?}");
    }

    // The same order without the NUL is taken: the refusals were about the NUL alone.
    let res = app.post_json("/orders", &with_lines(json!([{"sku": "A", "parts": [{"tags": ["ok"]}]}]))).await;
    assert_eq!(res.status(), StatusCode::CREATED, "the order without a NUL");
    env.db.batch("DELETE FROM outbox_events; DELETE FROM orders").await;

    // A well-behaved client cannot send a NUL in a header; a raw one is refused by the
    // HTTP parser before any handler, so it cannot reach the database either.
    let addr = app.intake_url.trim_start_matches("http://");
    let head = b"POST /transfers HTTP/1.1\r\nHost: tally\r\nContent-Type: application/json\r\nIdempotency-Key: k\0ey";
    let (status, answer) = raw_http(addr, head, &transfer.to_string()).await;
    assert_eq!(status, 400, "a NUL in Idempotency-Key: {answer}");
    // Bytes a header may carry but a key may not (obs-text) get the JSON error of the key rule.
    let head = b"POST /transfers HTTP/1.1\r\nHost: tally\r\nContent-Type: application/json\r\nIdempotency-Key: k\xffey";
    let (status, answer) = raw_http(addr, head, &transfer.to_string()).await;
    assert_eq!(status, 400, "a non-ASCII byte in Idempotency-Key: {answer}");
    let answer: Value = serde_json::from_str(&answer).unwrap_or_else(|e| panic!("{e}: {answer}"));
    assert_eq!(answer["error"]["code"], "bad_request", "{answer}");
    assert!(answer["error"]["message"].as_str().unwrap_or("").contains("Idempotency-Key"), "{answer}");

    // An account id in a path: the NUL arrives percent-encoded.
    let res = app.get("/accounts/A%00B").await;
    assert_error(res, StatusCode::NOT_FOUND, "not_found", "GET /accounts/A%00B").await;

    assert_no_transfer_rows(&env.db, "after every NUL").await;
    assert_eq!(env.db.count("accounts").await, 0, "accounts rows");
    assert_eq!(env.db.count("orders").await, 0, "orders rows");
}
