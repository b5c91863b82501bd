//! Start-up database work: create the database if it is missing and apply pending
//! migrations (embedded in the binary). It runs before the actor system starts, on a
//! thread of its own, because diesel's migration harness is synchronous.

use anyhow::{anyhow, Context};
use diesel::migration::MigrationSource;
use diesel::pg::Pg;
use diesel_async::async_connection_wrapper::AsyncConnectionWrapper;
use diesel_async::AsyncPgConnection;
use diesel_migrations::{embed_migrations, EmbeddedMigrations, MigrationHarness};
use tracing::info;

use super::connect::PgConnector;

pub const MIGRATIONS: EmbeddedMigrations = embed_migrations!("../migrations");

/// The contract steps of migrations that expand first (`migrations-contract/`): applied by
/// `tally migrate --contract` only, once no instance of an older release runs, because
/// they drop what an older release still writes.
pub const CONTRACT: EmbeddedMigrations = embed_migrations!("../migrations-contract");

/// Advisory lock key held while migrating, so that two daemons starting together do not
/// apply the same migration twice.
const MIGRATION_LOCK: i64 = 0x7461_6c6c_795f_6d67; // "tally_mg"

/// The versions of every embedded migration, for the readiness check.
///
/// # Errors
/// When the embedded migrations cannot be listed (a build defect).
pub fn embedded_versions() -> anyhow::Result<Vec<String>> {
    versions(&MIGRATIONS)
}

fn versions(source: &EmbeddedMigrations) -> anyhow::Result<Vec<String>> {
    let migrations =
        MigrationSource::<Pg>::migrations(source).map_err(|e| anyhow!("cannot list embedded migrations: {e}"))?;
    Ok(migrations.iter().map(|m| m.name().version().to_string()).collect())
}

/// Creates the database named in `url` if missing, then applies pending migrations.
/// Returns the versions applied now. Blocking: call it before the actor system starts or
/// from a thread without an async runtime.
///
/// # Errors
/// When PostgreSQL is unreachable, the database cannot be created, or a migration fails.
pub fn prepare_blocking(url: &str) -> anyhow::Result<Vec<String>> {
    migrate_blocking(url, false)
}

/// [`prepare_blocking`], then the contract steps ([`CONTRACT`]).
///
/// # Errors
/// As [`prepare_blocking`].
pub fn contract_blocking(url: &str) -> anyhow::Result<Vec<String>> {
    migrate_blocking(url, true)
}

fn migrate_blocking(url: &str, contract: bool) -> anyhow::Result<Vec<String>> {
    let url = url.to_owned();
    std::thread::spawn(move || -> anyhow::Result<Vec<String>> {
        // One worker, so that the connection's driver task runs while the synchronous
        // migration harness blocks on its queries.
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .context("cannot start the start-up runtime")?;
        runtime.block_on(create_database_if_missing(&url))?;
        let connector = PgConnector::from_url(&url)?;
        let conn =
            runtime.block_on(connector.establish()).with_context(|| format!("cannot connect to {}", redact(&url)))?;
        let _entered = runtime.enter();
        run_migrations(AsyncConnectionWrapper::from(conn), &url, contract)
    })
    .join()
    .map_err(|_| anyhow!("the migration thread panicked"))?
}

/// Creates the database of `url` when it does not exist yet.
///
/// # Errors
/// When the server is unreachable or refuses `CREATE DATABASE`.
pub async fn create_database_if_missing(url: &str) -> anyhow::Result<()> {
    let connector = PgConnector::from_url(url).context("database.url cannot be used")?;
    let name = connector.config().get_dbname().ok_or_else(|| anyhow!("database.url names no database"))?.to_owned();
    let (client, connection) = connector
        .with_dbname("postgres")
        .connect()
        .await
        .with_context(|| format!("cannot connect to PostgreSQL at {}", redact(url)))?;
    let driver = tokio::spawn(connection);
    let exists = client
        .query_opt("SELECT 1 FROM pg_database WHERE datname = $1", &[&name])
        .await
        .context("cannot list databases")?
        .is_some();
    if !exists {
        let sql = format!("CREATE DATABASE \"{}\"", name.replace('"', "\"\""));
        match client.batch_execute(&sql).await {
            Ok(()) => info!(database = %name, "Created database."),
            // Another process created it in the meantime: 42P04 once its row is visible,
            // 23505 on the catalog's unique index while its CREATE DATABASE is running.
            Err(e) if created_meanwhile(&e) => {
                info!(database = %name, "Another process created the database meanwhile.");
            }
            Err(e) => return Err(e).with_context(|| format!("cannot create database {name}")),
        }
    }
    drop(client);
    let _ = driver.await;
    Ok(())
}

