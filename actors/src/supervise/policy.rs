//! The error policy shared by every pipeline: every handler error is classified by its
//! cause. Transient errors are retried with exponential backoff for their key, then
//! dead-lettered as `exhausted`; poison is dead-lettered at once; a dependency that is
//! down (database or broker unreachable) is nobody's record's fault: the pipeline waits
//! for it without spending any record's retry budget. Business results are not errors.

use std::time::Duration;

use tally_schema::headers::dlt_kind;

use crate::backoff::Backoff;

/// How an error is handled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorClass {
    /// May succeed later: database or broker unavailable, timeout, serialization failure,
    /// deadlock. Retried for that key only.
    Transient,
    /// Will never succeed: undecodable payload, missing or invalid field, a deterministic
    /// database error (data exception, integrity violation).
    Poison,
    /// The dependency itself is down (connection refused or lost, pool timeout, broker
    /// unreachable). Not the record's fault: waited out, never dead-lettered.
    Unavailable,
}

impl ErrorClass {
    /// A stable name of the class, for logs and traces.
    #[must_use]
    pub fn code(self) -> &'static str {
        match self {
            Self::Transient => "transient",
            Self::Poison => "poison",
            Self::Unavailable => "unavailable",
        }
    }

    /// The `dlt-exception-kind` value once this class leads to the DLT.
    #[must_use]
    pub fn dlt_kind(self) -> &'static str {
        match self {
            Self::Transient | Self::Unavailable => dlt_kind::EXHAUSTED,
            Self::Poison => dlt_kind::POISON,
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

    #[must_use]
    pub fn unavailable(message: impl Into<String>) -> Self {
        Self { class: ErrorClass::Unavailable, message: message.into() }
    }

    /// A failure classified by `error`'s own [`Classify`], with `context` before its
    /// message.
    #[must_use]
    pub fn classified<E: Classify + std::fmt::Display>(context: &str, error: &E) -> Self {
        Self { class: error.class(), message: format!("{context}: {error}") }
    }
}

impl Classify for HandlerError {
    fn class(&self) -> ErrorClass {
        self.class
    }
}

impl Classify for diesel::result::Error {
    /// By cause, as far as the driver reports it:
    /// - connection lost or never sent (`UnableToSendCommand`, `ClosedConnection`, a broken
    ///   transaction manager), or a database that refuses writes (25006, read-only: a
    ///   standby after a failover, a demoted primary): the database is unavailable;
    /// - integrity violations (SQLSTATE class 23: unique, foreign key, not null, check):
    ///   poison, the same statement fails the same way every time;
    /// - serialization failures (40001): transient;
    /// - anything else the server reported: by its SQLSTATE when diesel-async names it, else
    ///   by PostgreSQL's primary message ([`classify_server_message`]);
    /// - a value tally could not encode or decode: poison.
    fn class(&self) -> ErrorClass {
        use diesel::result::{DatabaseErrorKind as K, Error};
        match self {
            Error::DatabaseError(K::UnableToSendCommand | K::ClosedConnection | K::ReadOnlyTransaction, _)
            | Error::BrokenTransactionManager => ErrorClass::Unavailable,
            Error::DatabaseError(
                K::UniqueViolation | K::ForeignKeyViolation | K::NotNullViolation | K::CheckViolation,
                _,
            ) => ErrorClass::Poison,
            Error::DatabaseError(K::SerializationFailure, _) => ErrorClass::Transient,
            Error::DatabaseError(_, info) => classify_server_message(info.message()),
            Error::SerializationError(_) | Error::DeserializationError(_) => ErrorClass::Poison,
            _ => ErrorClass::Transient,
        }
    }
}

/// The class of a server error that diesel-async 0.6 reports as `Unknown`: it keeps the
/// SQLSTATE to itself except for six codes, so the primary message, whose wording
/// PostgreSQL keeps stable, stands in for the code. What is not recognised is transient:
/// the stage probes its database before counting it against the record
/// ([`super::DependencyProbe`]), then retries a bounded number of times and dead-letters it
/// as `exhausted` (never dropped).
///
/// - 08xxx connection exceptions, 57P01-57P03 (shutdown, cannot connect now), 25006
///   read-only transaction, 53100 disk full: unavailable (no record is at fault).
/// - 40P01 deadlock, 55P03 lock not available, 57014 statement or lock timeout, other 53xxx
///   insufficient resources: transient.
/// - 22xxx data exceptions (value too long, out of range, invalid input syntax, division
///   by zero, invalid encoding): poison.
#[must_use]
pub fn classify_server_message(message: &str) -> ErrorClass {
    const UNAVAILABLE: &[&str] = &[
        "terminating connection",
        "the database system is shutting down",
        "the database system is starting up",
        "the database system is in recovery mode",
        "is not currently accepting connections",
        "connection to server",
        "server closed the connection",
        "in a read-only transaction",
        "during recovery",
        "could not extend file",
        "no space left on device",
        "disk full",
    ];
    const TRANSIENT: &[&str] = &[
        "deadlock detected",
        "could not obtain lock",
        "canceling statement due to",
        "could not serialize access",
        "out of memory",
        "out of shared memory",
        "too many connections",
        "remaining connection slots",
    ];
    const POISON: &[&str] = &[
        "value too long for type",
        "out of range",
        "invalid input syntax",
        "invalid input value",
        "division by zero",
        "invalid byte sequence",
        "character with byte sequence",
        "null character not permitted",
        "date/time field value out of range",
        "violates check constraint",
        "violates not-null constraint",
        "violates foreign key constraint",
        "duplicate key value violates unique constraint",
    ];
    let m = message.to_ascii_lowercase();
    if UNAVAILABLE.iter().any(|p| m.contains(p)) {
        ErrorClass::Unavailable
    } else if TRANSIENT.iter().any(|p| m.contains(p)) {
        ErrorClass::Transient
    } else if POISON.iter().any(|p| m.contains(p)) {
        ErrorClass::Poison
    } else {
        ErrorClass::Transient
    }
}

