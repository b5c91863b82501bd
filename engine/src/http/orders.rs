//! Order intake: `POST /orders` deduplicated by `externalReference`, the
//! business idempotency key of reception, and `GET /orders/{id}`.

use actix_web::http::header;
use actix_web::{web, HttpRequest, HttpResponse};
use serde::{Deserialize, Serialize};
use tally_actors::orders::{CUSTOMER_ID_MAX, EXTERNAL_REFERENCE_MAX};
use tally_schema::models::Order;
use tally_schema::values::{check_json_text, parse_amount, parse_text};
use uuid::Uuid;

use super::auth::Caller;
use super::error::{ApiError, ErrorBody};
use super::AppState;
use tally_actors::authority::Scope;
use tally_actors::store::orders::{self, OrderIntake, OrderRequest};

/// An order received; `externalReference` deduplicates it (per API client).
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CreateOrderBody {
    /// 1 to 128 characters, not blank, no control characters.
    #[schema(
        min_length = 1,
        max_length = 128,
        pattern = r"^[^\x00-\x1f\x7f-\x9f]*[^\s\x00-\x1f\x7f-\x9f][^\x00-\x1f\x7f-\x9f]*$",
        example = "EXT-1"
    )]
    external_reference: String,
    /// 1 to 64 characters, not blank, no control characters.
    #[schema(
        min_length = 1,
        max_length = 64,
        pattern = r"^[^\x00-\x1f\x7f-\x9f]*[^\s\x00-\x1f\x7f-\x9f][^\x00-\x1f\x7f-\x9f]*$",
        example = "C-1"
    )]
    customer_id: String,
    #[schema(value_type = i64, minimum = 1, example = 1250)]
    amount_cents: serde_json::Number,
    #[schema(pattern = r"^[A-Z]{3}$", example = "BRL")]
    currency: String,
    /// Optional; `null` is the same as absent. Kept as it is, but no string or key in it
    /// may hold the NUL character (U+0000).
    #[serde(default)]
    #[schema(value_type = Option<Vec<serde_json::Value>>)]
    lines: Option<serde_json::Value>,
}

impl CreateOrderBody {
    fn validate(self, client: String, currencies: &super::Currencies) -> Result<OrderRequest, ApiError> {
        let external_reference = parse_text("externalReference", &self.external_reference, EXTERNAL_REFERENCE_MAX)?;
        let customer_id = parse_text("customerId", &self.customer_id, CUSTOMER_ID_MAX)?;
        let amount_cents = parse_amount("amountCents", &self.amount_cents)?;
        let currency = currencies.parse("currency", &self.currency)?;
        let lines = match self.lines {
            None | Some(serde_json::Value::Null) => None,
            Some(lines @ serde_json::Value::Array(_)) => {
                check_json_text("lines", &lines)?;
                Some(lines)
            }
            Some(_) => return Err(ApiError::Validation("lines must be a JSON array when given".into())),
        };
        Ok(OrderRequest {
            client,
            adopts_anonymous: false,
            external_reference,
            customer_id,
            amount_cents,
            currency: currency.to_string(),
            lines,
        })
    }
}

#[derive(Debug, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct OrderView {
    id: Uuid,
    external_reference: String,
    customer_id: String,
    amount_cents: i64,
    currency: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Vec<serde_json::Value>>)]
    lines: Option<serde_json::Value>,
    /// The API client that created it; `null` when the intake did not authenticate it.
    client: Option<String>,
    created_at: chrono::DateTime<chrono::Utc>,
}

impl From<Order> for OrderView {
    fn from(o: Order) -> Self {
        Self {
            id: o.id,
            external_reference: o.external_reference,
            customer_id: o.customer_id,
            amount_cents: o.amount_cents,
            currency: o.currency,
            lines: o.lines,
            client: Some(o.client).filter(|c| !c.is_empty()),
            created_at: o.created_at,
        }
    }
}

