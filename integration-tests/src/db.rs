//! Test databases: a fresh database per test, copied from a migrated template, and the
//! tools to take PostgreSQL away from a daemon (refused connections, a cuttable proxy).

use super::*;

/// A fresh, uniquely named, fully migrated database on `TALLY_TEST_DATABASE_URL`
/// (default [`DEFAULT_DATABASE_URL`]). Dropping it drops the database (best effort,
/// `DROP DATABASE ... WITH (FORCE)`), even if daemons are still connected.
pub struct TestDb {
    name: String,
    url: String,
    admin_url: String,
    client: Client,
}

impl std::fmt::Debug for TestDb {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TestDb").field("name", &self.name).finish()
    }
}

impl TestDb {
    /// Creates the database as a copy of the migrated template ([`template`]), and opens a
    /// client on it.
    ///
    /// # Panics
    /// When PostgreSQL is unreachable (run `scripts/ensure-postgres.sh`) or a migration
    /// fails.
    pub async fn new() -> Self {
        init_logging();
        let admin_url = std::env::var("TALLY_TEST_DATABASE_URL").unwrap_or_else(|_| DEFAULT_DATABASE_URL.to_owned());
        let name = format!("tally_test_{}", uuid::Uuid::new_v4().simple());
        let url = with_database(&admin_url, &name);
        let template = template(&admin_url).await;
        let (admin, connection) = tokio_postgres::connect(&admin_url, NoTls).await.unwrap_or_else(|e| {
            panic!("cannot connect to {admin_url} (is PostgreSQL up? scripts/ensure-postgres.sh): {e}")
        });
        let driver = tokio::spawn(connection);
        admin
            .batch_execute(&format!("CREATE DATABASE \"{name}\" TEMPLATE \"{template}\""))
            .await
            .expect("CREATE DATABASE for the test, from the template");
        drop(admin);
        let _ = driver.await;
        let client = connect(&url).await.expect("connect to the test database");
        Self { name, url, admin_url, client }
    }

    /// The database URL, for `database.url`.
    #[must_use]
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The database name.
    #[must_use]
    pub fn name(&self) -> &str {
        &self.name
    }

    /// A pool of the daemon's kind on this database, for a stage under test: at most
    /// `max_size` connections named `application_name`, statements cut at
    /// `statement_timeout`, connections given 5 s.
    ///
    /// # Panics
    /// When the pool cannot be built (a test set-up error).
    #[must_use]
    pub fn pool(
        &self,
        max_size: usize,
        statement_timeout: std::time::Duration,
        application_name: &str,
    ) -> tally_actors::store::PgPool {
        tally_actors::store::build_pool(&tally_actors::store::PoolSettings {
            url: self.url.clone(),
            max_size,
            statement_timeout,
            connect_timeout: std::time::Duration::from_secs(5),
            application_name: application_name.to_owned(),
            outbox_notify_after_commit: false,
        })
        .expect("a pool on the test database")
    }

    /// The harness's own client (autocommit). Use [`TestDb::connect`] for a connection
    /// that holds a transaction open.
    #[must_use]
    pub fn client(&self) -> &Client {
        &self.client
    }

    /// Opens a new connection to the test database (its driver runs on the current
    /// tokio runtime).
    ///
    /// # Panics
    /// When the connection fails.
    pub async fn connect(&self) -> Client {
        connect(&self.url).await.expect("open a connection to the test database")
    }

    /// Runs `sql` and returns every row.
    ///
    /// # Panics
    /// When the query fails; the message holds the SQL.
    pub async fn query(&self, sql: &str, params: &[&(dyn ToSql + Sync)]) -> Vec<Row> {
        self.client.query(sql, params).await.unwrap_or_else(|e| panic!("query failed: {sql}: {e}"))
    }

    /// Runs `sql` (one statement with parameters) and returns the number of rows affected.
    ///
    /// # Panics
    /// When the statement fails.
    pub async fn execute(&self, sql: &str, params: &[&(dyn ToSql + Sync)]) -> u64 {
        self.client.execute(sql, params).await.unwrap_or_else(|e| panic!("statement failed: {sql}: {e}"))
    }

