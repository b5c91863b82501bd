//! The baseline of `make bench`: the classic statement sequence for one transfer, one
//! database transaction per transfer (`ledger.mode = "seed"`), with the same rules and
//! checks as [`super::settle::settle_batch`] so that the two compare like for like.

use std::collections::HashMap;

use diesel::sql_types::{BigInt, Text};
use diesel_async::scoped_futures::ScopedFutureExt;
use diesel_async::{AsyncConnection, AsyncPgConnection, RunQueryDsl};

use super::settle::{
    load_known, verdict, write_outcomes_and_events, Effects, LedgerTopics, LockedAccount, SettleOutcome, SettleRequest,
};

/// The seed's statement sequence for one transfer, one transaction per transfer (the
/// baseline of `make bench`; `ledger.mode = "seed"`).
///
/// # Errors
/// Any database error; the transaction is rolled back.
pub async fn settle_one_seed_style(
    conn: &mut AsyncPgConnection,
    topics: &LedgerTopics,
    req: &SettleRequest,
) -> Result<SettleOutcome, diesel::result::Error> {
    conn.transaction(|conn| {
        async move {
            let t = &req.transfer;
            let inserted = diesel::sql_query(
                "INSERT INTO processed_transfers (transfer_id, outcome) VALUES ($1, 'PROCESSING') \
                 ON CONFLICT (transfer_id) DO NOTHING",
            )
            .bind::<diesel::sql_types::Uuid, _>(t.transfer_id)
            .execute(conn)
            .await?;
            if inserted == 0 {
                return Ok(SettleOutcome::Duplicate);
            }
            let accounts: HashMap<String, LockedAccount> = diesel::sql_query(
                "SELECT id::text AS id, balance_cents, currency::text AS currency FROM accounts \
                 WHERE id IN ($1, $2) ORDER BY id FOR UPDATE",
            )
            .bind::<Text, _>(&t.source_account)
            .bind::<Text, _>(&t.destination_account)
            .load::<LockedAccount>(conn)
            .await?
            .into_iter()
            .map(|a| (a.id.clone(), a))
            .collect();
            let known = load_known(conn, &[t.transfer_id]).await?;
            let to_db = |e: serde_json::Error| diesel::result::Error::SerializationError(Box::new(e));
            let mut effects = Effects::default();
            let outcome = match verdict(&known, &accounts, t, topics.max_balance_cents) {
                Err(reason) => {
                    effects.reject(topics, req, reason).map_err(to_db)?;
                    SettleOutcome::Rejected(reason)
                }
                Ok(_) => {
                    for (account, kind, delta) in
                        [(&t.source_account, "D", -t.amount_cents), (&t.destination_account, "C", t.amount_cents)]
                    {
                        diesel::sql_query("UPDATE accounts SET balance_cents = balance_cents + $1 WHERE id = $2")
                            .bind::<BigInt, _>(delta)
                            .bind::<Text, _>(account)
                            .execute(conn)
                            .await?;
                        diesel::sql_query(
                            "INSERT INTO postings (transfer_id, account_id, kind, amount_cents) VALUES ($1, $2, $3, $4)",
                        )
                        .bind::<diesel::sql_types::Uuid, _>(t.transfer_id)
                        .bind::<Text, _>(account)
                        .bind::<Text, _>(kind)
                        .bind::<BigInt, _>(t.amount_cents)
                        .execute(conn)
                        .await?;
                    }
                    effects.settle(topics, req).map_err(to_db)?;
                    SettleOutcome::Settled
                }
            };
            // The postings and balances were written one by one above, as the seed does.
            write_outcomes_and_events(conn, &effects).await?;
            Ok(outcome)
        }
        .scope_boxed()
    })
    .await
}
