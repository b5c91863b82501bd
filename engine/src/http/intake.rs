//! Intake endpoints of transfers (those of accounts are in `accounts`, of orders in
//! `orders`).

use actix_web::http::header;
use actix_web::{web, HttpRequest, HttpResponse};
use diesel_async::AsyncPgConnection;
use futures_util::future::BoxFuture;
use futures_util::FutureExt;
use serde::{Deserialize, Serialize};
use tally_actors::outbox::CommitBell;
use tally_actors::trace;
use tally_schema::models::Transfer;
use tally_schema::values::parse_amount;
use tally_schema::{AccountId, Currency};
use tracing::field::{display, Empty};
use tracing::Instrument;
use uuid::Uuid;

use super::auth::Caller;
use super::error::{ApiError, ErrorBody};
use super::AppState;
use tally_actors::authority::{AccountRef, Scope};
use tally_actors::store::group_commit::{Batch, Refusal};
use tally_actors::store::transfers::{self, Created, Intake, TransferRequest};
use tally_actors::supervise::{Classify, ErrorClass};

/// A transfer to create. `amountCents` is at most `ledger.max_balance_cents` (the served
/// document states this daemon's); the two accounts differ.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CreateTransferBody {
    /// 1 to 32 characters, no whitespace or control characters.
    #[schema(pattern = r"^[^\s\x00-\x1f\x7f-\x9f]{1,32}$", example = "acc-alice")]
    source_account: String,
    #[schema(pattern = r"^[^\s\x00-\x1f\x7f-\x9f]{1,32}$", example = "acc-bob")]
    destination_account: String,
    #[schema(value_type = i64, minimum = 1, example = 1250)]
    amount_cents: serde_json::Number,
    /// ISO 4217.
    #[schema(pattern = r"^[A-Z]{3}$", example = "BRL")]
    currency: String,
}

impl CreateTransferBody {
    fn validate(self, max_cents: i64) -> Result<TransferRequest, ApiError> {
        let source = AccountId::parse("sourceAccount", &self.source_account)?;
        let destination = AccountId::parse("destinationAccount", &self.destination_account)?;
        let amount_cents = parse_amount("amountCents", &self.amount_cents)?;
        if amount_cents > max_cents {
            return Err(ApiError::Validation(format!("amountCents must be at most {max_cents}")));
        }
        // Any well-formed code: an account holds a currency it was opened in (checked then),
        // and a transfer in another is rejected CURRENCY_MISMATCH; accounts in a currency
        // ISO 4217 has since withdrawn keep moving money.
        let currency = Currency::parse("currency", &self.currency)?;
        if source == destination {
            return Err(ApiError::Validation("sourceAccount and destinationAccount must differ".into()));
        }
        Ok(TransferRequest {
            source_account: source.into_inner(),
            destination_account: destination.into_inner(),
            amount_cents,
            currency: currency.to_string(),
        })
    }
}

#[derive(Debug, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct TransferView {
    pub(super) id: Uuid,
    source_account: String,
    destination_account: String,
    amount_cents: i64,
    currency: String,
    /// `PENDING`, then `SETTLED` or `REJECTED` (a transfer antifraud blocked is `REJECTED`
    /// with `rejectionReason` `BLOCKED_BY_ANTIFRAUD`).
    status: String,
    rejection_reason: Option<String>,
    /// The API client that created it; `null` when the intake did not authenticate it.
    client: Option<String>,
    /// `transfer` (between two accounts, through antifraud and the ledger) or `issuance`
    /// (money issued from the currency's issuance account, settled at once).
    kind: String,
    created_at: chrono::DateTime<chrono::Utc>,
    updated_at: chrono::DateTime<chrono::Utc>,
}

impl From<Transfer> for TransferView {
    fn from(t: Transfer) -> Self {
        Self {
            id: t.id,
            source_account: t.source_account,
            destination_account: t.destination_account,
            amount_cents: t.amount_cents,
            currency: t.currency,
            status: t.status,
            rejection_reason: t.rejection_reason,
            client: Some(t.client).filter(|c| !c.is_empty()),
            kind: t.kind,
            created_at: t.created_at,
            updated_at: t.updated_at,
        }
    }
}

