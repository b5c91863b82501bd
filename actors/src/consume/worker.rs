//! `KeyedWorker`: one actor per record key (the ledger: one worker per source account, each running the shared `LedgerHandler`).
//! It handles its records strictly in arrival order, one at a time (`AtomicResponse`), so a
//! key in blocking retry holds back only that key. Workers are created on demand,
//! passivated when idle, and bounded in number by the [`WorkerRegistry`].
//!
//! A key never has two live workers: the registry keeps a worker while it has records
//! handed to it and not yet finished, counted by the worker itself when it finishes one,
//! not by whoever handed it over. A partition released with records still running (a
//! drain that timed out) therefore leaves their worker registered, and the partition's
//! next owner on this instance queues its records behind them in the same mailbox.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use actix::prelude::*;

use crate::counted::Counted;
use crate::record::{Lease, Record};
use crate::supervise::{Completion, RecordHandler, Stopping, Supervision};

pub struct KeyedWorker {
    handler: Arc<dyn RecordHandler>,
    supervision: Arc<Supervision>,
    mailbox: usize,
}

impl Actor for KeyedWorker {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        // Bounded by the partition's in-flight limit, so a key's records queue in order.
        ctx.set_mailbox_capacity(self.mailbox);
    }
}

/// Handle one record (retries and DLT included) under the lease of the partition
/// assignment it was taken under.
#[derive(Message)]
#[rtype(result = "Result<Completion, Stopping>")]
pub struct Process {
    pub record: Arc<Record>,
    pub lease: Lease,
    /// From [`WorkerRegistry::checkout`]: counts the record pending for its worker until
    /// the worker finished it, or until the message is dropped unhandled (actix drops a
    /// queued message whose sender stopped waiting for the answer).
    pub pending: Pending,
}

/// One record pending for a worker; dropping it counts the record finished.
pub type Pending = Counted;

impl Handler<Process> for KeyedWorker {
    type Result = AtomicResponse<Self, Result<Completion, Stopping>>;

    fn handle(&mut self, msg: Process, _: &mut Self::Context) -> Self::Result {
        let handler = Arc::clone(&self.handler);
        let supervision = Arc::clone(&self.supervision);
        AtomicResponse::new(Box::pin(
            async move {
                let Process { record, lease, pending } = msg;
                let result = supervision.run(handler.as_ref(), record, lease).await;
                drop(pending);
                result
            }
            .into_actor(self),
        ))
    }
}

struct Entry {
    addr: Addr<KeyedWorker>,
    last_used: Instant,
    pending: Arc<AtomicUsize>,
}

impl Entry {
    /// One more record pending for this worker, used `now`.
    fn checkout(&mut self, now: Instant) -> (Addr<KeyedWorker>, Pending) {
        self.last_used = now;
        (self.addr.clone(), Counted::new(&self.pending))
    }

    fn is_busy(&self) -> bool {
        self.pending.load(Ordering::Acquire) > 0
    }
}

/// The live workers of one pipeline, keyed by record key. Dropping a worker's address
/// stops it once its mailbox is empty (passivation).
pub struct WorkerRegistry {
    handler: Arc<dyn RecordHandler>,
    supervision: Arc<Supervision>,
    workers: HashMap<String, Entry>,
    max_live: usize,
    idle_after: Duration,
    mailbox: usize,
}

impl WorkerRegistry {
    #[must_use]
    pub fn new(
        handler: Arc<dyn RecordHandler>,
        supervision: Arc<Supervision>,
        max_live: usize,
        idle_after: Duration,
        mailbox: usize,
    ) -> Self {
        Self { handler, supervision, workers: HashMap::new(), max_live: max_live.max(1), idle_after, mailbox }
    }

    /// The worker for `key`, started if needed, and one more record counted pending for it
    /// (hand the [`Pending`] over in the [`Process`] message). Must be called on the
    /// arbiter that runs the workers.
    pub fn checkout(&mut self, key: &str) -> (Addr<KeyedWorker>, Pending) {
        let now = Instant::now();
        // The key's own string is allocated once, when its worker starts, not per record.
        if let Some(entry) = self.workers.get_mut(key) {
            return entry.checkout(now);
        }
        if self.workers.len() >= self.max_live {
            self.evict_idle(self.max_live.saturating_sub(self.max_live / 10).max(1) - 1);
        }
        let addr = KeyedWorker {
            handler: Arc::clone(&self.handler),
            supervision: Arc::clone(&self.supervision),
            mailbox: self.mailbox,
        }
        .start();
        let mut entry = Entry { addr, last_used: now, pending: Arc::new(AtomicUsize::new(0)) };
        let checked_out = entry.checkout(now);
        self.workers.insert(key.to_owned(), entry);
        checked_out
    }

