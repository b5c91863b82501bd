//! The bench's own SQL against PostgreSQL: the account ids it writes in SQL are the ids its
//! clients use, at every size (a million accounts included); the per-hop breakdown reads
//! the stages' times right.
#![allow(clippy::expect_used)] // tests: a failed expectation is a failed test, with its message

use tally_engine::bench::{account, ACCOUNT_ID_SQL};
use tally_integration_tests::TestDb;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn account_ids_in_sql_match_the_clients_ids_past_five_digits() {
    let db = TestDb::new().await;
    for i in [0_i64, 7, 99_999, 100_000, 999_999, 1_234_567] {
        let sql = format!("SELECT {ACCOUNT_ID_SQL} FROM (SELECT $1::bigint AS i) AS x");
        let rows = db.query(&sql, &[&i]).await;
        let in_sql: String = rows[0].get(0);
        assert_eq!(in_sql, account(usize::try_from(i).expect("small")), "account {i}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_hop_breakdown_reads_each_stages_time() {
    let db = TestDb::new().await;
    // Two settled transfers whose stages took known times (ms after t0), and one pending.
    let setup = "INSERT INTO accounts (id, balance_cents, currency) VALUES ('H-A', 0, 'BRL'), ('H-B', 0, 'BRL');
        CREATE TEMP TABLE plan (id uuid, k int);
        INSERT INTO plan VALUES (gen_random_uuid(), 1), (gen_random_uuid(), 2), (gen_random_uuid(), 3);
        INSERT INTO transfers (id, source_account, destination_account, amount_cents, currency, status, created_at, updated_at)
          SELECT id, 'H-A', 'H-B', 1, 'BRL', CASE WHEN k < 3 THEN 'SETTLED' ELSE 'PENDING' END,
                 timestamptz '2026-01-01' , timestamptz '2026-01-01' + make_interval(secs => 0.5 * k) FROM plan;
        INSERT INTO antifraud_decisions (transfer_id, source_account, destination_account, amount_cents, currency,
                                         outcome, score, requested_at, decided_at)
          SELECT id, 'H-A', 'H-B', 1, 'BRL', 'ANALYZED', 5, timestamptz '2026-01-01',
                 timestamptz '2026-01-01' + make_interval(secs => 0.1 * k) FROM plan;
        INSERT INTO processed_transfers (transfer_id, outcome, processed_at)
          SELECT id, 'SETTLED', timestamptz '2026-01-01' + make_interval(secs => 0.2 * k) FROM plan WHERE k < 3;
        INSERT INTO outbox_events (id, topic, key, event_type, payload, created_at, published_at)
          SELECT gen_random_uuid(), 'transfers.requested', 'H-A', 'TransferRequested',
                 json_build_object('transferId', id)::text, timestamptz '2026-01-01',
                 timestamptz '2026-01-01' + make_interval(secs => 0.05 * k) FROM plan
          UNION ALL
          SELECT gen_random_uuid(), 'transfers.settled', 'H-A', 'TransferSettled',
                 json_build_object('transferId', id)::text, timestamptz '2026-01-01',
                 timestamptz '2026-01-01' + make_interval(secs => 0.3 * k) FROM plan WHERE k < 3;";
    db.batch(setup).await;
    let client = db.connect().await;
    let hops = tally_engine::bench::hops::breakdown(&client).await.expect("the breakdown");
    let seen: Vec<(&str, usize, Option<f64>, Option<f64>)> =
        hops.iter().map(|h| (h.name, h.samples, h.p50_ms.map(f64::round), h.p99_ms.map(f64::round))).collect();
    // Transfer k: published at 50k ms, decided at 100k, settled at 200k, announced at
    // 300k, final at 500k. Only the settled ones (k = 1, 2) count.
    assert_eq!(
        seen,
        [
            ("intake -> publish", 2, Some(50.0), Some(100.0)),
            ("publish -> decision", 2, Some(50.0), Some(100.0)),
            ("decision -> settlement", 2, Some(100.0), Some(200.0)),
            ("settlement -> publish", 2, Some(100.0), Some(200.0)),
            ("publish -> final status", 2, Some(200.0), Some(400.0)),
        ]
    );
}
