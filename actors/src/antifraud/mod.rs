//! The antifraud stage: consume-transform-produce inside Kafka transactions.
//! (This file is the loop shell, its unit tests are in `tests.rs`; one batch is in
//! `batch.rs`, the transactions in `txn.rs`, the outputs in `output.rs`, the decisions in
//! `decisions.rs`, the risk rules in `risk.rs` and their velocity window in `velocity.rs`.)
//!
//! One driver thread polls `transfers.requested` (`read_committed`), decides each transfer
//! once, and writes `TransferAnalyzed` (score below the block limit) or `TransferRejected`
//! (BLOCKED_BY_ANTIFRAUD) keyed by the source account, with ids derived from the transfer
//! id. Several records form one transaction (bounded by count and time): their outputs and
//! the consumer offsets (`send_offsets_to_transaction` with the group metadata) commit
//! together. Undecodable records go to the DLT inside the same transaction; one the DLT
//! refuses for good (too large, partition missing) goes to the `dead_letters` table.
//!
//! A transfer's decision is made once ([`decisions`]): the first one is stored before the
//! transaction that publishes it commits, and every later delivery publishes the stored
//! one again. The risk engine's velocity window counts distinct transfers and is rebuilt
//! from stored decisions whenever partitions are assigned. A failed transaction is aborted
//! and the same outputs are produced again in a new one; a retriable commit is committed
//! again; after a fatal error the transactional producer is re-created and only what the
//! group's committed offsets do not cover is produced again. Polling (and so rebalancing)
//! happens between transactions and while a batch waits out a failure, with its
//! partitions paused (module `hold`), so a long outage never costs the group membership;
//! records of partitions revoked meanwhile are dropped from the batch and go to the
//! partition's new owner. An admin pause lasts across rebalances.
//!
//! This stage needs no per-key actors: the work per record is a lookup or a computation,
//! and one loop in partition order keeps per-key order and the transaction boundaries
//! simple. Its database connections, from a pool of its own, are opened on and driven by
//! the loop's own thread and runtime.

mod batch;
mod consumer;
pub mod decisions;
mod hold;
mod output;
mod risk;
mod txn;
mod velocity;

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaResult;
use rdkafka::message::Message;
use rdkafka::producer::Producer;
use tracing::info;

pub use risk::{RiskEngine, RiskRules, RulesRiskEngine};

use crate::consume::{Control, DriverThread, PartitionStatus, PipelineControl, PipelineStatus};
use crate::metrics::Metrics;
use crate::record::Record;
use crate::store::PgPool;
use crate::supervise::restart::{give_up, panic_message, CrashBook, Restarts, MAX_START_FAILURES};
use crate::supervise::RetryPolicy;
use consumer::{stopped_while_down, subscribe, AntifraudContext};
use txn::{new_producer, TxnProducer};

/// The rejection reason of a blocked transfer.
pub const BLOCKED_BY_ANTIFRAUD: &str = "BLOCKED_BY_ANTIFRAUD";
/// Kinds of the derived event ids.
pub const ANALYZED_KIND: &str = "analyzed";
pub const REJECTED_KIND: &str = "rejected-antifraud";

const PIPELINE: &str = "antifraud";

/// What the stage runs with. Not `Debug`: its pool is not.
#[derive(Clone)]
pub struct AntifraudSpec {
    pub group_id: String,
    pub input: String,
    pub analyzed: String,
    pub rejected: String,
    /// Consumer settings ([`crate::kafka_clients::KafkaClients::group_consumer`]); the stage sets
    /// its group, `read_committed` and manual offsets on top.
    pub consumer: ClientConfig,
    /// Transactional producer settings
    /// ([`crate::kafka_clients::KafkaClients::transactional_producer`]).
    pub producer: ClientConfig,
    /// Unique per running instance.
    pub transactional_id: String,
    pub block_limit: i32,
    pub max_batch: usize,
    pub max_batch_wait: Duration,
    /// Broker-side limit of one transaction; also bounds `init_transactions` and aborts.
    pub transaction_timeout: Duration,
    /// How long one call that completes a transaction may block; past it the call is
    /// retriable and is made again after serving the group.
    pub call_timeout: Duration,
    /// Backoff between attempts of a failed transaction or database call.
    pub retry: RetryPolicy,
    /// The stage's own database pool (decisions and the dead-letter fallback). Its
    /// connections open on the stage's runtime, which drives them; closed when the stage
    /// stops.
    pub database: PgPool,
    /// Signs the stage's outputs; its inputs' signatures must be made with one of its keys.
    pub keyring: crate::signing::Keyring,
}

