//! The operator console at `/` of the admin listener, in a real browser (Debian's headless
//! Chromium over WebDriver), against a running daemon: read-only without the token, then
//! with it pause and resume a pipeline, browse a DLT and replay a record after its dry run,
//! and look a transfer up. Screenshots go to `target/ui/`. Also the transfer lookup's API
//! (`GET /admin/transfers/{id}`) and the assets' headers, over plain HTTP. Broker:
//! librdkafka's mock cluster.
#![allow(clippy::expect_used)] // tests: a failed expectation is a failed test, with its message

use serde_json::Value;
use tally_integration_tests::{
    create_account, final_state, json_body, post_transfer, produce, producer, spawn_app, wait_until, Browser, Deadline,
    TestApp, TestEnv, WebhookReceiver,
};

const TOKEN: &str = "console-admin-token";
const DLT: &str = "transfers.analyzed-dlt";
const POISON: &str = r#"{not json <img src="x" onerror="document.title='injected'">"#;

/// A daemon with the admin token, notifications to `receiver`, and one settled transfer.
async fn daemon_with_a_settled_transfer(receiver: &WebhookReceiver) -> (TestEnv, TestApp, uuid::Uuid) {
    let url = receiver.url.clone();
    let (env, app) = spawn_app(move |c| {
        c.notifications.webhook_url = tally_engine::config::SecretUrl::new(url);
        c.notifications.webhook_secret = tally_engine::config::Secret::new("s3cret");
        c.http.admin_token = tally_engine::config::Secret::new(TOKEN);
    })
    .await;
    create_account(&app, "CON-A", 10_000, "BRL").await;
    create_account(&app, "CON-B", 0, "BRL").await;
    let id = post_transfer(&app, "CON-A", "CON-B", 1_234).await;
    assert_eq!(final_state(&app, id).await["status"], "SETTLED");
    (env, app, id)
}

async fn admin_json(app: &TestApp, path: &str, token: Option<&str>) -> (u16, Value) {
    let mut req = app.client.get(format!("{}{path}", app.admin_url));
    if let Some(t) = token {
        req = req.bearer_auth(t);
    }
    let res = app.send(req).await;
    (res.status().as_u16(), json_body(res).await)
}

async fn paused(app: &TestApp, name: &str) -> bool {
    let (_, body) = admin_json(app, "/admin/pipelines", None).await;
    body["pipelines"].as_array().expect("pipelines").iter().find(|p| p["name"] == name).expect("the pipeline")["paused"]
        .as_bool()
        .expect("paused")
}

