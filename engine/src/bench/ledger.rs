//! `tally bench ledger`: settles N pre-produced `TransferAnalyzed` records over 10,000
//! accounts (about 1% duplicates, 2% insufficient funds) with the ledger pipeline, then
//! runs the baseline ([`super::baseline::ledger`]: a classic consumer, sequential per
//! partition, one transaction per record, a commit after each) over the same records, and
//! prints both.

use std::time::{Duration, Instant};

use anyhow::bail;
use serde::Serialize;
use serde_json::json;
use uuid::Uuid;

use super::baseline::{self, ledger::ClassicConsumer};
use super::cluster::{Cluster, ClusterKind};
use super::stages::Stage;
use super::{
    daemon_config, fresh_database, histogram_quantile, http_get, metric_sum, peak_rss_mib, produce_all, write_report,
    Outgoing, Progress,
};
use crate::config::{Config, DbPool, LogFormat};
use tally_actors::ledger::LedgerTopics;

/// What to run.
#[derive(Debug, Clone)]
pub struct Args {
    pub transfers: usize,
    pub accounts: usize,
    pub partitions: i32,
    pub baseline: bool,
    /// The runs' databases are `<prefix>_tally` and `<prefix>_baseline`.
    pub database_prefix: String,
}

/// The measured figures of one run.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RunReport {
    pub mode: String,
    pub records: usize,
    /// Records per second from the first completed record to the last (group join
    /// excluded): for tally, from the first settlement transaction's start to the last one's.
    pub records_per_second: f64,
    pub settled: f64,
    pub rejected: f64,
    pub duplicates: f64,
    pub dead_lettered: f64,
    pub seconds: f64,
    /// Latency per record: tally's handler time (dispatch to completion, histogram
    /// estimates); the baseline's receive to commit.
    pub latency_p50_ms: Option<f64>,
    pub latency_p99_ms: Option<f64>,
    pub peak_rss_mib: Option<f64>,
    pub invariants_ok: bool,
    pub invariants: serde_json::Value,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct Report {
    scenario: &'static str,
    transfers: usize,
    accounts: usize,
    partitions: i32,
    duplicates: usize,
    insufficient: usize,
    tally: RunReport,
    baseline: Option<RunReport>,
    speedup: Option<f64>,
}

