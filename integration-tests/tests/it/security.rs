//! Security: PostgreSQL over TLS (each `sslmode` against the local server, which has
//! `ssl = on` with its own certificate), and the intake's API clients (bearer tokens
//! stored hashed, idempotency scoped per client).
#![allow(clippy::expect_used)] // tests: a failed expectation is a failed test, with its message

use reqwest::StatusCode;
use serde_json::{json, Value};
use sha2::{Digest, Sha256};
use tally_engine::config::{IntakeClientConfig, Secret, SecretUrl};
use tally_integration_tests::tls::TestCa;
use tally_integration_tests::{assert_error, json_body, TestApp, TestDb, TestEnv};

/// The local server's certificate, as its own root (it is self-signed), after checking
/// that the server speaks TLS at all.
async fn server_certificate(db: &TestDb) -> String {
    let ssl: String = db.query("SHOW ssl", &[]).await[0].get(0);
    assert_eq!(ssl, "on", "the test PostgreSQL must have ssl = on (Debian's default, with its snakeoil certificate)");
    db.query("SHOW ssl_cert_file", &[]).await[0].get(0)
}

/// `url` with `params` appended to its query.
fn with_params(url: &str, params: &str) -> String {
    format!("{url}{}{params}", if url.contains('?') { '&' } else { '?' })
}

/// `(application_name, ssl)` of every connection to the test database but the harness's.
async fn tally_connections(db: &TestDb) -> Vec<(String, bool)> {
    db.query(
        "SELECT a.application_name, s.ssl FROM pg_stat_activity a JOIN pg_stat_ssl s ON s.pid = a.pid \
         WHERE a.datname = current_database() AND a.pid <> pg_backend_pid() AND a.application_name LIKE 'tally-%' \
         ORDER BY 1",
        &[],
    )
    .await
    .iter()
    .map(|r| (r.get(0), r.get(1)))
    .collect()
}

fn transfer(amount: i64) -> Value {
    transfer_from("acc-a", amount)
}

fn transfer_from(source: &str, amount: i64) -> Value {
    json!({ "sourceAccount": source, "destinationAccount": "acc-b", "amountCents": amount, "currency": "BRL" })
}

/// Posts a transfer and waits until its outbox row is published: the intake's pool, the
/// outbox's pool and its LISTEN and NOTIFY connections have all been used.
async fn use_every_connection(env: &TestEnv, app: &TestApp) {
    env.db.open_accounts(&["acc-a"]).await;
    let res = app.post_json("/transfers", &transfer(100)).await;
    assert_eq!(res.status(), StatusCode::CREATED, "POST /transfers");
    env.db.wait_outbox_published().await;
}

// Broker: embedded mock cluster. Database: the local server, over TLS.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn require_and_verify_ca_encrypt_every_connection_of_the_daemon() {
    let env = TestEnv::new().await;
    let root = server_certificate(&env.db).await;
    for (case, params) in [
        ("require", "sslmode=require".to_owned()),
        ("verify-ca", format!("sslmode=verify-ca&sslrootcert={root}")),
        // The certificate names `localhost`: verify-full passes with that host name.
        ("verify-full", format!("sslmode=verify-full&sslrootcert={root}")),
    ] {
        let mut url = with_params(env.db.url(), &params);
        if case == "verify-full" {
            url = url.replace("127.0.0.1", "localhost");
        }
        // The migrations run on it at start.
        let app = env.spawn(|c| c.database.url = SecretUrl::new(&url)).await;
        use_every_connection(&env, &app).await;
        let connections = tally_connections(&env.db).await;
        let names: Vec<&str> = connections.iter().map(|(n, _)| n.as_str()).collect();
        for wanted in ["tally-intake", "tally-outbox", "tally-outbox-listen", "tally-outbox-notify"] {
            assert!(names.contains(&wanted), "{case}: no {wanted} connection among {connections:?}");
        }
        assert!(connections.iter().all(|(_, ssl)| *ssl), "{case}: a connection without TLS: {connections:?}");
        app.stop().await;
    }
}

// Broker: embedded mock cluster.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sslmode_disable_connects_in_the_clear() {
    let env = TestEnv::new().await;
    let url = with_params(env.db.url(), "sslmode=disable");
    let app = env.spawn(|c| c.database.url = SecretUrl::new(&url)).await;
    use_every_connection(&env, &app).await;
    let connections = tally_connections(&env.db).await;
    assert!(!connections.is_empty());
    assert!(connections.iter().all(|(_, ssl)| !*ssl), "sslmode=disable: {connections:?}");
}

