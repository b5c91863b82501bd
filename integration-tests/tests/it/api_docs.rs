//! The HTTP API described and fuzzed: each listener serves the OpenAPI 3.1 document of its
//! own paths at `/openapi.json`; schemathesis (installed under `target/` by
//! `scripts/ensure-schemathesis.sh`) sends what that document allows and what it forbids,
//! and every answer must be documented, JSON when it is an error, never a 5xx, and a
//! refused request writes nothing. Errors read as sentences. Broker: embedded mock cluster
//! (no pipeline runs: every row the intake writes stays to be counted).
#![allow(clippy::expect_used, clippy::unwrap_used)] // tests: a failed expectation is a failed test

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use reqwest::StatusCode;
use serde_json::{json, Value};
use sha2::{Digest, Sha256};
use tally_engine::config::{Config, IntakeClientConfig, Secret};
use tally_integration_tests::{json_body, run_only, spawn_app};

const ADMIN_TOKEN: &str = "admin-token";
const CLIENT_TOKEN: &str = "shop-token";

fn configure(c: &mut Config) {
    run_only(c, &[]);
    c.http.admin_token = Secret::new(ADMIN_TOKEN);
    c.http.intake_auth = true;
    c.http.clients = vec![serde_json::from_value::<IntakeClientConfig>(serde_json::json!({
        "name": "shop",
        "token_sha256": hex::encode(Sha256::digest(CLIENT_TOKEN.as_bytes())),
    }))
    .expect("a client configuration")];
}

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The schemathesis command that `scripts/ensure-schemathesis.sh` installs (once).
fn schemathesis() -> PathBuf {
    let out = Command::new(root().join("scripts/ensure-schemathesis.sh"))
        .current_dir(root())
        .stderr(std::process::Stdio::inherit())
        .output()
        .expect("run scripts/ensure-schemathesis.sh");
    assert!(
        out.status.success(),
        "scripts/ensure-schemathesis.sh failed: install schemathesis (PyPI) to run this test"
    );
    PathBuf::from(String::from_utf8_lossy(&out.stdout).trim())
}

