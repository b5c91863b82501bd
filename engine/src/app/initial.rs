//! The series a dashboard panel or an alert reads, published at start for every label set
//! known from the configuration: a counter that first appears at 1 is missed by
//! `increase()`, so the first dead letter, refusal or failed delivery after a start would
//! never be alerted on. The pipelines publish their own (see
//! `tally_actors::consume::publish_initial`).

use tally_actors::store::invariants::INVARIANTS;
use tally_actors::{outbox, Metrics};

use crate::config::Config;

/// HTTP statuses that alerts count by route, at 0 from the start for the intake's routes.
const ALERTED_STATUSES: [&str; 2] = ["500", "503"];

/// The intake routes (as `http_requests_total` names them) that take writes.
const INTAKE_WRITES: [&str; 3] = ["/transfers", "/accounts", "/orders"];

/// Publishes, at 0, the series of every label set the configuration makes known.
pub(super) fn publish(config: &Config, metrics: &Metrics, dlt_topics: impl Iterator<Item = String>) {
    let topics = &config.kafka.topics;
    if config.pipelines.runs(crate::config::OUTBOX) {
        for topic in [
            &topics.transfers_requested,
            &topics.transfers_settled,
            &topics.transfers_rejected,
            &topics.orders_received,
        ] {
            for refusal in outbox::Refusal::ALL {
                metrics.outbox_refused_total.with_label_values(&[topic, refusal.code()]).inc_by(0);
            }
        }
    }
    for dlt in dlt_topics {
        metrics.dlt_records_total.with_label_values(&[&dlt]).inc_by(0);
        metrics.dlt_replayed_total.with_label_values(&[&dlt]).inc_by(0);
    }
    metrics.dlt_replayed_total.with_label_values(&[tally_actors::dlt::table::NAME]).inc_by(0);
    // Without a webhook nothing is delivered: 0 deliveries, not an unknown.
    for outcome in tally_actors::notify::OUTCOMES {
        metrics.notification_deliveries_total.with_label_values(&[outcome]).inc_by(0);
    }
    let delays = config.notifications.delays_ms();
    for source in [&topics.transfers_settled, &topics.transfers_rejected] {
        for (i, delay) in delays.iter().enumerate() {
            // A record on the n-th retry topic carries attempt n + 1.
            let attempt = (i + 2).to_string();
            metrics
                .retry_records_total
                .with_label_values(&[&tally_schema::topics::retry(source, *delay), &attempt])
                .inc_by(0);
        }
    }
    // Not checked yet since the start: neither holding (1) nor failing (0).
    for invariant in INVARIANTS {
        metrics.ledger_invariant_ok.with_label_values(&[invariant]).set(-1);
    }
    for route in INTAKE_WRITES {
        for status in ALERTED_STATUSES {
            metrics.http_requests_total.with_label_values(&[route, status]).inc_by(0);
        }
        metrics.http_request_seconds.with_label_values(&[route]);
    }
}
