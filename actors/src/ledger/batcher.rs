//! `SettlementBatcher`: group commit. Account workers hand it their next transfer and await
//! the outcome; it gathers requests from many accounts and settles them in one database
//! transaction (a [`Settler`], by default [`settle_batch`]). A batch starts at once when no
//! transaction is running, otherwise requests gather until a slot frees (or the batch is
//! full), so batches grow with load; a batch takes only requests whose accounts no running
//! batch holds ([`super::policy`]), so concurrent batches do not wait on each other's row
//! locks. A batch that fails on a poison transfer (bad data: [`ErrorClass::Poison`]) is split
//! in halves and retried, down to single transfers, so one bad transfer cannot sink the
//! others; any other failure (a timeout, a deadlock, the database down) fails the batch
//! whole, once, and every transfer is retried or waits under its own record's policy.

use std::collections::VecDeque;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::Duration;

use actix::prelude::*;
use diesel_async::AsyncPgConnection;
use futures_util::future::BoxFuture;
use futures_util::FutureExt;
use tokio::sync::oneshot;

use super::policy::{account_key, take_free, FlushPolicy, HeldAccounts, OnRequest};
use super::settle::{settle_batch, LedgerTopics, SettleOutcome, SettleRequest};
use crate::metrics::Metrics;
use crate::outbox::CommitBell;
use crate::store::PgPool;
use crate::supervise::{Classify, ErrorClass};

/// Why a transfer was not settled, classified by cause (see [`Classify`]): the record's
/// policy retries it, waits for the database, or dead-letters it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("settlement failed: {message}")]
pub struct SettleError {
    pub class: ErrorClass,
    pub message: String,
}

impl SettleError {
    fn of<E: Classify + std::fmt::Display>(context: &str, e: &E) -> Self {
        Self { class: e.class(), message: format!("{context}: {e}") }
    }
}

impl Classify for SettleError {
    fn class(&self) -> ErrorClass {
        self.class
    }
}

/// How a batch of transfers is settled, in one call on one connection. The daemon uses
/// [`BatchSettler`]; tests plug in settlers that record or fail.
pub trait Settler: Send + Sync + 'static {
    /// Most transfers per call.
    fn max_batch(&self) -> usize;

    /// Settles `batch`; the outcomes are in batch order. On an error nothing is written.
    fn settle<'a>(
        &'a self,
        conn: &'a mut AsyncPgConnection,
        topics: &'a LedgerTopics,
        batch: &'a [SettleRequest],
    ) -> BoxFuture<'a, Result<Vec<SettleOutcome>, diesel::result::Error>>;
}

/// Group commit with set-based SQL: [`settle_batch`].
#[derive(Debug, Clone, Copy)]
pub struct BatchSettler {
    pub max_batch: usize,
}

impl Settler for BatchSettler {
    fn max_batch(&self) -> usize {
        self.max_batch
    }

    fn settle<'a>(
        &'a self,
        conn: &'a mut AsyncPgConnection,
        topics: &'a LedgerTopics,
        batch: &'a [SettleRequest],
    ) -> BoxFuture<'a, Result<Vec<SettleOutcome>, diesel::result::Error>> {
        settle_batch(conn, topics, batch).boxed()
    }
}

/// Where a request's outcome goes.
type Reply = oneshot::Sender<Result<SettleOutcome, SettleError>>;

pub struct SettlementBatcher {
    pool: PgPool,
    topics: LedgerTopics,
    metrics: Metrics,
    settler: Arc<dyn Settler>,
    linger: Duration,
    policy: FlushPolicy,
    /// The accounts of the running batches.
    held: HeldAccounts,
    /// Waiting requests, with their accounts' keys in [`HeldAccounts`].
    pending: VecDeque<(SettleRequest, Reply, [u64; 2])>,
    /// Rung after each batch, committed or not (its outbox rows wait for the publishers).
    committed: Option<CommitBell>,
}

impl SettlementBatcher {
    #[must_use]
    pub fn new(
        pool: PgPool,
        topics: LedgerTopics,
        metrics: Metrics,
        settler: Arc<dyn Settler>,
        max_concurrent: usize,
        linger: Duration,
    ) -> Self {
        let policy = FlushPolicy::new(settler.max_batch(), max_concurrent);
        Self {
            pool,
            topics,
            metrics,
            settler,
            linger,
            policy,
            held: HeldAccounts::default(),
            pending: VecDeque::new(),
            committed: None,
        }
    }

    /// Rings `bell` after each batch, committed or not: for a pool whose connections leave the
    /// outbox notification to their writers (`tally.outbox_notify = 'after_commit'`).
    #[must_use]
    pub fn with_commit_bell(mut self, bell: CommitBell) -> Self {
        self.committed = Some(bell);
        self
    }