async fn dlt_records(app: &TestApp) -> i64 {
    let (_, body) = admin_json(app, "/admin/dlt", None).await;
    body["topics"]
        .as_array()
        .and_then(|ts| ts.iter().find(|t| t["topic"] == DLT))
        .map_or(0, |t| t["records"].as_i64().expect("a count"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_transfer_lookup_tells_every_stage_and_needs_the_token() {
    let receiver = WebhookReceiver::start(|_, _| 200).await;
    let (_env, app, id) = daemon_with_a_settled_transfer(&receiver).await;
    // The console checks a token with the one endpoint that needs nothing else.
    assert_eq!(admin_json(&app, "/admin/token", None).await.0, 401);
    assert_eq!(admin_json(&app, "/admin/token", Some("wrong")).await.0, 403);
    assert_eq!(admin_json(&app, "/admin/token", Some(TOKEN)).await, (200, serde_json::json!({ "ok": true })));
    let path = format!("/admin/transfers/{id}");
    assert_eq!(admin_json(&app, &path, None).await.0, 401, "record contents need the token");
    assert_eq!(admin_json(&app, &path, Some("wrong")).await.0, 403);
    let (status, body) = admin_json(&app, "/admin/transfers/not-a-uuid", Some(TOKEN)).await;
    assert_eq!(status, 400, "{body}");
    let (status, body) = admin_json(&app, &format!("/admin/transfers/{}", uuid::Uuid::new_v4()), Some(TOKEN)).await;
    assert_eq!((status, body["error"]["code"].as_str()), (404, Some("not_found")), "{body}");

    // The notification is the last stage: wait until the lookup shows it.
    let body = wait_until("the lookup shows the notification", Deadline::DEFAULT, || async {
        let (status, body) = admin_json(&app, &path, Some(TOKEN)).await;
        let stages: Vec<&str> =
            body["timeline"].as_array().map_or(vec![], |t| t.iter().filter_map(|s| s["stage"].as_str()).collect());
        if status == 200 && stages.contains(&"notification") {
            Ok(body)
        } else {
            Err(format!("{status}: {stages:?}"))
        }
    })
    .await;
    assert_eq!(body["transfer"]["status"], "SETTLED");
    assert_eq!(body["transfer"]["amountCents"], 1_234);
    assert_eq!(body["decision"]["outcome"], "ANALYZED");
    assert!(body["decision"]["score"].is_i64(), "{body}");
    let postings: Vec<(String, String, i64)> = body["postings"]
        .as_array()
        .expect("postings")
        .iter()
        .map(|p| {
            (p["accountId"].as_str().expect("id").to_owned(), p["kind"].as_str().expect("kind").to_owned(), {
                p["amountCents"].as_i64().expect("amount")
            })
        })
        .collect();
    assert_eq!(
        postings,
        [("CON-A".to_owned(), "debit".to_owned(), 1_234), ("CON-B".to_owned(), "credit".to_owned(), 1_234)]
    );
    let timeline = body["timeline"].as_array().expect("timeline");
    let stages: Vec<&str> = timeline.iter().filter_map(|s| s["stage"].as_str()).collect();
    for stage in ["intake", "outbox", "antifraud", "ledger", "projection", "notification"] {
        assert!(stages.contains(&stage), "{stage} missing from {stages:?}");
    }
    // In time order, and every event of the transfer on its topics: the request published
    // to transfers.requested, the decision on transfers.analyzed, the settlement published.
    let times: Vec<&str> = timeline.iter().filter_map(|s| s["at"].as_str()).collect();
    let parsed: Vec<chrono::DateTime<chrono::Utc>> =
        times.iter().map(|t| t.parse().expect("an RFC 3339 time")).collect();
    assert!(parsed.windows(2).all(|w| w[0] <= w[1]), "{times:?}");
    let topics: Vec<&str> = timeline.iter().filter_map(|s| s["topic"].as_str()).collect();
    for topic in ["transfers.requested", "transfers.analyzed", "transfers.settled"] {
        assert!(topics.contains(&topic), "{topic} missing from {topics:?}");
    }
    assert_eq!(stages[0], "intake", "{stages:?}");

    // The page and its assets: served from the binary, with a strict content policy.
    for (path, kind) in [("/", "text/html"), ("/console/app.js", "text/javascript"), ("/console/app.css", "text/css")] {
        let res = app.send(app.client.get(format!("{}{path}", app.admin_url))).await;
        assert_eq!(res.status(), 200, "{path}");
        let header = |name: &str| res.headers().get(name).and_then(|v| v.to_str().ok()).unwrap_or("").to_owned();
        assert!(header("content-type").starts_with(kind), "{path}: {}", header("content-type"));
        assert!(header("content-security-policy").contains("script-src 'self'"), "{path}");
        assert_eq!(header("x-content-type-options"), "nosniff", "{path}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_pauses_replays_and_looks_up_in_a_browser() {
    let Some(browser) = Browser::start().await else { return };
    let receiver = WebhookReceiver::start(|_, _| 200).await;
    let (env, app, id) = daemon_with_a_settled_transfer(&receiver).await;
    // A poison record on the ledger's input: it lands in the ledger's DLT. Its payload is
    // markup that would run script if the console put record contents in as HTML.
    let p = producer(env.bootstrap());
    produce(&p, "transfers.analyzed", None, "CON-A", POISON.as_bytes(), &[("event-type", "TransferAnalyzed")]).await;
    wait_until("the poison record in the DLT", Deadline::DEFAULT, || async {
        match dlt_records(&app).await {
            1 => Ok(()),
            n => Err(format!("{n} records")),
        }
    })
    .await;

    // Read-only: the overview shows every pipeline, the actions are off.
    browser.goto(&format!("{}/", app.admin_url)).await;
    browser.wait_text("#mode", "read-only mode", |t| t == "read-only").await;
    for name in ["ledger", "antifraud", "projection", "notifications", "orders"] {
        browser.wait_text(&format!(".pipeline[data-name='{name}'] .state"), "running", |t| t == "running").await;
    }
    assert_eq!(browser.enabled(".pipeline[data-name='ledger'] .pipeline-pause").await, Some(false));
    browser.wait_text("#ready-state", "ready", |t| t == "ready").await;
    browser.wait_text("#ledger-state", "the ledger check", |t| t == "all invariants hold").await;
    browser.wait_text("[data-stat='dlt-records'] .value", "one record in the DLTs", |t| t == "1").await;
    let lag = browser.text(".pipeline[data-name='ledger'] [data-stat='lag'] .value").await;
    assert!(lag.as_deref().is_some_and(|t| t.parse::<i64>().is_ok()), "lag shown as a number: {lag:?}");
    let trend = browser.client.find(fantoccini::Locator::Css(".pipeline[data-name='ledger'] svg.trend polyline")).await;
    assert!(trend.is_ok(), "a lag trend is drawn");
    let overview_read_only = browser.screenshot("overview-read-only").await;

    // A wrong token is refused and the console stays read-only.
    browser.type_into("#token", "not-the-token").await;
    browser.click("#token-save").await;
    browser.wait_text("#flash", "the refusal", |t| t.contains("not accepted")).await;
    assert_eq!(browser.text("#mode").await.as_deref(), Some("read-only"));

    // With the token: pause and resume the ledger.
    browser.type_into("#token", TOKEN).await;
    browser.click("#token-save").await;
    browser.wait_text("#mode", "operator mode", |t| t == "operator").await;
    browser.click(".pipeline[data-name='ledger'] .pipeline-pause").await;
    browser.wait_text(".pipeline[data-name='ledger'] .state", "paused", |t| t == "paused").await;
    assert!(paused(&app, "ledger").await, "the daemon paused the ledger");
    let overview_paused = browser.screenshot("overview-ledger-paused").await;
    browser.click(".pipeline[data-name='ledger'] .pipeline-resume").await;
    browser.wait_text(".pipeline[data-name='ledger'] .state", "running again", |t| t == "running").await;
    assert!(!paused(&app, "ledger").await, "the daemon resumed the ledger");

    // The DLT browser: the record decoded, then a dry run, then the replay it enables.
    browser.goto(&format!("{}/#/dlt/{DLT}", app.admin_url)).await;
    browser.wait_text("#dlt-topic", "the DLT listed", |t| t.contains(DLT)).await;
    assert_eq!(browser.value("#dlt-topic").await.as_deref(), Some(DLT), "the address chose the source");
    assert_eq!(browser.enabled("#dlt-replay").await, Some(false), "no replay before its dry run");
    browser.click("#dlt-load").await;
    browser.wait_text("#dlt-count", "one record", |t| t == "1 record(s) shown").await;
    let record = browser.text(".record .title").await.expect("a record");
    assert!(record.contains("poison") && record.contains("transfers.analyzed") && record.contains("CON-A"), "{record}");
    browser.click(".record details summary").await;
    let payload = browser.wait_text(".record pre.payload", "the payload", |t| !t.is_empty()).await;
    assert_eq!(payload, POISON, "the payload is shown as text");
    assert!(browser.client.find(fantoccini::Locator::Css(".record img")).await.is_err(), "no markup from a record");
    assert_eq!(browser.client.title().await.expect("the title"), "tally console", "no script from a record");
    browser.click("#dlt-dry-run").await;
    browser.wait_text("#dlt-plan", "the plan", |t| t.contains("republish 1 record(s)")).await;
    assert_eq!(dlt_records(&app).await, 1, "a dry run produces nothing");
    let dlt_dry_run = browser.screenshot("dlt-dry-run").await;
    browser.click("#dlt-replay").await;
    browser.wait_text("#dlt-replayed", "the replay", |t| t == "Replayed 1 record(s).").await;
    // Replayed to the ledger's input, where it is poison again: a second DLT record.
    wait_until("the replayed record dead-lettered again", Deadline::DEFAULT, || async {
        match dlt_records(&app).await {
            2 => Ok(()),
            n => Err(format!("{n} records")),
        }
    })
    .await;

    // The transfer lookup.
    browser.click("#tab-transfer").await;
    browser.type_into("#transfer-id", &id.to_string()).await;
    browser.click("#transfer-lookup").await;
    browser.wait_text("#transfer-status", "settled", |t| t == "SETTLED").await;
    let decision = browser.text("#transfer-decision").await.expect("the decision");
    assert!(decision.starts_with("ANALYZED, score "), "{decision}");
    let postings = browser.text("#transfer-postings").await.expect("postings");
    assert!(postings.contains("CON-A") && postings.contains("debit") && postings.contains("12.34 BRL"), "{postings}");
    let timeline = browser.text("#transfer-timeline").await.expect("timeline");
    for stage in ["intake", "outbox", "antifraud", "ledger", "transfers.requested", "transfers.settled"] {
        assert!(timeline.contains(stage), "{stage} missing from {timeline}");
    }
    let transfer = browser.screenshot("transfer-lookup").await;

    for shot in [overview_read_only, overview_paused, dlt_dry_run, transfer] {
        let bytes = std::fs::metadata(&shot).expect("a screenshot").len();
        assert!(bytes > 10_000, "{} is {bytes} bytes", shot.display());
        println!("screenshot: {}", shot.display());
    }
    browser.close().await;
}
