//! Group commit: writes that arrive while the database is busy share one transaction.
//!
//! Callers hand an item to [`GroupCommit::submit`] and wait for its outcome. A few writer
//! tasks take turns at the queue: each takes whatever is waiting (at least one item, at
//! most `max_batch`), writes it in one transaction through [`Batch::write`] and answers
//! every caller once it has committed. Under light load a batch is one item and nothing
//! waits for company; under load one transaction serves many callers. A second writer
//! starts a transaction beside a running one only when that one is slow or the batch is
//! full (the `turns` module).
//!
//! What bounds it:
//! - **Time.** An item waits at most `max_wait` for a place in the queue and, once queued,
//!   for a writer to take it; past that it is answered [`Refusal::Overloaded`] and never
//!   written, as a caller waiting for a pooled connection would have been. Whether the
//!   writer took it or the caller gave up first is settled once, by a compare-and-swap on
//!   the item's state; an item taken is waited for to the end.
//! - **One bad item.** A batch that fails with an error [`Batch::split`] allows (one an
//!   item can cause: bad data) is written again in halves, down to single items, and each
//!   half is answered as soon as it commits. Any other error (timeout, deadlock, database
//!   down) fails the batch whole, once: each caller gets it, as it would have alone.
//! - **Panics.** A batch whose write panics is answered [`Refusal::Broken`] and its
//!   connection closed (PostgreSQL rolls its transaction back at once); the writer goes on
//!   with the next.

use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Arc;
use std::time::Duration;

use diesel_async::pooled_connection::deadpool::PoolError;
use diesel_async::AsyncPgConnection;
use futures_util::future::BoxFuture;
use futures_util::FutureExt;
use prometheus::{Histogram, IntCounterVec};
use tokio::sync::{mpsc, oneshot};

use super::PgPool;
use crate::metrics::Metrics;
use turns::Turns;

mod turns;

/// Why an item was answered without its batch being written.
#[derive(Debug)]
pub enum Refusal<'a> {
    /// No connection could be had for its batch.
    NoConnection(&'a PoolError),
    /// It waited longer than `max_wait` to be taken.
    Overloaded,
    /// The group commit has stopped.
    Stopped,
    /// Its batch's write panicked (nothing of it committed) or answered the wrong number
    /// of outcomes (it committed, but whose outcome is which is unknown).
    Broken,
}

impl Refusal<'_> {
    const LABELS: [&'static str; 4] = ["no_connection", "overloaded", "stopped", "broken"];

    fn label(&self) -> &'static str {
        match self {
            Self::NoConnection(_) => Self::LABELS[0],
            Self::Overloaded => Self::LABELS[1],
            Self::Stopped => Self::LABELS[2],
            Self::Broken => Self::LABELS[3],
        }
    }
}

/// Where a queued item stands: the writer takes it, or its caller abandons it, whichever
/// comes first.
const QUEUED: u8 = 0;
const TAKEN: u8 = 1;
const ABANDONED: u8 = 2;

/// The caller's side of the take-or-abandon race: true when the item was still queued and
/// is now abandoned (the writer will skip it), false when a writer took it first.
fn abandon(state: &AtomicU8) -> bool {
    state.compare_exchange(QUEUED, ABANDONED, Ordering::AcqRel, Ordering::Acquire).is_ok()
}

/// What a group commit writes, and how its failures reach the callers.
pub trait Batch: Send + Sync + 'static {
    type Item: Send + Sync + 'static;
    type Outcome: Send + 'static;
    type Error: Clone + Send + 'static;

    /// Writes `items` in one transaction: exactly one outcome per item, in order, or an
    /// error when none of them was written.
    fn write<'a>(
        &'a self,
        conn: &'a mut AsyncPgConnection,
        items: &'a [Self::Item],
    ) -> BoxFuture<'a, Result<Vec<Self::Outcome>, Self::Error>>;

    /// The error of an item answered without being written.
    fn refused(&self, why: Refusal<'_>) -> Self::Error;

    /// Whether a batch that failed with `error` is written again in halves: only for an
    /// error one item can cause on its own (bad data), never for one the batch as a whole
    /// met (a timeout, a deadlock, the database down).
    fn split(&self, error: &Self::Error) -> bool;
}

/// How a group commit batches.
#[derive(Debug, Clone, Copy)]
pub struct GroupCommitSettings {
    /// Most items per transaction; 1 writes each item in its own transaction.
    pub max_batch: usize,
    /// Transactions in flight at once, each on its own connection of the pool.
    pub writers: usize,
    /// Longest an item waits to be queued and then taken before it is refused.
    pub max_wait: Duration,
}

impl GroupCommitSettings {
    /// How long a transaction runs before it counts as slow and a second one may start
    /// beside it; an item waits at most this long for company (the `turns` module). A
    /// transaction of a few hundred small rows takes a few milliseconds; one that takes
    /// longer is waiting on something.
    pub const SPARE_AFTER: Duration = Duration::from_millis(10);

