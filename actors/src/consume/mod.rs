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
mod driver;
mod lease;
mod offsets;
mod partition;
mod record;
mod worker;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use actix::prelude::*;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaResult;
use rdkafka::Statistics;
use tracing::info;

pub(crate) use assignment::StatsView;
use assignment::{DriverContext, DriverState};
use driver::drive;

pub use lease::Lease;
pub use offsets::{window_admits, OffsetTracker};
pub use partition::{Drain, PartitionConsumer, PartitionShared, Release};
pub use record::{Origin, Record};
pub use worker::{KeyedWorker, Pending, Process, WorkerRegistry};

use crate::metrics::Metrics;
use crate::supervise::{RecordHandler, Supervision};

/// What a pipeline consumes and how.
#[derive(Debug, Clone)]
pub struct PipelineSpec {
    /// Pipeline name, used in metrics labels and logs (e.g. `ledger`).
    pub name: String,
    pub group_id: String,
    pub topics: Vec<String>,
    /// Consumer settings ([`crate::kafka::KafkaClients::group_consumer`]); the pipeline
    /// sets its group and manual offset storage on top.
    pub client: ClientConfig,
    /// Records in flight per partition before the partition stops fetching.
    pub max_in_flight: usize,
    /// Offsets at most between a partition's completed watermark and the newest record
    /// taken; past it the partition is held until the head of line completes.
    pub max_uncommitted: usize,
    /// Live keyed workers at most (least recently used idle ones are passivated first).
    pub max_live_workers: usize,
    /// Workers idle this long are passivated.
    pub idle_after: Duration,
    /// Longest wait for in-flight work when a partition is revoked or the pipeline stops.
    pub drain_timeout: Duration,
    /// Commit after every completed record (the bench's classic-consumer baseline).
    pub commit_each: bool,
    /// Header holding a record's due time (epoch milliseconds), for retry topics: a record
    /// not yet due is held and its partition paused until then, without holding up other
    /// partitions.
    pub due_header: Option<String>,
}

impl PipelineSpec {
    fn consumer_config(&self) -> ClientConfig {
        let mut c = self.client.clone();
        // Not overridable: correctness depends on them.
        c.set("group.id", &self.group_id).set("enable.auto.offset.store", "false");
        c
    }
}

/// A snapshot of one pipeline for `/admin/pipelines`.
#[derive(Debug, Clone, Default, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PipelineStatus {
    pub name: String,
    pub group: String,
    pub topics: Vec<String>,
    pub paused: bool,
    /// The group gave this pipeline its first partition assignment (possibly empty).
    pub assigned: bool,
    pub partitions: Vec<PartitionStatus>,
    /// Keys whose record is waiting in blocking retry.
    pub keys_in_retry: usize,
    pub live_workers: usize,
    /// Waiting for an unavailable dependency, partitions paused.
    pub degraded: bool,
    /// The last dependency failure seen, while degraded.
    pub degraded_reason: Option<String>,
    /// Seconds since the pipeline became degraded, while degraded.
    pub degraded_seconds: Option<f64>,
    /// Records waiting for the dependency, each probing it with capped backoff.
    pub waiting_for_dependency: usize,
}

#[derive(Debug, Clone, Default, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PartitionStatus {
    pub topic: String,
    pub partition: i32,
    /// The next offset to read after a restart, as last committed (librdkafka statistics).
    pub committed_offset: Option<i64>,
    /// The next offset to commit, as stored by tally.
    pub stored_offset: Option<i64>,
    pub lag: Option<i64>,
    pub in_flight: usize,
    /// Paused by backpressure, the uncommitted window, or a not-yet-due retry record.
    pub held: bool,
}

/// Pause, resume and observe a running pipeline from anywhere (cheap to clone).
#[derive(Clone)]
pub struct PipelineControl {
    control: std::sync::mpsc::Sender<Control>,
    status: Arc<Mutex<PipelineStatus>>,
}

impl PipelineControl {
    pub(crate) fn new(control: std::sync::mpsc::Sender<Control>, status: Arc<Mutex<PipelineStatus>>) -> Self {
        Self { control, status }
    }

    #[must_use]
    pub fn name(&self) -> String {
        self.status.lock().unwrap_or_else(PoisonError::into_inner).name.clone()
    }

    /// Stops fetching; records in flight finish. Blocks until the driver applied it
    /// (returns false when it did not answer within 5 s).
    #[must_use]
    pub fn pause(&self) -> bool {
        self.status.lock().unwrap_or_else(PoisonError::into_inner).paused = true;
        self.request(Control::Pause)
    }

    /// Resumes fetching. Blocks until the driver applied it (false after 5 s).
    #[must_use]
    pub fn resume(&self) -> bool {
        self.status.lock().unwrap_or_else(PoisonError::into_inner).paused = false;
        self.request(Control::Resume)
    }

