//! The one backoff curve of tally: `initial * multiplier^n`, capped at `max`. Record
//! retries, dependency probes, notification retry topics, dead-letter writes, the outbox
//! publisher and the LISTEN connection all wait along it.

use std::time::Duration;

/// An exponential curve, capped.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Backoff {
    pub initial: Duration,
    pub multiplier: f64,
    pub max: Duration,
}

impl Backoff {
    /// From `initial`, doubling, at most `max`.
    #[must_use]
    pub const fn doubling(initial: Duration, max: Duration) -> Self {
        Self { initial, multiplier: 2.0, max }
    }

    /// The `n`-th wait, from 0: `initial * multiplier^n`, at most `max`.
    #[must_use]
    pub fn nth(&self, n: u32) -> Duration {
        let factor = self.multiplier.powi(i32::try_from(n).unwrap_or(i32::MAX));
        let wait = self.initial.as_secs_f64() * factor;
        if wait.is_finite() && wait < self.max.as_secs_f64() {
            Duration::from_secs_f64(wait.max(0.0))
        } else {
            self.max
        }
    }

    /// The `n`-th wait in whole milliseconds, computed in milliseconds and truncated:
    /// exact and stable where the wait names something (the notification retry topics are
    /// named by it), which rounding through seconds would not be (1000 ms x 1.4^2 is
    /// 1959.999... ms: 1959 here, 1960 through nanoseconds).
    #[must_use]
    pub fn nth_millis(&self, n: u32) -> u64 {
        let initial = self.initial.as_millis() as f64;
        let max = self.max.as_millis() as f64;
        let wait = initial * self.multiplier.powi(i32::try_from(n).unwrap_or(i32::MAX));
        if wait.is_finite() {
            wait.min(max).max(0.0) as u64
        } else {
            max as u64
        }
    }

    /// The wait after `previous` (the first wait when `None`).
    #[must_use]
    pub fn after(&self, previous: Option<Duration>) -> Duration {
        match previous {
            None => self.initial.min(self.max),
            Some(p) => {
                let next = p.as_secs_f64() * self.multiplier;
                if next.is_finite() && next < self.max.as_secs_f64() {
                    Duration::from_secs_f64(next.max(0.0))
                } else {
                    self.max
                }
            }
        }
    }

    /// A sequence of waits along this curve, for a loop that retries until it succeeds.
    #[must_use]
    pub fn waits(self) -> Waits {
        Waits { curve: self, last: None }
    }
}

/// The state of one retry loop: each [`Waits::next_wait`] is longer, up to the cap;
/// [`Waits::reset`] after a success.
#[derive(Debug, Clone)]
pub struct Waits {
    curve: Backoff,
    last: Option<Duration>,
}

impl Waits {
    /// The next wait.
    pub fn next_wait(&mut self) -> Duration {
        let wait = self.curve.after(self.last);
        self.last = Some(wait);
        wait
    }

    /// Back to the first wait.
    pub fn reset(&mut self) {
        self.last = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: fn(u64) -> Duration = Duration::from_millis;

    #[test]
    fn the_curve_grows_then_stays_at_its_cap() {
        let b = Backoff { initial: MS(500), multiplier: 2.0, max: Duration::from_secs(15) };
        let waits: Vec<u64> = (0..7).map(|n| b.nth(n).as_millis() as u64).collect();
        assert_eq!(waits, [500, 1000, 2000, 4000, 8000, 15_000, 15_000]);
        assert_eq!(b.nth(u32::MAX), Duration::from_secs(15), "no overflow");
        let flat = Backoff { initial: MS(300), multiplier: 1.0, max: Duration::from_secs(1) };
        assert_eq!(flat.nth(9), MS(300));
    }

    #[test]
    fn a_loop_walks_the_curve_and_starts_again_after_a_success() {
        let mut w = Backoff::doubling(MS(200), MS(1000)).waits();
        let seen: Vec<u64> = (0..5).map(|_| w.next_wait().as_millis() as u64).collect();
        assert_eq!(seen, [200, 400, 800, 1000, 1000]);
        w.reset();
        assert_eq!(w.next_wait(), MS(200));
        assert_eq!(Backoff::doubling(MS(5000), MS(1000)).after(None), MS(1000), "the cap bounds the first wait too");
    }
}
