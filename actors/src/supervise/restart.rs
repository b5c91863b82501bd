//! Restarting a stage after a panic, and the poison-pill rule.
//!
//! A stage's long-lived thread (a pipeline's driver, the antifraud loop) runs its loop
//! under `catch_unwind`. A panic is a bug, but it must not leave a stage dead while the
//! daemon says it is ready: the supervisor counts it (`tally_stage_restarts_total`), logs
//! its cause, gives the stage's partitions up (finished work is committed, the rest is
//! redelivered), waits a capped backoff and starts the stage again from its committed
//! offsets. A record in hand when the stage crashed is remembered ([`CrashBook`]); one
//! that crashed its stage twice is dead-lettered as poison (`crashed: ...`) instead of
//! being decoded a third time (the poison-pill rule of Flink and Kafka Streams).
//!
//! While a stage waits to restart, or has crashed [`CRASH_LOOP`] times within
//! [`CRASH_WINDOW`], `/readyz` says so. A stage whose consumer cannot even be created
//! again ([`MAX_START_FAILURES`] times in a row) gives up: [`give_up`] tells the daemon,
//! which stops and exits non-zero so that its service manager restarts it.

use std::collections::{HashMap, VecDeque};
use std::sync::{Mutex, OnceLock, PoisonError};
use std::time::{Duration, Instant};

use crate::backoff::Backoff;

/// Crashes within [`CRASH_WINDOW`] that make a stage crash-looping.
pub const CRASH_LOOP: usize = 3;
/// The window of [`CRASH_LOOP`].
pub const CRASH_WINDOW: Duration = Duration::from_secs(300);
/// Failed attempts in a row to start a stage again before the process gives up.
pub const MAX_START_FAILURES: u32 = 5;
/// Crashes of one record before it is dead-lettered instead of handled again.
pub const CRASHES_BEFORE_POISON: u32 = 2;
/// The restart backoff: from 500 ms, doubling, at most 30 s.
pub const RESTART_BACKOFF: Backoff = Backoff::doubling(Duration::from_millis(500), Duration::from_secs(30));

/// Where a record lies: topic, partition, offset.
pub type Coordinates = (String, i32, i64);

/// The records that crashed a stage, and how often. Bounded: the oldest entries go first.
#[derive(Debug, Default)]
pub struct CrashBook {
    inner: Mutex<CrashBookInner>,
}

#[derive(Debug, Default)]
struct CrashBookInner {
    in_hand: Option<Coordinates>,
    /// Crashes of each record, with the cause of the last one.
    crashes: HashMap<Coordinates, (u32, String)>,
    order: VecDeque<Coordinates>,
}

const CRASH_BOOK_MAX: usize = 1_024;

impl CrashBook {
    fn inner(&self) -> std::sync::MutexGuard<'_, CrashBookInner> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The stage starts working on the record at `at`; `None` once it is done with it.
    pub fn hold(&self, at: Option<Coordinates>) {
        self.inner().in_hand = at;
    }

    /// How often the record at `at` crashed the stage.
    #[must_use]
    pub fn crashes(&self, at: &Coordinates) -> u32 {
        self.inner().crashes.get(at).map_or(0, |(n, _)| *n)
    }

    /// The defect of a record that crashed its stage [`CRASHES_BEFORE_POISON`] times, or
    /// `None`.
    #[must_use]
    pub fn poison_pill(&self, at: &Coordinates) -> Option<String> {
        let inner = self.inner();
        let (n, cause) = inner.crashes.get(at)?;
        (*n >= CRASHES_BEFORE_POISON)
            .then(|| format!("crashed: the record crashed its stage {n} times (last: {cause})"))
    }

    /// The stage crashed with `cause`: the record in hand, if any, counts one more crash.
    /// Returns it.
    pub fn crashed(&self, cause: &str) -> Option<Coordinates> {
        let mut inner = self.inner();
        let at = inner.in_hand.take()?;
        if !inner.crashes.contains_key(&at) {
            inner.order.push_back(at.clone());
            if inner.order.len() > CRASH_BOOK_MAX {
                if let Some(oldest) = inner.order.pop_front() {
                    inner.crashes.remove(&oldest);
                }
            }
        }
        let entry = inner.crashes.entry(at.clone()).or_insert_with(|| (0, String::new()));
        entry.0 += 1;
        cause.clone_into(&mut entry.1);
        Some(at)
    }
}

/// The restart state of one stage, shown by `/admin/pipelines` and `/readyz`.
#[derive(Debug, Default)]
pub struct Restarts {
    inner: Mutex<RestartsInner>,
}

#[derive(Debug, Default)]
struct RestartsInner {
    total: u64,
    recent: VecDeque<Instant>,
    last_cause: Option<String>,
    down_since: Option<Instant>,
    last_wait: Option<Duration>,
    last_start: Option<Instant>,
}

