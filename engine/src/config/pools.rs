//! `[database.pools]`: a connection pool per stage, so that a stage holding every
//! connection it may have (a backlog, a lock wait, a slow broker) leaves the other stages
//! theirs. Sizes are maxima: connections open on demand, so a stage that does not run opens
//! none. The defaults add up to 30 connections (32 with the outbox's LISTEN and NOTIFY
//! connections): three daemons fit PostgreSQL's default `max_connections` of 100.

use super::*;
use crate::stages::STAGES;

/// A database pool: one for each part of the daemon's frame ([`DbPool::HTTP`],
/// [`DbPool::INTAKE`], [`DbPool::OUTBOX`]) and one for each stage of
/// [`crate::stages::STAGES`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct DbPool(&'static str);

impl DbPool {
    /// Intake and admin requests, but for the writes of `POST /transfers`.
    pub const HTTP: Self = Self("http");
    /// The intake's group commit: `POST /transfers` writes.
    pub const INTAKE: Self = Self("intake");
    /// The outbox publisher.
    pub const OUTBOX: Self = Self("outbox");

    /// The pool called `name` (a stage's: [`crate::stages::Stage::db_pool`]).
    #[must_use]
    pub const fn named(name: &'static str) -> Self {
        Self(name)
    }

    /// Every pool: the frame's, then the stages' in their start order.
    #[must_use]
    pub fn all() -> Vec<Self> {
        FRAME.iter().map(|(pool, _)| *pool).chain(STAGES.iter().map(|s| s.db_pool())).collect()
    }

    /// Its key in `[database.pools]`, its `pool` label in the `tally_db_pool_*` metrics, and
    /// (as `tally-<name>`) the `application_name` of its connections.
    #[must_use]
    pub fn name(self) -> &'static str {
        self.0
    }

    /// How it is sized and checked.
    fn rule(self) -> Option<&'static PoolRule> {
        FRAME
            .iter()
            .find(|(pool, _)| *pool == self)
            .map(|(_, rule)| rule)
            .or_else(|| STAGES.iter().find(|s| s.name == self.0).map(|s| &s.pool))
    }
}

/// How a pool is sized: its default and its checks beyond the range 1..=1000.
pub struct PoolRule {
    /// What it serves, one line: `database.pools.<name>` in `tally config --example`.
    pub summary: &'static str,
    /// Its size when `[database.pools]` does not set it.
    pub default: fn(&Config) -> usize,
    /// Checks a size (set or default) against the concurrency it must serve.
    pub check: fn(&Config, usize) -> Result<(), ConfigError>,
}

impl PoolRule {
    /// No check beyond the range.
    ///
    /// # Errors
    /// Never.
    pub fn any(_: &Config, _: usize) -> Result<(), ConfigError> {
        Ok(())
    }

    /// `Ok` when `holds`, else the problem `problem()` with `key`.
    ///
    /// # Errors
    /// When `holds` is false.
    pub fn check(holds: bool, key: &'static str, problem: impl FnOnce() -> String) -> Result<(), ConfigError> {
        if holds {
            Ok(())
        } else {
            invalid(key, problem())
        }
    }
}

/// The pools of the daemon's frame, which runs on every instance.
static FRAME: [(DbPool, PoolRule); 3] = [
    (
        DbPool::HTTP,
        PoolRule {
            summary: "Intake and admin requests (all but the writes of POST /transfers).",
            default: |c| c.database.pool_size.unwrap_or(8),
            check: PoolRule::any,
        },
    ),
    (
        DbPool::INTAKE,
        PoolRule {
            summary: "The intake's group commit, a connection per writer (at least http.intake_writers).",
            default: |c| c.http.intake_writers,
            check: |c, size| {
                let writers = c.http.intake_writers;
                PoolRule::check(size >= writers, "database.pools.intake", || {
                    format!("is {size}: it must be at least http.intake_writers ({writers}), a connection per writer")
                })
            },
        },
    ),
    (
        DbPool::OUTBOX,
        PoolRule {
            summary: "The outbox publisher: outbox.concurrency loops plus the cleanup.",
            default: |c| c.outbox.concurrency + 1,
            check: |c, size| {
                let loops = c.outbox.concurrency;
                PoolRule::check(size > loops, "database.pools.outbox", || {
                    format!(
                        "is {size}: it must be above outbox.concurrency ({loops}), as each publish loop holds a \
                         connection while it awaits the broker and the cleanup takes one more"
                    )
                })
            },
        },
    ),
];

/// What `database.pools.<name>` serves, for `tally config --example`.
#[must_use]
pub(super) fn summary(name: &str) -> Option<&'static str> {
    DbPool::all().into_iter().find(|p| p.name() == name).and_then(DbPool::rule).map(|r| r.summary)
}

/// Connections per pool at most, each between 1 and 1000, by pool name. Unset: the pool's
/// default ([`PoolRule::default`]; the HTTP pool's is 8, or the older
/// `database.pool_size` when set).
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(transparent)]
pub struct PoolsConfig(BTreeMap<String, usize>);

impl PoolsConfig {
    /// The size set for `pool`, if any.
    #[must_use]
    pub fn get(&self, pool: DbPool) -> Option<usize> {
        self.0.get(pool.name()).copied()
    }