    /// Runs several statements without parameters (e.g. a `BEGIN; ...; COMMIT`).
    ///
    /// # Panics
    /// When a statement fails.
    pub async fn batch(&self, sql: &str) {
        self.client.batch_execute(sql).await.unwrap_or_else(|e| panic!("batch failed: {sql}: {e}"));
    }

    /// The first column of the single row of `sql`, as `i64` (cast in SQL: `count(*)` is
    /// already `bigint`).
    ///
    /// # Panics
    /// When the query fails or does not return exactly one row.
    pub async fn scalar_i64(&self, sql: &str, params: &[&(dyn ToSql + Sync)]) -> i64 {
        self.client
            .query_one(sql, params)
            .await
            .unwrap_or_else(|e| panic!("query failed: {sql}: {e}"))
            .try_get(0)
            .unwrap_or_else(|e| panic!("first column of {sql} is not a bigint: {e}"))
    }

    /// `SELECT count(*) FROM <table>`.
    ///
    /// # Panics
    /// When the query fails.
    pub async fn count(&self, table: &str) -> i64 {
        self.scalar_i64(&format!("SELECT count(*) FROM {table}"), &[]).await
    }

    /// Opens each account of `ids` in BRL, empty, owned by the anonymous caller (who
    /// debits it when the intake does not authenticate); one that exists is left as it is.
    ///
    /// # Panics
    /// When the insert fails.
    pub async fn open_accounts(&self, ids: &[&str]) {
        self.open_accounts_of("", ids).await;
    }

    /// Opens each account of `ids` in BRL, empty, owned by the API client `owner` (`""`:
    /// the anonymous caller); one that exists is left as it is.
    ///
    /// # Panics
    /// When the insert fails.
    pub async fn open_accounts_of(&self, owner: &str, ids: &[&str]) {
        self.execute(
            "INSERT INTO accounts (id, balance_cents, currency, owner) \
             SELECT id, 0, 'BRL', $2 FROM unnest($1::text[]) AS u(id) ON CONFLICT DO NOTHING",
            &[&ids, &owner],
        )
        .await;
    }

    /// Opens each account of `rows` in BRL, owned by the anonymous caller, with its balance
    /// issued (money enters only by issuance: one `issuance` transfer and its two postings
    /// per funded account, as an opening balance at the intake makes). The one way tests
    /// fund accounts: a change to how money enters changes this function only.
    ///
    /// # Panics
    /// When an account exists already or the insert fails.
    pub async fn fund_accounts(&self, rows: &[(&str, i64)]) {
        self.fund_accounts_in("", "BRL", rows).await;
    }

    /// [`TestDb::fund_accounts`] for accounts of `owner` (`""`: the anonymous caller) in
    /// `currency`.
    ///
    /// # Panics
    /// When an account exists already or the insert fails.
    pub async fn fund_accounts_in(&self, owner: &str, currency: &str, rows: &[(&str, i64)]) {
        use diesel_async::AsyncConnection;
        let mut conn = diesel_async::AsyncPgConnection::establish(&self.url)
            .await
            .expect("a diesel connection to the test database");
        let rows: Vec<(String, i64)> = rows.iter().map(|(id, cents)| ((*id).to_owned(), *cents)).collect();
        tally_actors::store::issuance::open_funded(&mut conn, owner, currency, &rows)
            .await
            .unwrap_or_else(|e| panic!("fund accounts {rows:?}: {e}"));
    }

    /// Postings of transfers between customer accounts: not those of money issued (an
    /// opening balance, inserted with the account, is issued with two postings).
    ///
    /// # Panics
    /// When the query fails.
    pub async fn transfer_postings(&self) -> i64 {
        self.scalar_i64(
            "SELECT count(*) FROM postings p \
             WHERE NOT EXISTS (SELECT 1 FROM transfers t WHERE t.id = p.transfer_id AND t.kind = 'issuance')",
            &[],
        )
        .await
    }

