//! Intake SQL, one place per table family: transfers (+ their outbox row), accounts, and
//! orders (+ their outbox row).

use chrono::Utc;
use diesel::prelude::*;
use diesel_async::scoped_futures::ScopedFutureExt;
use diesel_async::{AsyncConnection, AsyncPgConnection, RunQueryDsl};
use tally_schema::events::{OrderReceived, TransferRequested};
use tally_schema::models::{status, Account, NewOutboxEvent, Order, Posting, Transfer};
use tally_schema::schema::{accounts, orders, outbox_events, postings, transfers};
use tally_schema::EventType;
use uuid::Uuid;

/// A validated transfer request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TransferRequest {
    pub source_account: String,
    pub destination_account: String,
    pub amount_cents: i64,
    pub currency: String,
}

impl TransferRequest {
    fn matches(&self, t: &Transfer) -> bool {
        self.source_account == t.source_account
            && self.destination_account == t.destination_account
            && self.amount_cents == t.amount_cents
            && self.currency == t.currency
    }
}

/// What happened to a transfer request.
#[derive(Debug)]
pub enum Created {
    /// A new transfer (and its outbox row) was written.
    New(Transfer),
    /// The idempotency key was seen with the same request: nothing was written.
    Replayed(Transfer),
    /// The idempotency key was seen with a different request: nothing was written.
    KeyConflict,
}

/// Inserts the transfer (PENDING) and its `TransferRequested` outbox row in one
/// transaction, honouring `idempotency_key`.
///
/// # Errors
/// When the database fails; nothing is written then.
pub async fn create_transfer(
    conn: &mut AsyncPgConnection,
    req: &TransferRequest,
    idempotency_key: Option<&str>,
    topic: &str,
    traceparent: Option<String>,
) -> Result<Created, diesel::result::Error> {
    conn.transaction(|conn| {
        async move {
            let now = Utc::now();
            let row = Transfer {
                id: Uuid::now_v7(),
                source_account: req.source_account.clone(),
                destination_account: req.destination_account.clone(),
                amount_cents: req.amount_cents,
                currency: req.currency.clone(),
                status: status::PENDING.into(),
                rejection_reason: None,
                idempotency_key: idempotency_key.map(str::to_owned),
                created_at: now,
                updated_at: now,
            };
            let inserted: Option<Transfer> = diesel::insert_into(transfers::table)
                .values(&row)
                .on_conflict(transfers::idempotency_key)
                .do_nothing()
                .returning(Transfer::as_returning())
                .get_result(conn)
                .await
                .optional()?;
            let Some(transfer) = inserted else {
                let existing: Transfer = transfers::table
                    .filter(transfers::idempotency_key.eq(idempotency_key))
                    .select(Transfer::as_select())
                    .first(conn)
                    .await?;
                return Ok(if req.matches(&existing) { Created::Replayed(existing) } else { Created::KeyConflict });
            };
            let event = TransferRequested {
                event_id: Uuid::new_v4(),
                transfer_id: transfer.id,
                source_account: transfer.source_account.clone(),
                destination_account: transfer.destination_account.clone(),
                amount_cents: transfer.amount_cents,
                currency: transfer.currency.clone(),
                requested_at: transfer.created_at,
            };
            let outbox = NewOutboxEvent::new(
                event.event_id,
                topic,
                &transfer.source_account,
                EventType::TransferRequested,
                &event,
                traceparent,
            )
            .map_err(|e| diesel::result::Error::SerializationError(Box::new(e)))?;
            diesel::insert_into(outbox_events::table).values(&outbox).execute(conn).await?;
            Ok(Created::New(transfer))
        }
        .scope_boxed()
    })
    .await
}

/// # Errors
/// When the database fails.
pub async fn find_transfer(conn: &mut AsyncPgConnection, id: Uuid) -> Result<Option<Transfer>, diesel::result::Error> {
    transfers::table.find(id).select(Transfer::as_select()).first(conn).await.optional()
}

/// Creates an account; `None` when the id is taken.
///
/// # Errors
/// When the database fails.
pub async fn create_account(
    conn: &mut AsyncPgConnection,
    id: &str,
    currency: &str,
    balance_cents: i64,
) -> Result<Option<Account>, diesel::result::Error> {
    let row = Account {
        id: id.to_owned(),
        balance_cents,
        currency: currency.to_owned(),
        opening_balance_cents: balance_cents,
        created_at: Utc::now(),
    };
    diesel::insert_into(accounts::table)
        .values(&row)
        .on_conflict(accounts::id)
        .do_nothing()
        .returning(Account::as_returning())
        .get_result(conn)
        .await
        .optional()
}

/// # Errors
/// When the database fails.
pub async fn find_account(conn: &mut AsyncPgConnection, id: &str) -> Result<Option<Account>, diesel::result::Error> {
    accounts::table.find(id).select(Account::as_select()).first(conn).await.optional()
}

/// Postings of `account_id`, newest first, with ids below `before` when given.
///
/// # Errors
/// When the database fails.
pub async fn postings_page(
    conn: &mut AsyncPgConnection,
    account_id: &str,
    before: Option<i64>,
    limit: i64,
) -> Result<Vec<Posting>, diesel::result::Error> {
    let mut query = postings::table
        .filter(postings::account_id.eq(account_id))
        .select(Posting::as_select())
        .order(postings::id.desc())
        .limit(limit)
        .into_boxed();
    if let Some(before) = before {
        query = query.filter(postings::id.lt(before));
    }
    query.load(conn).await
}

/// A validated order, as received at intake.
#[derive(Debug, Clone, PartialEq)]
pub struct OrderRequest {
    /// The business idempotency key of reception.
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
/// reference create one order; the losers compare their request with the winner's.
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
            };
            let inserted: Option<Order> = diesel::insert_into(orders::table)
                .values(&row)
                .on_conflict(orders::external_reference)
                .do_nothing()
                .returning(Order::as_returning())
                .get_result(conn)
                .await
                .optional()?;
            let Some(order) = inserted else {
                // `lines` is compared by PostgreSQL as JSONB (key order, spacing and number
                // spelling do not matter), the other fields as stored.
                let (existing, same_lines): (Order, bool) = orders::table
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
            diesel::insert_into(outbox_events::table).values(&outbox).execute(conn).await?;
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
