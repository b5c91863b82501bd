//! What a client of the daemon does and checks: HTTP requests, JSON bodies, metrics, the
//! transfer flow end to end, error responses.

use super::*;

/// Reads a JSON response body, failing with the status and raw body when it is not JSON.
///
/// # Panics
/// When the body cannot be read or is not JSON.
pub async fn json_body(res: reqwest::Response) -> serde_json::Value {
    let status = res.status();
    let text = res.text().await.expect("read the response body");
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("response {status} is not JSON ({e}): {text}"))
}

/// The value of the sample `series` in Prometheus text (`name` or `name{labels}` exactly as
/// exposed, labels sorted by name); `None` when absent.
#[must_use]
pub fn metric_value(metrics: &str, series: &str) -> Option<f64> {
    metrics.lines().filter(|l| !l.starts_with('#')).find_map(|line| {
        let (name, value) = line.rsplit_once(' ')?;
        (name == series).then(|| value.parse().ok()).flatten()
    })
}

/// Asserts an error response: `status`, a JSON content type, and exactly the body
/// `{"error":{"code": code, "message": <non-empty>}}`.
///
/// # Panics
/// When the response is not that error.
pub async fn assert_error(res: reqwest::Response, status: reqwest::StatusCode, code: &str, case: &str) {
    assert_eq!(res.status(), status, "{case}: status");
    let content_type =
        res.headers().get(reqwest::header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).unwrap_or("").to_owned();
    assert!(content_type.starts_with("application/json"), "{case}: content type {content_type:?}");
    let body = json_body(res).await;
    assert_eq!(body["error"]["code"], code, "{case}: error code in {body}");
    let message = body["error"]["message"].as_str().unwrap_or("");
    assert!(!message.is_empty(), "{case}: error message in {body}");
    assert_eq!(body.as_object().map(|o| o.len()), Some(1), "{case}: only `error` at the top level of {body}");
}

/// `POST /accounts`; asserts 201.
///
/// # Panics
/// When the account is not created.
pub async fn create_account(app: &TestApp, id: &str, balance: i64, currency: &str) {
    let res = app
        .post_json("/accounts", &serde_json::json!({ "id": id, "currency": currency, "initialBalanceCents": balance }))
        .await;
    assert_eq!(res.status(), reqwest::StatusCode::CREATED, "create account {id}");
}

/// `POST /transfers` in BRL; asserts 201 and returns the transfer id.
///
/// # Panics
/// When the transfer is not accepted.
pub async fn post_transfer(app: &TestApp, from: &str, to: &str, amount: i64) -> uuid::Uuid {
    let res = app
        .post_json(
            "/transfers",
            &serde_json::json!({ "sourceAccount": from, "destinationAccount": to, "amountCents": amount, "currency": "BRL" }),
        )
        .await;
    assert_eq!(res.status(), reqwest::StatusCode::CREATED, "POST /transfers");
    serde_json::from_value(json_body(res).await["id"].clone()).expect("transfer id")
}

/// Waits until the transfer leaves PENDING and returns its view.
pub async fn final_state(app: &TestApp, id: uuid::Uuid) -> serde_json::Value {
    wait_until(&format!("transfer {id} reaches a final status"), Deadline::DEFAULT, || async {
        let body = json_body(app.get(&format!("/transfers/{id}")).await).await;
        if body["status"] == "PENDING" {
            Err(body.to_string())
        } else {
            Ok(body)
        }
    })
    .await
}

/// Waits until `GET http://<intake>/transfers/<id>` shows SETTLED: for a daemon run as a
/// child process, known by its intake `host:port` only.
pub async fn wait_settled(http: &reqwest::Client, intake: &str, id: &str) {
    wait_until(&format!("transfer {id} is settled"), Deadline::DEFAULT, || async {
        let view: serde_json::Value = http
            .get(format!("http://{intake}/transfers/{id}"))
            .send()
            .await
            .map_err(|e| e.to_string())?
            .json()
            .await
            .map_err(|e| e.to_string())?;
        if view["status"] == "SETTLED" {
            Ok(())
        } else {
            Err(view.to_string())
        }
    })
    .await;
}

/// The number of postings of a transfer.
pub async fn postings_of(db: &TestDb, id: uuid::Uuid) -> i64 {
    db.scalar_i64("SELECT count(*) FROM postings WHERE transfer_id = $1", &[&id]).await
}

/// An account's balance, through `GET /accounts/{id}`.
///
/// # Panics
/// When the answer has no balance.
pub async fn balance_of(app: &TestApp, id: &str) -> i64 {
    json_body(app.get(&format!("/accounts/{id}")).await).await["balanceCents"].as_i64().expect("balanceCents")
}

/// `/admin/ledger/check`, asserted ok (every invariant named in the message otherwise).
pub async fn assert_ledger_ok(app: &TestApp) -> serde_json::Value {
    let check = json_body(app.admin_get("/admin/ledger/check").await).await;
    assert_eq!(check["ok"], true, "{check}");
    check
}
