//! Prometheus metrics: one non-global registry, names `tally_<thing>_<unit>`, help text on
//! every family.

use prometheus::{
    Encoder, Gauge, GaugeVec, Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge, IntGaugeVec,
    Opts, Registry, TextEncoder,
};

/// Every metric family of the daemon, registered in [`Metrics::registry`].
#[derive(Clone)]
pub struct Metrics {
    registry: Registry,
    /// Process metrics (`process_cpu_seconds_total`, ...), unprefixed by convention.
    process: Registry,
    pub outbox_pending: IntGauge,
    pub outbox_oldest_pending_age_seconds: Gauge,
    pub outbox_pending_by_topic: GaugeVec,
    pub outbox_published_total: IntCounter,
    pub outbox_publish_failures_total: IntCounter,
    pub outbox_batch_seconds: Histogram,
    pub outbox_commit_to_ack_seconds: Histogram,
    pub outbox_deleted_total: IntCounter,
    pub http_requests_total: IntCounterVec,
    pub http_request_seconds: HistogramVec,
    pub records_total: IntCounterVec,
    pub retries_total: IntCounterVec,
    pub dlt_records_total: IntCounterVec,
    pub dlt_topic_records: IntGaugeVec,
    pub dlt_replayed_total: IntCounterVec,
    pub dlt_fallback_records_total: IntCounterVec,
    pub pipeline_degraded: IntGaugeVec,
    pub dependency_waits_total: IntCounterVec,
    pub consumer_lag: IntGaugeVec,
    pub inflight: IntGaugeVec,
    pub live_actors: IntGaugeVec,
    pub oldest_inflight_age_seconds: GaugeVec,
    pub handler_seconds: HistogramVec,
    pub settlement_batch_size: Histogram,
    pub kafka_transactions_total: IntCounterVec,
    pub rebalances_total: IntCounterVec,
    pub antifraud_score: Histogram,
    pub notification_deliveries_total: IntCounterVec,
    pub retry_records_total: IntCounterVec,
    pub ledger_invariant_ok: IntGaugeVec,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Metrics")
    }
}

const LATENCY_BUCKETS: &[f64] =
    &[0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0];

