//! The tally daemon: command line, configuration, wiring, HTTP intake and admin endpoints,
//! Kafka client set-up, the embedded broker, and the bench driver.
//!
//! Depends on `tally-actors` and `tally-schema`; only `integration-tests` depends on this
//! crate. The design, with the life of a record and the reasons behind it, is
//! `docs/ARCHITECTURE.md` at the repository root.

pub mod app;
pub mod bench;
pub mod broker;
pub mod config;
pub use tally_actors::dlt;
pub mod http;
pub mod sd_notify;
pub mod stages;
pub mod status;
pub mod telemetry;
pub mod throughput;
pub mod topics;

pub use app::{spawn, Daemon, DaemonHandle, KafkaEndpoint};
pub use config::Config;
