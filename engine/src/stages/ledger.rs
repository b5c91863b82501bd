//! The ledger: `transfers.analyzed` -> keyed workers -> settlement batcher -> the
//! double-entry ledger, `transfers.settled` | `transfers.rejected` (through the outbox).
//! Where it runs, the daemon also checks the ledger's invariants every
//! `ledger.check_interval_secs`.

use std::sync::Arc;
use std::time::Duration;

use actix::Actor;
use tally_actors::ledger::{BatchSettler, LedgerHandler, LedgerTopics, SettlementBatcher};
use tally_actors::store::{invariants, PgPool};
use tally_actors::Metrics;

use super::{Running, Stage, Wiring};
use crate::config::PoolRule;

pub(super) static STAGE: Stage = Stage {
    name: "ledger",
    summary: "Settle transfers.analyzed into the double-entry ledger.",
    pool: PoolRule {
        summary: "Settlement transactions (at least ledger.max_concurrent_batches), dead letters, the check.",
        default: |c| c.ledger.max_concurrent_batches + 2,
        check: |c, size| {
            let batches = c.ledger.max_concurrent_batches;
            PoolRule::check(size >= batches, "database.pools.ledger", || {
                format!(
                    "is {size}: it must be at least ledger.max_concurrent_batches ({batches}), a connection per \
                     settlement transaction"
                )
            })
        },
    },
    uses_pool: |_| true,
    group_id: |c| &c.ledger.group_id,
    inputs: |c| vec![c.kafka.topics.transfers_analyzed.clone()],
    outputs: |c| vec![c.kafka.topics.transfers_settled.clone(), c.kafka.topics.transfers_rejected.clone()],
    validate: |c| c.ledger.validate(),
    start,
};

fn start(w: &Wiring<'_>) -> anyhow::Result<Running> {
    let cfg = &w.config.ledger;
    let topics = &w.config.kafka.topics;
    let pool = w.pool(STAGE.db_pool());
    let batcher = SettlementBatcher::new(
        pool.clone(),
        LedgerTopics {
            settled: topics.transfers_settled.clone(),
            rejected: topics.transfers_rejected.clone(),
            max_balance_cents: cfg.max_balance_cents,
        },
        w.metrics.clone(),
        Arc::new(BatchSettler { max_batch: cfg.batch_size }),
        cfg.max_concurrent_batches,
        cfg.linger,
    )
    .with_commit_bell(w.outbox_commits.clone())
    .start();
    let spec = w.spec(STAGE.name, &cfg.group_id, (STAGE.inputs)(w.config), &cfg.retry, w.statement_timeout());
    let pipeline = w.start_pipeline(&STAGE, spec, &cfg.retry, Arc::new(LedgerHandler::new(batcher)))?;
    if !cfg.check_interval.is_zero() {
        spawn_checks(pool, w.metrics.clone(), cfg.check_interval);
    }
    Ok(Running::Pipelines(vec![pipeline]))
}

/// Evaluates the ledger invariants every `interval` on the actix system (read-only, one
/// snapshot) and publishes them, so that `tally_ledger_invariant_ok` is current for the
/// alert rules without anyone calling `/admin/ledger/check`, with the time of the last
/// check that ran (`tally_ledger_check_success_timestamp_seconds`), so that a check that
/// cannot run alerts too. Ends with the system.
fn spawn_checks(pool: PgPool, metrics: Metrics, interval: Duration) {
    // From now: a check that never manages to run shows as ever older.
    let started = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    metrics.ledger_check_success_timestamp_seconds.set(started.as_secs_f64());
    actix::spawn(async move {
        // The first check after one interval, not at every start (a rollout would scan the
        // ledger once per instance at once).
        let mut ticks = tokio::time::interval_at(tokio::time::Instant::now() + interval, interval);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            ticks.tick().await;
            let checked = match pool.get().await {
                Ok(mut conn) => invariants::check_ledger(&mut conn).await.map_err(|e| e.to_string()),
                Err(e) => Err(e.to_string()),
            };
            match checked {
                Ok(check) => {
                    invariants::publish(&check, &metrics);
                    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
                    metrics.ledger_check_success_timestamp_seconds.set(now.as_secs_f64());
                    if !check.ok {
                        tracing::error!(?check, "The ledger check failed: an invariant does not hold.");
                    }
                }
                Err(e) => tracing::warn!(error = %e, "The periodic ledger check could not run."),
            }
        }
    });
}