    fn flush(&mut self, ctx: &mut Context<Self>) {
        while let Some(offered) = self.policy.next_batch() {
            let (batch, accounts) = take_free(&mut self.pending, offered, &self.held, |(_, _, keys)| *keys);
            self.policy.on_started(offered, batch.len());
            if batch.is_empty() {
                break;
            }
            self.held.hold(&accounts);
            let (requests, replies): (Vec<_>, Vec<_>) = batch.into_iter().map(|(r, reply, _)| (r, reply)).unzip();
            self.metrics.settlement_batch_size.observe(requests.len() as f64);
            let (pool, topics, settler) = (self.pool.clone(), self.topics.clone(), Arc::clone(&self.settler));
            let committed = self.committed.clone();
            let size = requests.len();
            let work = async move {
                let results = settle_with_split(pool, topics, settler, requests).await;
                // Also after a failure: a COMMIT whose answer was lost may have committed.
                if let Some(bell) = committed {
                    bell.ring();
                }
                let transient = results.iter().any(|r| r.as_ref().is_err_and(|e| e.class() == ErrorClass::Transient));
                for (reply, result) in replies.into_iter().zip(results) {
                    let _ = reply.send(result);
                }
                transient
            };
            ctx.spawn(work.into_actor(self).map(move |transient, act, ctx| {
                act.held.release(&accounts);
                act.policy.on_batch_done(size, transient);
                act.flush(ctx);
            }));
        }
    }
}

impl Actor for SettlementBatcher {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        // Every keyed worker has at most one transfer in flight: the mailbox holds at
        // most one request per live keyed worker.
        ctx.set_mailbox_capacity(100_000);
    }
}

/// Settle one transfer as part of the next batch.
#[derive(Message)]
#[rtype(result = "Result<SettleOutcome, SettleError>")]
pub struct Settle(pub SettleRequest);

impl Handler<Settle> for SettlementBatcher {
    type Result = ResponseFuture<Result<SettleOutcome, SettleError>>;

    fn handle(&mut self, msg: Settle, ctx: &mut Self::Context) -> Self::Result {
        let (tx, rx) = oneshot::channel();
        let keys = [account_key(&msg.0.transfer.source_account), account_key(&msg.0.transfer.destination_account)];
        self.pending.push_back((msg.0, tx, keys));
        match self.policy.on_request() {
            OnRequest::FlushNow => self.flush(ctx),
            OnRequest::FlushLater => {
                ctx.run_later(self.linger, |act, ctx| {
                    act.policy.on_linger();
                    act.flush(ctx);
                });
            }
            OnRequest::Wait => {}
        }
        Box::pin(async move {
            rx.await.unwrap_or_else(|_| {
                Err(SettleError { class: ErrorClass::Transient, message: "settlement batcher stopped".into() })
            })
        })
    }
}

/// Settles `requests`. A batch that fails on poison is split in halves down to single
/// transfers, so that the poison transfer is isolated and the others settle. Any other
/// failure is the batch's as a whole (a lock or statement timeout, a deadlock, a
/// serialization failure, the database down): every transfer gets the error at once and is
/// retried or waits under its own record's policy; settling halves would only multiply the
/// work against a database that is slow or down. A panic, which is a bug, fails the
/// transfers as transient instead of taking the batcher down with every account that
/// depends on it, and is split like poison, since one transfer may cause it.
fn settle_with_split(
    pool: PgPool,
    topics: LedgerTopics,
    settler: Arc<dyn Settler>,
    requests: Vec<SettleRequest>,
) -> BoxFuture<'static, Vec<Result<SettleOutcome, SettleError>>> {
    async move {
        let fail_all = |e: SettleError, n: usize| vec![Err(e); n];
        let mut conn = match pool.get().await {
            Ok(c) => c,
            Err(e) => return fail_all(SettleError::of("no database connection", &e), requests.len()),
        };
        let attempt =
            AssertUnwindSafe(async { settler.settle(&mut conn, &topics, &requests).await }).catch_unwind().await;
        let (result, split) = match attempt {
            Ok(result) => {
                // Back to the pool before any split, which takes connections of its own.
                drop(conn);
                let result = result.map_err(|e| SettleError::of("database error", &e));
                let split = result.as_ref().is_err_and(splits);
                (result, split)
            }
            Err(_) => {
                // The connection may hold an open transaction: never give it back.
                let _ = deadpool::managed::Object::take(conn);
                // Split like poison, so the others of the batch settle.
                let panicked =
                    SettleError { class: ErrorClass::Transient, message: "settlement panicked (a bug)".into() };
                (Err(panicked), true)
            }
        };
        match result {
            Ok(outcomes) => outcomes.into_iter().map(refused_as_poison).collect(),
            Err(e) if !split || requests.len() == 1 => fail_all(e, requests.len()),
            Err(_) => {
                let mut left = requests;
                let right = left.split_off(left.len() / 2);
                let mut results = settle_with_split(pool.clone(), topics.clone(), Arc::clone(&settler), left).await;
                results.extend(settle_with_split(pool, topics, settler, right).await);
                results
            }
        }
    }
    .boxed()
}

/// A transfer the system of record refused is its record's poison (the dead letter names
/// why); every other outcome stands.
fn refused_as_poison(outcome: SettleOutcome) -> Result<SettleOutcome, SettleError> {
    match outcome {
        SettleOutcome::Refused(refusal) => {
            Err(SettleError { class: ErrorClass::Poison, message: refusal.reason().to_owned() })
        }
        outcome => Ok(outcome),
    }
}

/// Whether a batch that failed with `error` is settled again in halves: only when one of
/// its transfers can have caused it on its own (poison). A timeout, a deadlock, a
/// serialization failure or an outage is met by the batch as a whole.
fn splits(error: &SettleError) -> bool {
    error.class() == ErrorClass::Poison
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_poison_splits_a_batch() {
        let error = |class| SettleError { class, message: String::new() };
        assert!(splits(&error(ErrorClass::Poison)));
        assert!(!splits(&error(ErrorClass::Transient)), "a timeout, deadlock or serialization failure");
        assert!(!splits(&error(ErrorClass::Unavailable)), "the database down");
    }
}
