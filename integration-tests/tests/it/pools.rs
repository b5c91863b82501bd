//! Black-box tests of the database pools, one per stage: a stage that holds every
//! connection of its pool leaves intake and the other stages theirs; `/metrics` shows each
//! pool; `pg_stat_activity` names each pool's connections; a connection is verified at
//! checkout only after it sat idle.
//!
//! Broker: the embedded broker (librdkafka's mock cluster) of the harness. Database: a fresh
//! PostgreSQL database per test.
#![allow(clippy::expect_used)] // tests: a failed expectation is a failed test, with its message

use std::time::Duration;

use serde_json::{json, Value};
use tally_integration_tests::{json_body, metric_value, run_only, spawn_app, wait_until, Deadline, TestDb};
use uuid::Uuid;

/// Connections of the ledger's pool, and settlement transactions at once.
const LEDGER_POOL: usize = 4;

fn analyzed(transfer_id: Uuid, from: &str, to: &str, amount: i64) -> Value {
    json!({
        "eventId": Uuid::new_v4(), "transferId": transfer_id, "sourceAccount": from,
        "destinationAccount": to, "amountCents": amount, "currency": "BRL", "score": 10,
        "analyzedAt": "2026-11-30T00:00:00Z",
    })
}

/// `application_name` of every connection of this database waiting for a lock.
async fn waiting_on_locks(db: &TestDb) -> Vec<String> {
    db.query(
        "SELECT application_name FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'",
        &[],
    )
    .await
    .iter()
    .map(|r| r.get(0))
    .collect()
}

