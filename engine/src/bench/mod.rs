//! `tally bench`: load scenarios run from the same binary, against the local PostgreSQL and
//! an embedded broker. Progress goes to stderr, a table to stdout; JSON, plots and the log
//! lines to `target/bench/`. Figures are measured and reported, never asserted.
//!
//! Nothing outside this module refers to it but the `tally bench` command: the baselines
//! tally is compared with are here ([`baseline`]), and so is every SQL statement of the
//! bench ([`sql`]).

pub mod baseline;
mod child;
pub mod cli;
pub mod cluster;
pub mod cpu;
pub mod e2e;
pub mod floor;
pub mod hops;
mod keys;
pub mod ledger;
pub mod logs;
pub mod outbox;
pub mod plot;
mod progress;
pub mod scale;
pub mod soak;
pub mod sql;
pub mod stages;
pub mod target;
pub mod upstream;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::Context;
use rdkafka::config::ClientConfig;
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord};
use serde::Serialize;

use crate::config::SecretUrl;
use crate::Config;
use cluster::Cluster;
pub use keys::{bench_keys, KEYS_DIR};
pub use progress::Progress;

/// The async runtime of a bench: two worker threads, as many as the machine class has cores.
///
/// # Errors
/// When the runtime cannot be built.
pub fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().context("cannot start a runtime")
}

/// The configuration of a bench daemon: `base` on database `url` and `cluster` (one broker,
/// replication 1), its listeners on free loopback ports.
#[must_use]
pub fn daemon_config(base: &Config, url: &str, cluster: &Cluster) -> Config {
    let mut config = base.clone();
    config.database.url = SecretUrl::new(url);
    // Made here if no record was produced yet; if it cannot be, the daemon's start says why.
    config.signing.keys_dir = bench_keys().map_or_else(|_| KEYS_DIR.into(), |(dir, _)| dir.display().to_string());
    cluster.configure(&mut config);
    config.http.intake_addr = ([127, 0, 0, 1], 0).into();
    config.http.admin_addr = ([127, 0, 0, 1], 0).into();
    config
}

/// One record to pre-produce.
#[derive(Debug, Clone)]
pub struct Outgoing {
    pub topic: String,
    pub key: String,
    pub payload: String,
    /// The `event-type` header.
    pub event_type: &'static str,
}

/// Produces `n` records, record `i` made by `record(i)`, in chunks of 20,000 awaited
/// together (a bar of records produced on stderr), each with the `event-id` of its
/// payload's `eventId` and signed with the bench's key ([`bench_keys`]). With `upstream`
/// (a database URL), what the stages before the records' consumer would have written
/// for them goes there first ([`upstream::record`]).
///
/// # Errors
/// When the producer cannot be created, `record` fails, or a delivery fails.
pub async fn produce_all(
    bootstrap: &str,
    upstream: Option<&str>,
    n: usize,
    mut record: impl FnMut(usize) -> anyhow::Result<Outgoing>,
) -> anyhow::Result<()> {
    const CHUNK: usize = 20_000;
    let producer: FutureProducer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("linger.ms", "20")
        .set("batch.num.messages", "10000")
        .set("queue.buffering.max.messages", "1000000")
        .set("compression.type", "lz4")
        .create()?;
    let (_, keyring) = bench_keys()?;
    let mut progress = Progress::bar("records produced", n as u64);
    for start in (0..n).step_by(CHUNK) {
        let chunk = (start..(start + CHUNK).min(n)).map(&mut record).collect::<anyhow::Result<Vec<_>>>()?;
        if let Some(url) = upstream {
            upstream::record(url, &chunk).await?;
        }
        let mut deliveries = Vec::with_capacity(CHUNK);
        for out in chunk {
            let event_id = serde_json::from_str::<serde_json::Value>(&out.payload)?["eventId"]
                .as_str()
                .context("a bench event without an eventId")?
                .to_owned();
            let headers = OwnedHeaders::new()
                .insert(Header { key: "event-id", value: Some(&event_id) })
                .insert(Header { key: "event-type", value: Some(out.event_type) });
            let headers = keyring.sign(headers, out.key.as_bytes(), out.payload.as_bytes(), &event_id, out.event_type);
            let sent = FutureRecord::to(&out.topic).key(&out.key).payload(&out.payload).headers(headers);
            deliveries.push(producer.send_result(sent).map_err(|(e, _)| e)?);
        }
        for d in deliveries {
            d.await.context("delivery report lost")?.map_err(|(e, _)| e)?;
        }
        progress.update((start + CHUNK).min(n) as u64, String::new);
    }
    progress.finish();
    Ok(())
}

/// Peak resident set size of this process so far (VmHWM), in MiB.
#[must_use]
pub fn peak_rss_mib() -> Option<f64> {
    proc_status_mib("self", "VmHWM")
}

/// Peak resident set size of process `pid` so far (VmHWM), in MiB.
#[must_use]
pub fn peak_rss_mib_of(pid: u32) -> Option<f64> {
    proc_status_mib(&pid.to_string(), "VmHWM")
}

