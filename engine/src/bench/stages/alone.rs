//! Each stage alone: a fresh database and cluster per stage, its input in place before the
//! daemon starts, and the span from its first to its last finished record.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use actix_web::{web, App, HttpResponse, HttpServer};
use anyhow::{bail, Context};
use chrono::Utc;
use serde::Serialize;
use tally_schema::events::{TransferRejected, TransferRequested, TransferSettled};
use tally_schema::{derived_event_id, EventType};
use uuid::Uuid;

use super::{Args, Stage, StageReport, HANDLER, NONE, POST};
use crate::bench::cluster::Cluster;
use crate::bench::e2e::Load;
use crate::bench::sql;
use crate::bench::target::Target;
use crate::bench::{
    account, connect, daemon_config, fresh_database, histogram_quantile, http_get, ledger, outbox, pair, produce_all,
    quantile, wait_for_zero, Outgoing,
};
use crate::config::{Config, Secret, SecretUrl};

pub(super) fn alone(
    base: &Config,
    args: &Args,
    runtime: &tokio::runtime::Runtime,
    stage: Stage,
) -> anyhow::Result<StageReport> {
    match stage {
        Stage::Intake => intake(base, args, runtime),
        Stage::Outbox => outbox_drain(base, args, runtime),
        Stage::Antifraud => antifraud(base, args, runtime),
        Stage::Ledger => ledger_alone(base, args, runtime),
        Stage::Projection => projection(base, args, runtime),
        Stage::Notifications => notifications(base, args, runtime),
    }
}

/// A stage's fresh database and cluster (its topics created) and the configuration of a
/// daemon that runs only that stage.
struct Bed {
    stage: Stage,
    url: String,
    cluster: Cluster,
    config: Config,
}

fn bed(base: &Config, args: &Args, runtime: &tokio::runtime::Runtime, stage: Stage) -> anyhow::Result<Bed> {
    let name = format!("{}_{}", args.database_prefix, stage.name());
    let url = runtime.block_on(fresh_database(base, &name, args.accounts))?;
    let cluster = Cluster::start(args.broker)?;
    let mut config = daemon_config(base, &url, &cluster);
    config.kafka.partitions = args.partitions;
    config.pipelines = stage.alone();
    runtime.block_on(cluster.create_topics(&config)).context("cannot create the topics")?;
    Ok(Bed { stage, url, cluster, config })
}

/// What counts as done for a stage: `left` counts what is not done yet; `column` of the
/// rows of `table` that match `rows` is each record's completion time.
struct Done {
    what: &'static str,
    left: String,
    table: &'static str,
    column: &'static str,
    rows: &'static str,
}

impl Done {
    /// A stage done when `records` rows are in `table`, each finished at `column`.
    fn rows_in(what: &'static str, table: &'static str, column: &'static str, records: usize) -> Self {
        Self { what, left: sql::rows_left(records, table), table, column, rows: "true" }
    }

    /// The first and last completion (epoch seconds), and how many completed at the first.
    fn span_sql(&self) -> String {
        sql::completion_span(self.table, self.column, self.rows)
    }
}

/// The intake alone: every pipeline off, `--records` POSTs from `--clients` clients.
fn intake(base: &Config, args: &Args, runtime: &tokio::runtime::Runtime) -> anyhow::Result<StageReport> {
    let bed = bed(base, args, runtime, Stage::Intake)?;
    let target = Target::unwarmed(bed.config.clone(), &bed.cluster, args.clients, args.accounts)?;
    let load = Load { rate: None, seconds: 1_800, clients: args.clients, limit: Some(args.records) };
    let started = Instant::now();
    let sent = runtime.block_on(target.send(&load, "intake alone"));
    let seconds = started.elapsed().as_secs_f64();
    target.stop();
    let (sent, mut post_ms, errors) = sent?;
    if errors > 0 {
        bail!("intake alone: {errors} of {sent} POSTs failed");
    }
    post_ms.sort_by(f64::total_cmp);
    Ok(StageReport {
        stage: bed.stage.name().into(),
        records: sent as u64,
        records_per_second: sent as f64 / seconds,
        seconds,
        p50_ms: quantile(&post_ms, 0.5),
        p99_ms: quantile(&post_ms, 0.99),
        latency: POST,
    })
}

fn outbox_drain(base: &Config, args: &Args, runtime: &tokio::runtime::Runtime) -> anyhow::Result<StageReport> {
    let bed = bed(base, args, runtime, Stage::Outbox)?;
    runtime.block_on(outbox::insert_pending(&bed.url, args.records))?;
    let done = Done {
        what: "outbox rows published",
        left: sql::OUTBOX_PENDING.into(),
        table: "outbox_events",
        column: "published_at",
        rows: "true",
    };
    run_alone(&bed, runtime, args.records, &done, "outbox drain")
}

