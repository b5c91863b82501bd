//! `[database.pools]`: a connection pool per stage, so that a stage holding every
//! connection it may have (a backlog, a lock wait, a slow broker) leaves the other stages
//! theirs. Sizes are maxima: connections open on demand, so a stage that does not run opens
//! none. The defaults add up to 30 connections (31 with the outbox's LISTEN connection):
//! three daemons fit PostgreSQL's default `max_connections` of 100.

use super::*;

/// A stage with a database pool of its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DbPool {
    /// Intake and admin requests, but for the writes of `POST /transfers`.
    Http,
    /// The intake's group commit: `POST /transfers` writes.
    Intake,
    Outbox,
    Ledger,
    Antifraud,
    Projection,
    Orders,
    Notifications,
}

impl DbPool {
    pub const ALL: [Self; 8] = [
        Self::Http,
        Self::Intake,
        Self::Outbox,
        Self::Ledger,
        Self::Antifraud,
        Self::Projection,
        Self::Orders,
        Self::Notifications,
    ];

    /// Its key in `[database.pools]`, its `pool` label in the `tally_db_pool_*` metrics, and
    /// (as `tally-<name>`) the `application_name` of its connections.
    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            Self::Http => "http",
            Self::Intake => "intake",
            Self::Outbox => "outbox",
            Self::Ledger => "ledger",
            Self::Antifraud => "antifraud",
            Self::Projection => "projection",
            Self::Orders => "orders",
            Self::Notifications => "notifications",
        }
    }

    fn key(self) -> &'static str {
        match self {
            Self::Http => "database.pools.http",
            Self::Intake => "database.pools.intake",
            Self::Outbox => "database.pools.outbox",
            Self::Ledger => "database.pools.ledger",
            Self::Antifraud => "database.pools.antifraud",
            Self::Projection => "database.pools.projection",
            Self::Orders => "database.pools.orders",
            Self::Notifications => "database.pools.notifications",
        }
    }
}

/// Connections per pool at most, each between 1 and 1000. Unset: the default named with it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PoolsConfig {
    /// Intake and admin requests (all but the writes of `POST /transfers`), a connection
    /// each while it runs. Default 8, or `database.pool_size` when that older key is set.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub http: Option<usize>,
    /// The intake's group commit, a connection per writer. Default `http.intake_writers`;
    /// must be at least that.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub intake: Option<usize>,
    /// The outbox publisher: each loop holds a connection while it awaits the broker's
    /// acknowledgements, and the cleanup takes one more. Default `outbox.concurrency` + 1;
    /// must be above `outbox.concurrency`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub outbox: Option<usize>,
    /// Settlement transactions, the ledger's dead letters and its periodic check. Default
    /// `ledger.max_concurrent_batches` + 2; must be at least `ledger.max_concurrent_batches`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ledger: Option<usize>,
    /// Antifraud's decisions and dead-letter fallback: one loop, one batch at a time.
    /// Default 2.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub antifraud: Option<usize>,
    /// The status projection: its group commit's writers and its dead letters. Default 4;
    /// must be above `projection.writers`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub projection: Option<usize>,
    /// The order materializer: an insert per order. Default 2.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub orders: Option<usize>,
    /// Notifications: one writer for the delivery lookups, one for the delivery records
    /// (none held through the webhook call), and the dead letters. Default 3.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub notifications: Option<usize>,
}

impl PoolsConfig {
    /// The size set for `pool`, if any.
    #[must_use]
    pub fn get(&self, pool: DbPool) -> Option<usize> {
        *self.slot(pool)
    }

    fn slot(&self, pool: DbPool) -> &Option<usize> {
        match pool {
            DbPool::Http => &self.http,
            DbPool::Intake => &self.intake,
            DbPool::Outbox => &self.outbox,
            DbPool::Ledger => &self.ledger,
            DbPool::Antifraud => &self.antifraud,
            DbPool::Projection => &self.projection,
            DbPool::Orders => &self.orders,
            DbPool::Notifications => &self.notifications,
        }
    }

    fn slot_mut(&mut self, pool: DbPool) -> &mut Option<usize> {
        match pool {
            DbPool::Http => &mut self.http,
            DbPool::Intake => &mut self.intake,
            DbPool::Outbox => &mut self.outbox,
            DbPool::Ledger => &mut self.ledger,
            DbPool::Antifraud => &mut self.antifraud,
            DbPool::Projection => &mut self.projection,
            DbPool::Orders => &mut self.orders,
            DbPool::Notifications => &mut self.notifications,
        }
    }
}

