//! Whose money: an account belongs to the client that opened it, which alone debits it and
//! reads it; anyone may pay into it; the payee sees the transfer; money enters only by
//! issuance, by a client holding `issue`; and the ledger check proves every balance is its
//! postings and every currency sums to zero.
//!
//! Broker: the embedded broker (librdkafka's mock cluster, in this process).
#![allow(clippy::expect_used)] // tests: a failed expectation is a failed test, with its message

use reqwest::StatusCode;
use serde_json::{json, Value};
use sha2::{Digest, Sha256};
use tally_engine::config::IntakeClientConfig;
use tally_integration_tests::{assert_error, json_body, wait_until, Deadline, TestApp, TestEnv};

/// A client of `name`, holding `scopes` (`None`: the default, every one but `issue`).
fn client(name: &str, scopes: Option<&[&str]>) -> IntakeClientConfig {
    IntakeClientConfig {
        name: name.into(),
        token_sha256: vec![tally_engine::config::Secret::new(hex::encode(Sha256::digest(token(name).as_bytes())))],
        scopes: scopes.map(|s| s.iter().map(|s| (*s).to_owned()).collect()),
        ..IntakeClientConfig::default()
    }
}

fn token(name: &str) -> String {
    format!("{name}-secret-token")
}

/// A daemon whose intake authenticates clients `a`, `b`, `c`, an issuer and a reader.
async fn daemon() -> (TestEnv, TestApp) {
    let env = TestEnv::new().await;
    let app = env
        .spawn(|c| {
            c.http.intake_auth = true;
            c.http.clients = vec![
                client("a", None),
                client("b", None),
                client("c", None),
                client("issuer", Some(&["accounts:open", "issue", "read"])),
                client("reader", Some(&["read"])),
            ];
        })
        .await;
    (env, app)
}

async fn as_client(
    app: &TestApp,
    who: &str,
    method: reqwest::Method,
    path: &str,
    body: Option<Value>,
) -> reqwest::Response {
    let mut req = app.client.request(method, format!("{}{path}", app.intake_url)).bearer_auth(token(who));
    if let Some(body) = body {
        req = req.json(&body);
    }
    app.send(req).await
}

async fn post(app: &TestApp, who: &str, path: &str, body: Value) -> reqwest::Response {
    as_client(app, who, reqwest::Method::POST, path, Some(body)).await
}

async fn get(app: &TestApp, who: &str, path: &str) -> reqwest::Response {
    as_client(app, who, reqwest::Method::GET, path, None).await
}

fn transfer(from: &str, to: &str, amount: i64) -> Value {
    json!({ "sourceAccount": from, "destinationAccount": to, "amountCents": amount, "currency": "BRL" })
}

async fn open(app: &TestApp, who: &str, id: &str) {
    let res = post(app, who, "/accounts", json!({ "id": id, "currency": "BRL", "initialBalanceCents": 0 })).await;
    assert_eq!(res.status(), StatusCode::CREATED, "{who} opens {id}");
}

async fn balance(app: &TestApp, who: &str, id: &str) -> i64 {
    json_body(get(app, who, &format!("/accounts/{id}")).await).await["balanceCents"].as_i64().expect("balanceCents")
}

async fn ledger_check(app: &TestApp) -> Value {
    json_body(app.admin_get("/admin/ledger/check").await).await
}

