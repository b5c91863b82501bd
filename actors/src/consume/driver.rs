//! The driver loop of a pipeline: polls, routes records to their partition's queue or,
//! when it is full, to the partition's stash (holding the partition once the stash is full
//! or its next record cannot go: uncommitted window full, not yet due), serves pause and
//! resume, follows the dependency health, stores
//! watermarks and publishes gauges and status.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, PoisonError};
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::Message;
use rdkafka::TopicPartitionList;
use tokio::sync::mpsc;
use tracing::{debug, info, warn};

use super::assignment::{DriverContext, DriverState, Slot, TopicPartition};
use super::pause::Fetch;
use super::stall::{Look, PartitionLook};
use super::{Control, PartitionStatus, Record};

/// The driver thread's loop: serve control commands, follow dependency health, poll,
/// route records, store watermarks. Over 80 lines because it is one loop whose steps
/// share the poll's state; each step is a function of its own below.
pub(super) fn drive(
    consumer: &BaseConsumer<DriverContext>,
    shared: &Arc<DriverState>,
    control: &std::sync::mpsc::Receiver<Control>,
) -> Result<(), String> {
    let name = shared.spec.name.clone();
    // An admin pause outlives a restart of the stage.
    shared.pauses().set_admin(shared.admin_paused());
    // A new consumer: the watchdog starts over.
    shared.stall.lock().unwrap_or_else(PoisonError::into_inner).reset();
    *shared.join_state.lock().unwrap_or_else(PoisonError::into_inner) = None;
    let mut last_gauges = Instant::now();
    let mut last_passivation = Instant::now();
    let mut last_lag = Instant::now();
    loop {
        while let Ok(c) = control.try_recv() {
            match c {
                Control::Stop(done) => {
                    info!(pipeline = %name, "Stopping: no more fetching; draining in-flight records.");
                    let all: Vec<TopicPartition> = shared.slots().keys().cloned().collect();
                    shared.revoke(consumer, &all);
                    consumer.unsubscribe();
                    let _ = done.send(());
                    return Ok(());
                }
                Control::Pause(applied) => {
                    let fetch = shared.pauses().pause();
                    apply(consumer, shared, &fetch);
                    shared.status.lock().unwrap_or_else(PoisonError::into_inner).paused = true;
                    shared.metrics.pipeline_paused.with_label_values(&[&name]).set(1);
                    info!(pipeline = %name, "Pipeline paused.");
                    let _ = applied.send(());
                }
                Control::Resume(applied) => {
                    shared.status.lock().unwrap_or_else(PoisonError::into_inner).paused = false;
                    shared.metrics.pipeline_paused.with_label_values(&[&name]).set(0);
                    // While degraded the partitions stay paused; resumed when it ends.
                    let fetch = shared.pauses().resume();
                    apply(consumer, shared, &fetch);
                    let _ = applied.send(());
                    info!(pipeline = %name, "Pipeline resumed.");
                }
            }
        }
        follow_health(consumer, shared);
        let ready = shared.slots().values().any(|s| s.stash.front().is_some_and(|r| is_ready(shared, s, r)));
        let waiting = shared.slots().values().any(|s| !s.stash.is_empty());
        let timeout = Duration::from_millis(if ready {
            5
        } else if waiting {
            20
        } else {
            100
        });
        match consumer.poll(timeout) {
            Some(Ok(message)) => {
                let at = (message.topic().to_owned(), message.partition(), message.offset());
                // A record that crashed this stage twice is not decoded a third time.
                let record = match shared.crashes.poison_pill(&at) {
                    // Decoding is total; its headers say where a retry record came from.
                    Some(defect) => Record { defect: Some(defect), ..Record::from_message(&message) },
                    None => {
                        shared.crashes.hold(Some(at));
                        let record = Record::from_message(&message);
                        crate::faults::crash_on_marked(&record);
                        record
                    }
                };
                drop(message);
                route(consumer, shared, Arc::new(record));
                shared.crashes.hold(None);
            }
            Some(Err(e)) => crate::kafka_clients::log_consumer_error(&name, &e),
            None => {}
        }
        if let Some(fatal) = crate::kafka_clients::fatal_consumer_error(consumer.client()) {
            return Err(fatal);
        }
        if shared.pauses().flowing() {
            flush_stashes(consumer, shared);
        }
        if let Some(lost) = shared.lost.lock().unwrap_or_else(PoisonError::into_inner).take() {
            // An actor of this stage is gone: restart the stage from the committed offsets.
            return Err(lost);
        }
        store_watermarks(consumer, shared);
        if last_gauges.elapsed() >= Duration::from_millis(500) {
            last_gauges = Instant::now();
            if let Some(stall) = watch_stall(shared) {
                // Whatever holds its records does not let go: neither the drain nor the
                // keys' workers wait for them again.
                shared.stalled.store(true, Ordering::Release);
                let abandoned = shared.registry.lock().unwrap_or_else(PoisonError::into_inner).abandon_busy();
                warn!(pipeline = %name, stall, abandoned,
                      "Pipeline stalled; its busy workers abandoned, the stage restarts from its committed offsets.");
                return Err(stall);
            }
            publish_gauges(shared);
        }
        if last_lag.elapsed() >= Duration::from_secs(2) {
            last_lag = Instant::now();
            refresh_lag(consumer, shared);
        }
        if last_passivation.elapsed() >= Duration::from_secs(5) {
            last_passivation = Instant::now();
            shared.registry.lock().unwrap_or_else(PoisonError::into_inner).passivate_idle();
        }
    }
}

