//! `DependencyHealth`: whether a pipeline is degraded because a dependency it needs (the
//! database, the broker) is down. A record whose attempt failed with
//! [`ErrorClass::Unavailable`](super::ErrorClass::Unavailable) holds a [`DependencyWait`]
//! while it waits to probe again; the pipeline is degraded while any record waits. Its
//! driver pauses the partitions then, and resumes them when the last waiting record got
//! through.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

#[derive(Debug, Default)]
pub struct DependencyHealth {
    waiting: AtomicUsize,
    /// Since when, and why (the last failure seen), while degraded.
    state: Mutex<Option<(Instant, String)>>,
}

/// What `/admin/pipelines` and `/readyz` show of a degraded pipeline.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Degradation {
    pub reason: String,
    pub since: Duration,
    /// Records waiting for the dependency.
    pub waiting: usize,
}

impl DependencyHealth {
    /// A record starts waiting for a dependency that failed with `reason`.
    #[must_use]
    pub fn wait(self: &Arc<Self>, reason: &str) -> DependencyWait {
        self.waiting.fetch_add(1, Ordering::AcqRel);
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        let since = state.as_ref().map_or_else(Instant::now, |(since, _)| *since);
        *state = Some((since, reason.to_owned()));
        DependencyWait { health: Arc::clone(self) }
    }

    /// The latest failure of a record already waiting.
    pub fn still_failing(&self, reason: &str) {
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some((_, last)) = state.as_mut() {
            reason.clone_into(last);
        }
    }

    #[must_use]
    pub fn is_degraded(&self) -> bool {
        self.waiting.load(Ordering::Acquire) > 0
    }

    /// The degradation, while degraded.
    #[must_use]
    pub fn degradation(&self) -> Option<Degradation> {
        let waiting = self.waiting.load(Ordering::Acquire);
        let state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        match (waiting, state.as_ref()) {
            (0, _) | (_, None) => None,
            (waiting, Some((since, reason))) => {
                Some(Degradation { reason: reason.clone(), since: since.elapsed(), waiting })
            }
        }
    }
}

/// One record waiting for a dependency; dropping it (the record got through, gave up, or
/// its future was dropped) ends its wait.
#[derive(Debug)]
pub struct DependencyWait {
    health: Arc<DependencyHealth>,
}

impl Drop for DependencyWait {
    fn drop(&mut self) {
        let mut state = self.health.state.lock().unwrap_or_else(PoisonError::into_inner);
        if self.health.waiting.fetch_sub(1, Ordering::AcqRel) == 1 {
            *state = None;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn degraded_while_any_record_waits() {
        let health = Arc::new(DependencyHealth::default());
        assert!(!health.is_degraded());
        let a = health.wait("connection refused");
        let b = health.wait("pool timed out");
        let d = health.degradation().unwrap();
        assert_eq!((d.reason.as_str(), d.waiting), ("pool timed out", 2));
        health.still_failing("connection refused again");
        drop(a);
        assert!(health.is_degraded(), "b still waits");
        assert_eq!(health.degradation().unwrap().reason, "connection refused again");
        drop(b);
        assert!(!health.is_degraded());
        assert_eq!(health.degradation(), None);
    }
}
