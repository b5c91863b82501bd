//! The order materializer: `orders.received` -> `received_orders`, keyed by order id.
//! The smallest stage, and the worked example of "Adding a stage" in
//! `docs/ARCHITECTURE.md`: its records are handled by `tally_actors::orders`, its section
//! is `[orders]` (`config/orders.rs`), and this entry is all the daemon needs to know.

use std::sync::Arc;

use tally_actors::orders::OrderMaterializer;

use super::{Running, Stage, Wiring};
use crate::config::PoolRule;

pub(super) static STAGE: Stage = Stage {
    name: "orders",
    summary: "Materialise orders.received.",
    pool: PoolRule { summary: "The order materializer: an insert per order.", default: |_| 2, check: PoolRule::any },
    uses_pool: |_| true,
    group_id: |c| &c.orders.group_id,
    inputs: |c| vec![c.kafka.topics.orders_received.clone()],
    outputs: |_| Vec::new(),
    validate: |c| c.orders.validate(),
    start,
};

fn start(w: &Wiring<'_>) -> anyhow::Result<Running> {
    let cfg = &w.config.orders;
    let spec = w.spec(STAGE.name, &cfg.group_id, (STAGE.inputs)(w.config), &cfg.retry, w.statement_timeout());
    let handler = Arc::new(OrderMaterializer::new(w.pool(STAGE.db_pool())));
    Ok(Running::Pipelines(vec![w.start_pipeline(&STAGE, spec, &cfg.retry, handler)?]))
}
