//! Settlement, set-based: one database transaction
//! settles a batch of transfers with the same effects as settling them one by one in batch
//! order.
//!
//! The rules are applied in memory by [`super::plan::plan_batch`] (plain, unit-tested);
//! the statements are in [`crate::store::accounts`] and [`crate::store::transfers`]. The
//! bench's one-transfer baseline is `tally_engine::bench::baseline::ledger`.
//!
//! 1. Inbox: `INSERT INTO processed_transfers ... ON CONFLICT (transfer_id) DO NOTHING
//!    RETURNING transfer_id`, in transfer id order (so batches sharing redelivered
//!    transfers cannot deadlock); a transfer whose row was not inserted is a duplicate and
//!    has no effect.
//! 2. With it, read what the system of record holds of the batch's transfers: the intake's
//!    `transfers` rows and antifraud's stored decisions. The ledger acts only on a transfer
//!    the intake took, still PENDING, with an ANALYZED decision, the event matching both
//!    (accounts, amount, currency); any other event is refused as poison and its inbox
//!    claim undone ([`super::plan::admits`]).
//! 3. Lock the accounts of the admitted transfers, `ORDER BY id FOR UPDATE`: every
//!    transaction locks in the same global order, so concurrent batches (and A->B against
//!    B->A) cannot deadlock. An issuance account is never locked here: a transfer naming
//!    one finds it missing (ACCOUNT_NOT_FOUND), and only issuance moves it.
//! 4. Rules in memory, in batch order, on running balances, so two transfers of one batch
//!    touching the same account see each other's effect: ACCOUNT_NOT_FOUND,
//!    CURRENCY_MISMATCH, INSUFFICIENT_FUNDS, BALANCE_LIMIT_EXCEEDED (a credit past the
//!    configured ceiling; arithmetic is checked) are committed rejections, not errors.
//! 5. Set-based writes: postings (D and C), balances, outcomes, outbox events, and the
//!    release of refused transfers' inbox claims.
//!
//! Five round trips a batch: `BEGIN`; the inbox and the read of step 2, sent together; the
//! locks of the admitted transfers' accounts; the writes, sent together; `COMMIT` (see
//! [`crate::store::Sent`]).

use std::collections::HashSet;

use diesel_async::scoped_futures::ScopedFutureExt;
use diesel_async::{AsyncConnection, AsyncPgConnection};
use futures_util::future::try_join;
use futures_util::{FutureExt, TryFutureExt};
use tally_schema::events::TransferAnalyzed;
use uuid::Uuid;

use super::plan::{admits, plan_batch, Effects, Refusal};
use crate::authority::ISSUANCE_PREFIX;
use crate::store::{accounts, known, outbox, Sent};

/// Rejection reasons of the ledger.
pub mod reason {
    pub const ACCOUNT_NOT_FOUND: &str = "ACCOUNT_NOT_FOUND";
    pub const CURRENCY_MISMATCH: &str = "CURRENCY_MISMATCH";
    pub const INSUFFICIENT_FUNDS: &str = "INSUFFICIENT_FUNDS";
    /// The credit would take the destination past the configured balance ceiling.
    pub const BALANCE_LIMIT_EXCEEDED: &str = "BALANCE_LIMIT_EXCEEDED";
}

/// Kinds of the derived event ids.
pub const SETTLED_KIND: &str = "settled";
pub const REJECTED_KIND: &str = "rejected";

/// A transfer to settle, with the trace context of the record that carried it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SettleRequest {
    pub transfer: TransferAnalyzed,
    pub traceparent: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SettleOutcome {
    Settled,
    Rejected(&'static str),
    Duplicate,
    /// The system of record contradicts the event: nothing was written for it, and its
    /// record is poison.
    Refused(Refusal),
}

impl SettleOutcome {
    #[must_use]
    pub fn label(self) -> &'static str {
        match self {
            Self::Settled => "settled",
            Self::Rejected(_) => "rejected",
            Self::Duplicate => "duplicate",
            Self::Refused(_) => "refused",
        }
    }
}

/// Output topics and limits of the ledger.
#[derive(Debug, Clone)]
pub struct LedgerTopics {
    pub settled: String,
    pub rejected: String,
    /// No balance may exceed this many cents; a credit past it is BALANCE_LIMIT_EXCEEDED.
    pub max_balance_cents: i64,
}

/// Settles `batch` in one transaction. The outcomes are in batch order.
///
/// # Errors
/// Any database error; the transaction is rolled back and nothing is written.
pub async fn settle_batch(
    conn: &mut AsyncPgConnection,
    topics: &LedgerTopics,
    batch: &[SettleRequest],
) -> Result<Vec<SettleOutcome>, diesel::result::Error> {
    conn.transaction(|conn| {
        async move {
            // Inbox rows for the distinct transfer ids of the batch.
            let mut seen = HashSet::new();
            let ids: Vec<Uuid> = batch.iter().map(|r| r.transfer.transfer_id).filter(|id| seen.insert(*id)).collect();
            // The inbox claim and the read of the system of record go in one round trip.
            let (fresh, mut known) = try_join(accounts::claim_inbox(conn, &ids), known::load_known(conn, &ids)).await?;
            let fresh: HashSet<Uuid> = if crate::faults::is_on(crate::faults::Fault::SkipInbox) {
                // Broken on purpose (test builds only): every transfer counts as new, and
                // no final status is noticed.
                for k in known.values_mut().filter(|k| k.status.is_some()) {
                    k.status = Some(tally_schema::models::status::PENDING.into());
                }
                ids.iter().copied().collect()
            } else {
                fresh
            };
            // Only the accounts of what the system of record admits are locked: a refused
            // event takes no lock, and no issuance account is ever locked here (a transfer
            // naming one finds it missing: ACCOUNT_NOT_FOUND).
            let mut account_ids: Vec<String> = batch
                .iter()
                .filter(|r| fresh.contains(&r.transfer.transfer_id))
                .filter(|r| admits(known.get(&r.transfer.transfer_id), &r.transfer).is_ok())
                .flat_map(|r| [r.transfer.source_account.clone(), r.transfer.destination_account.clone()])
                .filter(|id| !id.starts_with(ISSUANCE_PREFIX))
                .collect();
            account_ids.sort_unstable();
            account_ids.dedup();
            let locked = accounts::lock(conn, &account_ids).await?;
            let plan = plan_batch(batch, &fresh, &known, locked, topics)
                .map_err(|e| diesel::result::Error::SerializationError(Box::new(e)))?;
            let (changed, balances): (Vec<String>, Vec<i64>) = plan.changed_balances().unzip();
            try_join(
                try_join(
                    accounts::insert_postings(conn, &plan.effects.postings),
                    accounts::set_balances(conn, &changed, &balances),
                ),
                write_outcomes_and_events(conn, &plan.effects),
            )
            .await?;
            Ok(plan.outcomes)
        }
        .scope_boxed()
    })
    .await
}

/// The inbox outcomes, the outbox events and the refused transfers' released inbox claims
/// of `effects`, sent together (one round trip).
pub fn write_outcomes_and_events<'a>(conn: &mut AsyncPgConnection, effects: &'a Effects) -> Sent<'a, ()> {
    let outcomes =
        try_join(accounts::set_outcomes(conn, &effects.outcomes), accounts::release_inbox(conn, &effects.released));
    try_join(outcomes, outbox::insert_columns(conn, &effects.events)).map_ok(|_| ()).boxed()
}
