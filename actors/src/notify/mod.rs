//! Notifications: `transfers.settled` and `transfers.rejected` are delivered
//! to a webhook, signed, with non-blocking retry topics.
//!
//! Each event is POSTed as its JSON with `X-Tally-Event-Id` and
//! `X-Tally-Signature: sha256=<hex of HMAC-SHA256(secret, body)>`. A delivery is recorded by
//! event id, so a retry never sends again after a success (a crash between the receiver's
//! 2xx and the record can still send twice: receivers dedupe on `X-Tally-Event-Id`).
//!
//! A failed attempt does not hold anything up: the record moves to
//! `<topic>-retry-<delay_ms>` with its attempt count, original coordinates and due time,
//! and the consumer of that retry topic holds the partition until the record is due. After
//! the last attempt the record goes to `<topic>-dlt` as `exhausted`.
//!
//! The POST and the retry-topic write each check the record's lease right before they
//! happen: once its partition is revoked, this instance sends and schedules nothing more
//! for it.

mod writes;

use std::sync::Arc;
use std::time::Duration;

use chrono::Utc;
use futures_util::future::BoxFuture;
use hmac::{Hmac, Mac};
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::util::Timeout;
use serde::Deserialize;
use sha2::Sha256;
use tally_schema::{headers, topics};
use tracing::field::display;
use tracing::{debug, warn};
use uuid::Uuid;

use crate::backoff::Backoff;
use crate::metrics::Metrics;
use crate::record::{Lease, Record};
use crate::store::notifications::Delivery;
use crate::store::PgPool;
use crate::supervise::{DeadLetters, HandlerError, RecordHandler};
use crate::trace;

/// Where and how to deliver.
#[derive(Debug, Clone)]
pub struct NotifierSettings {
    pub webhook_url: String,
    pub secret: String,
    /// PEM root certificates an `https://` receiver's certificate must chain to, instead of
    /// the system's.
    pub root_certs: Option<Vec<u8>>,
    pub timeout: Duration,
    /// Delay before each retry, in order (attempt 2 waits `delays[0]`, ...).
    pub delays_ms: Vec<u64>,
    /// Longest a database call waits to be taken by its writer (the connect timeout).
    pub database_wait: Duration,
    /// The topic of `TransferSettled` events (the other source carries rejections).
    pub settled_topic: String,
}

impl NotifierSettings {
    /// Attempts in all: the first plus one per retry topic.
    #[must_use]
    pub fn max_attempts(&self) -> u32 {
        u32::try_from(self.delays_ms.len()).unwrap_or(u32::MAX).saturating_add(1)
    }
}

/// The retry delays in milliseconds (they name the retry topics): the first
/// `max_attempts - 1` waits of `curve` (1 s, x2, max 30 s, 4 attempts: 1000, 2000, 4000).
#[must_use]
pub fn retry_delays(curve: Backoff, max_attempts: u32) -> Vec<u64> {
    (0..max_attempts.saturating_sub(1)).map(|i| curve.nth_millis(i)).collect()
}