/// B can neither debit A's account, nor read it, nor tell it from one that does not
/// exist; A pays B, and B (the payee) sees the transfer while C does not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_debits_and_reads_only_its_own_accounts() {
    let (env, app) = daemon().await;
    open(&app, "a", "OWN-A").await;
    open(&app, "b", "OWN-B").await;
    let res = app
        .send(
            app.client
                .post(format!("{}/issuances", app.intake_url))
                .bearer_auth(token("issuer"))
                .header("Idempotency-Key", "fund-own-a")
                .json(&json!({ "destinationAccount": "OWN-A", "amountCents": 10_000, "currency": "BRL" })),
        )
        .await;
    assert_eq!(res.status(), StatusCode::CREATED, "{}", json_body(res).await);
    let transfers_before = env.db.count("transfers").await;

    // B debits A's account: refused, naming the account, nothing written.
    let res = post(&app, "b", "/transfers", transfer("OWN-A", "OWN-B", 1_000)).await;
    let body = json_body(res).await;
    assert_eq!(body["error"]["code"], "debit_forbidden", "{body}");
    assert!(body["error"]["message"].as_str().unwrap_or_default().contains("OWN-A"), "{body}");
    // An account that does not exist gets the same answer: no existence oracle.
    let res = post(&app, "b", "/transfers", transfer("NOPE", "OWN-B", 1_000)).await;
    assert_eq!(
        (res.status(), json_body(res).await["error"]["code"].clone()),
        (StatusCode::FORBIDDEN, json!("debit_forbidden"))
    );
    assert_eq!(env.db.count("transfers").await, transfers_before, "nothing written");

    // B reads A's account: 404, as for one that does not exist.
    for id in ["OWN-A", "NOPE"] {
        assert_error(get(&app, "b", &format!("/accounts/{id}")).await, StatusCode::NOT_FOUND, "not_found", id).await;
    }
    assert_eq!(balance(&app, "a", "OWN-A").await, 10_000);

    // A pays B: settled; the payee sees it, a third client does not.
    let res = post(&app, "a", "/transfers", transfer("OWN-A", "OWN-B", 2_500)).await;
    assert_eq!(res.status(), StatusCode::CREATED);
    let id = json_body(res).await["id"].as_str().expect("id").to_owned();
    let settled = wait_until("the transfer settles", Deadline::DEFAULT, || async {
        let v = json_body(get(&app, "a", &format!("/transfers/{id}")).await).await;
        if v["status"] == "SETTLED" {
            Ok(v)
        } else {
            Err(v.to_string())
        }
    })
    .await;
    assert_eq!(settled["kind"], "transfer");
    let seen_by_payee = get(&app, "b", &format!("/transfers/{id}")).await;
    assert_eq!(seen_by_payee.status(), StatusCode::OK, "the payee sees money that came in");
    assert_error(get(&app, "c", &format!("/transfers/{id}")).await, StatusCode::NOT_FOUND, "not_found", "third party")
        .await;
    assert_eq!(balance(&app, "a", "OWN-A").await, 7_500);
    assert_eq!(balance(&app, "b", "OWN-B").await, 2_500);

    // Scopes: a reader reads nothing it does not own, and may not move money.
    let res = post(&app, "reader", "/transfers", transfer("OWN-A", "OWN-B", 1)).await;
    assert_error(res, StatusCode::FORBIDDEN, "scope_missing", "a reader posts a transfer").await;
    let check = ledger_check(&app).await;
    assert_eq!(check["ok"], true, "{check}");
}

