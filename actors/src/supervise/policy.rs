//! The error policy shared by every pipeline (DESIGN.md §5.3): every handler error is
//! transient (retry with exponential backoff, then dead-letter as `exhausted`) or poison
//! (dead-letter at once). Business results are not errors.

use std::time::Duration;

/// How an error is handled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorClass {
    /// May succeed later: database or broker unavailable, timeout, serialization failure,
    /// deadlock. Retried for that key only.
    Transient,
    /// Will never succeed: undecodable payload, missing or invalid field.
    Poison,
}

impl ErrorClass {
    /// The `dlt-exception-kind` value once this class leads to the DLT.
    #[must_use]
    pub fn dlt_kind(self) -> &'static str {
        match self {
            Self::Transient => "exhausted",
            Self::Poison => "poison",
        }
    }
}

/// Types whose errors the supervisor can classify.
pub trait Classify {
    fn class(&self) -> ErrorClass;
}

/// A handler failure, classified.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct HandlerError {
    pub class: ErrorClass,
    pub message: String,
}

impl HandlerError {
    #[must_use]
    pub fn poison(message: impl Into<String>) -> Self {
        Self { class: ErrorClass::Poison, message: message.into() }
    }

    #[must_use]
    pub fn transient(message: impl Into<String>) -> Self {
        Self { class: ErrorClass::Transient, message: message.into() }
    }
}

impl Classify for HandlerError {
    fn class(&self) -> ErrorClass {
        self.class
    }
}

impl Classify for diesel::result::Error {
    /// Every database failure is transient: connection loss, timeouts, serialization
    /// failures and deadlocks may pass; anything else is retried a bounded number of times
    /// and then dead-lettered, never dropped.
    fn class(&self) -> ErrorClass {
        ErrorClass::Transient
    }
}

/// Blocking exponential retry: `max_retries` retries after the first attempt, waiting
/// `initial * multiplier^(n-1)` capped at `max` before retry `n`.
#[derive(Debug, Clone, PartialEq)]
pub struct RetryPolicy {
    pub max_retries: u32,
    pub initial: Duration,
    pub multiplier: f64,
    pub max: Duration,
}

impl Default for RetryPolicy {
    /// Seed 001 §6: 5 retries, 500 ms, x2, at most 15 s.
    fn default() -> Self {
        Self { max_retries: 5, initial: Duration::from_millis(500), multiplier: 2.0, max: Duration::from_secs(15) }
    }
}

impl RetryPolicy {
    /// The wait before retry number `retry` (1-based), or `None` when retries are exhausted.
    #[must_use]
    pub fn backoff(&self, retry: u32) -> Option<Duration> {
        if retry == 0 || retry > self.max_retries {
            return None;
        }
        let factor = self.multiplier.powi(i32::try_from(retry - 1).unwrap_or(i32::MAX));
        let wait = self.initial.as_secs_f64() * factor;
        Some(Duration::from_secs_f64(wait.min(self.max.as_secs_f64())))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seed_backoff_sequence() {
        let p = RetryPolicy::default();
        let waits: Vec<u64> = (1..=5).map(|n| p.backoff(n).map_or(0, |d| d.as_millis() as u64)).collect();
        assert_eq!(waits, vec![500, 1000, 2000, 4000, 8000]);
        assert_eq!(p.backoff(6), None, "5 retries, then the DLT");
        assert_eq!(p.backoff(0), None);
    }

    #[test]
    fn backoff_is_capped() {
        let p = RetryPolicy { max_retries: 10, ..RetryPolicy::default() };
        assert_eq!(p.backoff(10), Some(Duration::from_secs(15)));
    }

    #[test]
    fn dlt_kinds() {
        assert_eq!(ErrorClass::Poison.dlt_kind(), "poison");
        assert_eq!(ErrorClass::Transient.dlt_kind(), "exhausted");
    }
}
