//! `heartbeats`: the dependency probe of a stage. Asks the database whether it is in
//! recovery or read-only, then writes the stage's one row: a database that answers but
//! cannot take a write (a standby after a failover, a demoted primary, a full disk) fails
//! the probe whatever the error text of the statement that failed.

use diesel::sql_types::{Bool, Text};
use diesel::QueryableByName;
use diesel_async::{AsyncPgConnection, RunQueryDsl};

#[derive(QueryableByName)]
struct Mode {
    #[diesel(sql_type = Bool)]
    in_recovery: bool,
    #[diesel(sql_type = Text)]
    read_only: String,
}

/// Why the database cannot take `stage`'s writes, or `Ok` when it just took one.
///
/// # Errors
/// The reason, in words: in recovery, read-only, or the error of the probe's own write.
pub async fn probe(conn: &mut AsyncPgConnection, stage: &str) -> Result<(), String> {
    let mode = diesel::sql_query(
        "SELECT pg_is_in_recovery() AS in_recovery, current_setting('transaction_read_only') AS read_only",
    )
    .get_result::<Mode>(conn)
    .await
    .map_err(|e| format!("the database does not answer: {e}"))?;
    if mode.in_recovery {
        return Err("the database is in recovery (a standby)".into());
    }
    if mode.read_only == "on" {
        return Err("the database is read-only (default_transaction_read_only)".into());
    }
    diesel::sql_query(
        "INSERT INTO heartbeats (stage, beat_at) VALUES ($1, now()) \
         ON CONFLICT (stage) DO UPDATE SET beat_at = excluded.beat_at",
    )
    .bind::<Text, _>(stage)
    .execute(conn)
    .await
    .map(drop)
    .map_err(|e| format!("the database refuses a write: {e}"))
}
