//! Throughput history: how many records each pipeline completed, and how many transfers
//! the intake accepted, in each interval of the last hour. The daemon samples its own
//! counters (`tally_records_total`, `tally_http_requests_total`) every [`INTERVAL`] into
//! a bounded ring ([`CAPACITY`] intervals), and `GET /admin/throughput` serves it, so the
//! console's chart shows the same history after a reload or in a second tab.
//!
//! Only whole intervals are kept: the interval in progress is not shown until it ends, so
//! the chart never ends in a false drop.

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use chrono::{DateTime, Utc};
use prometheus::core::Collector;
use serde::Serialize;
use tally_actors::Metrics;

/// Length of one interval.
pub const INTERVAL: Duration = Duration::from_secs(5);
/// Intervals kept: one hour.
pub const CAPACITY: usize = 720;
/// The series of transfers accepted by `POST /transfers`.
pub const INTAKE: &str = "intake";

/// Counts of one finished interval, by series.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Point {
    /// When the interval ended.
    pub end: DateTime<Utc>,
    pub counts: BTreeMap<String, u64>,
}

/// The ring: the last [`CAPACITY`] points and the counter totals at the last sample.
#[derive(Debug)]
pub struct Ring {
    capacity: usize,
    totals: Option<BTreeMap<String, u64>>,
    points: VecDeque<Point>,
}

impl Ring {
    #[must_use]
    pub fn new(capacity: usize) -> Self {
        Self { capacity: capacity.max(1), totals: None, points: VecDeque::new() }
    }

    /// Takes the counter totals at `at`: the first call sets the baseline, each later one
    /// adds the interval since the previous call. A series seen for the first time counts
    /// from 0; a total that went down (a counter reset) counts from 0 again.
    pub fn sample(&mut self, at: DateTime<Utc>, totals: BTreeMap<String, u64>) {
        if let Some(previous) = &self.totals {
            let counts = totals
                .iter()
                .map(|(name, &now)| {
                    let before = previous.get(name).copied().unwrap_or(0);
                    (name.clone(), if now >= before { now - before } else { now })
                })
                .collect();
            self.points.push_back(Point { end: at, counts });
            while self.points.len() > self.capacity {
                self.points.pop_front();
            }
        }
        self.totals = Some(totals);
    }

    /// Every series seen, in name order.
    #[must_use]
    pub fn series(&self) -> Vec<String> {
        self.totals.as_ref().map(|t| t.keys().cloned().collect()).unwrap_or_default()
    }

    /// The kept points, oldest first.
    #[must_use]
    pub fn points(&self) -> Vec<Point> {
        self.points.iter().cloned().collect()
    }
}

/// The daemon's ring, shared by its sampler and the admin endpoint.
#[derive(Debug, Clone)]
pub struct History(Arc<Mutex<Ring>>);

impl Default for History {
    fn default() -> Self {
        Self(Arc::new(Mutex::new(Ring::new(CAPACITY))))
    }
}

impl History {
    /// Applies `f` to the ring (a panic elsewhere while it was held leaves it usable).
    pub fn with<T>(&self, f: impl FnOnce(&mut Ring) -> T) -> T {
        f(&mut self.0.lock().unwrap_or_else(PoisonError::into_inner))
    }

    /// Samples `metrics` every [`INTERVAL`] on the actix system, from now. Ends with the
    /// system.
    pub fn spawn_sampler(&self, metrics: Metrics) {
        let history = self.clone();
        history.with(|ring| ring.sample(Utc::now(), totals(&metrics)));
        actix::spawn(async move {
            let mut ticks = tokio::time::interval_at(tokio::time::Instant::now() + INTERVAL, INTERVAL);
            ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                ticks.tick().await;
                let now = totals(&metrics);
                history.with(|ring| ring.sample(Utc::now(), now));
            }
        });
    }
}

/// The counter totals now: records completed per pipeline (every outcome), and transfers
/// accepted by the intake (`POST /transfers` answered 2xx).
#[must_use]
pub fn totals(metrics: &Metrics) -> BTreeMap<String, u64> {
    let mut out = BTreeMap::new();
    let label = |m: &prometheus::proto::Metric, name: &str| {
        m.get_label().iter().find(|l| l.name() == name).map(|l| l.value().to_owned())
    };
    for family in metrics.records_total.collect() {
        for m in family.get_metric() {
            if let Some(pipeline) = label(m, "pipeline") {
                *out.entry(pipeline).or_insert(0) += m.get_counter().get_value() as u64;
            }
        }
    }
    let mut accepted = 0;
    for family in metrics.http_requests_total.collect() {
        for m in family.get_metric() {
            let intake = label(m, "route").as_deref() == Some("/transfers");
            if intake && label(m, "status").is_some_and(|s| s.starts_with('2')) {
                accepted += m.get_counter().get_value() as u64;
            }
        }
    }
    out.insert(INTAKE.to_owned(), accepted);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(s: i64) -> DateTime<Utc> {
        DateTime::from_timestamp(1_800_000_000 + s, 0).unwrap_or_default()
    }

    fn totals(pairs: &[(&str, u64)]) -> BTreeMap<String, u64> {
        pairs.iter().map(|(k, v)| ((*k).to_owned(), *v)).collect()
    }

    #[test]
    fn each_sample_after_the_first_adds_the_interval_since_the_previous() {
        let mut ring = Ring::new(10);
        ring.sample(at(0), totals(&[("ledger", 5)]));
        assert!(ring.points().is_empty(), "the first sample is the baseline");
        ring.sample(at(5), totals(&[("ledger", 9), ("intake", 2)]));
        ring.sample(at(10), totals(&[("ledger", 9), ("intake", 3)]));
        let points = ring.points();
        assert_eq!(points.len(), 2);
        assert_eq!(points[0].counts, totals(&[("ledger", 4), ("intake", 2)]));
        assert_eq!(points[1].counts, totals(&[("ledger", 0), ("intake", 1)]));
        assert_eq!(points[1].end, at(10));
        assert_eq!(ring.series(), ["intake", "ledger"]);
    }

    #[test]
    fn the_ring_keeps_only_its_capacity_and_survives_a_counter_reset() {
        let mut ring = Ring::new(3);
        for i in 0..=6 {
            ring.sample(at(i * 5), totals(&[("ledger", 10 * i as u64)]));
        }
        let points = ring.points();
        assert_eq!(points.len(), 3);
        assert_eq!(points[0].end, at(20), "the oldest intervals went first");
        ring.sample(at(35), totals(&[("ledger", 7)]));
        assert_eq!(ring.points().last().map(|p| p.counts["ledger"]), Some(7));
    }

    #[test]
    fn totals_count_records_per_pipeline_and_accepted_transfers() {
        let metrics = Metrics::new().expect("metrics");
        metrics.records_total.with_label_values(&["ledger", "settled"]).inc_by(3);
        metrics.records_total.with_label_values(&["ledger", "rejected"]).inc_by(2);
        metrics.http_requests_total.with_label_values(&["/transfers", "201"]).inc_by(4);
        metrics.http_requests_total.with_label_values(&["/transfers", "422"]).inc_by(9);
        metrics.http_requests_total.with_label_values(&["/transfers/{id}", "200"]).inc_by(9);
        assert_eq!(super::totals(&metrics), totals(&[("ledger", 5), ("intake", 4)]));
    }
}