/// `POST /orders`: 201 with the order and its `OrderReceived` queued in the outbox; a
/// repeat of the same request with the same `externalReference` answers 200 with the
/// existing order, a different request 409 (references are scoped per API client, and a
/// client that adopts anonymous requests also meets theirs).
/// Nothing is written unless 201.
#[utoipa::path(post, path = "/orders", tag = "intake", request_body = CreateOrderBody,
    responses((status = 201, description = "Received; `OrderReceived` queued.", body = OrderView),
        (status = 200, description = "The same order again.", body = OrderView),
        (status = 403, description = "The client lacks the `orders:create` scope.", body = ErrorBody),
        (status = 409, description = "This externalReference came with another order.", body = ErrorBody),
        (status = 422, description = "A value breaks its rule.", body = ErrorBody)))]
pub async fn create_order(
    caller: Caller,
    state: web::Data<AppState>,
    req: HttpRequest,
    body: web::Json<CreateOrderBody>,
) -> Result<HttpResponse, ApiError> {
    caller.require(Scope::OrdersCreate)?;
    let mut request = body.into_inner().validate(caller.name.clone(), &state.currencies)?;
    request.adopts_anonymous = caller.adopts_anonymous;
    let traceparent = super::traceparent(&req);
    let mut conn = state.pool.get().await?;
    let intake = orders::create_order(&mut conn, &request, &state.topics.orders_received, Some(traceparent)).await?;
    match intake {
        OrderIntake::New(o) => Ok(HttpResponse::Created()
            .insert_header((header::LOCATION, format!("/orders/{}", o.id)))
            .json(OrderView::from(o))),
        OrderIntake::Replayed(o) => Ok(HttpResponse::Ok()
            .insert_header((header::LOCATION, format!("/orders/{}", o.id)))
            .json(OrderView::from(o))),
        OrderIntake::ReferenceConflict => Err(ApiError::Conflict {
            code: "external_reference_conflict",
            message: "this externalReference was already received with a different order".into(),
        }),
    }
}

/// `GET /orders/{id}`: an API client sees its own orders only.
#[utoipa::path(get, path = "/orders/{id}", tag = "intake", params(("id" = Uuid, Path)),
    responses((status = 200, description = "The order.", body = OrderView),
        (status = 404, description = "No such order (of this client).", body = ErrorBody)))]
pub async fn get_order(
    caller: Caller,
    state: web::Data<AppState>,
    id: web::Path<Uuid>,
) -> Result<HttpResponse, ApiError> {
    caller.require(Scope::Read)?;
    let mut conn = state.pool.get().await?;
    let order = orders::find_order(&mut conn, *id)
        .await?
        .filter(|o| caller.may_see(&o.client))
        .ok_or_else(|| ApiError::NotFound(format!("Order {id} does not exist")))?;
    Ok(HttpResponse::Ok().json(OrderView::from(order)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn body(json: serde_json::Value) -> Result<OrderRequest, String> {
        let body: CreateOrderBody = serde_json::from_value(json).map_err(|e| e.to_string())?;
        body.validate(String::new(), &super::super::Currencies::default()).map_err(|e| e.to_string())
    }

    #[test]
    fn validation() {
        let ok = serde_json::json!({"externalReference": "EXT-1", "customerId": "C-1", "amountCents": 10, "currency": "BRL"});
        let req = body(ok.clone()).unwrap();
        assert_eq!((req.amount_cents, req.lines), (10, None));
        let mut with_lines = ok.clone();
        with_lines["lines"] = serde_json::json!([{"sku": "A", "qty": 1}]);
        assert!(body(with_lines).unwrap().lines.is_some());
        let mut null_lines = ok.clone();
        null_lines["lines"] = serde_json::Value::Null;
        assert_eq!(body(null_lines).unwrap().lines, None);
        for (field, bad) in [
            ("lines", serde_json::json!({"sku": "A"})),
            ("lines", serde_json::json!([{"sku": "A\u{0}"}])),
            ("externalReference", serde_json::json!("")),
            ("externalReference", serde_json::json!("x".repeat(129))),
            ("customerId", serde_json::json!("c".repeat(65))),
            ("amountCents", serde_json::json!(0)),
            ("amountCents", serde_json::json!(1.5)),
            ("currency", serde_json::json!("brl")),
            ("unexpected", serde_json::json!(1)),
        ] {
            let mut case = ok.clone();
            case[field] = bad.clone();
            assert!(body(case).is_err(), "{field} = {bad} accepted");
        }
        assert!(
            body(serde_json::json!({"externalReference": "EXT-1", "customerId": "C-1", "currency": "BRL"})).is_err()
        );
    }
}
