//! `tally bench floor`: what PostgreSQL alone does with tally's own statements, set-based,
//! at tally's batch sizes, on the same schema and machine: no broker, no actors, no HTTP,
//! no group commit; only the statements, sent by `--clients` connections at once over a
//! fresh database with the ledger bench's 10,000 accounts. The stages are measured against
//! it (`tally bench stages` prints "stage / floor"), so the distance between a stage and
//! its floor is what tally's own machinery costs.
//!
//! - **Ledger floor** ([`ledger`]): per transaction a batch of `--batch` transfers (the
//!   ledger's `batch_size`) over random account pairs, with the ledger's statements (inbox
//!   claim, accounts locked in id order, the intake's rows read, postings, balances,
//!   outcomes, `TransferSettled` outbox rows); every transfer settles. Transfers/s from the
//!   first transaction's start to the last commit, the best over 1, 2, 4, ... connections
//!   up to `--clients`, each on a fresh database.
//! - **Lifecycle floor** ([`lifecycle`]): each stage's statements over a transfer's whole
//!   life, intake to final status, run as a pipeline by the clients. Transfers/s from the
//!   first intake to the last status move.
//!
//! The statements are copies of tally's (`super::sql::floor`). After each floor the ledger
//! invariants are checked (`tally_actors::store::invariants`).

pub mod ledger;
pub mod lifecycle;
mod steps;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use serde::Serialize;
use tally_actors::store::{build_pool, PgPool, PoolSettings};

use super::{connect, fresh_database, peak_rss_mib, sql, write_report, Outgoing, Progress};
use crate::config::Config;
use lifecycle::{Batches, Pipeline, StepReport, Topics};
use tally_schema::events::TransferAnalyzed;

/// Connections of each floor unless told otherwise.
pub const DEFAULT_CLIENTS: usize = 8;

/// What to run.
#[derive(Debug, Clone)]
pub struct Args {
    /// Transfers of each floor.
    pub transfers: usize,
    /// Stop handing out new transfers after this long (whichever comes first).
    pub seconds: Option<u64>,
    pub clients: usize,
    /// Transfers per ledger floor transaction.
    pub batch: usize,
    pub accounts: usize,
    /// The floors' databases are `<prefix>_ledger` and `<prefix>_lifecycle`.
    pub database_prefix: String,
}

/// One floor's figures.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct FloorReport {
    pub floor: &'static str,
    /// Transfers that reached the end (settled; for the lifecycle, their final status).
    pub transfers: u64,
    pub transfers_per_second: f64,
    pub seconds: f64,
    /// Connections it ran on.
    pub connections: usize,
    pub invariants_ok: bool,
    pub invariants: serde_json::Value,
}

/// The ledger floor at one number of connections.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Tried {
    pub connections: usize,
    pub transfers_per_second: f64,
}

/// 1, 2, 4, ... up to `clients`, and `clients` itself.
fn connection_counts(clients: usize) -> Vec<usize> {
    let mut counts: Vec<usize> =
        std::iter::successors(Some(1_usize), |n| n.checked_mul(2)).take_while(|&n| n < clients).collect();
    counts.push(clients.max(1));
    counts
}

/// Everything one run measured.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Report {
    pub scenario: &'static str,
    pub accounts: usize,
    pub clients: usize,
    pub ledger_batch: usize,
    /// The best of these is the ledger floor.
    pub ledger_tried: Vec<Tried>,
    pub ledger: FloorReport,
    pub lifecycle_batches: Batches,
    /// Transactions at once per step, at most.
    pub lifecycle_at_once: Batches,
    pub lifecycle: FloorReport,
    pub lifecycle_steps: Vec<StepReport>,
    pub peak_rss_mib: Option<f64>,
}

/// Runs the scenario: the table on stdout, the JSON under `target/bench/`.
///
/// # Errors
/// As [`measure`], or when the report cannot be written.
pub fn run(base: &Config, args: &Args) -> anyhow::Result<()> {
    let runtime = super::runtime()?;
    let report = measure(base, args, &runtime)?;
    print_table(&report);
    let path = write_report("floor", &report)?;
    println!("JSON: {}", path.display());
    Ok(())
}

