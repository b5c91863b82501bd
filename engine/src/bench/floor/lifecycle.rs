//! A transfer's whole life as PostgreSQL alone runs it: each stage's statements, in the
//! transaction shapes tally uses, over batches, handed from step to step in memory where
//! tally hands them over Kafka.
//!
//! | step | what it runs | batch |
//! |---|---|---|
//! | intake | one transaction: the transfers (PENDING, no idempotency key, as the e2e load) and their `TransferRequested` outbox rows | `http.intake_batch_max` |
//! | outbox | one transaction: free shards locked, pending rows claimed, marked published | `outbox.batch_size` |
//! | antifraud | the stored decisions read, the new ones inserted (two statements, no transaction, as antifraud does) | `antifraud.batch_max_records` |
//! | ledger | [`super::ledger::settle`]: the ledger's transaction, with its `TransferSettled` rows | `ledger.batch_size` |
//! | projection | the status move of the settled transfers (one statement) | `projection.batch_max` |
//!
//! The outbox step publishes both events, as tally's publisher does: a `TransferRequested`
//! goes on to antifraud, a `TransferSettled` to the projection. Notifications are left
//! out, as in the end-to-end runs (no webhook). Every client takes, in turn, the step
//! furthest down the path with a full batch waiting, else the intake while transfers are
//! left to create, else any step with work; so batches are as full as the backlog allows.
//! A step runs at most as many transactions at once as tally does (`http.intake_writers`,
//! `outbox.concurrency`, one antifraud loop, `ledger.max_concurrent_batches`,
//! `projection.writers`).

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use diesel_async::AsyncPgConnection;
use serde::Serialize;
use tally_schema::events::{TransferAnalyzed, TransferRequested, TransferSettled};
use tally_schema::EventType;
use uuid::Uuid;

use super::ledger::settle;
use super::steps;

/// The steps, in the order of a transfer's life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    Intake,
    Outbox,
    Antifraud,
    Ledger,
    Projection,
}

impl Step {
    pub const ALL: [Self; 5] = [Self::Intake, Self::Outbox, Self::Antifraud, Self::Ledger, Self::Projection];

    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            Self::Intake => "intake",
            Self::Outbox => "outbox",
            Self::Antifraud => "antifraud",
            Self::Ledger => "ledger",
            Self::Projection => "projection",
        }
    }
}

/// A figure per step: the most rows per transaction, or the most transactions at once
/// (tally's, from its configuration).
#[derive(Debug, Clone, Copy, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Batches {
    pub intake: usize,
    pub outbox: usize,
    pub antifraud: usize,
    pub ledger: usize,
    pub projection: usize,
}

impl Batches {
    fn of(&self, step: Step) -> usize {
        match step {
            Step::Intake => self.intake,
            Step::Outbox => self.outbox,
            Step::Antifraud => self.antifraud,
            Step::Ledger => self.ledger,
            Step::Projection => self.projection,
        }
        .max(1)
    }
}

/// What one step did over the run.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct StepReport {
    pub step: &'static str,
    pub transactions: u64,
    pub rows: u64,
    /// Time the clients spent in this step, summed over them.
    pub busy_seconds: f64,
}

/// Where the topics' names come from.
#[derive(Debug, Clone)]
pub struct Topics {
    pub requested: String,
    pub settled: String,
}

/// The state the clients share: what each step has waiting, and how far the run is.
pub struct Pipeline {
    transfers: usize,
    accounts: usize,
    deadline: Option<Instant>,
    batches: Batches,
    at_once: Batches,
    topics: Topics,
    /// Transactions under way per step (in [`Step::ALL`] order).
    running: [AtomicUsize; 5],
    /// The publisher's next claim sweeps every free shard (after a claim of half found none).
    sweep: AtomicBool,
    /// Transfers handed to an intake transaction so far.
    handed: AtomicUsize,
    /// Intake transactions under way.
    creating: AtomicUsize,
    created: AtomicUsize,
    /// Outbox rows committed and not claimed yet.
    unpublished: AtomicUsize,
    requested: Mutex<VecDeque<TransferRequested>>,
    analyzed: Mutex<VecDeque<TransferAnalyzed>>,
    settled: Mutex<VecDeque<Uuid>>,
    finished: AtomicUsize,
    failed: AtomicBool,
    stats: Mutex<Vec<StepReport>>,
}