    /// `processed_transfers` rows the ledger finished for transfers (not issuances, which
    /// are finished as they are issued).
    ///
    /// # Panics
    /// When the query fails.
    pub async fn ledger_finished(&self) -> i64 {
        self.scalar_i64(
            "SELECT count(*) FROM processed_transfers p WHERE outcome <> 'PROCESSING' \
             AND NOT EXISTS (SELECT 1 FROM transfers t WHERE t.id = p.transfer_id AND t.kind = 'issuance')",
            &[],
        )
        .await
    }

    /// The money held by customer accounts: everything issued, if nothing was lost or made.
    ///
    /// # Panics
    /// When the query fails.
    pub async fn customer_money(&self) -> i64 {
        self.scalar_i64("SELECT coalesce(sum(balance_cents), 0)::bigint FROM accounts WHERE kind = 'customer'", &[])
            .await
    }

    /// Number of outbox rows with `published_at` still NULL.
    pub async fn pending_outbox(&self) -> i64 {
        self.scalar_i64("SELECT count(*) FROM outbox_events WHERE published_at IS NULL", &[]).await
    }

    /// Waits until at least `n` backends of this database wait on a lock (held by the test).
    ///
    /// # Panics
    /// When that does not happen within [`Deadline::DEFAULT`].
    pub async fn wait_lock_waiters(&self, n: i64, what: &str) {
        wait_until(what, Deadline::DEFAULT, || async {
            let waiting = self
                .scalar_i64(
                    "SELECT count(*) FROM pg_stat_activity \
                     WHERE wait_event_type = 'Lock' AND datname = current_database()",
                    &[],
                )
                .await;
            if waiting >= n {
                Ok(())
            } else {
                Err(format!("{waiting} backends wait on a lock"))
            }
        })
        .await;
    }

    /// Waits until every outbox row is published.
    ///
    /// # Panics
    /// When that does not happen within [`Deadline::DEFAULT`].
    pub async fn wait_outbox_published(&self) {
        wait_until("every outbox row is published", Deadline::DEFAULT, || async {
            match self.pending_outbox().await {
                0 => Ok(()),
                pending => Err(format!("{pending} pending")),
            }
        })
        .await;
    }
}

impl Drop for TestDb {
    fn drop(&mut self) {
        // A failing test drops its database while unwinding: say what its daemons and
        // brokers logged last.
        crate::logs::print_tails_on_failure();
        let admin_url = self.admin_url.clone();
        let name = self.name.clone();
        // Drop may run inside a tokio runtime: do the async work on a thread of its own.
        let dropped = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().ok()?;
            runtime.block_on(async move {
                let (admin, connection) = tokio_postgres::connect(&admin_url, NoTls).await.ok()?;
                let driver = tokio::spawn(connection);
                let result = admin.batch_execute(&format!("DROP DATABASE IF EXISTS \"{name}\" WITH (FORCE)")).await;
                drop(admin);
                let _ = driver.await;
                result.ok()
            })
        })
        .join();
        if !matches!(dropped, Ok(Some(()))) {
            eprintln!("warning: could not drop test database {}", self.name);
        }
    }
}

async fn connect(url: &str) -> Result<Client, tokio_postgres::Error> {
    let (client, connection) = tokio_postgres::connect(url, NoTls).await?;
    tokio::spawn(async move {
        // Ends when the client is dropped or the database is dropped under it.
        let _ = connection.await;
    });
    Ok(client)
}

/// `url` with its database name replaced by `name` (query string kept).
fn with_database(url: &str, name: &str) -> String {
    let (base, query) = match url.split_once('?') {
        Some((b, q)) => (b, Some(q)),
        None => (url, None),
    };
    let scheme_end = base.find("://").map_or(0, |i| i + 3);
    let prefix = match base[scheme_end..].find('/') {
        Some(i) => &base[..scheme_end + i],
        None => base,
    };
    match query {
        Some(q) => format!("{prefix}/{name}?{q}"),
        None => format!("{prefix}/{name}"),
    }
}

impl TestDb {
    /// Starts an outage of this database: it refuses new connections and every open one
    /// (the daemon's pooled connections and this handle's own client) is terminated.
    ///
    /// # Panics
    /// When the server cannot be reached.
    pub async fn refuse_connections(&self) {
        self.admin(&format!(
            "ALTER DATABASE \"{0}\" ALLOW_CONNECTIONS false; \
             SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
             WHERE datname = '{0}' AND pid <> pg_backend_pid();",
            self.name
        ))
        .await;
    }

