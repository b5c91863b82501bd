//! The soak's windows: splitting a run into windows of N processed records and timing
//! them from polls of the processed counter.

/// `rate` over `first` (0 when `first` is not positive).
pub(super) fn ratio(rate: f64, first: f64) -> f64 {
    if first > 0.0 {
        rate / first
    } else {
        0.0
    }
}

/// A window that just ended.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) struct Closed {
    /// Records processed at its end.
    pub(super) end: u64,
    pub(super) seconds: f64,
    pub(super) rate: f64,
}

/// Splits a run of `total` processed records into windows of `size` (the last one may be
/// shorter) and times them from polls of the processed counter: a window ends when the
/// counter crosses its mark, at the time interpolated between the two polls around it.
#[derive(Debug, Clone)]
pub(super) struct Windows {
    size: u64,
    total: u64,
    /// Windows closed so far.
    closed: u64,
    /// When the last window closed (the run's start at first), seconds.
    closed_at: f64,
    /// The previous poll: (seconds, processed).
    previous: (f64, f64),
}

impl Windows {
    pub(super) fn new(size: u64, total: u64) -> Self {
        Self { size: size.max(1), total, closed: 0, closed_at: 0.0, previous: (0.0, 0.0) }
    }

    /// The processed count that ends the current window, if any is left.
    fn mark(&self) -> Option<u64> {
        let start = self.closed * self.size;
        (start < self.total).then(|| (start + self.size).min(self.total))
    }

    /// A poll at `at` seconds saw `processed` records: the windows it ended.
    pub(super) fn observe(&mut self, at: f64, processed: f64) -> Vec<Closed> {
        let mut ended = Vec::new();
        while let Some(mark) = self.mark().filter(|m| processed >= *m as f64) {
            let start = self.closed * self.size;
            let when = crossing(self.previous, (at, processed), mark as f64);
            let seconds = when - self.closed_at;
            let records = (mark - start) as f64;
            ended.push(Closed { end: mark, seconds, rate: records / seconds.max(1e-6) });
            self.closed += 1;
            self.closed_at = when;
        }
        self.previous = (at, processed);
        ended
    }
}

/// When a counter polled at `before` and `after` (seconds, count) passed `mark`, by linear
/// interpolation; `after`'s time when it did not move.
fn crossing(before: (f64, f64), after: (f64, f64), mark: f64) -> f64 {
    let moved = after.1 - before.1;
    if moved <= 0.0 {
        return after.0;
    }
    before.0 + (after.0 - before.0) * ((mark - before.1) / moved).clamp(0.0, 1.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_crossing_is_interpolated_between_polls() {
        assert_eq!(crossing((0.0, 0.0), (2.0, 100.0), 50.0), 1.0);
        assert_eq!(crossing((1.0, 100.0), (2.0, 100.0), 100.0), 2.0, "a counter that did not move");
        assert_eq!(crossing((1.0, 80.0), (3.0, 120.0), 100.0), 2.0);
    }

    #[test]
    fn windows_close_at_their_marks_and_the_last_may_be_short() {
        let mut w = Windows::new(100, 250);
        assert_eq!(w.observe(1.0, 50.0), []);
        // 50 -> 150 between 1 s and 2 s: 100 crossed at 1.5 s.
        assert_eq!(w.observe(2.0, 150.0), [Closed { end: 100, seconds: 1.5, rate: 100.0 / 1.5 }]);
        // One poll across two marks: 200 at 2.5 s, 250 (the short last window) at 3 s.
        let both = w.observe(3.0, 250.0);
        assert_eq!(
            both,
            [Closed { end: 200, seconds: 1.0, rate: 100.0 }, Closed { end: 250, seconds: 0.5, rate: 100.0 }]
        );
        assert_eq!(w.observe(4.0, 260.0), [], "no window after the total");
        assert_eq!(w.mark(), None);
    }

    #[test]
    fn a_ratio_to_a_missing_first_window_is_zero() {
        assert_eq!(ratio(80.0, 100.0), 0.8);
        assert_eq!(ratio(80.0, 0.0), 0.0);
    }
}