/// A small deterministic generator (xorshift64*), so every run uses the same data.
pub(crate) struct Rng(pub(crate) u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    pub(crate) fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

use super::account;

/// Runs the scenario.
///
/// # Errors
/// When the database or the broker cannot be used, or a run does not finish.
pub fn run(base: &Config, args: &Args) -> anyhow::Result<()> {
    check(args)?;
    let runtime = super::runtime()?;
    let cluster = Cluster::start(ClusterKind::Embedded)?;
    let (duplicates, insufficient, records) = runtime.block_on(produce(base, args, &cluster))?;
    eprintln!("  produced: {duplicates} duplicates, {insufficient} over the balance");

    let tally = run_once(base, args, &cluster, &records, false, &runtime)?;
    let baseline = if args.baseline { Some(run_once(base, args, &cluster, &records, true, &runtime)?) } else { None };
    let speedup = baseline.as_ref().map(|b| tally.records_per_second / b.records_per_second.max(f64::MIN_POSITIVE));
    let report = Report {
        scenario: "ledger",
        transfers: args.transfers,
        accounts: args.accounts,
        partitions: args.partitions,
        duplicates,
        insufficient,
        tally,
        baseline,
        speedup,
    };
    print_table(&report);
    let path = write_report("ledger", &report)?;
    println!("JSON: {}", path.display());
    Ok(())
}

/// The ledger pipeline alone on `cluster` over `args.transfers` records produced first (no
/// baseline): the ledger stage of `tally bench stages`.
///
/// # Errors
/// As [`run`].
pub fn alone(
    base: &Config,
    args: &Args,
    cluster: &Cluster,
    runtime: &tokio::runtime::Runtime,
) -> anyhow::Result<RunReport> {
    check(args)?;
    let (_, _, records) = runtime.block_on(produce(base, args, cluster))?;
    run_once(base, args, cluster, &records, false, runtime)
}

fn check(args: &Args) -> anyhow::Result<()> {
    if args.accounts < 2 || args.transfers == 0 {
        bail!("need at least 2 accounts and 1 transfer");
    }
    Ok(())
}

/// Creates the topics and produces the records; returns how many are duplicates and how
/// many are over the balance.
/// Produces the scenario's records; returns how many are copies, how many are over the
/// balance, and the records (whose upstream rows each run's fresh database gets).
async fn produce(base: &Config, args: &Args, cluster: &Cluster) -> anyhow::Result<(usize, usize, Vec<Outgoing>)> {
    let mut config = base.clone();
    cluster.configure(&mut config);
    config.kafka.partitions = args.partitions;
    cluster.create_topics(&config).await?;
    eprintln!(
        "ledger bench: producing {} TransferAnalyzed records over {} accounts, {} partitions",
        args.transfers, args.accounts, args.partitions
    );
    let mut backlog = Backlog {
        rng: Rng(0x9e37_79b9_7f4a_7c15),
        sent: Vec::with_capacity(args.transfers),
        topic: config.kafka.topics.transfers_analyzed.clone(),
        accounts: args.accounts,
        duplicates: 0,
        insufficient: 0,
    };
    produce_all(&cluster.bootstrap(), None, args.transfers, |_| Ok(backlog.next())).await?;
    let records = backlog
        .sent
        .into_iter()
        .map(|(key, payload)| Outgoing { topic: backlog.topic.clone(), key, payload, event_type: "TransferAnalyzed" })
        .collect();
    Ok((backlog.duplicates, backlog.insufficient, records))
}

/// The records of the scenario: about 1% copies of earlier ones, 2% over the balance.
struct Backlog {
    rng: Rng,
    /// (key, payload) of every record so far.
    sent: Vec<(String, String)>,
    topic: String,
    accounts: usize,
    duplicates: usize,
    insufficient: usize,
}

impl Backlog {
    fn next(&mut self) -> Outgoing {
        let (key, payload) = if !self.sent.is_empty() && self.rng.below(100) == 0 {
            self.duplicates += 1;
            self.sent[self.rng.below(self.sent.len())].clone()
        } else {
            let from = self.rng.below(self.accounts);
            let mut to = self.rng.below(self.accounts);
            if to == from {
                to = (to + 1) % self.accounts;
            }
            let over = self.rng.below(50) == 0;
            self.insufficient += usize::from(over);
            let amount: i64 = if over { 10_000_000_000 } else { 1 + self.rng.below(1_000) as i64 };
            // Time-ordered, as the intake makes them.
            let transfer_id = Uuid::now_v7();
            let event = json!({
                "eventId": tally_schema::derived_event_id("analyzed", transfer_id),
                "transferId": transfer_id, "sourceAccount": account(from), "destinationAccount": account(to),
                "amountCents": amount, "currency": "BRL", "score": 10, "analyzedAt": chrono::Utc::now(),
            });
            (account(from), event.to_string())
        };
        self.sent.push((key.clone(), payload.clone()));
        Outgoing { topic: self.topic.clone(), key, payload, event_type: "TransferAnalyzed" }
    }
}

/// What runs over the records: the daemon's ledger pipeline, or the classic consumer.
enum Runner {
    Tally { daemon: crate::DaemonHandle, metrics_url: String },
    Baseline(ClassicConsumer),
}

impl Runner {
    fn start(config: &Config, cluster: &Cluster, baseline: bool) -> anyhow::Result<Self> {
        if !baseline {
            let daemon = crate::spawn(config.clone(), cluster.embedded())?;
            let metrics_url = format!("http://{}/metrics", daemon.admin_addr);
            return Ok(Self::Tally { daemon, metrics_url });
        }
        let settings = baseline::ledger::Settings {
            url: config.database.url.expose().to_owned(),
            bootstrap: cluster.bootstrap(),
            topic: config.kafka.topics.transfers_analyzed.clone(),
            partitions: config.kafka.partitions,
            group: config.ledger.group_id.clone(),
            connections: config.pool_size(DbPool::named("ledger")),
            topics: LedgerTopics {
                settled: config.kafka.topics.transfers_settled.clone(),
                rejected: config.kafka.topics.transfers_rejected.clone(),
                max_balance_cents: config.ledger.max_balance_cents,
            },
            statement_timeout: config.database.statement_timeout,
            connect_timeout: config.database.connect_timeout,
        };
        Ok(Self::Baseline(ClassicConsumer::start(&settings)?))
    }

    /// How often progress is read. A scrape of the daemon's `/metrics` also counts the
    /// outbox backlog in PostgreSQL (60,000 unpublished rows here, about 20 ms a count),
    /// so the daemon is read once a second and its span taken from the database after.
    fn poll_interval(&self) -> Duration {
        match self {
            Self::Tally { .. } => Duration::from_secs(1),
            Self::Baseline(_) => Duration::from_millis(200),
        }
    }

    /// Records completed so far, and the daemon's metrics text when it is the daemon.
    fn done(&self, runtime: &tokio::runtime::Runtime) -> anyhow::Result<(f64, Option<String>)> {
        match self {
            Self::Tally { metrics_url, .. } => {
                let text = runtime.block_on(http_get(metrics_url))?;
                Ok((metric_sum(&text, "tally_records_total", "pipeline=\"ledger\""), Some(text)))
            }
            Self::Baseline(consumer) => Ok((consumer.done() as f64, None)),
        }
    }
}

/// One run over the records on `cluster` (tally's ledger pipeline alone, or the classic
/// consumer), on a fresh database.
fn run_once(
    base: &Config,
    args: &Args,
    cluster: &Cluster,
    records: &[Outgoing],
    baseline: bool,
    runtime: &tokio::runtime::Runtime,
) -> anyhow::Result<RunReport> {
    let label = if baseline { "baseline" } else { "tally" };
    let url = runtime.block_on(fresh_database(base, &format!("{}_{label}", args.database_prefix), args.accounts))?;
    runtime.block_on(super::upstream::record(&url, records))?;

    let mut config = daemon_config(base, &url, cluster);
    // The baseline settles one transfer per connection of its pool at once.
    let ledger = DbPool::named("ledger");
    config.database.pools.set(ledger, config.pool_size(ledger).max(16));
    config.kafka.partitions = args.partitions;
    config.pipelines = Stage::Ledger.alone();
    config.ledger.group_id = format!("bench-{label}");
    config.log.format = LogFormat::Pretty;
    eprintln!("ledger bench: running {label} over {} records", args.transfers);
    let started = Instant::now();
    let runner = Runner::start(&config, cluster, baseline)?;
    // The first completion happened after the last poll that saw none.
    let mut first: Option<Instant> = None;
    let mut polled = Instant::now();
    let mut progress = Progress::bar(&format!("ledger records settled ({label})"), args.transfers as u64);
    let deadline = Duration::from_secs(3_600);
    let text = loop {
        let now = Instant::now();
        let (done, text) = runner.done(runtime)?;
        if done > 0.0 && first.is_none() {
            // All of them between two polls: the span starts at the earlier poll.
            first = Some(if done >= args.transfers as f64 { polled } else { now });
        }
        polled = now;
        let rate = first.map_or(0.0, |f| done / f.elapsed().as_secs_f64().max(0.001));
        progress.update(done as u64, || format!("{rate:.0}/s since the first"));
        if done >= args.transfers as f64 {
            progress.finish();
            break text;
        }
        if started.elapsed() > deadline {
            bail!("{label} did not finish within {deadline:?}");
        }
        std::thread::sleep(runner.poll_interval());
    };
    let busy = match &runner {
        // The span PostgreSQL saw: the first batch's start to the last one's.
        Runner::Tally { .. } => runtime.block_on(settled_span(&url))?,
        Runner::Baseline(_) => None,
    }
    .unwrap_or_else(|| first.map_or(started.elapsed(), |f| f.elapsed()));
    let (outcomes, latency, invariants) = match runner {
        Runner::Tally { daemon, .. } => {
            let text = text.unwrap_or_default();
            let invariants = runtime.block_on(super::ledger_check(&format!("http://{}", daemon.admin_addr)))?;
            let outcome =
                |o: &str| metric_sum(&text, "tally_records_total", &format!("outcome=\"{o}\",pipeline=\"ledger\""));
            let ms =
                |q| histogram_quantile(&text, "tally_handler_seconds", "pipeline=\"ledger\"", q).map(|s| s * 1000.0);
            daemon.stop();
            let outcomes = ["settled", "rejected", "duplicate", "dead_lettered"].map(outcome);
            (outcomes, [ms(0.5), ms(0.99)], invariants)
        }
        Runner::Baseline(consumer) => {
            let outcomes = consumer.outcomes().map(|n| n as f64);
            let latency = [consumer.latency_ms(0.5), consumer.latency_ms(0.99)];
            let invariants = serde_json::to_value(consumer.stop()?)?;
            (outcomes, latency, invariants)
        }
    };
    let [settled, rejected, duplicates, dead_lettered] = outcomes;
    let report = RunReport {
        mode: label.into(),
        records: args.transfers,
        records_per_second: args.transfers as f64 / busy.as_secs_f64(),
        settled,
        rejected,
        duplicates,
        dead_lettered,
        seconds: busy.as_secs_f64(),
        latency_p50_ms: latency[0],
        latency_p99_ms: latency[1],
        peak_rss_mib: peak_rss_mib(),
        invariants_ok: invariants["ok"] == true,
        invariants,
    };
    eprintln!("  {label}: {:.0} records/s over {:.1} s", report.records_per_second, report.seconds);
    Ok(report)
}

fn print_table(r: &Report) {
    println!();
    println!(
        "ledger bench: {} transfers ({} duplicates, {} over the balance), {} accounts, {} partitions",
        r.transfers, r.duplicates, r.insufficient, r.accounts, r.partitions
    );
    println!(
        "{:<15} {:>12} {:>9} {:>9} {:>9} {:>9} {:>9} {:>10} {:>10}",
        "run", "records/s", "settled", "rejected", "dup", "p50 ms", "p99 ms", "RSS MiB", "invariants"
    );
    for run in std::iter::once(&r.tally).chain(r.baseline.iter()) {
        let opt = |v: Option<f64>| v.map_or("-".into(), |v| format!("{v:.1}"));
        println!(
            "{:<15} {:>12.0} {:>9.0} {:>9.0} {:>9.0} {:>9} {:>9} {:>10} {:>10}",
            run.mode,
            run.records_per_second,
            run.settled,
            run.rejected,
            run.duplicates,
            opt(run.latency_p50_ms),
            opt(run.latency_p99_ms),
            opt(run.peak_rss_mib),
            if run.invariants_ok { "ok" } else { "VIOLATED" }
        );
    }
    if let Some(s) = r.speedup {
        println!("tally / baseline: {s:.1}x");
    }
}

/// From the first settlement transaction's start to the last one's (`processed_at` is the
/// start of the transaction that settled the transfer), when at least two differ.
async fn settled_span(url: &str) -> anyhow::Result<Option<Duration>> {
    let row = super::connect(url).await?.query_one(super::sql::SETTLED_SPAN, &[]).await?;
    let seconds: Option<f64> = row.get(0);
    Ok(seconds.filter(|s| *s > 0.0).map(Duration::from_secs_f64))
}
