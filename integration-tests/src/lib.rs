//! The black-box test harness of tally: a fresh PostgreSQL database per test
//! ([`TestDb`]), an embedded Kafka broker that outlives daemon restarts ([`TestEnv`]),
//! whole daemons started on port 0 ([`TestApp`]), Kafka topic readers ([`read_topic`]) and
//! deadline-bounded waits ([`wait_until`]). Test binaries live in `tests/`; nothing else
//! depends on this crate.
//!
//! | module | what |
//! |---|---|
//! | `db` | [`TestDb`] (copied from a migrated template), [`DbProxy`], refusing connections |
//! | `daemon` | [`TestEnv`], [`TestApp`], [`spawn_app`], [`run_only`], [`spawn_tally_process`] |
//! | `client` | HTTP helpers, [`metric_value`], the transfer flow ([`post_transfer`], [`final_state`], ...) |
//! | `kafka` | [`read_topic`], [`produce`], [`committed_offset`], [`non_empty_dlts`] |
//! | `wait` | [`Deadline`], [`wait_until`] |
//! | `logs` | every log of a test under `target/test-logs/<test>/`, their last lines printed when it fails |
//! | `webhook` | [`WebhookReceiver`] |
//! | `upstream` | [`Upstream`]: events signed as tally's stages sign them, and the system-of-record rows the stages before the tested one would have written |
//! | `hostile` | records no well-behaved producer writes, produced as raw bytes |
//! | `noida` | a noida-db broker (real transactions) |
//! | `kafka_tls` | [`kafka_tls::TlsBroker`]: a TLS-terminating proxy (socat) in front of the embedded broker |
//! | `browser` | [`Browser`]: headless Chromium over WebDriver, screenshots under `target/ui/` |
//!
//! Conventions every test follows:
//! - Each test owns its database and its broker, so default topic names never collide
//!   between tests running in parallel.
//! - Waiting is done with [`wait_until`] (poll every 50 ms, fail with the last observation
//!   after a deadline), never with a fixed sleep used as an assertion.
//! - The broker is librdkafka's mock cluster; tests say so in a comment.
//!
//! Harness functions panic (with a message) instead of returning errors: a failing set-up
//! is a failing test, and the panic message is the report. Hence `expect` is allowed here.
//!
//! ```no_run
//! # async fn demo() {
//! use tally_integration_tests::{spawn_app, wait_until, Deadline};
//! let (env, app) = spawn_app(|c| c.outbox.batch_size = 10).await;
//! let res = app.post_json("/transfers", &serde_json::json!({})).await;
//! assert_eq!(res.status(), 400);
//! let n = wait_until("nothing", Deadline::DEFAULT, || async { Ok::<_, String>(()) }).await;
//! # drop((env, app, n));
//! # }
//! ```

#![allow(clippy::expect_used)]

use std::collections::HashMap;
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context};
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::Message;
use rdkafka::{ClientConfig, Offset, TopicPartitionList};
use tally_engine::broker::EmbeddedBroker;
pub use tally_engine::config::GroupProtocol;
use tally_engine::config::{DbPool, PoolsConfig, SecretUrl};
use tally_engine::{Config, DaemonHandle};
use tokio_postgres::types::ToSql;
use tokio_postgres::{Client, NoTls, Row};

mod browser;
mod client;
mod daemon;
mod db;
pub mod hostile;
mod kafka;
pub mod kafka_tls;
pub mod logs;
pub mod noida;
pub mod tls;
mod upstream;
mod wait;
mod webhook;

pub use browser::*;
pub use client::*;
pub use daemon::*;
pub use db::*;
pub use kafka::*;
pub use logs::init_logging;
pub use upstream::*;
pub use wait::*;
pub use webhook::*;

pub use tally_engine;

/// Runs each async test function `name(protocol: GroupProtocol)` under both consumer group
/// protocols, as the tests `name::classic` and `name::consumer` (multi-threaded runtime,
/// two workers).
#[macro_export]
macro_rules! under_both_protocols {
    ($($name:ident),+ $(,)?) => {$(
        mod $name {
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn classic() {
                super::$name($crate::GroupProtocol::Classic).await;
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn consumer() {
                super::$name($crate::GroupProtocol::Consumer).await;
            }
        }
    )+};
}

/// The server on which tests create their databases.
pub const DEFAULT_DATABASE_URL: &str = "postgres://postgres@127.0.0.1:5432/postgres";
