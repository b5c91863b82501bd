//! `tally bench soak`: cost as work grows. N `TransferAnalyzed` records (default 2,000,000)
//! over M accounts (default 1,000,000; source accounts follow [`super::pair`], so the
//! first M records alone touch every account) settled by ONE `tally run` child running only
//! the ledger, on the bench's embedded broker. Per window of W processed records: the
//! window's records/s and its ratio to the first (flagged below 0.8), the daemon's RSS at
//! its end and the highest within it, the live keyed workers, the postings so far, and
//! the database server's WAL and checkpoints in the window (`soak/database.rs`).
//!
//! - **Throughput** counts `tally_records_total{pipeline="ledger"}` from the child's
//!   `/metrics` every 200 ms (a counter read costs the same at any size; counting
//!   `processed_transfers` would not); a window's bounds are interpolated between polls.
//! - **RSS** is the child's own `VmRSS` (`/proc/<pid>/status`) every second: the broker,
//!   the producer and this bench live in another process.
//! - **Input** is produced while the daemon consumes, at most 2,500 records per partition
//!   ahead of it: the bench never holds the records, and the mock broker keeps only the
//!   last 5 MiB of each partition (records produced further ahead would be lost). It also
//!   keeps the daemon's prefetch small, so its RSS is the daemon's and not a backlog's.
//! - The child's periodic ledger check is off (`ledger.check_interval_secs = 0`): it scans
//!   every account and posting on a timer, a cost that grows with the ledger by design and
//!   would land in one window at random.
//!
//! What keeps the RSS flat: the keyed workers (the ledger's `KeyedWorker`, one per
//! source account) hold no state of their own (balances are locked and read from
//! PostgreSQL per settlement batch), and the pipeline's `WorkerRegistry` keeps at most
//! `consumer.max_live_workers` (20,000) of them: a new account at the cap evicts the least
//! recently used idle ones down to 90% of it, and the consume loop passivates any idle for
//! `consumer.idle_after_secs` (60 s) every 5 s. A million accounts touched costs 20,000
//! live actors at most. Records in flight are bounded per partition
//! (`consumer.max_in_flight`, `consumer.max_uncommitted`).
//!
//! Figures are reported, never asserted: targets are 0.8 of the first window's rate and
//! 256 MiB of RSS.

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use rdkafka::producer::FutureProducer;
use serde::Serialize;

use super::child::{Daemon, Site, Stream};
use super::plot::{self, Axes, Line};
use super::{connect, http_get, metric_sum, rss_mib, write_report, Progress};
use crate::config::Config;

mod database;
mod table;
mod windows;
use database::{Load, Mark, Probe};
use windows::{ratio, Closed, Windows};

/// The daemon's RSS target, MiB.
const TARGET_RSS_MIB: f64 = 256.0;
/// A window slower than this fraction of the first is flagged.
const SLOW_RATIO: f64 = 0.8;
/// Records produced ahead of the daemon, per partition.
const LEAD_PER_PARTITION: usize = 2_500;
const POLL: Duration = Duration::from_millis(200);
const RSS_EVERY: Duration = Duration::from_secs(1);
/// The run fails when no record completes for this long.
const STALL: Duration = Duration::from_secs(120);

/// What to run.
#[derive(Debug, Clone)]
pub struct Args {
    pub transfers: usize,
    pub accounts: usize,
    /// Processed records per window.
    pub window: usize,
    /// The database (dropped and re-created).
    pub database: String,
}

/// One window of processed records.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
struct Window {
    /// 1-based.
    index: usize,
    /// Records processed at its end.
    records: u64,
    seconds: f64,
    records_per_second: f64,
    ratio_to_first: f64,
    /// Below [`SLOW_RATIO`] of the first window.
    slow: bool,
    rss_end_mib: Option<f64>,
    rss_max_mib: Option<f64>,
    /// `tally_live_actors{pipeline="ledger"}` at its end.
    live_actors: f64,
    /// Rows of `postings` at its end.
    postings: i64,
    /// WAL and checkpoints of the database server in the window (`None` when its
    /// statistics cannot be read).
    database: Option<Load>,
}

