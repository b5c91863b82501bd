//! `tally bench stages`: every stage alone on input that is in place before it starts, then
//! the whole flow, then the whole flow in the seed configuration, in one run, and the
//! ratios between them.
//!
//! Each stage alone runs on a fresh database ([`fresh_database`]) and a fresh cluster
//! ([`Cluster`]), in a daemon that runs only that pipeline ([`Stage::alone`]), over
//! `--records` inputs (N):
//!
//! | stage | input | done when |
//! |---|---|---|
//! | intake | N `POST /transfers` from `--clients` clients, every pipeline off | every POST answered |
//! | outbox drain | N committed, unpublished outbox rows | every row has `published_at` |
//! | antifraud | N `TransferRequested` records on `transfers.requested` | N rows in `antifraud_decisions` |
//! | ledger | N `TransferAnalyzed` records, as [`super::ledger`] makes them | N records completed |
//! | projection | N PENDING transfers, a `TransferSettled` (9 in 10) or `TransferRejected` record each | none PENDING |
//! | notifications | N `TransferSettled` records; a local receiver answering 200 | N rows in `notification_deliveries` |
//!
//! records/s is the steady rate from the completion times the stage writes in its table
//! (`published_at`, `decided_at`, the final `updated_at`, `delivered_at`; PostgreSQL's
//! clock): the records completed after the first completion over first -> last. So the
//! daemon's start and the group join are left out, and so is the first batch (its records
//! share the first time), which a start time could not be taken for without counting the
//! start-up. `decided_at` is taken before antifraud's Kafka transaction commits, so each
//! interval holds one whole cycle (decide, produce, commit, poll). A run whose records all
//! completed at one time (a tiny N in one batch) falls back to N over daemon start -> last.
//! The ledger's figure is [`super::ledger`]'s (first completion to last, from the daemon's
//! metrics polled every 200 ms).
//!
//! p50/p99 of a stage alone are its handler time per record (dispatch to completion,
//! retries included), estimated from the `tally_handler_seconds` histogram, where the
//! pipeline measures it (ledger, projection, notifications; `-` for the outbox and
//! antifraud). Record produced -> stage done is not reported: with the whole backlog in
//! place before the daemon starts, it is the record's place in the queue over the rate
//! plus the start-up, a queueing figure, not the stage's latency.
//!
//! The two end-to-end runs are [`super::e2e`]'s open loop (`--clients` clients POST
//! /transfers as fast as they are answered), bounded to `--e2e-transfers` and
//! `--seed-transfers` transfers (and `--seconds` of sending), each on a fresh database and
//! cluster with every pipeline: sustained transfers/s (final transfers over first creation
//! to last final status), POST -> final status p50/p99 (in an open loop this includes the
//! queue the burst builds up) and the per-hop breakdown ([`super::hops`]). The seed
//! configuration is the same daemon with configuration overrides only
//! ([`seed_configuration`]); the outbox's one-batch-per-poll relay of `tally bench outbox`
//! is not part of it.
//!
//! The intake's records/s is N over the sending time (first POST sent to last answered);
//! its p50/p99 are the POSTs' response times.
//!
//! The ratios are reported, never asserted: e2e sustained over the slowest stage alone
//! among the pipelines a transfer passes to its final status (notifications are a side
//! branch the e2e runs do not start: they have no webhook) (target >= 0.5), the same with
//! the intake counted as a stage, e2e over the seed configuration's e2e (target >= 10), and
//! the e2e's slowest hop at p50. One more bound puts the first in proportion: every stage
//! of e2e runs on the same cores at once, so if each stage alone is bound by the machine,
//! e2e cannot pass the **shared-machine bound** 1 / (sum over the path's stages, intake
//! included, of 1 / records/s alone): the rate at which one machine could do each stage's
//! work for every transfer, one stage after another.
//!
//! Before the stages, the same run measures the two floors of [`super::floor`]
//! (PostgreSQL alone with tally's statements, `--records` transfers each, on databases of
//! their own) and reports the ledger stage alone over the ledger floor (target >= 0.8) and
//! e2e over the lifecycle floor (target >= 0.6): how much of what the database alone does
//! with the same statements each keeps.
//!
//! With `--broker noida` every run has a fresh noida-db process instead of the embedded
//! broker ([`super::cluster`]): real transactions, so antifraud's `read_committed` reads
//! and transactional offsets cost what they cost on a real cluster.