    /// Starts or ends an outage for tally's processes only: the database refuses new
    /// connections and tally's open ones (application names `tally*`) are terminated,
    /// while this handle's own connection lives on.
    ///
    /// # Panics
    /// When the server cannot be reached.
    pub async fn refuse_tally(&self, refuse: bool) {
        let allow = if refuse { "false" } else { "true" };
        let mut sql = format!("ALTER DATABASE \"{}\" ALLOW_CONNECTIONS {allow};", self.name);
        if refuse {
            sql.push_str(&format!(
                " SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
                 WHERE datname = '{}' AND application_name LIKE 'tally%';",
                self.name
            ));
        }
        self.admin(&sql).await;
    }

    /// Ends the outage of [`TestDb::refuse_connections`] and reconnects this handle.
    ///
    /// # Panics
    /// When the server cannot be reached.
    pub async fn allow_connections(&mut self) {
        self.admin(&format!("ALTER DATABASE \"{}\" ALLOW_CONNECTIONS true", self.name)).await;
        self.client = connect(&self.url).await.expect("reconnect to the test database");
    }

    async fn admin(&self, sql: &str) {
        let (admin, connection) = tokio_postgres::connect(&self.admin_url, NoTls).await.expect("connect as admin");
        let driver = tokio::spawn(connection);
        admin.batch_execute(sql).await.expect("admin statement");
        drop(admin);
        let _ = driver.await;
    }
}

/// A TCP forwarder to PostgreSQL for one daemon, so that a test can cut that daemon off
/// its database while others keep theirs.
pub struct DbProxy {
    /// The test database's URL through the proxy.
    pub url: String,
    up: Arc<std::sync::atomic::AtomicBool>,
    cut: tokio::sync::watch::Sender<u64>,
    task: tokio::task::JoinHandle<()>,
}

impl std::fmt::Debug for DbProxy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DbProxy").field("url", &self.url).finish()
    }
}

impl DbProxy {
    /// Forwards a loopback port to the server of `db` (127.0.0.1:5432 unless its URL says
    /// otherwise).
    ///
    /// # Panics
    /// When no port can be bound or the URL has no `host:port`.
    pub async fn start(db: &TestDb) -> Self {
        use std::sync::atomic::Ordering;
        let rest = db.url().split_once('@').map(|(_, r)| r).expect("user@host in the URL");
        let target = rest.split_once('/').map(|(h, _)| h).expect("host/db in the URL").to_owned();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind the proxy");
        let port = listener.local_addr().expect("proxy address").port();
        let url = db.url().replacen(&target, &format!("127.0.0.1:{port}"), 1);
        let up = Arc::new(std::sync::atomic::AtomicBool::new(true));
        let (cut, cuts) = tokio::sync::watch::channel(0_u64);
        let accepting = Arc::clone(&up);
        let task = tokio::spawn(async move {
            while let Ok((mut inbound, _)) = listener.accept().await {
                if !accepting.load(Ordering::Acquire) {
                    continue; // dropped: the connection is refused
                }
                let target = target.clone();
                let mut cuts = cuts.clone();
                // Only a cut after this connection was accepted ends it.
                cuts.borrow_and_update();
                tokio::spawn(async move {
                    let Ok(mut outbound) = tokio::net::TcpStream::connect(&target).await else { return };
                    tokio::select! {
                        _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound) => {}
                        _ = cuts.changed() => {}
                    }
                });
            }
        });
        Self { url, up, cut, task }
    }

    /// Cuts every forwarded connection and refuses new ones.
    pub fn cut(&self) {
        self.up.store(false, std::sync::atomic::Ordering::Release);
        self.cut.send_modify(|n| *n += 1);
    }

    /// Forwards new connections again.
    pub fn restore(&self) {
        self.up.store(true, std::sync::atomic::Ordering::Release);
    }
}

