//! `tally bench e2e`: HTTP load on the whole flow (intake -> outbox -> antifraud -> ledger
//! -> outbox -> projection) with every pipeline in one daemon.
//!
//! The daemon is a `tally run` child process and the embedded broker a `tally broker` child
//! process, both configured by `TALLY__*` variables over the bench's own; the bench itself
//! is the HTTP load generator. So each phase can report the daemon's own CPU time per
//! transfer that reached its final status ([`super::cpu`]), beside the broker's, the
//! bench's and that of the PostgreSQL backends serving the bench's database.
//!
//! 1. A fixed offered rate (default 500/s) for a while: latency from the intake commit to
//!    the projection's commit of the final status (`updated_at - created_at`), p50/p99.
//! 2. Open loop at the maximum (many concurrent clients): sustained transfers/s from POST
//!    to a final status, measured as final transfers over the span from the first
//!    creation to the last final update.
//!
//! Each phase also reports where the time went, hop by hop ([`super::hops`]).

use anyhow::bail;
use serde::Serialize;

use super::cluster::Cluster;
use super::cpu::PhaseCpu;
use super::sql;
use super::target::Target;
use super::{fresh_database, hops, peak_rss_mib, plot, quantile, stamp, write_report};
use crate::config::Config;

/// What to run.
#[derive(Debug, Clone)]
pub struct Args {
    pub rate: u32,
    pub rate_seconds: u64,
    pub max_seconds: u64,
    /// Seconds without load before the phases (the processes' idle CPU).
    pub idle_seconds: u64,
    pub clients: usize,
    pub accounts: usize,
    /// The database (dropped and re-created).
    pub database: String,
}

/// The figures of one load phase.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Phase {
    pub name: String,
    pub offered_per_second: Option<u32>,
    pub sent: usize,
    pub http_errors: usize,
    pub finished: i64,
    /// Final transfers / (last final update - first creation).
    pub sustained_per_second: f64,
    pub post_p50_ms: Option<f64>,
    pub post_p99_ms: Option<f64>,
    /// Intake commit to final status commit.
    pub final_p50_ms: Option<f64>,
    pub final_p99_ms: Option<f64>,
    /// Where the time went, hop by hop (settled transfers).
    pub hops: Vec<hops::Hop>,
    /// Final statuses per second since the phase's first transfer, for the plot.
    #[serde(skip)]
    pub per_second: Vec<(f64, f64)>,
    /// The CDF of POST -> final status, for the plot.
    #[serde(skip)]
    pub final_cdf: Vec<(f64, f64)>,
    /// CPU time per process from the first POST to the last final status (a daemon in a
    /// child process only).
    pub cpu: Option<PhaseCpu>,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct Report {
    scenario: &'static str,
    accounts: usize,
    /// CPU per process with no load, before the phases.
    idle_cpu: Option<PhaseCpu>,
    phases: Vec<Phase>,
    /// The bench's own (the load generator).
    peak_rss_mib: Option<f64>,
    daemon_peak_rss_mib: Option<f64>,
    ledger_invariants_ok: bool,
}

/// One load phase: POST /transfers at `rate` per second, or as fast as `clients`
/// concurrent clients go (`rate` `None`), for `seconds` or until `limit` transfers are
/// sent, whichever comes first; then wait for every transfer's final status.
#[derive(Debug, Clone)]
pub struct Load {
    pub rate: Option<u32>,
    pub seconds: u64,
    pub clients: usize,
    pub limit: Option<usize>,
}

impl Load {
    pub(super) fn name(&self) -> String {
        self.rate.map_or_else(|| format!("open loop, {} clients", self.clients), |r| format!("{r}/s offered"))
    }
}

/// Runs the scenario.
///
/// # Errors
/// When the database, the broker or the daemon fail.
pub fn run(base: &Config, args: &Args) -> anyhow::Result<()> {
    if args.accounts < 2 || args.rate == 0 || args.clients == 0 {
        bail!("need at least 2 accounts, a positive rate and at least 1 client");
    }
    let runtime = super::runtime()?;
    let url = runtime.block_on(fresh_database(base, &args.database, args.accounts))?;
    let logs = ["broker", "daemon"].map(|p| format!("target/bench/e2e-{p}-{}.log", stamp()));
    eprintln!("e2e bench: starting a broker and a daemon with every pipeline, each a process of its own");
    let cluster = Cluster::process(base.kafka.partitions, &logs[0])?;
    let target =
        Target::spawn(base, (&url, &args.database), &cluster, (args.clients, args.accounts), &logs[1], &runtime)?;
    let idle_cpu = runtime.block_on(target.idle(std::time::Duration::from_secs(args.idle_seconds)));
    let fixed = Load { rate: Some(args.rate), seconds: args.rate_seconds, clients: args.clients, limit: None };
    let open = Load { rate: None, seconds: args.max_seconds, clients: args.clients, limit: None };
    let phases = vec![runtime.block_on(target.load(&fixed))?, runtime.block_on(target.load(&open))?];
    let ledger_invariants_ok = runtime.block_on(target.ledger_ok())?;
    let daemon_peak_rss_mib = target.pid().and_then(super::peak_rss_mib_of);
    target.stop();
    drop(cluster);
    let report = Report {
        scenario: "e2e",
        accounts: args.accounts,
        idle_cpu,
        phases,
        peak_rss_mib: peak_rss_mib(),
        daemon_peak_rss_mib,
        ledger_invariants_ok,
    };
    print_table(&report);
    println!("logs of the daemon and the broker: {}, {}", logs[1], logs[0]);
    let path = write_report("e2e", &report)?;
    println!("JSON: {}", path.display());
    for plot in plots("e2e", &report.phases.iter().collect::<Vec<_>>())? {
        println!("plot: {}", plot.display());
    }
    Ok(())
}