/// One RSS sample.
#[derive(Debug, Clone, Copy, Serialize)]
#[serde(rename_all = "camelCase")]
struct Sample {
    records: f64,
    rss_mib: f64,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct Report {
    scenario: &'static str,
    transfers: usize,
    accounts: usize,
    window: usize,
    partitions: i32,
    /// Records produced ahead of the daemon at most.
    lead: usize,
    seconds: f64,
    /// The daemon's RSS once it held its partitions, before any record.
    rss_idle_mib: Option<f64>,
    max_rss_mib: f64,
    target_rss_mib: f64,
    rss_within_target: bool,
    /// The lowest window rate over the first window's.
    slowest_ratio: f64,
    slow_ratio: f64,
    /// The mean ratio to the first window of the windows in which the database
    /// checkpointed for WAL volume, and of the others.
    ratio_with_wal_checkpoint: Option<f64>,
    ratio_without_wal_checkpoint: Option<f64>,
    windows: Vec<Window>,
    /// The daemon's RSS every second, by records processed.
    rss: Vec<Sample>,
}

/// Runs the scenario.
///
/// # Errors
/// When the database, the broker or the daemon fail, or the daemon stalls.
pub fn run(base: &Config, args: &Args) -> anyhow::Result<()> {
    if args.transfers == 0 || args.accounts < 2 || args.window == 0 {
        bail!("need at least 1 transfer, 2 accounts and a window of 1 record");
    }
    eprintln!("soak bench: creating {} accounts in database {}", args.accounts, args.database);
    let site = Site::new(base, &args.database, args.accounts)?;
    let (topic, group) = site.prepare("soak", "soak")?;
    eprintln!("soak bench: one daemon, {} records, windows of {}", args.transfers, args.window);
    let mut daemons = site.start(1, &topic, &group, &[("TALLY__LEDGER__CHECK_INTERVAL_SECS", "0")])?;
    let daemon = daemons.pop().context("no daemon started")?;
    let report = Soak::new(&site, args, &daemon, topic)?.run()?;
    drop(daemon);
    table::print(&report);
    let path = write_report("soak", &report)?;
    println!("JSON: {}", path.display());
    for svg in plots(&report, Path::new("target/bench"))? {
        println!("plot: {}", svg.display());
    }
    Ok(())
}

/// The run in progress.
struct Soak<'a> {
    site: &'a Site<'a>,
    args: &'a Args,
    daemon: &'a Daemon,
    db: tokio_postgres::Client,
    /// The database's WAL and checkpoint counters, and their reading at the last window's
    /// end.
    probe: Option<(Probe, Mark)>,
    producer: FutureProducer,
    stream: Stream,
    topic: String,
    lead: usize,
    produced: usize,
    windows: Windows,
    /// The highest RSS since the current window began.
    window_rss: Option<f64>,
    samples: Vec<Sample>,
    done: Vec<Window>,
}

impl<'a> Soak<'a> {
    fn new(site: &'a Site<'a>, args: &'a Args, daemon: &'a Daemon, topic: String) -> anyhow::Result<Self> {
        let db = site.runtime.block_on(connect(&site.url))?;
        let probe = site.runtime.block_on(async {
            let probe = Probe::new(&db).await?;
            let mark = probe.mark(&db).await?;
            anyhow::Ok((probe, mark))
        });
        let probe = probe
            .inspect_err(|e| {
                eprintln!("soak bench: the database's WAL statistics are not readable ({e:#}); no WAL columns")
            })
            .ok();
        Ok(Self {
            db,
            probe,
            producer: site.producer()?,
            stream: Stream::new(args.accounts, site.partitions)?,
            lead: LEAD_PER_PARTITION * usize::try_from(site.partitions.max(1)).unwrap_or(1),
            windows: Windows::new(args.window as u64, args.transfers as u64),
            produced: 0,
            window_rss: None,
            samples: Vec::new(),
            done: Vec::new(),
            site,
            args,
            daemon,
            topic,
        })
    }

    fn run(mut self) -> anyhow::Result<Report> {
        let rss_idle = rss_mib(self.daemon.pid());
        let total = self.args.transfers as f64;
        let started = Instant::now();
        let mut sampled: Option<Instant> = None;
        let (mut last, mut moved) = (0.0, Instant::now());
        let mut progress = Progress::bar("records processed", self.args.transfers as u64);
        loop {
            let text = self.metrics()?;
            // `abs`: the sum of no sample yet is -0.0.
            let processed = metric_sum(&text, "tally_records_total", "pipeline=\"ledger\"").abs();
            if sampled.is_none_or(|s| s.elapsed() >= RSS_EVERY) {
                sampled = Some(Instant::now());
                self.sample(processed);
            }
            for closed in self.windows.observe(started.elapsed().as_secs_f64(), processed) {
                self.close(closed, &text)?;
            }
            let rss = self.samples.last().map_or(0.0, |s| s.rss_mib);
            progress.update(processed as u64, || format!("daemon RSS {rss:.0} MiB"));
            if processed >= total {
                break;
            }
            if processed > last {
                (last, moved) = (processed, Instant::now());
            } else if moved.elapsed() > STALL {
                bail!("no record processed for {STALL:?} at {processed} of {total}");
            }
            self.top_up(processed as usize)?;
            std::thread::sleep(POLL);
        }
        progress.finish();
        Ok(self.report(rss_idle, started.elapsed().as_secs_f64()))
    }

    fn metrics(&self) -> anyhow::Result<String> {
        let url = format!("{}/metrics", self.daemon.admin);
        self.site
            .runtime
            .block_on(http_get(&url))
            .with_context(|| format!("the daemon does not answer at {url}; see its log under target/bench"))
    }

