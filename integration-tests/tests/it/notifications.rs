//! Notifications with non-blocking retry topics, pipeline administration, and admin auth.
//! A local HTTP server in the test plays the webhook receiver.
//!
//! Broker: the embedded broker (librdkafka's mock cluster, 3 brokers, in this process);
//! the log test runs `tally run` as a child process against it.
#![allow(clippy::expect_used)] // tests: a failed expectation is a failed test, with its message

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use reqwest::StatusCode;
use serde_json::{json, Value};
use tally_integration_tests::{
    json_body, metric_value, read_topic, spawn_app, spawn_app_under, under_both_protocols, wait_until, Deadline,
    GroupProtocol, ReceivedCall, TestApp, TestEnv, WebhookReceiver,
};
use uuid::Uuid;

const SECRET: &str = "webhook-s3cret";
const TOKEN: &str = "admin-t0ken-for-tests";

fn notify_config(url: &str) -> impl FnOnce(&mut tally_engine::Config) + '_ {
    move |c: &mut tally_engine::Config| {
        c.notifications.webhook_url = tally_engine::config::SecretUrl::new(url);
        c.notifications.webhook_secret = tally_engine::config::Secret::new(SECRET);
        c.http.admin_token = tally_engine::config::Secret::new(TOKEN);
    }
}

/// Produces a TransferSettled for a new transfer keyed `key`, which the ledger is recorded
/// to have settled; returns (event, offset).
async fn settled(env: &TestEnv, key: &str) -> (Value, i64) {
    let transfer = Uuid::new_v4();
    let event = json!({ "eventId": tally_schema::derived_event_id("settled", transfer), "transferId": transfer,
                        "settledAt": "2026-11-30T00:00:00Z" });
    let offset = settled_event(env, key, &event).await;
    (event, offset)
}

/// Records the settlement of `event`'s transfer and produces `event`, signed, keyed `key`;
/// returns its offset.
async fn settled_event(env: &TestEnv, key: &str, event: &Value) -> i64 {
    let id: Uuid = serde_json::from_value(event["transferId"].clone()).expect("transferId");
    env.db.record_settled(id, key, &format!("{key}-DEST"), 1).await;
    env.upstream().signed("transfers.settled", None, key, event.to_string().as_bytes(), "TransferSettled").await.1
}

fn event_id(call: &ReceivedCall) -> &str {
    call.headers.get("x-tally-event-id").map_or("", String::as_str)
}

fn millis(t: SystemTime) -> i64 {
    t.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as i64)
}

