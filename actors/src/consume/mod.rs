//! The consumption machinery shared by every pipeline (DESIGN.md §3, §5).
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
//! A dependency that is down (see [`DependencyHealth`]) degrades the pipeline: the driver
//! pauses every assigned partition until the records waiting for it got through, then
//! resumes those not held otherwise (an admin pause stays).
//!
//! Why a thread: on revoke the rebalance callback must wait for in-flight work to finish
//! and commit before the partition is given up. The callback runs on the thread that
//! polls, so that thread must not be the one that runs the actors doing the work.

mod lease;
mod offsets;
mod partition;
mod record;
mod worker;

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use actix::prelude::*;
use rdkafka::config::{ClientConfig, RDKafkaLogLevel};
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer, ConsumerContext, Rebalance};
use rdkafka::error::KafkaResult;
use rdkafka::{ClientContext, Statistics, TopicPartitionList};
use tokio::sync::mpsc;
use tracing::{debug, error, info, warn};

pub use lease::Lease;
pub use offsets::{window_admits, OffsetTracker};
pub use partition::{Drain, PartitionConsumer, PartitionShared, Release};
pub use record::{Origin, Record};
pub use worker::{KeyedWorker, Pending, Process, WorkerRegistry};

use crate::metrics::Metrics;
use crate::supervise::{DependencyHealth, RecordHandler, Supervision};

/// What a pipeline consumes and how.
#[derive(Debug, Clone)]
pub struct PipelineSpec {
    /// Pipeline name, used in metrics labels and logs (e.g. `ledger`).
    pub name: String,
    pub group_id: String,
    pub topics: Vec<String>,
    /// Base client settings (bootstrap servers and pass-through properties).
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
    /// Commit after every completed record (the seed-style baseline).
    pub commit_each: bool,
    /// Header holding a record's due time (epoch milliseconds), for retry topics: a record
    /// not yet due is held and its partition paused until then, without holding up other
    /// partitions.
    pub due_header: Option<String>,
}

