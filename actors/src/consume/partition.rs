//! `PartitionConsumer`: one actor per assigned partition and pipeline. It takes records
//! from its bounded queue (fed by the pipeline's driver thread), routes each to the keyed
//! worker of its key, and publishes the contiguous completed watermark, which the driver
//! stores and commits. In-flight records are bounded by a semaphore: when the bound is
//! reached it stops taking records, its queue fills, and the driver pauses the partition.

use std::sync::atomic::{AtomicI64, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use actix::prelude::*;
use futures_util::future::BoxFuture;
use futures_util::{stream, StreamExt};
use tokio::sync::{mpsc, OwnedSemaphorePermit, Semaphore};
use tracing::debug;

use super::offsets::OffsetTracker;
use super::worker::{KeyedWorker, Process, WorkerRegistry};
use super::{Lease, Record};
use crate::supervise::{Completion, Stopping};

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

/// The bookkeeping of one partition's records, without the actor (plain, unit-tested):
/// which offsets are in flight, the contiguous completed watermark, the records abandoned
/// because the pipeline is stopping (their offsets stay uncommitted), and whether a drain
/// has nothing left to wait for.
#[derive(Debug)]
pub struct PartitionBook {
    tracker: OffsetTracker,
    abandoned: usize,
    draining: bool,
}

impl Default for PartitionBook {
    fn default() -> Self {
        Self { tracker: OffsetTracker::new(), abandoned: 0, draining: false }
    }
}

impl PartitionBook {
    /// A record was handed to its worker.
    pub fn begin(&mut self, offset: i64) {
        self.tracker.begin(offset);
    }

    /// A record finished (handled or dead-lettered); the new watermark when it moved.
    pub fn complete(&mut self, offset: i64) -> Option<i64> {
        self.tracker.complete(offset)
    }

    /// A record was left unfinished because the pipeline is stopping: a drain does not
    /// wait for it, and the watermark stays below it.
    pub fn abandon(&mut self) {
        self.abandoned += 1;
    }

    /// A drain began: no more records will begin.
    pub fn start_drain(&mut self) {
        self.draining = true;
    }

    /// Nothing left to wait for: every record begun finished or was abandoned.
    #[must_use]
    pub fn drained(&self) -> bool {
        self.tracker.in_flight() - self.tracker.completed_ahead() <= self.abandoned
    }

    /// A drain is under way and has nothing left to wait for.
    #[must_use]
    pub fn drain_complete(&self) -> bool {
        self.draining && self.drained()
    }

    /// Records begun and not yet below the watermark.
    #[must_use]
    pub fn in_flight(&self) -> usize {
        self.tracker.in_flight()
    }

    /// When the oldest unfinished record began.
    #[must_use]
    pub fn oldest_started(&self) -> Option<std::time::Instant> {
        self.tracker.oldest_started()
    }
}

pub struct PartitionConsumer {
    topic: String,
    partition: i32,
    book: PartitionBook,
    shared: Arc<PartitionShared>,
    registry: Arc<Mutex<WorkerRegistry>>,
    intake: Option<(mpsc::Receiver<Arc<Record>>, Arc<Semaphore>)>,
    intake_handle: Option<SpawnHandle>,
    /// Records handed to their workers, awaiting the answer. They run as one stream of
    /// the actor rather than a future each: an actix context polls every future it holds
    /// whenever it wakes, so at hundreds in flight each answer cost hundreds of polls. The
    /// stream polls only those woken, and stopping the actor drops them all, as it did the
    /// futures (a message still queued for its worker is then dropped unhandled).
    handing: mpsc::UnboundedSender<BoxFuture<'static, Handed>>,
    handed: Option<mpsc::UnboundedReceiver<BoxFuture<'static, Handed>>>,
    drain_waiters: Vec<std::sync::mpsc::Sender<()>>,
    /// This assignment's lease, carried with each record to its worker.
    lease: Lease,
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
        let (handing, handed) = mpsc::unbounded_channel();
        Self {
            topic,
            partition,
            book: PartitionBook::default(),
            shared,
            registry,
            intake: Some((rx, Arc::new(Semaphore::new(max_in_flight.max(1))))),
            intake_handle: None,
            handing,
            handed: Some(handed),
            drain_waiters: Vec::new(),
            lease,
        }
    }

    fn registry(&self) -> std::sync::MutexGuard<'_, WorkerRegistry> {
        // A poisoned lock only means another thread panicked while holding it; the
        // registry itself stays consistent (every mutation is a single map operation).
        self.registry.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn dispatch(&mut self, record: Arc<Record>, permit: OwnedSemaphorePermit) {
        let key = record.routing_key().to_owned();
        let (worker, pending) = self.registry().checkout(&key);
        let message = Process { record: Arc::clone(&record), lease: self.lease.clone(), pending };
        // `send` on a fresh clone of the address (`checkout` gives one per record) always
        // queues the message: only a clone that already met a full mailbox returns a
        // future that waits without asking to be woken. The stream below polls only the
        // futures woken, so one such future would hold its record forever; a shared
        // address per partition must not be reused here.
        let answer = worker.send(message);
        // The receiving end lives in the actor's context as long as the actor does.
        let _ = self.handing.send(Box::pin(async move {
            let result = answer.await;
            Handed { record, key, worker, permit, result }
        }));
    }

    fn complete(&mut self, offset: i64) {
        if let Some(watermark) = self.book.complete(offset) {
            self.shared.watermark.store(watermark, Ordering::Release);
        }
        // The oldest-age scan is linear in the records in flight: it runs on the timer.
        self.shared.in_flight.store(self.book.in_flight(), Ordering::Relaxed);
        if self.book.drain_complete() {
            self.finish_drain();
        }
    }

    fn publish_state(&self) {
        self.shared.in_flight.store(self.book.in_flight(), Ordering::Relaxed);
        let age = self.book.oldest_started().map_or(0, |t| t.elapsed().as_millis() as u64);
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
        if let Some(handed) = self.handed.take() {
            let answers = stream::unfold(handed, |mut rx| async move { Some((rx.recv().await?, rx)) })
                .buffer_unordered(usize::MAX);
            ctx.add_stream(answers);
        }
        ctx.run_interval(std::time::Duration::from_millis(500), |act, _| act.publish_state());
        debug!(topic = %self.topic, partition = self.partition, "Partition consumer started.");
    }
}