/// `POST /transfers`: 201 with the transfer; with `Idempotency-Key`, a replay of the same
/// request by the same client answers 200 with the original and a different request 409
/// (keys are scoped per API client). Nothing is written unless 201; nothing is read without
/// a valid client token when the intake authenticates (401). The write shares a transaction with the requests that arrived meanwhile
/// ([`IntakeBatch`]).
///
/// Runs inside the `http.transfer` span (kind SERVER, status ERROR on a 5xx), the first hop
/// of the transfer's trace: a child of
/// the request's `traceparent` when it has a valid one, else the root of a new trace. The
/// traceparent stored with the outbox row names this span when traces are exported.
#[utoipa::path(post, path = "/transfers", tag = "intake",
    params(("Idempotency-Key" = Option<String>, Header, pattern = r"^[\x21-\x7e]{1,255}$",
        description = "Makes retries safe: a replay answers 200 with the original.")),
    request_body = CreateTransferBody,
    responses(
        (status = 201, description = "Created and queued for the ledger.", body = TransferView),
        (status = 200, description = "A replay of the request of this Idempotency-Key.", body = TransferView),
        (status = 403, description = "The source account is not the client's, the destination an issuance \
            account, or the client lacks `transfers:create`.", body = ErrorBody),
        (status = 409, description = "This Idempotency-Key was used with another request.", body = ErrorBody),
        (status = 422, description = "A value breaks its rule.", body = ErrorBody),
        (status = 500, description = "outcome_unknown: retry with the same Idempotency-Key.", body = ErrorBody)))]
pub async fn create_transfer(
    caller: Caller,
    state: web::Data<AppState>,
    req: HttpRequest,
    body: web::Json<CreateTransferBody>,
) -> Result<HttpResponse, ApiError> {
    let span = tracing::info_span!(
        "http.transfer",
        otel.kind = "server",
        otel.status_code = Empty,
        otel.status_description = Empty,
        error.type = Empty,
        trace_id = Empty,
        transfer.id = Empty,
        outcome = Empty,
        http.request.method = "POST",
        http.route = "/transfers",
        http.response.status_code = Empty,
        db.system = "postgresql",
    );
    let traceparent = trace::start(&span, super::incoming_traceparent(&req));
    let result = accept_transfer(caller, state, req, body, traceparent).instrument(span.clone()).await;
    match &result {
        Ok((outcome, id, response)) => {
            span.record("transfer.id", display(id));
            span.record("outcome", *outcome);
            span.record("http.response.status_code", i64::from(response.status().as_u16()));
        }
        Err(e) => {
            span.record("outcome", e.code());
            let status = actix_web::ResponseError::status_code(e);
            span.record("http.response.status_code", i64::from(status.as_u16()));
            // A server span fails on a 5xx only: a 4xx is the client's (OpenTelemetry's
            // HTTP conventions).
            if status.is_server_error() {
                trace::failed(&span, status.as_str(), &e.to_string());
            }
        }
    }
    result.map(|(_, _, response)| response)
}

async fn accept_transfer(
    caller: Caller,
    state: web::Data<AppState>,
    req: HttpRequest,
    body: web::Json<CreateTransferBody>,
    traceparent: String,
) -> Result<(&'static str, Uuid, HttpResponse), ApiError> {
    caller.require(Scope::TransfersCreate)?;
    let key = idempotency_key(&req)?;
    let request = body.into_inner().validate(state.max_balance_cents)?;
    let created = state
        .intake
        .submit(Intake {
            request,
            client: caller.name.clone(),
            adopts_anonymous: caller.adopts_anonymous,
            idempotency_key: key,
            traceparent: Some(traceparent),
        })
        .await
        .map_err(|e| e.answer)?;
    let answer = |outcome, mut response: actix_web::HttpResponseBuilder, t: Transfer| {
        let id = t.id;
        let body = response.insert_header((header::LOCATION, format!("/transfers/{id}"))).json(TransferView::from(t));
        Ok((outcome, id, body))
    };
    match created {
        Created::New(t) => answer("created", HttpResponse::Created(), t),
        Created::Replayed(t) => answer("replayed", HttpResponse::Ok(), t),
        Created::KeyConflict => Err(ApiError::Conflict {
            code: "idempotency_key_conflict",
            message: "this Idempotency-Key was already used with a different request".into(),
        }),
        Created::Refused(refusal) => Err(refused(&caller, &req, &refusal)),
    }
}

/// The 403 of a refused transfer request, after its audit log line.
fn refused(caller: &Caller, req: &HttpRequest, refusal: &transfers::Refusal) -> ApiError {
    let (code, account, message) = match refusal {
        transfers::Refusal::Debit(account) => {
            ("debit_forbidden", account, format!("Account {account} is not {}'s to debit", caller.who()))
        }
        transfers::Refusal::Credit(account) => (
            "credit_forbidden",
            account,
            format!("Account {account} is an issuance account: money reaches it by no transfer"),
        ),
    };
    tracing::warn!(target: "tally::audit", actor = %caller.who(), from = %super::edge::client_label(req),
                   action = "transfer", account = %account, refused = code, "Refused a transfer.");
    ApiError::Refused { code, message }
}

