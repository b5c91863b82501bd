//! tally's actors and the plain logic they wrap: the outbox publisher, and (as the engine
//! grows) consumption, dispatch, offsets, supervision, ledger, antifraud, notifications,
//! projections and orders. Actors are thin mailbox shells; the logic lives in plain structs
//! beside them so that it is tested without an actix `System`.
//!
//! Depends on `tally-schema`; `tally-engine` depends on this crate.

pub mod db;
pub mod metrics;
pub mod outbox;

pub use metrics::Metrics;