/// The phase's figures from the finished transfers in the database (the POST figures are
/// the caller's).
pub(super) async fn measure(client_db: &tokio_postgres::Client, name: String, since: f64) -> anyhow::Result<Phase> {
    let row = client_db.query_one(&sql::transfers_finished_span(), &[&since]).await?;
    let finished: i64 = row.get(0);
    let span: f64 = row.get(1);
    let mut final_ms: Vec<f64> =
        client_db.query(&sql::transfers_final_ms(), &[&since]).await?.iter().map(|r| r.get::<_, f64>(0)).collect();
    final_ms.sort_by(f64::total_cmp);
    let hops = hops::breakdown(client_db, since).await?;
    let offsets: Vec<f64> =
        client_db.query(&sql::transfers_final_offsets(), &[&since]).await?.iter().map(|r| r.get::<_, f64>(0)).collect();
    let per_second = plot::full_bins(&offsets, 1.0);
    Ok(Phase {
        name,
        offered_per_second: None,
        sent: 0,
        http_errors: 0,
        finished,
        sustained_per_second: if span > 0.0 { finished as f64 / span } else { 0.0 },
        post_p50_ms: None,
        post_p99_ms: None,
        final_p50_ms: quantile(&final_ms, 0.5),
        final_p99_ms: quantile(&final_ms, 0.99),
        hops,
        per_second,
        final_cdf: plot::cdf(&final_ms, 400),
        cpu: None,
    })
}

fn print_table(r: &Report) {
    let opt = |v: Option<f64>| v.map_or("-".into(), |v| format!("{v:.1}"));
    println!();
    println!("e2e bench: {} accounts; POST /transfers -> final status through every pipeline", r.accounts);
    println!(
        "{:<26} {:>8} {:>7} {:>9} {:>12} {:>10} {:>10} {:>11} {:>11}",
        "phase", "sent", "errors", "finished", "final/s", "POST p50", "POST p99", "final p50", "final p99"
    );
    if let Some(idle) = &r.idle_cpu {
        println!("idle, no load");
        for line in idle.lines() {
            println!("{line}");
        }
    }
    for p in &r.phases {
        println!(
            "{:<26} {:>8} {:>7} {:>9} {:>12.0} {:>10} {:>10} {:>11} {:>11}",
            p.name,
            p.sent,
            p.http_errors,
            p.finished,
            p.sustained_per_second,
            opt(p.post_p50_ms),
            opt(p.post_p99_ms),
            opt(p.final_p50_ms),
            opt(p.final_p99_ms)
        );
        for line in hops::lines(&p.hops) {
            println!("{line}");
        }
        for line in p.cpu.iter().flat_map(PhaseCpu::lines) {
            println!("{line}");
        }
    }
    println!(
        "latencies in ms; CPU: user + system time per transfer that reached a final status; peak RSS: daemon {} MiB, bench {} MiB; ledger invariants {}",
        opt(r.daemon_peak_rss_mib),
        opt(r.peak_rss_mib),
        if r.ledger_invariants_ok { "ok" } else { "VIOLATED" }
    );
}

/// Throughput over time and the latency CDF of every phase, as SVG beside the JSON.
///
/// # Errors
/// When a file cannot be written.
pub fn plots(scenario: &str, phases: &[&Phase]) -> anyhow::Result<Vec<std::path::PathBuf>> {
    let series: Vec<_> =
        phases.iter().map(|p| plot::Phase { name: &p.name, rate: &p.per_second, cdf: &p.final_cdf }).collect();
    plot::throughput_and_cdf(
        &super::output_dir()?,
        scenario,
        plot::Axes {
            title: &format!("{scenario}: transfers reaching a final status per second"),
            x: "seconds since the phase's first transfer",
            y: "final statuses / s",
        },
        plot::Axes {
            title: &format!("{scenario}: POST -> final status, cumulative distribution"),
            x: "ms",
            y: "fraction of transfers",
        },
        &series,
    )
}