/// Whether `CREATE DATABASE` failed because another session created the same database at
/// the same time.
fn created_meanwhile(e: &tokio_postgres::Error) -> bool {
    use tokio_postgres::error::SqlState;
    e.code().is_some_and(|c| *c == SqlState::DUPLICATE_DATABASE || *c == SqlState::UNIQUE_VIOLATION)
}

fn run_migrations(
    mut conn: AsyncConnectionWrapper<AsyncPgConnection>,
    url: &str,
    contract: bool,
) -> anyhow::Result<Vec<String>> {
    use diesel::connection::SimpleConnection;
    // The harness creates its table IF NOT EXISTS on every start: no NOTICE about it.
    conn.batch_execute("SET client_min_messages TO warning").context("cannot set client_min_messages")?;
    conn.batch_execute(&format!("SELECT pg_advisory_lock({MIGRATION_LOCK})"))
        .context("cannot take the migration lock")?;
    let applied = refuse_unknown(&mut conn, url).and_then(|()| {
        let failed = |e| anyhow!("migration failed: {e}");
        let mut applied: Vec<String> =
            conn.run_pending_migrations(MIGRATIONS).map_err(failed)?.iter().map(ToString::to_string).collect();
        if contract {
            applied.extend(conn.run_pending_migrations(CONTRACT).map_err(failed)?.iter().map(ToString::to_string));
        }
        Ok(applied)
    });
    let unlock = conn.batch_execute(&format!("SELECT pg_advisory_unlock({MIGRATION_LOCK})"));
    let applied = applied?;
    unlock.context("cannot release the migration lock")?;
    for version in &applied {
        info!(version, "Applied migration.");
    }
    Ok(applied)
}

/// Fails, naming them, when the database has applied migrations this binary does not
/// embed: a newer release migrated it, and this one would run against a schema it does
/// not know. Migrations are forward-only; the way back is that release (or a restore).
fn refuse_unknown(conn: &mut AsyncConnectionWrapper<AsyncPgConnection>, url: &str) -> anyhow::Result<()> {
    let mut known = embedded_versions()?;
    known.extend(versions(&CONTRACT)?);
    let applied = conn.applied_migrations().map_err(|e| anyhow!("cannot read the applied migrations: {e}"))?;
    let mut unknown: Vec<String> = applied.iter().map(ToString::to_string).filter(|v| !known.contains(v)).collect();
    if unknown.is_empty() {
        return Ok(());
    }
    unknown.sort();
    Err(anyhow!(
        "the database at {} was migrated by a newer tally: it has migrations {} that this binary ({}) \
         does not know (the newest it knows is {}). Run that newer release, or restore the database \
         from before its upgrade; this binary does not start on a schema newer than its own",
        redact(url),
        unknown.join(", "),
        env!("CARGO_PKG_VERSION"),
        known.iter().max().map_or("none", String::as_str),
    ))
}

/// `url` without its password, for messages: user, host, port and database.
#[must_use]
pub fn redact(url: &str) -> String {
    super::connect::describe(url)
}

#[derive(diesel::QueryableByName)]
struct VersionRow {
    #[diesel(sql_type = diesel::sql_types::Text)]
    version: String,
}

/// The versions of every applied migration, for the readiness check.
///
/// # Errors
/// Any database error (e.g. the migrations table is missing).
pub async fn applied_versions(conn: &mut AsyncPgConnection) -> Result<Vec<String>, diesel::result::Error> {
    use diesel_async::RunQueryDsl;
    Ok(diesel::sql_query("SELECT version::text AS version FROM __diesel_schema_migrations")
        .load::<VersionRow>(conn)
        .await?
        .into_iter()
        .map(|r| r.version)
        .collect())
}

#[cfg(test)]
mod tests {
    use super::redact;

    #[test]
    fn redacted_urls_keep_host_port_and_database_but_no_password() {
        assert_eq!(redact("postgres://app:s3cret@db.example:6543/tally"), "postgres://app@db.example:6543/tally");
        assert_eq!(redact("postgres://app:s3cret@db.example/tally"), "postgres://app@db.example:5432/tally");
        assert_eq!(redact("postgres://app@[::1]:5433/tally"), "postgres://app@[::1]:5433/tally");
        assert_eq!(redact("not a url at all"), "<invalid url>");
    }
}
