//! The database pools of one daemon: one per stage ([`DbPool`]), sized by
//! `[database.pools]`, their connections named `tally-<pool>` in `pg_stat_activity`. Every
//! pool is lazy: a stage that does not run opens no connection.

use std::collections::HashMap;

use anyhow::Context;
use tally_actors::store::{build_pool, PgPool, PoolSettings};
use tracing::{info, warn};

use crate::config::{Config, DbPool};

/// A pool per stage. Each stage takes connections from its own only.
#[derive(Clone)]
pub struct Pools {
    by_stage: HashMap<DbPool, PgPool>,
}

impl Pools {
    /// Builds every pool; none opens a connection yet.
    ///
    /// # Errors
    /// When a pool cannot be built.
    pub fn build(config: &Config) -> anyhow::Result<Self> {
        let by_stage = DbPool::all()
            .into_iter()
            .map(|pool| {
                let built = build_pool(&settings(config, pool))
                    .with_context(|| format!("cannot build the {} database pool", pool.name()))?;
                Ok((pool, built))
            })
            .collect::<anyhow::Result<_>>()?;
        Ok(Self { by_stage })
    }

    /// The pool of `pool`'s stage.
    #[must_use]
    pub fn get(&self, pool: DbPool) -> &PgPool {
        // Built for every pool of `DbPool::all()`.
        &self.by_stage[&pool]
    }

    /// `pools` by name, for the `tally_db_pool_*` gauges.
    #[must_use]
    pub fn named(&self, pools: &[DbPool]) -> Vec<(&'static str, PgPool)> {
        pools.iter().map(|p| (p.name(), self.get(*p).clone())).collect()
    }
}

/// How the pool of `pool` is built: its size, the database's timeouts, and
/// `application_name` `tally-<pool>`.
fn settings(config: &Config, pool: DbPool) -> PoolSettings {
    PoolSettings {
        url: config.database.connect_url(),
        max_size: config.pool_size(pool),
        statement_timeout: config.database.statement_timeout,
        connect_timeout: config.database.connect_timeout,
        application_name: format!("tally-{}", pool.name()),
        outbox_notify_after_commit: crate::stages::rings_after_commit(pool),
    }
}

/// The pools of the stages `config` runs, HTTP first: a stage that does not run opens no
/// connection and shows no gauges.
#[must_use]
pub fn in_use(config: &Config) -> Vec<DbPool> {
    let frame = [DbPool::HTTP, DbPool::INTAKE]
        .into_iter()
        .chain(config.pipelines.runs(crate::config::OUTBOX).then_some(DbPool::OUTBOX));
    let stages = crate::stages::STAGES.iter().filter(|s| s.runs(config) && (s.uses_pool)(config)).map(|s| s.db_pool());
    frame.chain(stages).collect()
}

/// Logs the size of every pool in `pools` and their sum: the most connections this daemon
/// opens, besides the outbox's LISTEN connection.
pub fn log(config: &Config, pools: &[DbPool]) {
    let sizes: Vec<String> = pools.iter().map(|p| format!("{}={}", p.name(), config.pool_size(*p))).collect();
    let total: usize = pools.iter().map(|p| config.pool_size(*p)).sum();
    info!(pools = %sizes.join(" "), total, "Database pools (connections at most).");
    if config.database.pool_size.is_some() {
        warn!("database.pool_size is the older name of database.pools.http: it sizes the HTTP pool only.");
    }
}
