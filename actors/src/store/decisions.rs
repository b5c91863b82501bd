//! The `antifraud_decisions` table: the first decision for a transfer, stored before the
//! Kafka transaction that publishes it commits, and read back by every later delivery of
//! the same transfer; plus the recent decisions a velocity window needs after a restart.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use chrono::{DateTime, Utc};
use diesel::sql_types::{Array, Integer, Nullable, Text, Timestamptz};
use diesel::QueryableByName;
use diesel_async::{AsyncPgConnection, RunQueryDsl};
use tally_schema::events::TransferRequested;
use uuid::Uuid;

/// `antifraud_decisions.outcome` of a transfer let through to the ledger.
pub const ANALYZED: &str = "ANALYZED";
/// `antifraud_decisions.outcome` of a blocked transfer.
pub const BLOCKED: &str = "BLOCKED";

/// One stored decision.
#[derive(Debug, Clone, PartialEq, Eq, QueryableByName)]
pub struct Decision {
    #[diesel(sql_type = diesel::sql_types::Uuid)]
    pub transfer_id: Uuid,
    #[diesel(sql_type = Text)]
    pub source_account: String,
    #[diesel(sql_type = Text)]
    pub destination_account: String,
    #[diesel(sql_type = diesel::sql_types::BigInt)]
    pub amount_cents: i64,
    #[diesel(sql_type = Text)]
    pub currency: String,
    #[diesel(sql_type = Text)]
    pub outcome: String,
    #[diesel(sql_type = Integer)]
    pub score: i32,
    #[diesel(sql_type = Nullable<Text>)]
    pub reason: Option<String>,
    #[diesel(sql_type = Timestamptz)]
    pub requested_at: DateTime<Utc>,
    #[diesel(sql_type = Timestamptz)]
    pub decided_at: DateTime<Utc>,
}

impl Decision {
    #[must_use]
    pub fn blocked(&self) -> bool {
        self.outcome == BLOCKED
    }

    /// Whether `t` asks for what was decided: a request under the same transfer id with
    /// other accounts, amount or currency does not get this decision.
    #[must_use]
    pub fn decides(&self, t: &TransferRequested) -> bool {
        self.source_account == t.source_account
            && self.destination_account == t.destination_account
            && self.amount_cents == t.amount_cents
            && self.currency == t.currency
    }
}

/// The stored decisions of `ids`.
///
/// # Errors
/// Any database error.
pub async fn load(
    conn: &mut AsyncPgConnection,
    ids: &[Uuid],
) -> Result<HashMap<Uuid, Decision>, diesel::result::Error> {
    if ids.is_empty() {
        return Ok(HashMap::new());
    }
    Ok(diesel::sql_query(
        "SELECT transfer_id, source_account::text AS source_account, \
         destination_account::text AS destination_account, amount_cents, currency::text AS currency, \
         outcome::text AS outcome, score, reason, requested_at, decided_at \
         FROM antifraud_decisions WHERE transfer_id = ANY($1)",
    )
    .bind::<Array<diesel::sql_types::Uuid>, _>(ids)
    .load::<Decision>(conn)
    .await?
    .into_iter()
    .map(|d| (d.transfer_id, d))
    .collect())
}

#[derive(QueryableByName)]
struct Inserted {
    #[diesel(sql_type = diesel::sql_types::Uuid)]
    transfer_id: Uuid,
}

/// Stores `decisions` unless a decision for the same transfer is there already (another
/// instance decided it first); returns the ids that were inserted.
///
/// # Errors
/// Any database error.
pub async fn store(
    conn: &mut AsyncPgConnection,
    decisions: &[Decision],
) -> Result<HashSet<Uuid>, diesel::result::Error> {
    if decisions.is_empty() {
        return Ok(HashSet::new());
    }
    let ids: Vec<Uuid> = decisions.iter().map(|d| d.transfer_id).collect();
    let accounts: Vec<&str> = decisions.iter().map(|d| d.source_account.as_str()).collect();
    let destinations: Vec<&str> = decisions.iter().map(|d| d.destination_account.as_str()).collect();
    let amounts: Vec<i64> = decisions.iter().map(|d| d.amount_cents).collect();
    let currencies: Vec<&str> = decisions.iter().map(|d| d.currency.as_str()).collect();
    let outcomes: Vec<&str> = decisions.iter().map(|d| d.outcome.as_str()).collect();
    let scores: Vec<i32> = decisions.iter().map(|d| d.score).collect();
    let reasons: Vec<Option<&str>> = decisions.iter().map(|d| d.reason.as_deref()).collect();
    let requested: Vec<DateTime<Utc>> = decisions.iter().map(|d| d.requested_at).collect();
    let decided: Vec<DateTime<Utc>> = decisions.iter().map(|d| d.decided_at).collect();
    Ok(diesel::sql_query(
        "INSERT INTO antifraud_decisions (transfer_id, source_account, destination_account, amount_cents, currency, \
                                          outcome, score, reason, requested_at, decided_at) \
         SELECT * FROM unnest($1::uuid[], $2::text[], $8::text[], $9::bigint[], $10::text[], $3::text[], $4::int[], \
                              $5::text[], $6::timestamptz[], $7::timestamptz[]) \
         ON CONFLICT (transfer_id) DO NOTHING RETURNING transfer_id",
    )
    .bind::<Array<diesel::sql_types::Uuid>, _>(&ids)
    .bind::<Array<Text>, _>(&accounts)
    .bind::<Array<Text>, _>(&outcomes)
    .bind::<Array<Integer>, _>(&scores)
    .bind::<Array<Nullable<Text>>, _>(&reasons)
    .bind::<Array<Timestamptz>, _>(&requested)
    .bind::<Array<Timestamptz>, _>(&decided)
    .bind::<Array<Text>, _>(&destinations)
    .bind::<Array<diesel::sql_types::BigInt>, _>(&amounts)
    .bind::<Array<Text>, _>(&currencies)
    .load::<Inserted>(conn)
    .await?
    .into_iter()
    .map(|r| r.transfer_id)
    .collect())
}

/// One transfer inside the velocity window, as stored.
#[derive(Debug, Clone, PartialEq, Eq, QueryableByName)]
pub struct Recent {
    #[diesel(sql_type = Text)]
    pub source_account: String,
    #[diesel(sql_type = diesel::sql_types::Uuid)]
    pub transfer_id: Uuid,
    #[diesel(sql_type = Timestamptz)]
    pub requested_at: DateTime<Utc>,
}

/// Every decided transfer requested within `window` of the newest decided one (event
/// time, but never later than now, so one future-dated request cannot empty the window),
/// oldest first: what a velocity window needs after a restart or rebalance.
///
/// # Errors
/// Any database error.
pub async fn recent(conn: &mut AsyncPgConnection, window: Duration) -> Result<Vec<Recent>, diesel::result::Error> {
    diesel::sql_query(
        "SELECT source_account::text AS source_account, transfer_id, requested_at FROM antifraud_decisions \
         WHERE requested_at >= LEAST((SELECT max(requested_at) FROM antifraud_decisions), now()) \
                               - make_interval(secs => $1) \
         ORDER BY requested_at",
    )
    .bind::<diesel::sql_types::Double, _>(window.as_secs_f64())
    .load(conn)
    .await
}