// Database: the local server; no daemon, the migrations' connection alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_certificate_that_fails_the_check_is_refused() {
    let db = TestDb::new().await;
    let root = server_certificate(&db).await;
    let migrate = |url: String| async move {
        tokio::task::spawn_blocking(move || tally_actors::store::migrate::prepare_blocking(&url))
            .await
            .expect("migration thread")
            .map_err(|e| format!("{e:#}"))
    };
    migrate(with_params(db.url(), &format!("sslmode=verify-ca&sslrootcert={root}"))).await.expect("verify-ca");
    // The certificate names `localhost`, not `127.0.0.1`.
    let e = migrate(with_params(db.url(), &format!("sslmode=verify-full&sslrootcert={root}"))).await.unwrap_err();
    assert!(e.contains("not valid for name") || e.contains("NotValidForName"), "verify-full by address: {e}");
    // A root that did not sign it.
    let other = TestCa::new("another authority");
    let e = migrate(with_params(db.url(), &format!("sslmode=verify-ca&sslrootcert={}", other.cert_path().display())))
        .await
        .unwrap_err();
    assert!(e.to_lowercase().contains("unknown issuer") || e.contains("UnknownIssuer"), "a foreign root: {e}");
}

/// The hexadecimal SHA-256 of `token`, as `token_sha256` holds it.
fn digest(token: &str) -> String {
    hex::encode(Sha256::digest(token.as_bytes()))
}

/// An API client as an operator writes it in `[[http.clients]]`.
fn client_from(config: Value) -> IntakeClientConfig {
    serde_json::from_value(config.clone()).unwrap_or_else(|e| panic!("client configuration {config}: {e}"))
}

fn client(name: &str, token: &str) -> IntakeClientConfig {
    client_from(json!({ "name": name, "token_sha256": digest(token) }))
}

async fn post_as(app: &TestApp, token: Option<&str>, key: &str, body: &Value) -> reqwest::Response {
    let mut request =
        app.client.post(format!("{}/transfers", app.intake_url)).header("Idempotency-Key", key).json(body);
    if let Some(token) = token {
        request = request.bearer_auth(token);
    }
    app.send(request).await
}

// Broker: embedded mock cluster (publisher off: the test is about HTTP and rows).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_authenticated_intake_refuses_requests_without_a_client_token_and_writes_nothing() {
    let env = TestEnv::new().await;
    let app = env
        .spawn(|c| {
            c.pipelines.set("outbox", false);
            c.http.intake_auth = true;
            c.http.clients = vec![client("shop", "shop-token"), client("market", "market-token")];
        })
        .await;
    for (case, token) in [("no token", None), ("a token no client has", Some("guess")), ("empty", Some(""))] {
        let res = post_as(&app, token, "k-1", &transfer(100)).await;
        assert_eq!(res.headers().get("www-authenticate").map(|v| v.to_str().ok()), Some(Some("Bearer")), "{case}");
        assert_error(res, StatusCode::UNAUTHORIZED, "unauthorized", case).await;
        let mut order = app.client.post(format!("{}/orders", app.intake_url)).json(&json!({
            "externalReference": "EXT-1", "customerId": "C-1", "amountCents": 10, "currency": "BRL"
        }));
        if let Some(token) = token {
            order = order.bearer_auth(token);
        }
        assert_error(app.send(order).await, StatusCode::UNAUTHORIZED, "unauthorized", case).await;
        let account =
            app.post_json("/accounts", &json!({"id": "acc-z", "currency": "BRL", "initialBalanceCents": 1})).await;
        assert_error(account, StatusCode::UNAUTHORIZED, "unauthorized", case).await;
    }
    for table in ["transfers", "outbox_events", "orders", "accounts"] {
        assert_eq!(env.db.count(table).await, 0, "{table} rows after refused requests");
    }
    env.db.open_accounts_of("shop", &["acc-a"]).await;

    let res = post_as(&app, Some("shop-token"), "k-1", &transfer(100)).await;
    assert_eq!(res.status(), StatusCode::CREATED);
    let created = json_body(res).await;
    assert_eq!(created["client"], "shop");
    let id = created["id"].as_str().expect("an id").to_owned();
    let shown = app.send(app.client.get(format!("{}/transfers/{id}", app.intake_url)).bearer_auth("shop-token")).await;
    assert_eq!(json_body(shown).await["client"], "shop", "GET /transfers/{{id}} names the client");
    let other =
        app.send(app.client.get(format!("{}/transfers/{id}", app.intake_url)).bearer_auth("market-token")).await;
    assert_eq!(other.status(), StatusCode::NOT_FOUND, "a client sees its own transfers only");
    let anonymous = app.get(&format!("/transfers/{id}")).await;
    assert_eq!(anonymous.status(), StatusCode::UNAUTHORIZED);
    let row: String = env.db.query("SELECT client FROM transfers", &[]).await[0].get(0);
    assert_eq!(row, "shop");
}

