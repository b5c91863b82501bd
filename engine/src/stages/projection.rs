//! The status projection: `transfers.settled` + `transfers.rejected` -> `transfers`.

use std::sync::Arc;

use tally_actors::projection::StatusProjector;
use tally_actors::store::group_commit::GroupCommitSettings;

use super::{Running, Stage, Wiring};
use crate::config::PoolRule;

pub(super) static STAGE: Stage = Stage {
    name: "projection",
    summary: "Project settled and rejected transfers onto the transfer status.",
    pool: PoolRule {
        summary: "The status projection's writers (above projection.writers) and dead letters.",
        default: |_| 4,
        check: |c, size| {
            let writers = c.projection.writers;
            PoolRule::check(size > writers, "database.pools.projection", || {
                format!(
                    "is {size}: it must be above projection.writers ({writers}), a connection per writer and one \
                     for dead letters"
                )
            })
        },
    },
    uses_pool: |_| true,
    group_id: |c| &c.projection.group_id,
    inputs: |c| vec![c.kafka.topics.transfers_settled.clone(), c.kafka.topics.transfers_rejected.clone()],
    outputs: |_| Vec::new(),
    validate: |c| c.projection.validate(),
    start,
};

fn start(w: &Wiring<'_>) -> anyhow::Result<Running> {
    let cfg = &w.config.projection;
    let spec = w.spec(STAGE.name, &cfg.group_id, (STAGE.inputs)(w.config), &cfg.retry, w.statement_timeout());
    let handler = Arc::new(StatusProjector::new(
        w.pool(STAGE.db_pool()),
        w.config.kafka.topics.transfers_settled.clone(),
        GroupCommitSettings {
            max_batch: cfg.batch_max,
            writers: cfg.writers,
            max_wait: w.config.database.connect_timeout,
        },
        &w.metrics,
    ));
    Ok(Running::Pipelines(vec![w.start_pipeline(&STAGE, spec, &cfg.retry, handler)?]))
}
