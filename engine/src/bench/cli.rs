//! The `tally bench` subcommands and what each runs.

use clap::Subcommand;

use crate::config::Config;

/// A load scenario (`tally bench <scenario>`).
#[derive(Debug, Subcommand)]
pub enum Scenario {
    /// Settle pre-produced TransferAnalyzed records with the ledger pipeline, then with the
    /// classic one-transaction-per-record baseline over the same records.
    Ledger {
        #[arg(long, default_value_t = 200_000)]
        transfers: usize,
        #[arg(long, default_value_t = 10_000)]
        accounts: usize,
        #[arg(long, default_value_t = 12)]
        partitions: i32,
        /// Skip the baseline run.
        #[arg(long)]
        no_baseline: bool,
        /// The prefix of its databases (`<prefix>_tally`, `<prefix>_baseline`) on the server of `database.url`: dropped and re-created, so two
        /// benches at once need different names.
        #[arg(long, default_value = "tally_bench")]
        database: String,
    },
    /// The outbox publisher against a classic scheduled relay (poll 200 ms, batches of 100): drain
    /// rate of pending rows, and commit-to-publish latency at a fixed intake rate.
    Outbox {
        #[arg(long, default_value_t = 100_000)]
        rows: usize,
        /// POST /transfers per second in the latency phase.
        #[arg(long, default_value_t = 1_000)]
        rate: u32,
        #[arg(long, default_value_t = 20)]
        seconds: u64,
        /// The prefix of its databases (`<prefix>_tally`, `<prefix>_classic_relay`) on the server of `database.url`: dropped and re-created, so two
        /// benches at once need different names.
        #[arg(long, default_value = "tally_bench_outbox")]
        database: String,
    },
    /// HTTP load through every pipeline: a fixed offered rate, then an open loop.
    E2e {
        /// Offered transfers per second in the fixed-rate phase.
        #[arg(long, default_value_t = 500)]
        rate: u32,
        #[arg(long, default_value_t = 20)]
        rate_seconds: u64,
        #[arg(long, default_value_t = 30)]
        max_seconds: u64,
        /// Seconds without load before the phases, to measure what each process spends idle.
        #[arg(long, default_value_t = 5)]
        idle_seconds: u64,
        /// Concurrent clients in the open-loop phase.
        #[arg(long, default_value_t = 64)]
        clients: usize,
        #[arg(long, default_value_t = 10_000)]
        accounts: usize,
        /// Its database on the server of `database.url`: dropped and re-created, so two
        /// benches at once need different names.
        #[arg(long, default_value = "tally_bench_e2e")]
        database: String,
    },
    /// Each stage alone on pre-produced input (outbox drain, antifraud, ledger, projection,
    /// notifications), then end to end, then end to end in the seed configuration; the
    /// ratios between them.
    Stages {
        /// Input records of each stage alone.
        #[arg(long, default_value_t = 10_000)]
        records: usize,
        /// Transfers of the end-to-end run (open loop).
        #[arg(long, default_value_t = 5_000)]
        e2e_transfers: usize,
        /// Transfers of the end-to-end run in the seed configuration.
        #[arg(long, default_value_t = 500)]
        seed_transfers: usize,
        /// Longest sending time of each end-to-end run.
        #[arg(long, default_value_t = 30)]
        seconds: u64,
        /// Concurrent clients of the end-to-end runs.
        #[arg(long, default_value_t = 64)]
        clients: usize,
        #[arg(long, default_value_t = 10_000)]
        accounts: usize,
        #[arg(long, default_value_t = 12)]
        partitions: i32,
        /// The Kafka cluster: the in-process embedded broker, or noida-db (real
        /// transactions; installed by scripts/ensure-noida.sh) as a child process.
        #[arg(long, value_enum, default_value_t = super::cluster::ClusterKind::Embedded)]
        broker: super::cluster::ClusterKind,
        /// The prefix of its databases (one per stage and end-to-end run) on the server of `database.url`: dropped and re-created, so two
        /// benches at once need different names.
        #[arg(long, default_value = "tally_bench_stages")]
        database: String,
    },
    /// What PostgreSQL alone does with tally's statements, set-based, at tally's batch
    /// sizes: the ledger's batch, and a transfer's whole life (intake to final status), each
    /// run by concurrent connections on a fresh database. The floor the stages are
    /// measured against.
    Floor {
        /// Transfers of each floor.
        #[arg(long, default_value_t = 50_000)]
        transfers: usize,
        /// Stop starting transfers after this many seconds (with --transfers, whichever
        /// comes first).
        #[arg(long)]
        seconds: Option<u64>,
        /// Concurrent connections.
        #[arg(long, default_value_t = super::floor::DEFAULT_CLIENTS)]
        clients: usize,
        /// Transfers per ledger floor transaction (default: `ledger.batch_size`).
        #[arg(long)]
        batch: Option<usize>,
        #[arg(long, default_value_t = 10_000)]
        accounts: usize,
        /// The prefix of its databases (`<prefix>_ledger`, `<prefix>_lifecycle`) on the server of `database.url`:
        /// dropped and re-created, so two benches at once need different names.
        #[arg(long, default_value = "tally_bench_floor")]
        database: String,
    },
    /// The ledger on 1..=N daemons of one group (separate processes), then a SIGKILL of one
    /// of two under a steady stream: how long each partition stood still.
    Scale {
        #[arg(long, default_value_t = 3)]
        daemons: usize,
        /// Records per throughput run.
        #[arg(long, default_value_t = 40_000)]
        transfers: usize,
        #[arg(long, default_value_t = 10_000)]
        accounts: usize,
        /// Records per second through the kill and join runs.
        #[arg(long, default_value_t = 1_000)]
        rate: u32,
        /// Length of the kill run and of the join run (the change happens at a third of it).
        #[arg(long, default_value_t = 30)]
        kill_seconds: u64,
        /// Its database on the server of `database.url`: dropped and re-created, so two
        /// benches at once need different names.
        #[arg(long, default_value = "tally_bench_scale")]
        database: String,
    },
    /// Cost as work grows: the ledger on one daemon (a separate process) over many records
    /// and accounts; per window, records/s against the first window and the daemon's RSS.
    /// Long at the defaults: `make soak`, not part of `make bench`.
    Soak {
        #[arg(long, default_value_t = 2_000_000)]
        transfers: usize,
        #[arg(long, default_value_t = 1_000_000)]
        accounts: usize,
        /// Processed records per window.
        #[arg(long, default_value_t = 100_000)]
        window: usize,
        /// Its database on the server of `database.url`: dropped and re-created, so two
        /// benches at once need different names.
        #[arg(long, default_value = "tally_bench_soak")]
        database: String,
    },
}

