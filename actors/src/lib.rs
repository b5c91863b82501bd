//! tally's actors and the plain logic they wrap: the outbox publisher, the consumption
//! machinery (driver, partition consumers, keyed workers, offset watermarks), supervision
//! (retry policy, DLT), and the pipelines built on them (ledger, orders, ...). Actors are thin
//! mailbox shells; the logic lives in plain structs beside them so that it is tested
//! without an actix `System`.
//!
//! Also every SQL statement ([`store`]), every Kafka client's settings ([`kafka_clients`]), the
//! dead-letter topics ([`dlt`]), the one backoff curve ([`backoff`]) and the hop spans of
//! distributed traces ([`trace`]).
//!
//! Depends on `tally-schema`; `tally-engine` depends on this crate. The design, with the
//! life of a record and the reasons behind it, is `docs/ARCHITECTURE.md` at the repository
//! root.

pub mod antifraud;
pub mod authority;
pub mod backoff;
pub mod consume;
pub mod counted;
pub mod dlt;
pub mod faults;
pub mod kafka_clients;
pub mod ledger;
pub mod metrics;
pub mod notify;
pub mod orders;
pub mod outbox;
pub mod projection;
pub mod record;
pub mod signing;
pub mod store;
pub mod supervise;
pub mod trace;

#[cfg(test)]
mod decode_tests;

pub use metrics::Metrics;
