//! `tally bench outbox`: the transactional outbox publisher against the classic relay shape
//! (`@Scheduled(fixedDelay = 200)`, batches of 100, no LISTEN: at most 500 rows/s;
//! [`super::baseline::relay`]), in the same process as the bench.
//!
//! 1. Drain: N rows pending before the publisher starts; rate = rows / (last
//!    `published_at` - first `published_at`).
//! 2. Commit-to-publish latency at a fixed intake rate (POST /transfers): per row,
//!    `published_at - created_at` (the intake transaction's time to the publisher's
//!    marking, which follows the broker's acknowledgement), p50/p99.
//!
//! Only the outbox pipeline runs, so nothing else competes for the machine.

use std::time::{Duration, Instant};

use anyhow::bail;
use serde::Serialize;
use serde_json::json;

use super::baseline::relay::{self, ClassicRelay};
use super::cluster::{Cluster, ClusterKind};
use super::stages::Stage;
use super::{account, connect as db, daemon_config, fresh_database, quantile, wait_for_zero, write_report};
use super::{plot, sql};
use crate::config::Config;

#[derive(Debug, Clone)]
pub struct Args {
    pub rows: usize,
    pub rate: u32,
    pub seconds: u64,
    /// The runs' databases are `<prefix>_tally` and `<prefix>_classic_relay`.
    pub database_prefix: String,
}

#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ModeReport {
    pub mode: String,
    pub batch_size: i64,
    pub poll_interval_ms: u64,
    pub listen: bool,
    pub drain_rows: usize,
    pub drain_rows_per_second: f64,
    pub offered_per_second: u32,
    pub published: i64,
    pub commit_to_publish_p50_ms: Option<f64>,
    pub commit_to_publish_p99_ms: Option<f64>,
    /// Rows published per second through the drain, for the plot.
    #[serde(skip)]
    pub drain_per_second: Vec<(f64, f64)>,
    /// The CDF of commit -> publish at the fixed rate, for the plot.
    #[serde(skip)]
    pub commit_to_publish_cdf: Vec<(f64, f64)>,
}

#[derive(Debug, Serialize)]
struct Report {
    scenario: &'static str,
    modes: Vec<ModeReport>,
}

/// Runs the scenario.
///
/// # Errors
/// When the database, the broker or the daemon fail.
pub fn run(base: &Config, args: &Args) -> anyhow::Result<()> {
    if args.rows == 0 || args.rate == 0 {
        bail!("need at least one row and a positive rate");
    }
    let runtime = super::runtime()?;
    let mut reports = Vec::new();
    for classic in [false, true] {
        reports.push(run_mode(base, args, &runtime, classic)?);
    }
    let report = Report { scenario: "outbox", modes: reports };
    let opt = |v: Option<f64>| v.map_or("-".into(), |v| format!("{v:.1}"));
    println!();
    println!(
        "outbox bench: drain of {} pending rows; commit-to-publish at {}/s for {} s",
        args.rows, args.rate, args.seconds
    );
    println!(
        "{:<12} {:>6} {:>8} {:>7} {:>12} {:>10} {:>10} {:>10}",
        "mode", "batch", "poll ms", "listen", "drain rows/s", "published", "p50 ms", "p99 ms"
    );
    for m in &report.modes {
        println!(
            "{:<12} {:>6} {:>8} {:>7} {:>12.0} {:>10} {:>10} {:>10}",
            m.mode,
            m.batch_size,
            m.poll_interval_ms,
            m.listen,
            m.drain_rows_per_second,
            m.published,
            opt(m.commit_to_publish_p50_ms),
            opt(m.commit_to_publish_p99_ms)
        );
    }
    if let [t, s] = report.modes.as_slice() {
        println!(
            "drain: tally / classic relay = {:.1}x",
            t.drain_rows_per_second / s.drain_rows_per_second.max(f64::MIN_POSITIVE)
        );
    }
    let path = write_report("outbox", &report)?;
    println!("JSON: {}", path.display());
    let series: Vec<_> = report
        .modes
        .iter()
        .map(|m| plot::Phase { name: &m.mode, rate: &m.drain_per_second, cdf: &m.commit_to_publish_cdf })
        .collect();
    let drawn = plot::throughput_and_cdf(
        &super::output_dir()?,
        "outbox",
        plot::Axes {
            title: "outbox: rows published per second through the drain",
            x: "seconds since the first publication",
            y: "rows / s",
        },
        plot::Axes {
            title: "outbox: commit -> publish at the fixed rate, cumulative distribution",
            x: "ms",
            y: "fraction of rows",
        },
        &series,
    )?;
    for plot in drawn {
        println!("plot: {}", plot.display());
    }
    Ok(())
}

async fn wait_drained(client: &tokio_postgres::Client, label: &str) -> anyhow::Result<()> {
    let what = format!("outbox rows published ({label})");
    wait_for_zero(client, sql::OUTBOX_PENDING, &what, None, Duration::from_secs(1_800)).await
}

