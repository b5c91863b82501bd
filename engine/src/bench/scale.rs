//! `tally bench scale`: the ledger pipeline on 1, 2, ... daemons of one consumer group,
//! each a `tally run` process of its own on one embedded broker and one database, then
//! what a SIGKILL of one of two daemons costs under a steady stream.
//!
//! - **Throughput**: per daemon count, N `TransferAnalyzed` records produced once the
//!   group has settled (every daemon holds a share), settled records/s until the last is
//!   processed. On a 2-core machine more daemons share the same cores: flat is the
//!   expectation, the point is that nothing is lost to coordination.
//! - **Kill**: two daemons, records produced at a fixed rate to known partitions (the
//!   source account picks the partition), one daemon killed part-way. Per partition, the
//!   longest gap between consecutive settlements after the kill: for the survivor's own
//!   partitions it is the stream's own spacing (cooperative assignment never revokes them),
//!   for the dead one's it is the time until the group expires it (`session.timeout.ms`)
//!   and the survivor takes them over.
//! - **Join**: one daemon under the same stream, a second started part-way. The same gaps,
//!   over the partitions the first keeps and over those the newcomer takes: how long a
//!   rebalance holds a moving partition (both protocols move only those).
//!
//! The daemons join under `kafka.group_protocol` of the bench's configuration.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use serde::Serialize;
use uuid::Uuid;

use super::child::{epoch_ms, shares, Site, Stream};
use super::{connect, quantile, sql, write_report, Progress};
use crate::config::{Config, GroupProtocol};

