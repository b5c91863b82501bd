//! The ledger's batch as PostgreSQL alone runs it: tally's own
//! `tally_actors::ledger::settle_batch` (its statements, in its order, in one transaction,
//! and its rules in memory), called directly on a connection: no broker, no consumer, no
//! keyed workers, no batcher. Calling it rather than copying its statements keeps the floor
//! from drifting away from what the ledger sends. What is pure (the batch) is unit-tested.

use std::collections::HashSet;

use chrono::Utc;
use diesel_async::AsyncPgConnection;
use tally_actors::ledger::{settle_batch, LedgerTopics, SettleOutcome, SettleRequest};
use tally_schema::events::{derived_event_id, TransferAnalyzed};
use uuid::Uuid;

use crate::bench::account;
use crate::bench::ledger::Rng;

/// `n` transfers over random pairs of distinct accounts out of `accounts` (at least 2),
/// 1 to 1,000 cents each, time-ordered ids, as the ledger bench makes them (without its
/// duplicates and overdrafts: the floor settles every transfer).
#[must_use]
pub(crate) fn transfers(rng: &mut Rng, n: usize, accounts: usize) -> Vec<TransferAnalyzed> {
    (0..n)
        .map(|_| {
            let from = rng.below(accounts);
            let mut to = rng.below(accounts);
            if to == from {
                to = (to + 1) % accounts;
            }
            let transfer_id = Uuid::now_v7();
            TransferAnalyzed {
                event_id: derived_event_id("analyzed", transfer_id),
                transfer_id,
                source_account: account(from),
                destination_account: account(to),
                amount_cents: 1 + rng.below(1_000) as i64,
                currency: "BRL".into(),
                score: 10,
                analyzed_at: Utc::now(),
                client: None,
            }
        })
        .collect()
}

/// The distinct transfer ids of `batch`, in batch order (what the inbox claims).
#[must_use]
pub fn distinct_ids(batch: &[TransferAnalyzed]) -> Vec<Uuid> {
    let mut seen = HashSet::new();
    batch.iter().map(|t| t.transfer_id).filter(|id| seen.insert(*id)).collect()
}

/// Settles `batch` in one transaction with the ledger's own settlement, its events to
/// `topic`; returns how many transfers settled.
///
/// # Errors
/// Any database error; the transaction is rolled back.
pub async fn settle(
    conn: &mut AsyncPgConnection,
    batch: &[TransferAnalyzed],
    topic: &str,
) -> Result<usize, diesel::result::Error> {
    let topics = LedgerTopics {
        settled: topic.to_owned(),
        rejected: tally_schema::topics::TRANSFERS_REJECTED.to_owned(),
        max_balance_cents: i64::MAX,
    };
    let requests: Vec<SettleRequest> =
        batch.iter().map(|t| SettleRequest { transfer: t.clone(), traceparent: None }).collect();
    let outcomes = settle_batch(conn, &topics, &requests).await?;
    Ok(outcomes.iter().filter(|o| **o == SettleOutcome::Settled).count())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_batch_is_distinct_pairs_within_the_accounts() {
        let batch = transfers(&mut Rng(7), 500, 3);
        assert_eq!(batch.len(), 500);
        assert_eq!(distinct_ids(&batch).len(), 500);
        for t in &batch {
            assert_ne!(t.source_account, t.destination_account);
            assert!((1..=1_000).contains(&t.amount_cents));
            assert!([account(0), account(1), account(2)].contains(&t.destination_account));
        }
    }
}
