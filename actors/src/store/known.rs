//! What the ledger and antifraud read of the system of record before they act on an event:
//! the intake's `transfers` row of each transfer and antifraud's stored decision.

use std::collections::HashMap;

use diesel::sql_types::{Array, BigInt, Nullable, Text};
use diesel::QueryableByName;
use diesel_async::{AsyncPgConnection, RunQueryDsl};
use futures_util::FutureExt;
use tally_schema::events::TransferRequested;
use uuid::Uuid;

use super::Sent;

/// What the system of record holds of a transfer the ledger is asked to settle: the
/// intake's row and antifraud's stored decision, each `None` when absent.
#[derive(Debug, QueryableByName, Clone, Default, PartialEq, Eq)]
pub struct KnownTransfer {
    #[diesel(sql_type = diesel::sql_types::Uuid)]
    pub id: Uuid,
    #[diesel(sql_type = Nullable<Text>)]
    pub source_account: Option<String>,
    #[diesel(sql_type = Nullable<Text>)]
    pub destination_account: Option<String>,
    #[diesel(sql_type = Nullable<BigInt>)]
    pub amount_cents: Option<i64>,
    #[diesel(sql_type = Nullable<Text>)]
    pub currency: Option<String>,
    /// `None` when the intake never took the transfer.
    #[diesel(sql_type = Nullable<Text>)]
    pub status: Option<String>,
    /// Antifraud's stored outcome (`ANALYZED` or `BLOCKED`); `None` before it decided.
    #[diesel(sql_type = Nullable<Text>)]
    pub decision: Option<String>,
    #[diesel(sql_type = Nullable<Text>)]
    pub decided_source: Option<String>,
    #[diesel(sql_type = Nullable<Text>)]
    pub decided_destination: Option<String>,
    #[diesel(sql_type = Nullable<BigInt>)]
    pub decided_amount_cents: Option<i64>,
    #[diesel(sql_type = Nullable<Text>)]
    pub decided_currency: Option<String>,
}

/// What the intake and antifraud hold of each of `ids` (one entry per id, found or not).
///
/// # Errors
/// Any database error.
pub fn load_known<'a>(conn: &mut AsyncPgConnection, ids: &'a [Uuid]) -> Sent<'a, HashMap<Uuid, KnownTransfer>> {
    let sent = (!ids.is_empty()).then(|| {
        diesel::sql_query(
            "SELECT u.id, t.source_account::text AS source_account, \
                    t.destination_account::text AS destination_account, t.amount_cents, \
                    t.currency::text AS currency, t.status::text AS status, d.outcome::text AS decision, \
                    d.source_account::text AS decided_source, d.destination_account::text AS decided_destination, \
                    d.amount_cents AS decided_amount_cents, d.currency::text AS decided_currency \
             FROM unnest($1::uuid[]) AS u(id) \
             LEFT JOIN transfers t ON t.id = u.id \
             LEFT JOIN antifraud_decisions d ON d.transfer_id = u.id",
        )
        .bind::<Array<diesel::sql_types::Uuid>, _>(ids)
        .load::<KnownTransfer>(conn)
    });
    async move {
        let Some(sent) = sent else { return Ok(HashMap::new()) };
        Ok(sent.await?.into_iter().map(|k| (k.id, k)).collect())
    }
    .boxed()
}

/// The accounts, amount and currency the intake took under a transfer id.
#[derive(Debug, Clone, PartialEq, Eq, QueryableByName)]
pub struct Taken {
    #[diesel(sql_type = diesel::sql_types::Uuid)]
    pub id: Uuid,
    #[diesel(sql_type = Text)]
    pub source_account: String,
    #[diesel(sql_type = Text)]
    pub destination_account: String,
    #[diesel(sql_type = BigInt)]
    pub amount_cents: i64,
    #[diesel(sql_type = Text)]
    pub currency: String,
    #[diesel(sql_type = Text)]
    pub status: String,
}

impl Taken {
    /// Whether `t` asks for what the intake took.
    #[must_use]
    pub fn matches(&self, t: &TransferRequested) -> bool {
        self.source_account == t.source_account
            && self.destination_account == t.destination_account
            && self.amount_cents == t.amount_cents
            && self.currency == t.currency
    }
}

/// What the intake took under each of `ids` that it took as a transfer between accounts (an
/// issuance is no request antifraud decides).
///
/// # Errors
/// Any database error.
pub async fn taken(conn: &mut AsyncPgConnection, ids: &[Uuid]) -> Result<HashMap<Uuid, Taken>, diesel::result::Error> {
    if ids.is_empty() {
        return Ok(HashMap::new());
    }
    Ok(diesel::sql_query(
        "SELECT id, source_account::text AS source_account, destination_account::text AS destination_account, \
                amount_cents, currency::text AS currency, status::text AS status \
         FROM transfers WHERE id = ANY($1) AND kind = 'transfer'",
    )
    .bind::<Array<diesel::sql_types::Uuid>, _>(ids)
    .load::<Taken>(conn)
    .await?
    .into_iter()
    .map(|t| (t.id, t))
    .collect())
}