/// Runs both floors, each on a fresh database.
///
/// # Errors
/// When PostgreSQL refuses, a statement fails, or the arguments cannot make a run.
pub fn measure(base: &Config, args: &Args, runtime: &tokio::runtime::Runtime) -> anyhow::Result<Report> {
    if args.accounts < 2 || args.transfers == 0 || args.clients == 0 || args.batch == 0 {
        bail!("need at least 2 accounts, 1 transfer, 1 client and a batch of 1");
    }
    let deadline = || args.seconds.map(|s| Instant::now() + Duration::from_secs(s));
    let settled_topic = base.kafka.topics.transfers_settled.clone();

    // The ledger floor is the best of 1, 2, 4, ... connections up to `--clients`: batches of
    // a thousand transfers over ten thousand accounts lock about a fifth of them each, so
    // more connections can settle less, waiting on each other's locks.
    let mut ledger: Option<FloorReport> = None;
    let mut ledger_tried = Vec::new();
    for connections in connection_counts(args.clients) {
        let url = runtime.block_on(fresh_database(base, &format!("{}_ledger", args.database_prefix), args.accounts))?;
        eprintln!(
            "floor bench: ledger, {} transfers in batches of {}, {connections} connections",
            args.transfers, args.batch
        );
        let ledger_pool = pool(base, &url, connections)?;
        let batches = runtime.block_on(ledger_batches(&url, args))?;
        let measured =
            runtime.block_on(ledger_floor(&ledger_pool, batches, connections, deadline(), &settled_topic))?;
        let mut report = runtime.block_on(finish_report("ledger", &url, &ledger_pool, measured))?;
        report.connections = connections;
        ledger_tried.push(Tried { connections, transfers_per_second: report.transfers_per_second });
        if ledger.as_ref().is_none_or(|best| report.transfers_per_second > best.transfers_per_second) {
            ledger = Some(report);
        }
    }
    let Some(ledger) = ledger else { bail!("no ledger floor ran") };

    let url = runtime.block_on(fresh_database(base, &format!("{}_lifecycle", args.database_prefix), args.accounts))?;
    let batches = Batches {
        intake: base.http.intake_batch_max,
        outbox: usize::try_from(base.outbox.batch_size).unwrap_or(1),
        antifraud: base.antifraud.batch_max_records,
        ledger: base.ledger.batch_size,
        projection: base.projection.batch_max,
    };
    let at_once = Batches {
        intake: base.http.intake_writers,
        outbox: base.outbox.concurrency,
        antifraud: 1,
        ledger: base.ledger.max_concurrent_batches,
        projection: base.projection.writers,
    };
    eprintln!(
        "floor bench: lifecycle, {} transfers, {} clients, batches of {} / {} / {} / {} / {} \
         (intake / outbox / antifraud / ledger / projection)",
        args.transfers,
        args.clients,
        batches.intake,
        batches.outbox,
        batches.antifraud,
        batches.ledger,
        batches.projection
    );
    let topics = Topics { requested: base.kafka.topics.transfers_requested.clone(), settled: settled_topic };
    let pipeline = Arc::new(Pipeline::new(args.transfers, args.accounts, deadline(), [batches, at_once], topics));
    let lifecycle_pool = pool(base, &url, args.clients)?;
    let lifecycle = runtime.block_on(lifecycle_floor(&lifecycle_pool, args.clients, args.transfers, &pipeline))?;
    let mut lifecycle = runtime.block_on(finish_report("lifecycle", &url, &lifecycle_pool, lifecycle))?;
    lifecycle.connections = args.clients;
    Ok(Report {
        scenario: "floor",
        accounts: args.accounts,
        clients: args.clients,
        ledger_batch: args.batch,
        ledger,
        ledger_tried,
        lifecycle_batches: batches,
        lifecycle_at_once: at_once,
        lifecycle,
        lifecycle_steps: pipeline.steps(),
        peak_rss_mib: peak_rss_mib(),
    })
}

