//! The velocity window of [`super::risk::RulesRiskEngine`]: per source account, the distinct
//! transfers it requested within a sliding window of event time (`requestedAt`).
//!
//! Each account keeps its transfers sorted by time beside the set of their ids, so a score
//! costs O(log n) in the account's transfers inside the window, however busy the account:
//! the id set answers "seen before?" (a redelivery is not a second transfer), a binary
//! search finds where a transfer goes and how many are at or before it, and expired
//! transfers leave from the front. A transfer in time order goes to the back; one that
//! arrives out of order moves the later ones of its account by one place.

use std::collections::{HashMap, HashSet, VecDeque};
use std::time::Duration;

use chrono::{DateTime, Utc};
use uuid::Uuid;

/// Scores between two sweeps of the accounts with nothing left inside the window.
const FORGET_EVERY: usize = 10_000;

/// Per source account, the transfers inside the window.
#[derive(Debug)]
pub struct VelocityWindow {
    window: chrono::Duration,
    accounts: HashMap<String, AccountTimes>,
    counted: usize,
    forget_every: usize,
}

/// One account's transfers: `times` sorted by time (equal times in arrival order), `ids`
/// the transfers in `times`.
#[derive(Debug, Default)]
struct AccountTimes {
    times: VecDeque<(DateTime<Utc>, Uuid)>,
    ids: HashSet<Uuid>,
}

impl AccountTimes {
    /// Adds `transfer` at `at` unless it is already there.
    fn add(&mut self, transfer: Uuid, at: DateTime<Utc>) {
        if !self.ids.insert(transfer) {
            return;
        }
        if self.times.back().is_none_or(|(last, _)| *last <= at) {
            self.times.push_back((at, transfer));
        } else {
            let position = self.times.partition_point(|(t, _)| *t <= at);
            self.times.insert(position, (at, transfer));
        }
    }

    /// Drops the transfers at or before `expired`'s boundary: every one for which it holds,
    /// which (times being sorted, `expired` monotonic) is a prefix.
    fn expire(&mut self, expired: impl Fn(&DateTime<Utc>) -> bool) {
        while let Some((t, id)) = self.times.front() {
            if !expired(t) {
                break;
            }
            self.ids.remove(id);
            self.times.pop_front();
        }
    }

    /// Transfers at or before `at`.
    fn up_to(&self, at: DateTime<Utc>) -> usize {
        self.times.partition_point(|(t, _)| *t <= at)
    }
}

impl VelocityWindow {
    #[must_use]
    pub fn new(window: Duration) -> Self {
        Self {
            window: chrono::Duration::from_std(window).unwrap_or(chrono::Duration::MAX),
            accounts: HashMap::new(),
            counted: 0,
            forget_every: FORGET_EVERY,
        }
    }

    /// Whether a transfer requested at `t` is out of the window that ends at `at`. Checked:
    /// a time near chrono's limits must not overflow (decode bounds the years).
    fn expired(window: chrono::Duration, at: DateTime<Utc>) -> impl Fn(&DateTime<Utc>) -> bool {
        move |t| t.checked_add_signed(window).is_some_and(|end| end < at)
    }

    /// Records `transfer` of `account`, requested at `at` (once, however often it is
    /// delivered), and returns how many of the account's transfers are inside the window
    /// that ends at `at`, this one included.
    pub fn count(&mut self, account: &str, transfer: Uuid, at: DateTime<Utc>) -> usize {
        let expired = Self::expired(self.window, at);
        let times = match self.accounts.get_mut(account) {
            Some(times) => times,
            None => self.accounts.entry(account.to_owned()).or_default(),
        };
        times.add(transfer, at);
        times.expire(&expired);
        let n = times.up_to(at);
        self.counted += 1;
        if self.counted % self.forget_every == 0 {
            // Forget accounts with nothing inside the window, so memory stays bounded.
            self.accounts.retain(|_, a| a.times.back().is_some_and(|(last, _)| !expired(last)));
        }
        n
    }

    /// Replaces every account's transfers with `recent` (source account, transfer id,
    /// requested at), as stored: one decision per transfer id.
    pub fn rebuild(&mut self, recent: &[(String, Uuid, DateTime<Utc>)]) {
        self.accounts.clear();
        for (account, id, at) in recent {
            self.accounts.entry(account.clone()).or_default().add(*id, *at);
        }
    }
}

#[cfg(test)]
mod tests;
