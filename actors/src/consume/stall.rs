//! The watchdog of a pipeline: a stage that stopped making progress for a reason nobody
//! foresaw is restarted from its committed offsets instead of standing still.
//!
//! Two signs, each held for the pipeline's `stall_after`:
//! - **Records wait and none finishes.** Some assigned partition has work (records in
//!   flight, or a record in hand that is due) and no partition's completed watermark
//!   moved. Not while the pipeline is paused from the admin API or degraded (a record
//!   waits for an unavailable dependency: that has its own report), and not for a
//!   partition whose next record is a retry not yet due.
//! - **Out of the group.** The consumer is not in a steady generation of its group (it
//!   lost its assignment and has not got a new one, whatever the cause).
//!
//! Every wait a record may rightly spend is bounded by its retry sequence, so
//! `stall_after` is kept above the worst case of that sequence.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use super::assignment::TopicPartition;

/// What the driver sees of one assigned partition.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct PartitionLook {
    pub tp: TopicPartition,
    /// The completed watermark.
    pub watermark: i64,
    /// Records wait for it: in flight, or in hand and due.
    pub waiting: bool,
}

/// What the driver sees of the pipeline at one look.
#[derive(Debug, Clone, Default)]
pub(super) struct Look {
    pub partitions: Vec<PartitionLook>,
    /// Paused from the admin API or degraded: standing still is meant.
    pub held_on_purpose: bool,
    /// librdkafka's group join state (`steady` once in a generation), when known.
    pub join_state: Option<String>,
}

/// The two signs of a stall and since when each holds.
#[derive(Debug)]
pub(super) struct StallWatch {
    after: Duration,
    watermarks: HashMap<TopicPartition, i64>,
    waiting_since: Option<Instant>,
    out_of_group_since: Option<(Instant, String)>,
}

impl StallWatch {
    pub(super) fn new(after: Duration) -> Self {
        Self { after, watermarks: HashMap::new(), waiting_since: None, out_of_group_since: None }
    }

    /// Takes a look at `now`; the reason once a sign has held for `stall_after`.
    pub(super) fn look(&mut self, now: Instant, look: &Look) -> Option<String> {
        // A partition newly assigned counts as a move: a rebalance is progress of a kind.
        let moved = look.partitions.iter().any(|p| self.watermarks.get(&p.tp) != Some(&p.watermark));
        self.watermarks = look.partitions.iter().map(|p| (p.tp.clone(), p.watermark)).collect();
        let waiting = look.partitions.iter().any(|p| p.waiting);
        if moved || !waiting || look.held_on_purpose {
            self.waiting_since = None;
        } else {
            self.waiting_since.get_or_insert(now);
        }
        match look.join_state.as_deref() {
            Some(state) if state != "steady" => {
                let since = self.out_of_group_since.get_or_insert_with(|| (now, String::new()));
                state.clone_into(&mut since.1);
            }
            _ => self.out_of_group_since = None,
        }
        if let Some(since) = self.waiting_since.filter(|s| now.duration_since(*s) >= self.after) {
            let waiting: Vec<String> =
                look.partitions.iter().filter(|p| p.waiting).map(|p| format!("{}/{}", p.tp.0, p.tp.1)).collect();
            return Some(format!(
                "stalled: records waited on {} and none finished for {} s",
                waiting.join(", "),
                now.duration_since(since).as_secs()
            ));
        }
        if let Some((since, state)) =
            self.out_of_group_since.as_ref().filter(|(s, _)| now.duration_since(*s) >= self.after)
        {
            return Some(format!(
                "stalled: out of a steady consumer group for {} s (join state {state})",
                now.duration_since(*since).as_secs()
            ));
        }
        None
    }

    /// Seconds since records have waited with none finished, while they do.
    pub(super) fn waiting_for(&self, now: Instant) -> Option<f64> {
        self.waiting_since.map(|s| now.duration_since(s).as_secs_f64())
    }