impl Drop for DbProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The database every test database is copied from, created and migrated once: a copy
/// costs one `CREATE DATABASE ... TEMPLATE`, not every migration. Its name carries a hash
/// of the migration files, so a changed migration makes a new template; several test
/// processes agree on it under an advisory lock. Nothing ever connects to it after it is
/// built (PostgreSQL refuses to copy a database with sessions).
///
/// # Panics
/// When PostgreSQL is unreachable or a migration fails.
pub async fn template(admin_url: &str) -> String {
    static TEMPLATE: tokio::sync::OnceCell<String> = tokio::sync::OnceCell::const_new();
    TEMPLATE
        .get_or_init(|| async {
            let name = format!("tally_template_{:016x}", migrations_hash());
            let (admin, connection) = tokio_postgres::connect(admin_url, NoTls).await.unwrap_or_else(|e| {
                panic!("cannot connect to {admin_url} (is PostgreSQL up? scripts/ensure-postgres.sh): {e}")
            });
            // The connection task lives on this test's runtime only while it builds the
            // template; it ends when `admin` is dropped below.
            let driver = tokio::spawn(connection);
            admin.batch_execute("SELECT pg_advisory_lock(7461616)").await.expect("take the template lock");
            let exists = !admin
                .query("SELECT 1 FROM pg_database WHERE datname = $1", &[&name])
                .await
                .expect("look for the template")
                .is_empty();
            if !exists {
                // Built under another name and renamed when complete, so a run killed
                // half-way never leaves a half-migrated template behind.
                let building = format!("{name}_building");
                // Two statements: neither may run inside the implicit transaction of a batch.
                admin
                    .batch_execute(&format!("DROP DATABASE IF EXISTS \"{building}\" WITH (FORCE)"))
                    .await
                    .expect("drop a half-built template");
                admin.batch_execute(&format!("CREATE DATABASE \"{building}\"")).await.expect("create the template");
                let url = with_database(admin_url, &building);
                tokio::task::spawn_blocking(move || tally_actors::store::migrate::prepare_blocking(&url))
                    .await
                    .expect("migration task")
                    .expect("migrations apply to the template");
                admin
                    .batch_execute(&format!("ALTER DATABASE \"{building}\" RENAME TO \"{name}\""))
                    .await
                    .expect("name the template");
                // Templates of other migration sets are left over from earlier checkouts:
                // drop all but the three newest (by oid), which another checkout on this
                // machine may be testing with right now (dropped under it, its next test
                // database could not be copied).
                let others = admin
                    .query(
                        "SELECT datname FROM pg_database WHERE datname LIKE 'tally\\_template\\_%' AND datname <> $1 \
                         ORDER BY oid DESC OFFSET 3",
                        &[&name],
                    )
                    .await
                    .map(|rows| rows.iter().map(|r| r.get::<_, String>(0)).collect::<Vec<_>>())
                    .unwrap_or_default();
                for other in others {
                    let _ = admin.batch_execute(&format!("DROP DATABASE IF EXISTS \"{other}\"")).await;
                }
            }
            admin.batch_execute("SELECT pg_advisory_unlock(7461616)").await.expect("release the template lock");
            drop(admin);
            let _ = driver.await;
            name
        })
        .await
        .clone()
}

/// A hash of the migrations this build embeds (their versions) and of every file under
/// `migrations/` (names and contents). The versions keep apart a test binary built before
/// a migration was added, running while the files have it: the template it builds lacks
/// the new migration, and must not be taken for the one the newer build expects.
fn migrations_hash() -> u64 {
    use std::hash::{Hash, Hasher};
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    tally_actors::store::migrate::embedded_versions().expect("the embedded migrations").hash(&mut hasher);
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../migrations");
    let mut files = Vec::new();
    let mut pending = vec![dir.clone()];
    while let Some(d) = pending.pop() {
        for entry in std::fs::read_dir(&d).expect("read migrations/").flatten() {
            let path = entry.path();
            if path.is_dir() {
                pending.push(path);
            } else {
                files.push(path);
            }
        }
    }
    files.sort();
    for f in files {
        f.strip_prefix(&dir).unwrap_or(&f).hash(&mut hasher);
        std::fs::read(&f).expect("read a migration file").hash(&mut hasher);
    }
    hasher.finish()
}