impl StreamHandler<(Arc<Record>, OwnedSemaphorePermit)> for PartitionConsumer {
    fn handle(&mut self, (record, permit): (Arc<Record>, OwnedSemaphorePermit), _: &mut Self::Context) {
        self.book.begin(record.offset);
        self.dispatch(record, permit);
    }

    /// The queue closed: the driver dropped this partition. Stay alive until drained.
    fn finished(&mut self, _: &mut Self::Context) {}
}

/// A record handed to its worker, and the worker's answer.
pub struct Handed {
    record: Arc<Record>,
    key: String,
    worker: Addr<KeyedWorker>,
    permit: OwnedSemaphorePermit,
    result: Result<Result<Completion, Stopping>, MailboxError>,
}

impl StreamHandler<Handed> for PartitionConsumer {
    fn handle(&mut self, handed: Handed, _: &mut Self::Context) {
        let Handed { record, key, worker, permit, result } = handed;
        match result {
            Ok(Ok(Completion::Handled(_) | Completion::DeadLettered)) => {
                drop(permit);
                self.complete(record.offset);
            }
            // The pipeline is stopping or the partition is being given up: leave the record
            // unfinished (uncommitted).
            Ok(Err(_stopping)) => {
                drop(permit);
                self.book.abandon();
                if self.book.drain_complete() {
                    self.finish_drain();
                }
            }
            // The worker stopped (its mailbox closed, so it runs nothing): start a new one
            // and hand it the record again.
            Err(_mailbox) => {
                self.registry().forget(&key, &worker);
                self.dispatch(record, permit);
            }
        }
    }

    /// Never called: the actor owns the sending end, so the stream does not end; it is
    /// dropped with the actor.
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
        self.book.start_drain();
        if let Some(handle) = self.intake_handle.take() {
            ctx.cancel_future(handle);
        }
        self.drain_waiters.push(msg.done);
        if self.book.drained() {
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
        debug!(topic = %self.topic, partition = self.partition, unfinished = self.book.in_flight(),
               "Partition consumer released.");
        ctx.stop();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_drain_waits_for_every_record_begun() {
        let mut book = PartitionBook::default();
        for offset in 10..13 {
            book.begin(offset);
        }
        assert!(!book.drain_complete(), "no drain yet");
        book.start_drain();
        assert_eq!(book.complete(11), None, "10 still runs: the watermark cannot pass it");
        assert!(!book.drain_complete());
        assert_eq!(book.complete(10), Some(11), "10 and 11 done");
        assert!(!book.drain_complete(), "12 still runs");
        assert_eq!(book.complete(12), Some(12));
        assert!(book.drain_complete());
        assert_eq!(book.in_flight(), 0);
    }

    #[test]
    fn an_abandoned_record_holds_the_watermark_but_not_the_drain() {
        let mut book = PartitionBook::default();
        book.begin(0);
        book.begin(1);
        book.start_drain();
        book.abandon();
        assert!(!book.drain_complete(), "one abandoned, one still running");
        assert_eq!(book.complete(1), None, "the abandoned record stays uncommitted");
        assert!(book.drain_complete(), "nothing left that could finish");
    }

    #[test]
    fn an_idle_partition_drains_at_once() {
        let mut book = PartitionBook::default();
        book.start_drain();
        assert!(book.drain_complete());
    }
}
