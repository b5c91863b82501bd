//! The bench's own set-up against PostgreSQL: the account ids it writes in SQL are the ids
//! its clients use, at every size (a million accounts included).
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