    fn sample(&mut self, records: f64) {
        if let Some(rss) = rss_mib(self.daemon.pid()) {
            self.samples.push(Sample { records, rss_mib: rss });
            self.window_rss = Some(self.window_rss.map_or(rss, |m| m.max(rss)));
        }
    }

    /// Records window `closed`: the RSS now, the live actors and the postings.
    fn close(&mut self, closed: Closed, metrics: &str) -> anyhow::Result<()> {
        let rss_end = rss_mib(self.daemon.pid());
        let rss_max = match (self.window_rss, rss_end) {
            (Some(a), Some(b)) => Some(a.max(b)),
            (a, b) => a.or(b),
        };
        self.window_rss = rss_end;
        let postings: i64 = self.site.runtime.block_on(self.db.query_one(super::sql::POSTINGS_COUNT, &[]))?.get(0);
        let database = match &mut self.probe {
            Some((probe, last)) => {
                let now = self.site.runtime.block_on(probe.mark(&self.db))?;
                Some(now.since(std::mem::replace(last, now)))
            }
            None => None,
        };
        let first = self.done.first().map_or(closed.rate, |w| w.records_per_second);
        let ratio = ratio(closed.rate, first);
        self.done.push(Window {
            index: self.done.len() + 1,
            records: closed.end,
            seconds: closed.seconds,
            records_per_second: closed.rate,
            ratio_to_first: ratio,
            slow: ratio < SLOW_RATIO,
            rss_end_mib: rss_end,
            rss_max_mib: rss_max,
            live_actors: metric_sum(metrics, "tally_live_actors", "pipeline=\"ledger\""),
            postings,
            database,
        });
        Ok(())
    }

    /// Produces up to `lead` records ahead of `processed`, and waits for their delivery.
    fn top_up(&mut self, processed: usize) -> anyhow::Result<()> {
        let target = (processed + self.lead).min(self.args.transfers);
        if self.produced >= target {
            return Ok(());
        }
        let (producer, stream, topic) = (&self.producer, &mut self.stream, self.topic.as_str());
        let count = target - self.produced;
        self.site.runtime.block_on(async {
            let mut deliveries = Vec::with_capacity(count);
            for _ in 0..count {
                deliveries.push(stream.send(producer, topic)?.delivery);
            }
            for d in deliveries {
                d.await.context("delivery report lost")?.map_err(|(e, _)| e)?;
            }
            anyhow::Ok(())
        })?;
        self.produced = target;
        Ok(())
    }

    fn report(self, rss_idle_mib: Option<f64>, seconds: f64) -> Report {
        let max_rss_mib = self
            .samples
            .iter()
            .map(|s| s.rss_mib)
            .chain(self.done.iter().filter_map(|w| w.rss_max_mib))
            .fold(0.0, f64::max);
        let (ratio_with_wal_checkpoint, ratio_without_wal_checkpoint) =
            database::ratio_by_checkpoints(self.done.iter().skip(1).map(|w| (w.ratio_to_first, w.database.as_ref())));
        Report {
            scenario: "soak",
            transfers: self.args.transfers,
            accounts: self.args.accounts,
            window: self.args.window,
            partitions: self.site.partitions,
            lead: self.lead,
            seconds,
            rss_idle_mib,
            max_rss_mib,
            target_rss_mib: TARGET_RSS_MIB,
            rss_within_target: max_rss_mib <= TARGET_RSS_MIB,
            slowest_ratio: self.done.iter().map(|w| w.ratio_to_first).fold(f64::INFINITY, f64::min),
            slow_ratio: SLOW_RATIO,
            ratio_with_wal_checkpoint,
            ratio_without_wal_checkpoint,
            windows: self.done,
            rss: self.samples,
        }
    }
}

/// The two SVGs: records/s per window, and the daemon's RSS, over records processed.
fn plots(r: &Report, dir: &Path) -> anyhow::Result<Vec<std::path::PathBuf>> {
    let end = r.transfers as f64;
    let level = |name: String, y: f64| Line { name, points: vec![(0.0, y), (end, y)] };
    let rates = Line {
        name: "records/s of the window".into(),
        points: r.windows.iter().map(|w| (w.records as f64, w.records_per_second)).collect(),
    };
    let first = r.windows.first().map_or(0.0, |w| w.records_per_second);
    let throughput = plot::lines(
        dir,
        "soak-throughput",
        Axes { title: "soak: ledger records/s per window", x: "records processed", y: "records/s" },
        &[rates, level(format!("{:.0}% of the first window", SLOW_RATIO * 100.0), first * SLOW_RATIO)],
    )?;
    let rss = Line { name: "daemon RSS".into(), points: r.rss.iter().map(|s| (s.records, s.rss_mib)).collect() };
    let memory = plot::lines(
        dir,
        "soak-rss",
        Axes { title: "soak: daemon RSS (broker apart)", x: "records processed", y: "MiB" },
        &[rss, level(format!("target {TARGET_RSS_MIB:.0} MiB"), TARGET_RSS_MIB)],
    )?;
    Ok(vec![throughput, memory])
}
