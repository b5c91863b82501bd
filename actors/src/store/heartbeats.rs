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

/// Why the database cannot take `stage`'s writes, or `Ok` when it just took one (or when
/// the probe itself failed for a reason that says nothing about the database being down:
/// a missing table, a permission, a lock; then the record is blamed as before).
///
/// # Errors
/// The reason, in words: in recovery, read-only, or an error of the probe's own statements
/// that marks the database unavailable (connection lost, read-only, disk full).
pub async fn probe(conn: &mut AsyncPgConnection, stage: &str) -> Result<(), String> {
    let mode = match diesel::sql_query(
        "SELECT pg_is_in_recovery() AS in_recovery, current_setting('transaction_read_only') AS read_only",
    )
    .get_result::<Mode>(conn)
    .await
    {
        Ok(mode) => mode,
        Err(e) => return down_or_inconclusive("the database does not answer", &e),
    };
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
    .map_or_else(|e| down_or_inconclusive("the database refuses a write", &e), |_| Ok(()))
}

/// A failed probe statement: the database is down when the error says so; anything else
/// is no evidence either way.
fn down_or_inconclusive(what: &str, e: &diesel::result::Error) -> Result<(), String> {
    use crate::supervise::{Classify, ErrorClass};
    if e.class() == ErrorClass::Unavailable {
        Err(format!("{what}: {e}"))
    } else {
        tracing::debug!(error = %e, "The dependency probe could not tell; the record is blamed.");
        Ok(())
    }
}