impl Scenario {
    /// Its name on the command line.
    #[must_use]
    pub fn name(&self) -> &'static str {
        match self {
            Self::Ledger { .. } => "ledger",
            Self::Outbox { .. } => "outbox",
            Self::E2e { .. } => "e2e",
            Self::Stages { .. } => "stages",
            Self::Floor { .. } => "floor",
            Self::Scale { .. } => "scale",
            Self::Soak { .. } => "soak",
        }
    }
}

/// Runs `scenario` on `config`.
///
/// # Errors
/// When the scenario fails (its database, broker or daemons).
pub fn run(config: &Config, scenario: Scenario) -> anyhow::Result<()> {
    // Made once here, before any daemon reads it.
    super::bench_keys()?;
    match scenario {
        Scenario::Ledger { transfers, accounts, partitions, no_baseline, database } => super::ledger::run(
            config,
            &super::ledger::Args { transfers, accounts, partitions, baseline: !no_baseline, database_prefix: database },
        ),
        Scenario::Outbox { rows, rate, seconds, database } => {
            super::outbox::run(config, &super::outbox::Args { rows, rate, seconds, database_prefix: database })
        }
        Scenario::E2e { rate, rate_seconds, max_seconds, idle_seconds, clients, accounts, database } => {
            super::e2e::run(
                config,
                &super::e2e::Args { rate, rate_seconds, max_seconds, idle_seconds, clients, accounts, database },
            )
        }
        Scenario::Stages {
            records,
            e2e_transfers,
            seed_transfers,
            seconds,
            clients,
            accounts,
            partitions,
            broker,
            database,
        } => super::stages::run(
            config,
            &super::stages::Args {
                records,
                e2e_transfers,
                seed_transfers,
                seconds,
                clients,
                accounts,
                partitions,
                broker,
                database_prefix: database,
            },
        ),
        Scenario::Floor { transfers, seconds, clients, batch, accounts, database } => super::floor::run(
            config,
            &super::floor::Args {
                transfers,
                seconds,
                clients,
                batch: batch.unwrap_or(config.ledger.batch_size),
                accounts,
                database_prefix: database,
            },
        ),
        Scenario::Scale { daemons, transfers, accounts, rate, kill_seconds, database } => super::scale::run(
            config,
            &super::scale::Args { daemons, transfers, accounts, rate, kill_seconds, database },
        ),
        Scenario::Soak { transfers, accounts, window, database } => {
            super::soak::run(config, &super::soak::Args { transfers, accounts, window, database })
        }
    }
}
