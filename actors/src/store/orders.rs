//! The `orders` and `received_orders` tables: intake of an order with its outbox row, and
//! the consumer's idempotent materialization of `OrderReceived`.

use chrono::Utc;
use diesel::prelude::*;
use diesel_async::scoped_futures::ScopedFutureExt;
use diesel_async::{AsyncConnection, AsyncPgConnection, RunQueryDsl};
use tally_schema::events::OrderReceived;
use tally_schema::models::{NewOutboxEvent, Order, ReceivedOrder};
use tally_schema::schema::{orders, received_orders};
use tally_schema::EventType;
use uuid::Uuid;

use super::outbox;

/// A validated order, as received at intake.
#[derive(Debug, Clone, PartialEq)]
pub struct OrderRequest {
    /// The authenticated API client; empty when the intake does not authenticate.
    pub client: String,
    /// A reference also matches an anonymous request's order (with an empty `client`)
    /// received before this client authenticated: see [`create_order`].
    pub adopts_anonymous: bool,
    /// The business idempotency key of reception, unique per client.
    pub external_reference: String,
    pub customer_id: String,
    pub amount_cents: i64,
    pub currency: String,
    /// A JSON array, when given.
    pub lines: Option<serde_json::Value>,
}

/// What happened to an order request.
#[derive(Debug)]
pub enum OrderIntake {
    /// A new order (and its `OrderReceived` outbox row) was written.
    New(Order),
    /// The external reference was seen with the same request: nothing was written.
    Replayed(Order),
    /// The external reference was seen with a different request: nothing was written.
    ReferenceConflict,
}

/// Inserts the order and its `OrderReceived` outbox row (keyed by the order id) in one
/// transaction. `external_reference` is the idempotency key of reception: the unique
/// constraint decides, with `ON CONFLICT DO NOTHING`, so concurrent requests with one
/// reference create one order; the losers compare their request with the winner's. A client
/// that adopts anonymous requests and has no order of its own with the reference compares
/// with an anonymous order that has it, and writes nothing.
///
/// # Errors
/// When the database fails; nothing is written then.
pub async fn create_order(
    conn: &mut AsyncPgConnection,
    req: &OrderRequest,
    topic: &str,
    traceparent: Option<String>,
) -> Result<OrderIntake, diesel::result::Error> {
    conn.transaction(|conn| {
        async move {
            let row = Order {
                id: Uuid::now_v7(),
                external_reference: req.external_reference.clone(),
                customer_id: req.customer_id.clone(),
                amount_cents: req.amount_cents,
                currency: req.currency.clone(),
                lines: req.lines.clone(),
                created_at: Utc::now(),
                client: req.client.clone(),
            };
            // The client's own order first, then an anonymous one it adopts.
            if req.client.is_empty() || req.adopts_anonymous {
                super::idempotency::lock_keys(conn, "orders", vec![req.external_reference.clone()]).await?;
            }
            let mut adopted = None;
            if req.adopts_anonymous && !req.client.is_empty() {
                let holders: Vec<String> = orders::table
                    .filter(orders::client.eq_any([req.client.as_str(), ""]))
                    .filter(orders::external_reference.eq(&req.external_reference))
                    .select(orders::client)
                    .load(conn)
                    .await?;
                if holders.iter().any(String::is_empty) && !holders.contains(&req.client) {
                    adopted = Some("");
                }
            }
            let inserted: Option<Order> = if adopted.is_some() {
                None
            } else {
                diesel::insert_into(orders::table)
                    .values(&row)
                    .on_conflict((orders::client, orders::external_reference))
                    .do_nothing()
                    .returning(Order::as_returning())
                    .get_result(conn)
                    .await
                    .optional()?
            };
            let Some(order) = inserted else {
                // `lines` is compared by PostgreSQL as JSONB (key order, spacing and number
                // spelling do not matter), the other fields as stored.
                let (existing, same_lines): (Order, bool) = orders::table
                    .filter(orders::client.eq(adopted.unwrap_or(&req.client)))
                    .filter(orders::external_reference.eq(&req.external_reference))
                    .select((Order::as_select(), orders::lines.is_not_distinct_from(req.lines.clone())))
                    .first(conn)
                    .await?;
                let same = same_lines
                    && existing.customer_id == req.customer_id
                    && existing.amount_cents == req.amount_cents
                    && existing.currency == req.currency;
                return Ok(if same { OrderIntake::Replayed(existing) } else { OrderIntake::ReferenceConflict });
            };
            let event = OrderReceived {
                event_id: Uuid::new_v4(),
                order_id: order.id,
                external_reference: order.external_reference.clone(),
                customer_id: order.customer_id.clone(),
                amount_cents: order.amount_cents,
                currency: order.currency.clone(),
                received_at: order.created_at,
            };
            let outbox = NewOutboxEvent::new(
                event.event_id,
                topic,
                &order.id.to_string(),
                EventType::OrderReceived,
                &event,
                traceparent,
            )
            .map_err(|e| diesel::result::Error::SerializationError(Box::new(e)))?;
            outbox::insert(conn, &outbox).await?;
            Ok(OrderIntake::New(order))
        }
        .scope_boxed()
    })
    .await
}

/// # Errors
/// When the database fails.
pub async fn find_order(conn: &mut AsyncPgConnection, id: Uuid) -> Result<Option<Order>, diesel::result::Error> {
    orders::table.find(id).select(Order::as_select()).first(conn).await.optional()
}

// Materialization of `OrderReceived` into `received_orders`:
// One database transaction per record: `INSERT ... ON CONFLICT (order_id) DO NOTHING`.
// The primary key is the deduplication, so there is no `exists -> insert` check that two
// consumers could race past: a concurrent insert of the same `order_id` waits for the
// first transaction and then does nothing. A redelivery, before or after the first
// delivery's offset was committed, is therefore harmless.

/// What [`materialize`] did with an `OrderReceived`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Materialized {
    /// The order's `received_orders` row was inserted.
    New,
    /// A row with this `order_id` already existed: nothing was written.
    Duplicate,
    /// The intake took no such order (or another one under this id): nothing was written,
    /// and the record is poison, for this reason.
    Refused(&'static str),
}

impl Materialized {
    /// The outcome label of `tally_records_total{pipeline="orders"}`.
    #[must_use]
    pub fn label(self) -> &'static str {
        match self {
            Self::New => "materialized",
            Self::Duplicate => "duplicate",
            Self::Refused(_) => "refused",
        }
    }
}

/// Inserts `event` into `received_orders` in a transaction of its own, keyed by
/// `order_id`; a second materialisation of the same order id writes nothing. Only an order
/// the intake took, with the event's reference, customer, amount and currency, is
/// materialised: any other event is [`Materialized::Refused`].
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
            // Orders never change once taken: what is read here stays true.
            let taken: Option<Order> =
                orders::table.find(event.order_id).select(Order::as_select()).first(conn).await.optional()?;
            match taken {
                None => return Ok(Materialized::Refused("unknown order: the intake never took it")),
                Some(o)
                    if o.external_reference != event.external_reference
                        || o.customer_id != event.customer_id
                        || o.amount_cents != event.amount_cents
                        || o.currency != event.currency =>
                {
                    return Ok(Materialized::Refused(
                        "contradicts the order: other reference, customer, amount or currency than the intake took",
                    ))
                }
                Some(_) => {}
            }
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
