//! Notifications: the main pipeline on `transfers.settled` + `transfers.rejected`, and one
//! pipeline per retry delay on the `-retry-<delay_ms>` topics, holding each record until it
//! is due. Nothing runs without `notifications.webhook_url`.

use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use actix::Arbiter;
use anyhow::Context;
use tally_actors::consume::Pipeline;
use tally_actors::notify::{Notifier, NotifierSettings};
use tally_actors::supervise::RecordHandler;

use super::{Running, Stage, Wiring};
use crate::config::PoolRule;

pub(super) static STAGE: Stage = Stage {
    name: "notifications",
    summary: "Deliver settled and rejected transfers to notifications.webhook_url.",
    pool: PoolRule {
        summary: "Notification delivery lookups, delivery records and dead letters.",
        default: |_| 3,
        check: |_, size| {
            PoolRule::check(size >= 2, "database.pools.notifications", || {
                "must be at least 2: one connection for the delivery lookups, one for the delivery records".into()
            })
        },
    },
    uses_pool: |c| !c.notifications.webhook_url.is_empty(),
    group_id: |c| &c.notifications.group_id,
    inputs: |c| vec![c.kafka.topics.transfers_settled.clone(), c.kafka.topics.transfers_rejected.clone()],
    outputs: |c| {
        let topics = (STAGE.inputs)(c);
        let delays = c.notifications.delays_ms();
        topics.iter().flat_map(|t| delays.iter().map(|d| tally_schema::topics::retry(t, *d))).collect()
    },
    validate: |c| c.notifications.validate(),
    start,
};

fn start(w: &Wiring<'_>) -> anyhow::Result<Running> {
    let cfg = &w.config.notifications;
    if cfg.webhook_url.is_empty() {
        tracing::info!("Notifications pipeline not started: notifications.webhook_url is empty.");
        return Ok(Running::Pipelines(Vec::new()));
    }
    let sources = (STAGE.inputs)(w.config);
    let delays = cfg.delays_ms();
    let stopping = Arc::new(AtomicBool::new(false));
    let notifier = Arc::new(
        Notifier::new(
            w.pool(STAGE.db_pool()),
            w.dlt_producer.clone(),
            w.dead_letters(STAGE.db_pool(), &cfg.group_id, &stopping),
            w.metrics.clone(),
            NotifierSettings {
                webhook_url: cfg.webhook_url.expose().to_owned(),
                secret: cfg.webhook_secret.expose().to_owned(),
                root_certs: cfg.root_certs().map_err(|e| anyhow::anyhow!("notifications.webhook_root_cert: {e}"))?,
                timeout: cfg.timeout,
                delays_ms: delays.clone(),
                database_wait: w.config.database.connect_timeout,
                settled_topic: w.config.kafka.topics.transfers_settled.clone(),
            },
        )
        .context("cannot build the webhook client")?,
    );
    let attempt_timeout = w.statement_timeout().max(cfg.timeout);
    let mut specs = vec![w.spec(STAGE.name, &cfg.group_id, sources.clone(), &cfg.retry, attempt_timeout)];
    for delay in &delays {
        let mut spec = w.spec(
            &format!("{}-retry-{delay}", STAGE.name),
            &format!("{}-retry-{delay}", cfg.group_id),
            sources.iter().map(|t| tally_schema::topics::retry(t, *delay)).collect(),
            &cfg.retry,
            attempt_timeout,
        );
        spec.due_header = Some(tally_schema::headers::RETRY_DUE_AT.into());
        specs.push(spec);
    }
    // One stop flag for every pipeline of the stage: they share the notifier's dead letters.
    let pipelines = specs
        .into_iter()
        .map(|spec| {
            let name = spec.name.clone();
            let supervision = w.supervision(STAGE.db_pool(), &name, &spec.group_id, &cfg.retry, &stopping);
            let handler: Arc<dyn RecordHandler> = notifier.clone();
            Pipeline::start(spec, handler, supervision, Arc::clone(&stopping), w.metrics.clone(), Arbiter::current())
                .with_context(|| format!("cannot start the {name} pipeline"))
        })
        .collect::<anyhow::Result<_>>()?;
    Ok(Running::Pipelines(pipelines))
}
