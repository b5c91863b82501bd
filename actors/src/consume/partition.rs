//! `PartitionConsumer`: one actor per assigned partition and pipeline. It takes records
//! from its bounded queue (fed by the pipeline's driver thread), routes each to the keyed
//! worker of its key, and publishes the contiguous completed watermark, which the driver
//! stores and commits. In-flight records are bounded by a semaphore: when the bound is
//! reached it stops taking records, its queue fills, and the driver pauses the partition.

use std::sync::atomic::{AtomicI64, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use actix::prelude::*;
use futures_util::stream;
use tokio::sync::{mpsc, OwnedSemaphorePermit, Semaphore};
use tracing::debug;

use super::offsets::OffsetTracker;
use super::worker::{Process, WorkerRegistry};
use super::{Lease, Record};
use crate::supervise::Completion;

/// State a partition shares with the driver thread.
#[derive(Debug)]
pub struct PartitionShared {
    /// Last offset such that it and all earlier ones completed; -1 when none.
    pub watermark: AtomicI64,
    pub in_flight: AtomicUsize,
    /// Milliseconds the oldest unfinished record has been in flight (0 when none).
    pub oldest_age_ms: AtomicU64,
}

impl Default for PartitionShared {
    fn default() -> Self {
        Self { watermark: AtomicI64::new(-1), in_flight: AtomicUsize::new(0), oldest_age_ms: AtomicU64::new(0) }
    }
}

pub struct PartitionConsumer {
    topic: String,
    partition: i32,
    tracker: OffsetTracker,
    shared: Arc<PartitionShared>,
    registry: Arc<Mutex<WorkerRegistry>>,
    intake: Option<(mpsc::Receiver<Arc<Record>>, Arc<Semaphore>)>,
    intake_handle: Option<SpawnHandle>,
    drain_waiters: Vec<std::sync::mpsc::Sender<()>>,
    draining: bool,
    /// This assignment's lease, carried with each record to its worker.
    lease: Lease,
    /// Records left unfinished because the pipeline is stopping: their offsets stay
    /// uncommitted, and a drain does not wait for them.
    abandoned: usize,
}

impl PartitionConsumer {
    #[must_use]
    pub fn new(
        topic: String,
        partition: i32,
        rx: mpsc::Receiver<Arc<Record>>,
        max_in_flight: usize,
        shared: Arc<PartitionShared>,
        registry: Arc<Mutex<WorkerRegistry>>,
        lease: Lease,
    ) -> Self {
        Self {
            topic,
            partition,
            tracker: OffsetTracker::new(),
            shared,
            registry,
            intake: Some((rx, Arc::new(Semaphore::new(max_in_flight.max(1))))),
            intake_handle: None,
            drain_waiters: Vec::new(),
            draining: false,
            lease,
            abandoned: 0,
        }
    }

    fn registry(&self) -> std::sync::MutexGuard<'_, WorkerRegistry> {
        // A poisoned lock only means another thread panicked while holding it; the
        // registry itself stays consistent (every mutation is a single map operation).
        self.registry.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn dispatch(&mut self, record: Arc<Record>, permit: OwnedSemaphorePermit, ctx: &mut Context<Self>) {
        let key = record.routing_key().to_owned();
        let (worker, pending) = self.registry().checkout(&key);
        let offset = record.offset;
        let message = Process { record: Arc::clone(&record), lease: self.lease.clone(), pending };
        let fut = worker.clone().send(message).into_actor(self).map(move |result, act, ctx| match result {
            Ok(Ok(Completion::Handled(_) | Completion::DeadLettered)) => {
                drop(permit);
                act.complete(offset);
            }
            // The pipeline is stopping or the partition is being given up: leave the record
            // unfinished (uncommitted).
            Ok(Err(_stopping)) => {
                drop(permit);
                act.abandoned += 1;
                if act.draining && act.drained() {
                    act.finish_drain();
                }
            }
            // The worker stopped (its mailbox closed, so it runs nothing): start a new one
            // and hand it the record again.
            Err(_mailbox) => {
                act.registry().forget(&key, &worker);
                act.dispatch(record, permit, ctx);
            }
        });
        ctx.spawn(fut);
    }

    fn complete(&mut self, offset: i64) {
        if let Some(watermark) = self.tracker.complete(offset) {
            self.shared.watermark.store(watermark, Ordering::Release);
        }
        // The oldest-age scan is linear in the records in flight: it runs on the timer.
        self.shared.in_flight.store(self.tracker.in_flight(), Ordering::Relaxed);
        if self.draining && self.drained() {
            self.finish_drain();
        }
    }

    /// Nothing left to wait for: every record received finished or was abandoned.
    fn drained(&self) -> bool {
        self.tracker.in_flight() - self.tracker.completed_ahead() <= self.abandoned
    }

    fn publish_state(&self) {
        self.shared.in_flight.store(self.tracker.in_flight(), Ordering::Relaxed);
        let age = self.tracker.oldest_started().map_or(0, |t| t.elapsed().as_millis() as u64);
        self.shared.oldest_age_ms.store(age, Ordering::Relaxed);
    }

    fn finish_drain(&mut self) {
        for waiter in self.drain_waiters.drain(..) {
            let _ = waiter.send(());
        }
    }
}

impl Actor for PartitionConsumer {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        if let Some((rx, permits)) = self.intake.take() {
            // Yields a record only with a free in-flight permit: the bound on in-flight work.
            let records = stream::unfold((rx, permits), |(mut rx, permits)| async move {
                let permit = Arc::clone(&permits).acquire_owned().await.ok()?;
                let record = rx.recv().await?;
                Some(((record, permit), (rx, permits)))
            });
            self.intake_handle = Some(ctx.add_stream(records));
        }
        ctx.run_interval(std::time::Duration::from_millis(500), |act, _| act.publish_state());
        debug!(topic = %self.topic, partition = self.partition, "Partition consumer started.");
    }
}

