//! The driver loop of a pipeline: polls, routes records to their partition's queue or
//! stash (`stash.rs`), serves pause and resume, follows the dependency health, stores
//! watermarks and publishes gauges and status.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, PoisonError};
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::Message;
use rdkafka::TopicPartitionList;
use tracing::{debug, info, warn};

use super::assignment::{DriverContext, DriverState, TopicPartition};
use super::pause::Fetch;
use super::stall::{Look, PartitionLook};
use super::stash::{flush_stashes, is_due, is_ready, route};
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
                    crate::faults::hang_on_stop();
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
                        let mut record = Record::from_message(&message);
                        shared.spec.keyring.check(&mut record);
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
pub(super) fn apply(consumer: &BaseConsumer<DriverContext>, shared: &DriverState, fetch: &Fetch) {
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