impl Pipeline {
    #[must_use]
    pub fn new(
        transfers: usize,
        accounts: usize,
        deadline: Option<Instant>,
        [batches, at_once]: [Batches; 2],
        topics: Topics,
    ) -> Self {
        let stats = Step::ALL
            .iter()
            .map(|s| StepReport { step: s.name(), transactions: 0, rows: 0, busy_seconds: 0.0 })
            .collect();
        Self {
            transfers,
            accounts,
            deadline,
            batches,
            at_once,
            topics,
            running: Default::default(),
            sweep: AtomicBool::new(false),
            handed: AtomicUsize::new(0),
            creating: AtomicUsize::new(0),
            created: AtomicUsize::new(0),
            unpublished: AtomicUsize::new(0),
            requested: Mutex::default(),
            analyzed: Mutex::default(),
            settled: Mutex::default(),
            finished: AtomicUsize::new(0),
            failed: AtomicBool::new(false),
            stats: Mutex::new(stats),
        }
    }

    /// Transfers created, and those that reached their final status.
    #[must_use]
    pub fn counts(&self) -> (usize, usize) {
        (self.created.load(Ordering::Acquire), self.finished.load(Ordering::Acquire))
    }

    #[must_use]
    pub fn steps(&self) -> Vec<StepReport> {
        self.stats.lock().unwrap_or_else(PoisonError::into_inner).clone()
    }

    fn intake_open(&self) -> bool {
        self.handed.load(Ordering::Acquire) < self.transfers && self.deadline.is_none_or(|d| Instant::now() < d)
    }

    /// Whether every transfer created reached its final status and no more will be.
    fn done(&self) -> bool {
        !self.intake_open()
            && self.creating.load(Ordering::Acquire) == 0
            && self.finished.load(Ordering::Acquire) >= self.created.load(Ordering::Acquire)
    }

    fn waiting(&self, step: Step) -> usize {
        match step {
            Step::Intake => usize::from(self.intake_open()) * self.batches.intake,
            Step::Outbox => self.unpublished.load(Ordering::Acquire),
            Step::Antifraud => len(&self.requested),
            Step::Ledger => len(&self.analyzed),
            Step::Projection => len(&self.settled),
        }
    }

    /// The next step for a client, entered: the furthest down the path with a full batch,
    /// else the intake, else the furthest down with anything waiting; only a step with
    /// fewer transactions under way than tally runs at once. [`Pipeline::leave`] it after.
    fn next_step(&self) -> Option<Step> {
        let downstream = [Step::Projection, Step::Ledger, Step::Antifraud, Step::Outbox];
        let full = downstream.into_iter().filter(|s| self.waiting(*s) >= self.batches.of(*s));
        let intake = std::iter::once(Step::Intake).filter(|_| self.intake_open());
        let some = downstream.into_iter().filter(|s| self.waiting(*s) > 0);
        full.chain(intake).chain(some).find(|s| self.enter(*s))
    }

    fn enter(&self, step: Step) -> bool {
        let running = &self.running[step as usize];
        if running.fetch_add(1, Ordering::AcqRel) < self.at_once.of(step) {
            return true;
        }
        running.fetch_sub(1, Ordering::AcqRel);
        false
    }

    fn leave(&self, step: Step) {
        self.running[step as usize].fetch_sub(1, Ordering::AcqRel);
    }

    fn count(&self, step: Step, rows: usize, busy: Duration) {
        let mut stats = self.stats.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(s) = stats.iter_mut().find(|s| s.step == step.name()) {
            s.transactions += 1;
            s.rows += rows as u64;
            s.busy_seconds += busy.as_secs_f64();
        }
    }
}

fn len<T>(queue: &Mutex<VecDeque<T>>) -> usize {
    queue.lock().unwrap_or_else(PoisonError::into_inner).len()
}

