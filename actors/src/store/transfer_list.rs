//! `transfers`, read-only: the operator console's transfer list, newest first, by account
//! (either side) and status, a page at a time. Transfer ids are UUIDv7, so id order is
//! creation order and the last id of a page is where the next one starts.

use diesel::prelude::*;
use diesel_async::{AsyncPgConnection, RunQueryDsl};
use tally_schema::models::Transfer;
use tally_schema::schema::transfers;
use uuid::Uuid;

/// What to list; every filter optional.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TransferFilter {
    /// Transfers from or to this account.
    pub account: Option<String>,
    /// Transfers in this status (`PENDING`, `SETTLED`, `REJECTED`).
    pub status: Option<String>,
    /// Transfers older than this one (the previous page's last id).
    pub before: Option<Uuid>,
}

/// At most `limit` transfers that `filter` selects, newest first.
///
/// # Errors
/// Any database error.
pub async fn list(
    conn: &mut AsyncPgConnection,
    filter: &TransferFilter,
    limit: i64,
) -> Result<Vec<Transfer>, diesel::result::Error> {
    let mut query =
        transfers::table.select(Transfer::as_select()).order(transfers::id.desc()).limit(limit).into_boxed();
    if let Some(account) = &filter.account {
        query = query.filter(transfers::source_account.eq(account).or(transfers::destination_account.eq(account)));
    }
    if let Some(status) = &filter.status {
        query = query.filter(transfers::status.eq(status));
    }
    if let Some(before) = filter.before {
        query = query.filter(transfers::id.lt(before));
    }
    query.load(conn).await
}
