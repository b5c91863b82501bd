//! `tally bench ledger`: settles N pre-produced `TransferAnalyzed` records over 10,000
//! accounts (about 1% duplicates, 2% insufficient funds) with the ledger pipeline, then
//! runs the baseline ([`super::baseline::OneByOne`]: sequential per partition, one
//! transaction per record, commit after each) over the same records, and prints both.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use rdkafka::config::ClientConfig;
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord};
use serde::Serialize;
use serde_json::json;
use uuid::Uuid;

use super::{fresh_database, histogram_quantile, http_get, metric_sum, peak_rss_mib, write_report, Progress};
use crate::app::Parts;
use crate::bench::baseline::OneByOne;
use crate::broker::EmbeddedBroker;
use crate::config::{Config, LogFormat, SecretUrl};

#[derive(Debug, Clone)]
pub struct Args {
    pub transfers: usize,
    pub accounts: usize,
    pub partitions: i32,
    pub baseline: bool,
}

/// The measured figures of one run.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RunReport {
    pub mode: String,
    pub records: usize,
    /// Records per second from the first completed record to the last (group join excluded).
    pub records_per_second: f64,
    pub settled: f64,
    pub rejected: f64,
    pub duplicates: f64,
    pub dead_lettered: f64,
    pub seconds: f64,
    /// Handler latency per record (dispatch to completion), histogram estimates.
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
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

use super::account;

