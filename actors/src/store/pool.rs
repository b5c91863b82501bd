//! The PostgreSQL connection pool: one deadpool of `AsyncPgConnection`, with
//! `statement_timeout` and `application_name` set on every new connection.

use std::time::Duration;

use diesel::ConnectionError;
use diesel_async::pooled_connection::deadpool::{BuildError, Pool};
use diesel_async::pooled_connection::{AsyncDieselConnectionManager, ManagerConfig};
use diesel_async::{AsyncConnection, AsyncPgConnection, SimpleAsyncConnection};
use futures_util::FutureExt;

pub type PgPool = Pool<AsyncPgConnection>;
pub type PooledConnection = diesel_async::pooled_connection::deadpool::Object<AsyncPgConnection>;

/// Settings of [`build_pool`].
#[derive(Debug, Clone)]
pub struct PoolSettings {
    pub url: String,
    pub max_size: usize,
    pub statement_timeout: Duration,
    pub connect_timeout: Duration,
    pub application_name: String,
}

/// Builds the pool. Connections are opened lazily.
///
/// # Errors
/// When the pool cannot be built (an invalid size).
pub fn build_pool(settings: &PoolSettings) -> Result<PgPool, BuildError> {
    let setup_sql = format!(
        "SET statement_timeout = {}; SET application_name = '{}'; SET lock_timeout = {};",
        settings.statement_timeout.as_millis(),
        settings.application_name.replace('\'', ""),
        settings.statement_timeout.as_millis(),
    );
    let mut config = ManagerConfig::<AsyncPgConnection>::default();
    config.custom_setup = Box::new(move |url| {
        let setup_sql = setup_sql.clone();
        let url = url.to_owned();
        async move {
            let mut conn = AsyncPgConnection::establish(&url).await?;
            conn.batch_execute(&setup_sql).await.map_err(ConnectionError::CouldntSetupConfiguration)?;
            Ok(conn)
        }
        .boxed()
    });
    let manager = AsyncDieselConnectionManager::new_with_config(settings.url.clone(), config);
    Pool::builder(manager)
        .max_size(settings.max_size)
        .wait_timeout(Some(settings.connect_timeout))
        .create_timeout(Some(settings.connect_timeout))
        .runtime(deadpool::Runtime::Tokio1)
        .build()
}