impl Metrics {
    /// Creates every family and registers it, with process metrics where supported.
    ///
    /// # Errors
    /// When a family cannot be registered (a duplicate name: a programming error).
    pub fn new() -> Result<Self, prometheus::Error> {
        let registry = Registry::new_custom(Some("tally".into()), None)?;
        let m = Self {
            outbox_pending: IntGauge::new("outbox_pending", "Outbox rows not yet published.")?,
            outbox_oldest_pending_age_seconds: Gauge::new(
                "outbox_oldest_pending_age_seconds",
                "Age of the oldest unpublished outbox row, in seconds (0 when none).",
            )?,
            outbox_pending_by_topic: GaugeVec::new(
                Opts::new("outbox_pending_by_topic", "Outbox rows not yet published, per topic."),
                &["topic"],
            )?,
            outbox_published_total: IntCounter::new(
                "outbox_published_total",
                "Outbox rows published to Kafka and marked published.",
            )?,
            outbox_publish_failures_total: IntCounter::new(
                "outbox_publish_failures_total",
                "Outbox batches that failed and were rolled back for a later retry.",
            )?,
            outbox_batch_seconds: Histogram::with_opts(
                HistogramOpts::new("outbox_batch_seconds", "Time to claim, publish and mark one outbox batch.")
                    .buckets(LATENCY_BUCKETS.to_vec()),
            )?,
            outbox_commit_to_ack_seconds: Histogram::with_opts(
                HistogramOpts::new(
                    "outbox_commit_to_ack_seconds",
                    "Time from an outbox row's creation to the broker's acknowledgement of its record.",
                )
                .buckets(LATENCY_BUCKETS.to_vec()),
            )?,
            outbox_deleted_total: IntCounter::new(
                "outbox_deleted_total",
                "Published outbox rows deleted after the retention period.",
            )?,
            http_requests_total: IntCounterVec::new(
                Opts::new("http_requests_total", "HTTP requests served, by route and status."),
                &["route", "status"],
            )?,
            http_request_seconds: HistogramVec::new(
                HistogramOpts::new("http_request_seconds", "HTTP request latency, by route.")
                    .buckets(LATENCY_BUCKETS.to_vec()),
                &["route"],
            )?,
            records_total: IntCounterVec::new(
                Opts::new(
                    "records_total",
                    "Records completed, by pipeline and outcome (e.g. settled, rejected, duplicate, dead_lettered).",
                ),
                &["pipeline", "outcome"],
            )?,
            retries_total: IntCounterVec::new(
                Opts::new("retries_total", "Blocking retries after transient errors, by pipeline."),
                &["pipeline"],
            )?,
            dlt_records_total: IntCounterVec::new(
                Opts::new("dlt_records_total", "Records written to a dead-letter topic, by DLT topic."),
                &["topic"],
            )?,
            dlt_topic_records: IntGaugeVec::new(
                Opts::new(
                    "dlt_topic_records",
                    "Records present in a dead-letter topic (high minus low watermark, summed over partitions), \
                     refreshed by GET /admin/dlt and GET /metrics.",
                ),
                &["topic"],
            )?,
            dlt_replayed_total: IntCounterVec::new(
                Opts::new(
                    "dlt_replayed_total",
                    "Dead-letter records republished to their original topic and acknowledged, by DLT topic.",
                ),
                &["topic"],
            )?,
            dlt_fallback_records_total: IntCounterVec::new(
                Opts::new(
                    "dlt_fallback_records_total",
                    "Records a dead-letter topic could never take (too large, topic or partition missing, \
                     forbidden), stored in the dead_letters table instead, by DLT topic.",
                ),
                &["topic"],
            )?,
            pipeline_degraded: IntGaugeVec::new(
                Opts::new(
                    "pipeline_degraded",
                    "1 while a pipeline waits for an unavailable dependency (database or broker down) with its \
                     partitions paused, 0 otherwise.",
                ),
                &["pipeline"],
            )?,
            dependency_waits_total: IntCounterVec::new(
                Opts::new(
                    "dependency_waits_total",
                    "Handler attempts that found a dependency unavailable; they cost no record any retry, by pipeline.",
                ),
                &["pipeline"],
            )?,
            consumer_lag: IntGaugeVec::new(
                Opts::new("consumer_lag", "Records between the committed offset and the end of the partition."),
                &["pipeline", "partition"],
            )?,
            inflight: IntGaugeVec::new(
                Opts::new("inflight", "Records received and not yet below the committed watermark, per partition."),
                &["pipeline", "partition"],
            )?,
            live_actors: IntGaugeVec::new(
                Opts::new("live_actors", "Live keyed worker actors (e.g. account ledgers), by pipeline."),
                &["pipeline"],
            )?,
            oldest_inflight_age_seconds: GaugeVec::new(
                Opts::new(
                    "oldest_inflight_age_seconds",
                    "Age of the oldest unfinished record, by pipeline (a key stuck in retry shows here).",
                ),
                &["pipeline"],
            )?,
            handler_seconds: HistogramVec::new(
                HistogramOpts::new("handler_seconds", "Time to handle one record, retries included, by pipeline.")
                    .buckets(LATENCY_BUCKETS.to_vec()),
                &["pipeline"],
            )?,
            settlement_batch_size: Histogram::with_opts(
                HistogramOpts::new("settlement_batch_size", "Transfers settled per ledger database transaction.")
                    .buckets(vec![1.0, 2.0, 5.0, 10.0, 25.0, 50.0, 100.0, 200.0, 500.0]),
            )?,
            kafka_transactions_total: IntCounterVec::new(
                Opts::new(
                    "kafka_transactions_total",
                    "Kafka transaction events, by outcome: committed, failed (an attempt that did not commit), \
                     aborted (by the stage), retried (a retriable call made again), producer_renewed (re-created \
                     after a fatal error or a failed abort).",
                ),
                &["outcome"],
            )?,
            rebalances_total: IntCounterVec::new(
                Opts::new(
                    "rebalances_total",
                    "Consumer group rebalance events seen by a pipeline, by event (assigned, revoked).",
                ),
                &["pipeline", "event"],
            )?,
            antifraud_score: Histogram::with_opts(
                HistogramOpts::new("antifraud_score", "Risk scores given by the antifraud stage.")
                    .buckets(vec![10.0, 20.0, 30.0, 40.0, 50.0, 60.0, 70.0, 80.0, 90.0, 100.0]),
            )?,
            notification_deliveries_total: IntCounterVec::new(
                Opts::new(
                    "notification_deliveries_total",
                    "Webhook deliveries, by outcome (delivered, failed, already_delivered, dead_lettered).",
                ),
                &["outcome"],
            )?,
            retry_records_total: IntCounterVec::new(
                Opts::new(
                    "retry_records_total",
                    "Records written to a retry topic, by topic and the attempt they carry.",
                ),
                &["topic", "attempt"],
            )?,
            ledger_invariant_ok: IntGaugeVec::new(
                Opts::new("ledger_invariant_ok", "1 when the ledger invariant held at the last check, 0 otherwise."),
                &["invariant"],
            )?,
            registry,
            process: Registry::new(),
        };
        m.registry.register(Box::new(m.outbox_pending.clone()))?;
        m.registry.register(Box::new(m.outbox_oldest_pending_age_seconds.clone()))?;
        m.registry.register(Box::new(m.outbox_pending_by_topic.clone()))?;
        m.registry.register(Box::new(m.outbox_published_total.clone()))?;
        m.registry.register(Box::new(m.outbox_publish_failures_total.clone()))?;
        m.registry.register(Box::new(m.outbox_batch_seconds.clone()))?;
        m.registry.register(Box::new(m.outbox_commit_to_ack_seconds.clone()))?;
        m.registry.register(Box::new(m.outbox_deleted_total.clone()))?;
        m.registry.register(Box::new(m.http_requests_total.clone()))?;
        m.registry.register(Box::new(m.http_request_seconds.clone()))?;
        m.registry.register(Box::new(m.records_total.clone()))?;
        m.registry.register(Box::new(m.retries_total.clone()))?;
        m.registry.register(Box::new(m.dlt_records_total.clone()))?;
        m.registry.register(Box::new(m.dlt_topic_records.clone()))?;
        m.registry.register(Box::new(m.dlt_replayed_total.clone()))?;
        m.registry.register(Box::new(m.dlt_fallback_records_total.clone()))?;
        m.registry.register(Box::new(m.pipeline_degraded.clone()))?;
        m.registry.register(Box::new(m.dependency_waits_total.clone()))?;
        m.registry.register(Box::new(m.consumer_lag.clone()))?;
        m.registry.register(Box::new(m.inflight.clone()))?;
        m.registry.register(Box::new(m.live_actors.clone()))?;
        m.registry.register(Box::new(m.oldest_inflight_age_seconds.clone()))?;
        m.registry.register(Box::new(m.handler_seconds.clone()))?;
        m.registry.register(Box::new(m.settlement_batch_size.clone()))?;
        m.registry.register(Box::new(m.ledger_invariant_ok.clone()))?;
        m.registry.register(Box::new(m.kafka_transactions_total.clone()))?;
        m.registry.register(Box::new(m.rebalances_total.clone()))?;
        m.registry.register(Box::new(m.antifraud_score.clone()))?;
        m.registry.register(Box::new(m.notification_deliveries_total.clone()))?;
        m.registry.register(Box::new(m.retry_records_total.clone()))?;
        #[cfg(target_os = "linux")]
        m.process.register(Box::new(prometheus::process_collector::ProcessCollector::for_self()))?;
        Ok(m)
    }

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