    /// The wait for company the writers use: [`Self::SPARE_AFTER`], at most half of
    /// `max_wait`, so that an item gathered while a transaction runs is still taken before
    /// its caller gives up on it.
    fn spare(&self) -> Duration {
        Self::SPARE_AFTER.min(self.max_wait / 2)
    }
}

struct Pending<B: Batch> {
    item: B::Item,
    state: Arc<AtomicU8>,
    reply: oneshot::Sender<Result<B::Outcome, B::Error>>,
    queued: tokio::time::Instant,
}

impl<B: Batch> turns::Queued for Pending<B> {
    fn queued_at(&self) -> tokio::time::Instant {
        self.queued
    }
}

/// The handle callers submit to. The writers stop once every handle is dropped and the
/// queue is empty: what was submitted before is still written or refused, and answered.
pub struct GroupCommit<B: Batch> {
    queue: mpsc::Sender<Pending<B>>,
    batch: Arc<B>,
    max_wait: Duration,
    refused: Refused,
}

impl<B: Batch> Clone for GroupCommit<B> {
    fn clone(&self) -> Self {
        Self {
            queue: self.queue.clone(),
            batch: Arc::clone(&self.batch),
            max_wait: self.max_wait,
            refused: self.refused.clone(),
        }
    }
}

/// `tally_group_commit_refused_total` of one group commit.
#[derive(Clone)]
struct Refused {
    name: String,
    counter: IntCounterVec,
}

impl Refused {
    fn count(&self, why: &Refusal<'_>) {
        self.counter.with_label_values(&[&self.name, why.label()]).inc();
    }
}

impl<B: Batch> GroupCommit<B> {
    /// Starts the writers on the current actix system. `name` labels its metrics:
    /// `tally_group_commit_batch_size{writes}` (items per transaction that committed) and
    /// `tally_group_commit_refused_total{writes,reason}`.
    #[must_use]
    pub fn start(name: &str, batch: B, pool: PgPool, settings: GroupCommitSettings, metrics: &Metrics) -> Self {
        let max_batch = settings.max_batch.max(1);
        let writers = settings.writers.max(1);
        let (queue, rx) = mpsc::channel(max_batch * writers * 4);
        let turns = Arc::new(Turns::new(rx, max_batch, settings.spare()));
        let batch = Arc::new(batch);
        let refused = Refused { name: name.to_owned(), counter: metrics.group_commit_refused_total.clone() };
        // At 0 from the start: an alert on their increase sees the first one too.
        for reason in Refusal::LABELS {
            refused.counter.with_label_values(&[name, reason]).inc_by(0);
        }
        for _ in 0..writers {
            let writer = Writer {
                turns: Arc::clone(&turns),
                pool: pool.clone(),
                batch: Arc::clone(&batch),
                name: name.to_owned(),
                sizes: metrics.group_commit_batch_size.with_label_values(&[name]),
                refused: refused.clone(),
            };
            actix::spawn(writer.run());
        }
        Self { queue, batch, max_wait: settings.max_wait, refused }
    }

    /// Writes `item` in the next batch; its outcome once that batch has committed.
    ///
    /// # Errors
    /// The error of the transaction that did not write it, or [`Batch::refused`].
    pub async fn submit(&self, item: B::Item) -> Result<B::Outcome, B::Error> {
        let queued = tokio::time::Instant::now();
        let deadline = queued + self.max_wait;
        let (reply, mut outcome) = oneshot::channel();
        let state = Arc::new(AtomicU8::new(QUEUED));
        let pending = Pending { item, state: Arc::clone(&state), reply, queued };
        match tokio::time::timeout_at(deadline, self.queue.send(pending)).await {
            Ok(Ok(())) => {}
            Ok(Err(_)) => return Err(self.refuse(Refusal::Stopped)),
            Err(_) => return Err(self.refuse(Refusal::Overloaded)),
        }
        let answered = match tokio::time::timeout_at(deadline, &mut outcome).await {
            Ok(answered) => answered,
            // Not taken in time: abandoned, never written. Taken meanwhile: wait it out.
            Err(_) if abandon(&state) => {
                return Err(self.refuse(Refusal::Overloaded));
            }
            Err(_) => outcome.await,
        };
        answered.map_err(|_| self.refuse(Refusal::Stopped))?
    }

    fn refuse(&self, why: Refusal<'_>) -> B::Error {
        self.refused.count(&why);
        self.batch.refused(why)
    }
}

type Reply<B> = oneshot::Sender<Result<<B as Batch>::Outcome, <B as Batch>::Error>>;