/// Makes the consumer fetch as `fetch` says.
fn apply(consumer: &BaseConsumer<DriverContext>, shared: &DriverState, fetch: &Fetch) {
    let result = match fetch {
        Fetch::Unchanged => Ok(()),
        Fetch::PauseAll => consumer.assignment().and_then(|tpl| consumer.pause(&tpl)),
        Fetch::ResumeUnheld => consumer.assignment().and_then(|tpl| {
            // Not those held by backpressure, the uncommitted window or a not-yet-due
            // record: the stash flush resumes them.
            let pauses = shared.pauses();
            let mut ready = TopicPartitionList::new();
            for e in tpl.elements().iter().filter(|e| !pauses.is_held(&(e.topic().to_owned(), e.partition()))) {
                ready.add_partition(e.topic(), e.partition());
            }
            drop(pauses);
            consumer.resume(&ready)
        }),
        Fetch::Pause((topic, partition)) => consumer.pause(&tpl_of(topic, *partition)),
        Fetch::Resume((topic, partition)) => consumer.resume(&tpl_of(topic, *partition)),
    };
    if let Err(e) = result {
        warn!(pipeline = %shared.spec.name, error = %e, ?fetch, "Cannot pause or resume partitions.");
    }
}

/// Pauses the assignment when the pipeline became degraded (a record waits for an
/// unavailable dependency) and resumes it when no record waits any more, unless the
/// pipeline is paused through the admin API.
fn follow_health(consumer: &BaseConsumer<DriverContext>, shared: &DriverState) {
    let name = &shared.spec.name;
    let degraded = shared.health.is_degraded();
    let Some(fetch) = shared.pauses().health(degraded) else { return };
    shared.metrics.pipeline_degraded.with_label_values(&[name]).set(i64::from(degraded));
    apply(consumer, shared, &fetch);
    if degraded {
        let reason = shared.health.degradation().map(|d| d.reason).unwrap_or_default();
        warn!(pipeline = %name, reason, "Pipeline degraded: a dependency is unavailable; partitions paused.");
    } else {
        info!(pipeline = %name, "Dependency available again; pipeline resumed.");
    }
    publish_gauges(shared);
}

fn tpl_of(topic: &str, partition: i32) -> TopicPartitionList {
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition(topic, partition);
    tpl
}

