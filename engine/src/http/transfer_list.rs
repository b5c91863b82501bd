//! `GET /admin/transfers?account=&status=&limit=&before=` (admin token, it shows accounts
//! and amounts): the operator console's transfer list, newest first.
//!
//! - `account`: transfers from or to this account;
//! - `status`: `PENDING`, `SETTLED` or `REJECTED` (any case);
//! - `limit`: 1 to [`MAX_LIMIT`] (default [`DEFAULT_LIMIT`]);
//! - `before`: a transfer id, the `next` of the previous page.
//!
//! Answers `{transfers: [..], next}` (each transfer viewed as by `GET /transfers/{id}`),
//! `next` null on the last page. Any other parameter, or a bad value, is a 400 that says
//! which parameter and what it accepts.

use std::collections::HashMap;

use actix_web::{web, HttpResponse};
use serde_json::json;
use tally_actors::store::transfer_list::{self, TransferFilter};
use tally_schema::models::status;
use tally_schema::AccountId;
use uuid::Uuid;

use super::auth::Admin;
use super::error::{ApiError, ErrorBody};
use super::intake::TransferView;
use super::AppState;

pub const DEFAULT_LIMIT: usize = 50;
pub const MAX_LIMIT: usize = 200;
const STATUSES: [&str; 3] = [status::PENDING, status::SETTLED, status::REJECTED];

/// A validated query: the filter and the page size.
#[derive(Debug, PartialEq, Eq)]
struct ListQuery {
    filter: TransferFilter,
    limit: usize,
}

fn parse(params: &HashMap<String, String>) -> Result<ListQuery, ApiError> {
    let bad = |m: String| Err(ApiError::BadRequest(m));
    let mut names: Vec<&String> = params.keys().collect();
    names.sort();
    if let Some(unknown) = names.iter().find(|n| !["account", "status", "limit", "before"].contains(&n.as_str())) {
        return bad(format!(
            "Unknown parameter \"{unknown}\": the transfer list takes account, status, limit and before."
        ));
    }
    let value = |name: &str| params.get(name).map(|v| v.trim()).filter(|v| !v.is_empty());
    let account = match value("account") {
        None => None,
        Some(a) => match AccountId::parse("account", a) {
            Ok(a) => Some(a.into_inner()),
            Err(e) => return bad(format!("The parameter {e}.")),
        },
    };
    let status = match value("status").map(str::to_ascii_uppercase) {
        None => None,
        Some(s) if STATUSES.contains(&s.as_str()) => Some(s),
        Some(s) => return bad(format!("The status must be PENDING, SETTLED or REJECTED, not \"{s}\".")),
    };
    // Empty account and status are the console's blank search fields; an empty limit or
    // cursor is a malformed request.
    for name in ["limit", "before"] {
        if params.get(name).is_some_and(|v| v.trim().is_empty()) {
            return bad(format!("The parameter {name} is empty: leave it out or give it a value."));
        }
    }
    let limit = match value("limit") {
        None => DEFAULT_LIMIT,
        Some(l) => match l.parse::<usize>() {
            Ok(n) if (1..=MAX_LIMIT).contains(&n) => n,
            _ => return bad(format!("The limit must be a whole number from 1 to {MAX_LIMIT}, not \"{l}\".")),
        },
    };
    let before = match value("before") {
        None => None,
        Some(b) => match Uuid::parse_str(b) {
            Ok(id) => Some(id),
            Err(_) => return bad(format!("The parameter before must be a transfer id (a UUID), not \"{b}\".")),
        },
    };
    Ok(ListQuery { filter: TransferFilter { account, status, before }, limit })
}

/// `GET /admin/transfers` (admin token).
#[utoipa::path(get, path = "/admin/transfers", tag = "console", security(("admin" = [])),
    params(
        ("account" = Option<String>, Query, description = "Transfers from or to this account."),
        ("status" = Option<String>, Query, description = "PENDING, SETTLED or REJECTED."),
        ("limit" = Option<usize>, Query, minimum = 1, maximum = 200, description = "Page size, default 50."),
        ("before" = Option<Uuid>, Query, description = "The previous page's `next`: older transfers."),
    ),
    responses((status = 200, description = "`{transfers, next}`, newest first.", body = Object),
        (status = 400, description = "A parameter is unknown or malformed.", body = ErrorBody)))]
pub(super) async fn list(
    _: Admin,
    state: web::Data<AppState>,
    query: web::Query<HashMap<String, String>>,
) -> Result<HttpResponse, ApiError> {
    let q = parse(&query)?;
    let mut conn = state.pool.get().await?;
    let rows = transfer_list::list(&mut conn, &q.filter, q.limit as i64).await?;
    let next = if rows.len() == q.limit { rows.last().map(|t| t.id) } else { None };
    let transfers: Vec<TransferView> = rows.into_iter().map(TransferView::from).collect();
    Ok(HttpResponse::Ok().json(json!({ "transfers": transfers, "next": next })))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_empty_cursor_or_limit_is_refused_and_empty_filters_are_absent() {
        for name in ["before", "limit"] {
            let e = query(&[(name, "")]).unwrap_err();
            assert!(e.contains(name) && e.contains("empty"), "{e}");
        }
        let q = query(&[("account", ""), ("status", " ")]).unwrap();
        assert_eq!((q.filter.account, q.filter.status, q.limit), (None, None, DEFAULT_LIMIT));
    }

    fn query(pairs: &[(&str, &str)]) -> Result<ListQuery, String> {
        let params = pairs.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect();
        parse(&params).map_err(|e| e.to_string())
    }

    #[test]
    fn every_parameter_is_optional() {
        assert_eq!(query(&[]), Ok(ListQuery { filter: TransferFilter::default(), limit: DEFAULT_LIMIT }));
        assert_eq!(query(&[("account", " "), ("status", "")]).map(|q| q.filter), Ok(TransferFilter::default()));
    }

    #[test]
    fn valid_values_are_taken() {
        let id = Uuid::now_v7();
        let q = query(&[("account", "ACC-1"), ("status", "settled"), ("limit", "200"), ("before", &id.to_string())])
            .expect("valid");
        assert_eq!(q.limit, 200);
        assert_eq!(
            q.filter,
            TransferFilter { account: Some("ACC-1".into()), status: Some("SETTLED".into()), before: Some(id) }
        );
    }

    #[test]
    fn bad_values_are_refused_with_a_sentence_naming_the_parameter() {
        for (pairs, says) in [
            (vec![("limit", "0")], "The limit must be a whole number from 1 to 200, not \"0\"."),
            (vec![("limit", "201")], "The limit must be a whole number from 1 to 200, not \"201\"."),
            (vec![("limit", "ten")], "The limit must be a whole number from 1 to 200, not \"ten\"."),
            (vec![("status", "done")], "The status must be PENDING, SETTLED or REJECTED, not \"DONE\"."),
            (vec![("before", "x")], "The parameter before must be a transfer id (a UUID), not \"x\"."),
            (
                vec![("acount", "A")],
                "Unknown parameter \"acount\": the transfer list takes account, status, limit and before.",
            ),
        ] {
            assert_eq!(query(&pairs), Err(says.to_owned()));
        }
        let long = "A".repeat(33);
        let e = query(&[("account", &long)]).expect_err("too long");
        assert!(e.starts_with("The parameter account must be 1 to 32 characters"), "{e}");
    }
}