    /// Forgets the worker of `key` if it is still `dead` (its mailbox closed: it stopped
    /// and runs nothing); the next checkout starts a new one. A newer worker of the key is
    /// kept.
    pub fn forget(&mut self, key: &str, dead: &Addr<KeyedWorker>) {
        if self.workers.get(key).is_some_and(|e| e.addr == *dead) {
            self.workers.remove(key);
        }
    }

    /// Forgets every busy worker, returning how many: the pipeline stalled, and whatever
    /// holds their records does not let go. The next record of such a key gets a new
    /// worker. An abandoned worker that wakes up later finishes the step it was held in,
    /// and then finds its record's lease revoked, as after any revoke.
    pub fn abandon_busy(&mut self) -> usize {
        let before = self.workers.len();
        self.workers.retain(|_, e| !e.is_busy());
        before - self.workers.len()
    }

    /// Passivates workers idle for longer than the idle timeout.
    pub fn passivate_idle(&mut self) {
        let idle_after = self.idle_after;
        self.workers.retain(|_, e| e.is_busy() || e.last_used.elapsed() < idle_after);
    }

    /// Records handed to the worker of `key` and not finished.
    #[must_use]
    pub fn pending(&self, key: &str) -> usize {
        self.workers.get(key).map_or(0, |e| e.pending.load(Ordering::Acquire))
    }

    /// Evicts least recently used idle workers until at most `target` remain (busy workers
    /// are never evicted, so the bound may be exceeded while every worker is busy).
    fn evict_idle(&mut self, target: usize) {
        let excess = self.workers.len().saturating_sub(target);
        if excess == 0 {
            return;
        }
        let mut idle: Vec<(Instant, String)> =
            self.workers.iter().filter(|(_, e)| !e.is_busy()).map(|(k, e)| (e.last_used, k.clone())).collect();
        idle.sort_unstable();
        for (_, key) in idle.into_iter().take(excess) {
            self.workers.remove(&key);
        }
    }

    #[must_use]
    pub fn live(&self) -> usize {
        self.workers.len()
    }
}

#[cfg(test)]
mod tests {
    use futures_util::future::BoxFuture;
    use tokio::sync::Notify;

    use super::*;
    use crate::supervise::tests::{record, supervision};
    use crate::supervise::HandlerError;

    /// Holds every record until released.
    struct Held(Arc<Notify>);

    impl RecordHandler for Held {
        fn handle(&self, _: Arc<Record>) -> BoxFuture<'static, Result<&'static str, HandlerError>> {
            let release = Arc::clone(&self.0);
            Box::pin(async move {
                release.notified().await;
                Ok("handled")
            })
        }
    }

    /// A worker busy on a record whose partition was released meanwhile (nobody awaits its
    /// answer any more) stays the key's only worker: it is not passivated, and the next
    /// checkout of the key (the partition's next owner) gets it, so the new record queues
    /// behind the old one instead of running beside it.
    #[test]
    fn a_message_dropped_unhandled_is_not_pending() {
        actix::System::new().block_on(async {
            let handler = Arc::new(Held(Arc::new(Notify::new())));
            let mut registry = WorkerRegistry::new(handler, Arc::new(supervision(0)), 10, Duration::ZERO, 16);
            let (worker, pending) = registry.checkout("K");
            // Sent and abandoned before the worker took it: actix drops it unhandled.
            drop(worker.send(Process { record: record(), lease: Lease::new(), pending }));
            tokio::time::sleep(Duration::from_millis(20)).await;
            assert_eq!(registry.pending("K"), 0);
            registry.passivate_idle();
            assert_eq!(registry.live(), 0);
        });
    }

    #[test]
    fn a_busy_worker_stays_the_keys_only_worker_until_it_finished() {
        actix::System::new().block_on(async {
            let release = Arc::new(Notify::new());
            let handler = Arc::new(Held(Arc::clone(&release)));
            let mut registry = WorkerRegistry::new(handler, Arc::new(supervision(0)), 10, Duration::ZERO, 16);
            let (first, pending) = registry.checkout("K");
            let abandoned = first.send(Process { record: record(), lease: Lease::new(), pending });
            tokio::time::sleep(Duration::from_millis(20)).await;
            // The partition consumer that sent it is gone: its answer is never awaited.
            drop(abandoned);
            assert_eq!(registry.pending("K"), 1);
            registry.passivate_idle();
            assert_eq!(registry.live(), 1, "a busy worker is never passivated");
            let (second, pending) = registry.checkout("K");
            assert!(first == second, "one worker per key");
            let queued = second.send(Process { record: record(), lease: Lease::new(), pending });
            release.notify_one();
            tokio::time::sleep(Duration::from_millis(20)).await;
            release.notify_one();
            assert_eq!(queued.await.ok(), Some(Ok(Completion::Handled("handled"))));
            assert_eq!(registry.pending("K"), 0);
            registry.passivate_idle();
            assert_eq!(registry.live(), 0, "idle once both finished");
        });
    }
}
