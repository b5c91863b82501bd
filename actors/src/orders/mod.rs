//! The order materializer pipeline: `orders.received` -> `received_orders`,
//! idempotent by the order's identity (`order_id`).
//!
//! The record's offset is stored by the shared machinery only after [`materialize`]
//! returned without error (the handler returned `Ok`). On error nothing is acknowledged:
//! a database failure is transient (blocking retry, then the DLT as `exhausted`), an
//! undecodable or invalid record is poison (the DLT at once). Consumption stays
//! at-least-once; the `order_id` primary key makes the redeliveries harmless.
//!
//! Scope, as the ADR sets it: this is not a generic deduplication table. `order_id` is the
//! stable identity of the order aggregate; the business idempotency key of *reception*
//! (`externalReference`) is enforced at intake, by `orders.external_reference`.

use std::sync::Arc;

use futures_util::future::BoxFuture;
use futures_util::FutureExt;
use tally_schema::events::OrderReceived;
use tally_schema::values::parse_text;
use tally_schema::Currency;

pub use crate::store::orders::{materialize, Materialized};

use crate::record::Record;
use crate::store::PgPool;
use crate::supervise::{HandlerError, RecordHandler};

/// Longest `externalReference` (`orders.external_reference VARCHAR(128)`).
pub const EXTERNAL_REFERENCE_MAX: usize = 128;
/// Longest `customerId` (`orders.customer_id VARCHAR(64)`).
pub const CUSTOMER_ID_MAX: usize = 64;

/// Decodes and validates an `OrderReceived` record.
///
/// # Errors
/// A poison [`HandlerError`] naming what is wrong: no value, undecodable JSON, a missing
/// field, or a field that breaks the intake's rules.
pub fn decode_order_received(record: &Record) -> Result<OrderReceived, HandlerError> {
    let payload = record.payload.as_deref().ok_or_else(|| HandlerError::poison("record has no value"))?;
    let order: OrderReceived =
        serde_json::from_slice(payload).map_err(|e| HandlerError::poison(format!("undecodable OrderReceived: {e}")))?;
    parse_text("externalReference", &order.external_reference, EXTERNAL_REFERENCE_MAX)
        .and_then(|_| parse_text("customerId", &order.customer_id, CUSTOMER_ID_MAX))
        .and_then(|_| Currency::parse("currency", &order.currency))
        .map_err(|e| HandlerError::poison(format!("invalid OrderReceived: {e}")))?;
    if order.amount_cents <= 0 {
        return Err(HandlerError::poison("invalid OrderReceived: amountCents must be positive"));
    }
    Ok(order)
}

/// The handler of the `orders` pipeline: decode (poison when impossible), then
/// [`materialize`] on a pooled connection (transient when the database fails).
pub struct OrderMaterializer {
    pool: PgPool,
}

impl OrderMaterializer {
    #[must_use]
    pub fn new(pool: PgPool) -> Self {
        Self { pool }
    }
}

impl RecordHandler for OrderMaterializer {
    fn handle(&self, record: Arc<Record>) -> BoxFuture<'static, Result<&'static str, HandlerError>> {
        let pool = self.pool.clone();
        async move {
            let order = decode_order_received(&record)?;
            let mut conn = pool.get().await.map_err(|e| HandlerError::classified("database unavailable", &e))?;
            match materialize(&mut conn, &order).await {
                Ok(Materialized::Refused(reason)) => Err(HandlerError::poison(reason)),
                Ok(done) => Ok(done.label()),
                Err(e) => Err(HandlerError::classified(&format!("cannot materialize order {}", order.order_id), &e)),
            }
        }
        .boxed()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::supervise::ErrorClass;

    fn record(payload: &str) -> Record {
        Record {
            topic: "orders.received".into(),
            partition: 0,
            offset: 0,
            key: Some(b"00000000-0000-0000-0000-000000000002".to_vec()),
            payload: Some(payload.as_bytes().to_vec()),
            headers: vec![],
            timestamp: None,
            defect: None,
        }
    }

    const OK: &str = r#"{"eventId":"00000000-0000-0000-0000-000000000001","orderId":"00000000-0000-0000-0000-000000000002","externalReference":"EXT-1","customerId":"C-1","amountCents":5,"currency":"BRL","receivedAt":"2026-01-01T00:00:00Z"}"#;

    #[test]
    fn valid_records_decode() {
        let order = decode_order_received(&record(OK)).unwrap();
        assert_eq!(order.order_id, uuid::Uuid::from_u128(2));
        assert_eq!(order.external_reference, "EXT-1");
    }

    #[test]
    fn poison_records_are_classified() {
        let long_ref = format!("\"{}\"", "r".repeat(129));
        for bad in [
            "{not json".to_owned(),
            r#"{"eventId":"00000000-0000-0000-0000-000000000001"}"#.to_owned(),
            OK.replace("\"orderId\":\"00000000-0000-0000-0000-000000000002\"", "\"orderId\":\"nope\""),
            OK.replace("\"amountCents\":5", "\"amountCents\":0"),
            OK.replace("\"amountCents\":5", "\"amountCents\":-5"),
            OK.replace("\"BRL\"", "\"brl\""),
            OK.replace("\"EXT-1\"", "\"\""),
            OK.replace("\"EXT-1\"", &long_ref),
            OK.replace("\"C-1\"", "\"  \""),
        ] {
            let err = decode_order_received(&record(&bad)).expect_err(&bad);
            assert_eq!(err.class, ErrorClass::Poison, "{bad}");
        }
        let mut empty = record(OK);
        empty.payload = None;
        assert_eq!(decode_order_received(&empty).map_err(|e| e.class), Err(ErrorClass::Poison));
    }

    #[test]
    fn outcome_labels() {
        assert_eq!(Materialized::New.label(), "materialized");
        assert_eq!(Materialized::Duplicate.label(), "duplicate");
    }
}