// Broker: embedded mock cluster (publisher off).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idempotency_keys_are_scoped_per_client() {
    let env = TestEnv::new().await;
    let app = env
        .spawn(|c| {
            c.pipelines.set("outbox", false);
            c.http.admin_token = Secret::new("admin-token");
            c.http.clients = vec![client("shop", "shop-token"), client("market", "market-token")];
        })
        .await;
    env.db.open_accounts_of("shop", &["acc-a"]).await;
    env.db.open_accounts_of("market", &["acc-m"]).await;
    env.db.open_accounts(&["acc-anon"]).await;
    let shop = json_body(post_as(&app, Some("shop-token"), "same-key", &transfer(100)).await).await;
    // The same key from another client is another transfer, even with another body.
    let res = post_as(&app, Some("market-token"), "same-key", &transfer_from("acc-m", 200)).await;
    assert_eq!(res.status(), StatusCode::CREATED, "another client's key does not conflict");
    let market = json_body(res).await;
    assert_ne!(market["id"], shop["id"]);
    assert_eq!(market["client"], "market");
    // Anonymous (intake_auth off): a third scope.
    let res = post_as(&app, None, "same-key", &transfer_from("acc-anon", 300)).await;
    assert_eq!(res.status(), StatusCode::CREATED, "an anonymous request has its own scope");
    assert_eq!(json_body(res).await["client"], Value::Null);
    // Within a client, a replay answers the original and a different request conflicts.
    let res = post_as(&app, Some("shop-token"), "same-key", &transfer(100)).await;
    assert_eq!(res.status(), StatusCode::OK, "a replay by the same client");
    assert_eq!(json_body(res).await, shop);
    let res = post_as(&app, Some("market-token"), "same-key", &transfer_from("acc-m", 100)).await;
    assert_error(res, StatusCode::CONFLICT, "idempotency_key_conflict", "market, different amount").await;
    // A token no client has is refused even though anonymous requests are allowed.
    let res = post_as(&app, Some("guess"), "other-key", &transfer(100)).await;
    assert_error(res, StatusCode::UNAUTHORIZED, "unauthorized", "a wrong token").await;
    assert_eq!(env.db.count("transfers").await, 3);
    assert_eq!(env.db.count("outbox_events").await, 3);

    // The console's timeline says which client asked.
    let id = shop["id"].as_str().expect("an id");
    let story =
        app.send(app.client.get(format!("{}/admin/transfers/{id}", app.admin_url)).bearer_auth("admin-token")).await;
    let story = json_body(story).await;
    assert_eq!(story["transfer"]["client"], "shop");
    let steps = story["timeline"].as_array().expect("a timeline");
    let accepted =
        steps.iter().find(|s| s["stage"] == "intake").and_then(|s| s["what"].as_str()).expect("an intake step");
    assert!(accepted.ends_with("for client shop"), "{accepted}");

    // Orders: the same external reference from two clients is two orders.
    let order = json!({ "externalReference": "EXT-1", "customerId": "C-1", "amountCents": 10, "currency": "BRL" });
    for token in ["shop-token", "market-token"] {
        let res = app.send(app.client.post(format!("{}/orders", app.intake_url)).bearer_auth(token).json(&order)).await;
        assert_eq!(res.status(), StatusCode::CREATED, "{token}");
    }
    assert_eq!(env.db.count("orders").await, 2);
}