impl StreamHandler<(Arc<Record>, OwnedSemaphorePermit)> for PartitionConsumer {
    fn handle(&mut self, (record, permit): (Arc<Record>, OwnedSemaphorePermit), ctx: &mut Self::Context) {
        self.tracker.begin(record.offset);
        self.dispatch(record, permit, ctx);
    }

    /// The queue closed: the driver dropped this partition. Stay alive until drained.
    fn finished(&mut self, _: &mut Self::Context) {}
}

/// Stop taking records, wait for the in-flight ones, then stop. `done` fires when the
/// last in-flight record completed; the watermark in [`PartitionShared`] is then final.
#[derive(Message)]
#[rtype(result = "()")]
pub struct Drain {
    pub done: std::sync::mpsc::Sender<()>,
}

impl Handler<Drain> for PartitionConsumer {
    type Result = ();

    fn handle(&mut self, msg: Drain, ctx: &mut Self::Context) {
        self.draining = true;
        if let Some(handle) = self.intake_handle.take() {
            ctx.cancel_future(handle);
        }
        self.drain_waiters.push(msg.done);
        if self.drained() {
            self.finish_drain();
        }
    }
}

/// Stop now (after a drain, or when the drain timed out).
#[derive(Message)]
#[rtype(result = "()")]
pub struct Release;

impl Handler<Release> for PartitionConsumer {
    type Result = ();

    fn handle(&mut self, _: Release, ctx: &mut Self::Context) {
        // Records still running belong to their workers, which stay registered until they
        // finish (the lease, revoked by now, stops them at their next step): a new owner of
        // the partition on this instance queues behind them instead of racing them.
        debug!(topic = %self.topic, partition = self.partition, unfinished = self.tracker.in_flight(),
               "Partition consumer released.");
        ctx.stop();
    }
}
