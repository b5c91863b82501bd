//! Prometheus metrics: one non-global registry, names `tally_<thing>_<unit>`, help text on
//! every family. Each family is declared once, in the `metrics!` list below: its field,
//! its name (the field's), its help, its labels and its buckets.

use prometheus::core::Collector;
use prometheus::{
    Encoder, Gauge, GaugeVec, Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge, IntGaugeVec,
    Opts, Registry, TextEncoder,
};

const LATENCY_BUCKETS: &[f64] =
    &[0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0];

/// A metric family made from its declaration.
trait Family: Collector + Clone + Sized + 'static {
    fn build(name: &str, help: &str, labels: &[&str], buckets: &[f64]) -> Result<Self, prometheus::Error>;
}

macro_rules! scalar_family {
    ($($ty:ty),*) => {$(
        impl Family for $ty {
            fn build(name: &str, help: &str, _: &[&str], _: &[f64]) -> Result<Self, prometheus::Error> {
                <$ty>::new(name, help)
            }
        }
    )*};
}
scalar_family!(IntGauge, Gauge, IntCounter);

macro_rules! vec_family {
    ($($ty:ty),*) => {$(
        impl Family for $ty {
            fn build(name: &str, help: &str, labels: &[&str], _: &[f64]) -> Result<Self, prometheus::Error> {
                <$ty>::new(Opts::new(name, help), labels)
            }
        }
    )*};
}
vec_family!(IntGaugeVec, GaugeVec, IntCounterVec);

impl Family for Histogram {
    fn build(name: &str, help: &str, _: &[&str], buckets: &[f64]) -> Result<Self, prometheus::Error> {
        Histogram::with_opts(HistogramOpts::new(name, help).buckets(buckets.to_vec()))
    }
}

impl Family for HistogramVec {
    fn build(name: &str, help: &str, labels: &[&str], buckets: &[f64]) -> Result<Self, prometheus::Error> {
        HistogramVec::new(HistogramOpts::new(name, help).buckets(buckets.to_vec()), labels)
    }
}