fn antifraud(base: &Config, args: &Args, runtime: &tokio::runtime::Runtime) -> anyhow::Result<StageReport> {
    let bed = bed(base, args, runtime, Stage::Antifraud)?;
    let topic = bed.config.kafka.topics.transfers_requested.clone();
    runtime.block_on(produce_all(&bed.cluster.bootstrap(), Some(&bed.url), args.records, |i| {
        let (from, to) = pair(i, args.accounts);
        let transfer_id = Uuid::new_v4();
        let event = TransferRequested {
            event_id: derived_event_id("requested", transfer_id),
            transfer_id,
            source_account: account(from),
            destination_account: account(to),
            amount_cents: 1 + (i % 1_000) as i64,
            currency: "BRL".into(),
            requested_at: Utc::now(),
            client: None,
        };
        outgoing(&topic, event.source_account.clone(), &event, EventType::TransferRequested)
    }))?;
    let done = Done::rows_in("antifraud decisions", "antifraud_decisions", "decided_at", args.records);
    run_alone(&bed, runtime, args.records, &done, "antifraud")
}

fn ledger_alone(base: &Config, args: &Args, runtime: &tokio::runtime::Runtime) -> anyhow::Result<StageReport> {
    let cluster = Cluster::start(args.broker)?;
    let ledger_args = ledger::Args {
        transfers: args.records,
        accounts: args.accounts,
        partitions: args.partitions,
        baseline: false,
        database_prefix: format!("{}_ledger", args.database_prefix),
    };
    let run = ledger::alone(base, &ledger_args, &cluster, runtime)?;
    Ok(StageReport {
        stage: "ledger".into(),
        records: args.records as u64,
        records_per_second: run.records_per_second,
        seconds: run.seconds,
        p50_ms: run.latency_p50_ms,
        p99_ms: run.latency_p99_ms,
        latency: HANDLER,
    })
}

fn projection(base: &Config, args: &Args, runtime: &tokio::runtime::Runtime) -> anyhow::Result<StageReport> {
    let bed = bed(base, args, runtime, Stage::Projection)?;
    let pending = runtime.block_on(pending_transfers(&bed.url, args.records, args.accounts))?;
    let topics = &bed.config.kafka.topics;
    runtime.block_on(produce_all(&bed.cluster.bootstrap(), Some(&bed.url), pending.len(), |i| {
        let (transfer_id, source) = &pending[i];
        let transfer_id = *transfer_id;
        if i % 10 == 9 {
            let event = TransferRejected {
                event_id: derived_event_id("rejected", transfer_id),
                transfer_id,
                reason: "INSUFFICIENT_FUNDS".into(),
                rejected_at: Utc::now(),
            };
            outgoing(&topics.transfers_rejected, source.clone(), &event, EventType::TransferRejected)
        } else {
            let event = settled(transfer_id);
            outgoing(&topics.transfers_settled, source.clone(), &event, EventType::TransferSettled)
        }
    }))?;
    let done = Done {
        what: "transfers projected",
        left: sql::TRANSFERS_PENDING.into(),
        table: "transfers",
        column: "updated_at",
        rows: "status <> 'PENDING'",
    };
    run_alone(&bed, runtime, args.records, &done, "projection")
}

fn notifications(base: &Config, args: &Args, runtime: &tokio::runtime::Runtime) -> anyhow::Result<StageReport> {
    let mut bed = bed(base, args, runtime, Stage::Notifications)?;
    let receiver = Receiver::start()?;
    bed.config.notifications.webhook_url = SecretUrl::new(receiver.url.clone());
    bed.config.notifications.webhook_secret = Secret::new("bench");
    let topic = bed.config.kafka.topics.transfers_settled.clone();
    // Transfers the intake took, which the ledger settles as the records are made.
    let pending = runtime.block_on(pending_transfers(&bed.url, args.records, args.accounts))?;
    runtime.block_on(produce_all(&bed.cluster.bootstrap(), Some(&bed.url), pending.len(), |i| {
        let (transfer_id, source) = &pending[i];
        outgoing(&topic, source.clone(), &settled(*transfer_id), EventType::TransferSettled)
    }))?;
    let done = Done::rows_in("notifications delivered", "notification_deliveries", "delivered_at", args.records);
    run_alone(&bed, runtime, args.records, &done, "notifications")
}

fn settled(transfer_id: Uuid) -> TransferSettled {
    TransferSettled { event_id: derived_event_id("settled", transfer_id), transfer_id, settled_at: Utc::now() }
}

fn outgoing(topic: &str, key: String, event: &impl Serialize, kind: EventType) -> anyhow::Result<Outgoing> {
    Ok(Outgoing { topic: topic.to_owned(), key, payload: serde_json::to_string(event)?, event_type: kind.as_str() })
}

