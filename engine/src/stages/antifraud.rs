//! The antifraud stage: `transfers.requested` -> Kafka transactions ->
//! `transfers.analyzed` | `transfers.rejected`. First in [`super::STAGES`]: its
//! `init_transactions` fences a crashed predecessor's open transaction.

use anyhow::Context;
use tally_actors::antifraud::{Antifraud, AntifraudSpec, RiskRules, RulesRiskEngine};

use super::{Running, Stage, Wiring};
use crate::config::PoolRule;

pub(super) static STAGE: Stage = Stage {
    name: "antifraud",
    summary: "Score transfers.requested inside Kafka transactions.",
    pool: PoolRule {
        summary: "Antifraud's decisions and its dead-letter fallback.",
        default: |_| 2,
        check: PoolRule::any,
    },
    uses_pool: |_| true,
    group_id: |c| &c.antifraud.group_id,
    inputs: |c| vec![c.kafka.topics.transfers_requested.clone()],
    outputs: |c| vec![c.kafka.topics.transfers_analyzed.clone(), c.kafka.topics.transfers_rejected.clone()],
    validate: |c| c.antifraud.validate(),
    start,
};

fn start(w: &Wiring<'_>) -> anyhow::Result<Running> {
    let cfg = &w.config.antifraud;
    let topics = &w.config.kafka.topics;
    let transactional_id = if cfg.transactional_id.is_empty() {
        format!("tally-antifraud-{}", w.config.instance.id)
    } else {
        cfg.transactional_id.clone()
    };
    let spec = AntifraudSpec {
        group_id: cfg.group_id.clone(),
        input: topics.transfers_requested.clone(),
        analyzed: topics.transfers_analyzed.clone(),
        rejected: topics.transfers_rejected.clone(),
        consumer: w.consumer_client(STAGE.name),
        producer: w.config.kafka.clients(w.bootstrap).transactional_producer(
            "tally-antifraud",
            &transactional_id,
            cfg.transaction_timeout,
        ),
        transactional_id,
        block_limit: cfg.block_score,
        max_batch: cfg.batch_max_records,
        max_batch_wait: cfg.batch_max_wait,
        transaction_timeout: cfg.transaction_timeout,
        call_timeout: cfg.call_timeout,
        retry: cfg.retry.policy(),
        database: w.pool(STAGE.db_pool()),
        keyring: w.keyring.clone(),
    };
    let rules = RiskRules {
        base: cfg.base_score,
        amount_tiers: cfg.amount_tiers.clone(),
        velocity_window: cfg.velocity_window,
        velocity_max: cfg.velocity_max,
        velocity_points: cfg.velocity_points,
    };
    Antifraud::start(spec, Box::new(RulesRiskEngine::new(rules)), w.metrics.clone())
        .map(Running::Antifraud)
        .context("cannot start the antifraud stage")
}