    fn request(&self, make: fn(std::sync::mpsc::Sender<()>) -> Control) -> bool {
        let (done, applied) = std::sync::mpsc::channel();
        self.control.send(make(done)).is_ok() && applied.recv_timeout(Duration::from_secs(5)).is_ok()
    }

    #[must_use]
    pub fn status(&self) -> PipelineStatus {
        self.status.lock().unwrap_or_else(PoisonError::into_inner).clone()
    }
}

/// Commands to a driver thread.
pub(crate) enum Control {
    Stop(std::sync::mpsc::Sender<()>),
    /// Acknowledged once applied.
    Pause(std::sync::mpsc::Sender<()>),
    Resume(std::sync::mpsc::Sender<()>),
}

/// A running pipeline. Stop it with [`Pipeline::stop`].
pub struct Pipeline {
    name: String,
    handle: PipelineControl,
    driver: DriverThread,
}

/// A stage's driver thread with its control channel: spawned with a body that serves the
/// channel, stopped in order (stop flag, `Stop` command, wait for it, join).
pub(crate) struct DriverThread {
    control: std::sync::mpsc::Sender<Control>,
    thread: Option<std::thread::JoinHandle<()>>,
    stopping: Arc<AtomicBool>,
}

impl DriverThread {
    /// Spawns `body` on a thread named `name`, handing it the receiving end of the
    /// control channel.
    pub(crate) fn spawn(
        name: String,
        stopping: Arc<AtomicBool>,
        body: impl FnOnce(std::sync::mpsc::Receiver<Control>) + Send + 'static,
    ) -> KafkaResult<Self> {
        let (control, control_rx) = std::sync::mpsc::channel();
        let thread = std::thread::Builder::new()
            .name(name)
            .spawn(move || body(control_rx))
            .map_err(|e| rdkafka::error::KafkaError::ClientCreation(e.to_string()))?;
        Ok(Self { control, thread: Some(thread), stopping })
    }

    /// A sender of commands to the thread.
    pub(crate) fn control(&self) -> std::sync::mpsc::Sender<Control> {
        self.control.clone()
    }

    /// Raises the stop flag, sends `Stop`, waits until it was served, joins the thread.
    pub(crate) async fn stop(mut self) {
        self.stopping.store(true, Ordering::Relaxed);
        let (done, wait) = std::sync::mpsc::channel();
        if self.control.send(Control::Stop(done)).is_ok() {
            let _ = tokio::task::spawn_blocking(move || wait.recv()).await;
        }
        if let Some(thread) = self.thread.take() {
            let _ = tokio::task::spawn_blocking(move || thread.join()).await;
        }
    }
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
            degraded_pause: AtomicBool::new(false),
        });
        publish_initial_health(&shared);
        let consumer: BaseConsumer<DriverContext> =
            spec.consumer_config().create_with_context(DriverContext { shared: Arc::clone(&shared) })?;
        let topics: Vec<&str> = spec.topics.iter().map(String::as_str).collect();
        consumer.subscribe(&topics)?;
        let name = spec.name.clone();
        let driver = DriverThread::spawn(format!("tally-{name}"), stopping, move |control_rx| {
            drive(&consumer, &shared, &control_rx);
        })?;
        info!(pipeline = %name, group = %spec.group_id, topics = ?spec.topics, "Pipeline started.");
        let handle = PipelineControl { control: driver.control(), status };
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
    pub async fn stop(self) {
        self.driver.stop().await;
        info!(pipeline = %self.name, "Pipeline stopped.");
    }
}

/// Publishes the pipeline's degraded gauge from the start (0), so that it is there to
/// alert on before the first degradation.
fn publish_initial_health(shared: &DriverState) {
    shared.metrics.pipeline_degraded.with_label_values(&[&shared.spec.name]).set(0);
}

/// Keeps the committed offset and lag of every partition from librdkafka statistics.
pub(crate) fn record_stats(view: &Mutex<StatsView>, stats: &Statistics) {
    let mut view = view.lock().unwrap_or_else(PoisonError::into_inner);
    for (topic, t) in &stats.topics {
        for (id, p) in &t.partitions {
            if *id >= 0 {
                view.insert((topic.clone(), *id), (p.committed_offset, p.consumer_lag));
            }
        }
    }
}

/// Publishes `tally_consumer_lag{pipeline,partition}` from librdkafka statistics.
pub(crate) fn publish_lag(metrics: &Metrics, pipeline: &str, topics: &[String], stats: &Statistics) {
    for (topic, t) in &stats.topics {
        if !topics.contains(topic) {
            continue;
        }
        for (id, p) in &t.partitions {
            if *id >= 0 && p.consumer_lag >= 0 {
                metrics.consumer_lag.with_label_values(&[pipeline, &id.to_string()]).set(p.consumer_lag);
            }
        }
    }
}
