//! The ledger baseline of `make bench`: the classic consumer's statement sequence, one
//! database transaction per transfer, sequential per partition, a commit after each
//! record; with the same rules and checks as tally's batched settlement so that the two
//! compare like for like. Plugged into the daemon as a [`Settler`] (see
//! [`crate::app::Parts`]), never through configuration.

use diesel_async::scoped_futures::ScopedFutureExt;
use diesel_async::{AsyncConnection, AsyncPgConnection};
use futures_util::future::BoxFuture;
use futures_util::FutureExt;
use tally_actors::ledger::plan::{verdict, Effects};
use tally_actors::ledger::{write_outcomes_and_events, LedgerTopics, SettleOutcome, SettleRequest, Settler};
use tally_actors::store::accounts::{self, PostingColumns};
use tally_actors::store::transfers;

/// One transfer per call: see the module documentation.
#[derive(Debug, Clone, Copy)]
pub struct OneByOne;

impl Settler for OneByOne {
    fn max_batch(&self) -> usize {
        1
    }

    fn one_at_a_time(&self) -> bool {
        true
    }

    fn settle<'a>(
        &'a self,
        conn: &'a mut AsyncPgConnection,
        topics: &'a LedgerTopics,
        batch: &'a [SettleRequest],
    ) -> BoxFuture<'a, Result<Vec<SettleOutcome>, diesel::result::Error>> {
        async move {
            let mut outcomes = Vec::with_capacity(batch.len());
            for req in batch {
                outcomes.push(settle_one(conn, topics, req).await?);
            }
            Ok(outcomes)
        }
        .boxed()
    }
}

/// The classic statement sequence for one transfer, in a transaction of its own.
///
/// # Errors
/// Any database error; the transaction is rolled back.
async fn settle_one(
    conn: &mut AsyncPgConnection,
    topics: &LedgerTopics,
    req: &SettleRequest,
) -> Result<SettleOutcome, diesel::result::Error> {
    conn.transaction(|conn| {
        async move {
            let t = &req.transfer;
            let inserted = accounts::claim_inbox(conn, &[t.transfer_id]).await?;
            if inserted.is_empty() {
                return Ok(SettleOutcome::Duplicate);
            }
            let mut pair = [t.source_account.clone(), t.destination_account.clone()];
            pair.sort_unstable();
            let locked = accounts::lock(conn, &pair).await?;
            let known = transfers::load_known(conn, &[t.transfer_id]).await?;
            let to_db = |e: serde_json::Error| diesel::result::Error::SerializationError(Box::new(e));
            let mut effects = Effects::default();
            let outcome = match verdict(&known, &locked, t, topics.max_balance_cents) {
                Err(reason) => {
                    effects.reject(topics, req, reason).map_err(to_db)?;
                    SettleOutcome::Rejected(reason)
                }
                Ok(_) => {
                    for (account, kind, delta) in
                        [(&t.source_account, "D", -t.amount_cents), (&t.destination_account, "C", t.amount_cents)]
                    {
                        accounts::add_to_balance(conn, account, delta).await?;
                        let one = PostingColumns {
                            transfer_id: vec![t.transfer_id],
                            account_id: vec![account.clone()],
                            kind: vec![kind.into()],
                            amount_cents: vec![t.amount_cents],
                        };
                        accounts::insert_postings(conn, &one).await?;
                    }
                    effects.settle(topics, req).map_err(to_db)?;
                    SettleOutcome::Settled
                }
            };
            // The postings and balances were written one by one above, as the classic consumer does.
            write_outcomes_and_events(conn, &effects).await?;
            Ok(outcome)
        }
        .scope_boxed()
    })
    .await
}