/// Declares [`Metrics`]: one line per family, `field: Type = "help" [, labels [..]]
/// [, buckets ..];`. The family's name is the field's, under the `tally_` prefix.
macro_rules! metrics {
    ($($name:ident: $ty:ty = $help:literal $(, labels [$($label:literal),*])? $(, buckets $buckets:expr)?;)*) => {
        /// Every metric family of the daemon, registered in [`Metrics::registry`].
        #[derive(Clone)]
        pub struct Metrics {
            registry: Registry,
            /// Process metrics (`process_cpu_seconds_total`, ...), unprefixed by convention.
            process: Registry,
            $(#[doc = $help] pub $name: $ty,)*
        }

        impl Metrics {
            /// Creates every family and registers it, with process metrics where supported.
            ///
            /// # Errors
            /// When a family cannot be registered (a duplicate name: a programming error).
            pub fn new() -> Result<Self, prometheus::Error> {
                let registry = Registry::new_custom(Some("tally".into()), None)?;
                $(
                    let buckets: &[f64] = metrics!(@buckets $($buckets)?);
                    let $name = <$ty as Family>::build(stringify!($name), $help, &[$($($label),*)?], buckets)?;
                    registry.register(Box::new($name.clone()))?;
                )*
                let process = Registry::new();
                #[cfg(target_os = "linux")]
                process.register(Box::new(prometheus::process_collector::ProcessCollector::for_self()))?;
                Ok(Self { registry, process, $($name),* })
            }
        }
    };
    (@buckets) => { &[] };
    (@buckets $buckets:expr) => { $buckets };
}

metrics! {
    outbox_pending: IntGauge = "Outbox rows not yet published.";
    outbox_oldest_pending_age_seconds: Gauge = "Age of the oldest unpublished outbox row, in seconds (0 when none).";
    outbox_pending_by_topic: GaugeVec = "Outbox rows not yet published, per topic.", labels ["topic"];
    outbox_published_total: IntCounter = "Outbox rows published to Kafka and marked published.";
    outbox_parked_rows: IntGauge = "Outbox rows the broker refused for good (too large, topic not authorised or unknown), kept \
                     unpublished and tried again on a slow backoff; GET /admin/outbox lists them.";
    outbox_held_rows: IntGauge = "Outbox rows waiting behind a parked row of their topic and key.";
    outbox_refused_total: IntCounterVec = "Outbox records the broker refused for good, each attempt counted, by topic and reason \
                     (message_too_large, topic_authorization_failed, unknown_topic, invalid_record).", labels ["topic", "reason"];
    outbox_publish_failures_total: IntCounter = "Outbox batches that failed and were rolled back for a later retry.";
    outbox_claims_total: IntCounterVec = "Claims of the outbox publish loops that ended without an error, by what they found: rows, \
                     nothing, or held (every shard held by other loops). Each is a database transaction.", labels ["found"];
    outbox_batch_seconds: Histogram = "Time to claim, publish and mark one outbox batch.", buckets LATENCY_BUCKETS;
    outbox_commit_to_ack_seconds: Histogram = "Time from an outbox row's creation to the broker's acknowledgement of its record.", buckets LATENCY_BUCKETS;
    outbox_deleted_total: IntCounter = "Published outbox rows deleted after the retention period.";
    http_requests_total: IntCounterVec = "HTTP requests served, by route and status.", labels ["route", "status"];
    http_auth_failures_total: IntCounterVec = "Presented client or admin credentials that named no one, by listener.", labels ["listener"];
    http_auth_refused_total: IntCounterVec = "Requests refused unread while their address waits after failed authentication, by listener.", labels ["listener"];
    http_connections_refused_total: IntCounterVec = "Connections closed at once: their address held http.max_connections_per_address, by listener.", labels ["listener"];
    http_request_seconds: HistogramVec = "HTTP request latency, by route.", labels ["route"], buckets LATENCY_BUCKETS;
    records_total: IntCounterVec = "Records completed, by pipeline and outcome (e.g. settled, rejected, duplicate, dead_lettered).", labels ["pipeline", "outcome"];
    retries_total: IntCounterVec = "Blocking retries after transient errors, by pipeline.", labels ["pipeline"];
    dlt_records_total: IntCounterVec = "Records written to a dead-letter topic, by DLT topic.", labels ["topic"];
    dlt_topic_records: IntGaugeVec = "Records present in a dead-letter topic (high minus low watermark, summed over partitions), \
                     refreshed by GET /admin/dlt and GET /metrics.", labels ["topic"];
    dlt_replayed_total: IntCounterVec = "Dead-letter records republished to their original topic and acknowledged, by DLT topic.", labels ["topic"];
    dlt_fallback_records_total: IntCounterVec = "Records a dead-letter topic could never take (too large, topic or partition missing, \
                     forbidden), stored in the dead_letters table instead, by DLT topic.", labels ["topic"];
    stage_restarts_total: IntCounterVec = "Restarts of a stage after a panic in its thread (it starts again from its committed offsets), by stage.", labels ["stage"];
    pipeline_paused: IntGaugeVec = "1 while a pipeline is paused through the admin API, 0 otherwise.", labels ["pipeline"];
    partition_holds_total: IntCounterVec = "Times a partition stopped fetching because the records in hand reached their bound \
                     (its queue and stash full, its uncommitted window full, or its next record not yet due), by pipeline; \
                     each drops what librdkafka had prefetched for it.", labels ["pipeline"];
    pipeline_degraded: IntGaugeVec = "1 while a pipeline waits for an unavailable dependency (database or broker down) with its \
                     partitions paused, 0 otherwise.", labels ["pipeline"];
    dependency_waits_total: IntCounterVec = "Handler attempts that found a dependency unavailable; they cost no record any retry, by pipeline.", labels ["pipeline"];
    consumer_lag: IntGaugeVec = "Records between the committed offset and the end of the partition (0 from its assignment until \
                     librdkafka's first statistics of it).", labels ["pipeline", "partition"];
    inflight: IntGaugeVec = "Records received and not yet below the committed watermark, per partition.", labels ["pipeline", "partition"];
    live_actors: IntGaugeVec = "Live keyed worker actors (the ledger: one per source account), by pipeline.", labels ["pipeline"];
    oldest_inflight_age_seconds: GaugeVec = "Age of the oldest unfinished record, by pipeline (a key stuck in retry shows here).", labels ["pipeline"];
    handler_seconds: HistogramVec = "Time to handle one record, retries included, by pipeline.", labels ["pipeline"], buckets LATENCY_BUCKETS;
    group_commit_batch_size: HistogramVec = "Items written per transaction of a group commit, by writes (intake, projection, \
                     notifications_seen, notifications_delivered): transactions that committed, split halves included.", labels ["writes"], buckets &[1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0];
    group_commit_refused_total: IntCounterVec = "Items a group commit answered without writing them, by writes and reason (no_connection, \
                     overloaded: waited past the database connect timeout, stopped, broken: its write panicked).", labels ["writes", "reason"];
    settlement_batch_size: Histogram = "Transfers settled per ledger database transaction.", buckets &[1.0, 2.0, 5.0, 10.0, 25.0, 50.0, 100.0, 200.0, 500.0];
    kafka_transactions_total: IntCounterVec = "Kafka transaction events, by outcome: committed, failed (an attempt that did not commit), \
                     aborted (by the stage), retried (a retriable call made again), producer_renewed (re-created \
                     after a fatal error, a failed abort or a wedged call), producer_wedged (a call that never came \
                     back: the producer is given up, once no other given up is still stuck).", labels ["outcome"];
    kafka_producers_abandoned: IntGauge = "Transactional producers given up as wedged whose blocked call has not returned yet \
                     (at most one): it still holds a librdkafka client (threads, connections) until it does.";
    rebalances_total: IntCounterVec = "Consumer group rebalance events seen by a pipeline, by event (assigned, revoked).", labels ["pipeline", "event"];
    rebalance_partitions_total: IntCounterVec = "Partitions a pipeline was given or gave up in rebalances, by event (assigned, revoked): \
                     with cooperative assignment only the partitions that move are counted.", labels ["pipeline", "event"];
    antifraud_score: Histogram = "Risk scores given by the antifraud stage.", buckets &[10.0, 20.0, 30.0, 40.0, 50.0, 60.0, 70.0, 80.0, 90.0, 100.0];
    notification_deliveries_total: IntCounterVec = "Webhook deliveries, by outcome (delivered, failed, already_delivered, dead_lettered).", labels ["outcome"];
    retry_records_total: IntCounterVec = "Records written to a retry topic, by topic and the attempt they carry.", labels ["topic", "attempt"];
    ledger_check_success_timestamp_seconds: Gauge = "Unix time of the last periodic ledger check that ran (whatever it found).";
    ledger_invariant_ok: IntGaugeVec = "1 when the ledger invariant held at the last check, 0 when it did not, -1 before the first check since the start.", labels ["invariant"];
    db_pool_connections: IntGaugeVec = "Open connections of a stage's database pool, by pool and state (in_use, idle), refreshed by GET /metrics.", labels ["pool", "state"];
    db_pool_max_connections: IntGaugeVec = "The most connections a stage's database pool opens (its size in database.pools).", labels ["pool"];
    db_pool_waiting: IntGaugeVec = "Tasks waiting for a connection of a stage's database pool, refreshed by GET /metrics.", labels ["pool"];
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Metrics")
    }
}

impl Metrics {
    #[must_use]
    pub fn registry(&self) -> &Registry {
        &self.registry
    }

    /// The Prometheus text exposition of every family, process metrics included.
    #[must_use]
    pub fn render(&self) -> String {
        let mut families = self.registry.gather();
        families.extend(self.process.gather());
        let mut out = Vec::new();
        if TextEncoder::new().encode(&families, &mut out).is_err() {
            return String::new();
        }
        String::from_utf8(out).unwrap_or_default()
    }
}