fn route(consumer: &BaseConsumer<DriverContext>, shared: &DriverState, record: Arc<Record>) {
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
fn is_ready(shared: &DriverState, slot: &Slot, record: &Record) -> bool {
    is_due(shared, record) && slot.admits(record.offset, shared.spec.max_uncommitted)
}

/// Whether `record` may be handled now (always, unless the pipeline reads a due header).
fn is_due(shared: &DriverState, record: &Record) -> bool {
    let Some(header) = shared.spec.due_header.as_deref() else { return true };
    let Some(due) = record.header_str(header).and_then(|v| v.parse::<i64>().ok()) else { return true };
    due <= chrono::Utc::now().timestamp_millis()
}

/// Hands stashed records over while their queue takes them, and lets a held partition
/// fetch again once its stash is down to half its bound with a ready record at its head:
/// the half still in hand covers the refetch.
fn flush_stashes(consumer: &BaseConsumer<DriverContext>, shared: &DriverState) {
    let mut slots = shared.slots();
    let bound = shared.spec.queue_capacity();
    for ((topic, partition), slot) in slots.iter_mut() {
        while let Some(record) = slot.stash.pop_front() {
            if !is_ready(shared, slot, &record) {
                slot.stash.push_front(record);
                break;
            }
            let offset = record.offset;
            match slot.tx.try_send(record) {
                Ok(()) => taken(consumer, slot, &(topic.clone(), *partition), offset),
                Err(mpsc::error::TrySendError::Full(record)) => {
                    slot.stash.push_front(record);
                    break;
                }
                Err(mpsc::error::TrySendError::Closed(_)) => {
                    slot.stash.clear();
                    lost(shared, &(topic.clone(), *partition));
                    break;
                }
            }
        }
        // Only a held partition's stash is looked through, at most half a bound of it.
        let tp = (topic.clone(), *partition);
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

fn store_watermarks(consumer: &BaseConsumer<DriverContext>, shared: &DriverState) {
    for ((topic, partition), slot) in shared.slots().iter_mut() {
        let watermark = slot.shared.watermark.load(Ordering::Acquire);
        if watermark > slot.stored {
            match consumer.store_offset(topic, *partition, watermark) {
                Ok(()) => slot.stored = watermark,
                Err(e) => debug!(pipeline = %shared.spec.name, topic, partition, error = %e, "Cannot store offset."),
            }
        }
    }
}

/// Lag = the broker's high watermark - the next offset this pipeline will commit. Asked of
/// the broker because librdkafka's own figure goes stale while a partition is paused.
fn refresh_lag(consumer: &BaseConsumer<DriverContext>, shared: &DriverState) {
    let positions: Vec<(TopicPartition, i64)> = {
        let stats = shared.stats.lock().unwrap_or_else(PoisonError::into_inner);
        shared
            .slots()
            .iter()
            .map(|(tp, slot)| {
                let committed = stats.get(tp).map_or(-1, |(c, _)| *c);
                (tp.clone(), if slot.stored >= 0 { slot.stored + 1 } else { committed })
            })
            .collect()
    };
    let mut lags = HashMap::with_capacity(positions.len());
    for ((topic, partition), next) in positions {
        if let Ok((low, high)) = consumer.fetch_watermarks(&topic, partition, Duration::from_millis(500)) {
            let lag = (high - if next >= 0 { next } else { low }).max(0);
            shared.metrics.consumer_lag.with_label_values(&[&shared.spec.name, &partition.to_string()]).set(lag);
            lags.insert((topic, partition), lag);
        }
    }
    *shared.lags.lock().unwrap_or_else(PoisonError::into_inner) = lags;
}

/// Takes the watchdog's look at the pipeline (see `stall.rs`); the stall, once it lasted
/// the pipeline's `stall_after`.
fn watch_stall(shared: &DriverState) -> Option<String> {
    // Lag alone is not work: on a topic written in transactions the high watermark stays
    // past the last record (its commit marker) with nothing left to read.
    let partitions = shared
        .slots()
        .iter()
        .map(|(tp, slot)| {
            let due = slot.stash.front().is_none_or(|r| is_due(shared, r));
            let work = slot.shared.in_flight.load(Ordering::Relaxed) > 0 || !slot.stash.is_empty();
            PartitionLook {
                tp: tp.clone(),
                watermark: slot.shared.watermark.load(Ordering::Acquire),
                waiting: due && work,
            }
        })
        .collect();
    let look = Look {
        partitions,
        held_on_purpose: !shared.pauses().flowing(),
        join_state: shared.join_state.lock().unwrap_or_else(PoisonError::into_inner).clone(),
    };
    let now = Instant::now();
    let mut watch = shared.stall.lock().unwrap_or_else(PoisonError::into_inner);
    let stall = watch.look(now, &look);
    shared.status.lock().unwrap_or_else(PoisonError::into_inner).stalled_seconds = watch.waiting_for(now);
    stall
}

fn publish_gauges(shared: &DriverState) {
    let name = &shared.spec.name;
    let mut oldest = 0_u64;
    for ((_, partition), slot) in shared.slots().iter() {
        let in_flight = slot.in_hand();
        shared.metrics.inflight.with_label_values(&[name, &partition.to_string()]).set(in_flight as i64);
        oldest = oldest.max(slot.shared.oldest_age_ms.load(Ordering::Relaxed));
    }
    shared.metrics.oldest_inflight_age_seconds.with_label_values(&[name]).set(oldest as f64 / 1000.0);
    let live = shared.registry.lock().unwrap_or_else(PoisonError::into_inner).live();
    shared.metrics.live_actors.with_label_values(&[name]).set(live as i64);

    let stats = shared.stats.lock().unwrap_or_else(PoisonError::into_inner).clone();
    let pauses = shared.pauses().clone();
    let lags = shared.lags.lock().unwrap_or_else(PoisonError::into_inner).clone();
    let mut partitions: Vec<PartitionStatus> = shared
        .slots()
        .iter()
        .map(|((topic, partition), slot)| {
            let committed = stats.get(&(topic.clone(), *partition)).map_or(-1, |(c, _)| *c);
            let lag = lags.get(&(topic.clone(), *partition)).copied().unwrap_or(-1);
            PartitionStatus {
                topic: topic.clone(),
                partition: *partition,
                committed_offset: (committed >= 0).then_some(committed),
                stored_offset: (slot.stored >= 0).then_some(slot.stored + 1),
                lag: (lag >= 0).then_some(lag),
                in_flight: slot.in_hand(),
                held: pauses.is_held(&(topic.clone(), *partition)),
            }
        })
        .collect();
    partitions.sort_by(|a, b| (&a.topic, a.partition).cmp(&(&b.topic, b.partition)));
    let degradation = shared.health.degradation();
    let mut status = shared.status.lock().unwrap_or_else(PoisonError::into_inner);
    status.partitions = partitions;
    status.keys_in_retry = shared.in_retry.load(Ordering::Relaxed);
    status.oldest_in_flight_seconds = oldest as f64 / 1000.0;
    status.live_workers = live;
    status.degraded = degradation.is_some();
    status.waiting_for_dependency = degradation.as_ref().map_or(0, |d| d.waiting);
    status.degraded_seconds = degradation.as_ref().map(|d| d.since.as_secs_f64());
    status.degraded_reason = degradation.map(|d| d.reason);
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
