//! Group commit: writes that arrive while the database is busy share one transaction.
//!
//! Callers hand an item to [`GroupCommit::submit`] and wait for its outcome. A few writer
//! tasks take turns at the queue: each takes whatever is waiting (at least one item, at
//! most `max_batch`), writes it in one transaction through [`Batch::write`] and answers
//! every caller once it has committed. Under light load a batch is one item and nothing
//! waits for company; under load one commit (one WAL flush) serves many callers.
//!
//! A batch that fails with an error [`Batch::split`] allows is written again in halves,
//! down to single items, so that an item that cannot be written fails alone. A caller that
//! stopped waiting before its batch was taken is skipped.

use std::sync::Arc;

use diesel_async::pooled_connection::deadpool::PoolError;
use diesel_async::AsyncPgConnection;
use futures_util::future::BoxFuture;
use futures_util::FutureExt;
use prometheus::Histogram;
use tokio::sync::{mpsc, oneshot, Mutex};

use super::PgPool;

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

    /// The error of a batch that got no connection.
    fn no_connection(&self, error: &PoolError) -> Self::Error;

    /// The error of a caller whose group commit has stopped.
    fn stopped(&self) -> Self::Error;

    /// Whether a batch that failed with `error` is written again in halves (an error one
    /// item may have caused), rather than failing whole (the database is down).
    fn split(&self, error: &Self::Error) -> bool;
}

/// How a group commit batches.
#[derive(Debug, Clone, Copy)]
pub struct GroupCommitSettings {
    /// Most items per transaction; 1 writes each item in its own transaction.
    pub max_batch: usize,
    /// Transactions in flight at once, each on its own connection of the pool.
    pub writers: usize,
}

struct Pending<B: Batch> {
    item: B::Item,
    reply: oneshot::Sender<Result<B::Outcome, B::Error>>,
}

/// The handle callers submit to. The writers stop once every handle is dropped and the
/// queue is empty: what was submitted before is still written and answered.
pub struct GroupCommit<B: Batch> {
    queue: mpsc::Sender<Pending<B>>,
    batch: Arc<B>,
}

impl<B: Batch> Clone for GroupCommit<B> {
    fn clone(&self) -> Self {
        Self { queue: self.queue.clone(), batch: Arc::clone(&self.batch) }
    }
}

impl<B: Batch> GroupCommit<B> {
    /// Starts the writers on the current actix system; each batch's size is observed in
    /// `sizes`.
    #[must_use]
    pub fn start(batch: B, pool: PgPool, settings: GroupCommitSettings, sizes: Histogram) -> Self {
        let max_batch = settings.max_batch.max(1);
        let writers = settings.writers.max(1);
        let (queue, rx) = mpsc::channel(max_batch * writers * 4);
        let rx = Arc::new(Mutex::new(rx));
        let batch = Arc::new(batch);
        for _ in 0..writers {
            let writer = Writer {
                queue: Arc::clone(&rx),
                pool: pool.clone(),
                batch: Arc::clone(&batch),
                max_batch,
                sizes: sizes.clone(),
            };
            actix::spawn(writer.run());
        }
        Self { queue, batch }
    }

    /// Writes `item` in the next batch; its outcome once that batch has committed.
    ///
    /// # Errors
    /// The error of the transaction that did not write it, or [`Batch::stopped`].
    pub async fn submit(&self, item: B::Item) -> Result<B::Outcome, B::Error> {
        let (reply, outcome) = oneshot::channel();
        self.queue.send(Pending { item, reply }).await.map_err(|_| self.batch.stopped())?;
        outcome.await.map_err(|_| self.batch.stopped())?
    }
}

struct Writer<B: Batch> {
    queue: Arc<Mutex<mpsc::Receiver<Pending<B>>>>,
    pool: PgPool,
    batch: Arc<B>,
    max_batch: usize,
    sizes: Histogram,
}

impl<B: Batch> Writer<B> {
    async fn run(self) {
        while let Some(mut pending) = self.next_batch().await {
            pending.retain(|p| !p.reply.is_closed());
            if pending.is_empty() {
                continue;
            }
            let (items, replies): (Vec<_>, Vec<_>) = pending.into_iter().map(|p| (p.item, p.reply)).unzip();
            self.sizes.observe(items.len() as f64);
            for (reply, outcome) in replies.into_iter().zip(self.write(&items).await) {
                let _ = reply.send(outcome);
            }
        }
    }

    /// Waits for one item, then takes every waiting one up to `max_batch`. `None` once the
    /// queue is closed and empty.
    async fn next_batch(&self) -> Option<Vec<Pending<B>>> {
        let mut queue = self.queue.lock().await;
        let first = queue.recv().await?;
        let mut batch = Vec::with_capacity(self.max_batch.min(64));
        batch.push(first);
        while batch.len() < self.max_batch {
            match queue.try_recv() {
                Ok(next) => batch.push(next),
                Err(_) => break,
            }
        }
        Some(batch)
    }

    /// Writes `items` in one transaction, or in halves when it fails with an error that
    /// allows a split; one result per item.
    fn write<'a>(&'a self, items: &'a [B::Item]) -> BoxFuture<'a, Vec<Result<B::Outcome, B::Error>>> {
        async move {
            let written = match self.pool.get().await {
                Ok(mut conn) => self.batch.write(&mut conn, items).await,
                Err(e) => Err(self.batch.no_connection(&e)),
            };
            match written {
                Ok(outcomes) => outcomes.into_iter().map(Ok).collect(),
                Err(e) if items.len() > 1 && self.batch.split(&e) => {
                    let (left, right) = items.split_at(items.len() / 2);
                    let mut results = self.write(left).await;
                    results.extend(self.write(right).await);
                    results
                }
                Err(e) => items.iter().map(|_| Err(e.clone())).collect(),
            }
        }
        .boxed()
    }
}
