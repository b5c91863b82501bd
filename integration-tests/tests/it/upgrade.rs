//! Upgrading a database across the migration that made opening balances issuance: the
//! expand step turns every opening balance into an issuance with postings and keeps an
//! older release's writes working (its POST /accounts still inserts a balance, which is
//! issued as it lands, audited as the older release's; anyone else's such INSERT is
//! refused); the contract step, once no older release runs, drops what only that release
//! wrote, after which no INSERT issues money. The ledger check holds at every step, and
//! fails on a balance inserted by hand after the contract.
#![allow(clippy::expect_used)] // tests: a failed expectation is a failed test, with its message

use std::path::Path;

use tally_actors::store::migrate;
use tally_integration_tests::{TestDb, DEFAULT_DATABASE_URL};

/// The migration that made opening balances issuance: everything before it is the older
/// release's schema.
const ISSUANCE: &str = "2026-12-04-000010_owners_and_issuance";

/// A fresh, empty database on the test server.
async fn empty_database() -> (String, String, tokio_postgres::Client) {
    let admin_url = std::env::var("TALLY_TEST_DATABASE_URL").unwrap_or_else(|_| DEFAULT_DATABASE_URL.to_owned());
    let name = format!("tally_upgrade_{}", uuid::Uuid::new_v4().simple());
    let (admin, connection) = tokio_postgres::connect(&admin_url, tokio_postgres::NoTls).await.expect("connect");
    tokio::spawn(connection);
    admin.batch_execute(&format!("CREATE DATABASE \"{name}\"")).await.expect("create database");
    let url = format!("{}/{name}", admin_url.rsplit_once('/').map_or(admin_url.as_str(), |(base, _)| base));
    let (client, connection) = tokio_postgres::connect(&url, tokio_postgres::NoTls).await.expect("connect");
    tokio::spawn(connection);
    (url, name, client)
}

/// Applies every migration before [`ISSUANCE`] as the older release did, recording each in
/// diesel's table as its harness does.
async fn migrate_as_the_older_release(client: &tokio_postgres::Client) {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../migrations");
    let mut names: Vec<String> =
        std::fs::read_dir(&dir).expect("migrations").filter_map(|e| e.ok()?.file_name().into_string().ok()).collect();
    names.sort();
    client
        .batch_execute(
            "CREATE TABLE __diesel_schema_migrations (version VARCHAR(50) PRIMARY KEY NOT NULL, \
             run_on TIMESTAMP NOT NULL DEFAULT CURRENT_TIMESTAMP)",
        )
        .await
        .expect("diesel's table");
    for name in names.iter().take_while(|n| n.as_str() < ISSUANCE) {
        let sql = std::fs::read_to_string(dir.join(name).join("up.sql")).expect("up.sql");
        client.batch_execute(&format!("BEGIN; {sql}; COMMIT;")).await.unwrap_or_else(|e| panic!("{name}: {e}"));
        let version: String = name.chars().filter(char::is_ascii_digit).take(14).collect();
        client
            .execute("INSERT INTO __diesel_schema_migrations (version) VALUES ($1)", &[&version])
            .await
            .expect("record");
    }
}

async fn check(url: &str) -> serde_json::Value {
    use diesel_async::AsyncConnection;
    let mut conn = diesel_async::AsyncPgConnection::establish(url).await.expect("diesel connection");
    let check = tally_actors::store::invariants::check_ledger(&mut conn).await.expect("ledger check");
    serde_json::to_value(check).expect("json")
}

/// The versions of the migrations under `dir` whose names sort at or after `first`.
fn since(first: &str, dir: &str) -> Vec<String> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(dir);
    let mut names: Vec<String> =
        std::fs::read_dir(&dir).expect("migrations").filter_map(|e| e.ok()?.file_name().into_string().ok()).collect();
    names.sort();
    names
        .iter()
        .filter(|n| n.as_str() >= first)
        .map(|n| n.chars().filter(char::is_ascii_digit).take(14).collect())
        .collect()
}

