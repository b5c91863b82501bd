//! Intake endpoints of accounts: `POST /accounts` (an opening balance is issued money)
//! and `GET /accounts/{id}` with its postings, for its owner only.

use actix_web::http::header;
use actix_web::{web, HttpRequest, HttpResponse};
use serde::{Deserialize, Serialize};
use tally_schema::models::{Account, Posting};
use tally_schema::AccountId;
use uuid::Uuid;

use super::auth::Caller;
use super::error::{ApiError, ErrorBody};
use super::AppState;
use tally_actors::authority::{AccountRef, Scope};
use tally_actors::store::{accounts, issuance};

/// An account to open; `initialBalanceCents` is at most `ledger.max_balance_cents`, and
/// more than 0 is issued money (the `issue` scope).
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CreateAccountBody {
    /// 1 to 32 characters, each an ASCII letter, a digit or one of `. _ : @ + -`, not
    /// starting with `issuance:` in any letter case (the issuance accounts' names). Unique
    /// regardless of letter case: `ACC-1` cannot be opened beside `acc-1`.
    #[schema(pattern = r"^[A-Za-z0-9._:@+-]{1,32}$", example = "acc-alice")]
    id: String,
    #[schema(pattern = r"^[A-Z]{3}$", example = "BRL")]
    currency: String,
    #[schema(value_type = i64, minimum = 0, example = 10000)]
    initial_balance_cents: serde_json::Number,
}

#[derive(Debug, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct AccountView {
    id: String,
    currency: String,
    balance_cents: i64,
    /// The API client that opened it (and alone debits and reads it); `null` for one the
    /// anonymous caller opened.
    owner: Option<String>,
}

impl From<Account> for AccountView {
    fn from(a: Account) -> Self {
        Self {
            id: a.id,
            currency: a.currency,
            balance_cents: a.balance_cents,
            owner: Some(a.owner).filter(|o| !o.is_empty()),
        }
    }
}

/// `POST /accounts`: 201 with the account, owned by the caller; 409 when the id exists. An
/// opening balance is issued, with postings, from the issuance account of its currency.
#[utoipa::path(post, path = "/accounts", tag = "intake", request_body = CreateAccountBody,
    responses((status = 201, description = "Opened.", body = AccountView),
        (status = 403, description = "The client lacks `accounts:open`, or `issue` for an opening balance.", body = ErrorBody),
        (status = 409, description = "The id exists.", body = ErrorBody),
        (status = 422, description = "A value breaks its rule.", body = ErrorBody)))]
pub async fn create_account(
    caller: Caller,
    state: web::Data<AppState>,
    req: HttpRequest,
    body: web::Json<CreateAccountBody>,
) -> Result<HttpResponse, ApiError> {
    caller.require(Scope::AccountsOpen)?;
    let body = body.into_inner();
    let id = AccountId::parse_new("id", &body.id)?;
    let currency = state.currencies.parse("currency", &body.currency)?;
    let max = state.max_balance_cents;
    let balance =
        body.initial_balance_cents.as_i64().filter(|b| (0..=max).contains(b)).ok_or_else(|| {
            ApiError::Validation(format!("initialBalanceCents must be an integer between 0 and {max}"))
        })?;
    if balance > 0 {
        // An opening balance is money entering the ledger.
        caller.require(Scope::Issue)?;
    }
    let mut conn = state.pool.get().await?;
    let opening = issuance::Opening {
        id: id.as_str().to_owned(),
        currency: currency.as_str().to_owned(),
        balance_cents: balance,
        owner: caller.name.clone(),
    };
    let account = match issuance::open_account(&mut conn, &opening).await {
        // Another request opened an id that differs only in letter case meanwhile.
        Err(e) if issuance::is_folded_id_conflict(&e) => return Err(account_exists(&id)),
        other => other?,
    };
    match account {
        Some(account) if balance > 0 => {
            super::issuances::audit_issue(&caller, &req, &account.id, balance, &account.currency);
            Ok(opened(account))
        }
        Some(account) => Ok(opened(account)),
        None => Err(account_exists(&id)),
    }
}

/// 409 for an id that is taken, exactly or but for letter case, by any client: the answer
/// says that much and nothing of the account (README, Security).
fn account_exists(id: &AccountId) -> ApiError {
    ApiError::Conflict {
        code: "account_exists",
        message: format!("Account {id} already exists (account ids are unique regardless of letter case)"),
    }
}

fn opened(account: Account) -> HttpResponse {
    HttpResponse::Created()
        .insert_header((header::LOCATION, format!("/accounts/{}", account.id)))
        .json(AccountView::from(account))
}

#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct PostingsQuery {
    /// Postings per page (default 50).
    #[param(minimum = 1, maximum = 500)]
    limit: Option<i64>,
    /// The `nextBefore` of the previous page.
    before: Option<i64>,
}

#[derive(Debug, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct PostingView {
    id: i64,
    transfer_id: Uuid,
    kind: String,
    amount_cents: i64,
    created_at: chrono::DateTime<chrono::Utc>,
}

impl From<Posting> for PostingView {
    fn from(p: Posting) -> Self {
        Self {
            id: p.id,
            transfer_id: p.transfer_id,
            kind: p.kind,
            amount_cents: p.amount_cents,
            created_at: p.created_at,
        }
    }
}

#[derive(Debug, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct AccountDetail {
    #[serde(flatten)]
    account: AccountView,
    postings: Vec<PostingView>,
    /// Pass as `before` to get the next (older) page; null on the last page.
    next_before: Option<i64>,
}

/// `GET /accounts/{id}?limit=&before=`: balance and postings, newest first, for the
/// account's owner; anyone else gets 404, as for an account that does not exist.
#[utoipa::path(get, path = "/accounts/{id}", tag = "intake", params(("id" = String, Path), PostingsQuery),
    responses((status = 200, description = "Balance and a page of postings.", body = AccountDetail),
        (status = 403, description = "The client lacks the `read` scope.", body = ErrorBody),
        (status = 404, description = "No such account (of this client).", body = ErrorBody)))]
pub async fn get_account(
    caller: Caller,
    state: web::Data<AppState>,
    id: web::Path<String>,
    query: web::Query<PostingsQuery>,
) -> Result<HttpResponse, ApiError> {
    caller.require(Scope::Read)?;
    let limit = query.limit.unwrap_or(50);
    if !(1..=500).contains(&limit) {
        return Err(ApiError::BadRequest("The limit parameter must be between 1 and 500".into()));
    }
    // An id that breaks the rule was never created (and one with a NUL would make
    // PostgreSQL refuse the query).
    if AccountId::parse("id", &id).is_err() {
        return Err(ApiError::NotFound(format!("Account {} does not exist", id.escape_debug())));
    }
    let mut conn = state.pool.get().await?;
    let account = accounts::find_account(&mut conn, &id)
        .await?
        .filter(|a| caller.may_read_account(&AccountRef { owner: &a.owner, kind: &a.kind }))
        .ok_or_else(|| ApiError::NotFound(format!("Account {id} does not exist")))?;
    let postings = accounts::postings_page(&mut conn, &id, query.before, limit).await?;
    let next_before = (postings.len() as i64 == limit).then(|| postings.last().map(|p| p.id)).flatten();
    Ok(HttpResponse::Ok().json(AccountDetail {
        account: account.into(),
        postings: postings.into_iter().map(Into::into).collect(),
        next_before,
    }))
}
