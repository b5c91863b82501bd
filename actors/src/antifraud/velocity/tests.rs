//! The window against the linear scan it replaced (`LinearWindow`, the previous code kept
//! as the reference): the same counts and the same remembered transfers on generated
//! inputs, and the cost of a busy account (`--ignored`).

use std::collections::{HashMap, VecDeque};
use std::time::Duration;

use chrono::{DateTime, Utc};
use proptest::prelude::*;
use uuid::Uuid;

use super::*;

/// The previous velocity window: per account a time-ordered deque, scanned whole for the
/// transfer's id and for the count on every score.
struct LinearWindow {
    window: chrono::Duration,
    recent: HashMap<String, VecDeque<(DateTime<Utc>, Uuid)>>,
    seen: usize,
    forget_every: usize,
}

impl LinearWindow {
    fn new(window: Duration, forget_every: usize) -> Self {
        let window = chrono::Duration::from_std(window).unwrap_or(chrono::Duration::MAX);
        Self { window, recent: HashMap::new(), seen: 0, forget_every }
    }

    fn velocity(&mut self, account: &str, transfer: Uuid, at: DateTime<Utc>) -> usize {
        let window = self.window;
        let times = self.recent.entry(account.to_owned()).or_default();
        if !times.iter().any(|(_, id)| *id == transfer) {
            let position = times.partition_point(|(t, _)| *t <= at);
            times.insert(position, (at, transfer));
        }
        let expired = |t: &DateTime<Utc>| t.checked_add_signed(window).is_some_and(|end| end < at);
        while times.front().is_some_and(|(t, _)| expired(t)) {
            times.pop_front();
        }
        let n = times.iter().filter(|(t, _)| *t <= at).count();
        self.seen += 1;
        if self.seen % self.forget_every == 0 {
            self.recent.retain(|_, t| t.back().is_some_and(|(last, _)| !expired(last)));
        }
        n
    }

    fn rebuild(&mut self, recent: &[(String, Uuid, DateTime<Utc>)]) {
        self.recent.clear();
        for (account, id, at) in recent {
            let times = self.recent.entry(account.clone()).or_default();
            let position = times.partition_point(|(t, _)| *t <= *at);
            times.insert(position, (*at, *id));
        }
    }
}

fn window(window: Duration, forget_every: usize) -> VelocityWindow {
    VelocityWindow { forget_every, ..VelocityWindow::new(window) }
}

/// The remembered transfers, per account, as both keep them.
fn state(w: &VelocityWindow) -> HashMap<String, Vec<(DateTime<Utc>, Uuid)>> {
    w.accounts.iter().map(|(k, a)| (k.clone(), a.times.iter().copied().collect())).collect()
}

fn linear_state(w: &LinearWindow) -> HashMap<String, Vec<(DateTime<Utc>, Uuid)>> {
    w.recent.iter().map(|(k, t)| (k.clone(), t.iter().copied().collect())).collect()
}

#[derive(Debug, Clone)]
enum Op {
    /// Score transfer number `transfer` of account `account`, `step` seconds after the
    /// previous score (negative: out of order).
    Score { account: u8, transfer: u8, step: i64 },
    /// Score near the end of chrono's time range.
    ScoreAtTheEnd { account: u8, transfer: u8, before_end: i64 },
    /// Rebuild from stored decisions: (account, transfer, seconds from the current time).
    Rebuild(Vec<(u8, u8, i64)>),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        20 => (0..3u8, 0..40u8, prop_oneof![4 => -3..6i64, 1 => -120..120i64])
            .prop_map(|(account, transfer, step)| Op::Score { account, transfer, step }),
        1 => (0..3u8, 0..40u8, 0..20i64)
            .prop_map(|(account, transfer, before_end)| Op::ScoreAtTheEnd { account, transfer, before_end }),
        1 => prop::collection::vec((0..3u8, 0..40u8, -60..5i64), 0..30).prop_map(Op::Rebuild),
    ]
}

fn id(transfer: u8) -> Uuid {
    Uuid::from_u128(u128::from(transfer) + 1)
}

fn account(account: u8) -> String {
    format!("acc-{account}")
}

fn seconds(at: i64) -> DateTime<Utc> {
    DateTime::from_timestamp(1_800_000_000 + at, 0).unwrap_or_default()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// On any sequence of scores (in order, out of order, redelivered, at the end of time)
    /// and rebuilds, the window counts what the linear scan counted and remembers the same
    /// transfers, forgotten accounts included.
    #[test]
    fn counts_like_the_linear_scan(
        window_secs in prop_oneof![0..30u64, Just(u64::MAX)],
        forget_every in 1..12usize,
        ops in prop::collection::vec(op(), 1..300),
    ) {
        let window_length = Duration::from_secs(window_secs);
        let mut fast = window(window_length, forget_every);
        let mut linear = LinearWindow::new(window_length, forget_every);
        let mut now = 0_i64;
        for op in ops {
            match op {
                Op::Score { account: a, transfer, step } => {
                    now += step;
                    let (a, t, at) = (account(a), id(transfer), seconds(now));
                    prop_assert_eq!(fast.count(&a, t, at), linear.velocity(&a, t, at));
                }
                Op::ScoreAtTheEnd { account: a, transfer, before_end } => {
                    let at = DateTime::<Utc>::MAX_UTC - chrono::Duration::seconds(before_end);
                    let (a, t) = (account(a), id(transfer));
                    prop_assert_eq!(fast.count(&a, t, at), linear.velocity(&a, t, at));
                }
                Op::Rebuild(rows) => {
                    // As stored: one decision per transfer id.
                    let mut ids = std::collections::HashSet::new();
                    let recent: Vec<_> = rows
                        .into_iter()
                        .filter(|(_, transfer, _)| ids.insert(*transfer))
                        .map(|(a, transfer, back)| (account(a), id(transfer), seconds(now + back)))
                        .collect();
                    fast.rebuild(&recent);
                    linear.rebuild(&recent);
                }
            }
            prop_assert_eq!(state(&fast), linear_state(&linear));
            for a in fast.accounts.values() {
                prop_assert_eq!(a.ids.len(), a.times.len(), "one id per remembered transfer");
            }
        }
    }
}