/// The names of the invariants a check reports broken.
fn failing(check: &serde_json::Value) -> Vec<String> {
    check["invariants"]
        .as_array()
        .expect("invariants")
        .iter()
        .filter(|i| i["ok"] == false)
        .map(|i| i["name"].as_str().unwrap_or_default().to_owned())
        .collect()
}

async fn connect(url: &str) -> tokio_postgres::Client {
    let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls).await.expect("connect");
    tokio::spawn(connection);
    client
}

async fn scalar(client: &tokio_postgres::Client, sql: &str) -> i64 {
    client.query_one(sql, &[]).await.unwrap_or_else(|e| panic!("{sql}: {e}")).get(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn opening_balances_become_issuance_and_an_older_release_keeps_working() {
    let db = TestDb::new().await; // the logging, and a client on the server
    let (url, name, client) = empty_database().await;
    migrate_as_the_older_release(&client).await;
    // The older release's data: accounts opened with balances, one transfer settled.
    client
        .batch_execute(
            "INSERT INTO accounts (id, balance_cents, currency, opening_balance_cents) \
               VALUES ('A', 1000, 'BRL', 1000), ('B', 0, 'BRL', 0), ('U', 500, 'USD', 500); \
             INSERT INTO transfers (id, source_account, destination_account, amount_cents, currency, status) \
               VALUES ('00000000-0000-0000-0000-000000000001', 'A', 'B', 300, 'BRL', 'SETTLED'); \
             INSERT INTO antifraud_decisions (transfer_id, source_account, destination_account, amount_cents, \
               currency, outcome, score, requested_at) \
               VALUES ('00000000-0000-0000-0000-000000000001', 'A', 'B', 300, 'BRL', 'ANALYZED', 5, now()); \
             INSERT INTO processed_transfers (transfer_id, outcome) VALUES ('00000000-0000-0000-0000-000000000001', 'SETTLED'); \
             INSERT INTO postings (transfer_id, account_id, kind, amount_cents) VALUES \
               ('00000000-0000-0000-0000-000000000001', 'A', 'D', 300), ('00000000-0000-0000-0000-000000000001', 'B', 'C', 300); \
             UPDATE accounts SET balance_cents = 700 WHERE id = 'A'; UPDATE accounts SET balance_cents = 300 WHERE id = 'B';",
        )
        .await
        .expect("the older release's data");

    // Expand: what `tally run` of this release applies at start.
    let applied = migrate::prepare_blocking(&url).expect("expand");
    assert_eq!(applied, since(ISSUANCE, "migrations"), "every migration from the issuance one on");
    let after = check(&url).await;
    assert_eq!(after["ok"], true, "{after}");
    assert_eq!(scalar(&client, "SELECT balance_cents FROM accounts WHERE id = 'issuance:BRL'").await, -1000);
    assert_eq!(scalar(&client, "SELECT balance_cents FROM accounts WHERE id = 'issuance:USD'").await, -500);
    assert_eq!(scalar(&client, "SELECT count(*) FROM transfers WHERE kind = 'issuance'").await, 2);
    assert_eq!(scalar(&client, "SELECT balance_cents FROM accounts WHERE id = 'A'").await, 700, "balances kept");

    // An instance of the older release, still running during the rolling upgrade, opens
    // an account the way it did, on a connection of its pools (named tally-*): the
    // balance is issued as it lands, on the older release's authority.
    let older_release = connect(&format!("{url}?application_name=tally-http")).await;
    older_release
        .execute(
            "INSERT INTO accounts (id, balance_cents, currency, opening_balance_cents, created_at) \
             VALUES ('OLD', 250, 'BRL', 250, now())",
            &[],
        )
        .await
        .expect("the older release's insert");
    let after = check(&url).await;
    assert_eq!(after["ok"], true, "{after}");
    assert_eq!(scalar(&client, "SELECT balance_cents FROM accounts WHERE id = 'issuance:BRL'").await, -1250);
    let audited = "SELECT count(*) FROM issuance_audit a JOIN transfers t ON t.id = a.transfer_id \
                   WHERE t.destination_account = 'OLD' AND a.authority = 'older-release'";
    assert_eq!(scalar(&client, audited).await, 1, "audited as the older release's");
    // Its POST /issuances, as it made a top-up: the balance credited, then tally_issue.
    older_release
        .batch_execute(
            "BEGIN; UPDATE accounts SET balance_cents = balance_cents + 50 WHERE id = 'OLD'; \
             SELECT tally_issue(ARRAY[gen_random_uuid()], ARRAY['OLD']::varchar[], ARRAY['BRL'], ARRAY[50::bigint], \
                                ARRAY['shop']::varchar[], ARRAY[now()]); COMMIT;",
        )
        .await
        .expect("the older release's top-up");
    let after = check(&url).await;
    assert_eq!(after["ok"], true, "the older release's top-up is audited as its own: {after}");
    assert_eq!(scalar(&client, audited).await, 2);
    // Anyone else's INSERT with a balance would mint money: refused.
    let minted = client
        .execute(
            "INSERT INTO accounts (id, currency, balance_cents, owner) VALUES ('SQL-MINT-1', 'BRL', 500000, 'alice')",
            &[],
        )
        .await
        .expect_err("a bare INSERT with a balance is refused");
    assert!(minted.as_db_error().is_some_and(|e| e.message().contains("mint money")), "{minted}");
    // The older release's own check still holds on the new schema.
    let older = scalar(&client, "SELECT (sum(balance_cents) - sum(opening_balance_cents))::bigint FROM accounts").await;
    assert_eq!(older, 0, "the older release's money check");

    // Contract, once no older instance runs.
    let applied = migrate::contract_blocking(&url).expect("contract");
    assert_eq!(applied, since(ISSUANCE, "migrations-contract"), "every contract step");
    let column = "SELECT count(*) FROM information_schema.columns WHERE table_name = 'accounts' AND column_name = 'opening_balance_cents'";
    assert_eq!(scalar(&client, column).await, 0);
    let after = check(&url).await;
    assert_eq!(after["ok"], true, "{after}");
    // No INSERT issues money any more, not even on a connection named as tally's: a
    // balance inserted by hand holds money without postings, and the check says so.
    older_release
        .execute(
            "INSERT INTO accounts (id, currency, balance_cents, owner) VALUES ('SQL-MINT-1', 'BRL', 500000, 'alice')",
            &[],
        )
        .await
        .expect("an insert after the contract");
    let after = check(&url).await;
    assert_eq!(failing(&after), ["money_conserved", "balances_match_postings"], "{after}");
    assert_eq!(scalar(&client, "SELECT count(*) FROM transfers WHERE destination_account = 'SQL-MINT-1'").await, 0);
    older_release.execute("DELETE FROM accounts WHERE id = 'SQL-MINT-1'", &[]).await.expect("undo the mint");
    let after = check(&url).await;
    assert_eq!(after["ok"], true, "{after}");
    // Nor is an issuance audited as the older release's any more, on any connection.
    older_release
        .batch_execute(
            "BEGIN; UPDATE accounts SET balance_cents = balance_cents + 50 WHERE id = 'OLD'; \
             SELECT tally_issue(ARRAY[gen_random_uuid()], ARRAY['OLD']::varchar[], ARRAY['BRL'], ARRAY[50::bigint], \
                                ARRAY['shop']::varchar[], ARRAY[now()]); COMMIT;",
        )
        .await
        .expect("an issuance by hand");
    assert_eq!(failing(&check(&url).await), ["issuances_authorized"]);
    assert_eq!(migrate::prepare_blocking(&url).expect("a start after the contract"), Vec::<String>::new());
    drop(client);
    db.execute(&format!("DROP DATABASE \"{name}\" WITH (FORCE)"), &[]).await;
}
