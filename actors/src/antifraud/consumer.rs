//! The antifraud stage's consumer: its context (rebalance callbacks that drop revoked
//! partitions from the batch in hand and keep the pause state across assignments, lag from
//! statistics, the crash book), how it subscribes, and the wait of a stage that is down.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext, Rebalance};
use rdkafka::error::KafkaResult;
use rdkafka::{ClientContext, Statistics};
use tracing::{info, warn};

use super::{AntifraudSpec, PIPELINE};
use crate::consume::{publish_lag, record_stats, Control, StatsView};
use crate::metrics::Metrics;
use crate::supervise::restart::CrashBook;

pub(super) struct AntifraudContext {
    pub(super) metrics: Metrics,
    pub(super) topics: Vec<String>,
    /// Partitions revoked since the loop last looked.
    pub(super) revoked: Mutex<Vec<(String, i32)>>,
    /// Set on every assignment: the velocity window must be rebuilt before scoring.
    pub(super) assigned: AtomicBool,
    /// The group gave this stage an assignment at least once (for `/readyz`).
    pub(super) received_assignment: AtomicBool,
    /// Paused through the admin API: newly assigned partitions are paused too.
    pub(super) admin_paused: AtomicBool,
    /// A batch is waiting out a failure ([`hold::Hold`]): newly assigned partitions are
    /// paused until it ends.
    pub(super) holding: AtomicBool,
    pub(super) stats: Mutex<StatsView>,
    /// The records that crashed the stage while it decoded them (the poison-pill rule).
    pub(super) crashes: Arc<CrashBook>,
}

impl ClientContext for AntifraudContext {
    fn stats(&self, stats: Statistics) {
        publish_lag(&self.metrics, PIPELINE, &self.topics, &stats);
        record_stats(&self.stats, &stats);
    }
}

impl ConsumerContext for AntifraudContext {
    fn pre_rebalance(&self, _: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        if let Rebalance::Revoke(tpl) = rebalance {
            self.metrics.rebalances_total.with_label_values(&[PIPELINE, "revoked"]).inc();
            self.metrics
                .rebalance_partitions_total
                .with_label_values(&[PIPELINE, "revoked"])
                .inc_by(tpl.count() as u64);
            let mut revoked = self.revoked.lock().unwrap_or_else(PoisonError::into_inner);
            revoked.extend(tpl.elements().iter().map(|e| (e.topic().to_owned(), e.partition())));
        }
    }

    fn post_rebalance(&self, consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        if let Rebalance::Assign(tpl) = rebalance {
            self.metrics.rebalances_total.with_label_values(&[PIPELINE, "assigned"]).inc();
            self.metrics
                .rebalance_partitions_total
                .with_label_values(&[PIPELINE, "assigned"])
                .inc_by(tpl.count() as u64);
            // Cooperative assignment ends every rebalance with an Assign, often empty:
            // the velocity window is rebuilt only when partitions were added.
            if tpl.count() > 0 {
                self.assigned.store(true, Ordering::Relaxed);
            }
            self.received_assignment.store(true, Ordering::Relaxed);
            // librdkafka keeps a pause across re-assignment but new partitions start
            // unpaused: set every assigned partition to the stage's state.
            let hold = self.admin_paused.load(Ordering::Relaxed) || self.holding.load(Ordering::Relaxed);
            let result = if hold { consumer.pause(tpl) } else { consumer.resume(tpl) };
            if let Err(e) = result {
                warn!(pipeline = PIPELINE, error = %e, "Cannot set the pause state of new partitions.");
            }
            if tpl.count() > 0 {
                info!(pipeline = PIPELINE, partitions = tpl.count(), paused = hold, "Partitions assigned.");
            }
        }
    }
}

/// A consumer of the stage's group (`read_committed`, offsets only in transactions),
/// subscribed to its input; its new partitions start paused when `admin_paused`.
pub(super) fn subscribe(
    spec: &AntifraudSpec,
    metrics: &Metrics,
    admin_paused: bool,
    crashes: &Arc<CrashBook>,
) -> KafkaResult<BaseConsumer<AntifraudContext>> {
    let mut consumer_config = spec.consumer.clone();
    consumer_config
        .set("group.id", &spec.group_id)
        .set("isolation.level", "read_committed")
        .set("enable.auto.commit", "false")
        .set("enable.auto.offset.store", "false");
    let context = AntifraudContext {
        metrics: metrics.clone(),
        topics: vec![spec.input.clone()],
        revoked: Mutex::default(),
        assigned: AtomicBool::new(false),
        received_assignment: AtomicBool::new(false),
        admin_paused: AtomicBool::new(admin_paused),
        holding: AtomicBool::new(false),
        stats: Mutex::default(),
        crashes: Arc::clone(crashes),
    };
    let consumer: BaseConsumer<AntifraudContext> = consumer_config.create_with_context(context)?;
    consumer.subscribe(&[&spec.input])?;
    Ok(consumer)
}

/// Waits `wait` while the stage is down; true when it was stopped meanwhile (the stop is
/// acknowledged here).
pub(super) fn stopped_while_down(
    control: &std::sync::mpsc::Receiver<Control>,
    stopping: &AtomicBool,
    wait: Duration,
) -> bool {
    let deadline = Instant::now() + wait;
    while Instant::now() < deadline {
        match control.recv_timeout(Duration::from_millis(50)) {
            Ok(Control::Stop(done)) => {
                let _ = done.send(());
                return true;
            }
            Ok(Control::Pause(applied) | Control::Resume(applied)) => {
                // Applied by the next consumer's first assignment (it starts paused or not).
                let _ = applied.send(());
            }
            Err(_) if stopping.load(Ordering::Relaxed) => return true,
            Err(_) => {}
        }
    }
    false
}