// Broker: embedded mock cluster (publisher off). Three daemons one after another on one
// database: before, during and after the rotation of the shop's token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_across_a_token_rotation_replays_the_original_transfer() {
    let env = TestEnv::new().await;
    let with_clients = |clients: Vec<IntakeClientConfig>| {
        move |c: &mut tally_engine::config::Config| {
            c.pipelines.set("outbox", false);
            c.http.intake_auth = true;
            c.http.clients = clients;
        }
    };
    let before = env.spawn(with_clients(vec![client("shop", "old-token")])).await;
    env.db.open_accounts_of("shop", &["acc-a"]).await;
    let res = post_as(&before, Some("old-token"), "rotating", &transfer(100)).await;
    assert_eq!(res.status(), StatusCode::CREATED);
    let original = json_body(res).await;
    before.stop().await;

    // The overlap: both tokens are the shop's while its callers move to the new one.
    let both = client_from(json!({ "name": "shop", "token_sha256": [digest("old-token"), digest("new-token")] }));
    let during = env.spawn(with_clients(vec![both])).await;
    for token in ["new-token", "old-token"] {
        let res = post_as(&during, Some(token), "rotating", &transfer(100)).await;
        assert_eq!(res.status(), StatusCode::OK, "a retry with the {token} replays");
        assert_eq!(json_body(res).await, original, "a retry with the {token}");
    }
    during.stop().await;

    let after = env.spawn(with_clients(vec![client("shop", "new-token")])).await;
    let res = post_as(&after, Some("old-token"), "rotating", &transfer(100)).await;
    assert_error(res, StatusCode::UNAUTHORIZED, "unauthorized", "the retired token").await;
    let res = post_as(&after, Some("new-token"), "rotating", &transfer(100)).await;
    assert_eq!(res.status(), StatusCode::OK, "a retry after the rotation replays");
    assert_eq!(json_body(res).await, original);
    assert_eq!(env.db.count("transfers").await, 1, "one transfer across the rotation");
    assert_eq!(env.db.count("outbox_events").await, 1);
}

// Broker: embedded mock cluster (publisher off). A daemon without authentication, then
// one with it, on one database.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_across_the_cut_over_to_an_authenticated_intake_replays_the_anonymous_transfer() {
    let env = TestEnv::new().await;
    let before = env.spawn(|c| c.pipelines.set("outbox", false)).await;
    env.db.open_accounts(&["acc-a"]).await;
    env.db.open_accounts_of("market", &["acc-m"]).await;
    let res = post_as(&before, None, "cut-over", &transfer(100)).await;
    assert_eq!(res.status(), StatusCode::CREATED);
    let original = json_body(res).await;
    assert_eq!(original["client"], Value::Null);
    let order = json!({ "externalReference": "EXT-9", "customerId": "C-1", "amountCents": 10, "currency": "BRL" });
    let res = app_order(&before, None, &order).await;
    assert_eq!(res.status(), StatusCode::CREATED);
    let original_order = json_body(res).await;
    before.stop().await;

    let after = env
        .spawn(|c| {
            c.pipelines.set("outbox", false);
            c.http.intake_auth = true;
            c.http.clients = vec![
                client_from(json!({ "name": "shop", "token_sha256": digest("shop-token"), "adopts_anonymous": true })),
                client("market", "market-token"),
            ];
        })
        .await;
    // The shop, which sent the anonymous requests, retries them with its token.
    let res = post_as(&after, Some("shop-token"), "cut-over", &transfer(100)).await;
    assert_eq!(res.status(), StatusCode::OK, "the retry replays the anonymous transfer");
    assert_eq!(json_body(res).await, original);
    let res = post_as(&after, Some("shop-token"), "cut-over", &transfer(999)).await;
    assert_error(res, StatusCode::CONFLICT, "idempotency_key_conflict", "the key with another amount").await;
    let id = original["id"].as_str().expect("an id");
    let shown =
        after.send(after.client.get(format!("{}/transfers/{id}", after.intake_url)).bearer_auth("shop-token")).await;
    assert_eq!(shown.status(), StatusCode::OK, "the adopting client sees the anonymous transfer");
    let res = app_order(&after, Some("shop-token"), &order).await;
    assert_eq!(res.status(), StatusCode::OK, "the order's retry replays the anonymous order");
    assert_eq!(json_body(res).await["id"], original_order["id"]);
    // Adoption is explicit: another client's key is its own.
    let res = post_as(&after, Some("market-token"), "cut-over", &transfer_from("acc-m", 100)).await;
    assert_eq!(res.status(), StatusCode::CREATED, "a client that does not adopt has its own scope");
    assert_eq!(json_body(res).await["client"], "market");
    assert_eq!(env.db.count("transfers").await, 2, "the anonymous transfer and the market's");
    assert_eq!(env.db.count("orders").await, 1);
}

async fn app_order(app: &TestApp, token: Option<&str>, order: &Value) -> reqwest::Response {
    let mut request = app.client.post(format!("{}/orders", app.intake_url)).json(order);
    if let Some(token) = token {
        request = request.bearer_auth(token);
    }
    app.send(request).await
}