/// `sha256=<hex>` of HMAC-SHA256(`secret`, `body`).
#[must_use]
pub fn signature(secret: &str, body: &[u8]) -> String {
    // HMAC accepts keys of any length, so this never takes the else branch.
    let Ok(mut mac) = <Hmac<Sha256> as Mac>::new_from_slice(secret.as_bytes()) else {
        return String::new();
    };
    mac.update(body);
    format!("sha256={}", hex::encode(mac.finalize().into_bytes()))
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct EventIds {
    event_id: Uuid,
    transfer_id: Uuid,
}

pub struct Notifier {
    writes: writes::Writes,
    http: reqwest::Client,
    producer: FutureProducer,
    dead_letters: DeadLetters,
    metrics: Metrics,
    settings: NotifierSettings,
}

impl Notifier {
    /// Starts the group commits of its database calls over `pool` (on the current actix
    /// system).
    ///
    /// # Errors
    /// When the HTTP client cannot be built (or `root_certs` is not PEM).
    pub fn new(
        pool: PgPool,
        producer: FutureProducer,
        dead_letters: DeadLetters,
        metrics: Metrics,
        settings: NotifierSettings,
    ) -> Result<Self, reqwest::Error> {
        // No redirects: a 307/308 would POST the signed body again, possibly to another
        // host or over plain http.
        let mut http = reqwest::Client::builder().timeout(settings.timeout).redirect(reqwest::redirect::Policy::none());
        if let Some(pem) = &settings.root_certs {
            http = http.tls_built_in_root_certs(false);
            for root in reqwest::Certificate::from_pem_bundle(pem)? {
                http = http.add_root_certificate(root);
            }
        }
        let http = http.build()?;
        let writes = writes::Writes::start(&pool, &metrics, settings.database_wait);
        Ok(Self { writes, http, producer, dead_letters, metrics, settings })
    }
}

/// Every outcome `tally_notification_deliveries_total` counts.
pub const OUTCOMES: [&str; 4] = ["delivered", "failed", "already_delivered", "dead_lettered"];

impl RecordHandler for Notifier {
    /// Delivers (or schedules a retry, or dead-letters) inside the record's
    /// `notify.deliver` span; each attempt has its own.
    fn handle(&self, record: Arc<Record>) -> BoxFuture<'static, Result<&'static str, HandlerError>> {
        let (writes, http, producer) = (self.writes.clone(), self.http.clone(), self.producer.clone());
        let (settings, metrics) = (self.settings.clone(), self.metrics.clone());
        let dead_letters = self.dead_letters.clone();
        let span = trace::hop_span!("notify.deliver", &record);
        trace::join(&span, record.traceparent());
        let hop = span.clone();
        trace::handled(span, async move {
            let body = record.payload.as_deref().ok_or_else(|| HandlerError::poison("record has no value"))?;
            let ids: EventIds = serde_json::from_slice(body)
                .map_err(|e| HandlerError::poison(format!("undecodable transfer event: {e}")))?;
            hop.record("transfer.id", display(ids.transfer_id));
            let origin = record.origin();
            let change = crate::projection::decode_change(body, origin.topic == settings.settled_topic)?;
            // What the receiver gets is the event as tally wrote it, not the record's bytes.
            let body = change.canonical.clone();
            let attempt = record
                .header_str(headers::RETRY_ATTEMPTS)
                .and_then(|v| v.parse::<u32>().ok())
                .unwrap_or(0)
                .saturating_add(1);
            match writes.seen.submit(writes::Check { event_id: ids.event_id, change }).await? {
                writes::Seen::Delivered => {
                    metrics.notification_deliveries_total.with_label_values(&["already_delivered"]).inc();
                    return Ok("already_delivered");
                }
                // An outcome no stage decided: no one is told of it.
                writes::Seen::Refused(reason) => return Err(HandlerError::poison(reason)),
                writes::Seen::Due => {}
            }
            still_ours("the webhook POST")?;
            let failure = match post(&http, &settings, &record, ids.event_id, &body, attempt).await {
                Ok(status) => {
                    // Recorded even when the lease ended meanwhile: the receiver has the
                    // event, and the record keeps the partition's new owner from sending it
                    // again.
                    let delivery = Delivery {
                        event_id: ids.event_id,
                        topic: origin.topic.clone(),
                        transfer_id: ids.transfer_id,
                        attempt,
                        response_status: status,
                    };
                    writes.delivered.submit(delivery).await?;
                    metrics.notification_deliveries_total.with_label_values(&["delivered"]).inc();
                    debug!(event_id = %ids.event_id, attempt, "Notification delivered.");
                    return Ok("delivered");
                }
                Err(failure) => failure,
            };
            metrics.notification_deliveries_total.with_label_values(&["failed"]).inc();
            if attempt >= settings.max_attempts() {
                warn!(event_id = %ids.event_id, attempt, error = %failure, "Notification failed on its last attempt.");
                dead_letters
                    .publish(&record, headers::dlt_kind::EXHAUSTED, &failure, attempt)
                    .await
                    .map_err(|e| HandlerError::transient(e.to_string()))?;
                metrics.notification_deliveries_total.with_label_values(&["dead_lettered"]).inc();
                return Ok("dead_lettered");
            }
            let delay = settings.delays_ms[(attempt - 1) as usize];
            let retry_topic = topics::retry(&origin.topic, delay);
            still_ours("the retry-topic write")?;
            warn!(event_id = %ids.event_id, attempt, retry_topic, error = %failure, "Notification failed; scheduled a retry.");
            schedule_retry(&producer, &record, &retry_topic, attempt, delay, &failure).await?;
            metrics.retry_records_total.with_label_values(&[&retry_topic, &(attempt + 1).to_string()]).inc();
            Ok("retry_scheduled")
        })
    }
}

/// Checks the record's lease right before a side effect (the supervisor checks it before
/// each attempt; an attempt can wait long on the database or the receiver). After the
/// partition was revoked nothing more happens for the record here: the error ends it
/// uncommitted (an ending lease never waits for a dependency), and the partition's new
/// owner delivers it.
fn still_ours(step: &str) -> Result<(), HandlerError> {
    if Lease::current_is_live() {
        Ok(())
    } else {
        Err(HandlerError::unavailable(format!("the partition was revoked before {step}")))
    }
}

/// POSTs the event; `Ok(status)` for a 2xx answer, `Err(reason)` otherwise.
async fn post(
    http: &reqwest::Client,
    settings: &NotifierSettings,
    record: &Record,
    event_id: Uuid,
    body: &[u8],
    attempt: u32,
) -> Result<u16, String> {
    let event_type = record.header_str(headers::EVENT_TYPE).unwrap_or("");
    let response = http
        .post(&settings.webhook_url)
        .header(reqwest::header::CONTENT_TYPE, "application/json")
        .header("X-Tally-Event-Id", event_id.to_string())
        .header("X-Tally-Event-Type", event_type)
        .header("X-Tally-Attempt", attempt.to_string())
        .header("X-Tally-Signature", signature(&settings.secret, body))
        .body(body.to_vec())
        .send()
        .await
        .map_err(send_failure)?;
    let status = response.status();
    if status.is_success() {
        Ok(status.as_u16())
    } else {
        Err(format!("webhook answered HTTP {}", status.as_u16()))
    }
}

/// Why a POST got no answer, with its causes: the message goes to the log, to the retry
/// topic's `retry-last-error` header and to the dead letter, so it leaves out the URL,
/// whose query may carry a credential (reqwest names it in its errors).
fn send_failure(e: reqwest::Error) -> String {
    let e = e.without_url();
    let mut message = format!("webhook request failed: {e}");
    let mut cause = std::error::Error::source(&e);
    while let Some(c) = cause {
        message.push_str(&format!(": {c}"));
        cause = c.source();
    }
    message
}

async fn schedule_retry(
    producer: &FutureProducer,
    record: &Record,
    retry_topic: &str,
    attempt: u32,
    delay_ms: u64,
    failure: &str,
) -> Result<(), HandlerError> {
    let origin = record.origin();
    let mut hdrs = OwnedHeaders::new_with_capacity(record.headers.len() + 7);
    for (k, v) in record.headers_without_retry() {
        hdrs = hdrs.insert(Header { key: k, value: v.as_deref() });
    }
    let due = Utc::now().timestamp_millis() + i64::try_from(delay_ms).unwrap_or(i64::MAX);
    let values = [
        (headers::RETRY_ATTEMPTS, attempt.to_string()),
        (headers::RETRY_ORIGINAL_TOPIC, origin.topic.clone()),
        (headers::RETRY_ORIGINAL_PARTITION, origin.partition.to_string()),
        (headers::RETRY_ORIGINAL_OFFSET, origin.offset.to_string()),
        (headers::RETRY_ORIGINAL_TIMESTAMP, origin.timestamp.map(|t| t.to_string()).unwrap_or_default()),
        (headers::RETRY_DUE_AT, due.to_string()),
        (headers::RETRY_LAST_ERROR, failure.chars().take(512).collect()),
    ];
    for (k, v) in &values {
        hdrs = hdrs.insert(Header { key: k, value: Some(v.as_bytes()) });
    }
    let mut out: FutureRecord<'_, [u8], [u8]> = FutureRecord::to(retry_topic).headers(hdrs);
    if let Some(key) = &record.key {
        out = out.key(key.as_slice());
    }
    if let Some(payload) = &record.payload {
        out = out.payload(payload.as_slice());
    }
    producer
        .send(out, Timeout::After(Duration::from_secs(30)))
        .await
        .map(|_| ())
        .map_err(|(e, _)| HandlerError::transient(format!("cannot write to {retry_topic}: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_retry_delays() {
        let curve = |max| Backoff { initial: Duration::from_secs(1), multiplier: 2.0, max: Duration::from_millis(max) };
        assert_eq!(retry_delays(curve(30_000), 4), vec![1_000, 2_000, 4_000]);
        assert_eq!(retry_delays(curve(3_000), 4), vec![1_000, 2_000, 3_000]);
        assert!(retry_delays(curve(30_000), 1).is_empty());
        // The delays name topics: computed in whole milliseconds and truncated, as always.
        let inexact = Backoff { initial: Duration::from_secs(1), multiplier: 1.4, max: Duration::from_secs(30) };
        assert_eq!(retry_delays(inexact, 4), vec![1_000, 1_400, 1_959]);
    }

    /// The webhook URL may carry credentials (`user:password@`, `?token=`); a failed
    /// request's message is logged and written to Kafka and the database, so it must not
    /// show them.
    #[tokio::test]
    async fn a_failed_request_does_not_show_the_url_credentials() {
        let closed = std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).unwrap();
        let url = format!("http://hook-user:hunter2@{closed}/hook?token=hunter3&x=1");
        let error = reqwest::Client::new().post(&url).body("{}").send().await.unwrap_err();
        let message = send_failure(error);
        assert!(message.starts_with("webhook request failed"), "{message}");
        assert!(!message.contains("hunter"), "{message}");
        assert!(message.contains("refused"), "the cause is kept: {message}");
    }

    #[test]
    fn signature_is_hmac_sha256_hex() {
        // RFC 4231 test case 2.
        assert_eq!(
            signature("Jefe", b"what do ya want for nothing?"),
            "sha256=5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
    }
}