impl Config {
    /// The size of `pool`: its `database.pools` key, else its default ([`PoolsConfig`]).
    #[must_use]
    pub fn pool_size(&self, pool: DbPool) -> usize {
        self.database.pools.get(pool).unwrap_or_else(|| match pool {
            DbPool::Http => self.database.pool_size.unwrap_or(8),
            DbPool::Intake => self.http.intake_writers,
            DbPool::Outbox => self.outbox.concurrency + 1,
            DbPool::Ledger => self.ledger.max_concurrent_batches + 2,
            DbPool::Projection => 4,
            DbPool::Notifications => 3,
            DbPool::Antifraud | DbPool::Orders => 2,
        })
    }

    /// This configuration with every pool size spelled out, and `database.pool_size` moved
    /// to `database.pools.http`: what `tally config` shows.
    pub(super) fn with_pools_resolved(&self) -> Config {
        let mut resolved = self.clone();
        for pool in DbPool::ALL {
            *resolved.database.pools.slot_mut(pool) = Some(self.pool_size(pool));
        }
        resolved.database.pool_size = None;
        resolved
    }
}

/// Ranges, the older `database.pool_size`, and the sizes the stages' concurrency needs.
pub(super) fn validate(config: &Config) -> Result<(), ConfigError> {
    let db = &config.database;
    if let Some(size) = db.pool_size {
        if db.pools.http.is_some() {
            return invalid("database.pool_size", "is the older name of database.pools.http: set only one of them");
        }
        if !(1..=1000).contains(&size) {
            return invalid("database.pool_size", "must be between 1 and 1000");
        }
    }
    if let Some(pool) = DbPool::ALL.into_iter().find(|p| db.pools.get(*p).is_some_and(|n| !(1..=1000).contains(&n))) {
        return invalid(pool.key(), "must be between 1 and 1000");
    }
    let (outbox, loops) = (config.pool_size(DbPool::Outbox), config.outbox.concurrency);
    if outbox <= loops {
        return invalid(
            "database.pools.outbox",
            format!(
                "is {outbox}: it must be above outbox.concurrency ({loops}), as each publish loop holds a \
                 connection while it awaits the broker and the cleanup takes one more"
            ),
        );
    }
    let (intake, writers) = (config.pool_size(DbPool::Intake), config.http.intake_writers);
    if intake < writers {
        return invalid(
            "database.pools.intake",
            format!("is {intake}: it must be at least http.intake_writers ({writers}), a connection per writer"),
        );
    }
    let (projection, writers) = (config.pool_size(DbPool::Projection), config.projection.writers);
    if projection <= writers {
        return invalid(
            "database.pools.projection",
            format!(
                "is {projection}: it must be above projection.writers ({writers}), a connection per writer and \
                 one for dead letters"
            ),
        );
    }
    if config.pool_size(DbPool::Notifications) < 2 {
        return invalid(
            "database.pools.notifications",
            "must be at least 2: one connection for the delivery lookups, one for the delivery records",
        );
    }
    let (ledger, batches) = (config.pool_size(DbPool::Ledger), config.ledger.max_concurrent_batches);
    if ledger < batches {
        return invalid(
            "database.pools.ledger",
            format!(
                "is {ledger}: it must be at least ledger.max_concurrent_batches ({batches}), a connection per \
                 settlement transaction"
            ),
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with(toml: &str) -> Result<Config, ConfigError> {
        let figment = Figment::from(Serialized::defaults(Config::default())).merge(Toml::string(toml));
        Config::from_figment(&figment)
    }

    fn sizes(c: &Config) -> Vec<(&'static str, usize)> {
        DbPool::ALL.into_iter().map(|p| (p.name(), c.pool_size(p))).collect()
    }

    #[test]
    fn every_stage_has_a_pool_and_the_defaults_leave_room_for_three_daemons() {
        let c = with("").unwrap();
        assert_eq!(
            sizes(&c),
            [
                ("http", 8),
                ("intake", 2),
                ("outbox", 3),
                ("ledger", 6),
                ("antifraud", 2),
                ("projection", 4),
                ("orders", 2),
                ("notifications", 3)
            ]
        );
        let per_daemon: usize = sizes(&c).iter().map(|(_, n)| n).sum::<usize>() + 1; // + LISTEN
        assert!(3 * per_daemon <= 97, "PostgreSQL keeps 3 of its 100 for superusers: {per_daemon} per daemon");
    }

    #[test]
    fn the_outbox_and_ledger_pools_follow_their_concurrency_unless_set() {
        let c = with("[outbox]\nconcurrency = 6\n[ledger]\nmax_concurrent_batches = 10").unwrap();
        assert_eq!((c.pool_size(DbPool::Outbox), c.pool_size(DbPool::Ledger)), (7, 12));
        let c = with("[database.pools]\noutbox = 5\nledger = 4\nprojection = 9").unwrap();
        assert_eq!((c.pool_size(DbPool::Outbox), c.pool_size(DbPool::Ledger)), (5, 4));
        assert_eq!(c.pool_size(DbPool::Projection), 9);
        assert_eq!(c.pool_size(DbPool::Http), 8, "the others keep their defaults");
    }

    #[test]
    fn the_older_pool_size_is_the_http_pool() {
        let c = with("[database]\npool_size = 16\n[outbox]\nconcurrency = 8\n[ledger]\nmax_concurrent_batches = 16")
            .unwrap();
        assert_eq!(c.pool_size(DbPool::Http), 16);
        assert_eq!((c.pool_size(DbPool::Outbox), c.pool_size(DbPool::Ledger)), (9, 18), "stages size their own");
        let e = with("[database]\npool_size = 16\n[database.pools]\nhttp = 8").unwrap_err().to_string();
        assert!(e.contains("database.pool_size") && e.contains("database.pools.http"), "{e}");
        let e = with("[database]\npool_size = 1001").unwrap_err().to_string();
        assert!(e.contains("database.pool_size"), "{e}");
    }

    #[test]
    fn sizes_are_validated_with_the_key_named() {
        for pool in DbPool::ALL {
            for bad in [0, 1001] {
                let e = with(&format!("[database.pools]\n{} = {bad}", pool.name())).unwrap_err().to_string();
                assert!(e.contains(&format!("database.pools.{}", pool.name())), "{e}");
            }
        }
        let e = with("[database.pools]\noutbox = 2").unwrap_err().to_string();
        assert!(e.contains("database.pools.outbox") && e.contains("outbox.concurrency (2)"), "{e}");
        with("[database.pools]\noutbox = 2\n[outbox]\nconcurrency = 1").unwrap();
        let e = with("[database.pools]\nledger = 3").unwrap_err().to_string();
        assert!(e.contains("database.pools.ledger") && e.contains("ledger.max_concurrent_batches (4)"), "{e}");
        with("[database.pools]\nledger = 4").unwrap();
        let e = with("[database.pools]\nreporting = 3").unwrap_err().to_string();
        assert!(e.contains("reporting"), "{e}");
        let e = with("[ledger]\nmax_concurrent_batches = 1001").unwrap_err().to_string();
        assert!(e.contains("ledger.max_concurrent_batches"), "{e}");
    }

    #[test]
    fn tally_config_shows_every_size() {
        let c = with("[database]\npool_size = 5\n[database.pools]\nledger = 7").unwrap();
        let shown = c.to_redacted_toml();
        assert!(
            shown.contains("[database.pools]\nhttp = 5\nintake = 2\noutbox = 3\nledger = 7\nantifraud = 2\n"),
            "{shown}"
        );
        assert!(!shown.contains("pool_size"), "{shown}");
        let again = with(&shown.replace("<redacted>", "x")).unwrap();
        assert_eq!(sizes(&again), sizes(&c), "what it shows loads back to the same pools");
    }

    #[test]
    #[allow(clippy::result_large_err)] // figment::Jail's closure type, not ours
    fn environment_variables_set_pools() {
        figment::Jail::expect_with(|jail| {
            jail.create_file("tally.toml", "[database]\npool_size = 6\n[database.pools]\nledger = 9")?;
            jail.set_env("TALLY__DATABASE__POOLS__LEDGER", "5");
            jail.set_env("TALLY__DATABASE__POOLS__ORDERS", "3");
            let c = Config::load(Some(Path::new("tally.toml"))).map_err(|e| e.to_string())?;
            assert_eq!((c.pool_size(DbPool::Ledger), c.pool_size(DbPool::Orders)), (5, 3));
            assert_eq!(c.pool_size(DbPool::Http), 6);
            Ok(())
        });
    }
}
