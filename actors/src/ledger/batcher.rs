//! `SettlementBatcher`: group commit. Account ledgers hand it their next transfer and await
//! the outcome; it gathers requests from many accounts and settles them in one database
//! transaction ([`settle_batch`]). A batch starts at once when no transaction is running,
//! otherwise requests gather until a slot frees (or the batch is full), so batches grow with
//! load. A failing batch is split in halves and retried, down to single transfers, so one
//! bad transfer cannot sink the others; connection-level failures fail the whole batch at
//! once (every transfer is retried by its own account's policy).

use std::panic::AssertUnwindSafe;
use std::time::Duration;

use actix::prelude::*;
use futures_util::future::BoxFuture;
use futures_util::FutureExt;
use tokio::sync::oneshot;

use super::seed::settle_one_seed_style;
use super::settle::{settle_batch, LedgerTopics, SettleOutcome, SettleRequest};
use crate::db::PgPool;
use crate::metrics::Metrics;
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

/// How transfers are settled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SettlementMode {
    /// Group commit, set-based SQL.
    Batched,
    /// One transaction per transfer with the seed's statement sequence (the baseline).
    Seed,
}

pub struct SettlementBatcher {
    pool: PgPool,
    topics: LedgerTopics,
    metrics: Metrics,
    mode: SettlementMode,
    max_batch: usize,
    max_concurrent: usize,
    linger: Duration,
    pending: Vec<(SettleRequest, oneshot::Sender<Result<SettleOutcome, SettleError>>)>,
    running: usize,
    flush_scheduled: bool,
}

impl SettlementBatcher {
    #[must_use]
    pub fn new(
        pool: PgPool,
        topics: LedgerTopics,
        metrics: Metrics,
        mode: SettlementMode,
        max_batch: usize,
        max_concurrent: usize,
        linger: Duration,
    ) -> Self {
        Self {
            pool,
            topics,
            metrics,
            mode,
            max_batch: max_batch.max(1),
            max_concurrent: max_concurrent.max(1),
            linger,
            pending: Vec::new(),
            running: 0,
            flush_scheduled: false,
        }
    }

    fn flush(&mut self, ctx: &mut Context<Self>) {
        while self.running < self.max_concurrent && !self.pending.is_empty() {
            let take = self.pending.len().min(if self.mode == SettlementMode::Seed { 1 } else { self.max_batch });
            let batch: Vec<_> = self.pending.drain(..take).collect();
            self.running += 1;
            let (requests, replies): (Vec<_>, Vec<_>) = batch.into_iter().unzip();
            self.metrics.settlement_batch_size.observe(requests.len() as f64);
            let (pool, topics, mode) = (self.pool.clone(), self.topics.clone(), self.mode);
            let work = async move {
                let results = settle_with_split(pool, topics, mode, requests).await;
                for (reply, result) in replies.into_iter().zip(results) {
                    let _ = reply.send(result);
                }
            };
            ctx.spawn(work.into_actor(self).map(|(), act, ctx| {
                act.running -= 1;
                act.flush(ctx);
            }));
        }
    }
}

impl Actor for SettlementBatcher {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        // Every account ledger has at most one transfer in flight: the mailbox holds at
        // most one request per live account actor.
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
        self.pending.push((msg.0, tx));
        if self.running == 0 || self.pending.len() >= self.max_batch {
            self.flush(ctx);
        } else if !self.flush_scheduled {
            self.flush_scheduled = true;
            ctx.run_later(self.linger, |act, ctx| {
                act.flush_scheduled = false;
                act.flush(ctx);
            });
        }
        Box::pin(async move {
            rx.await.unwrap_or_else(|_| {
                Err(SettleError { class: ErrorClass::Transient, message: "settlement batcher stopped".into() })
            })
        })
    }
}

/// Settles `requests`, splitting a failing batch in halves down to single transfers, so
/// that a poison transfer is isolated and the others settle. A database that is down fails
/// every transfer at once (each waits for it under its own policy). A panic, which is a
/// bug, fails the transfers of that batch as transient instead of taking the batcher down
/// with every account that depends on it.
fn settle_with_split(
    pool: PgPool,
    topics: LedgerTopics,
    mode: SettlementMode,
    requests: Vec<SettleRequest>,
) -> BoxFuture<'static, Vec<Result<SettleOutcome, SettleError>>> {
    async move {
        let fail_all = |e: SettleError, n: usize| vec![Err(e); n];
        let mut conn = match pool.get().await {
            Ok(c) => c,
            Err(e) => return fail_all(SettleError::of("no database connection", &e), requests.len()),
        };
        let attempt = AssertUnwindSafe(async {
            match mode {
                SettlementMode::Batched => settle_batch(&mut conn, &topics, &requests).await,
                SettlementMode::Seed => match requests.first() {
                    Some(req) => settle_one_seed_style(&mut conn, &topics, req).await.map(|o| vec![o]),
                    None => Ok(Vec::new()),
                },
            }
        })
        .catch_unwind()
        .await;
        let result = match attempt {
            Ok(result) => {
                // Back to the pool before any split, which takes connections of its own.
                drop(conn);
                result.map_err(|e| SettleError::of("database error", &e))
            }
            Err(_) => {
                // The connection may hold an open transaction: never give it back.
                let _ = deadpool::managed::Object::take(conn);
                // Split like any other failure, so the others of the batch settle.
                Err(SettleError { class: ErrorClass::Transient, message: "settlement panicked (a bug)".into() })
            }
        };
        match result {
            Ok(outcomes) => outcomes.into_iter().map(Ok).collect(),
            Err(e) if requests.len() == 1 || e.class() == ErrorClass::Unavailable => fail_all(e, requests.len()),
            Err(_) => {
                let mut left = requests;
                let right = left.split_off(left.len() / 2);
                let mut results = settle_with_split(pool.clone(), topics.clone(), mode, left).await;
                results.extend(settle_with_split(pool, topics, mode, right).await);
                results
            }
        }
    }
    .boxed()
}
