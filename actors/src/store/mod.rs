//! Every SQL statement tally runs, one file per table family, with the connection pools
//! and the migration runner. Actors, handlers and HTTP endpoints call the named functions
//! here; no other module builds a query. (The bench's own statements, which create and
//! fill throwaway databases and read what the stages wrote, are in `tally_engine::bench::sql`.)
//!
//! | file | tables |
//! |---|---|
//! | `transfers.rs` | `transfers` (intake, projection) |
//! | `known.rs` | `transfers`, `antifraud_decisions`, read-only: what the ledger and antifraud check an event against |
//! | `transfer_list.rs` | `transfers`, read-only: the console's list, by account and status |
//! | `accounts.rs` | `accounts`, `postings`, `processed_transfers` (the ledger's inbox) |
//! | `issuance.rs` | `transfers`, `accounts`, `postings`, `processed_transfers`: money entering the ledger (top-ups) |
//! | `outbox.rs` | `outbox_events`: insert, claim, mark published, delete, backlog |
//! | `outbox_parked.rs` | `outbox_events`: rows the broker refused (parked) and the rows behind them (held) |
//! | `orders.rs` | `orders`, `received_orders` |
//! | `notifications.rs` | `notification_deliveries` |
//! | `decisions.rs` | `antifraud_decisions` |
//! | `outcomes.rs` | `transfers`, `processed_transfers`, `postings`, `antifraud_decisions`, read-only: a transfer's outcome as stored |
//! | `dead_letters.rs` | `dead_letters` |
//! | `dlt_replays.rs` | `dlt_replays` (the log of every dead-letter replay) |
//! | `heartbeats.rs` | `heartbeats` (the dependency probe of each stage) |
//! | `lookup.rs` | all of them, read-only: one transfer's story, for the operator console |
//! | `invariants.rs` | all of them, read-only: the ledger invariants |
//! | `idempotency.rs` | none: advisory locks that order requests whose key scopes meet across clients |
//! | `group_commit.rs` | none of its own: batches the writes of many callers into one transaction |
//! | `connect.rs`, `tls.rs`, `pool.rs`, `migrate.rs` | connections (TLS per `sslmode`) (a pool per stage, its gauges); `__diesel_schema_migrations` |
//!
//! The raw statements (`diesel::sql_query`) are prepared again at every run: diesel never
//! caches them. Keeping them prepared was measured and left out; `docs/ARCHITECTURE.md`
//! (section 7, "Raw statements prepared at each run") says why, and what a later attempt
//! must do.

pub mod accounts;
pub mod connect;
pub mod dead_letters;
pub mod decisions;
pub mod dlt_replays;
pub mod group_commit;
pub mod heartbeats;
pub mod idempotency;
pub mod invariants;
pub mod issuance;
pub mod known;
pub mod lookup;
pub mod migrate;
pub mod notifications;
pub mod orders;
pub mod outbox;
pub mod outbox_parked;
pub mod outcomes;
pub mod pool;
pub mod tls;
pub mod transfer_list;
pub mod transfers;

pub use connect::PgConnector;
pub use pool::{build_pool, publish_pool_status, PgPool, PoolSettings, PooledConnection, VERIFY_AFTER};

/// A statement already sent, or about to be sent on the first poll: the future holds no
/// borrow of the connection, so statements of one transaction that do not need each
/// other's results can be awaited together and travel in one round trip (diesel-async
/// pipelines futures polled at once on one connection; the server runs them one after
/// the other, in the order they are first polled: `try_join`'s argument order). An error in one makes every later one
/// fail too, and the transaction rolls back.
pub type Sent<'a, T> = futures_util::future::BoxFuture<'a, Result<T, diesel::result::Error>>;

/// A statement whose row count does not matter, or none at all (`None`: nothing to write).
fn unit<'a>(sent: Option<futures_util::future::BoxFuture<'a, diesel::QueryResult<usize>>>) -> Sent<'a, ()> {
    use futures_util::FutureExt;
    async move {
        if let Some(sent) = sent {
            sent.await?;
        }
        Ok(())
    }
    .boxed()
}
