//! Bearer-token authorization of state-changing admin endpoints: a missing token is 401,
//! a wrong one 403, compared in constant time. With no token configured those endpoints
//! are refused (403): an admin listener is never open by omission.

use actix_web::dev::Payload;
use actix_web::{web, FromRequest, HttpRequest};
use futures_util::future::{ready, Ready};
use subtle::ConstantTimeEq;

use super::error::ApiError;
use super::AppState;

/// Present in a handler's arguments: the request carried the admin token.
#[derive(Debug)]
pub struct Admin;

impl FromRequest for Admin {
    type Error = ApiError;
    type Future = Ready<Result<Self, ApiError>>;

    fn from_request(req: &HttpRequest, _: &mut Payload) -> Self::Future {
        ready(check(req))
    }
}

fn check(req: &HttpRequest) -> Result<Admin, ApiError> {
    let state =
        req.app_data::<web::Data<AppState>>().ok_or_else(|| ApiError::Internal("admin state missing".into()))?;
    let configured = state.admin_token.expose().as_bytes();
    let presented = req
        .headers()
        .get(actix_web::http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .ok_or(ApiError::Unauthorized)?;
    if configured.is_empty() {
        return Err(ApiError::Forbidden);
    }
    if bool::from(presented.as_bytes().ct_eq(configured)) {
        Ok(Admin)
    } else {
        Err(ApiError::Forbidden)
    }
}