/// Runs schemathesis against the document at `doc_url` with every check, bounded per
/// operation; returns the HAR of every request it sent (`entries`).
fn fuzz(name: &str, doc_url: &str, token: &str, more: &[&str]) -> Vec<Value> {
    let dir = root().join("target/api-fuzz");
    std::fs::create_dir_all(&dir).unwrap();
    let har = dir.join(format!("{name}.har"));
    let _ = std::fs::remove_file(&har);
    let args: Vec<String> = [
        "run",
        doc_url,
        "--checks",
        "all",
        // Not this one: JSON Schema counts 1250.0 as an integer, so schemathesis sends
        // amounts so written as valid; the API refuses any amount written with a fraction
        // or an exponent (422), on purpose.
        "--exclude-checks",
        "positive_data_acceptance",
        "--generation-database",
        "none",
        "--seed",
        "27",
        "--workers",
        "1",
        "--request-timeout",
        "30",
        "--header",
        &format!("Authorization: Bearer {token}"),
        "--report",
        "har",
        "--report-har-path",
        har.to_str().unwrap(),
    ]
    .iter()
    .chain(more)
    .map(|s| (*s).to_owned())
    .collect();
    let started = Instant::now();
    let out = Command::new(schemathesis())
        .args(&args)
        .current_dir(&dir)
        .env("NO_COLOR", "1")
        .output()
        .expect("run schemathesis");
    let stdout = String::from_utf8_lossy(&out.stdout);
    std::fs::write(dir.join(format!("{name}.txt")), stdout.as_bytes()).unwrap();
    eprintln!(
        "schemathesis {} ({name}): {:.0} s, exit {:?}\n{}",
        args.join(" "),
        started.elapsed().as_secs_f64(),
        out.status.code(),
        stdout.lines().rev().take(12).collect::<Vec<_>>().into_iter().rev().collect::<Vec<_>>().join("\n")
    );
    assert!(
        out.status.success(),
        "schemathesis found failures ({name}):\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let har: Value = serde_json::from_str(&std::fs::read_to_string(&har).expect("the HAR report")).unwrap();
    har["log"]["entries"].as_array().cloned().unwrap_or_default()
}

/// How many answers of each status each method got, for the log.
fn summary(seen: &BTreeMap<(String, String), Vec<u16>>) -> BTreeMap<String, usize> {
    let mut counts = BTreeMap::new();
    for ((method, _), statuses) in seen {
        for status in statuses {
            *counts.entry(format!("{method} {status}")).or_default() += 1;
        }
    }
    counts
}

/// `(method, path)` -> statuses answered, and every error answer checked to be our JSON.
fn tally(entries: &[Value]) -> BTreeMap<(String, String), Vec<u16>> {
    let mut seen: BTreeMap<(String, String), Vec<u16>> = BTreeMap::new();
    for entry in entries {
        let method = entry["request"]["method"].as_str().unwrap_or_default().to_owned();
        let url = reqwest::Url::parse(entry["request"]["url"].as_str().unwrap_or_default()).unwrap();
        let status = u16::try_from(entry["response"]["status"].as_u64().unwrap_or_default()).unwrap();
        let case = format!("{method} {url} -> {status}");
        assert!(status < 500, "a server error: {case}: {}", entry["response"]["content"]);
        if status >= 400 && method != "HEAD" {
            let text = entry["response"]["content"]["text"].as_str().unwrap_or_default();
            let body: Value = serde_json::from_str(text).unwrap_or_else(|e| panic!("{case}: not JSON ({e}): {text}"));
            let message = body["error"]["message"].as_str().unwrap_or_default();
            assert!(body["error"]["code"].is_string() && message.ends_with('.'), "{case}: {body}");
        }
        seen.entry((method, url.path().to_owned())).or_default().push(status);
    }
    seen
}

fn created(seen: &BTreeMap<(String, String), Vec<u16>>, path: &str) -> i64 {
    let statuses = seen.get(&("POST".to_owned(), path.to_owned())).cloned().unwrap_or_default();
    statuses.iter().filter(|s| **s == 201).count() as i64
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn schemathesis_finds_no_undocumented_answer_no_5xx_and_no_write_when_refused() {
    fuzz_intake("intake", &["--max-examples", "100"], &["/transfers", "/orders", "/accounts"]).await;
}

/// An order's `lines` is kept as it is, any JSON: it gets more tries of its own (a test of
/// its own, beside the intake's).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn schemathesis_sends_any_order_lines_and_each_201_writes_one_order() {
    let lines = ["--include-path", "/orders", "--include-method", "POST", "--phases", "fuzzing"];
    fuzz_intake("orders", &[&lines[..], &["--max-examples", "1000"]].concat(), &["/orders"]).await;
}

/// Fuzzes the intake's document of a fresh daemon (as `name`, with schemathesis' `more`
/// arguments), then checks that each path of `paths` was tried, and that its table and the
/// outbox hold one row per 201 and none for a refusal.
async fn fuzz_intake(name: &'static str, more: &[&'static str], paths: &[&str]) {
    let (env, app) = spawn_app(configure).await;
    let intake_doc = format!("{}/openapi.json", app.intake_url);
    let more = more.to_vec();
    let entries = tokio::task::spawn_blocking(move || fuzz(name, &intake_doc, CLIENT_TOKEN, &more)).await.unwrap();
    let seen = tally(&entries);
    for (path, table) in [("/transfers", "transfers"), ("/orders", "orders"), ("/accounts", "accounts")] {
        let answers = seen.get(&("POST".to_owned(), path.to_owned())).map_or(0, Vec::len);
        assert!(!paths.contains(&path) || answers > 10, "POST {path} was tried {answers} times");
        let rows = env.db.count(table).await;
        assert_eq!(rows, created(&seen, path), "{table} rows: one per 201 of POST {path}, none for a refusal");
    }
    let outbox = env.db.count("outbox_events").await;
    assert_eq!(outbox, created(&seen, "/transfers") + created(&seen, "/orders"), "outbox rows: one per 201");
    let refused = seen.values().flatten().filter(|s| **s >= 400).count();
    eprintln!("{name}: {} requests, {refused} refused: {:?}", entries.len(), summary(&seen));
    drop(app);
    drop(env);
}

