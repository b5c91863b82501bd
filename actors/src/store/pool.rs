//! The PostgreSQL connection pools: each a deadpool of `AsyncPgConnection`, with
//! `statement_timeout` and `application_name` set on every new connection. The daemon
//! builds one per stage, so that one stage's backlog waits on its own connections only.

use std::time::Duration;

use deadpool::managed::{BuildError, Manager, Pool, RecycleResult};
use diesel::ConnectionError;
use diesel_async::pooled_connection::{AsyncDieselConnectionManager, ManagerConfig, PoolError, PoolableConnection};
use diesel_async::{AsyncPgConnection, SimpleAsyncConnection};
use futures_util::FutureExt;

use super::connect::PgConnector;
use crate::metrics::Metrics;

pub type PgPool = Pool<Verifier>;
pub type PooledConnection = deadpool::managed::Object<Verifier>;

/// A connection handed out again within this long of its last checkout is not asked
/// `SELECT 1` first: it answered a moment ago. The same window as HikariCP's
/// `aliveBypassWindowMs`.
pub const VERIFY_AFTER: Duration = Duration::from_millis(500);

/// diesel-async's manager, except for the check at checkout. diesel-async sends `SELECT 1`
/// before every reuse, a round trip per checkout: under load about one per transfer, a
/// fifth of the statements the daemon sends. A connection checked out within
/// [`VERIFY_AFTER`] is only checked for what the driver knows without asking: a transaction
/// left open or failed to roll back, or its socket closed (the server ended the session or
/// restarted). An older one is also asked `SELECT 1`, as before.
pub struct Verifier(AsyncDieselConnectionManager<AsyncPgConnection>);

impl Manager for Verifier {
    type Type = AsyncPgConnection;
    type Error = PoolError;

    async fn create(&self) -> Result<AsyncPgConnection, PoolError> {
        self.0.create().await
    }

    async fn recycle(
        &self,
        conn: &mut AsyncPgConnection,
        metrics: &deadpool::managed::Metrics,
    ) -> RecycleResult<PoolError> {
        if metrics.last_used() < VERIFY_AFTER && !std::thread::panicking() && !conn.is_broken() {
            return Ok(());
        }
        self.0.recycle(conn, metrics).await
    }
}

/// Settings of [`build_pool`].
#[derive(Debug, Clone)]
pub struct PoolSettings {
    pub url: String,
    pub max_size: usize,
    pub statement_timeout: Duration,
    pub connect_timeout: Duration,
    pub application_name: String,
    /// The pool's writers wake the outbox publishers themselves after they commit (a
    /// [`crate::outbox::CommitBell`]): its connections set `tally.outbox_notify =
    /// 'after_commit'`, and the `outbox_events` trigger sends no notification for them.
    pub outbox_notify_after_commit: bool,
}

/// Builds the pool. Connections are opened lazily, each on the runtime of the task that
/// first needs it (which then drives it), with the URL's TLS set-up ([`PgConnector`]).
///
/// # Errors
/// When the URL cannot be used (its TLS parameters, the files they name) or the pool
/// cannot be built (an invalid size).
pub fn build_pool(settings: &PoolSettings) -> anyhow::Result<PgPool> {
    let connector = PgConnector::from_url(&settings.url)?;
    let mut setup_sql = format!(
        "SET statement_timeout = {}; SET application_name = '{}'; SET lock_timeout = {};",
        settings.statement_timeout.as_millis(),
        settings.application_name.replace('\'', ""),
        settings.statement_timeout.as_millis(),
    );
    if settings.outbox_notify_after_commit {
        setup_sql.push_str(" SET tally.outbox_notify = 'after_commit';");
    }
    let mut config = ManagerConfig::<AsyncPgConnection>::default();
    config.custom_setup = Box::new(move |_url| {
        let setup_sql = setup_sql.clone();
        let connector = connector.clone();
        async move {
            let mut conn = connector.establish().await?;
            conn.batch_execute(&setup_sql).await.map_err(ConnectionError::CouldntSetupConfiguration)?;
            Ok(conn)
        }
        .boxed()
    });
    let manager = Verifier(AsyncDieselConnectionManager::new_with_config(settings.url.clone(), config));
    Pool::builder(manager)
        .max_size(settings.max_size)
        .wait_timeout(Some(settings.connect_timeout))
        .create_timeout(Some(settings.connect_timeout))
        .runtime(deadpool::Runtime::Tokio1)
        .build()
        .map_err(|e: BuildError| anyhow::anyhow!(e))
}

/// Publishes the status of `pool` as the `tally_db_pool_*` gauges labelled `name`:
/// connections in use and idle, tasks waiting for one, and the pool's maximum.
pub fn publish_pool_status(name: &str, pool: &PgPool, metrics: &Metrics) {
    let status = pool.status();
    let gauge = |n: usize| i64::try_from(n).unwrap_or(i64::MAX);
    let connections = &metrics.db_pool_connections;
    connections.with_label_values(&[name, "in_use"]).set(gauge(status.size.saturating_sub(status.available)));
    connections.with_label_values(&[name, "idle"]).set(gauge(status.available));
    metrics.db_pool_waiting.with_label_values(&[name]).set(gauge(status.waiting));
    metrics.db_pool_max_connections.with_label_values(&[name]).set(gauge(status.max_size));
}
