//! `POST /issuances`: money entering the ledger as a top-up of an existing account, from
//! the issuance account of its currency, by a client holding the `issue` scope. Settled at
//! once, with postings, like an opening balance (`POST /accounts`); the transfer it makes
//! is read with `GET /transfers/{id}`. Every issuance is in the audit log.

use actix_web::http::header;
use actix_web::{web, HttpRequest, HttpResponse};
use serde::Deserialize;
use tally_actors::authority::Scope;
use tally_actors::store::issuance::{self, Issued, TopUp, TopUpRefusal};
use tally_schema::values::parse_amount;
use tally_schema::{AccountId, Currency};

use super::auth::Caller;
use super::error::{ApiError, ErrorBody};
use super::intake::{idempotency_key, TransferView};
use super::AppState;

/// Money to issue to an account.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CreateIssuanceBody {
    /// The customer account credited.
    #[schema(pattern = r"^[^\s\x00-\x1f\x7f-\x9f]{1,32}$", example = "acc-alice")]
    destination_account: String,
    #[schema(value_type = i64, minimum = 1, example = 100000)]
    amount_cents: serde_json::Number,
    /// The account's currency (ISO 4217).
    #[schema(pattern = r"^[A-Z]{3}$", example = "BRL")]
    currency: String,
}

/// `POST /issuances`: 201 with the issuance, SETTLED. The `Idempotency-Key` is required:
/// the same request again answers 200 with the original and another request 409, so a
/// retry after a lost answer never issues twice.
#[utoipa::path(post, path = "/issuances", tag = "intake",
    params(("Idempotency-Key" = String, Header, pattern = r"^[\x21-\x7e]{1,255}$",
        description = "Required: a retry under the same key answers 200 with the original.")),
    request_body = CreateIssuanceBody,
    responses(
        (status = 201, description = "Issued and settled.", body = TransferView),
        (status = 200, description = "A replay of the request of this Idempotency-Key.", body = TransferView),
        (status = 400, description = "No or a malformed Idempotency-Key.", body = ErrorBody),
        (status = 403, description = "The client lacks the `issue` scope.", body = ErrorBody),
        (status = 404, description = "No such account.", body = ErrorBody),
        (status = 409, description = "This Idempotency-Key was used with another request.", body = ErrorBody),
        (status = 422, description = "A value breaks its rule (currency, the balance ceiling).", body = ErrorBody),
        (status = 500, description = "outcome_unknown: retry with the same Idempotency-Key.", body = ErrorBody)))]
pub async fn create_issuance(
    caller: Caller,
    state: web::Data<AppState>,
    req: HttpRequest,
    body: web::Json<CreateIssuanceBody>,
) -> Result<HttpResponse, ApiError> {
    caller.require(Scope::Issue)?;
    let key = idempotency_key(&req)?.ok_or_else(|| {
        ApiError::BadRequest("POST /issuances needs an Idempotency-Key, so that a retry never issues twice".into())
    })?;
    let body = body.into_inner();
    let destination = AccountId::parse("destinationAccount", &body.destination_account)?;
    let amount_cents = parse_amount("amountCents", &body.amount_cents)?;
    // Any well-formed code: the destination's own currency was checked when it opened.
    let currency = Currency::parse("currency", &body.currency)?;
    let top_up = TopUp {
        destination: destination.into_inner(),
        amount_cents,
        currency: currency.to_string(),
        client: caller.name.clone(),
        idempotency_key: key,
        max_balance_cents: state.max_balance_cents,
    };
    let mut conn = state.pool.get().await?;
    let answer = |mut response: actix_web::HttpResponseBuilder, t| {
        let view = TransferView::from(t);
        response.insert_header((header::LOCATION, format!("/transfers/{}", view.id))).json(view)
    };
    match issue(&mut conn, &top_up).await? {
        Issued::New(t) => {
            audit_issue(&caller, &req, &top_up.destination, top_up.amount_cents, &top_up.currency);
            Ok(answer(HttpResponse::Created(), t))
        }
        Issued::Replayed(t) => Ok(answer(HttpResponse::Ok(), t)),
        Issued::KeyConflict => Err(ApiError::Conflict {
            code: "idempotency_key_conflict",
            message: "this Idempotency-Key was already used with a different request".into(),
        }),
        Issued::Refused(TopUpRefusal::UnknownAccount) => {
            Err(ApiError::NotFound(format!("Account {} does not exist", top_up.destination)))
        }
        Issued::Refused(TopUpRefusal::CurrencyMismatch) => Err(ApiError::Validation(format!(
            "currency must be account {}'s currency, which {} is not",
            top_up.destination, top_up.currency
        ))),
        Issued::Refused(TopUpRefusal::BalanceLimit) => Err(ApiError::Validation(format!(
            "amountCents would take account {} past the balance ceiling of {} (ledger.max_balance_cents)",
            top_up.destination, state.max_balance_cents
        ))),
    }
}

/// [`issuance::issue`], once more when a concurrent request under the same key inserted
/// first (the second run replays it or conflicts). A connection lost mid-write may have
/// committed: the caller retries with its key to learn which.
async fn issue(conn: &mut diesel_async::AsyncPgConnection, top_up: &TopUp) -> Result<Issued, ApiError> {
    use diesel::result::{DatabaseErrorKind, Error};
    let mut raced = false;
    loop {
        return match issuance::issue(conn, top_up).await {
            Err(Error::DatabaseError(DatabaseErrorKind::UniqueViolation, _)) if !raced => {
                raced = true;
                continue;
            }
            Err(Error::DatabaseError(
                DatabaseErrorKind::ClosedConnection | DatabaseErrorKind::UnableToSendCommand,
                _,
            )) => Err(ApiError::OutcomeUnknown("the database connection was lost during the issuance".into())),
            other => Ok(other?),
        };
    }
}

/// The audit log line of money issued by `caller` to `account`.
pub fn audit_issue(caller: &Caller, req: &HttpRequest, account: &str, amount_cents: i64, currency: &str) {
    tracing::info!(
        target: "tally::audit",
        actor = %caller.who(),
        from = %super::edge::client_label(req),
        action = "issue",
        account,
        amount_cents,
        currency,
        "Money issued."
    );
}