fn pool(base: &Config, url: &str, clients: usize) -> anyhow::Result<PgPool> {
    build_pool(&PoolSettings {
        url: url.to_owned(),
        max_size: clients,
        statement_timeout: base.database.statement_timeout,
        connect_timeout: base.database.connect_timeout,
        application_name: "tally-bench-floor".into(),
        outbox_notify_after_commit: true,
    })
}

/// How many transfers reached the end, and over how long.
struct Measured {
    transfers: usize,
    seconds: f64,
}

/// The floor's batches of transfers, made before it is measured, with what the intake and
/// antifraud would have written for them (the ledger settles only such transfers) in the
/// database at `url`.
async fn ledger_batches(url: &str, args: &Args) -> anyhow::Result<Vec<Vec<TransferAnalyzed>>> {
    let mut rng = super::ledger::Rng(0x9e37_79b9_7f4a_7c15);
    let mut batches = Vec::new();
    let mut left = args.transfers;
    while left > 0 {
        let n = args.batch.min(left);
        batches.push(ledger::transfers(&mut rng, n, args.accounts));
        left -= n;
    }
    let records = batches
        .iter()
        .flatten()
        .map(|t| {
            let payload = serde_json::to_string(t)?;
            Ok(Outgoing { topic: String::new(), key: String::new(), payload, event_type: "TransferAnalyzed" })
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    super::upstream::record(url, &records).await?;
    Ok(batches)
}

async fn ledger_floor(
    pool: &PgPool,
    batches: Vec<Vec<TransferAnalyzed>>,
    connections: usize,
    deadline: Option<Instant>,
    topic: &str,
) -> anyhow::Result<Measured> {
    let total = batches.iter().map(Vec::len).sum();
    let queue = Arc::new(std::sync::Mutex::new(batches));
    let settled = Arc::new(AtomicUsize::new(0));
    let started = Instant::now();
    let mut clients = Vec::new();
    for _ in 0..connections {
        let (pool, queue, settled, topic) = (pool.clone(), Arc::clone(&queue), Arc::clone(&settled), topic.to_owned());
        clients.push(tokio::spawn(async move {
            let mut conn = pool.get().await.context("no database connection")?;
            loop {
                let next = queue.lock().unwrap_or_else(std::sync::PoisonError::into_inner).pop();
                let Some(records) = next.filter(|_| deadline.is_none_or(|d| Instant::now() < d)) else {
                    return anyhow::Ok(());
                };
                let n = ledger::settle(&mut conn, &records, &topic).await.context("ledger floor batch")?;
                settled.fetch_add(n, Ordering::AcqRel);
            }
        }));
    }
    let shared = Arc::clone(&settled);
    let bar = Bar::start(total, "ledger floor: transfers settled", move || shared.load(Ordering::Acquire));
    let joined = futures_util::future::join_all(clients).await;
    let seconds = started.elapsed().as_secs_f64();
    bar.end().await;
    for result in joined {
        result.context("a ledger floor client panicked")??;
    }
    Ok(Measured { transfers: settled.load(Ordering::Acquire), seconds })
}

async fn lifecycle_floor(
    pool: &PgPool,
    clients: usize,
    transfers: usize,
    pipeline: &Arc<Pipeline>,
) -> anyhow::Result<Measured> {
    let started = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..clients {
        let (pool, pipeline) = (pool.clone(), Arc::clone(pipeline));
        tasks.push(tokio::spawn(async move {
            let mut conn = pool.get().await.context("no database connection")?;
            lifecycle::client(&pipeline, &mut conn).await
        }));
    }
    let shared = Arc::clone(pipeline);
    let bar = Bar::start(transfers, "lifecycle floor: transfers final", move || shared.counts().1);
    let joined = futures_util::future::join_all(tasks).await;
    let seconds = started.elapsed().as_secs_f64();
    bar.end().await;
    for result in joined {
        result.context("a lifecycle floor client panicked")??;
    }
    Ok(Measured { transfers: pipeline.counts().1, seconds })
}

/// A bar of `done()` out of `total` on stderr, updated every 200 ms until [`Bar::end`].
struct Bar {
    stop: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<()>,
}

impl Bar {
    fn start(total: usize, what: &'static str, done: impl Fn() -> usize + Send + 'static) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let stopped = Arc::clone(&stop);
        let task = tokio::spawn(async move {
            let mut bar = Progress::bar(what, total as u64);
            loop {
                let n = done() as u64;
                bar.raise_total(n);
                bar.update(n, String::new);
                if stopped.load(Ordering::Acquire) {
                    bar.finish();
                    return;
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        });
        Self { stop, task }
    }

    async fn end(self) {
        self.stop.store(true, Ordering::Release);
        let _ = self.task.await;
    }
}

/// The floor's figures, with the ledger invariants checked on its database.
async fn finish_report(floor: &'static str, url: &str, pool: &PgPool, m: Measured) -> anyhow::Result<FloorReport> {
    let mut conn = pool.get().await.context("no database connection")?;
    let check = tally_actors::store::invariants::check_ledger(&mut conn).await?;
    let processed: i64 = connect(url).await?.query_one(sql::PROCESSED_COUNT, &[]).await?.get(0);
    if usize::try_from(processed).ok() != Some(m.transfers) && floor == "ledger" {
        bail!("ledger floor: {processed} inbox rows for {} transfers settled", m.transfers);
    }
    let report = FloorReport {
        floor,
        transfers: m.transfers as u64,
        transfers_per_second: if m.seconds > 0.0 { m.transfers as f64 / m.seconds } else { 0.0 },
        seconds: m.seconds,
        connections: 0,
        invariants_ok: check.ok,
        invariants: serde_json::to_value(&check)?,
    };
    eprintln!("  {floor} floor: {:.0} transfers/s over {:.1} s", report.transfers_per_second, report.seconds);
    Ok(report)
}

fn print_table(r: &Report) {
    println!();
    println!("floor bench: PostgreSQL alone with tally's statements, {} clients, {} accounts", r.clients, r.accounts);
    println!("{:<12} {:>10} {:>13} {:>9} {:>10}", "floor", "transfers", "transfers/s", "seconds", "invariants");
    for f in [&r.ledger, &r.lifecycle] {
        println!(
            "{:<12} {:>10} {:>13.0} {:>9.1} {:>10}",
            f.floor,
            f.transfers,
            f.transfers_per_second,
            f.seconds,
            if f.invariants_ok { "ok" } else { "VIOLATED" }
        );
    }
    let tried: Vec<String> =
        r.ledger_tried.iter().map(|t| format!("{:.0}/s on {}", t.transfers_per_second, t.connections)).collect();
    println!("ledger floor: batches of {}; the best of {}", r.ledger_batch, tried.join(", "));
    let b = &r.lifecycle_batches;
    let a = &r.lifecycle_at_once;
    println!(
        "lifecycle floor: batches of {} (intake), {} (outbox), {} (antifraud), {} (ledger), {} (projection); \
         at most {}, {}, {}, {}, {} at once",
        b.intake,
        b.outbox,
        b.antifraud,
        b.ledger,
        b.projection,
        a.intake,
        a.outbox,
        a.antifraud,
        a.ledger,
        a.projection
    );
    println!("{:<12} {:>12} {:>10} {:>10} {:>14}", "step", "transactions", "rows", "rows/txn", "busy s (sum)");
    for s in &r.lifecycle_steps {
        let per = if s.transactions > 0 { s.rows as f64 / s.transactions as f64 } else { 0.0 };
        println!("{:<12} {:>12} {:>10} {:>10.1} {:>14.1}", s.step, s.transactions, s.rows, per, s.busy_seconds);
    }
}

#[cfg(test)]
mod tests;
