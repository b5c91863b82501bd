//! A partition's stash: the records librdkafka handed over that the partition's queue
//! could not take yet, kept in offset order so that a full queue does not pause the
//! partition (a pause drops librdkafka's prefetch for it). The partition is held (paused)
//! once its stash is full or its next record cannot go, and fetches again once the stash
//! is down to half with every record in it ready.

use std::sync::{Arc, PoisonError};

use rdkafka::consumer::{BaseConsumer, Consumer};
use tokio::sync::mpsc;

use super::assignment::{DriverContext, DriverState, Slot, TopicPartition};
use super::driver::apply;
use super::pause::Fetch;
use super::Record;

/// Hands `record` to its partition's queue, or to the stash when the queue is full or the
/// stash already holds older records; holds the partition as [`hold`] says.
pub(super) fn route(consumer: &BaseConsumer<DriverContext>, shared: &DriverState, record: Arc<Record>) {
    let mut slots = shared.slots();
    let tp = (record.topic.clone(), record.partition);
    let Some(slot) = slots.get_mut(&tp) else {
        // Not (or no longer) ours: it stays uncommitted and goes to the partition's owner.
        return;
    };
    let ready = is_ready(shared, slot, &record);
    if !slot.stash.is_empty() || !ready {
        slot.stash.push_back(record);
        if !ready || slot.stash.len() >= shared.spec.queue_capacity() {
            hold(consumer, shared, &tp);
        }
        return;
    }
    let offset = record.offset;
    match slot.tx.try_send(record) {
        Ok(()) => taken(consumer, slot, &tp, offset),
        // The queue is full: the stash takes what librdkafka already fetched, up to a second
        // queue's worth, so that a partition under back-pressure keeps its prefetch instead
        // of dropping it at every pause.
        Err(mpsc::error::TrySendError::Full(record)) => slot.stash.push_back(record),
        Err(mpsc::error::TrySendError::Closed(_)) => lost(shared, &tp),
    }
}

/// Pauses a partition whose records in hand reached their bound: the stash full, or its
/// next record not admitted yet (uncommitted window full, or not yet due).
/// librdkafka drops what it prefetched for it and, on resume, fetches again after the last
/// record handed to tally (the stash's newest).
fn hold(consumer: &BaseConsumer<DriverContext>, shared: &DriverState, tp: &TopicPartition) {
    let fetch = shared.pauses().hold(tp);
    if fetch != Fetch::Unchanged {
        shared.metrics.partition_holds_total.with_label_values(&[&shared.spec.name]).inc();
    }
    apply(consumer, shared, &fetch);
}

/// Whether `record` may go to its partition consumer now: due, and inside the uncommitted
/// window.
pub(super) fn is_ready(shared: &DriverState, slot: &Slot, record: &Record) -> bool {
    is_due(shared, record) && slot.admits(record.offset, shared.spec.max_uncommitted)
}

/// Whether `record` may be handled now (always, unless the pipeline reads a due header). A
/// record that is poison already (unsigned, malformed) is due at once: its due header is
/// no more to be believed than the rest of it, and it must not hold its partition.
pub(super) fn is_due(shared: &DriverState, record: &Record) -> bool {
    if record.defect.is_some() {
        return true;
    }
    let Some(header) = shared.spec.due_header.as_deref() else { return true };
    let Some(due) = record.header_str(header).and_then(|v| v.parse::<i64>().ok()) else { return true };
    due <= chrono::Utc::now().timestamp_millis()
}

/// Hands stashed records over while their queue takes them, and lets a held partition
/// fetch again as [`refetch_due`] says: once its stash is down to half its bound with every
/// record in it ready, the half still in hand covering the refetch.
pub(super) fn flush_stashes(consumer: &BaseConsumer<DriverContext>, shared: &DriverState) {
    let mut slots = shared.slots();
    let bound = shared.spec.queue_capacity();
    for ((topic, partition), slot) in slots.iter_mut() {
        let tp = (topic.clone(), *partition);
        while let Some(record) = slot.stash.pop_front() {
            if !is_ready(shared, slot, &record) {
                slot.stash.push_front(record);
                break;
            }
            let offset = record.offset;
            match slot.tx.try_send(record) {
                Ok(()) => taken(consumer, slot, &tp, offset),
                Err(mpsc::error::TrySendError::Full(record)) => {
                    slot.stash.push_front(record);
                    break;
                }
                Err(mpsc::error::TrySendError::Closed(_)) => {
                    slot.stash.clear();
                    lost(shared, &tp);
                    break;
                }
            }
        }
        // Only a held partition's stash is looked through, at most half a bound of it.
        let held = shared.pauses().is_held(&tp);
        if held && refetch_due(slot.stash.len(), bound, || slot.stash.iter().all(|r| is_ready(shared, slot, r))) {
            let fetch = shared.pauses().release(&tp);
            apply(consumer, shared, &fetch);
        }
    }
}

/// Whether a held partition with `stashed` records in hand (bound `bound`) may fetch
/// again: nothing in hand, or at most half the bound, every one of them able to go now.
/// A partition held for a record not yet due, or for a full uncommitted window, stays
/// held until that record is ready: what it fetched would only be stashed, one record per
/// pause.
pub(super) fn refetch_due(stashed: usize, bound: usize, all_ready: impl FnOnce() -> bool) -> bool {
    stashed == 0 || (stashed <= bound / 2 && all_ready())
}

/// The partition consumer of `tp` stopped while the partition is still ours (its actor
/// died): what it had is uncommitted, and the stage must restart to read it again.
fn lost(shared: &DriverState, tp: &TopicPartition) {
    let reason = format!("the partition consumer of {}/{} stopped", tp.0, tp.1);
    shared.lost.lock().unwrap_or_else(PoisonError::into_inner).get_or_insert(reason);
}

/// A record at `offset` went to its worker.
fn taken(consumer: &BaseConsumer<DriverContext>, slot: &mut Slot, tp: &TopicPartition, offset: i64) {
    slot.first_taken.get_or_insert(offset);
    if crate::faults::is_on(crate::faults::Fault::OffsetBeforeCommit) && offset + 1 > slot.stored {
        // Broken on purpose (test builds only): committed before its effect.
        if consumer.store_offset(&tp.0, tp.1, offset + 1).is_ok() {
            slot.stored = offset + 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::refetch_due;

    #[test]
    fn a_held_partition_fetches_again_at_half_its_bound_when_all_it_holds_can_go() {
        let unreachable = || -> bool { panic!("a full or empty stash is not looked through") };
        assert!(refetch_due(0, 512, unreachable), "nothing in hand");
        assert!(!refetch_due(512, 512, unreachable), "full");
        assert!(!refetch_due(257, 512, unreachable), "more than half");
        assert!(refetch_due(256, 512, || true), "half: the rest covers the refetch");
        assert!(
            !refetch_due(3, 512, || false),
            "a record in hand is not due or not admitted: fetching would only stash more"
        );
    }
}