/// What a stage shows of its crashes.
#[derive(Debug, Clone, PartialEq, Eq, Default, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RestartStatus {
    /// Restarts since the daemon started.
    pub restarts: u64,
    /// Down: crashed and waiting to start again.
    pub down: bool,
    /// [`CRASH_LOOP`] crashes or more within [`CRASH_WINDOW`].
    pub crash_looping: bool,
    /// The cause of the last crash.
    pub last_crash: Option<String>,
}

impl Restarts {
    fn inner(&self) -> std::sync::MutexGuard<'_, RestartsInner> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The stage crashed with `cause`: it is down; returns how long to wait before
    /// starting it again (longer after each crash, from the start after a stage ran for a
    /// whole [`CRASH_WINDOW`]).
    pub fn crashed(&self, cause: &str) -> Duration {
        let mut inner = self.inner();
        let now = Instant::now();
        inner.total += 1;
        inner.recent.push_back(now);
        while inner.recent.front().is_some_and(|t| now.duration_since(*t) > CRASH_WINDOW) {
            inner.recent.pop_front();
        }
        inner.last_cause = Some(cause.to_owned());
        inner.down_since = Some(now);
        let ran_long = inner.last_start.is_some_and(|s| now.duration_since(s) > CRASH_WINDOW);
        let previous = if ran_long { None } else { inner.last_wait };
        let wait = RESTART_BACKOFF.after(previous);
        inner.last_wait = Some(wait);
        wait
    }

    /// The stage runs again.
    pub fn started(&self) {
        let mut inner = self.inner();
        inner.down_since = None;
        inner.last_start = Some(Instant::now());
    }

    #[must_use]
    pub fn status(&self) -> RestartStatus {
        let inner = self.inner();
        let now = Instant::now();
        let recent = inner.recent.iter().filter(|t| now.duration_since(**t) <= CRASH_WINDOW).count();
        RestartStatus {
            restarts: inner.total,
            down: inner.down_since.is_some(),
            crash_looping: recent >= CRASH_LOOP,
            last_crash: inner.last_cause.clone(),
        }
    }
}

/// The text of a panic's payload.
#[must_use]
pub fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic without a message".into())
}

static GAVE_UP: OnceLock<String> = OnceLock::new();
static GIVE_UP: tokio::sync::Notify = tokio::sync::Notify::const_new();

/// A stage could not be started again: the process must stop and exit non-zero. The first
/// reason given is kept. (Process-wide: one daemon per process.)
pub fn give_up(reason: String) {
    tracing::error!(reason, "A stage cannot be restarted; the daemon stops.");
    let _ = GAVE_UP.set(reason);
    GIVE_UP.notify_waiters();
    GIVE_UP.notify_one();
}

/// Waits until a stage gave up; returns why.
pub async fn gave_up() -> String {
    loop {
        if let Some(reason) = GAVE_UP.get() {
            return reason.clone();
        }
        GIVE_UP.notified().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_is_poison_after_crashing_its_stage_twice() {
        let book = CrashBook::default();
        let at: Coordinates = ("t".into(), 1, 7);
        assert_eq!(book.crashed("boom"), None, "nothing in hand");
        for n in 1..=2 {
            assert_eq!(book.poison_pill(&at), None, "not before crash {n}");
            book.hold(Some(at.clone()));
            assert_eq!(book.crashed("boom"), Some(at.clone()));
        }
        let pill = book.poison_pill(&at).unwrap_or_default();
        assert!(pill.starts_with("crashed:") && pill.contains("2 times") && pill.contains("boom"), "{pill}");
        book.hold(Some(("t".into(), 1, 8)));
        book.hold(None);
        assert_eq!(book.crashed("boom"), None, "a record handled in time is not blamed");
    }

    #[tokio::test]
    async fn giving_up_wakes_the_daemon_with_the_reason() {
        let waiting = tokio::spawn(gave_up());
        tokio::task::yield_now().await;
        give_up("pipeline x: cannot create its consumer again".into());
        give_up("a second reason is not kept".into());
        let reason = tokio::time::timeout(Duration::from_secs(5), waiting).await;
        assert_eq!(reason.ok().and_then(Result::ok).as_deref(), Some("pipeline x: cannot create its consumer again"));
    }

    #[test]
    fn restarts_back_off_and_show_a_crash_loop() {
        let r = Restarts::default();
        assert_eq!(r.status(), RestartStatus::default());
        let waits: Vec<u64> = (0..CRASH_LOOP).map(|_| r.crashed("boom").as_millis() as u64).collect();
        assert_eq!(waits, [500, 1_000, 2_000]);
        let status = r.status();
        assert!(status.down && status.crash_looping && status.restarts == 3, "{status:?}");
        r.started();
        assert!(!r.status().down);
        assert_eq!(r.status().last_crash.as_deref(), Some("boom"));
    }
}
