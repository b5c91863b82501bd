//! `KeyedWorker`: one actor per record key (e.g. one `AccountLedger` per source account).
//! It handles its records strictly in arrival order, one at a time (`AtomicResponse`), so a
//! key in blocking retry holds back only that key. Workers are created on demand,
//! passivated when idle, and bounded in number by the [`WorkerRegistry`].

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use actix::prelude::*;

use crate::consume::Record;
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

/// Handle one record (retries and DLT included).
#[derive(Message)]
#[rtype(result = "Result<Completion, Stopping>")]
pub struct Process(pub Arc<Record>);

impl Handler<Process> for KeyedWorker {
    type Result = AtomicResponse<Self, Result<Completion, Stopping>>;

    fn handle(&mut self, msg: Process, _: &mut Self::Context) -> Self::Result {
        let handler = Arc::clone(&self.handler);
        let supervision = Arc::clone(&self.supervision);
        AtomicResponse::new(Box::pin(async move { supervision.run(handler.as_ref(), msg.0).await }.into_actor(self)))
    }
}

struct Entry {
    addr: Addr<KeyedWorker>,
    last_used: Instant,
    in_flight: usize,
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

    /// The worker for `key`, started if needed; counts one more record in flight for it.
    /// Must be called on the arbiter that runs the workers.
    pub fn checkout(&mut self, key: &str) -> Addr<KeyedWorker> {
        if !self.workers.contains_key(key) && self.workers.len() >= self.max_live {
            self.evict_idle(self.max_live.saturating_sub(self.max_live / 10).max(1) - 1);
        }
        let entry = self.workers.entry(key.to_owned()).or_insert_with(|| Entry {
            addr: KeyedWorker {
                handler: Arc::clone(&self.handler),
                supervision: Arc::clone(&self.supervision),
                mailbox: self.mailbox,
            }
            .start(),
            last_used: Instant::now(),
            in_flight: 0,
        });
        entry.in_flight += 1;
        entry.last_used = Instant::now();
        entry.addr.clone()
    }

    /// Counts one record of `key` as finished.
    pub fn checkin(&mut self, key: &str) {
        if let Some(e) = self.workers.get_mut(key) {
            e.in_flight = e.in_flight.saturating_sub(1);
            e.last_used = Instant::now();
        }
    }

    /// Forgets the worker of `key` (it died); the next checkout starts a new one.
    pub fn forget(&mut self, key: &str) {
        self.workers.remove(key);
    }

    /// Passivates workers idle for longer than the idle timeout.
    pub fn passivate_idle(&mut self) {
        let idle_after = self.idle_after;
        self.workers.retain(|_, e| e.in_flight > 0 || e.last_used.elapsed() < idle_after);
    }

    /// Evicts least recently used idle workers until at most `target` remain (busy workers
    /// are never evicted, so the bound may be exceeded while every worker is busy).
    fn evict_idle(&mut self, target: usize) {
        let excess = self.workers.len().saturating_sub(target);
        if excess == 0 {
            return;
        }
        let mut idle: Vec<(Instant, String)> =
            self.workers.iter().filter(|(_, e)| e.in_flight == 0).map(|(k, e)| (e.last_used, k.clone())).collect();
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