/// The signature the receiver can check: HMAC-SHA256 over the exact body.
fn assert_signed(call: &ReceivedCall) {
    let expected = tally_actors::notify::signature(SECRET, &call.body);
    assert_eq!(call.headers.get("x-tally-signature"), Some(&expected), "signature over the body");
    assert!(expected.starts_with("sha256=") && expected.len() == 7 + 64);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_receiver_failing_twice_gets_the_event_once_on_attempt_three() {
    let receiver = WebhookReceiver::start(|_, n| if n < 2 { 500 } else { 200 }).await;
    let (env, app) = spawn_app(notify_config(&receiver.url)).await;
    let (event, offset) = settled(&env, "N-A").await;
    let id = event["eventId"].as_str().expect("id").to_owned();
    wait_until("delivered", Deadline::DEFAULT, || async {
        let calls = receiver.calls();
        if calls.iter().any(|c| c.status == 200) {
            Ok(())
        } else {
            Err(format!("{} calls", calls.len()))
        }
    })
    .await;
    let calls = receiver.calls();
    assert_eq!(calls.len(), 3, "two failures, then one success, nothing after");
    for (i, call) in calls.iter().enumerate() {
        assert_eq!(event_id(call), id);
        assert_eq!(call.headers.get("x-tally-attempt").map(String::as_str), Some((i + 1).to_string().as_str()));
        assert_eq!(serde_json::from_slice::<Value>(&call.body).expect("json body"), event);
        assert_signed(call);
    }
    // Each retry waited until its record was due: compare timestamps, not durations.
    let retry1 = read_topic(env.bootstrap(), "transfers.settled-retry-1000", Deadline::secs(10)).await.expect("read");
    let retry2 = read_topic(env.bootstrap(), "transfers.settled-retry-2000", Deadline::secs(10)).await.expect("read");
    assert_eq!((retry1.len(), retry2.len()), (1, 1));
    let due1: i64 = retry1[0].header("retry-due-at").expect("due").parse().expect("millis");
    let due2: i64 = retry2[0].header("retry-due-at").expect("due").parse().expect("millis");
    assert!(millis(calls[0].at) < due1 && due1 <= millis(calls[1].at), "attempt 2 after its due time");
    assert!(millis(calls[1].at) < due2 && due2 <= millis(calls[2].at), "attempt 3 after its due time");
    assert!(due2 - millis(calls[1].at) > due1 - millis(calls[0].at) - 200, "the second delay is the longer one");
    assert_eq!(retry1[0].header("retry-attempts"), Some("1"));
    assert_eq!(retry2[0].header("retry-attempts"), Some("2"));
    assert_eq!(retry2[0].header("retry-original-topic"), Some("transfers.settled"));
    assert_eq!(retry2[0].header("retry-original-offset"), Some(offset.to_string().as_str()));
    assert_eq!(retry2[0].key.as_deref(), Some("N-A"));
    let rows = env.db.query("SELECT attempts, response_status FROM notification_deliveries", &[]).await;
    assert_eq!(rows.len(), 1);
    assert_eq!((rows[0].get::<_, i32>(0), rows[0].get::<_, i32>(1)), (3, 200));
    let m = app.metrics().await;
    assert_eq!(metric_value(&m, r#"tally_notification_deliveries_total{outcome="delivered"}"#), Some(1.0));
    assert_eq!(
        metric_value(&m, r#"tally_retry_records_total{attempt="3",topic="transfers.settled-retry-2000"}"#),
        Some(1.0)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_receiver_that_always_fails_leads_to_the_dlt_after_four_attempts() {
    let receiver = WebhookReceiver::start(|_, _| 503).await;
    let (env, app) = spawn_app(notify_config(&receiver.url)).await;
    let (event, offset) = settled(&env, "N-B").await;
    let dlt = wait_until("dead-lettered", Deadline::DEFAULT, || async {
        let r =
            read_topic(env.bootstrap(), "transfers.settled-dlt", Deadline::secs(5)).await.map_err(|e| e.to_string())?;
        if r.is_empty() {
            Err("empty DLT".into())
        } else {
            Ok(r)
        }
    })
    .await;
    assert_eq!(dlt.len(), 1);
    let r = &dlt[0];
    assert_eq!(r.header("dlt-exception-kind"), Some("exhausted"));
    assert_eq!(r.header("dlt-attempts"), Some("4"));
    assert_eq!(r.header("dlt-original-topic"), Some("transfers.settled"));
    assert_eq!(r.header("dlt-original-offset"), Some(offset.to_string().as_str()));
    assert!(r.header("dlt-exception-message").is_some_and(|m| m.contains("503")));
    assert!(r.headers.iter().all(|(k, _)| !k.starts_with("retry-")), "no retry headers in the DLT");
    assert_eq!(r.payload_json(), event);
    assert_eq!(receiver.calls().len(), 4, "four attempts in all");
    assert_eq!(env.db.count("notification_deliveries").await, 0);
    let m = app.metrics().await;
    assert_eq!(metric_value(&m, r#"tally_notification_deliveries_total{outcome="dead_lettered"}"#), Some(1.0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_failing_event_does_not_delay_the_others() {
    let failing_transfer = Uuid::new_v4();
    let failing = tally_schema::derived_event_id("settled", failing_transfer).to_string();
    let marker = failing.clone();
    let receiver =
        WebhookReceiver::start(move |body, _| if String::from_utf8_lossy(body).contains(&marker) { 500 } else { 200 })
            .await;
    let (env, _app) = spawn_app(notify_config(&receiver.url)).await;
    // The failing event first, then others with the same key (so the same partition). Their
    // settlements are recorded before any is produced, so that the six records follow each
    // other within milliseconds, well inside the first retry delay (1 s), however loaded
    // the machine.
    let bad = json!({ "eventId": failing, "transferId": failing_transfer, "settledAt": "2026-11-30T00:00:00Z" });
    let mut events = vec![bad];
    for _ in 0..5 {
        let transfer = Uuid::new_v4();
        events.push(json!({ "eventId": tally_schema::derived_event_id("settled", transfer), "transferId": transfer,
                            "settledAt": "2026-11-30T00:00:00Z" }));
    }
    for event in &events {
        let id: Uuid = serde_json::from_value(event["transferId"].clone()).expect("transferId");
        env.db.record_settled(id, "SAME", "SAME-DEST", 1).await;
    }
    let upstream = env.upstream();
    for event in &events {
        upstream.signed("transfers.settled", None, "SAME", event.to_string().as_bytes(), "TransferSettled").await;
    }
    wait_until("the failing event's second attempt", Deadline::DEFAULT, || async {
        let n = receiver.calls().iter().filter(|c| event_id(c) == failing).count();
        if n >= 2 {
            Ok(())
        } else {
            Err(format!("{n} attempts"))
        }
    })
    .await;
    let calls = receiver.calls();
    let second_attempt = calls.iter().filter(|c| event_id(c) == failing).nth(1).expect("second attempt").at;
    let good: Vec<_> = calls.iter().filter(|c| event_id(c) != failing && c.status == 200).collect();
    assert_eq!(good.len(), 5, "every other event delivered");
    assert!(good.iter().all(|c| c.at < second_attempt), "delivered before the failing one was retried");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_settled_transfer_produces_one_signed_post() {
    let receiver = WebhookReceiver::start(|_, _| 200).await;
    let (_env, app) = spawn_app(notify_config(&receiver.url)).await;
    for (id, balance) in [("W-A", 10_000), ("W-B", 0)] {
        let res =
            app.post_json("/accounts", &json!({ "id": id, "currency": "BRL", "initialBalanceCents": balance })).await;
        assert_eq!(res.status(), StatusCode::CREATED);
    }
    let res = app
        .post_json(
            "/transfers",
            &json!({ "sourceAccount": "W-A", "destinationAccount": "W-B", "amountCents": 100, "currency": "BRL" }),
        )
        .await;
    let transfer = json_body(res).await;
    let calls = first_calls(&receiver, "the settled notification").await;
    tokio::time::sleep(Duration::from_millis(500)).await; // would a second POST arrive?
    let calls = if receiver.calls().len() > calls.len() { receiver.calls() } else { calls };
    assert_eq!(calls.len(), 1, "one POST");
    let body: Value = serde_json::from_slice(&calls[0].body).expect("json");
    assert_eq!(body["transferId"], transfer["id"]);
    assert_eq!(calls[0].headers.get("x-tally-event-type").map(String::as_str), Some("TransferSettled"));
    assert_eq!(
        body["eventId"],
        json!(tally_schema::derived_event_id("settled", serde_json::from_value(transfer["id"].clone()).expect("uuid")))
    );
    assert_signed(&calls[0]);
}

/// A webhook URL with credentials (`user:password@`, a `?token=`) is called with them,
/// while `tally config` shows it redacted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_webhook_url_with_credentials_is_called_with_them() {
    let receiver = WebhookReceiver::start(|_, _| 200).await;
    let authority = receiver.url.trim_start_matches("http://").trim_end_matches("/hook");
    let url = format!("http://hook-user:hook-pa55word@{authority}/hook?token=hook-t0ken&x=1");
    let (env, app) = spawn_app(notify_config(&url)).await;
    assert!(!app.config.to_redacted_toml().contains("hook-pa55word"), "the configuration shows the password");
    let (event, _) = settled(&env, "N-CRED").await;
    let calls = first_calls(&receiver, "the notification").await;
    assert_eq!(event_id(&calls[0]), event["eventId"].as_str().expect("id"));
    assert_eq!(calls[0].request, "POST /hook?token=hook-t0ken&x=1", "the path and query as configured");
    // Basic base64("hook-user:hook-pa55word"): the userinfo goes as HTTP basic auth.
    assert_eq!(
        calls[0].headers.get("authorization").map(String::as_str),
        Some("Basic aG9vay11c2VyOmhvb2stcGE1NXdvcmQ="),
        "the credentials of the userinfo"
    );
    assert_signed(&calls[0]);
}

async fn admin_post(app: &TestApp, path: &str, token: Option<&str>) -> reqwest::Response {
    let mut req = app.client.post(format!("{}{path}", app.admin_url));
    if let Some(t) = token {
        req = req.bearer_auth(t);
    }
    app.send(req).await
}

async fn ledger_status(app: &TestApp) -> Value {
    let all = json_body(app.admin_get("/admin/pipelines").await).await;
    all["pipelines"].as_array().expect("pipelines").iter().find(|p| p["name"] == "ledger").expect("ledger").clone()
}

async fn pause_stops_progress_and_lag_grows_then_resume_drains(protocol: GroupProtocol) {
    let (env, app) = spawn_app_under(protocol, |c| c.http.admin_token = tally_engine::config::Secret::new(TOKEN)).await;
    env.db.fund_accounts(&[("PZ-A", 100_000), ("PZ-B", 0)]).await;
    wait_until("the ledger owns its partitions", Deadline::DEFAULT, || async {
        let s = ledger_status(&app).await;
        if s["partitions"].as_array().is_some_and(|p| p.len() == 12) {
            Ok(())
        } else {
            Err(s.to_string())
        }
    })
    .await;
    let res = admin_post(&app, "/admin/pipelines/ledger/pause", Some(TOKEN)).await;
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(ledger_status(&app).await["paused"], true);
    let upstream = env.upstream();
    for _ in 0..20 {
        let event = json!({ "eventId": Uuid::new_v4(), "transferId": Uuid::new_v4(), "sourceAccount": "PZ-A",
            "destinationAccount": "PZ-B", "amountCents": 10, "currency": "BRL", "score": 1, "analyzedAt": "2026-11-30T00:00:00Z" });
        upstream.analyzed(&event, None).await;
    }
    wait_until("lag grows while paused", Deadline::DEFAULT, || async {
        let s = ledger_status(&app).await;
        let lag: i64 = s["partitions"].as_array().map_or(0, |p| p.iter().filter_map(|p| p["lag"].as_i64()).sum());
        if lag >= 20 {
            Ok(())
        } else {
            Err(format!("lag {lag}"))
        }
    })
    .await;
    assert_eq!(env.db.ledger_finished().await, 0, "no progress while paused");
    let res = admin_post(&app, "/admin/pipelines/ledger/resume", Some(TOKEN)).await;
    assert_eq!(res.status(), StatusCode::OK);
    wait_until("drained after resume", Deadline::DEFAULT, || async {
        let n = env.db.ledger_finished().await;
        if n == 20 {
            Ok(())
        } else {
            Err(format!("{n} processed"))
        }
    })
    .await;
    assert_eq!(ledger_status(&app).await["paused"], false);
    let all = json_body(app.admin_get("/admin/pipelines").await).await;
    let mut names: Vec<&str> =
        all["pipelines"].as_array().expect("list").iter().filter_map(|p| p["name"].as_str()).collect();
    names.sort_unstable();
    assert_eq!(names, ["antifraud", "ledger", "orders", "projection"], "every running stage is listed");
    let res = admin_post(&app, "/admin/pipelines/nope/pause", Some(TOKEN)).await;
    assert_eq!(res.status(), StatusCode::NOT_FOUND);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn state_changing_admin_endpoints_need_the_token() {
    let (env, app) = spawn_app(|c| c.http.admin_token = tally_engine::config::Secret::new(TOKEN)).await;
    let res = admin_post(&app, "/admin/pipelines/ledger/pause", None).await;
    assert_eq!(res.status(), StatusCode::UNAUTHORIZED);
    assert_eq!(json_body(res).await["error"]["code"], "unauthorized");
    let res = admin_post(&app, "/admin/pipelines/ledger/pause", Some("wrong-token")).await;
    assert_eq!(res.status(), StatusCode::FORBIDDEN);
    assert_eq!(json_body(res).await["error"]["code"], "forbidden");
    assert_eq!(ledger_status(&app).await["paused"], false, "refused requests change nothing");
    let res = admin_post(&app, "/admin/pipelines/ledger/resume", Some(TOKEN)).await;
    assert_eq!(res.status(), StatusCode::OK);
    // Reading stays open.
    assert_eq!(app.admin_get("/admin/pipelines").await.status(), StatusCode::OK);
    app.stop().await;
    // Without a configured token, state-changing endpoints are refused.
    let open = env.spawn(|_| {}).await;
    let res = admin_post(&open, "/admin/pipelines/ledger/pause", Some("anything")).await;
    assert_eq!(res.status(), StatusCode::FORBIDDEN);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_admin_token_never_reaches_the_logs() {
    let env = TestEnv::new().await;
    let port = std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).expect("free port").port();
    let admin = format!("127.0.0.1:{port}");
    let mut child = tally_integration_tests::spawn_tally_process(
        &env,
        &[("TALLY__HTTP__ADMIN_TOKEN", TOKEN), ("TALLY__HTTP__ADMIN_ADDR", &admin), ("RUST_LOG", "debug")],
    );
    let client = reqwest::Client::new();
    let url = format!("http://{admin}/admin/pipelines/ledger/pause");
    let status = wait_until("the child serves admin requests", Deadline::DEFAULT, || async {
        match client.post(&url).bearer_auth(TOKEN).send().await {
            Ok(r) => Ok(r.status()),
            Err(e) => Err(e.to_string()),
        }
    })
    .await;
    assert!(status == StatusCode::OK || status == StatusCode::NOT_FOUND, "{status}");
    let wrong = client.post(&url).bearer_auth(format!("{TOKEN}-wrong")).send().await.expect("request");
    assert_eq!(wrong.status(), StatusCode::FORBIDDEN);
    // SIGTERM: the shutdown path logs too.
    let _ = std::process::Command::new("kill").arg("-TERM").arg(child.id().to_string()).status();
    let _ = child.wait();
    let log = child.log_text();
    assert!(log.contains("Shutdown complete"), "the child logged (debug level) and stopped cleanly");
    assert!(!log.contains(TOKEN), "the admin token appears in the log");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_the_receiver_is_fixed_replay_delivers_dead_lettered_events_exactly_once() {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    let fixed = Arc::new(AtomicBool::new(false));
    let healthy = Arc::clone(&fixed);
    let receiver = WebhookReceiver::start(move |_, _| if healthy.load(Ordering::SeqCst) { 200 } else { 500 }).await;
    let (env, app) = spawn_app(|c| {
        notify_config(&receiver.url)(c);
        c.notifications.retry_initial = std::time::Duration::from_millis(100);
        c.notifications.retry_max = std::time::Duration::from_millis(400);
    })
    .await;
    let mut ids = Vec::new();
    for key in ["R-1", "R-2"] {
        ids.push(settled(&env, key).await.0["eventId"].as_str().expect("id").to_owned());
    }
    wait_until("both events dead-lettered", Deadline::DEFAULT, || async {
        let r =
            read_topic(env.bootstrap(), "transfers.settled-dlt", Deadline::secs(5)).await.map_err(|e| e.to_string())?;
        if r.len() == 2 {
            Ok(())
        } else {
            Err(format!("{} in the DLT", r.len()))
        }
    })
    .await;
    let failed_calls = receiver.calls().len();
    assert_eq!(failed_calls, 8, "4 attempts each");
    fixed.store(true, Ordering::SeqCst);
    let replay = |token: &'static str| {
        let req =
            app.client.post(format!("{}/admin/dlt/transfers.settled-dlt/replay", app.admin_url)).bearer_auth(token);
        app.send(req)
    };
    let res = replay(TOKEN).await;
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(json_body(res).await["replayed"], 2);
    wait_until("both events delivered", Deadline::DEFAULT, || async {
        let ok: Vec<_> = receiver.calls().into_iter().filter(|c| c.status == 200).collect();
        if ok.len() >= 2 {
            Ok(())
        } else {
            Err(format!("{} delivered", ok.len()))
        }
    })
    .await;
    // Replaying again sends nothing more: the deliveries are recorded by event id.
    let res = replay(TOKEN).await;
    assert_eq!(json_body(res).await["replayed"], 2);
    wait_until("the second replay is absorbed", Deadline::DEFAULT, || async {
        let m = app.metrics().await;
        let n = metric_value(&m, r#"tally_notification_deliveries_total{outcome="already_delivered"}"#).unwrap_or(0.0);
        if n >= 2.0 {
            Ok(())
        } else {
            Err(format!("{n} already delivered"))
        }
    })
    .await;
    let delivered: Vec<_> = receiver.calls().into_iter().filter(|c| c.status == 200).collect();
    assert_eq!(delivered.len(), 2, "each event delivered exactly once");
    let mut seen: Vec<String> = delivered.iter().map(|c| event_id(c).to_owned()).collect();
    seen.sort();
    ids.sort();
    assert_eq!(seen, ids);
    assert_eq!(env.db.count("notification_deliveries").await, 2);
}

/// A TransferSettled record of `transfers.settled`, as the notifier gets it from its
/// consumer, for a transfer the ledger is recorded in `db` to have settled.
async fn settled_record(
    db: &tally_integration_tests::TestDb,
    offset: i64,
) -> std::sync::Arc<tally_actors::consume::Record> {
    let transfer = Uuid::new_v4();
    db.record_settled(transfer, "N-LEASE", "N-LEASE-DEST", 1).await;
    let event = json!({ "eventId": tally_schema::derived_event_id("settled", transfer), "transferId": transfer,
                        "settledAt": "2026-11-30T00:00:00Z" });
    std::sync::Arc::new(tally_actors::consume::Record {
        topic: "transfers.settled".into(),
        partition: 0,
        offset,
        key: Some(b"N-LEASE".to_vec()),
        payload: Some(event.to_string().into_bytes()),
        headers: vec![("event-type".into(), Some(b"TransferSettled".to_vec()))],
        ..Default::default()
    })
}

/// A notifier on `db` and the broker at `bootstrap`, delivering to `url` with one retry
/// topic (`transfers.settled-retry-1000`), started on the current actix system.
fn start_notifier(db: &tally_integration_tests::TestDb, bootstrap: &str, url: &str) -> tally_actors::notify::Notifier {
    let pool = db.pool(3, Duration::from_secs(30), "notifier-under-test");
    let metrics = tally_actors::Metrics::new().expect("metrics");
    let producer = tally_integration_tests::producer(bootstrap);
    let stopping = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let dead_letters = tally_actors::supervise::DeadLetters::new(
        producer.clone(),
        "tally-notifications".into(),
        metrics.clone(),
        stopping,
        pool.clone(),
    );
    let settings = tally_actors::notify::NotifierSettings {
        webhook_url: url.to_owned(),
        secret: SECRET.to_owned(),
        root_certs: None,
        timeout: Duration::from_secs(5),
        delays_ms: vec![1_000],
        database_wait: Duration::from_secs(5),
        settled_topic: "transfers.settled".into(),
    };
    tally_actors::notify::Notifier::new(pool, producer, dead_letters, metrics, settings).expect("notifier")
}

/// After its partition is revoked nothing more happens for a record on this instance: a
/// notification whose lease is revoked while it waits for its delivery lookup (held on a
/// table lock) POSTs nothing, and one whose lease is revoked while its POST is answered
/// writes no retry record. (The supervisor checks the lease before each attempt; these
/// are the checks inside one.)
#[test]
fn a_revoked_lease_prevents_the_webhook_post_and_the_retry_write() {
    use tally_actors::consume::Lease;
    use tally_actors::supervise::RecordHandler;
    const RETRY: &str = "transfers.settled-retry-1000";
    actix::System::new().block_on(async {
        let env = TestEnv::new().await;
        env.broker.create_topic(RETRY, 1, 1).expect("retry topic");

        // 1. Revoked while the record waits for its lookup: no POST.
        let receiver = WebhookReceiver::start(|_, _| 200).await;
        let notifier = start_notifier(&env.db, env.bootstrap(), &receiver.url);
        let locker = env.db.connect().await;
        locker.batch_execute("BEGIN; LOCK TABLE notification_deliveries IN ACCESS EXCLUSIVE MODE").await.expect("lock");
        let lease = Lease::new();
        let handling = tokio::spawn(lease.clone().scope(notifier.handle(settled_record(&env.db, 0).await)));
        wait_until("the delivery lookup waits on the lock", Deadline::DEFAULT, || async {
            let waiting = env
                .db
                .scalar_i64(
                    "SELECT count(*) FROM pg_stat_activity \
                     WHERE wait_event_type = 'Lock' AND application_name = 'notifier-under-test'",
                    &[],
                )
                .await;
            if waiting > 0 {
                Ok(())
            } else {
                Err("no lookup waits yet".to_owned())
            }
        })
        .await;
        lease.revoke();
        locker.batch_execute("COMMIT").await.expect("unlock");
        let outcome = handling.await.expect("handler task");
        assert!(receiver.calls().is_empty(), "the webhook got a POST after the lease was revoked: {outcome:?}");
        let error = outcome.expect_err("no outcome under a revoked lease");
        assert!(error.message.contains("revoked"), "stopped by the lease check: {error}");

        // 2. Revoked while the POST is answered (500): no retry record.
        let lease = Lease::new();
        let revoke = lease.clone();
        let receiver = WebhookReceiver::start(move |_, _| {
            revoke.revoke();
            500
        })
        .await;
        let notifier = start_notifier(&env.db, env.bootstrap(), &receiver.url);
        let outcome = lease.scope(notifier.handle(settled_record(&env.db, 1).await)).await;
        assert_eq!(receiver.calls().len(), 1, "the POST was made under the live lease: {outcome:?}");
        let written = read_topic(env.bootstrap(), RETRY, Deadline::secs(10)).await.expect("read the retry topic");
        assert!(written.is_empty(), "a retry record was written after the lease was revoked: {outcome:?}");
        let error = outcome.expect_err("no outcome under a revoked lease");
        assert!(error.message.contains("revoked"), "stopped by the lease check: {error}");
    });
}

/// A transfer antifraud blocked has its outcome published once. A `TransferAnalyzed` for it
/// that reaches the ledger anyway (a forged record, signed with the daemon's key) is
/// refused there as poison, without a second outcome event, so the client is told
/// "rejected" once, under one event id.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transfer_refused_again_by_the_ledger_is_notified_once() {
    let receiver = WebhookReceiver::start(|_, _| 200).await;
    let (env, app) = spawn_app(notify_config(&receiver.url)).await;
    for (id, balance) in [("W-R1", 100_000_000), ("W-R2", 0)] {
        let res =
            app.post_json("/accounts", &json!({ "id": id, "currency": "BRL", "initialBalanceCents": balance })).await;
        assert_eq!(res.status(), StatusCode::CREATED);
    }
    let request =
        json!({ "sourceAccount": "W-R1", "destinationAccount": "W-R2", "amountCents": 10_000_000, "currency": "BRL" });
    let res = app.post_json("/transfers", &request).await;
    let transfer = json_body(res).await;
    let id: Uuid = serde_json::from_value(transfer["id"].clone()).expect("transfer id");
    let notified = |receiver: &WebhookReceiver| {
        receiver
            .calls()
            .into_iter()
            .filter(|c| c.status == 200 && String::from_utf8_lossy(&c.body).contains(&id.to_string()))
            .count()
    };
    wait_until("the blocked transfer is notified", Deadline::DEFAULT, || async {
        match notified(&receiver) {
            0 => Err("not yet".to_owned()),
            n => Ok(n),
        }
    })
    .await;

    // The same transfer, analyzed after all, straight to the ledger's topic.
    let event = json!({
        "eventId": Uuid::new_v4(), "transferId": id, "sourceAccount": "W-R1", "destinationAccount": "W-R2",
        "amountCents": 10_000_000, "currency": "BRL", "score": 10, "analyzedAt": "2026-11-30T00:00:00Z",
    });
    env.upstream().signed("transfers.analyzed", None, "W-R1", event.to_string().as_bytes(), "TransferAnalyzed").await;
    let refused = wait_until("the ledger refused it", Deadline::DEFAULT, || async {
        let dlt = read_topic(env.bootstrap(), "transfers.analyzed-dlt", Deadline::secs(5))
            .await
            .map_err(|e| e.to_string())?;
        dlt.into_iter().find(|r| r.payload_json()["transferId"] == json!(id)).ok_or_else(|| "not yet".to_owned())
    })
    .await;
    let reason = refused.header("dlt-exception-message").unwrap_or_default();
    assert!(reason.contains("contradicts"), "{reason}");
    assert_eq!(env.db.scalar_i64("SELECT count(*) FROM processed_transfers WHERE transfer_id = $1", &[&id]).await, 0);
    env.db.wait_outbox_published().await;
    let rejected = read_topic(env.bootstrap(), "transfers.rejected", Deadline::secs(10)).await.expect("read");
    let outcomes: Vec<_> = rejected.iter().filter(|r| r.payload_json()["transferId"] == json!(id)).collect();
    assert_eq!(outcomes.len(), 1, "one TransferRejected for the transfer: {outcomes:?}");
    assert_eq!(env.db.scalar_i64("SELECT count(*) FROM postings WHERE transfer_id = $1", &[&id]).await, 0);
    assert_eq!(notified(&receiver), 1, "notified once");
}

under_both_protocols!(pause_stops_progress_and_lag_grows_then_resume_drains,);

/// An https:// receiver whose certificate a test authority signed: delivered (and signed)
/// when `webhook_root_cert` names that authority, refused (dead-lettered, nothing received)
/// with the system's roots, which do not know it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn webhooks_go_over_https_to_receivers_the_roots_trust() {
    use tally_integration_tests::tls::{path_str, server_config, TestCa};
    let ca = TestCa::new("tally test CA");
    let receiver = WebhookReceiver::start_tls(|_, _| 200, server_config(&ca.sign(&["localhost"]))).await;
    assert!(receiver.url.starts_with("https://localhost:"), "{}", receiver.url);

    let env = TestEnv::new().await;
    let app = env
        .spawn(|c| {
            notify_config(&receiver.url)(c);
            c.notifications.webhook_root_cert = path_str(&ca.cert_path());
        })
        .await;
    let (event, _) = settled(&env, "H-A").await;
    let calls = first_calls(&receiver, "delivered over https").await;
    assert_eq!(serde_json::from_slice::<Value>(&calls[0].body).expect("json"), event);
    assert_signed(&calls[0]);
    app.stop().await;

    // The system's roots: the receiver's certificate is refused, and nothing reaches it.
    let untrusted = TestEnv::new().await;
    let _app = untrusted
        .spawn(|c| {
            notify_config(&receiver.url)(c);
            c.notifications.max_attempts = 1;
        })
        .await;
    let (event, _) = settled(&untrusted, "H-B").await;
    let dlt = wait_until("dead-lettered", Deadline::DEFAULT, || async {
        let r = read_topic(untrusted.bootstrap(), "transfers.settled-dlt", Deadline::secs(5))
            .await
            .map_err(|e| e.to_string())?;
        if r.is_empty() {
            Err("empty DLT".into())
        } else {
            Ok(r)
        }
    })
    .await;
    assert_eq!(dlt[0].payload_json(), event);
    assert_eq!(receiver.calls().len(), 1, "only the trusted daemon's call arrived");
}

/// Waits (the default deadline, as `what`) until `receiver` got at least one call; every
/// call so far.
async fn first_calls(receiver: &WebhookReceiver, what: &str) -> Vec<tally_integration_tests::ReceivedCall> {
    wait_until(what, Deadline::DEFAULT, || async {
        let calls = receiver.calls();
        if calls.is_empty() {
            Err("no call".to_owned())
        } else {
            Ok(calls)
        }
    })
    .await
}

/// A forged outcome that reuses the event id of one already delivered (the id is derived
/// from the transfer, so anyone can compute it) is poison, dead-lettered with its reason:
/// not skipped as a redelivery of what was delivered. Whether the genuine event had been
/// delivered before the forged one came must not change what becomes of it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forged_outcome_under_a_delivered_events_id_is_dead_lettered() {
    let receiver = WebhookReceiver::start(|_, _| 200).await;
    let (env, _app) = spawn_app(notify_config(&receiver.url)).await;
    let transfer = Uuid::new_v4();
    env.db.record_rejected(transfer, "FG-A", "INSUFFICIENT_FUNDS").await;
    let event_id = tally_schema::derived_event_id("rejected", transfer);
    let genuine = json!({ "eventId": event_id, "transferId": transfer, "reason": "INSUFFICIENT_FUNDS",
                          "rejectedAt": "2026-11-30T00:00:00Z" });
    let upstream = env.upstream();
    upstream.signed("transfers.rejected", None, "FG-A", genuine.to_string().as_bytes(), "TransferRejected").await;
    first_calls(&receiver, "the genuine rejection").await;
    let forged = json!({ "eventId": event_id, "transferId": transfer, "reason": "FORGED_REASON",
                         "rejectedAt": "2026-11-30T00:00:00Z" });
    let (_, offset) =
        upstream.signed("transfers.rejected", None, "FG-A", forged.to_string().as_bytes(), "TransferRejected").await;
    let dlt = wait_until("the forged outcome dead-lettered", Deadline::DEFAULT, || async {
        let r = read_topic(env.bootstrap(), "transfers.rejected-dlt", Deadline::secs(5))
            .await
            .map_err(|e| e.to_string())?;
        let mine: Vec<_> = r
            .into_iter()
            .filter(|d| d.header("dlt-original-offset") == Some(offset.to_string().as_str()))
            .filter(|d| d.header("dlt-consumer-group") == Some("tally-notifications"))
            .collect();
        if mine.is_empty() {
            Err("not in the DLT".into())
        } else {
            Ok(mine)
        }
    })
    .await;
    assert_eq!(dlt.len(), 1);
    assert_eq!(dlt[0].header("dlt-exception-kind"), Some("poison"), "{:?}", dlt[0].headers);
    assert_eq!(receiver.calls().len(), 1, "the genuine rejection only");
}