impl PipelineSpec {
    fn consumer_config(&self) -> ClientConfig {
        let mut c = ClientConfig::new();
        c.set("enable.auto.commit", "true")
            .set("auto.commit.interval.ms", "1000")
            .set("auto.offset.reset", "earliest")
            .set("statistics.interval.ms", "5000")
            .set("session.timeout.ms", "10000")
            .set("heartbeat.interval.ms", "1000")
            // Prefetch per partition, bounded; librdkafka 2.x then waits
            // fetch.queue.backoff.ms (default 1 s) before fetching that partition again,
            // which starves a fast pipeline: keep the back-off short.
            .set("queued.min.messages", "10000")
            .set("fetch.queue.backoff.ms", "5")
            // librdkafka waits up to 500 ms for an empty fetch by default; the mock broker
            // does not answer early when data arrives, which adds that wait per hop.
            .set("fetch.wait.max.ms", "25")
            .set_log_level(RDKafkaLogLevel::Warning);
        for (k, v) in self.client.config_map() {
            c.set(k, v);
        }
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

/// Committed offset and lag per partition, from librdkafka statistics.
pub(crate) type StatsView = HashMap<TopicPartition, (i64, i64)>;

struct Slot {
    addr: Addr<PartitionConsumer>,
    tx: mpsc::Sender<Arc<Record>>,
    shared: Arc<PartitionShared>,
    stored: i64,
    stash: VecDeque<Arc<Record>>,
    paused: bool,
    /// This assignment's lease: drained then revoked when the partition is given up.
    lease: Lease,
    /// The offset of the first record handed over under this assignment.
    first_taken: Option<i64>,
}

impl Slot {
    /// Whether `offset` may be handed over without passing the uncommitted window.
    fn admits(&self, offset: i64, max_uncommitted: usize) -> bool {
        window_admits(offset, self.shared.watermark.load(Ordering::Acquire), self.first_taken, max_uncommitted)
    }
}

pub(crate) type TopicPartition = (String, i32);

/// State shared by the driver loop and the rebalance callbacks (both on the driver thread,
/// never locked across a poll).
struct Shared {
    spec: PipelineSpec,
    slots: Mutex<HashMap<TopicPartition, Slot>>,
    arbiter: ArbiterHandle,
    registry: Arc<Mutex<WorkerRegistry>>,
    metrics: Metrics,
    status: Arc<Mutex<PipelineStatus>>,
    stats: Mutex<StatsView>,
    /// Lag per partition from the broker's high watermark (refreshed by the driver).
    lags: Mutex<HashMap<TopicPartition, i64>>,
    in_retry: Arc<std::sync::atomic::AtomicUsize>,
    health: Arc<DependencyHealth>,
    /// Whether the driver paused the assignment because the pipeline is degraded.
    degraded_pause: AtomicBool,
}

impl Shared {
    fn admin_paused(&self) -> bool {
        self.status.lock().unwrap_or_else(PoisonError::into_inner).paused
    }

    fn slots(&self) -> MutexGuard<'_, HashMap<TopicPartition, Slot>> {
        self.slots.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn assign(&self, tpl: &TopicPartitionList) {
        let mut slots = self.slots();
        for e in tpl.elements() {
            let tp = (e.topic().to_owned(), e.partition());
            if slots.contains_key(&tp) {
                continue;
            }
            // The queue holds records not yet started; the semaphore of the partition consumer
            // bounds those in flight. A queue of one would pause and refetch per record.
            let (tx, rx) = mpsc::channel(self.spec.max_in_flight.max(64));
            let shared = Arc::new(PartitionShared::default());
            let (topic, partition) = tp.clone();
            let (max, registry, state) = (self.spec.max_in_flight, Arc::clone(&self.registry), Arc::clone(&shared));
            let lease = Lease::new();
            let held = lease.clone();
            let addr = PartitionConsumer::start_in_arbiter(&self.arbiter, move |_| {
                PartitionConsumer::new(topic, partition, rx, max, state, registry, held)
            });
            let stash = VecDeque::new();
            slots.insert(tp, Slot { addr, tx, shared, stored: -1, stash, paused: false, lease, first_taken: None });
        }
        info!(pipeline = %self.spec.name, partitions = tpl.count(), "Partitions assigned.");
    }

    /// Drains the given partitions (bounded by the drain timeout), stores their final
    /// watermarks and commits, then releases them.
    fn revoke(&self, consumer: &BaseConsumer<DriverContext>, partitions: &[TopicPartition]) {
        let mut taken = Vec::new();
        {
            let mut slots = self.slots();
            for tp in partitions {
                if let Some(slot) = slots.remove(tp) {
                    taken.push((tp.clone(), slot));
                }
            }
        }
        if taken.is_empty() {
            return;
        }
        let deadline = Instant::now() + self.spec.drain_timeout;
        let waits: Vec<_> = taken
            .iter()
            .map(|(_, slot)| {
                let (done, wait) = std::sync::mpsc::channel();
                slot.lease.drain();
                slot.addr.do_send(Drain { done });
                wait
            })
            .collect();
        let mut undrained = 0;
        for wait in waits {
            let left = deadline.saturating_duration_since(Instant::now());
            if wait.recv_timeout(left).is_err() {
                undrained += 1;
            }
        }
        if undrained > 0 {
            warn!(pipeline = %self.spec.name, undrained, "Drain timed out; unfinished records stay uncommitted and will be redelivered.");
        }
        for ((topic, partition), slot) in &taken {
            // From here on nothing more happens for the partition on this instance.
            slot.lease.revoke();
            let watermark = slot.shared.watermark.load(Ordering::Acquire);
            if watermark > slot.stored {
                if let Err(e) = consumer.store_offset(topic, *partition, watermark) {
                    warn!(pipeline = %self.spec.name, topic, partition, error = %e, "Cannot store final offset.");
                }
            }
            slot.addr.do_send(Release);
            self.metrics.inflight.with_label_values(&[&self.spec.name, &partition.to_string()]).set(0);
        }
        match consumer.commit_consumer_state(CommitMode::Sync) {
            Ok(()) => info!(pipeline = %self.spec.name, partitions = taken.len(), "Drained and committed partitions."),
            // Nothing stored since the last commit is reported as an error by librdkafka.
            Err(e) => debug!(pipeline = %self.spec.name, error = %e, "Commit on revoke."),
        }
    }
}

/// The consumer context: rebalance callbacks and statistics (lag).
struct DriverContext {
    shared: Arc<Shared>,
}

impl ClientContext for DriverContext {
    fn stats(&self, stats: Statistics) {
        record_stats(&self.shared.stats, &stats);
    }
}

impl ConsumerContext for DriverContext {
    fn pre_rebalance(&self, consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        if let Rebalance::Revoke(tpl) = rebalance {
            let partitions: Vec<TopicPartition> =
                tpl.elements().iter().map(|e| (e.topic().to_owned(), e.partition())).collect();
            info!(pipeline = %self.shared.spec.name, partitions = partitions.len(), "Partitions revoked; draining.");
            self.shared.revoke(consumer, &partitions);
        }
    }

    fn post_rebalance(&self, consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        match rebalance {
            Rebalance::Assign(tpl) => {
                self.shared.assign(tpl);
                self.shared.status.lock().unwrap_or_else(PoisonError::into_inner).assigned = true;
                // librdkafka keeps an application pause across re-assignment: a partition
                // held (backpressure, a not-yet-due record) when it was revoked would stay
                // paused. New slots start unheld, so resume them, unless the pipeline is
                // paused through the admin API, which lasts across rebalances, or degraded.
                let hold = self.shared.admin_paused() || self.shared.degraded_pause.load(Ordering::Relaxed);
                let result = if hold { consumer.pause(tpl) } else { consumer.resume(tpl) };
                if let Err(e) = result {
                    warn!(pipeline = %self.shared.spec.name, error = %e, "Cannot set the pause state of new partitions.");
                }
            }
            Rebalance::Error(e) => error!(pipeline = %self.shared.spec.name, error = %e, "Rebalance error."),
            Rebalance::Revoke(_) => {}
        }
    }

    fn commit_callback(&self, result: KafkaResult<()>, _: &TopicPartitionList) {
        if let Err(e) = result {
            debug!(pipeline = %self.shared.spec.name, error = %e, "Offset commit failed; the next commit retries.");
        }
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
        let shared = Arc::new(Shared {
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

fn drive(consumer: &BaseConsumer<DriverContext>, shared: &Arc<Shared>, control: &std::sync::mpsc::Receiver<Control>) {
    let name = shared.spec.name.clone();
    let mut paused_all = false;
    let mut last_gauges = Instant::now();
    let mut last_passivation = Instant::now();
    let mut last_lag = Instant::now();
    loop {
        while let Ok(c) = control.try_recv() {
            match c {
                Control::Stop(done) => {
                    info!(pipeline = %name, "Stopping: no more fetching; draining in-flight records.");
                    let all: Vec<TopicPartition> = shared.slots().keys().cloned().collect();
                    shared.revoke(consumer, &all);
                    consumer.unsubscribe();
                    let _ = done.send(());
                    return;
                }
                Control::Pause(applied) => {
                    if let Ok(tpl) = consumer.assignment() {
                        let _ = consumer.pause(&tpl);
                    }
                    paused_all = true;
                    shared.status.lock().unwrap_or_else(PoisonError::into_inner).paused = true;
                    info!(pipeline = %name, "Pipeline paused.");
                    let _ = applied.send(());
                }
                Control::Resume(applied) => {
                    paused_all = false;
                    shared.status.lock().unwrap_or_else(PoisonError::into_inner).paused = false;
                    // While degraded the partitions stay paused; resumed when it ends.
                    if !shared.degraded_pause.load(Ordering::Relaxed) {
                        resume_unheld(consumer, shared);
                    }
                    let _ = applied.send(());
                    info!(pipeline = %name, "Pipeline resumed.");
                }
            }
        }
        follow_health(consumer, shared, paused_all);
        let ready = shared.slots().values().any(|s| {
            s.stash.front().is_some_and(|r| is_due(shared, r) && s.admits(r.offset, shared.spec.max_uncommitted))
        });
        let waiting = shared.slots().values().any(|s| !s.stash.is_empty());
        let timeout = Duration::from_millis(if ready {
            5
        } else if waiting {
            20
        } else {
            100
        });
        match consumer.poll(timeout) {
            Some(Ok(message)) => {
                let record = Arc::new(Record::from_message(&message));
                drop(message);
                route(consumer, shared, record);
            }
            Some(Err(e)) => warn!(pipeline = %name, error = %e, "Consumer error."),
            None => {}
        }
        if !paused_all && !shared.degraded_pause.load(Ordering::Relaxed) {
            flush_stashes(consumer, shared);
        }
        store_watermarks(consumer, shared);
        if last_gauges.elapsed() >= Duration::from_millis(500) {
            last_gauges = Instant::now();
            publish_gauges(shared);
        }
        if last_lag.elapsed() >= Duration::from_secs(2) {
            last_lag = Instant::now();
            refresh_lag(consumer, shared);
        }
        if last_passivation.elapsed() >= Duration::from_secs(5) {
            last_passivation = Instant::now();
            shared.registry.lock().unwrap_or_else(PoisonError::into_inner).passivate_idle();
        }
    }
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

/// Resumes every assigned partition not held by backpressure, the uncommitted window or a
/// not-yet-due record (the stash flush resumes those).
fn resume_unheld(consumer: &BaseConsumer<DriverContext>, shared: &Shared) {
    if let Ok(tpl) = consumer.assignment() {
        let mut ready = TopicPartitionList::new();
        let slots = shared.slots();
        for e in tpl.elements() {
            let held = slots.get(&(e.topic().to_owned(), e.partition())).is_some_and(|s| s.paused);
            if !held {
                ready.add_partition(e.topic(), e.partition());
            }
        }
        drop(slots);
        if let Err(e) = consumer.resume(&ready) {
            warn!(pipeline = %shared.spec.name, error = %e, "Cannot resume partitions.");
        }
    }
}

/// Pauses the assignment when the pipeline became degraded (a record waits for an
/// unavailable dependency) and resumes it when no record waits any more, unless the
/// pipeline is paused through the admin API.
fn follow_health(consumer: &BaseConsumer<DriverContext>, shared: &Shared, admin_paused: bool) {
    let name = &shared.spec.name;
    let degraded = shared.health.is_degraded();
    if degraded == shared.degraded_pause.load(Ordering::Relaxed) {
        return;
    }
    shared.degraded_pause.store(degraded, Ordering::Relaxed);
    shared.metrics.pipeline_degraded.with_label_values(&[name]).set(i64::from(degraded));
    if degraded {
        if let Ok(tpl) = consumer.assignment() {
            if let Err(e) = consumer.pause(&tpl) {
                warn!(pipeline = %name, error = %e, "Cannot pause partitions.");
            }
        }
        let reason = shared.health.degradation().map(|d| d.reason).unwrap_or_default();
        warn!(pipeline = %name, reason, "Pipeline degraded: a dependency is unavailable; partitions paused.");
    } else {
        if !admin_paused {
            resume_unheld(consumer, shared);
        }
        info!(pipeline = %name, "Dependency available again; pipeline resumed.");
    }
    publish_gauges(shared);
}

fn tpl_of(topic: &str, partition: i32) -> TopicPartitionList {
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition(topic, partition);
    tpl
}

fn route(consumer: &BaseConsumer<DriverContext>, shared: &Shared, record: Arc<Record>) {
    let mut slots = shared.slots();
    let tp = (record.topic.clone(), record.partition);
    let Some(slot) = slots.get_mut(&tp) else {
        // Not (or no longer) ours: it stays uncommitted and goes to the partition's owner.
        return;
    };
    if !slot.stash.is_empty() {
        slot.stash.push_back(record);
        return;
    }
    if !is_due(shared, &record) || !slot.admits(record.offset, shared.spec.max_uncommitted) {
        slot.stash.push_back(record);
        hold(consumer, shared, slot, &tp);
        return;
    }
    let offset = record.offset;
    match slot.tx.try_send(record) {
        Ok(()) => {
            slot.first_taken.get_or_insert(offset);
        }
        Err(mpsc::error::TrySendError::Full(record)) => {
            slot.stash.push_back(record);
            hold(consumer, shared, slot, &tp);
        }
        Err(mpsc::error::TrySendError::Closed(_)) => {}
    }
}

/// Pauses a partition whose next record is in hand (queue full, window full, or not yet
/// due).
/// librdkafka drops what it prefetched for it and, on resume, fetches again after the last
/// record handed to tally.
fn hold(consumer: &BaseConsumer<DriverContext>, shared: &Shared, slot: &mut Slot, tp: &TopicPartition) {
    if !slot.paused {
        slot.paused = true;
        if let Err(e) = consumer.pause(&tpl_of(&tp.0, tp.1)) {
            warn!(pipeline = %shared.spec.name, error = %e, "Cannot pause partition.");
        }
    }
}

/// Whether `record` may be handled now (always, unless the pipeline reads a due header).
fn is_due(shared: &Shared, record: &Record) -> bool {
    let Some(header) = shared.spec.due_header.as_deref() else { return true };
    let Some(due) = record.header_str(header).and_then(|v| v.parse::<i64>().ok()) else { return true };
    due <= chrono::Utc::now().timestamp_millis()
}

fn flush_stashes(consumer: &BaseConsumer<DriverContext>, shared: &Shared) {
    let mut slots = shared.slots();
    for ((topic, partition), slot) in slots.iter_mut() {
        while let Some(record) = slot.stash.pop_front() {
            if !is_due(shared, &record) || !slot.admits(record.offset, shared.spec.max_uncommitted) {
                slot.stash.push_front(record);
                break;
            }
            let offset = record.offset;
            match slot.tx.try_send(record) {
                Ok(()) => {
                    slot.first_taken.get_or_insert(offset);
                }
                Err(mpsc::error::TrySendError::Full(record)) => {
                    slot.stash.push_front(record);
                    break;
                }
                Err(mpsc::error::TrySendError::Closed(_)) => slot.stash.clear(),
            }
        }
        if slot.stash.is_empty() && slot.paused {
            slot.paused = false;
            if let Err(e) = consumer.resume(&tpl_of(topic, *partition)) {
                warn!(pipeline = %shared.spec.name, error = %e, "Cannot resume partition.");
            }
        }
    }
}

fn store_watermarks(consumer: &BaseConsumer<DriverContext>, shared: &Shared) {
    let mut stored_any = false;
    for ((topic, partition), slot) in shared.slots().iter_mut() {
        let watermark = slot.shared.watermark.load(Ordering::Acquire);
        if watermark > slot.stored {
            match consumer.store_offset(topic, *partition, watermark) {
                Ok(()) => {
                    slot.stored = watermark;
                    stored_any = true;
                }
                Err(e) => debug!(pipeline = %shared.spec.name, topic, partition, error = %e, "Cannot store offset."),
            }
        }
    }
    if stored_any && shared.spec.commit_each {
        // One commit request per completed record (the seed's acknowledge-after-each).
        // Asynchronous, so that partitions stay parallel as with one consumer per
        // partition; a synchronous commit here would serialise every partition behind it.
        if let Err(e) = consumer.commit_consumer_state(CommitMode::Async) {
            debug!(pipeline = %shared.spec.name, error = %e, "Commit failed.");
        }
    }
}

/// Lag = the broker's high watermark - the next offset this pipeline will commit. Asked of
/// the broker because librdkafka's own figure goes stale while a partition is paused.
fn refresh_lag(consumer: &BaseConsumer<DriverContext>, shared: &Shared) {
    let positions: Vec<(TopicPartition, i64)> = {
        let stats = shared.stats.lock().unwrap_or_else(PoisonError::into_inner);
        shared
            .slots()
            .iter()
            .map(|(tp, slot)| {
                let committed = stats.get(tp).map_or(-1, |(c, _)| *c);
                (tp.clone(), if slot.stored >= 0 { slot.stored + 1 } else { committed })
            })
            .collect()
    };
    let mut lags = HashMap::with_capacity(positions.len());
    for ((topic, partition), next) in positions {
        if let Ok((low, high)) = consumer.fetch_watermarks(&topic, partition, Duration::from_millis(500)) {
            let lag = (high - if next >= 0 { next } else { low }).max(0);
            shared.metrics.consumer_lag.with_label_values(&[&shared.spec.name, &partition.to_string()]).set(lag);
            lags.insert((topic, partition), lag);
        }
    }
    *shared.lags.lock().unwrap_or_else(PoisonError::into_inner) = lags;
}

fn publish_gauges(shared: &Shared) {
    let name = &shared.spec.name;
    let mut oldest = 0_u64;
    for ((_, partition), slot) in shared.slots().iter() {
        let in_flight = slot.shared.in_flight.load(Ordering::Relaxed) + slot.stash.len();
        shared.metrics.inflight.with_label_values(&[name, &partition.to_string()]).set(in_flight as i64);
        oldest = oldest.max(slot.shared.oldest_age_ms.load(Ordering::Relaxed));
    }
    shared.metrics.oldest_inflight_age_seconds.with_label_values(&[name]).set(oldest as f64 / 1000.0);
    let live = shared.registry.lock().unwrap_or_else(PoisonError::into_inner).live();
    shared.metrics.live_actors.with_label_values(&[name]).set(live as i64);

    let stats = shared.stats.lock().unwrap_or_else(PoisonError::into_inner).clone();
    let lags = shared.lags.lock().unwrap_or_else(PoisonError::into_inner).clone();
    let mut partitions: Vec<PartitionStatus> = shared
        .slots()
        .iter()
        .map(|((topic, partition), slot)| {
            let committed = stats.get(&(topic.clone(), *partition)).map_or(-1, |(c, _)| *c);
            let lag = lags.get(&(topic.clone(), *partition)).copied().unwrap_or(-1);
            PartitionStatus {
                topic: topic.clone(),
                partition: *partition,
                committed_offset: (committed >= 0).then_some(committed),
                stored_offset: (slot.stored >= 0).then_some(slot.stored + 1),
                lag: (lag >= 0).then_some(lag),
                in_flight: slot.shared.in_flight.load(Ordering::Relaxed) + slot.stash.len(),
                held: slot.paused,
            }
        })
        .collect();
    partitions.sort_by(|a, b| (&a.topic, a.partition).cmp(&(&b.topic, b.partition)));
    let degradation = shared.health.degradation();
    let mut status = shared.status.lock().unwrap_or_else(PoisonError::into_inner);
    status.partitions = partitions;
    status.keys_in_retry = shared.in_retry.load(Ordering::Relaxed);
    status.live_workers = live;
    status.degraded = degradation.is_some();
    status.waiting_for_dependency = degradation.as_ref().map_or(0, |d| d.waiting);
    status.degraded_seconds = degradation.as_ref().map(|d| d.since.as_secs_f64());
    status.degraded_reason = degradation.map(|d| d.reason);
}
