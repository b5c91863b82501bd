//! The consumption machinery shared by every pipeline.
//!
//! One consumer group per pipeline. A driver thread owns the Kafka consumer: it polls,
//! serves rebalance callbacks, routes each record to the [`PartitionConsumer`] actor of its
//! partition through a bounded queue, and stores and commits the contiguous completed
//! watermark each partition publishes. Offsets are stored only by tally
//! (`enable.auto.offset.store=false`); the periodic auto-commit and the explicit commits
//! on revoke and shutdown commit only stored offsets, so a commit never passes an
//! unfinished record.
//!
//! Backpressure: when a partition's queue is full, the driver pauses that partition and
//! keeps the record in hand; librdkafka drops what it had prefetched for the partition and,
//! on resume, fetches again from the record after the last one handed to tally. Nothing
//! buffers without bound.
//!
//! The uncommitted window is bounded too: a record is not handed over while it lies
//! `max_uncommitted` offsets or more past the partition's completed watermark; the
//! partition is held (paused) until the head of line completes, so one stuck record cannot
//! let completed offsets pile up without limit.
//!
//! A dependency that is down (see [`DependencyHealth`](crate::supervise::DependencyHealth)) degrades the pipeline: the driver
//! pauses every assigned partition until the records waiting for it got through, then
//! resumes those not held otherwise (an admin pause stays).
//!
//! Why a thread: on revoke the rebalance callback must wait for in-flight work to finish
//! and commit before the partition is given up. The callback runs on the thread that
//! polls, so that thread must not be the one that runs the actors doing the work.

mod assignment;
mod control;
mod driver;
mod offsets;
mod partition;
mod pause;
mod spec;
mod stall;
mod stash;
mod status;
mod supervised;
mod worker;

use std::collections::HashMap;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};

use actix::prelude::*;
use rdkafka::error::KafkaResult;
use tracing::info;

use assignment::DriverState;
pub(crate) use assignment::StatsView;
use supervised::{subscribe, supervised};

pub use crate::record::{Header, Lease, Origin, Record, MAX_HEADERS};
pub use control::{forced_stops, longest_stop, PipelineControl, STOP_MARGIN};
pub(crate) use control::{Control, DriverThread};
pub use offsets::{window_admits, OffsetTracker};
pub use partition::{Drain, PartitionBook, PartitionConsumer, PartitionShared, Release};
pub use spec::PipelineSpec;
pub(crate) use status::{publish_lag, record_stats};
pub use status::{PartitionStatus, PipelineStatus};
pub use worker::{KeyedWorker, Pending, Process, WorkerRegistry};

use crate::metrics::Metrics;
use crate::supervise::restart::CrashBook;
use crate::supervise::{RecordHandler, Supervision};

/// A running pipeline. Stop it with [`Pipeline::stop`].
pub struct Pipeline {
    name: String,
    handle: PipelineControl,
    driver: DriverThread,
}

impl Pipeline {
    /// Starts the pipeline: its driver thread subscribes and feeds partition actors that
    /// run on `arbiter`. `stopping` is shared with the supervision's DLT writer.
    ///
    /// # Errors
    /// When the consumer cannot be created or cannot subscribe.
    pub fn start(
        spec: PipelineSpec,
        handler: Arc<dyn RecordHandler>,
        supervision: Supervision,
        stopping: Arc<AtomicBool>,
        metrics: Metrics,
        arbiter: ArbiterHandle,
    ) -> KafkaResult<Self> {
        let in_retry = Arc::clone(&supervision.in_retry);
        let health = Arc::clone(&supervision.health);
        let registry = Arc::new(Mutex::new(WorkerRegistry::new(
            handler,
            Arc::new(supervision),
            spec.max_live_workers,
            spec.idle_after,
            spec.max_in_flight.max(16),
        )));
        let status = Arc::new(Mutex::new(PipelineStatus {
            name: spec.name.clone(),
            group: spec.group_id.clone(),
            topics: spec.topics.clone(),
            ..PipelineStatus::default()
        }));
        let shared = Arc::new(DriverState {
            spec: spec.clone(),
            slots: Mutex::new(HashMap::new()),
            arbiter,
            registry,
            metrics,
            status: Arc::clone(&status),
            stats: Mutex::default(),
            lags: Mutex::default(),
            in_retry,
            health,
            pauses: Mutex::default(),
            crashes: CrashBook::default(),
            restarts: Arc::default(),
            lost: Mutex::default(),
            stall: Mutex::new(stall::StallWatch::new(spec.stall_after)),
            join_state: Mutex::default(),
            stalled: AtomicBool::new(false),
        });
        publish_initial_health(&shared);
        let consumer = subscribe(&shared)?;
        let name = spec.name.clone();
        let restarts = Arc::clone(&shared.restarts);
        // The drain's own bound, the final commit and the group leave.
        let stop_within = spec.drain_timeout + STOP_MARGIN;
        let driver = DriverThread::spawn(format!("tally-{name}"), stopping, stop_within, move |control_rx| {
            supervised(consumer, &shared, &control_rx);
        })?;
        info!(pipeline = %name, group = %spec.group_id, topics = ?spec.topics, "Pipeline started.");
        let handle = PipelineControl::new(driver.control(), status, restarts);
        Ok(Self { name, handle, driver })
    }

    /// A handle to pause, resume and observe this pipeline.
    #[must_use]
    pub fn control(&self) -> PipelineControl {
        self.handle.clone()
    }

    #[must_use]
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Stops fetching, drains in-flight work (bounded), commits, and leaves the group.
    /// Whether the stop was clean (see [`forced_stops`]).
    pub async fn stop(self) -> bool {
        let clean = self.driver.stop().await;
        info!(pipeline = %self.name, clean, "Pipeline stopped.");
        clean
    }
}

/// Publishes the pipeline's gauges and counters from the start (0), so that they are there
/// to alert on before the first degradation, pause, retry or wait.
fn publish_initial_health(shared: &DriverState) {
    publish_initial(&shared.metrics, &shared.spec.name);
}

/// The series of `pipeline` that alerts and dashboards use, at 0.
pub(crate) fn publish_initial(metrics: &Metrics, pipeline: &str) {
    metrics.pipeline_degraded.with_label_values(&[pipeline]).set(0);
    metrics.pipeline_paused.with_label_values(&[pipeline]).set(0);
    metrics.retries_total.with_label_values(&[pipeline]).inc_by(0);
    metrics.dependency_waits_total.with_label_values(&[pipeline]).inc_by(0);
    metrics.stage_restarts_total.with_label_values(&[pipeline]).inc_by(0);
    metrics.partition_holds_total.with_label_values(&[pipeline]).inc_by(0);
    metrics.records_total.with_label_values(&[pipeline, "dead_lettered"]).inc_by(0);
    metrics.handler_seconds.with_label_values(&[pipeline]);
    metrics.live_actors.with_label_values(&[pipeline]).set(0);
    metrics.oldest_inflight_age_seconds.with_label_values(&[pipeline]).set(0.0);
    for event in ["assigned", "revoked"] {
        metrics.rebalances_total.with_label_values(&[pipeline, event]).inc_by(0);
        metrics.rebalance_partitions_total.with_label_values(&[pipeline, event]).inc_by(0);
    }
}
