//! The registry of pipeline stages: one entry per stage drives its `[pipelines]` switch,
//! its database pool (`[database.pools]`, `application_name` `tally-<name>`), its
//! configuration checks, its consumer group, its topics and its start. The daemon's frame
//! (the HTTP listeners, the intake's group commit and the outbox publisher) is not a stage:
//! it runs on every instance and starts around the stages (`app::start`).
//!
//! Adding a stage is its own folder in `tally-actors`, its configuration section in
//! `config/<stage>.rs`, its entry here, and its lines in the configuration docs:
//! `docs/ARCHITECTURE.md` ("Adding a stage") walks through `orders` as the example.

use tally_actors::antifraud::Antifraud;
use tally_actors::consume::{Pipeline, PipelineControl};

use crate::config::{Config, ConfigError, DbPool, PoolRule};

mod antifraud;
mod ledger;
mod notifications;
mod orders;
mod projection;
mod wiring;

pub use wiring::Wiring;

/// One pipeline stage, as the daemon runs and configures it.
pub struct Stage {
    /// Its `[pipelines]` switch, its `[database.pools]` key, its `pipeline` label in the
    /// metrics, and (as `tally-<name>`) the `application_name` of its connections.
    pub name: &'static str,
    /// What it does, one line: `pipelines.<name>` in `tally config --example`.
    pub summary: &'static str,
    /// Its database pool: default size, checks and description.
    pub pool: PoolRule,
    /// Whether, switched on, it opens its pool at all (notifications without a webhook
    /// run nothing).
    pub uses_pool: fn(&Config) -> bool,
    /// Its consumer group (the main one, when it has several).
    pub group_id: fn(&Config) -> &str,
    /// The topics it consumes (retry topics aside): each has a `-dlt` twin.
    pub inputs: fn(&Config) -> Vec<String>,
    /// The topics it produces to (dead letters aside).
    pub outputs: fn(&Config) -> Vec<String>,
    /// Checks its configuration section, naming the key at fault.
    pub validate: fn(&Config) -> Result<(), ConfigError>,
    /// Starts it on the current actix arbiter.
    pub start: fn(&Wiring<'_>) -> anyhow::Result<Running>,
}

/// Every stage, in start order. Antifraud comes first: its `init_transactions` fences the
/// transaction a crashed predecessor left open before any `read_committed` consumer of
/// this instance fetches behind it.
pub static STAGES: [&Stage; 5] =
    [&antifraud::STAGE, &ledger::STAGE, &projection::STAGE, &orders::STAGE, &notifications::STAGE];

/// Whether the writers of `pool` wake the outbox publishers themselves after they commit
/// ([`tally_actors::outbox::CommitBell`]) instead of through the trigger's notification:
/// the intake's and the ledger's, the two that write outbox rows on every transfer.
#[must_use]
pub fn rings_after_commit(pool: DbPool) -> bool {
    pool == DbPool::INTAKE || pool == ledger::STAGE.db_pool()
}

impl Stage {
    /// Its database pool.
    #[must_use]
    pub const fn db_pool(&self) -> DbPool {
        DbPool::named(self.name)
    }

    /// Whether `config` runs it here.
    #[must_use]
    pub fn runs(&self, config: &Config) -> bool {
        config.pipelines.runs(self.name)
    }
}

/// The stage called `name`.
#[must_use]
pub fn find(name: &str) -> Option<&'static Stage> {
    STAGES.iter().copied().find(|s| s.name == name)
}

/// A started stage: its pipelines (or antifraud's transactional loop), stopped at
/// shutdown.
pub enum Running {
    Pipelines(Vec<Pipeline>),
    Antifraud(Antifraud),
}

impl Running {
    /// The control handles of its consumers (admin pause, status).
    #[must_use]
    pub fn controls(&self) -> Vec<PipelineControl> {
        match self {
            Self::Pipelines(all) => all.iter().map(Pipeline::control).collect(),
            Self::Antifraud(antifraud) => vec![antifraud.control()],
        }
    }

    /// Stops fetching, drains in-flight records and commits their offsets. Whether every
    /// consumer stopped within its bound.
    pub async fn stop(self) -> bool {
        match self {
            Self::Pipelines(all) => {
                futures_util::future::join_all(all.into_iter().map(Pipeline::stop)).await.into_iter().all(|clean| clean)
            }
            Self::Antifraud(antifraud) => antifraud.stop().await,
        }
    }

    /// How many consumers it runs.
    #[must_use]
    pub fn len(&self) -> usize {
        match self {
            Self::Pipelines(all) => all.len(),
            Self::Antifraud(_) => 1,
        }
    }

    /// Whether it runs no consumer (notifications without a webhook).
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Starts every stage `config` switches on, in [`STAGES`] order.
///
/// # Errors
/// When a stage cannot start: its consumer or producer cannot be created.
pub fn start_all(wiring: &Wiring<'_>) -> anyhow::Result<Vec<Running>> {
    STAGES.iter().filter(|s| s.runs(wiring.config)).map(|s| (s.start)(wiring)).collect()
}

/// Every stage's checks, and those across stages: consumer groups are distinct (two stages
/// in one group would split each other's partitions).
///
/// # Errors
/// The first [`ConfigError`] found.
pub fn validate(config: &Config) -> Result<(), ConfigError> {
    for stage in STAGES {
        (stage.validate)(config)?;
    }
    for (i, a) in STAGES.iter().enumerate() {
        if let Some(b) = STAGES[..i].iter().find(|b| (b.group_id)(config) == (a.group_id)(config)) {
            return Err(ConfigError::Invalid {
                key: "pipelines",
                problem: format!(
                    "{}.group_id and {}.group_id are both {:?}: each stage needs its own consumer group",
                    a.name,
                    b.name,
                    (a.group_id)(config)
                ),
            });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests;
