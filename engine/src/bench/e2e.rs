//! `tally bench e2e`: HTTP load on the whole flow (intake -> outbox -> antifraud -> ledger
//! -> outbox -> projection) with every pipeline in one daemon.
//!
//! 1. A fixed offered rate (default 500/s) for a while: latency from the intake commit to
//!    the projection's commit of the final status (`updated_at - created_at`), p50/p99.
//! 2. Open loop at the maximum (many concurrent clients): sustained transfers/s from POST
//!    to a final status, measured as final transfers over the span from the first
//!    creation to the last final update.
//!
//! Each phase also reports where the time went, hop by hop ([`super::hops`]).

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use serde::Serialize;
use serde_json::json;
use tokio::sync::Semaphore;

use super::cluster::{Cluster, ClusterKind};
use super::sql;
use super::{
    account, connect as db, daemon_config, fresh_database, hops, peak_rss_mib, plot, quantile, wait_for_zero,
    write_report, Progress,
};
use crate::config::Config;
use crate::DaemonHandle;

/// What to run.
#[derive(Debug, Clone)]
pub struct Args {
    pub rate: u32,
    pub rate_seconds: u64,
    pub max_seconds: u64,
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
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct Report {
    scenario: &'static str,
    accounts: usize,
    phases: Vec<Phase>,
    peak_rss_mib: Option<f64>,
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
    fn name(&self) -> String {
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
    let cluster = Cluster::start(ClusterKind::Embedded)?;
    eprintln!("e2e bench: starting a daemon with every pipeline");
    let target = Target::start(daemon_config(base, &url, &cluster), &cluster, args.clients, args.accounts, &runtime)?;
    let fixed = Load { rate: Some(args.rate), seconds: args.rate_seconds, clients: args.clients, limit: None };
    let open = Load { rate: None, seconds: args.max_seconds, clients: args.clients, limit: None };
    let phases = vec![runtime.block_on(target.load(&fixed))?, runtime.block_on(target.load(&open))?];
    let ledger_invariants_ok = runtime.block_on(target.ledger_ok())?;
    target.daemon.stop();
    let report =
        Report { scenario: "e2e", accounts: args.accounts, phases, peak_rss_mib: peak_rss_mib(), ledger_invariants_ok };
    print_table(&report);
    let path = write_report("e2e", &report)?;
    println!("JSON: {}", path.display());
    for plot in plots("e2e", &report.phases.iter().collect::<Vec<_>>())? {
        println!("plot: {}", plot.display());
    }
    Ok(())
}

/// A daemon with every pipeline on a fresh database, warmed up: what the load phases POST
/// to and measure.
pub struct Target {
    pub daemon: DaemonHandle,
    url: String,
    intake: String,
    client: reqwest::Client,
    accounts: usize,
}

impl Target {
    /// Starts a daemon on `config` (its database fresh, from [`fresh_database`] with
    /// `accounts` accounts) and `cluster`, and lets every consumer group join: one transfer
    /// through every stage, then forgotten. The HTTP client keeps up to `clients`
    /// connections.
    ///
    /// # Errors
    /// When the daemon does not start or the first transfer does not reach a final status.
    pub fn start(
        config: Config,
        cluster: &Cluster,
        clients: usize,
        accounts: usize,
        runtime: &tokio::runtime::Runtime,
    ) -> anyhow::Result<Self> {
        let target = Self::unwarmed(config, cluster, clients, accounts)?;
        runtime.block_on(async {
            target.post(0).await?;
            wait_final(&target.url, None, Duration::from_secs(120)).await?;
            clear(&target.url).await
        })?;
        Ok(target)
    }

    /// [`Target::start`] without the warm-up transfer: for a daemon whose pipelines do not
    /// take a transfer to a final status (the intake alone).
    ///
    /// # Errors
    /// When the daemon does not start.
    pub fn unwarmed(config: Config, cluster: &Cluster, clients: usize, accounts: usize) -> anyhow::Result<Self> {
        let url = config.database.connect_url();
        let daemon = crate::spawn(config, cluster.embedded())?;
        let intake = format!("http://{}", daemon.intake_addr);
        let client = reqwest::Client::builder().pool_max_idle_per_host(clients).build()?;
        Ok(Self { daemon, url, intake, client, accounts })
    }

    async fn post(&self, n: usize) -> anyhow::Result<()> {
        post(&self.client, &self.intake, n, self.accounts).await
    }

    /// Runs one load phase and measures it from the database; forgets its transfers after.
    ///
    /// # Errors
    /// When a query fails or the transfers do not all reach a final status in 10 minutes.
    pub async fn load(&self, load: &Load) -> anyhow::Result<Phase> {
        let name = load.name();
        eprintln!(
            "e2e bench: {name} for {} s{}",
            load.seconds,
            load.limit.map_or(String::new(), |l| format!(" or {l} transfers"))
        );
        let (sent, mut post_ms, errors) = self.send(load, &name).await?;
        post_ms.sort_by(f64::total_cmp);
        let created = u64::try_from(sent - errors)?;
        wait_final(&self.url, Some(created), Duration::from_secs(600)).await?;
        let mut phase = measure(&db(&self.url).await?, name).await?;
        clear(&self.url).await?;
        phase.offered_per_second = load.rate;
        phase.sent = sent;
        phase.http_errors = errors;
        phase.post_p50_ms = quantile(&post_ms, 0.5);
        phase.post_p99_ms = quantile(&post_ms, 0.99);
        Ok(phase)
    }

    /// POSTs for the phase; returns how many were sent, each one's latency in ms, and how
    /// many failed.
    pub(crate) async fn send(&self, load: &Load, name: &str) -> anyhow::Result<(usize, Vec<f64>, usize)> {
        let permits = Arc::new(Semaphore::new(if load.rate.is_some() { 1_000 } else { load.clients }));
        let started = Instant::now();
        let until = started + Duration::from_secs(load.seconds);
        let mut tasks = Vec::new();
        let mut n = 0_usize;
        let mut progress = match load.limit {
            Some(limit) => Progress::bar(&format!("{name}: transfers sent"), limit as u64),
            None => Progress::spinner(name),
        };
        while Instant::now() < until && load.limit.is_none_or(|l| n < l) {
            if let Some(r) = load.rate {
                let due = started + Duration::from_secs_f64(n as f64 / f64::from(r));
                tokio::time::sleep_until(due.into()).await;
            }
            let permit = Arc::clone(&permits).acquire_owned().await.context("load permits")?;
            let (client, intake, accounts) = (self.client.clone(), self.intake.clone(), self.accounts);
            tasks.push(tokio::spawn(async move {
                let sent = Instant::now();
                let result = post(&client, &intake, n + 1, accounts).await;
                drop(permit);
                (sent.elapsed().as_secs_f64() * 1000.0, result.is_ok())
            }));
            n += 1;
            progress.update(n as u64, || format!("sent {n}"));
        }
        progress.finish();
        let mut post_ms = Vec::with_capacity(tasks.len());
        let mut errors = 0;
        for t in tasks {
            let (ms, ok) = t.await?;
            post_ms.push(ms);
            errors += usize::from(!ok);
        }
        Ok((n, post_ms, errors))
    }

    /// Whether the ledger invariants hold (`/admin/ledger/check`).
    ///
    /// # Errors
    /// When the admin endpoint does not answer JSON.
    pub async fn ledger_ok(&self) -> anyhow::Result<bool> {
        let check = super::http_get(&format!("http://{}/admin/ledger/check", self.daemon.admin_addr)).await?;
        let check: serde_json::Value = serde_json::from_str(&check)?;
        Ok(check["ok"] == true)
    }
}

async fn post(client: &reqwest::Client, intake: &str, n: usize, accounts: usize) -> anyhow::Result<()> {
    let (from, to) = super::pair(n, accounts);
    let body = json!({
        "sourceAccount": account(from), "destinationAccount": account(to),
        "amountCents": 1 + (n % 500) as i64, "currency": "BRL",
    });
    let res = client.post(format!("{intake}/transfers")).json(&body).send().await?;
    if res.status() != reqwest::StatusCode::CREATED {
        bail!("POST /transfers answered {}", res.status());
    }
    Ok(())
}

/// Waits until no transfer is PENDING (a bar of the `total` created, when known).
async fn wait_final(url: &str, total: Option<u64>, limit: Duration) -> anyhow::Result<()> {
    let client = db(url).await?;
    wait_for_zero(&client, sql::TRANSFERS_PENDING, "transfers finished", total, limit).await
}

/// Forgets finished transfers between phases (the measurements read `transfers`).
async fn clear(url: &str) -> anyhow::Result<()> {
    db(url).await?.batch_execute(sql::TRANSFERS_DELETE_FINISHED).await?;
    Ok(())
}

/// The phase's figures from the finished transfers in the database (the POST figures are
/// the caller's).
async fn measure(client_db: &tokio_postgres::Client, name: String) -> anyhow::Result<Phase> {
    let row = client_db.query_one(sql::TRANSFERS_FINISHED_SPAN, &[]).await?;
    let finished: i64 = row.get(0);
    let span: f64 = row.get(1);
    let mut final_ms: Vec<f64> =
        client_db.query(sql::TRANSFERS_FINAL_MS, &[]).await?.iter().map(|r| r.get::<_, f64>(0)).collect();
    final_ms.sort_by(f64::total_cmp);
    let hops = hops::breakdown(client_db).await?;
    let offsets: Vec<f64> =
        client_db.query(sql::TRANSFERS_FINAL_OFFSETS, &[]).await?.iter().map(|r| r.get::<_, f64>(0)).collect();
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
    }
    println!(
        "latencies in ms; peak RSS {} MiB; ledger invariants {}",
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