/// The ledger holds every connection of its pool: its four settlement transactions wait
/// on account rows this test keeps locked. Meanwhile intake creates an account and an
/// order (on the single shared pool they failed after the connect timeout with 503 "no
/// database connection"), the outbox publishes the order and the orders stage
/// materializes it; `/metrics` shows the ledger's pool full and the gauges of every pool
/// of a running stage (and none of the stages that do not run); `pg_stat_activity` names
/// the waiting connections `tally-ledger`. Released, the four transfers settle.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stage_holding_every_connection_of_its_pool_starves_no_other_stage() {
    let (env, app) = spawn_app(|c| {
        run_only(c, &["outbox", "ledger", "orders"]);
        c.database.pools.set(tally_engine::config::DbPool::named("ledger"), LEDGER_POOL);
        c.ledger.max_concurrent_batches = LEDGER_POOL;
        // A transaction per transfer: each holds a connection while it waits.
        c.ledger.batch_size = 1;
        // The settlements wait on the locks for the whole test (lock_timeout follows it).
        c.database.statement_timeout = Duration::from_secs(120);
    })
    .await;
    let sources: Vec<String> = (0..LEDGER_POOL).map(|i| format!("POOL-S{i}")).collect();
    for (i, source) in sources.iter().enumerate() {
        let destination = format!("POOL-D{i}");
        env.db.fund_accounts(&[(source.as_str(), 1_000), (destination.as_str(), 0)]).await;
    }
    // FOR NO KEY UPDATE: settlement's FOR UPDATE waits on it; intake's foreign key checks
    // (FOR KEY SHARE) would not.
    let mut holder = env.db.connect().await;
    let hold = holder.transaction().await.expect("begin");
    let locked = hold
        .query("SELECT id FROM accounts WHERE id = ANY($1) FOR NO KEY UPDATE", &[&sources])
        .await
        .expect("lock the source accounts");
    assert_eq!(locked.len(), LEDGER_POOL);

    let upstream = env.upstream();
    for (i, source) in sources.iter().enumerate() {
        let event = analyzed(Uuid::new_v4(), source, &format!("POOL-D{i}"), 100);
        upstream.analyzed(&event, None).await;
    }
    wait_until("every connection of the ledger's pool waits on a locked account", Deadline::DEFAULT, || async {
        match waiting_on_locks(&env.db).await {
            w if w.len() >= LEDGER_POOL => Ok(()),
            w => Err(format!("waiting on locks: {w:?}")),
        }
    })
    .await;

    let res =
        app.post_json("/accounts", &json!({ "id": "POOL-NEW", "currency": "BRL", "initialBalanceCents": 5 })).await;
    let status = res.status();
    assert_eq!(status, 201, "intake has its own connections: {}", res.text().await.unwrap_or_default());
    let order =
        json!({ "externalReference": "EXT-POOLS", "customerId": "CUST-1", "amountCents": 4_990, "currency": "BRL" });
    let res = app.post_json("/orders", &order).await;
    assert_eq!(res.status(), 201, "POST /orders");
    let order_id: Uuid = serde_json::from_value(json_body(res).await["id"].clone()).expect("order id");
    wait_until("the outbox and the orders stage materialize the order", Deadline::DEFAULT, || async {
        match env.db.scalar_i64("SELECT count(*) FROM received_orders WHERE order_id = $1", &[&order_id]).await {
            1 => Ok(()),
            n => Err(format!("{n} rows")),
        }
    })
    .await;

    let metrics = app.metrics().await;
    let series = |name: &str, labels: &str| metric_value(&metrics, &format!("tally_db_pool_{name}{{{labels}}}"));
    let full = LEDGER_POOL as f64;
    assert_eq!(series("connections", r#"pool="ledger",state="in_use""#), Some(full), "{metrics}");
    assert_eq!(series("max_connections", r#"pool="ledger""#), Some(full));
    assert_eq!(series("max_connections", r#"pool="http""#), Some(4.0), "the harness's HTTP pool");
    for pool in ["http", "outbox", "ledger", "orders"] {
        for state in ["in_use", "idle"] {
            assert!(series("connections", &format!(r#"pool="{pool}",state="{state}""#)).is_some(), "{pool} {state}");
        }
        assert!(series("waiting", &format!(r#"pool="{pool}""#)).is_some(), "{pool} waiting");
    }
    for pool in ["antifraud", "projection", "notifications"] {
        assert_eq!(series("max_connections", &format!(r#"pool="{pool}""#)), None, "{pool} does not run here");
    }
    let waiting = waiting_on_locks(&env.db).await;
    assert!(waiting.len() == LEDGER_POOL && waiting.iter().all(|a| a == "tally-ledger"), "{waiting:?}");
    let names: Vec<String> = env
        .db
        .query(
            "SELECT DISTINCT application_name FROM pg_stat_activity \
             WHERE datname = current_database() AND application_name LIKE 'tally-%' ORDER BY 1",
            &[],
        )
        .await
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(
        names,
        ["tally-http", "tally-ledger", "tally-orders", "tally-outbox", "tally-outbox-listen", "tally-outbox-notify"],
        "no connection of a stopped stage"
    );

    hold.rollback().await.expect("release the accounts");
    wait_until("the four transfers settle", Deadline::DEFAULT, || async {
        let credited = env
            .db
            .scalar_i64("SELECT count(*) FROM accounts WHERE id LIKE 'POOL-D%' AND balance_cents = 100", &[])
            .await;
        if credited == LEDGER_POOL as i64 {
            Ok(())
        } else {
            Err(format!("{credited} credited"))
        }
    })
    .await;
}

/// The server process behind a connection of `pool`, and the connection.
async fn checkout(pool: &tally_actors::store::PgPool) -> (i32, tally_actors::store::PooledConnection) {
    use diesel::sql_types::Integer;
    use diesel_async::RunQueryDsl;
    let mut conn = pool.get().await.expect("a connection");
    let pid = diesel::select(diesel::dsl::sql::<Integer>("pg_backend_pid()"))
        .get_result::<i32>(&mut conn)
        .await
        .expect("a working connection");
    (pid, conn)
}

/// The statement the server process `pid` ran last.
async fn last_statement(db: &TestDb, pid: i32) -> String {
    db.query("SELECT query FROM pg_stat_activity WHERE pid = $1", &[&pid]).await[0].get(0)
}

/// A connection checked out again at once goes straight to its next statement; one that sat
/// idle past `VERIFY_AFTER` is asked `SELECT 1` first; one the server closed while it sat
/// idle is replaced before anyone uses it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_is_verified_at_checkout_only_after_it_sat_idle() {
    use tally_actors::store::VERIFY_AFTER;
    let db = TestDb::new().await;
    let pool = db.pool(1, Duration::from_secs(10), "tally-test-pool");
    let (first, conn) = checkout(&pool).await;
    drop(conn);
    // Two checkouts within the window (a machine too loaded for that gets a few tries).
    let mut within = false;
    for _ in 0..5 {
        let started = std::time::Instant::now();
        let (pid, conn) = checkout(&pool).await;
        assert_eq!(pid, first, "one connection");
        drop(conn);
        let conn = pool.get().await.expect("the same connection");
        if started.elapsed() < VERIFY_AFTER {
            let last = last_statement(&db, first).await;
            assert!(last.contains("pg_backend_pid"), "checked out again at once, its last statement is ours: {last}");
            within = true;
            break;
        }
        drop(conn);
    }
    assert!(within, "no two checkouts within {VERIFY_AFTER:?} in five tries");

    tokio::time::sleep(VERIFY_AFTER + Duration::from_millis(200)).await;
    let conn = pool.get().await.expect("the same connection");
    assert_eq!(last_statement(&db, first).await, "SELECT $1", "idle past the window, it was verified first");
    drop(conn);

    tokio::time::sleep(VERIFY_AFTER + Duration::from_millis(200)).await;
    db.query("SELECT pg_terminate_backend($1)", &[&first]).await;
    wait_until("the server ends the connection's process", Deadline::DEFAULT, || async {
        let alive = db.scalar_i64("SELECT count(*) FROM pg_stat_activity WHERE pid = $1", &[&first]).await;
        if alive == 0 {
            Ok(())
        } else {
            Err("still running".to_owned())
        }
    })
    .await;
    let (second, _conn) = checkout(&pool).await;
    assert_ne!(first, second, "a new connection replaced the one the server closed");
}