fn take<T>(queue: &Mutex<VecDeque<T>>, n: usize) -> Vec<T> {
    let mut q = queue.lock().unwrap_or_else(PoisonError::into_inner);
    let n = n.min(q.len());
    q.drain(..n).collect()
}

fn give<T>(queue: &Mutex<VecDeque<T>>, items: impl IntoIterator<Item = T>) {
    queue.lock().unwrap_or_else(PoisonError::into_inner).extend(items);
}

/// One client's share of the run, on its own connection, until every transfer is final
/// (or another client failed).
///
/// # Errors
/// Any database error (the other clients then stop too).
pub async fn client(p: &Pipeline, conn: &mut AsyncPgConnection) -> anyhow::Result<()> {
    while !p.done() && !p.failed.load(Ordering::Acquire) {
        let Some(step) = p.next_step() else {
            // Everything left is in another client's transaction.
            tokio::time::sleep(Duration::from_millis(1)).await;
            continue;
        };
        let started = Instant::now();
        let result = run_step(p, conn, step).await;
        p.leave(step);
        let rows = match result {
            Ok(rows) => rows,
            Err(e) => {
                p.failed.store(true, Ordering::Release);
                return Err(e.context(format!("lifecycle floor, {} step", step.name())));
            }
        };
        // An empty claim is counted: it is work the publisher does too.
        if rows > 0 || step == Step::Outbox {
            p.count(step, rows, started.elapsed());
        }
    }
    Ok(())
}

async fn run_step(p: &Pipeline, conn: &mut AsyncPgConnection, step: Step) -> anyhow::Result<usize> {
    let batch = p.batches.of(step);
    Ok(match step {
        Step::Intake => {
            p.creating.fetch_add(1, Ordering::AcqRel);
            let first = p.handed.fetch_add(batch, Ordering::AcqRel);
            let n = batch.min(p.transfers.saturating_sub(first));
            let written =
                if n > 0 { steps::intake(conn, first, n, p.accounts, &p.topics.requested).await } else { Ok(0) };
            if let Ok(written) = &written {
                p.created.fetch_add(*written, Ordering::AcqRel);
                p.unpublished.fetch_add(*written, Ordering::AcqRel);
            }
            p.creating.fetch_sub(1, Ordering::AcqRel);
            written?
        }
        Step::Outbox => publish(p, conn, batch).await?,
        Step::Antifraud => {
            let requests = take(&p.requested, batch);
            let analyzed = steps::decide(conn, &requests).await?;
            give(&p.analyzed, analyzed);
            requests.len()
        }
        Step::Ledger => {
            let transfers = take(&p.analyzed, batch);
            let settled = settle(conn, &transfers, &p.topics.settled).await?;
            p.unpublished.fetch_add(settled, Ordering::AcqRel);
            transfers.len()
        }
        Step::Projection => {
            let ids = take(&p.settled, batch);
            let moved = steps::finish(conn, &ids).await?;
            p.finished.fetch_add(moved, Ordering::AcqRel);
            ids.len()
        }
    })
}

/// One publisher transaction ([`steps::claim`]); each row's event handed to the step that
/// consumes it.
async fn publish(p: &Pipeline, conn: &mut AsyncPgConnection, batch: usize) -> anyhow::Result<usize> {
    let all = p.sweep.load(Ordering::Acquire);
    let claimed = steps::claim(conn, batch, all).await?;
    // As the publisher's loop: an empty claim of half the shards is followed by a sweep of
    // all free shards, any claim that found rows by half again.
    p.sweep.store(claimed.is_empty() && !all, Ordering::Release);
    p.unpublished.fetch_sub(claimed.len(), Ordering::AcqRel);
    let (mut requested, mut settled) = (Vec::new(), Vec::new());
    for row in &claimed {
        if row.event.event_type == EventType::TransferRequested.as_str() {
            requested.push(serde_json::from_str::<TransferRequested>(&row.event.payload)?);
        } else {
            settled.push(serde_json::from_str::<TransferSettled>(&row.event.payload)?.transfer_id);
        }
    }
    give(&p.requested, requested);
    give(&p.settled, settled);
    Ok(claimed.len())
}