use std::time::Duration;

use anyhow::bail;
use serde::Serialize;

use super::cluster::{Cluster, ClusterKind};
use super::e2e::{Load, Phase};
use super::floor::{self, FloorReport};
use super::target::Target;
use super::{daemon_config, fresh_database, peak_rss_mib, write_report};
use crate::config::{Config, PipelinesConfig};

mod alone;
mod table;
use alone::alone;
use table::print_table;

/// What to run.
#[derive(Debug, Clone)]
pub struct Args {
    /// Input records of each stage alone.
    pub records: usize,
    /// Transfers of the end-to-end run.
    pub e2e_transfers: usize,
    /// Transfers of the end-to-end run in the seed configuration.
    pub seed_transfers: usize,
    /// Longest sending time of each end-to-end run.
    pub seconds: u64,
    /// Concurrent clients of the end-to-end runs.
    pub clients: usize,
    pub accounts: usize,
    pub partitions: i32,
    pub broker: ClusterKind,
    /// Every run's database is `<prefix>_<run>`.
    pub database_prefix: String,
}

/// A pipeline the bench runs alone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stage {
    Intake,
    Outbox,
    Antifraud,
    Ledger,
    Projection,
    Notifications,
}

impl Stage {
    /// Every stage, in the order of a transfer's life.
    pub const ALL: [Self; 6] =
        [Self::Intake, Self::Outbox, Self::Antifraud, Self::Ledger, Self::Projection, Self::Notifications];

    /// The pipeline's name (its metrics label).
    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            Self::Intake => "intake",
            Self::Outbox => "outbox",
            Self::Antifraud => "antifraud",
            Self::Ledger => "ledger",
            Self::Projection => "projection",
            Self::Notifications => "notifications",
        }
    }

    /// Whether a transfer passes this stage on its way to its final status (the e2e runs).
    #[must_use]
    pub fn on_transfer_path(self) -> bool {
        self != Self::Notifications
    }

    /// The pipeline switches that run this stage and nothing else (for the intake: none,
    /// its HTTP listener always runs).
    #[must_use]
    pub fn alone(self) -> PipelinesConfig {
        let mut switches = PipelinesConfig::default();
        for name in PipelinesConfig::names() {
            switches.set(name, name == self.name());
        }
        switches
    }
}

/// The seed configuration: the classic settings every stage started from (the outbox
/// polled every 200 ms in batches of 100 by one loop without LISTEN, one transaction per
/// intake request, one transfer per ledger transaction and one at a time, one record per
/// antifraud transaction).
pub fn seed_configuration(config: &mut Config) {
    config.outbox.batch_size = 100;
    config.outbox.poll_interval = Duration::from_millis(200);
    config.outbox.listen = false;
    config.outbox.concurrency = 1;
    config.http.intake_batch_max = 1;
    config.ledger.batch_size = 1;
    config.ledger.max_concurrent_batches = 1;
    config.antifraud.batch_max_records = 1;
}

/// One row of the table: a stage alone or an end-to-end run.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct StageReport {
    pub stage: String,
    pub records: u64,
    pub records_per_second: f64,
    /// The span `records_per_second` is measured over.
    pub seconds: f64,
    pub p50_ms: Option<f64>,
    pub p99_ms: Option<f64>,
    /// What p50 and p99 measure.
    pub latency: &'static str,
}

/// The ratios of one run; targets are reported beside them, never asserted.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Ratios {
    /// The slowest stage alone among those on a transfer's path to its final status.
    pub slowest_stage: String,
    pub slowest_stage_per_second: f64,
    /// e2e sustained / the slowest stage alone.
    pub e2e_over_slowest_stage: Option<f64>,
    pub e2e_over_slowest_stage_target: f64,
    /// The slowest stage alone with the intake counted as one, and e2e over it.
    pub slowest_stage_with_intake: String,
    pub e2e_over_slowest_stage_with_intake: Option<f64>,
    /// 1 / (sum of 1 / records/s alone over the path's stages, intake included): what one
    /// machine doing every stage's work in turn would sustain.
    pub shared_bound_per_second: f64,
    pub e2e_over_shared_bound: Option<f64>,
    /// e2e sustained / seed configuration's e2e sustained.
    pub e2e_over_seed: Option<f64>,
    pub e2e_over_seed_target: f64,
    /// The ledger stage alone / the ledger floor (PostgreSQL alone with the ledger's
    /// statements, [`floor`]): what the ledger's own machinery leaves of the database's rate.
    pub ledger_over_floor: Option<f64>,
    pub ledger_over_floor_target: f64,
    /// e2e sustained / the lifecycle floor (PostgreSQL alone with every stage's statements).
    pub e2e_over_lifecycle_floor: Option<f64>,
    pub e2e_over_lifecycle_floor_target: f64,
    /// The e2e hop with the highest p50.
    pub slowest_hop: Option<String>,
    pub slowest_hop_p50_ms: Option<f64>,
}

