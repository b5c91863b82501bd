//! The partitions a pipeline holds: one [`Slot`] per assigned partition (its
//! `PartitionConsumer`, queue, stash and lease), assigned and revoked by the rebalance
//! callbacks of [`DriverContext`], which run on the driver thread.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Instant;

use actix::prelude::*;
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer, ConsumerContext, Rebalance};
use rdkafka::error::KafkaResult;
use rdkafka::{ClientContext, Statistics, TopicPartitionList};
use tokio::sync::mpsc;
use tracing::{debug, error, info, warn};

use super::pause::PauseState;
use super::stall::StallWatch;
use super::{
    record_stats, window_admits, Drain, Lease, PartitionConsumer, PartitionShared, PipelineSpec, PipelineStatus,
    Record, Release, WorkerRegistry,
};
use crate::metrics::Metrics;
use crate::supervise::restart::{CrashBook, Restarts};
use crate::supervise::DependencyHealth;

/// Committed offset and lag per partition, from librdkafka statistics.
pub(crate) type StatsView = HashMap<TopicPartition, (i64, i64)>;

pub(super) struct Slot {
    pub(super) addr: Addr<PartitionConsumer>,
    pub(super) tx: mpsc::Sender<Arc<Record>>,
    pub(super) shared: Arc<PartitionShared>,
    pub(super) stored: i64,
    pub(super) stash: VecDeque<Arc<Record>>,
    /// This assignment's lease: drained then revoked when the partition is given up.
    pub(super) lease: Lease,
    /// The offset of the first record handed over under this assignment.
    pub(super) first_taken: Option<i64>,
}

impl Slot {
    /// Whether `offset` may be handed over without passing the uncommitted window.
    pub(super) fn admits(&self, offset: i64, max_uncommitted: usize) -> bool {
        window_admits(offset, self.shared.watermark.load(Ordering::Acquire), self.first_taken, max_uncommitted)
    }

    /// Records received and not finished: in flight, queued for the partition consumer,
    /// and stashed.
    pub(super) fn in_hand(&self) -> usize {
        let queued = self.tx.max_capacity() - self.tx.capacity();
        self.shared.in_flight.load(Ordering::Relaxed) + queued + self.stash.len()
    }
}

pub(crate) type TopicPartition = (String, i32);

/// State shared by the driver loop and the rebalance callbacks (both on the driver thread,
/// never locked across a poll).
pub(super) struct DriverState {
    pub(super) spec: PipelineSpec,
    pub(super) slots: Mutex<HashMap<TopicPartition, Slot>>,
    pub(super) arbiter: ArbiterHandle,
    pub(super) registry: Arc<Mutex<WorkerRegistry>>,
    pub(super) metrics: Metrics,
    pub(super) status: Arc<Mutex<PipelineStatus>>,
    pub(super) stats: Mutex<StatsView>,
    /// Lag per partition from the broker's high watermark (refreshed by the driver).
    pub(super) lags: Mutex<HashMap<TopicPartition, i64>>,
    pub(super) in_retry: Arc<std::sync::atomic::AtomicUsize>,
    pub(super) health: Arc<DependencyHealth>,
    /// Why partitions are paused (admin, degraded, held one by one).
    pub(super) pauses: Mutex<PauseState>,
    /// The records that crashed the driver (the poison-pill rule).
    pub(super) crashes: CrashBook,
    /// The driver's restarts after a panic.
    pub(super) restarts: Arc<Restarts>,
    /// Why the stage must restart though nothing panicked on its thread (a partition
    /// consumer actor stopped).
    pub(super) lost: Mutex<Option<String>>,
    /// The watchdog: records waiting with none finished, or out of the group.
    pub(super) stall: Mutex<StallWatch>,
    /// librdkafka's group join state, from its latest statistics.
    pub(super) join_state: Mutex<Option<String>>,
    /// The driver gave up on a stall: its in-flight records are not waited for again.
    pub(super) stalled: AtomicBool,
}

impl DriverState {
    pub(super) fn admin_paused(&self) -> bool {
        self.status.lock().unwrap_or_else(PoisonError::into_inner).paused
    }

    pub(super) fn slots(&self) -> MutexGuard<'_, HashMap<TopicPartition, Slot>> {
        self.slots.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub(super) fn pauses(&self) -> MutexGuard<'_, PauseState> {
        self.pauses.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub(super) fn assign(&self, tpl: &TopicPartitionList) {
        let mut slots = self.slots();
        for e in tpl.elements() {
            let tp = (e.topic().to_owned(), e.partition());
            if slots.contains_key(&tp) {
                continue;
            }
            // The queue holds records not yet started; the semaphore of the partition consumer
            // bounds those in flight.
            let (tx, rx) = mpsc::channel(self.spec.queue_capacity());
            let shared = Arc::new(PartitionShared::default());
            let (topic, partition) = tp.clone();
            let (max, registry, state) = (self.spec.max_in_flight, Arc::clone(&self.registry), Arc::clone(&shared));
            let lease = Lease::new();
            let held = lease.clone();
            let addr = PartitionConsumer::start_in_arbiter(&self.arbiter, move |_| {
                PartitionConsumer::new(topic, partition, rx, max, state, registry, held)
            });
            // Until the partition's first statistics (librdkafka's interval): the series
            // exists from the assignment on.
            let label = partition.to_string();
            self.metrics.consumer_lag.with_label_values(&[&self.spec.name, &label]).set(0);
            self.metrics.inflight.with_label_values(&[&self.spec.name, &label]).set(0);
            let stash = VecDeque::new();
            slots.insert(tp, Slot { addr, tx, shared, stored: -1, stash, lease, first_taken: None });
        }
        if tpl.count() > 0 {
            info!(pipeline = %self.spec.name, partitions = tpl.count(), "Partitions assigned.");
        }
    }

