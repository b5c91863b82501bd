//! Inputs a person cannot tell apart, and answers that tell more than they should: account
//! ids that only look like another, codes that are no currency, a request with two
//! credentials, and what opening someone else's id tells the caller.
//!
//! Broker: the embedded broker (librdkafka's mock cluster, in this process).
#![allow(clippy::expect_used)] // tests: a failed expectation is a failed test, with its message

use reqwest::StatusCode;
use serde_json::json;
use sha2::{Digest, Sha256};
use tally_engine::config::{IntakeClientConfig, Secret};
use tally_integration_tests::{assert_error, json_body, spawn_app, TestApp};

async fn open(app: &TestApp, id: &str, currency: &str) -> reqwest::Response {
    app.post_json("/accounts", &json!({ "id": id, "currency": currency, "initialBalanceCents": 0 })).await
}

/// Ids that differ from an existing one only by letter case, an invisible character, a
/// right-to-left mark, a letter of another script or a full-width letter are refused, and
/// so is the issuance accounts' prefix in any case.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn look_alike_account_ids_are_refused() {
    let (env, app) = spawn_app(|_| {}).await;
    assert_eq!(open(&app, "acc-alice", "BRL").await.status(), StatusCode::CREATED);
    let taken = open(&app, "ACC-Alice", "BRL").await;
    assert_error(taken, StatusCode::CONFLICT, "account_exists", "the same id but for letter case").await;
    // The database itself refuses the twin, whoever inserts it (two opens racing).
    let twin = env
        .db
        .client()
        .execute("INSERT INTO accounts (id, balance_cents, currency) VALUES ('ACC-ALICE', 0, 'BRL')", &[])
        .await
        .expect_err("the index refuses a case twin");
    assert!(twin.as_db_error().is_some_and(|e| e.constraint() == Some("accounts_id_folded")), "{twin}");
    let named = env
        .db
        .client()
        .execute("INSERT INTO accounts (id, balance_cents, currency) VALUES ('Issuance:EUR', 0, 'EUR')", &[])
        .await
        .expect_err("an issuance account's name in another case");
    assert!(named.as_db_error().is_some_and(|e| e.constraint() == Some("accounts_issuance_name")), "{named}");
    for (look_alike, what) in [
        ("acc\u{200b}-alice", "a zero-width space"),
        ("acc-alice\u{200f}", "a right-to-left mark"),
        ("\u{430}cc-alice", "a Cyrillic a"),
        ("\u{ff41}cc-alice", "a full-width a"),
        ("Issuance:BRL", "the issuance prefix, capitalised"),
        ("ISSUANCE:BRL", "the issuance prefix, in capitals"),
    ] {
        let res = open(&app, look_alike, "BRL").await;
        assert_error(res, StatusCode::UNPROCESSABLE_ENTITY, "validation_failed", what).await;
    }
    let customers = env.db.scalar_i64("SELECT count(*) FROM accounts WHERE kind = 'customer'", &[]).await;
    assert_eq!(customers, 1, "only acc-alice was opened");
}

/// A currency is a code ISO 4217 lists as active, or one the operator configured: `ZZZ`
/// opens no account (so no issuance account either) and takes no order, unless
/// `ledger.extra_currencies` names it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn codes_that_are_no_currency_are_refused_unless_configured() {
    let (_env, app) = spawn_app(|_| {}).await;
    let res = open(&app, "zzz-1", "ZZZ").await;
    assert_error(res, StatusCode::UNPROCESSABLE_ENTITY, "validation_failed", "ZZZ for an account").await;
    let order = json!({ "externalReference": "o-1", "customerId": "c-1", "amountCents": 1, "currency": "ZZZ" });
    let res = app.post_json("/orders", &order).await;
    assert_error(res, StatusCode::UNPROCESSABLE_ENTITY, "validation_failed", "ZZZ for an order").await;
    assert_eq!(open(&app, "usd-1", "USD").await.status(), StatusCode::CREATED);
    drop(app);

    let (_env, app) = spawn_app(|c| c.ledger.extra_currencies = vec!["ZZZ".into()]).await;
    assert_eq!(open(&app, "zzz-1", "ZZZ").await.status(), StatusCode::CREATED, "configured");
}

/// A request with two `Authorization` headers is refused on both listeners, whichever of
/// them is right.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_authorization_headers_are_refused() {
    let token = "shop-secret-token";
    let (_env, app) = spawn_app(|c| {
        c.http.intake_auth = true;
        c.http.clients = vec![IntakeClientConfig {
            name: "shop".into(),
            token_sha256: vec![Secret::new(hex::encode(Sha256::digest(token.as_bytes())))],
            ..IntakeClientConfig::default()
        }];
        c.http.admin_token = Secret::new("admin-token");
    })
    .await;
    let twice = |url: String, right: &str| {
        app.client.get(url).header("Authorization", format!("Bearer {right}")).header("Authorization", "Bearer wrong")
    };
    let one = app.send(app.client.get(format!("{}/accounts/nope", app.intake_url)).bearer_auth(token)).await;
    assert_eq!(one.status(), StatusCode::NOT_FOUND, "one header: {}", one.text().await.unwrap_or_default());
    let res = app.send(twice(format!("{}/accounts/nope", app.intake_url), token)).await;
    assert_error(res, StatusCode::BAD_REQUEST, "bad_request", "two headers on the intake").await;
    let one = app.send(app.client.get(format!("{}/admin/transfers", app.admin_url)).bearer_auth("admin-token")).await;
    assert_eq!(one.status(), StatusCode::OK, "one header on the admin listener");
    let res = app.send(twice(format!("{}/admin/transfers", app.admin_url), "admin-token")).await;
    assert_error(res, StatusCode::BAD_REQUEST, "bad_request", "two headers on the admin listener").await;
}

/// Opening an id another client holds answers 409 `account_exists`, as the README says:
/// the caller learns that the id is taken, and nothing of the account (no owner, currency
/// or balance), which stays 404 to it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_clients_id_is_taken_and_tells_nothing_more() {
    let tokens = ["a-secret-token", "b-secret-token"];
    let (_env, app) = spawn_app(|c| {
        c.http.intake_auth = true;
        c.http.clients = ["a", "b"]
            .iter()
            .zip(tokens)
            .map(|(name, token)| IntakeClientConfig {
                name: (*name).into(),
                token_sha256: vec![Secret::new(hex::encode(Sha256::digest(token.as_bytes())))],
                ..IntakeClientConfig::default()
            })
            .collect();
    })
    .await;
    let as_client = |token: &str, id: &str| {
        app.client
            .post(format!("{}/accounts", app.intake_url))
            .bearer_auth(token)
            .json(&json!({ "id": id, "currency": "BRL", "initialBalanceCents": 0 }))
    };
    assert_eq!(app.send(as_client(tokens[0], "a-1")).await.status(), StatusCode::CREATED);
    let body = json_body(app.send(as_client(tokens[1], "a-1")).await).await;
    assert_eq!(body["error"]["code"], "account_exists", "{body}");
    assert_eq!(body.as_object().map(|o| o.len()), Some(1), "only the error: {body}");
    let look = app.send(app.client.get(format!("{}/accounts/a-1", app.intake_url)).bearer_auth(tokens[1])).await;
    assert_eq!(look.status(), StatusCode::NOT_FOUND);
}