    /// Sets the size of `pool`.
    pub fn set(&mut self, pool: DbPool, size: usize) {
        self.0.insert(pool.name().to_owned(), size);
    }
}

impl Serialize for PoolsConfig {
    /// In [`DbPool::all`] order, as `tally config` shows them.
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let mut map = serializer.serialize_map(None)?;
        for pool in DbPool::all() {
            if let Some(size) = self.get(pool) {
                map.serialize_entry(pool.name(), &size)?;
            }
        }
        map.end()
    }
}

impl Config {
    /// The size of `pool`: its `database.pools` key, else its default ([`PoolRule`]).
    #[must_use]
    pub fn pool_size(&self, pool: DbPool) -> usize {
        self.database.pools.get(pool).or_else(|| pool.rule().map(|r| (r.default)(self))).unwrap_or(1)
    }

    /// This configuration with every pool size spelled out, and `database.pool_size` moved
    /// to `database.pools.http`: what `tally config` shows.
    pub(super) fn with_pools_resolved(&self) -> Config {
        let mut resolved = self.clone();
        for pool in DbPool::all() {
            resolved.database.pools.set(pool, self.pool_size(pool));
        }
        resolved.database.pool_size = None;
        resolved
    }
}

/// Names, ranges, the older `database.pool_size`, and the sizes the parts' concurrency
/// needs.
pub(super) fn validate(config: &Config) -> Result<(), ConfigError> {
    let db = &config.database;
    if let Some(size) = db.pool_size {
        if db.pools.get(DbPool::HTTP).is_some() {
            return invalid("database.pool_size", "is the older name of database.pools.http: set only one of them");
        }
        if !(1..=1000).contains(&size) {
            return invalid("database.pool_size", "must be between 1 and 1000");
        }
    }
    let all = DbPool::all();
    if let Some(unknown) = db.pools.0.keys().find(|k| !all.iter().any(|p| p.name() == k.as_str())) {
        let known: Vec<_> = all.iter().map(|p| p.name()).collect();
        return invalid("database.pools", format!("names {unknown}, which is not a pool ({})", known.join(", ")));
    }
    for pool in all {
        let size = config.pool_size(pool);
        if db.pools.get(pool).is_some() && !(1..=1000).contains(&size) {
            return Err(ConfigError::Conflict(format!("`database.pools.{}` must be between 1 and 1000", pool.name())));
        }
        if let Some(rule) = pool.rule() {
            (rule.check)(config, size)?;
        }
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
        DbPool::all().into_iter().map(|p| (p.name(), c.pool_size(p))).collect()
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
                ("antifraud", 2),
                ("ledger", 6),
                ("projection", 4),
                ("orders", 2),
                ("notifications", 3)
            ]
        );
        let per_daemon: usize = sizes(&c).iter().map(|(_, n)| n).sum::<usize>() + 2; // + LISTEN, NOTIFY
        assert!(3 * per_daemon <= 97, "PostgreSQL keeps 3 of its 100 for superusers: {per_daemon} per daemon");
    }

    #[test]
    fn the_outbox_and_ledger_pools_follow_their_concurrency_unless_set() {
        let c = with("[outbox]\nconcurrency = 6\n[ledger]\nmax_concurrent_batches = 10").unwrap();
        assert_eq!((c.pool_size(DbPool::OUTBOX), c.pool_size(DbPool::named("ledger"))), (7, 12));
        let c = with("[database.pools]\noutbox = 5\nledger = 4\nprojection = 9").unwrap();
        assert_eq!((c.pool_size(DbPool::OUTBOX), c.pool_size(DbPool::named("ledger"))), (5, 4));
        assert_eq!(c.pool_size(DbPool::named("projection")), 9);
        assert_eq!(c.pool_size(DbPool::HTTP), 8, "the others keep their defaults");
    }

    #[test]
    fn the_older_pool_size_is_the_http_pool() {
        let c = with("[database]\npool_size = 16\n[outbox]\nconcurrency = 8\n[ledger]\nmax_concurrent_batches = 16")
            .unwrap();
        assert_eq!(c.pool_size(DbPool::HTTP), 16);
        assert_eq!(
            (c.pool_size(DbPool::OUTBOX), c.pool_size(DbPool::named("ledger"))),
            (9, 18),
            "stages size their own"
        );
        let e = with("[database]\npool_size = 16\n[database.pools]\nhttp = 8").unwrap_err().to_string();
        assert!(e.contains("database.pool_size") && e.contains("database.pools.http"), "{e}");
        let e = with("[database]\npool_size = 1001").unwrap_err().to_string();
        assert!(e.contains("database.pool_size"), "{e}");
    }

    #[test]
    fn sizes_are_validated_with_the_key_named() {
        for pool in DbPool::all() {
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
            shown.contains("[database.pools]\nhttp = 5\nintake = 2\noutbox = 3\nantifraud = 2\nledger = 7\n"),
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
            assert_eq!((c.pool_size(DbPool::named("ledger")), c.pool_size(DbPool::named("orders"))), (5, 3));
            assert_eq!(c.pool_size(DbPool::HTTP), 6);
            Ok(())
        });
    }
}
