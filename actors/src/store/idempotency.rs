//! Serialising the idempotency keys whose scopes meet across clients. A key is unique per
//! (client, key), so the unique index does not order an anonymous request against a retry
//! of the client that adopts anonymous requests (the cut-over to an authenticated intake):
//! without a lock, each transaction reads before the other commits and both write. Every
//! transaction that writes an anonymous keyed row, or looks up the anonymous scope for an
//! adopting client, first takes a transaction-scoped advisory lock per key.

use diesel::sql_types::{Array, Text};
use diesel_async::{AsyncPgConnection, RunQueryDsl};

/// Takes, in one statement and in the order of their lock ids (so two transactions never
/// wait on each other in a cycle), the advisory locks of `keys` in `namespace` (the table).
/// Held until the transaction ends. Call it before the transaction's first insert of such a
/// row: a transaction never holds a row another one waits for while it waits for a lock.
///
/// # Errors
/// When the database fails.
pub async fn lock_keys(
    conn: &mut AsyncPgConnection,
    namespace: &str,
    keys: Vec<String>,
) -> Result<(), diesel::result::Error> {
    if keys.is_empty() {
        return Ok(());
    }
    // Volatile functions in a select list are evaluated after the sort beneath them.
    diesel::sql_query(
        "SELECT pg_advisory_xact_lock(id) FROM \
         (SELECT DISTINCT hashtextextended($1 || ':' || k, 0) AS id FROM unnest($2::text[]) AS k ORDER BY 1) AS ids",
    )
    .bind::<Text, _>(namespace)
    .bind::<Array<Text>, _>(keys)
    .execute(conn)
    .await?;
    Ok(())
}
