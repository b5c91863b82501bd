//! Failed authentication, per client address: every presented token or certificate that
//! names no one is counted (`tally_http_auth_failures_total{listener}`) and logged with the
//! address, at most once a minute per address (with how many came in between); past
//! [`FAILURES`] in [`WINDOW`], the address waits ([`BACKOFF_START`], doubling at each
//! further failure, up to [`BACKOFF_MAX`]) and every request of it that needs a credential
//! is answered 429 unread (`tally_http_auth_refused_total{listener}`). A success clears it.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use tally_actors::Metrics;
use tracing::warn;

/// Failures of one address within [`WINDOW`] before it must wait.
pub const FAILURES: u32 = 10;
pub const WINDOW: Duration = Duration::from_secs(60);
pub const BACKOFF_START: Duration = Duration::from_secs(1);
pub const BACKOFF_MAX: Duration = Duration::from_secs(300);
/// Addresses remembered at most; past it the quietest are forgotten.
const REMEMBERED: usize = 10_000;

#[derive(Debug)]
struct Entry {
    failures: u32,
    window_start: Instant,
    blocked_until: Option<Instant>,
    backoff: Duration,
    logged_at: Option<Instant>,
    unlogged: u32,
    last_seen: Instant,
}

/// The failed authentications of one listener, by address.
#[derive(Debug)]
pub struct AuthGuard {
    listener: &'static str,
    entries: Mutex<HashMap<IpAddr, Entry>>,
}

impl AuthGuard {
    #[must_use]
    pub fn new(listener: &'static str, metrics: &Metrics) -> Self {
        // Every label from the start, so that `increase()` sees the first one.
        metrics.http_auth_failures_total.with_label_values(&[listener]);
        metrics.http_auth_refused_total.with_label_values(&[listener]);
        Self { listener, entries: Mutex::new(HashMap::new()) }
    }

    /// `Err(wait)` while `addr` must wait after its failures.
    ///
    /// # Errors
    /// How long it still waits.
    pub fn check(&self, addr: Option<IpAddr>, metrics: &Metrics) -> Result<(), Duration> {
        let Some(addr) = addr.map(super::edge::address_key) else { return Ok(()) };
        let now = Instant::now();
        let entries = self.entries.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        match entries.get(&addr).and_then(|e| e.blocked_until).filter(|until| *until > now) {
            Some(until) => {
                metrics.http_auth_refused_total.with_label_values(&[self.listener]).inc();
                Err(until - now)
            }
            None => Ok(()),
        }
    }

    /// Counts a failure of `addr` (`what` says which credential failed), logs it unless
    /// this address was logged in the last minute, and starts or lengthens its wait.
    pub fn failed(&self, addr: Option<IpAddr>, what: &str, metrics: &Metrics) {
        metrics.http_auth_failures_total.with_label_values(&[self.listener]).inc();
        let Some(addr) = addr.map(super::edge::address_key) else {
            warn!(listener = self.listener, what, "Failed authentication from an unknown address.");
            return;
        };
        let now = Instant::now();
        let mut entries = self.entries.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if entries.len() >= REMEMBERED && !entries.contains_key(&addr) {
            forget_quietest(&mut entries);
        }
        let e = entries.entry(addr).or_insert(Entry {
            failures: 0,
            window_start: now,
            blocked_until: None,
            backoff: BACKOFF_START,
            logged_at: None,
            unlogged: 0,
            last_seen: now,
        });
        e.last_seen = now;
        if now.duration_since(e.window_start) > WINDOW && e.blocked_until.is_none_or(|u| u <= now) {
            e.failures = 0;
            e.window_start = now;
        }
        e.failures += 1;
        if e.failures > FAILURES {
            let wait = if e.blocked_until.is_some() { (e.backoff * 2).min(BACKOFF_MAX) } else { BACKOFF_START };
            e.backoff = wait;
            e.blocked_until = Some(now + wait);
        }
        if e.logged_at.is_none_or(|at| now.duration_since(at) >= WINDOW) {
            let waits_secs = e.blocked_until.filter(|u| *u > now).map_or(0, |u| (u - now).as_secs().max(1));
            warn!(
                listener = self.listener,
                from = %addr,
                what,
                failures = e.failures,
                since_last_line = e.unlogged,
                waits_secs,
                "Failed authentication."
            );
            e.logged_at = Some(now);
            e.unlogged = 0;
        } else {
            e.unlogged += 1;
        }
    }

    /// Clears what `addr` owed: it authenticated.
    pub fn succeeded(&self, addr: Option<IpAddr>) {
        if let Some(addr) = addr.map(super::edge::address_key) {
            self.entries.lock().unwrap_or_else(std::sync::PoisonError::into_inner).remove(&addr);
        }
    }
}

/// Forgets the tenth of the entries seen least recently.
fn forget_quietest(entries: &mut HashMap<IpAddr, Entry>) {
    let mut seen: Vec<(Instant, IpAddr)> = entries.iter().map(|(a, e)| (e.last_seen, *a)).collect();
    seen.sort_unstable();
    for (_, addr) in seen.into_iter().take(REMEMBERED / 10) {
        entries.remove(&addr);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_address_waits_after_its_failures_and_longer_each_time() {
        let metrics = Metrics::new().unwrap();
        let guard = AuthGuard::new("intake", &metrics);
        let (a, b) = (Some("192.0.2.1".parse().unwrap()), Some("192.0.2.2".parse().unwrap()));
        for _ in 0..FAILURES {
            assert!(guard.check(a, &metrics).is_ok());
            guard.failed(a, "token", &metrics);
        }
        assert!(guard.check(a, &metrics).is_ok(), "the tenth failure still gets a try");
        guard.failed(a, "token", &metrics);
        let first = guard.check(a, &metrics).unwrap_err();
        assert!(first <= BACKOFF_START, "{first:?}");
        assert!(guard.check(b, &metrics).is_ok(), "another address is not held");
        guard.failed(a, "token", &metrics);
        let second = guard.check(a, &metrics).unwrap_err();
        assert!(second > BACKOFF_START, "the wait doubles: {second:?}");
        guard.succeeded(a);
        assert!(guard.check(a, &metrics).is_ok(), "a success clears it");
        let failures = metrics.http_auth_failures_total.with_label_values(&["intake"]).get();
        assert_eq!(failures, u64::from(FAILURES + 2));
        assert_eq!(metrics.http_auth_refused_total.with_label_values(&["intake"]).get(), 2);
    }
}
