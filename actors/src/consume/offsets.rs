//! `OffsetTracker`: per-partition bookkeeping of in-flight records. Records may complete
//! out of order; only the contiguous completed watermark may be stored and committed, so a
//! crash never skips an unfinished record.

use std::collections::BTreeMap;
use std::time::Instant;

#[derive(Debug, Default)]
pub struct OffsetTracker {
    /// Offsets received and not yet below the watermark: `Some(started)` while in flight,
    /// `None` once completed.
    pending: BTreeMap<i64, Option<Instant>>,
    /// The last offset such that it and every earlier received offset completed.
    watermark: Option<i64>,
}

impl OffsetTracker {
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// Registers a received record.
    pub fn begin(&mut self, offset: i64) {
        self.pending.insert(offset, Some(Instant::now()));
    }

    /// Marks `offset` completed. Returns the new watermark when it advanced.
    pub fn complete(&mut self, offset: i64) -> Option<i64> {
        if let Some(state) = self.pending.get_mut(&offset) {
            *state = None;
        }
        let mut advanced = None;
        while let Some(entry) = self.pending.first_entry() {
            if entry.get().is_some() {
                break;
            }
            let (done, _) = entry.remove_entry();
            advanced = Some(done);
        }
        if advanced.is_some() {
            self.watermark = advanced;
        }
        advanced
    }

    /// The last offset that may be committed (the committed position is this + 1).
    #[must_use]
    pub fn watermark(&self) -> Option<i64> {
        self.watermark
    }

    /// Records received and not yet below the watermark (in flight or completed ahead of
    /// an unfinished one).
    #[must_use]
    pub fn in_flight(&self) -> usize {
        self.pending.len()
    }

    /// Records completed but held above the watermark by an unfinished earlier one.
    #[must_use]
    pub fn completed_ahead(&self) -> usize {
        self.pending.values().filter(|started| started.is_none()).count()
    }

    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.pending.is_empty()
    }

    /// When the oldest still unfinished record started, if any.
    #[must_use]
    pub fn oldest_started(&self) -> Option<Instant> {
        self.pending.values().flatten().min().copied()
    }
}

/// Whether the record at `offset` may be taken: fewer than `max_uncommitted` offsets lie
/// between the first uncommitted one (after `watermark`, the last completed offset, -1
/// when none; or the first offset taken under this assignment, when later) and it.
#[must_use]
pub fn window_admits(offset: i64, watermark: i64, first_taken: Option<i64>, max_uncommitted: usize) -> bool {
    let low = first_taken.map_or(offset, |first| first.max(watermark + 1));
    let max = i64::try_from(max_uncommitted).unwrap_or(i64::MAX);
    offset.saturating_sub(low) < max
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_uncommitted_window_is_bounded_from_the_head_of_line() {
        // Nothing taken yet: the first record always fits (whatever its offset).
        assert!(window_admits(500, -1, None, 3));
        // 500 taken and unfinished: 501 and 502 fit, 503 would make four uncommitted.
        assert!(window_admits(502, -1, Some(500), 3));
        assert!(!window_admits(503, -1, Some(500), 3));
        // 500 completed: the window moves on.
        assert!(window_admits(503, 500, Some(500), 3));
        assert!(!window_admits(504, 500, Some(500), 3));
        // A watermark from before this assignment does not widen it.
        assert!(!window_admits(503, 10, Some(500), 3));
    }

    #[test]
    fn watermark_only_advances_over_contiguous_completions() {
        let mut t = OffsetTracker::new();
        for o in [10, 11, 12, 13] {
            t.begin(o);
        }
        assert_eq!(t.complete(12), None, "12 finished before 10 and 11");
        assert_eq!(t.complete(11), None);
        assert_eq!(t.watermark(), None);
        assert_eq!(t.complete(10), Some(12), "10 unblocks 11 and 12");
        assert_eq!(t.in_flight(), 1);
        assert_eq!(t.complete(13), Some(13));
        assert!(t.is_empty());
    }

    #[test]
    fn gaps_in_offsets_do_not_block() {
        // Transaction markers and compaction leave gaps between received offsets.
        let mut t = OffsetTracker::new();
        t.begin(5);
        t.begin(9);
        assert_eq!(t.complete(9), None);
        assert_eq!(t.complete(5), Some(9));
    }

    #[test]
    fn oldest_started_tracks_unfinished_records() {
        let mut t = OffsetTracker::new();
        t.begin(1);
        t.begin(2);
        assert!(t.oldest_started().is_some());
        t.complete(2);
        assert!(t.oldest_started().is_some(), "1 is still unfinished");
        t.complete(1);
        assert!(t.oldest_started().is_none());
    }
}