/// Inserts `rows` committed, unpublished outbox rows (`TransferRequested` to
/// `transfers.requested`, 1,000 keys, 200-byte payloads) into the database at `url`.
///
/// # Errors
/// When the database refuses.
pub(crate) async fn insert_pending(url: &str, rows: usize) -> anyhow::Result<()> {
    let rows = i32::try_from(rows)?;
    db(url).await?.execute(sql::OUTBOX_INSERT_PENDING, &[&rows]).await?;
    Ok(())
}

/// One mode of the bench, both phases (drain, then latency at a fixed rate). Over 80
/// lines because the phases share the daemon, the database and the report fields.
fn run_mode(
    base: &Config,
    args: &Args,
    runtime: &tokio::runtime::Runtime,
    classic: bool,
) -> anyhow::Result<ModeReport> {
    let (label, batch, poll, listen) = if classic {
        ("classic-relay", relay::BATCH, u64::try_from(relay::FIXED_DELAY.as_millis())?, false)
    } else {
        ("tally", base.outbox.batch_size, u64::try_from(base.outbox.poll_interval.as_millis())?, true)
    };
    let url = runtime.block_on(fresh_database(
        base,
        &format!("{}_{}", args.database_prefix, label.replace('-', "_")),
        100,
    ))?;
    runtime.block_on(insert_pending(&url, args.rows))?;
    let cluster = Cluster::start(ClusterKind::Embedded)?;
    let mut config = daemon_config(base, &url, &cluster);
    // The classic relay runs beside a daemon that only takes requests.
    config.pipelines = if classic { Stage::Intake.alone() } else { Stage::Outbox.alone() };
    config.outbox.listen = listen;
    eprintln!("outbox bench ({label}): draining {} rows", args.rows);
    let relay = if classic {
        let _entered = runtime.enter();
        Some(ClassicRelay::start(&config, &cluster.bootstrap())?)
    } else {
        None
    };
    let daemon = crate::spawn(config, cluster.embedded())?;
    let (drain_rate, drain_per_second) = runtime.block_on(async {
        let client = db(&url).await?;
        wait_drained(&client, label).await?;
        let row = client.query_one(sql::OUTBOX_PUBLISHED_SPAN, &[]).await?;
        let (n, span): (i64, f64) = (row.get(0), row.get(1));
        let offsets: Vec<f64> =
            client.query(sql::OUTBOX_PUBLISHED_OFFSETS, &[]).await?.iter().map(|r| r.get::<_, f64>(0)).collect();
        client.batch_execute(sql::OUTBOX_DELETE_ALL).await?;
        anyhow::Ok((if span > 0.0 { n as f64 / span } else { 0.0 }, plot::full_bins(&offsets, 1.0)))
    })?;

    eprintln!("outbox bench ({label}): {} POST /transfers per second for {} s", args.rate, args.seconds);
    let intake = format!("http://{}", daemon.intake_addr);
    let (published, p50, p99, cdf) = runtime.block_on(async {
        let http = reqwest::Client::new();
        let started = Instant::now();
        let mut tasks = Vec::new();
        let total = args.rate as usize * args.seconds as usize;
        for n in 0..total {
            tokio::time::sleep_until((started + Duration::from_secs_f64(n as f64 / f64::from(args.rate))).into()).await;
            let (http, intake) = (http.clone(), intake.clone());
            tasks.push(tokio::spawn(async move {
                let body = json!({ "sourceAccount": account(n % 100), "destinationAccount": account((n + 1) % 100),
                                   "amountCents": 1, "currency": "BRL" });
                http.post(format!("{intake}/transfers")).json(&body).send().await.map(|r| r.status().is_success())
            }));
        }
        for t in tasks {
            if !matches!(t.await, Ok(Ok(true))) {
                bail!("a POST /transfers failed");
            }
        }
        let client = db(&url).await?;
        wait_drained(&client, label).await?;
        let mut ms: Vec<f64> =
            client.query(sql::OUTBOX_COMMIT_TO_PUBLISH_MS, &[]).await?.iter().map(|r| r.get::<_, f64>(0)).collect();
        ms.sort_by(f64::total_cmp);
        anyhow::Ok((ms.len() as i64, quantile(&ms, 0.5), quantile(&ms, 0.99), plot::cdf(&ms, 400)))
    })?;
    if let Some(relay) = relay {
        runtime.block_on(relay.stop());
    }
    daemon.stop();
    Ok(ModeReport {
        mode: label.into(),
        batch_size: batch,
        poll_interval_ms: poll,
        listen,
        drain_rows: args.rows,
        drain_rows_per_second: drain_rate,
        offered_per_second: args.rate,
        published,
        commit_to_publish_p50_ms: p50,
        commit_to_publish_p99_ms: p99,
        drain_per_second,
        commit_to_publish_cdf: cdf,
    })
}