/// The two floors of [`floor`], over `--records` transfers and [`floor::DEFAULT_CLIENTS`]
/// connections.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Floors {
    pub clients: usize,
    pub ledger: FloorReport,
    pub lifecycle: FloorReport,
}

/// Everything one run measured.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Report {
    pub scenario: &'static str,
    pub broker: ClusterKind,
    pub records: usize,
    /// The stages alone, then e2e, then e2e in the seed configuration.
    pub stages: Vec<StageReport>,
    pub e2e: Phase,
    pub seed_e2e: Phase,
    /// PostgreSQL alone with tally's statements, measured first in the same run.
    pub floors: Floors,
    pub ratios: Ratios,
    pub peak_rss_mib: Option<f64>,
}

const HANDLER: &str = "handler time per record (dispatch -> done)";
const POST_TO_FINAL: &str = "POST -> final status";
const NONE: &str = "not measured per record";
const POST: &str = "POST /transfers -> answered";

/// Runs the scenario: the table on stdout, the JSON under `target/bench/`.
///
/// # Errors
/// As [`measure`], or when the report cannot be written.
pub fn run(base: &Config, args: &Args) -> anyhow::Result<()> {
    let report = measure(base, args)?;
    print_table(&report);
    let path = write_report("stages", &report)?;
    println!("JSON: {}", path.display());
    for plot in super::e2e::plots("stages", &[&report.e2e, &report.seed_e2e])? {
        println!("plot: {}", plot.display());
    }
    Ok(())
}

/// Runs every stage alone, then both end-to-end runs, and returns what they measured.
///
/// # Errors
/// When the database, a cluster or a daemon fail, or a run does not finish.
pub fn measure(base: &Config, args: &Args) -> anyhow::Result<Report> {
    if args.records == 0 || args.e2e_transfers == 0 || args.seed_transfers == 0 || args.clients == 0 {
        bail!("need at least one record, one transfer per end-to-end run and one client");
    }
    if args.accounts < 2 {
        bail!("need at least 2 accounts");
    }
    let runtime = super::runtime()?;
    eprintln!("stages bench: the floors, PostgreSQL alone with tally's statements");
    let floor_args = floor::Args {
        // Five times the stages' records: at 10,000 a floor ran for about a second, too
        // short to read a rate from on a shared machine.
        transfers: args.records.saturating_mul(5),
        seconds: None,
        clients: floor::DEFAULT_CLIENTS,
        batch: base.ledger.batch_size,
        accounts: args.accounts,
        database_prefix: format!("{}_floor", args.database_prefix),
    };
    let measured = floor::measure(base, &floor_args, &runtime)?;
    let floors = Floors { clients: measured.clients, ledger: measured.ledger, lifecycle: measured.lifecycle };
    let mut stages = Vec::new();
    for stage in Stage::ALL {
        eprintln!("stages bench: {} alone over {} records ({} broker)", stage.name(), args.records, args.broker.name());
        stages.push(alone(base, args, &runtime, stage)?);
    }
    let e2e = end_to_end(base, args, &runtime, false)?;
    let seed_e2e = end_to_end(base, args, &runtime, true)?;
    stages.push(phase_row("e2e", &e2e));
    stages.push(phase_row("e2e, seed configuration", &seed_e2e));
    let path: Vec<(Stage, &StageReport)> =
        Stage::ALL.into_iter().zip(&stages).filter(|(stage, _)| stage.on_transfer_path()).collect();
    let ratios = ratios(&path, &e2e, &seed_e2e, &floors);
    Ok(Report {
        scenario: "stages",
        broker: args.broker,
        records: args.records,
        stages,
        e2e,
        seed_e2e,
        floors,
        ratios,
        peak_rss_mib: peak_rss_mib(),
    })
}