/// The writer's side of the take-or-abandon race: takes the items whose callers still wait
/// for them (queued, not abandoned), with their replies. An item its caller gave up on
/// (answered [`Refusal::Overloaded`]) or whose caller is gone is never written.
fn claim<B: Batch>(pending: Vec<Pending<B>>) -> (Vec<B::Item>, Vec<Reply<B>>) {
    let mut items = Vec::with_capacity(pending.len());
    let mut replies = Vec::with_capacity(pending.len());
    for p in pending {
        let taken = p.state.compare_exchange(QUEUED, TAKEN, Ordering::AcqRel, Ordering::Acquire).is_ok();
        if taken && !p.reply.is_closed() {
            items.push(p.item);
            replies.push(p.reply);
        }
    }
    (items, replies)
}

/// One attempt at writing a batch in one transaction.
enum Attempt<B: Batch> {
    /// The transaction's result.
    Done(Result<Vec<B::Outcome>, B::Error>),
    /// No connection could be had.
    NoConnection(PoolError),
    /// The write panicked (its connection was closed).
    Panicked,
}

/// Where batches are written, and how their callers are answered: the writers' pool, or a
/// test's script.
trait Transactions<B: Batch>: Sync {
    fn attempt<'s>(&'s self, items: &'s [B::Item]) -> BoxFuture<'s, Attempt<B>>;
    fn batch(&self) -> &B;
    /// What the batches write, for the log.
    fn name(&self) -> &str;
    /// A transaction of `items` items committed.
    fn committed(&self, items: usize);
    fn refuse(&self, reply: Reply<B>, why: Refusal<'_>);
}

struct Writer<B: Batch> {
    turns: Arc<Turns<Pending<B>>>,
    pool: PgPool,
    batch: Arc<B>,
    name: String,
    sizes: Histogram,
    refused: Refused,
}

impl<B: Batch> Writer<B> {
    async fn run(self) {
        // `_running` counts this writer's transaction as running until the batch is done.
        while let Some((pending, _running)) = self.turns.next_batch().await {
            let (items, replies) = claim(pending);
            if !items.is_empty() {
                write(&self, items, replies).await;
            }
        }
    }
}

impl<B: Batch> Transactions<B> for Writer<B> {
    fn attempt<'s>(&'s self, items: &'s [B::Item]) -> BoxFuture<'s, Attempt<B>> {
        async move {
            let mut conn = match self.pool.get().await {
                Ok(conn) => conn,
                Err(e) => return Attempt::NoConnection(e),
            };
            let written = AssertUnwindSafe(self.batch.write(&mut conn, items)).catch_unwind().await;
            match written {
                Ok(result) => Attempt::Done(result),
                Err(_) => {
                    // Its transaction may still be open, holding locks: close the connection
                    // (PostgreSQL rolls back at once) rather than leave it idle in the pool.
                    drop(deadpool::managed::Object::take(conn));
                    Attempt::Panicked
                }
            }
        }
        .boxed()
    }

    fn batch(&self) -> &B {
        &self.batch
    }

    fn name(&self) -> &str {
        &self.name
    }

    fn committed(&self, items: usize) {
        self.sizes.observe(items as f64);
    }

    fn refuse(&self, reply: Reply<B>, why: Refusal<'_>) {
        self.refused.count(&why);
        let _ = reply.send(Err(self.batch.refused(why)));
    }
}

/// Writes `items` in one transaction and answers `replies` (one per item) as soon as it
/// commits; on an error that allows it, writes each half the same way.
fn write<'a, B: Batch, T: Transactions<B>>(
    to: &'a T,
    mut items: Vec<B::Item>,
    mut replies: Vec<Reply<B>>,
) -> BoxFuture<'a, ()> {
    async move {
        match to.attempt(&items).await {
            Attempt::NoConnection(e) => {
                for reply in replies {
                    to.refuse(reply, Refusal::NoConnection(&e));
                }
            }
            Attempt::Done(Ok(outcomes)) if outcomes.len() == replies.len() => {
                to.committed(items.len());
                for (reply, outcome) in replies.into_iter().zip(outcomes) {
                    let _ = reply.send(Ok(outcome));
                }
            }
            Attempt::Done(Err(e)) if items.len() > 1 && to.batch().split(&e) => {
                let (right, right_replies) = (items.split_off(items.len() / 2), replies.split_off(replies.len() / 2));
                write(to, items, replies).await;
                write(to, right, right_replies).await;
            }
            Attempt::Done(Err(e)) => {
                for reply in replies {
                    let _ = reply.send(Err(e.clone()));
                }
            }
            // A write that panicked or broke its contract: nothing of it is trusted.
            Attempt::Done(Ok(_)) | Attempt::Panicked => {
                tracing::error!(writes = %to.name(), items = items.len(), "A group commit's write panicked or answered the wrong number of outcomes.");
                for reply in replies {
                    to.refuse(reply, Refusal::Broken);
                }
            }
        }
    }
    .boxed()
}

#[cfg(test)]
mod tests;