    /// Drains the given partitions (bounded by the drain timeout), stores their final
    /// watermarks and commits, then releases them.
    pub(super) fn revoke(&self, consumer: &BaseConsumer<DriverContext>, partitions: &[TopicPartition]) {
        self.revoke_within(consumer, partitions, self.spec.drain_timeout);
    }

    /// [`DriverState::revoke`], waiting at most `drain` for in-flight records.
    pub(super) fn revoke_within(
        &self,
        consumer: &BaseConsumer<DriverContext>,
        partitions: &[TopicPartition],
        drain: std::time::Duration,
    ) {
        let mut taken = Vec::new();
        {
            let mut slots = self.slots();
            for tp in partitions {
                if let Some(slot) = slots.remove(tp) {
                    taken.push((tp.clone(), slot));
                }
            }
        }
        if taken.is_empty() {
            return;
        }
        {
            let mut pauses = self.pauses();
            for (tp, _) in &taken {
                pauses.revoked(tp);
            }
        }
        let deadline = Instant::now() + drain;
        let waits: Vec<_> = taken
            .iter()
            .map(|(_, slot)| {
                let (done, wait) = std::sync::mpsc::channel();
                slot.lease.drain();
                slot.addr.do_send(Drain { done });
                wait
            })
            .collect();
        let mut undrained = 0;
        for wait in waits {
            let left = deadline.saturating_duration_since(Instant::now());
            if wait.recv_timeout(left).is_err() {
                undrained += 1;
            }
        }
        if undrained > 0 {
            warn!(pipeline = %self.spec.name, undrained, "Drain timed out; unfinished records stay uncommitted and will be redelivered.");
        }
        for ((topic, partition), slot) in &taken {
            // From here on nothing more happens for the partition on this instance.
            slot.lease.revoke();
            let watermark = slot.shared.watermark.load(Ordering::Acquire);
            if watermark > slot.stored {
                if let Err(e) = consumer.store_offset(topic, *partition, watermark) {
                    warn!(pipeline = %self.spec.name, topic, partition, error = %e, "Cannot store final offset.");
                }
            }
            slot.addr.do_send(Release);
            self.metrics.inflight.with_label_values(&[&self.spec.name, &partition.to_string()]).set(0);
        }
        match consumer.commit_consumer_state(CommitMode::Sync) {
            Ok(()) => info!(pipeline = %self.spec.name, partitions = taken.len(), "Drained and committed partitions."),
            // Nothing stored since the last commit is reported as an error by librdkafka.
            Err(e) => debug!(pipeline = %self.spec.name, error = %e, "Commit on revoke."),
        }
    }
}

/// The consumer context: rebalance callbacks and statistics (lag).
pub(super) struct DriverContext {
    pub(super) shared: Arc<DriverState>,
}

impl ClientContext for DriverContext {
    fn stats(&self, stats: Statistics) {
        record_stats(&self.shared.stats, &stats);
        if let Some(group) = stats.cgrp {
            *self.shared.join_state.lock().unwrap_or_else(PoisonError::into_inner) = Some(group.join_state);
        }
    }
}

impl ConsumerContext for DriverContext {
    fn pre_rebalance(&self, consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        if let Rebalance::Revoke(tpl) = rebalance {
            self.shared.metrics.rebalances_total.with_label_values(&[&self.shared.spec.name, "revoked"]).inc();
            self.shared
                .metrics
                .rebalance_partitions_total
                .with_label_values(&[&self.shared.spec.name, "revoked"])
                .inc_by(tpl.count() as u64);
            let partitions: Vec<TopicPartition> =
                tpl.elements().iter().map(|e| (e.topic().to_owned(), e.partition())).collect();
            if consumer.assignment_lost() {
                // The group went on without this member (a session timeout, a stop of the
                // process, a fenced generation): another may own these partitions already.
                warn!(pipeline = %self.shared.spec.name, partitions = partitions.len(),
                      "Assignment lost; draining, and rejoining the group.");
            } else {
                info!(pipeline = %self.shared.spec.name, partitions = partitions.len(), "Partitions revoked; draining.");
            }
            self.shared.revoke(consumer, &partitions);
        }
    }

    fn post_rebalance(&self, consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        match rebalance {
            Rebalance::Assign(tpl) => {
                self.shared.metrics.rebalances_total.with_label_values(&[&self.shared.spec.name, "assigned"]).inc();
                self.shared
                    .metrics
                    .rebalance_partitions_total
                    .with_label_values(&[&self.shared.spec.name, "assigned"])
                    .inc_by(tpl.count() as u64);
                self.shared.assign(tpl);
                self.shared.status.lock().unwrap_or_else(PoisonError::into_inner).assigned = true;
                // New slots start unheld: resumed, unless the pipeline is paused or degraded.
                let hold = self.shared.pauses().assigned_paused();
                let result = if hold { consumer.pause(tpl) } else { consumer.resume(tpl) };
                if let Err(e) = result {
                    warn!(pipeline = %self.shared.spec.name, error = %e, "Cannot set the pause state of new partitions.");
                }
            }
            Rebalance::Error(e) => error!(pipeline = %self.shared.spec.name, error = %e, "Rebalance error."),
            Rebalance::Revoke(_) => {}
        }
    }

    fn commit_callback(&self, result: KafkaResult<()>, _: &TopicPartitionList) {
        if let Err(e) = result {
            debug!(pipeline = %self.shared.spec.name, error = %e, "Offset commit failed; the next commit retries.");
        }
    }
}