/// No client without `issue` creates money by any route: an opening balance, a top-up, a
/// transfer to itself or from the issuance account, an account named like one. The
/// issuer's money is issuance with postings, and the check proves it sums to zero.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_a_client_with_issue_creates_money() {
    let (env, app) = daemon().await;
    open(&app, "b", "MINT-B").await;
    let huge = 1_000_000_000_000_000_i64;
    let res =
        post(&app, "b", "/accounts", json!({ "id": "MINT-X", "currency": "BRL", "initialBalanceCents": huge })).await;
    assert_error(res, StatusCode::FORBIDDEN, "scope_missing", "an opening balance without issue").await;
    let res =
        post(&app, "b", "/issuances", json!({ "destinationAccount": "MINT-B", "amountCents": 100, "currency": "BRL" }))
            .await;
    assert_error(res, StatusCode::FORBIDDEN, "scope_missing", "a top-up without issue").await;
    let res = post(&app, "b", "/transfers", transfer("MINT-B", "MINT-B", 100)).await;
    assert_error(res, StatusCode::UNPROCESSABLE_ENTITY, "validation_failed", "a transfer to itself").await;
    // The issuer opens an account with money, so issuance:BRL exists.
    let res =
        post(&app, "issuer", "/accounts", json!({ "id": "ISSUED", "currency": "BRL", "initialBalanceCents": 5_000 }))
            .await;
    assert_eq!(res.status(), StatusCode::CREATED);
    let res = post(&app, "b", "/transfers", transfer("issuance:BRL", "MINT-B", 100)).await;
    assert_error(res, StatusCode::FORBIDDEN, "debit_forbidden", "a transfer from the issuance account").await;
    let res = post(&app, "b", "/transfers", transfer("MINT-B", "issuance:BRL", 1)).await;
    assert_error(res, StatusCode::FORBIDDEN, "credit_forbidden", "a transfer to the issuance account").await;
    let res =
        post(&app, "b", "/accounts", json!({ "id": "issuance:USD", "currency": "USD", "initialBalanceCents": 0 }))
            .await;
    assert_error(res, StatusCode::UNPROCESSABLE_ENTITY, "validation_failed", "an account named like an issuer").await;
    assert_eq!(balance(&app, "b", "MINT-B").await, 0, "B has no money");
    assert_eq!(env.db.scalar_i64("SELECT count(*) FROM accounts WHERE id = 'MINT-X'", &[]).await, 0);

    // The issuer tops up, idempotently; the issuance is a transfer with its postings.
    let top_up = json!({ "destinationAccount": "MINT-B", "amountCents": 700, "currency": "BRL" });
    // Without a key a retry could issue twice: refused.
    let res = post(&app, "issuer", "/issuances", top_up.clone()).await;
    assert_error(res, StatusCode::BAD_REQUEST, "bad_request", "a top-up without Idempotency-Key").await;
    let first = app
        .send(
            app.client
                .post(format!("{}/issuances", app.intake_url))
                .bearer_auth(token("issuer"))
                .header("Idempotency-Key", "t-1")
                .json(&top_up),
        )
        .await;
    assert_eq!(first.status(), StatusCode::CREATED);
    let first = json_body(first).await;
    assert_eq!(
        (first["kind"].as_str(), first["status"].as_str(), first["sourceAccount"].as_str()),
        (Some("issuance"), Some("SETTLED"), Some("issuance:BRL"))
    );
    let again = app
        .send(
            app.client
                .post(format!("{}/issuances", app.intake_url))
                .bearer_auth(token("issuer"))
                .header("Idempotency-Key", "t-1")
                .json(&top_up),
        )
        .await;
    assert_eq!(again.status(), StatusCode::OK, "a retry replays");
    assert_eq!(json_body(again).await["id"], first["id"]);
    assert_eq!(balance(&app, "b", "MINT-B").await, 700, "issued once");
    let check = ledger_check(&app).await;
    assert_eq!(check["ok"], true, "{check}");
    let conserved = check["invariants"]
        .as_array()
        .and_then(|i| i.iter().find(|i| i["name"] == "money_conserved"))
        .expect("money_conserved");
    assert_eq!(conserved["detail"]["balanceCents"]["BRL"], "0", "{conserved}");
    assert_eq!(conserved["detail"]["issuedCents"]["BRL"], "5700", "{conserved}");
    let postings = env
        .db
        .scalar_i64(
            "SELECT count(*) FROM postings p JOIN transfers t ON t.id = p.transfer_id WHERE t.kind = 'issuance'",
            &[],
        )
        .await;
    assert_eq!(postings, 4, "a D and a C per issuance");
}

