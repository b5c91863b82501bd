//! What a pipeline shows of itself: the `/admin/pipelines` snapshot and the lag and
//! committed offsets read from librdkafka statistics.

use std::sync::{Mutex, PoisonError};

use rdkafka::Statistics;

use super::assignment::StatsView;
use crate::metrics::Metrics;

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
    /// Age of the oldest unfinished record (a key stuck in retry shows here), seconds.
    pub oldest_in_flight_seconds: f64,
    pub live_workers: usize,
    /// Waiting for an unavailable dependency, partitions paused.
    pub degraded: bool,
    /// The last dependency failure seen, while degraded.
    pub degraded_reason: Option<String>,
    /// Seconds since the pipeline became degraded, while degraded.
    pub degraded_seconds: Option<f64>,
    /// Records waiting for the dependency, each probing it with capped backoff.
    pub waiting_for_dependency: usize,
    /// Seconds that records have waited with none finished, while they do (past the
    /// pipeline's stall bound the stage restarts).
    pub stalled_seconds: Option<f64>,
    /// Restarts after a panic: down (waiting to start again), crash-looping, the last cause.
    pub restart: crate::supervise::restart::RestartStatus,
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
    /// Records received and not finished: in flight, queued and stashed.
    pub in_flight: usize,
    /// Paused by backpressure, the uncommitted window, or a not-yet-due retry record.
    pub held: bool,
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