/// Resident set size of process `pid` now (VmRSS), in MiB; `None` once it is gone.
#[must_use]
pub fn rss_mib(pid: u32) -> Option<f64> {
    proc_status_mib(&pid.to_string(), "VmRSS")
}

/// Field `field` (a size in kB) of `/proc/<pid>/status`, in MiB.
fn proc_status_mib(pid: &str, field: &str) -> Option<f64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.strip_prefix(field).is_some_and(|rest| rest.starts_with(':')))?;
    let kib: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib / 1024.0)
}

/// The time this run started (`20261201T191100Z`, UTC), the same for every file it writes.
#[must_use]
pub fn stamp() -> &'static str {
    static STAMP: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    STAMP.get_or_init(|| chrono::Utc::now().format("%Y%m%dT%H%M%SZ").to_string())
}

/// Where a bench writes its files: `target/bench/` (created).
///
/// # Errors
/// When the directory cannot be created.
pub fn output_dir() -> anyhow::Result<PathBuf> {
    let dir = PathBuf::from("target/bench");
    std::fs::create_dir_all(&dir).context("cannot create target/bench")?;
    Ok(dir)
}

/// Writes `report` as JSON to `target/bench/<name>-<run's stamp>.json` and returns the path.
///
/// # Errors
/// When the file cannot be written.
pub fn write_report<T: Serialize>(name: &str, report: &T) -> anyhow::Result<PathBuf> {
    let path = output_dir()?.join(format!("{name}-{}.json", stamp()));
    std::fs::write(&path, serde_json::to_vec_pretty(report)?)
        .with_context(|| format!("cannot write {}", path.display()))?;
    Ok(path)
}

/// GETs `url` and returns the body.
///
/// # Errors
/// When the request fails or answers an error status.
pub async fn http_get(url: &str) -> anyhow::Result<String> {
    Ok(reqwest::get(url).await?.error_for_status()?.text().await?)
}

/// The ledger invariants of the daemon whose admin listener is `admin` (`http://host:port`):
/// the JSON of `/admin/ledger/check`, which answers 409 when one does not hold.
///
/// # Errors
/// When the endpoint answers anything else, or no JSON.
pub async fn ledger_check(admin: &str) -> anyhow::Result<serde_json::Value> {
    let res = reqwest::get(format!("{admin}/admin/ledger/check")).await?;
    if res.status() != reqwest::StatusCode::CONFLICT {
        res.error_for_status_ref()?;
    }
    let check: serde_json::Value = res.json().await?;
    if check["ok"] != true {
        eprintln!("the ledger invariants do not hold: {check}");
    }
    Ok(check)
}

/// Quantile `q` of `sorted` (nearest rank), or `None` when empty.
#[must_use]
pub fn quantile(sorted: &[f64], q: f64) -> Option<f64> {
    if sorted.is_empty() {
        return None;
    }
    let rank = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    Some(sorted[rank - 1])
}

/// The value of the series `series` (exact text before the value) in Prometheus text.
#[must_use]
pub fn metric(text: &str, series: &str) -> Option<f64> {
    text.lines().find_map(|l| l.strip_prefix(series).and_then(|rest| rest.trim().parse().ok()))
}

/// Sum of every sample of family `name` whose labels contain `filter`.
#[must_use]
pub fn metric_sum(text: &str, name: &str, filter: &str) -> f64 {
    text.lines()
        .filter(|l| l.starts_with(&format!("{name}{{")) && l.contains(filter))
        .filter_map(|l| l.rsplit(' ').next().and_then(|v| v.parse::<f64>().ok()))
        .sum()
}

/// Estimates quantile `q` of histogram `name` (with label filter) by linear interpolation
/// inside the bucket, as Prometheus' `histogram_quantile` does.
#[must_use]
pub fn histogram_quantile(text: &str, name: &str, filter: &str, q: f64) -> Option<f64> {
    let mut buckets: Vec<(f64, f64)> = text
        .lines()
        .filter(|l| l.starts_with(&format!("{name}_bucket{{")) && l.contains(filter))
        .filter_map(|l| {
            let le = l.split("le=\"").nth(1)?.split('"').next()?;
            let le = if le == "+Inf" { f64::INFINITY } else { le.parse().ok()? };
            let count: f64 = l.rsplit(' ').next()?.parse().ok()?;
            Some((le, count))
        })
        .collect();
    buckets.sort_by(|a, b| a.0.total_cmp(&b.0));
    let total = buckets.last()?.1;
    if total <= 0.0 {
        return None;
    }
    let rank = q * total;
    let mut prev = (0.0, 0.0);
    for (le, count) in buckets {
        if count >= rank {
            if le.is_infinite() {
                return Some(prev.0);
            }
            let width = count - prev.1;
            let frac = if width > 0.0 { (rank - prev.1) / width } else { 1.0 };
            return Some(prev.0 + (le - prev.0) * frac);
        }
        prev = (le, count);
    }
    None
}