/// The intake's writes for a [`GroupCommit`](tally_actors::store::group_commit::GroupCommit): `POST /transfers` requests that arrive while
/// the intake's writers (`http.intake_writers`) are busy share one transaction, up to
/// `http.intake_batch_max`. A 201 still means the transfer and its outbox row are
/// committed.
pub struct IntakeBatch {
    /// Where `TransferRequested` events go (`kafka.topics.transfers_requested`).
    pub topic: String,
    /// Rung after each write, committed or not: the intake's connections leave the outbox
    /// notification to it (`tally.outbox_notify = 'after_commit'`).
    pub committed: CommitBell,
}

/// A failed intake write: the answer, and whether one request's data can have caused it.
#[derive(Debug, Clone)]
pub struct IntakeError {
    answer: ApiError,
    bad_data: bool,
}

impl Batch for IntakeBatch {
    type Item = Intake;
    type Outcome = Created;
    type Error = IntakeError;

    fn write<'a>(
        &'a self,
        conn: &'a mut AsyncPgConnection,
        items: &'a [Intake],
    ) -> BoxFuture<'a, Result<Vec<Created>, IntakeError>> {
        async move {
            let created = transfers::create_transfers(conn, items, &self.topic).await;
            // Also after a failure: a COMMIT whose answer was lost may have committed, and
            // a ring with nothing new costs one claim.
            self.committed.ring();
            created.map_err(|e| match e.class() {
                // Lost mid-transaction: the COMMIT may have reached the server.
                ErrorClass::Unavailable => IntakeError {
                    answer: ApiError::OutcomeUnknown("the database connection was lost during the write".into()),
                    bad_data: false,
                },
                class => IntakeError { bad_data: class == ErrorClass::Poison, answer: e.into() },
            })
        }
        .boxed()
    }

    fn refused(&self, why: Refusal<'_>) -> IntakeError {
        let answer = match why {
            Refusal::NoConnection(e) => ApiError::Unavailable(format!("database unavailable: {e}")),
            Refusal::Overloaded => ApiError::Unavailable("the intake is overloaded: retry later".into()),
            Refusal::Stopped => ApiError::Unavailable("the intake is stopping".into()),
            Refusal::Broken => ApiError::OutcomeUnknown("the intake's write failed".into()),
        };
        IntakeError { answer, bad_data: false }
    }

    /// Only for an error a request's data can cause (a data exception or an integrity
    /// violation): every request is validated before it is queued, so none should.
    fn split(&self, error: &IntakeError) -> bool {
        error.bad_data
    }
}

pub(super) fn idempotency_key(req: &HttpRequest) -> Result<Option<String>, ApiError> {
    let Some(value) = req.headers().get("Idempotency-Key") else { return Ok(None) };
    let key = value
        .to_str()
        .ok()
        .filter(|k| !k.is_empty() && k.len() <= 255 && k.bytes().all(|b| b.is_ascii_graphic()))
        .ok_or_else(|| ApiError::BadRequest("Idempotency-Key must be 1 to 255 visible ASCII characters".into()))?;
    Ok(Some(key.to_owned()))
}

/// `GET /transfers/{id}`: the client that created it and the owners of its two accounts
/// (the payee sees money that came in) see it; anyone else gets 404.
#[utoipa::path(get, path = "/transfers/{id}", tag = "intake", params(("id" = Uuid, Path)),
    responses((status = 200, description = "The transfer.", body = TransferView),
        (status = 403, description = "The client lacks the `read` scope.", body = ErrorBody),
        (status = 404, description = "No such transfer (of this client's).", body = ErrorBody)))]
pub async fn get_transfer(
    caller: Caller,
    state: web::Data<AppState>,
    id: web::Path<Uuid>,
) -> Result<HttpResponse, ApiError> {
    caller.require(Scope::Read)?;
    let mut conn = state.pool.get().await?;
    let not_found = || ApiError::NotFound(format!("Transfer {id} does not exist"));
    let transfer = transfers::find_transfer(&mut conn, *id).await?.ok_or_else(not_found)?;
    let parties = [transfer.source_account.as_str(), transfer.destination_account.as_str()];
    let accounts = tally_actors::store::accounts::refs(&mut conn, &parties).await?;
    let account = |id: &str| accounts.get(id).map(|(owner, kind)| AccountRef { owner, kind });
    if caller.may_read_transfer(&transfer.client, account(parties[0]).as_ref(), account(parties[1]).as_ref()) {
        Ok(HttpResponse::Ok().json(TransferView::from(transfer)))
    } else {
        Err(not_found())
    }
}
