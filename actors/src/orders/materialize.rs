//! Materialisation of `OrderReceived` into `received_orders`.
//!
//! One database transaction per record: `INSERT ... ON CONFLICT (order_id) DO NOTHING`.
//! The primary key is the deduplication, so there is no `exists -> insert` check that two
//! consumers could race past: a concurrent insert of the same `order_id` waits for the
//! first transaction and then does nothing. A redelivery, before or after the first
//! delivery's offset was committed, is therefore harmless.

use diesel_async::scoped_futures::ScopedFutureExt;
use diesel_async::{AsyncConnection, AsyncPgConnection, RunQueryDsl};
use tally_schema::events::OrderReceived;
use tally_schema::models::ReceivedOrder;
use tally_schema::schema::received_orders;

/// What [`materialize`] did with an `OrderReceived`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Materialized {
    /// The order's `received_orders` row was inserted.
    New,
    /// A row with this `order_id` already existed: nothing was written.
    Duplicate,
}

impl Materialized {
    /// The outcome label of `tally_records_total{pipeline="orders"}`.
    #[must_use]
    pub fn label(self) -> &'static str {
        match self {
            Self::New => "materialized",
            Self::Duplicate => "duplicate",
        }
    }
}

/// Inserts `event` into `received_orders` in a transaction of its own, keyed by
/// `order_id`; a second materialisation of the same order id writes nothing.
///
/// # Errors
/// When the database fails (unavailable, timeout, lock timeout); nothing is written then
/// and the caller must not acknowledge the record.
pub async fn materialize(
    conn: &mut AsyncPgConnection,
    event: &OrderReceived,
) -> Result<Materialized, diesel::result::Error> {
    let row = ReceivedOrder {
        order_id: event.order_id,
        event_id: event.event_id,
        external_reference: event.external_reference.clone(),
        customer_id: event.customer_id.clone(),
        amount_cents: event.amount_cents,
        currency: event.currency.clone(),
        received_at: event.received_at,
    };
    conn.transaction(|conn| {
        async move {
            let inserted = diesel::insert_into(received_orders::table)
                .values(&row)
                .on_conflict(received_orders::order_id)
                .do_nothing()
                .execute(conn)
                .await?;
            Ok(if inserted == 1 { Materialized::New } else { Materialized::Duplicate })
        }
        .scope_boxed()
    })
    .await
}