    /// Starts over (a new consumer).
    pub(super) fn reset(&mut self) {
        *self = Self::new(self.after);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const AFTER: Duration = Duration::from_secs(60);

    fn part(p: i32, watermark: i64, waiting: bool) -> PartitionLook {
        PartitionLook { tp: ("t".to_owned(), p), watermark, waiting }
    }

    fn look(partitions: Vec<PartitionLook>) -> Look {
        Look { partitions, held_on_purpose: false, join_state: Some("steady".to_owned()) }
    }

    fn secs(s: u64) -> Duration {
        Duration::from_secs(s)
    }

    #[test]
    fn records_waiting_with_none_finished_for_stall_after_is_a_stall() {
        let t0 = Instant::now();
        let mut w = StallWatch::new(AFTER);
        let stuck = look(vec![part(0, 5, true), part(1, 9, false)]);
        assert_eq!(w.look(t0, &stuck), None, "the first look sees the partitions arrive");
        assert_eq!(w.look(t0 + secs(1), &stuck), None);
        assert_eq!(w.look(t0 + secs(60), &stuck), None, "59 s without a move");
        let reason = w.look(t0 + secs(61), &stuck).expect("a stall");
        assert!(reason.contains("t/0") && !reason.contains("t/1") && reason.contains("60 s"), "{reason}");
    }

    #[test]
    fn any_move_of_a_watermark_starts_the_wait_over() {
        let t0 = Instant::now();
        let mut w = StallWatch::new(AFTER);
        w.look(t0, &look(vec![part(0, 5, true), part(1, 9, true)]));
        w.look(t0 + secs(1), &look(vec![part(0, 5, true), part(1, 9, true)]));
        assert_eq!(w.look(t0 + secs(50), &look(vec![part(0, 5, true), part(1, 10, true)])), None);
        assert_eq!(w.look(t0 + secs(51), &look(vec![part(0, 5, true), part(1, 10, true)])), None);
        assert_eq!(w.look(t0 + secs(110), &look(vec![part(0, 5, true), part(1, 10, true)])), None, "59 s since");
        assert!(w.look(t0 + secs(111), &look(vec![part(0, 5, true), part(1, 10, true)])).is_some());
    }

    #[test]
    fn nothing_waiting_or_standing_still_on_purpose_is_no_stall() {
        let t0 = Instant::now();
        let mut idle = StallWatch::new(AFTER);
        let mut paused = StallWatch::new(AFTER);
        let on_purpose = Look { held_on_purpose: true, ..look(vec![part(0, 5, true)]) };
        for s in [0, 1, 100, 1_000] {
            assert_eq!(idle.look(t0 + secs(s), &look(vec![part(0, 5, false)])), None);
            assert_eq!(paused.look(t0 + secs(s), &on_purpose), None);
        }
        assert_eq!(paused.waiting_for(t0 + secs(1_000)), None);
        // Resumed: the wait starts then, not at the pause.
        assert_eq!(paused.look(t0 + secs(1_001), &look(vec![part(0, 5, true)])), None);
        assert_eq!(paused.waiting_for(t0 + secs(1_031)), Some(30.0));
    }

    #[test]
    fn out_of_a_steady_group_for_stall_after_is_a_stall_even_while_paused() {
        let t0 = Instant::now();
        let mut w = StallWatch::new(AFTER);
        let rejoining = Look { held_on_purpose: true, join_state: Some("wait-join".to_owned()), partitions: vec![] };
        assert_eq!(w.look(t0, &rejoining), None);
        assert_eq!(w.look(t0 + secs(59), &rejoining), None);
        let reason = w.look(t0 + secs(60), &rejoining).expect("a stall");
        assert!(reason.contains("wait-join") && reason.contains("60 s"), "{reason}");
        // Back in the group in time: no stall.
        let mut back = StallWatch::new(AFTER);
        back.look(t0, &rejoining);
        back.look(t0 + secs(30), &look(vec![]));
        assert_eq!(back.look(t0 + secs(70), &rejoining), None, "out again since 70 s only");
        assert_eq!(back.look(t0 + secs(129), &rejoining), None);
        assert!(back.look(t0 + secs(130), &rejoining).is_some());
    }

    #[test]
    fn a_reset_forgets_both_signs() {
        let t0 = Instant::now();
        let mut w = StallWatch::new(AFTER);
        let stuck = Look { join_state: None, ..look(vec![part(0, 5, true)]) };
        w.look(t0, &stuck);
        w.look(t0 + secs(1), &stuck);
        w.reset();
        assert_eq!(w.look(t0 + secs(100), &stuck), None, "its partitions are new to it");
        assert_eq!(w.look(t0 + secs(101), &stuck), None);
        assert!(w.look(t0 + secs(161), &stuck).is_some());
    }
}
