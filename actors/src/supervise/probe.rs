//! `DependencyProbe`: blame the dependency before the record. Before a failure that is not
//! known poison is counted against a record, the stage asks its own database pool whether
//! the database still takes writes ([`crate::store::heartbeats::probe`]). A failing probe
//! makes the failure [`ErrorClass::Unavailable`](super::ErrorClass::Unavailable): the
//! record waits without spending its retries and nothing is dead-lettered for it.
//!
//! Probes are shared: many records of a batch fail together, so one probe answers every
//! caller for [`PROBE_FRESH`].

use std::time::{Duration, Instant};

use tokio::sync::Mutex;

use crate::store::PgPool;

/// How long one probe's answer stands for every caller.
pub const PROBE_FRESH: Duration = Duration::from_millis(250);

pub struct DependencyProbe {
    stage: String,
    pool: PgPool,
    last: Mutex<Option<(Instant, Result<(), String>)>>,
}

impl DependencyProbe {
    /// A probe of `pool`, writing the heartbeat row of `stage`.
    #[must_use]
    pub fn new(stage: &str, pool: PgPool) -> Self {
        Self { stage: stage.to_owned(), pool, last: Mutex::new(None) }
    }

    /// `Ok` when the database takes a write; else why not.
    ///
    /// # Errors
    /// The reason the database cannot take the stage's writes.
    pub async fn check(&self) -> Result<(), String> {
        let mut last = self.last.lock().await;
        if let Some((at, result)) = last.as_ref() {
            if at.elapsed() < PROBE_FRESH {
                return result.clone();
            }
        }
        let result = match self.pool.get().await {
            Ok(mut conn) => crate::store::heartbeats::probe(&mut conn, &self.stage).await,
            // Every connection busy (a backlog, not an outage): no evidence either way.
            Err(deadpool::managed::PoolError::Timeout(deadpool::managed::TimeoutType::Wait)) => Ok(()),
            Err(e) => Err(format!("no database connection: {e}")),
        };
        *last = Some((Instant::now(), result.clone()));
        result
    }
}