/// The whole flow through [`super::e2e`]'s open loop, on a fresh database and cluster, in
/// the default or the seed configuration.
fn end_to_end(base: &Config, args: &Args, runtime: &tokio::runtime::Runtime, seed: bool) -> anyhow::Result<Phase> {
    let name = format!("{}_{}", args.database_prefix, if seed { "e2e_seed" } else { "e2e" });
    let url = runtime.block_on(fresh_database(base, &name, args.accounts))?;
    let cluster = Cluster::start(args.broker)?;
    let mut config = daemon_config(base, &url, &cluster);
    config.kafka.partitions = args.partitions;
    if seed {
        seed_configuration(&mut config);
    }
    eprintln!("stages bench: end to end{}", if seed { " in the seed configuration" } else { "" });
    let target = Target::start(config, &cluster, args.clients, args.accounts, runtime)?;
    let limit = if seed { args.seed_transfers } else { args.e2e_transfers };
    let load = Load { rate: None, seconds: args.seconds, clients: args.clients, limit: Some(limit) };
    let phase = runtime.block_on(target.load(&load));
    target.stop();
    phase
}

fn phase_row(title: &str, phase: &Phase) -> StageReport {
    let finished = u64::try_from(phase.finished).unwrap_or(0);
    StageReport {
        stage: title.into(),
        records: finished,
        records_per_second: phase.sustained_per_second,
        seconds: if phase.sustained_per_second > 0.0 { finished as f64 / phase.sustained_per_second } else { 0.0 },
        p50_ms: phase.final_p50_ms,
        p99_ms: phase.final_p99_ms,
        latency: POST_TO_FINAL,
    }
}

fn ratios(path: &[(Stage, &StageReport)], e2e: &Phase, seed: &Phase, floors: &Floors) -> Ratios {
    let ratio = |a: f64, b: f64| (b > 0.0).then(|| a / b);
    let slowest = |with_intake: bool| {
        path.iter()
            .filter(|(stage, _)| with_intake || *stage != Stage::Intake)
            .map(|(_, r)| r)
            .min_by(|a, b| a.records_per_second.total_cmp(&b.records_per_second))
            .map_or((String::new(), 0.0), |s| (s.stage.clone(), s.records_per_second))
    };
    let (slowest_stage, slowest_rate) = slowest(false);
    let (slowest_with_intake, slowest_with_intake_rate) = slowest(true);
    let seconds_per_record: f64 = path
        .iter()
        .map(|(_, r)| if r.records_per_second > 0.0 { 1.0 / r.records_per_second } else { f64::INFINITY })
        .sum();
    let shared_bound =
        if seconds_per_record.is_finite() && seconds_per_record > 0.0 { 1.0 / seconds_per_record } else { 0.0 };
    let ledger_alone =
        path.iter().find(|(stage, _)| *stage == Stage::Ledger).map_or(0.0, |(_, r)| r.records_per_second);
    let hop = e2e
        .hops
        .iter()
        .filter(|h| h.p50_ms.is_some())
        .max_by(|a, b| a.p50_ms.unwrap_or_default().total_cmp(&b.p50_ms.unwrap_or_default()));
    Ratios {
        slowest_stage,
        slowest_stage_per_second: slowest_rate,
        e2e_over_slowest_stage: ratio(e2e.sustained_per_second, slowest_rate),
        e2e_over_slowest_stage_target: 0.5,
        slowest_stage_with_intake: slowest_with_intake,
        e2e_over_slowest_stage_with_intake: ratio(e2e.sustained_per_second, slowest_with_intake_rate),
        shared_bound_per_second: shared_bound,
        e2e_over_shared_bound: ratio(e2e.sustained_per_second, shared_bound),
        e2e_over_seed: ratio(e2e.sustained_per_second, seed.sustained_per_second),
        e2e_over_seed_target: 10.0,
        ledger_over_floor: ratio(ledger_alone, floors.ledger.transfers_per_second),
        ledger_over_floor_target: 0.8,
        e2e_over_lifecycle_floor: ratio(e2e.sustained_per_second, floors.lifecycle.transfers_per_second),
        e2e_over_lifecycle_floor_target: 0.6,
        slowest_hop: hop.map(|h| h.name.to_owned()),
        slowest_hop_p50_ms: hop.and_then(|h| h.p50_ms),
    }
}