impl Classify for diesel_async::pooled_connection::deadpool::PoolError {
    /// No connection could be had: refused, timed out, or the pool is closed. The
    /// database is unavailable, whatever the record.
    fn class(&self) -> ErrorClass {
        ErrorClass::Unavailable
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
    /// The default: 5 retries, 500 ms, x2, at most 15 s.
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
        Some(self.curve().nth(retry - 1))
    }

    /// The curve of the retry waits.
    #[must_use]
    pub fn curve(&self) -> Backoff {
        Backoff { initial: self.initial, multiplier: self.multiplier, max: self.max }
    }

    /// The longest a record can spend under this policy: every attempt taking
    /// `attempt_timeout` and every backoff in between. A drain must wait this long to let a
    /// record in retry finish.
    #[must_use]
    pub fn worst_case(&self, attempt_timeout: Duration) -> Duration {
        let backoffs: Duration = (1..=self.max_retries).filter_map(|n| self.backoff(n)).sum();
        backoffs + attempt_timeout * self.max_retries.saturating_add(1)
    }

    /// The wait before the next probe of an unavailable dependency, after `previous`
    /// (`None` for the first): from the initial backoff, doubling, capped at
    /// [`PROBE_MAX`] (or `max` when lower). Probes never count against `max_retries`.
    #[must_use]
    pub fn probe_backoff(&self, previous: Option<Duration>) -> Duration {
        Backoff::doubling(self.initial, self.max.min(PROBE_MAX)).after(previous)
    }
}

/// The longest wait between two probes of an unavailable dependency, so that a pipeline
/// resumes within seconds of the dependency coming back.
pub const PROBE_MAX: Duration = Duration::from_secs(5);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_backoff_sequence() {
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
    fn database_errors_are_classified_by_cause() {
        use diesel::result::{DatabaseErrorKind as K, Error};
        let db = |kind, msg: &str| Error::DatabaseError(kind, Box::new(msg.to_owned()));
        assert_eq!(db(K::UniqueViolation, "duplicate key").class(), ErrorClass::Poison);
        assert_eq!(db(K::CheckViolation, "violates check constraint").class(), ErrorClass::Poison);
        assert_eq!(db(K::SerializationFailure, "could not serialize").class(), ErrorClass::Transient);
        assert_eq!(db(K::ClosedConnection, "closed").class(), ErrorClass::Unavailable);
        assert_eq!(db(K::UnableToSendCommand, "connection reset").class(), ErrorClass::Unavailable);
        assert_eq!(db(K::ReadOnlyTransaction, "read-only").class(), ErrorClass::Unavailable);
        for (msg, class) in [
            ("value too long for type character varying(55)", ErrorClass::Poison),
            ("bigint out of range", ErrorClass::Poison),
            ("invalid input syntax for type uuid: \"x\"", ErrorClass::Poison),
            ("deadlock detected", ErrorClass::Transient),
            ("canceling statement due to lock timeout", ErrorClass::Transient),
            ("canceling statement due to statement timeout", ErrorClass::Transient),
            ("could not obtain lock on row in relation \"accounts\"", ErrorClass::Transient),
            ("terminating connection due to administrator command", ErrorClass::Unavailable),
            ("database \"t\" is not currently accepting connections", ErrorClass::Unavailable),
            ("cannot execute INSERT in a read-only transaction", ErrorClass::Unavailable),
            ("could not extend file \"base/16384/16390\": No space left on device", ErrorClass::Unavailable),
            ("something nobody has seen before", ErrorClass::Transient),
        ] {
            assert_eq!(db(K::Unknown, msg).class(), class, "{msg}");
        }
        assert_eq!(Error::BrokenTransactionManager.class(), ErrorClass::Unavailable);
    }

    #[test]
    fn worst_case_counts_every_attempt_and_backoff() {
        let p = RetryPolicy::default();
        // 0.5 + 1 + 2 + 4 + 8 s of backoff and 6 attempts of at most 10 s.
        assert_eq!(p.worst_case(Duration::from_secs(10)), Duration::from_millis(75_500));
        let none = RetryPolicy { max_retries: 0, ..RetryPolicy::default() };
        assert_eq!(none.worst_case(Duration::from_secs(1)), Duration::from_secs(1));
    }

    #[test]
    fn probes_back_off_to_a_cap() {
        let p =
            RetryPolicy { initial: Duration::from_millis(100), max: Duration::from_secs(60), ..RetryPolicy::default() };
        let mut wait = None;
        let waits: Vec<u64> = (0..8)
            .map(|_| {
                let w = p.probe_backoff(wait);
                wait = Some(w);
                w.as_millis() as u64
            })
            .collect();
        assert_eq!(waits, vec![100, 200, 400, 800, 1600, 3200, 5000, 5000]);
    }

    #[test]
    fn dlt_kinds() {
        assert_eq!(ErrorClass::Poison.dlt_kind(), "poison");
        assert_eq!(ErrorClass::Transient.dlt_kind(), "exhausted");
    }
}