/// A PostgreSQL client whose connection runs on the current runtime.
///
/// # Errors
/// When PostgreSQL is unreachable.
pub async fn connect(url: &str) -> anyhow::Result<tokio_postgres::Client> {
    let (client, conn) = tally_actors::store::PgConnector::from_url(url)?.connect().await?;
    tokio::spawn(conn);
    Ok(client)
}

/// Polls `count_sql` (a `SELECT` of one bigint: what is left to do) every 100 ms until it
/// is 0 or below, with a bar of `what` done out of `total` (default: the first count).
///
/// # Errors
/// When the query fails, or the count is not 0 after `limit`.
pub async fn wait_for_zero(
    client: &tokio_postgres::Client,
    count_sql: &str,
    what: &str,
    total: Option<u64>,
    limit: Duration,
) -> anyhow::Result<()> {
    let started = Instant::now();
    let mut progress: Option<Progress> = None;
    loop {
        let left: i64 = client.query_one(count_sql, &[]).await?.get(0);
        let remaining = u64::try_from(left).unwrap_or(0);
        let bar = progress.get_or_insert_with(|| Progress::bar(what, total.unwrap_or(remaining)));
        let all = bar.raise_total(remaining);
        bar.update(all - remaining, || format!("{remaining} left"));
        if left <= 0 {
            if let Some(done) = progress.take() {
                done.finish();
            }
            return Ok(());
        }
        if started.elapsed() > limit {
            anyhow::bail!("{what}: {left} left after {limit:?}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The id of bench account `i` (see [`fresh_database`]).
#[must_use]
pub fn account(i: usize) -> String {
    format!("ACC-{i:05}")
}

/// The source and destination accounts (indexes, distinct) of the bench's transfer `n` over
/// `accounts` accounts (at least 2): spread over every account, the same for every run.
#[must_use]
pub fn pair(n: usize, accounts: usize) -> (usize, usize) {
    let from = (n * 7_919) % accounts;
    let to = (from + 1 + (n * 104_729) % (accounts - 1)) % accounts;
    (from, to)
}

pub use sql::ACCOUNT_ID_SQL;

/// Drops and re-creates database `name` on the server of `database.url`, migrates it, and
/// creates `accounts` accounts `ACC-00000`.. with 1,000,000 cents each. Returns its URL.
///
/// # Errors
/// When PostgreSQL is unreachable or refuses.
pub async fn fresh_database(base: &crate::Config, name: &str, accounts: usize) -> anyhow::Result<String> {
    let server: tokio_postgres::Config = base.database.url.expose().parse()?;
    let url = format!(
        "postgres://{}@{}:{}/{name}",
        server.get_user().unwrap_or("postgres"),
        match server.get_hosts().first() {
            Some(tokio_postgres::config::Host::Tcp(h)) => h.clone(),
            _ => "127.0.0.1".into(),
        },
        server.get_ports().first().copied().unwrap_or(5432)
    );
    reset_database(base.database.url.expose(), name).await?;
    let migrate_url = url.clone();
    tokio::task::spawn_blocking(move || tally_actors::store::migrate::prepare_blocking(&migrate_url)).await??;
    create_accounts(&url, accounts).await?;
    Ok(url)
}

async fn reset_database(server_url: &str, name: &str) -> anyhow::Result<()> {
    let mut admin: tokio_postgres::Config = server_url.parse()?;
    admin.dbname("postgres");
    let (client, conn) = admin.connect(tokio_postgres::NoTls).await.context("cannot reach PostgreSQL")?;
    let driver = tokio::spawn(conn);
    client.batch_execute(&sql::drop_database(name)).await?;
    drop(client);
    let _ = driver.await;
    Ok(())
}

/// Opens `n` accounts, their balances issued as tally issues opening balances.
async fn create_accounts(url: &str, n: usize) -> anyhow::Result<()> {
    use diesel_async::AsyncConnection;
    let mut conn = diesel_async::AsyncPgConnection::establish(url).await.context("connect to the bench database")?;
    let rows: Vec<(String, i64)> = (0..n).map(|i| (account(i), 1_000_000)).collect();
    tally_actors::store::issuance::open_funded(&mut conn, "", "BRL", &rows).await.context("open the accounts")?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_interpolate_within_buckets() {
        let text =
            "h_bucket{p=\"x\",le=\"0.1\"} 50\nh_bucket{p=\"x\",le=\"0.2\"} 100\nh_bucket{p=\"x\",le=\"+Inf\"} 100\n";
        let p50 = histogram_quantile(text, "h", "p=\"x\"", 0.5).unwrap_or(-1.0);
        assert!((p50 - 0.1).abs() < 1e-9, "{p50}");
        let p75 = histogram_quantile(text, "h", "p=\"x\"", 0.75).unwrap_or(-1.0);
        assert!((p75 - 0.15).abs() < 1e-9, "{p75}");
        assert_eq!(metric_sum("c{a=\"1\",p=\"x\"} 2\nc{a=\"2\",p=\"x\"} 3\n", "c", "p=\"x\""), 5.0);
    }
}