/// The running antifraud stage.
pub struct Antifraud {
    handle: PipelineControl,
    driver: DriverThread,
}

impl Antifraud {
    /// Subscribes and starts the transactional loop on its own thread.
    ///
    /// # Errors
    /// When the consumer or the transactional producer cannot be created or initialised.
    pub fn start(spec: AntifraudSpec, risk: Box<dyn RiskEngine>, metrics: Metrics) -> KafkaResult<Self> {
        // At 0 from the start: what this stage moves (it has no degraded state: a hold
        // retries under its own policy, counted in retries).
        crate::consume::publish_initial(&metrics, PIPELINE);
        for outcome in ["committed", "failed", "aborted", "retried", "producer_renewed", "producer_wedged"] {
            metrics.kafka_transactions_total.with_label_values(&[outcome]).inc_by(0);
        }
        let status = Arc::new(Mutex::new(PipelineStatus {
            name: PIPELINE.into(),
            group: spec.group_id.clone(),
            topics: vec![spec.input.clone()],
            ..PipelineStatus::default()
        }));
        let crashes: Arc<CrashBook> = Arc::default();
        let consumer = subscribe(&spec, &metrics, false, &crashes)?;
        let producer = new_producer(&spec, &metrics)?;
        let stopping = Arc::new(AtomicBool::new(false));
        let stop_flag = Arc::clone(&stopping);
        let loop_status = Arc::clone(&status);
        let restarts: Arc<Restarts> = Arc::default();
        let loop_restarts = Arc::clone(&restarts);
        // The batch in hand: its database call (10 s, the default statement timeout), one
        // attempt of its transaction (adding the offsets waits up to two call timeouts, the
        // commit one more), an abort and a re-created producer's init (a transaction
        // timeout each); then the flush of the stop (10 s), the commit and the leave.
        let stop_within = 2 * spec.transaction_timeout
            + 3 * spec.call_timeout
            + Duration::from_secs(20)
            + crate::consume::STOP_MARGIN;
        let driver = DriverThread::spawn("tally-antifraud".into(), stopping, stop_within, move |control_rx| {
            let Ok(runtime) = tokio::runtime::Builder::new_current_thread().enable_all().build() else {
                give_up(format!("{PIPELINE}: cannot start its database runtime"));
                return;
            };
            let pool = spec.database.clone();
            let mut risk = risk;
            let mut next = Some((consumer, producer));
            let mut failures = 0_u32;
            loop {
                let admin_paused = loop_status.lock().unwrap_or_else(PoisonError::into_inner).paused;
                let started = next.take().map_or_else(
                    || {
                        subscribe(&spec, &metrics, admin_paused, &crashes)
                            .and_then(|c| Ok((c, new_producer(&spec, &metrics)?)))
                    },
                    Ok,
                );
                let (consumer, producer) = match started {
                    Ok(parts) => parts,
                    Err(e) => {
                        failures += 1;
                        if failures >= MAX_START_FAILURES {
                            give_up(format!("{PIPELINE}: cannot start again ({failures} tries): {e}"));
                            break;
                        }
                        if stopped_while_down(
                            &control_rx,
                            &stop_flag,
                            loop_restarts.crashed(&format!("cannot start: {e}")),
                        ) {
                            break;
                        }
                        continue;
                    }
                };
                failures = 0;
                loop_restarts.started();
                let io = LoopIo {
                    consumer: &consumer,
                    spec: &spec,
                    metrics: &metrics,
                    control: &control_rx,
                    stopping: &stop_flag,
                    status: &loop_status,
                    runtime: &runtime,
                    pool: &pool,
                };
                let (cause, record) = match catch_unwind(AssertUnwindSafe(|| drive(&io, producer, &mut risk))) {
                    Ok(Ok(())) => break,
                    // Not a record's fault: the consumer is gone.
                    Ok(Err(cause)) => (cause, None),
                    Err(panic) => {
                        let cause = panic_message(&*panic);
                        let record = crashes.crashed(&cause);
                        (cause, record)
                    }
                };
                metrics.stage_restarts_total.with_label_values(&[PIPELINE]).inc();
                let wait = loop_restarts.crashed(&cause);
                tracing::error!(pipeline = PIPELINE, cause, record = ?record, wait_ms = wait.as_millis() as u64,
                    "Stage crashed; its open transaction is abandoned and it restarts from the committed offsets.");
                // The next producer's init_transactions fences and aborts what this one left open.
                consumer.unsubscribe();
                drop(consumer);
                if stopped_while_down(&control_rx, &stop_flag, wait) {
                    break;
                }
            }
            // Its connections live on this runtime: they close with it.
            pool.close();
        })?;
        info!(pipeline = PIPELINE, "Antifraud stage started.");
        let handle = PipelineControl::new(driver.control(), status, restarts);
        Ok(Self { handle, driver })
    }

