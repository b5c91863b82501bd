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
//! 2. Lock every account involved, `ORDER BY id FOR UPDATE`: every transaction locks in the
//!    same global order, so concurrent batches (and A->B against B->A) cannot deadlock.
//! 3. Read what the system of record holds of the batch's transfers: the intake's
//!    `transfers` rows and antifraud's stored decisions. The ledger acts only on a transfer
//!    the intake took, still PENDING, with an ANALYZED decision, the event matching both
//!    (accounts, amount, currency); any other event is refused as poison and its inbox
//!    claim undone ([`super::plan::admits`]).
//! 4. Rules in memory, in batch order, on running balances, so two transfers of one batch
//!    touching the same account see each other's effect: ACCOUNT_NOT_FOUND,
//!    CURRENCY_MISMATCH, INSUFFICIENT_FUNDS, BALANCE_LIMIT_EXCEEDED (a credit past the
//!    configured ceiling; arithmetic is checked) are committed rejections, not errors.
//! 5. Set-based writes: postings (D and C), balances, outcomes, outbox events, and the
//!    release of refused transfers' inbox claims.
//!
//! Five round trips a batch: `BEGIN`; the inbox; the locks and the read of step 3, sent
//! together; the four writes, sent together; `COMMIT` (see [`crate::store::Sent`]).

use std::collections::HashSet;

use diesel_async::scoped_futures::ScopedFutureExt;
use diesel_async::{AsyncConnection, AsyncPgConnection};
use futures_util::future::try_join;
use futures_util::{FutureExt, TryFutureExt};
use tally_schema::events::TransferAnalyzed;
use uuid::Uuid;

use super::plan::{plan_batch, Effects, Refusal};
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
            let fresh = accounts::claim_inbox(conn, &ids).await?;
            // Broken on purpose (test builds only): every transfer counts as new.
            let fresh: HashSet<Uuid> = if crate::faults::is_on(crate::faults::Fault::SkipInbox) {
                ids.iter().copied().collect()
            } else {
                fresh
            };
            let mut account_ids: Vec<String> = batch
                .iter()
                .filter(|r| fresh.contains(&r.transfer.transfer_id))
                .flat_map(|r| [r.transfer.source_account.clone(), r.transfer.destination_account.clone()])
                .collect();
            account_ids.sort_unstable();
            account_ids.dedup();
            let fresh_ids: Vec<Uuid> = ids.iter().copied().filter(|id| fresh.contains(id)).collect();
            // The lock and the read go in one round trip, and so do the writes.
            let (locked, mut known) =
                try_join(accounts::lock(conn, &account_ids), known::load_known(conn, &fresh_ids)).await?;
            if crate::faults::is_on(crate::faults::Fault::SkipInbox) {
                // Broken on purpose (test builds only): nor is a final status noticed.
                for k in known.values_mut().filter(|k| k.status.is_some()) {
                    k.status = Some(tally_schema::models::status::PENDING.into());
                }
            }
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