/// The admin listener's document, fuzzed as the intake's is (a test of its own, so that
/// the two runs go side by side).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn schemathesis_finds_no_undocumented_admin_answer_and_no_5xx() {
    let (env, app) = spawn_app(configure).await;
    let admin_doc = format!("{}/openapi.json", app.admin_url);
    let entries =
        tokio::task::spawn_blocking(move || fuzz("admin", &admin_doc, ADMIN_TOKEN, &["--max-examples", "100"]))
            .await
            .unwrap();
    let seen = tally(&entries);
    eprintln!("admin: {} requests: {:?}", entries.len(), summary(&seen));
    assert!(seen.keys().any(|(_, p)| p.starts_with("/admin/dlt/")), "the DLT endpoints were tried");
    drop(app);
    drop(env);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_listener_serves_the_openapi_document_of_its_own_paths() {
    let (_env, app) = spawn_app(configure).await;
    let intake = json_body(app.get("/openapi.json").await).await;
    let admin = json_body(app.admin_get("/openapi.json").await).await;
    for doc in [&intake, &admin] {
        assert_eq!(doc["openapi"], "3.1.0");
        assert!(doc["paths"]["/openapi.json"]["get"].is_object());
    }
    assert!(intake["paths"]["/transfers"]["post"].is_object() && intake["paths"].get("/healthz").is_none());
    assert!(
        admin["paths"]["/admin/dlt/{topic}/replay"]["post"].is_object() && admin["paths"].get("/transfers").is_none()
    );
    // This daemon's configuration: its ceiling of amounts, its client token required.
    let amount = &intake["components"]["schemas"]["CreateTransferBody"]["properties"]["amountCents"];
    assert_eq!(amount["maximum"], json!(app.config.ledger.max_balance_cents));
    assert_eq!(intake["paths"]["/transfers"]["post"]["security"], json!([{"client": []}]));
    // The console links the admin document.
    let console = app.admin_get("/").await.text().await.unwrap();
    assert!(console.contains(r#"<a href="/openapi.json" id="api-doc""#), "the console links the document");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn errors_read_as_sentences() {
    let (env, app) = spawn_app(configure).await;
    let bearer = |token: &str| format!("Bearer {token}");
    let intake = |method: reqwest::Method, path: &str| {
        app.client.request(method, format!("{}{path}", app.intake_url)).header("Authorization", bearer(CLIENT_TOKEN))
    };
    let cases = [
        (intake(reqwest::Method::GET, "/transfers/not-a-uuid"), 400, "The transfer id in the path is not a UUID"),
        (intake(reqwest::Method::GET, "/orders/123"), 400, "The order id in the path is not a UUID"),
        (intake(reqwest::Method::GET, "/accounts/acc-1?limit=many"), 400, "The query string could not be read"),
        (intake(reqwest::Method::GET, "/accounts/acc-1?colour=red"), 400, "The query string could not be read"),
        (
            intake(reqwest::Method::POST, "/transfers").header("Content-Type", "application/json").body("{"),
            400,
            "The request body is not valid JSON",
        ),
        (
            intake(reqwest::Method::POST, "/transfers").json(&json!({"sourceAccount": "a"})),
            400,
            "The request body does not have the expected fields: missing field",
        ),
        (intake(reqwest::Method::POST, "/transfers").body("x"), 415, "The request body must be JSON"),
        (intake(reqwest::Method::DELETE, "/transfers"), 405, "DELETE /transfers is not served; this path takes POST"),
        (intake(reqwest::Method::GET, "/nowhere"), 404, "There is no route for GET /nowhere"),
        (
            app.client.get(format!("{}/transfers/{}", app.intake_url, uuid::Uuid::nil())),
            401,
            "This needs an API client",
        ),
        (
            app.client
                .get(format!("{}/admin/transfers/zzz", app.admin_url))
                .header("Authorization", bearer(ADMIN_TOKEN)),
            400,
            "The transfer id in the path is not a UUID",
        ),
        (
            app.client
                .post(format!("{}/admin/outbox/parked/zzz/retry", app.admin_url))
                .header("Authorization", bearer(ADMIN_TOKEN)),
            400,
            "The outbox row id in the path is not a UUID",
        ),
        (app.client.get(format!("{}/admin/token", app.admin_url)), 401, "This needs the admin token"),
    ];
    for (request, status, start) in cases {
        let res = app.send(request).await;
        let case = format!("{} -> {}", res.url().clone(), res.status());
        assert_eq!(res.status(), StatusCode::from_u16(status).unwrap(), "{case}");
        let allow = res.headers().get("allow").map(|v| v.to_str().unwrap().to_owned());
        let body = json_body(res).await;
        let message = body["error"]["message"].as_str().unwrap_or_default();
        assert!(message.starts_with(start) && message.ends_with('.'), "{case}: {message:?}");
        if status == 405 {
            assert_eq!(allow.as_deref(), Some("POST"), "{case}: the Allow header stays");
        }
    }
    assert_eq!(env.db.count("transfers").await, 0, "nothing written");
}

/// Found by the fuzz test: `jsonb` keeps a number such as -1.7976931348623157e308 as its
/// exact decimal (309 digits), which the JSON reader then refuses, so the order's insert
/// failed on reading its row back (500; the transaction rolled back). It is a 422 now; a
/// number the database gives back readably is still taken.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_order_whose_lines_could_not_be_read_back_is_a_422() {
    let (env, app) = spawn_app(configure).await;
    let order = |reference: &str, lines: &str| {
        let body = format!(
            r#"{{"externalReference": "{reference}", "customerId": "C-1", "amountCents": 1, "currency": "BRL", "lines": {lines}}}"#
        );
        app.client
            .post(format!("{}/orders", app.intake_url))
            .header("Authorization", format!("Bearer {CLIENT_TOKEN}"))
            .header("Content-Type", "application/json")
            .body(body)
    };
    let res = app.send(order("R-1", r#"[{"x": -1.7976931348623157e308}]"#)).await;
    assert_eq!(res.status(), StatusCode::UNPROCESSABLE_ENTITY);
    let body = json_body(res).await;
    assert_eq!(body["error"]["code"], "validation_failed", "{body}");
    assert!(body["error"]["message"].as_str().unwrap().starts_with("lines[0].x is a number too large"), "{body}");
    assert_eq!((env.db.count("orders").await, env.db.count("outbox_events").await), (0, 0), "nothing written");

    let res = app.send(order("R-2", "[1e308, 1.5, -1e-300]")).await;
    assert_eq!(res.status(), StatusCode::CREATED);
    let id = json_body(res).await["id"].as_str().unwrap().to_owned();
    let res = app.send(app.client.get(format!("{}/orders/{id}", app.intake_url)).bearer_auth(CLIENT_TOKEN)).await;
    assert_eq!(res.status(), StatusCode::OK, "read back");
}