    /// A handle to pause, resume and observe this stage.
    #[must_use]
    pub fn control(&self) -> PipelineControl {
        self.handle.clone()
    }

    /// Finishes the transaction in hand, then leaves the group.
    /// Whether the stop was clean (see [`crate::consume::forced_stops`]).
    pub async fn stop(self) -> bool {
        let clean = self.driver.stop().await;
        info!(pipeline = PIPELINE, clean, "Antifraud stage stopped.");
        clean
    }
}

/// What the antifraud loop works with, besides its producer and risk engine.
struct LoopIo<'a> {
    consumer: &'a BaseConsumer<AntifraudContext>,
    spec: &'a AntifraudSpec,
    metrics: &'a Metrics,
    control: &'a std::sync::mpsc::Receiver<Control>,
    stopping: &'a AtomicBool,
    status: &'a Mutex<PipelineStatus>,
    runtime: &'a tokio::runtime::Runtime,
    pool: &'a PgPool,
}

/// Runs the loop until stopped (`Ok`), or until its consumer fails fatally (`Err`, why).
fn drive(io: &LoopIo<'_>, mut producer: TxnProducer, risk: &mut Box<dyn RiskEngine>) -> Result<(), String> {
    let LoopIo { consumer, spec, metrics, control, status, .. } = *io;
    let mut last_status = Instant::now();
    loop {
        if last_status.elapsed() >= Duration::from_millis(500) {
            last_status = Instant::now();
            publish_status(consumer, status);
        }
        while let Ok(c) = control.try_recv() {
            match c {
                Control::Stop(done) => {
                    crate::faults::hang_on_stop();
                    consumer.unsubscribe();
                    let _ = producer.flush(Duration::from_secs(10));
                    let _ = done.send(());
                    return Ok(());
                }
                Control::Pause(applied) => {
                    set_admin_pause(consumer, status, true, true);
                    let _ = applied.send(());
                }
                Control::Resume(applied) => {
                    set_admin_pause(consumer, status, false, true);
                    let _ = applied.send(());
                }
            }
        }
        let mut batch = gather(consumer, spec);
        if let Some(fatal) = crate::kafka_clients::fatal_consumer_error(consumer.client()) {
            return Err(fatal);
        }
        if batch.is_empty() {
            continue;
        }
        metrics.inflight.with_label_values(&[PIPELINE, "all"]).set(batch.len() as i64);
        // Each record's `antifraud.decide` span, ended when the batch is done.
        let hops = output::Hops::start(&batch);
        let Some(decided) = batch::decide(io, &mut batch, risk.as_mut()) else {
            // Stopping while the database was away: nothing was produced or committed.
            return Ok(());
        };
        for d in decided.decisions.values() {
            metrics.antifraud_score.observe(f64::from(d.score));
        }
        let items = batch::outputs(batch, &decided, spec, &hops);
        if !batch::commit_batch(io, &mut producer, items) {
            return Ok(());
        }
        metrics.inflight.with_label_values(&[PIPELINE, "all"]).set(0);
    }
}