#[derive(Debug, Clone)]
pub struct Args {
    /// Daemon counts 1..=this for the throughput runs.
    pub daemons: usize,
    /// Records per throughput run.
    pub transfers: usize,
    pub accounts: usize,
    /// Records per second through the kill and join runs.
    pub rate: u32,
    /// Length of the kill and join runs' streams; the change happens at a third of each.
    pub kill_seconds: u64,
    /// The database (dropped and re-created).
    pub database: String,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct Throughput {
    daemons: usize,
    records: usize,
    records_per_second: f64,
}

/// What disturbs the group part-way through a steady stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Change {
    /// Two daemons; the second is killed (SIGKILL).
    Kill,
    /// One daemon; a second joins.
    Join,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct Disturbed {
    rate: u32,
    records: usize,
    /// The longest gap between two settlements of one partition after the change, over
    /// the partitions that kept their owner: the survivor's (kill) or the first daemon's
    /// (join) (ms).
    survivor_partitions_max_gap_ms: f64,
    /// The same over the partitions that changed owner: the killed daemon's, or those the
    /// newcomer took (ms).
    moved_partitions_max_gap_ms: f64,
    /// Produce -> settled over the whole run (ms).
    latency_p50_ms: Option<f64>,
    latency_p99_ms: Option<f64>,
    /// The group member's session timeout: the client's under the classic protocol, the
    /// embedded broker's under the consumer protocol.
    session_timeout_ms: String,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct Report {
    scenario: &'static str,
    partitions: i32,
    accounts: usize,
    group_protocol: &'static str,
    throughput: Vec<Throughput>,
    kill: Disturbed,
    join: Disturbed,
}

/// Runs the scenario.
///
/// # Errors
/// When the database, the broker or a daemon fail, or a run does not finish.
pub fn run(base: &Config, args: &Args) -> anyhow::Result<()> {
    if args.daemons == 0 || args.transfers == 0 || args.accounts < 2 || args.rate == 0 || args.kill_seconds < 3 {
        bail!("need at least 1 daemon, 1 transfer, 2 accounts, a positive rate and a kill run of 3 s or more");
    }
    let site = Site::new(base, &args.database, args.accounts)?;
    let mut throughput = Vec::new();
    for n in 1..=args.daemons {
        eprintln!("scale bench: {n} daemon(s), {} records", args.transfers);
        let records_per_second = measure_throughput(&site, n, args.transfers)?;
        eprintln!("  {records_per_second:.0} records/s");
        throughput.push(Throughput { daemons: n, records: args.transfers, records_per_second });
    }
    eprintln!("scale bench: kill one of two daemons under {} records/s", args.rate);
    let kill = disturbed(&site, args, Change::Kill)?;
    eprintln!("scale bench: a second daemon joins under {} records/s", args.rate);
    let join = disturbed(&site, args, Change::Join)?;
    let report = Report {
        scenario: "scale",
        partitions: site.partitions,
        accounts: args.accounts,
        group_protocol: base.kafka.effective_group_protocol().name(),
        throughput,
        kill,
        join,
    };
    print_table(&report);
    let path = write_report("scale", &report)?;
    println!("JSON: {}", path.display());
    Ok(())
}

fn measure_throughput(site: &Site<'_>, n: usize, transfers: usize) -> anyhow::Result<f64> {
    let (topic, group) = site.prepare("scale", &format!("throughput-{n}"))?;
    let daemons = site.start(n, &topic, &group, &[])?;
    let db = site.runtime.block_on(connect(&site.url))?;
    let before = site.runtime.block_on(processed(&db))?;
    let started = Instant::now();
    let producer = site.producer()?;
    let mut stream = Stream::new(site.accounts, site.partitions)?;
    site.runtime.block_on(async {
        let mut deliveries = Vec::with_capacity(transfers);
        for _ in 0..transfers {
            deliveries.push(stream.send(&producer, &topic)?.delivery);
        }
        for d in deliveries {
            d.await.context("delivery report lost")?.map_err(|(e, _)| e)?;
        }
        anyhow::Ok(())
    })?;
    wait_processed(site, &db, before + transfers as i64)?;
    let rate = transfers as f64 / started.elapsed().as_secs_f64();
    drop(daemons);
    Ok(rate)
}

/// A steady stream through the group, changed (`change`) at a third of it.
fn disturbed(site: &Site<'_>, args: &Args, change: Change) -> anyhow::Result<Disturbed> {
    let name = if change == Change::Kill { "kill" } else { "join" };
    let (topic, group) = site.prepare("scale", name)?;
    let mut daemons = site.start(if change == Change::Kill { 2 } else { 1 }, &topic, &group, &[])?;
    let mut owned: Vec<Vec<i32>> = site.runtime.block_on(shares(&daemons));
    let db = site.runtime.block_on(connect(&site.url))?;
    let before = site.runtime.block_on(processed(&db))?;
    let producer = site.producer()?;
    let mut stream = Stream::new(site.accounts, site.partitions)?;
    // Transfer id -> (partition, produced at).
    let mut sent: HashMap<Uuid, (i32, f64)> = HashMap::new();
    let records = args.rate as usize * args.kill_seconds as usize;
    let change_at = Duration::from_secs(args.kill_seconds) / 3;
    let mut changed_at = None;
    let start = Instant::now();
    let mut progress = Progress::bar("records produced at the rate", records as u64);
    site.runtime.block_on(async {
        let mut deliveries = Vec::with_capacity(records);
        for i in 0..records {
            let due = Duration::from_secs_f64(i as f64 / f64::from(args.rate));
            tokio::time::sleep_until((start + due).into()).await;
            if changed_at.is_none() && start.elapsed() >= change_at {
                if change == Change::Join {
                    daemons.push(site.spawn(1, &topic, &group, &[])?);
                    changed_at = Some(epoch_ms());
                    eprintln!("  started a second daemon after {change_at:?}");
                } else if let Some(victim) = daemons.last_mut() {
                    victim.child.kill().context("cannot kill a daemon")?;
                    let _ = victim.child.wait();
                    changed_at = Some(epoch_ms());
                    eprintln!("  killed the second daemon (SIGKILL) after {change_at:?}");
                }
            }
            let one = stream.send(&producer, &topic)?;
            sent.insert(one.transfer_id, (one.partition, one.at_ms));
            deliveries.push(one.delivery);
            progress.update(i as u64 + 1, String::new);
        }
        progress.finish();
        for d in deliveries {
            d.await.context("delivery report lost")?.map_err(|(e, _)| e)?;
        }
        anyhow::Ok(())
    })?;
    wait_processed(site, &db, before + records as i64)?;
    let changed_at = changed_at.context("the stream ended before the change")?;
    let settled = site.runtime.block_on(settled_at(&db, &sent))?;
    if change == Change::Join {
        // Who holds what once the newcomer is in: [the first's, the newcomer's].
        owned = site.runtime.block_on(shares(&daemons));
    }
    drop(daemons);
    let gap = |partitions: &[i32]| {
        partitions
            .iter()
            .filter_map(|p| settled.get(p))
            .map(|times| longest_gap_after(times, changed_at))
            .fold(0.0, f64::max)
    };
    let at: HashMap<Uuid, f64> = settled.values().flatten().copied().collect();
    let mut latencies: Vec<f64> = sent
        .iter()
        .filter_map(|(id, (_, produced))| at.get(id).map(|settled| ms_between(*produced, *settled)))
        .collect();
    latencies.sort_by(f64::total_cmp);
    Ok(Disturbed {
        rate: args.rate,
        records,
        survivor_partitions_max_gap_ms: gap(owned.first().map_or(&[][..], Vec::as_slice)),
        moved_partitions_max_gap_ms: gap(owned.get(1).map_or(&[][..], Vec::as_slice)),
        latency_p50_ms: quantile(&latencies, 0.5),
        latency_p99_ms: quantile(&latencies, 0.99),
        session_timeout_ms: match site.base.kafka.effective_group_protocol() {
            GroupProtocol::Classic => {
                site.base.kafka.clients("").group_consumer("ledger").get("session.timeout.ms").unwrap_or("?").to_owned()
            }
            GroupProtocol::Consumer => crate::broker::CONSUMER_GROUP_SESSION_MS.to_string(),
        },
    })
}

fn wait_processed(site: &Site<'_>, db: &tokio_postgres::Client, want: i64) -> anyhow::Result<()> {
    let started = Instant::now();
    let mut progress = Progress::spinner("records processed");
    loop {
        let done = site.runtime.block_on(processed(db))?;
        if done >= want {
            progress.finish();
            return Ok(());
        }
        progress.update(done as u64, || format!("{done} of {want}"));
        if started.elapsed() > Duration::from_secs(600) {
            bail!("{done} of {want} processed after 10 minutes");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

async fn processed(db: &tokio_postgres::Client) -> anyhow::Result<i64> {
    Ok(db.query_one(sql::PROCESSED_COUNT, &[]).await?.get(0))
}

/// Per partition, `(transfer id, settled at)` of the `sent` transfers, in time order.
async fn settled_at(
    db: &tokio_postgres::Client,
    sent: &HashMap<Uuid, (i32, f64)>,
) -> anyhow::Result<HashMap<i32, Vec<(Uuid, f64)>>> {
    let ids: Vec<String> = sent.keys().map(Uuid::to_string).collect();
    let rows = db.query(sql::PROCESSED_AT_MS, &[&ids]).await?;
    let mut by_partition: HashMap<i32, Vec<(Uuid, f64)>> = HashMap::new();
    for row in rows {
        let Ok(id) = row.get::<_, String>(0).parse::<Uuid>() else { continue };
        if let Some((partition, _)) = sent.get(&id) {
            by_partition.entry(*partition).or_default().push((id, row.get(1)));
        }
    }
    for times in by_partition.values_mut() {
        times.sort_by(|a, b| a.1.total_cmp(&b.1));
    }
    Ok(by_partition)
}

/// The longest time between consecutive settlements from `from` on (the first gap runs
/// from `from` itself), in ms.
fn longest_gap_after(times: &[(Uuid, f64)], from: f64) -> f64 {
    let mut last = from;
    let mut longest = 0.0_f64;
    for (_, at) in times.iter().filter(|(_, at)| *at >= from) {
        longest = longest.max(ms_between(last, *at));
        last = *at;
    }
    longest
}

fn ms_between(from: f64, to: f64) -> f64 {
    to - from
}

fn print_table(r: &Report) {
    println!();
    println!(
        "scale bench: the ledger on N daemons of one group ({} partitions, {} accounts)",
        r.partitions, r.accounts
    );
    println!("{:<10} {:>10} {:>12} {:>10}", "daemons", "records", "records/s", "vs 1");
    let one = r.throughput.first().map_or(1.0, |t| t.records_per_second.max(f64::MIN_POSITIVE));
    for t in &r.throughput {
        println!(
            "{:<10} {:>10} {:>12.0} {:>9.2}x",
            t.daemons,
            t.records,
            t.records_per_second,
            t.records_per_second / one
        );
    }
    let opt = |v: Option<f64>| v.map_or("-".into(), |v| format!("{v:.1}"));
    for (k, what, kept, moved) in [
        (&r.kill, "kill one of two", "survivor's", "the killed one's"),
        (&r.join, "a second joins", "first's", "moved"),
    ] {
        println!(
            "{what} at {}/s ({} records, {} group protocol, session timeout {} ms): {kept} partitions stood still \
             at most {:.0} ms, {moved} {:.0} ms; produce -> settled p50 {} ms, p99 {} ms",
            k.rate,
            k.records,
            r.group_protocol,
            k.session_timeout_ms,
            k.survivor_partitions_max_gap_ms,
            k.moved_partitions_max_gap_ms,
            opt(k.latency_p50_ms),
            opt(k.latency_p99_ms)
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_longest_gap_counts_from_the_kill_and_ignores_what_came_before() {
        let at = |ms: f64| (Uuid::nil(), ms);
        // Settled at 0 and 10 (before the kill at 100), then 150, 160, 1_160, 1_170.
        let times = [at(0.0), at(10.0), at(150.0), at(160.0), at(1_160.0), at(1_170.0)];
        assert_eq!(longest_gap_after(&times, 100.0), 1_000.0);
        // A partition that only moved on long after the kill: the gap runs from the kill.
        assert_eq!(longest_gap_after(&[at(0.0), at(5_100.0)], 100.0), 5_000.0);
        assert_eq!(longest_gap_after(&[at(0.0)], 100.0), 0.0, "nothing after the kill: no gap measured");
    }
}
