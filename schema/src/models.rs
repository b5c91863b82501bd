//! Row models for the tables in [`crate::schema`].

use chrono::{DateTime, Utc};
use diesel::prelude::*;
use uuid::Uuid;

use crate::schema::{accounts, orders, outbox_events, postings, received_orders, transfers};

/// Transfer status values (`transfers.status`).
pub mod status {
    pub const PENDING: &str = "PENDING";
    pub const SETTLED: &str = "SETTLED";
    pub const REJECTED: &str = "REJECTED";
}

#[derive(Debug, Clone, PartialEq, Eq, Queryable, Selectable, Insertable)]
#[diesel(table_name = transfers, check_for_backend(diesel::pg::Pg))]
pub struct Transfer {
    pub id: Uuid,
    pub source_account: String,
    pub destination_account: String,
    pub amount_cents: i64,
    pub currency: String,
    pub status: String,
    pub rejection_reason: Option<String>,
    pub idempotency_key: Option<String>,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
    /// The API client that created it; empty when the intake does not authenticate.
    /// Its `Idempotency-Key` is unique per client.
    pub client: String,
    /// `transfer` (between two customer accounts) or `issuance` ([`transfer_kind`]).
    pub kind: String,
}

/// `transfers.kind` values.
pub mod transfer_kind {
    /// Between two customer accounts, through antifraud and the ledger.
    pub const TRANSFER: &str = "transfer";
    /// From the issuance account of its currency, settled at once.
    pub const ISSUANCE: &str = "issuance";
}

/// An account. (`accounts.opening_balance_cents`, which a release before issuance wrote,
/// is left out: opening balances are issuance postings, and the contract step drops it.)
#[derive(Debug, Clone, PartialEq, Eq, Queryable, Selectable, Insertable)]
#[diesel(table_name = accounts, check_for_backend(diesel::pg::Pg))]
pub struct Account {
    pub id: String,
    pub balance_cents: i64,
    pub currency: String,
    pub created_at: DateTime<Utc>,
    /// The API client that opened it; empty for the anonymous scope.
    pub owner: String,
    /// `customer` or `issuance`.
    pub kind: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Queryable, Selectable)]
#[diesel(table_name = postings, check_for_backend(diesel::pg::Pg))]
pub struct Posting {
    pub id: i64,
    pub transfer_id: Uuid,
    pub account_id: String,
    pub kind: String,
    pub amount_cents: i64,
    pub created_at: DateTime<Utc>,
}

#[derive(Debug, Clone, PartialEq, Queryable, Selectable, Insertable)]
#[diesel(table_name = orders, check_for_backend(diesel::pg::Pg))]
pub struct Order {
    pub id: Uuid,
    pub external_reference: String,
    pub customer_id: String,
    pub amount_cents: i64,
    pub currency: String,
    pub lines: Option<serde_json::Value>,
    pub created_at: DateTime<Utc>,
    /// The API client that created it; empty when the intake does not authenticate.
    /// Its `externalReference` is unique per client.
    pub client: String,
}

/// An order as the consumer of `OrderReceived` materialised it. `order_id` is
/// the primary key: the aggregate's stable identity, and the consumer's only deduplication.
#[derive(Debug, Clone, PartialEq, Eq, Queryable, Selectable, Insertable)]
#[diesel(table_name = received_orders, check_for_backend(diesel::pg::Pg))]
pub struct ReceivedOrder {
    pub order_id: Uuid,
    pub event_id: Uuid,
    pub external_reference: String,
    pub customer_id: String,
    pub amount_cents: i64,
    pub currency: String,
    pub received_at: DateTime<Utc>,
}

/// An outbox row to insert in the same transaction as the business change.
#[derive(Debug, Clone, PartialEq, Eq, Insertable)]
#[diesel(table_name = outbox_events, check_for_backend(diesel::pg::Pg))]
pub struct NewOutboxEvent {
    pub id: Uuid,
    pub topic: String,
    pub key: String,
    pub event_type: String,
    pub payload: String,
    pub traceparent: Option<String>,
}

impl NewOutboxEvent {
    /// Serialises `payload` as the row's JSON body.
    ///
    /// # Errors
    /// When the payload cannot be serialised (it never fails for tally's event types).
    pub fn new<T: serde::Serialize>(
        id: Uuid,
        topic: &str,
        key: &str,
        event_type: crate::EventType,
        payload: &T,
        traceparent: Option<String>,
    ) -> Result<Self, serde_json::Error> {
        Ok(Self {
            id,
            topic: topic.to_owned(),
            key: key.to_owned(),
            event_type: event_type.as_str().to_owned(),
            payload: serde_json::to_string(payload)?,
            traceparent,
        })
    }
}

/// A pending outbox row as claimed by a publisher.
#[derive(Debug, Clone, PartialEq, Eq, Queryable, Selectable, QueryableByName)]
#[diesel(table_name = outbox_events, check_for_backend(diesel::pg::Pg))]
pub struct PendingOutboxEvent {
    pub id: Uuid,
    pub seq: i64,
    pub topic: String,
    pub key: String,
    pub event_type: String,
    pub payload: String,
    pub traceparent: Option<String>,
    pub created_at: DateTime<Utc>,
}