/// Applies an admin pause or resume: the flag that rebalances follow, the status, and,
/// with `now`, the assignment's pause state (a hold applies it when it ends instead).
fn set_admin_pause(consumer: &BaseConsumer<AntifraudContext>, status: &Mutex<PipelineStatus>, pause: bool, now: bool) {
    consumer.context().admin_paused.store(pause, Ordering::Relaxed);
    consumer.context().metrics.pipeline_paused.with_label_values(&[PIPELINE]).set(i64::from(pause));
    if now {
        hold::set_paused(consumer, pause);
    }
    status.lock().unwrap_or_else(PoisonError::into_inner).paused = pause;
    info!(pipeline = PIPELINE, "Pipeline {}.", if pause { "paused" } else { "resumed" });
}

fn publish_status(consumer: &BaseConsumer<AntifraudContext>, status: &Mutex<PipelineStatus>) {
    let stats = consumer.context().stats.lock().unwrap_or_else(PoisonError::into_inner).clone();
    let partitions: Vec<PartitionStatus> = consumer
        .assignment()
        .map(|tpl| {
            tpl.elements()
                .iter()
                .map(|e| {
                    let (committed, lag) =
                        stats.get(&(e.topic().to_owned(), e.partition())).copied().unwrap_or((-1, -1));
                    PartitionStatus {
                        topic: e.topic().to_owned(),
                        partition: e.partition(),
                        committed_offset: (committed >= 0).then_some(committed),
                        stored_offset: None,
                        lag: (lag >= 0).then_some(lag),
                        in_flight: 0,
                        held: false,
                    }
                })
                .collect()
        })
        .unwrap_or_default();
    let mut status = status.lock().unwrap_or_else(PoisonError::into_inner);
    status.partitions = partitions;
    status.assigned = consumer.context().received_assignment.load(Ordering::Relaxed);
}

/// Polls until `max_batch` records or `max_batch_wait` after the first one.
fn gather(consumer: &BaseConsumer<AntifraudContext>, spec: &AntifraudSpec) -> Vec<Record> {
    let mut batch = Vec::new();
    let mut deadline: Option<Instant> = None;
    while batch.len() < spec.max_batch {
        let timeout = deadline.map_or(Duration::from_millis(100), |d| d.saturating_duration_since(Instant::now()));
        let polled = consumer.poll(timeout);
        // Rebalance callbacks ran inside that poll: records gathered earlier from a
        // revoked partition are no longer ours to commit (the partition's owner reads them
        // again from the committed offset, even when that owner is this consumer again).
        // The record the poll returned comes after the rebalance and is kept.
        hold::drop_partitions(&mut batch, &hold::take_revoked(consumer));
        match polled {
            Some(Ok(m)) => {
                let crashes = &consumer.context().crashes;
                let at = (m.topic().to_owned(), m.partition(), m.offset());
                let record = match crashes.poison_pill(&at) {
                    Some(defect) => Record { defect: Some(defect), ..Record::from_message(&m) },
                    None => {
                        crashes.hold(Some(at));
                        let mut record = Record::from_message(&m);
                        spec.keyring.check(&mut record);
                        crate::faults::crash_on_marked(&record);
                        crashes.hold(None);
                        record
                    }
                };
                batch.push(record);
                deadline.get_or_insert_with(|| Instant::now() + spec.max_batch_wait);
            }
            Some(Err(e)) => crate::kafka_clients::log_consumer_error(PIPELINE, &e),
            None => {}
        }
        if deadline.is_none_or(|d| Instant::now() >= d) {
            break;
        }
    }
    batch
}

#[cfg(test)]
mod tests;