/// Inserts `n` PENDING transfers over `accounts` accounts; returns their ids and source
/// accounts.
async fn pending_transfers(url: &str, n: usize, accounts: usize) -> anyhow::Result<Vec<(Uuid, String)>> {
    let (n, accounts) = (i32::try_from(n)?, i32::try_from(accounts)?);
    let rows = connect(url).await?.query(&sql::insert_pending_transfers(), &[&n, &accounts]).await?;
    rows.iter().map(|r| Ok((r.get::<_, String>(0).parse()?, r.get(1)))).collect()
}

/// Starts the bed's daemon over `n` inputs already in place, waits until the stage is
/// done, and measures it.
fn run_alone(
    bed: &Bed,
    runtime: &tokio::runtime::Runtime,
    n: usize,
    done: &Done,
    title: &str,
) -> anyhow::Result<StageReport> {
    let started = epoch_now();
    let daemon = crate::spawn(bed.config.clone(), bed.cluster.embedded())?;
    let watched = runtime.block_on(watch(bed, daemon.admin_addr, n, done));
    daemon.stop();
    let (span, metrics) = watched?;
    let (records_per_second, seconds) = span.rate(n, started);
    let filter = format!("pipeline=\"{}\"", bed.stage.name());
    let ms = |q| histogram_quantile(&metrics, "tally_handler_seconds", &filter, q).map(|s| s * 1000.0);
    let (p50_ms, p99_ms) = (ms(0.5), ms(0.99));
    Ok(StageReport {
        stage: title.into(),
        records: n as u64,
        records_per_second,
        seconds,
        p50_ms,
        p99_ms,
        latency: if p50_ms.is_some() { HANDLER } else { NONE },
    })
}

fn epoch_now() -> f64 {
    Utc::now().timestamp_micros() as f64 / 1e6
}

/// When a stage's records completed, from its table (epoch seconds).
struct Span {
    first: f64,
    last: f64,
    /// Records that completed at `first` (a batch shares its time).
    at_first: i64,
}

impl Span {
    /// Records per second and the seconds it is measured over: the records after the first
    /// completion over first -> last; when everything completed at once, every record over
    /// `started` (before the daemon started) -> last.
    fn rate(&self, n: usize, started: f64) -> (f64, f64) {
        let after_first = n.saturating_sub(usize::try_from(self.at_first).unwrap_or(0));
        let span = self.last - self.first;
        if span > 0.0 && after_first > 0 {
            (after_first as f64 / span, span)
        } else {
            let seconds = (self.last - started).max(0.001);
            (n as f64 / seconds, seconds)
        }
    }
}

/// Waits for the stage to finish; returns its [`Span`] and the daemon's metrics.
async fn watch(bed: &Bed, admin: SocketAddr, n: usize, done: &Done) -> anyhow::Result<(Span, String)> {
    let client = connect(&bed.url).await?;
    wait_for_zero(&client, &done.left, done.what, Some(n as u64), Duration::from_secs(1_800)).await?;
    let row = client.query_one(&done.span_sql(), &[]).await?;
    let metrics = http_get(&format!("http://{admin}/metrics")).await?;
    Ok((Span { first: row.get(0), last: row.get(1), at_first: row.get(2) }, metrics))
}

/// A webhook receiver on 127.0.0.1 that answers 200 to every request, served by actix-web
/// on a thread (and actix system) of its own; stopped on drop.
struct Receiver {
    url: String,
    server: actix_web::dev::ServerHandle,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Receiver {
    fn start() -> anyhow::Result<Self> {
        let (tx, rx) = std::sync::mpsc::channel();
        let thread = std::thread::Builder::new().name("bench-webhook".into()).spawn(move || {
            let system = actix_web::rt::System::new();
            let started = system.block_on(async {
                let server = HttpServer::new(|| {
                    App::new().default_service(web::to(|_body: web::Bytes| async { HttpResponse::Ok().finish() }))
                })
                .workers(1)
                .disable_signals()
                .bind(("127.0.0.1", 0))?;
                let addr = server.addrs().first().copied().context("the webhook receiver bound no address")?;
                anyhow::Ok((addr, server.run()))
            });
            match started {
                Ok((addr, server)) => {
                    let _ = tx.send(Ok((addr, server.handle())));
                    let _ = system.block_on(server);
                }
                Err(e) => {
                    let _ = tx.send(Err(e));
                }
            }
        })?;
        let (addr, server) = rx.recv().context("the webhook receiver ended before it started")??;
        Ok(Self { url: format!("http://{addr}/hook"), server, thread: Some(thread) })
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        // The stop command is sent when `stop` is called; its future only waits for it.
        drop(self.server.stop(false));
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}