/// Runs the scenario.
///
/// # Errors
/// When the database or the broker cannot be used, or a run does not finish.
pub fn run(base: &Config, args: &Args) -> anyhow::Result<()> {
    if args.accounts < 2 || args.transfers == 0 {
        bail!("need at least 2 accounts and 1 transfer");
    }
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    let broker = Arc::new(EmbeddedBroker::start(1)?);
    let topic = base.kafka.topics.transfers_analyzed.clone();
    for t in base.kafka.topics.all() {
        broker.create_topic_if_missing(&t, args.partitions, 1)?;
    }
    eprintln!(
        "ledger bench: producing {} TransferAnalyzed records over {} accounts, {} partitions",
        args.transfers, args.accounts, args.partitions
    );
    let (duplicates, insufficient) = runtime.block_on(produce(broker.bootstrap_servers(), &topic, args))?;
    eprintln!("  produced: {duplicates} duplicates, {insufficient} over the balance");

    let tally = run_once(base, args, &broker, false, &runtime)?;
    let baseline = if args.baseline { Some(run_once(base, args, &broker, true, &runtime)?) } else { None };
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

async fn produce(bootstrap: &str, topic: &str, args: &Args) -> anyhow::Result<(usize, usize)> {
    let producer: FutureProducer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("linger.ms", "20")
        .set("batch.num.messages", "10000")
        .set("queue.buffering.max.messages", "1000000")
        .set("compression.type", "lz4")
        .create()?;
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let mut sent: Vec<(String, String)> = Vec::with_capacity(args.transfers);
    let (mut duplicates, mut insufficient) = (0, 0);
    let mut progress = Progress::new(Duration::from_secs(2));
    for chunk_start in (0..args.transfers).step_by(20_000) {
        let mut deliveries = Vec::with_capacity(20_000);
        for i in chunk_start..(chunk_start + 20_000).min(args.transfers) {
            let (key, payload) = if i > 0 && rng.below(100) == 0 {
                duplicates += 1;
                sent[rng.below(sent.len())].clone()
            } else {
                let from = rng.below(args.accounts);
                let mut to = rng.below(args.accounts);
                if to == from {
                    to = (to + 1) % args.accounts;
                }
                let over = rng.below(50) == 0;
                insufficient += usize::from(over);
                let amount: i64 = if over { 10_000_000_000 } else { 1 + rng.below(1_000) as i64 };
                let transfer_id = Uuid::new_v4();
                let event = json!({
                    "eventId": tally_schema::derived_event_id("analyzed", transfer_id),
                    "transferId": transfer_id, "sourceAccount": account(from), "destinationAccount": account(to),
                    "amountCents": amount, "currency": "BRL", "score": 10, "analyzedAt": chrono::Utc::now(),
                });
                (account(from), event.to_string())
            };
            let headers = OwnedHeaders::new().insert(Header { key: "event-type", value: Some("TransferAnalyzed") });
            let record = FutureRecord::to(topic).key(&key).payload(&payload).headers(headers);
            deliveries.push(producer.send_result(record).map_err(|(e, _)| e)?);
            sent.push((key, payload));
        }
        for d in deliveries {
            d.await.context("delivery report lost")?.map_err(|(e, _)| e)?;
        }
        progress.tick(|| format!("produced {}", sent.len()));
    }
    Ok((duplicates, insufficient))
}

fn run_once(
    base: &Config,
    args: &Args,
    broker: &Arc<EmbeddedBroker>,
    baseline: bool,
    runtime: &tokio::runtime::Runtime,
) -> anyhow::Result<RunReport> {
    let label = if baseline { "baseline" } else { "tally" };
    let url =
        runtime.block_on(fresh_database(base, &format!("tally_bench_{}", label.replace('-', "_")), args.accounts))?;

    let mut config = base.clone();
    config.database.url = SecretUrl::new(url);
    config.database.pool_size = config.database.pool_size.max(16);
    config.kafka.brokers = "embedded".into();
    config.kafka.partitions = args.partitions;
    config.kafka.replication_factor = 1;
    config.kafka.embedded_brokers = 1;
    config.http.intake_addr = ([127, 0, 0, 1], 0).into();
    config.http.admin_addr = ([127, 0, 0, 1], 0).into();
    config.pipelines.outbox = false;
    config.ledger.group_id = format!("bench-{label}");
    config.log.format = LogFormat::Pretty;
    eprintln!("ledger bench: running {label} over {} records", args.transfers);
    let started = Instant::now();
    let parts = Parts { settler: baseline.then(|| Arc::new(OneByOne) as _), ..Parts::default() };
    let daemon = crate::spawn_with(config, Some(Arc::clone(broker)), parts)?;
    let metrics_url = format!("http://{}/metrics", daemon.admin_addr);
    let mut first: Option<Instant> = None;
    let mut progress = Progress::new(Duration::from_secs(2));
    let deadline = Duration::from_secs(3_600);
    let text = loop {
        let text = runtime.block_on(http_get(&metrics_url))?;
        let done = metric_sum(&text, "tally_records_total", "pipeline=\"ledger\"");
        if done > 0.0 && first.is_none() {
            first = Some(Instant::now());
        }
        let rate = first.map_or(0.0, |f| done / f.elapsed().as_secs_f64().max(0.001));
        progress.tick(|| format!("{label}: {done:.0}/{} records, {rate:.0}/s", args.transfers));
        if done >= args.transfers as f64 {
            break text;
        }
        if started.elapsed() > deadline {
            bail!("{label} did not finish within {deadline:?}");
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    let busy = first.map_or(started.elapsed(), |f| f.elapsed());
    let check_url = format!("http://{}/admin/ledger/check", daemon.admin_addr);
    let invariants: serde_json::Value = serde_json::from_str(&runtime.block_on(http_get(&check_url))?)?;
    let outcome = |o: &str| metric_sum(&text, "tally_records_total", &format!("outcome=\"{o}\",pipeline=\"ledger\""));
    let ms = |q| histogram_quantile(&text, "tally_handler_seconds", "pipeline=\"ledger\"", q).map(|s| s * 1000.0);
    let report = RunReport {
        mode: label.into(),
        records: args.transfers,
        records_per_second: args.transfers as f64 / busy.as_secs_f64(),
        settled: outcome("settled"),
        rejected: outcome("rejected"),
        duplicates: outcome("duplicate"),
        dead_lettered: outcome("dead_lettered"),
        seconds: busy.as_secs_f64(),
        latency_p50_ms: ms(0.5),
        latency_p99_ms: ms(0.99),
        peak_rss_mib: peak_rss_mib(),
        invariants_ok: invariants["ok"] == true,
        invariants,
    };
    daemon.stop();
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