/// The ledger check fails on money from nowhere: a balance changed without postings, and
/// postings no transfer of the intake and antifraud accounts for.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_ledger_check_fails_on_money_from_nowhere() {
    let (env, app) = daemon().await;
    let res =
        post(&app, "issuer", "/accounts", json!({ "id": "NW-A", "currency": "BRL", "initialBalanceCents": 1_000 }))
            .await;
    assert_eq!(res.status(), StatusCode::CREATED);
    open(&app, "b", "NW-B").await;
    assert_eq!(ledger_check(&app).await["ok"], true);
    let failing = |check: &Value| -> Vec<String> {
        check["invariants"]
            .as_array()
            .expect("invariants")
            .iter()
            .filter(|i| i["ok"] == false)
            .map(|i| i["name"].as_str().unwrap_or_default().to_owned())
            .collect()
    };

    // A balance that changed without postings.
    env.db.execute("UPDATE accounts SET balance_cents = balance_cents + 1 WHERE id = 'NW-B'", &[]).await;
    let check = ledger_check(&app).await;
    assert_eq!(failing(&check), ["money_conserved", "balances_match_postings"], "{check}");
    env.db.execute("UPDATE accounts SET balance_cents = balance_cents - 1 WHERE id = 'NW-B'", &[]).await;

    // A settlement written straight into the tables, balances and all, for a transfer
    // antifraud never analyzed: balanced, yet from nowhere.
    let id = uuid::Uuid::new_v4();
    env.db.batch(&format!(
        "INSERT INTO transfers (id, source_account, destination_account, amount_cents, currency, status) \
         VALUES ('{id}', 'NW-A', 'NW-B', 10, 'BRL', 'SETTLED'); \
         INSERT INTO processed_transfers (transfer_id, outcome) VALUES ('{id}', 'SETTLED'); \
         INSERT INTO postings (transfer_id, account_id, kind, amount_cents) VALUES ('{id}', 'NW-A', 'D', 10), ('{id}', 'NW-B', 'C', 10); \
         UPDATE accounts SET balance_cents = balance_cents - 10 WHERE id = 'NW-A'; \
         UPDATE accounts SET balance_cents = balance_cents + 10 WHERE id = 'NW-B';"
    ))
    .await;
    let check = ledger_check(&app).await;
    assert_eq!(failing(&check), ["postings_have_provenance"], "{check}");
    env.db
        .batch(&format!(
        "DELETE FROM postings WHERE transfer_id = '{id}'; DELETE FROM processed_transfers WHERE transfer_id = '{id}'; \
         DELETE FROM transfers WHERE id = '{id}'; \
         UPDATE accounts SET balance_cents = balance_cents + 10 WHERE id = 'NW-A'; \
         UPDATE accounts SET balance_cents = balance_cents - 10 WHERE id = 'NW-B';"
    ))
        .await;
    assert_eq!(ledger_check(&app).await["ok"], true);

    // Money issued by hand with tally's own SQL function, balanced, postings and all, but
    // on nobody's authority: no audit row says which client holding `issue` made it.
    env.db
        .batch(&format!(
            "UPDATE accounts SET balance_cents = balance_cents + 500000 WHERE id = 'NW-B'; \
         SELECT tally_issue(ARRAY['{}'::uuid], ARRAY['NW-B']::varchar[], ARRAY['BRL'], ARRAY[500000::bigint], \
                            ARRAY['b']::varchar[], ARRAY[now()]);",
            uuid::Uuid::new_v4()
        ))
        .await;
    let check = ledger_check(&app).await;
    assert_eq!(failing(&check), ["issuances_authorized"], "{check}");
    // An audit row written by hand must at least name the issuance's own client.
    env.db
        .execute(
            "INSERT INTO issuance_audit (transfer_id, client, authority) \
             SELECT id, 'issuer', 'api' FROM transfers WHERE kind = 'issuance' AND destination_account = 'NW-B'",
            &[],
        )
        .await;
    let check = ledger_check(&app).await;
    assert_eq!(failing(&check), ["issuances_authorized"], "another client's authority: {check}");
}

/// An account inserted with a balance by anyone but tally would mint money: refused, and
/// nothing moved.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bare_sql_insert_mints_nothing() {
    let (env, app) = daemon().await;
    let minted = env
        .db
        .client()
        .execute(
            "INSERT INTO accounts (id, currency, balance_cents, owner) VALUES ('SQL-MINT-1', 'BRL', 500000, 'alice')",
            &[],
        )
        .await
        .expect_err("refused");
    assert!(minted.as_db_error().is_some_and(|e| e.message().contains("mint money")), "{minted}");
    assert_eq!(env.db.count("accounts").await, 0, "{minted}");
    assert_eq!(env.db.count("transfers").await, 0);
    assert_eq!(ledger_check(&app).await["ok"], true);
}
