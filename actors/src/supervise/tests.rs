//! Unit tests of the supervision loop: retries, dead letters, leases, waits, panics.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Mutex;

use futures_util::future::BoxFuture;

use super::*;
use crate::store::{build_pool, PoolSettings};
use tally_schema::headers::dlt_kind;

/// Answers each call with the next of `script` (then `Ok`), counting calls.
struct Scripted {
    script: Mutex<Vec<HandlerError>>,
    calls: Arc<AtomicU32>,
}

impl RecordHandler for Scripted {
    fn handle(&self, _: Arc<Record>) -> BoxFuture<'static, Result<&'static str, HandlerError>> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        let next = self.script.lock().ok().and_then(|mut s| if s.is_empty() { None } else { Some(s.remove(0)) });
        Box::pin(async move {
            match next {
                Some(e) => Err(e),
                None => Ok("handled"),
            }
        })
    }
}

fn scripted(script: Vec<HandlerError>) -> (Scripted, Arc<AtomicU32>) {
    let calls = Arc::new(AtomicU32::new(0));
    (Scripted { script: Mutex::new(script), calls: Arc::clone(&calls) }, calls)
}

/// A supervision whose dead-letter writes can never succeed (no broker, no database):
/// a test that reaches one times out.
pub(crate) fn supervision(max_retries: u32) -> Supervision {
    let producer = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", "127.0.0.1:9")
        .set("log_level", "0")
        .create()
        .expect("producer");
    let pool = build_pool(&PoolSettings {
        url: "postgres://nobody@127.0.0.1:9/none".into(),
        max_size: 1,
        statement_timeout: Duration::from_secs(1),
        connect_timeout: Duration::from_millis(100),
        application_name: "test".into(),
        outbox_notify_after_commit: false,
    })
    .expect("pool");
    let metrics = Metrics::new().expect("metrics");
    let stopping = Arc::new(std::sync::atomic::AtomicBool::new(false));
    Supervision {
        pipeline: "test".into(),
        policy: RetryPolicy {
            max_retries,
            initial: Duration::from_millis(1),
            multiplier: 1.0,
            max: Duration::from_millis(1),
        },
        dead_letters: Arc::new(DeadLetters::new(producer, "g".into(), metrics.clone(), stopping, pool)),
        metrics,
        in_retry: Arc::default(),
        health: Arc::default(),
        probe: None,
    }
}

pub(crate) fn record() -> Arc<Record> {
    Arc::new(Record {
        topic: "t".into(),
        partition: 0,
        offset: 0,
        key: None,
        payload: None,
        headers: Vec::new(),
        timestamp: None,
        defect: None,
    })
}

async fn run(s: &Supervision, h: &Scripted, lease: Lease) -> Result<Completion, Stopping> {
    tokio::time::timeout(Duration::from_secs(5), s.run(h, record(), lease)).await.expect("no dead-letter write")
}

#[tokio::test]
async fn an_unavailable_dependency_costs_the_record_no_retry() {
    let s = supervision(0);
    let (h, calls) = scripted((0..5).map(|_| HandlerError::unavailable("connection refused")).collect());
    assert_eq!(run(&s, &h, Lease::new()).await, Ok(Completion::Handled("handled")));
    assert_eq!(calls.load(Ordering::SeqCst), 6, "five waits, then the attempt that got through");
    assert!(!s.health.is_degraded(), "the wait ended with the record");
}

#[tokio::test]
async fn the_pipeline_is_degraded_while_a_record_waits() {
    let s = Arc::new(supervision(0));
    let (h, _) = scripted((0..1_000_000).map(|_| HandlerError::unavailable("connection refused")).collect());
    let lease = Lease::new();
    let running = tokio::spawn({
        let (s, lease) = (Arc::clone(&s), lease.clone());
        async move { s.run(&h, record(), lease).await }
    });
    while !s.health.is_degraded() {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    // Giving the partition up ends the wait at once: the record stays uncommitted.
    lease.drain();
    assert_eq!(running.await.expect("task"), Err(Stopping));
    assert!(!s.health.is_degraded());
}

#[tokio::test]
async fn nothing_runs_under_a_revoked_lease() {
    let s = supervision(3);
    let (h, calls) = scripted(vec![HandlerError::poison("bad")]);
    let lease = Lease::new();
    lease.revoke();
    assert_eq!(run(&s, &h, lease).await, Err(Stopping));
    assert_eq!(calls.load(Ordering::SeqCst), 0, "no attempt, no dead-letter write");
}

#[tokio::test]
async fn a_lease_revoked_during_a_retry_stops_the_record_before_its_next_attempt() {
    let s = supervision(1_000);
    let (h, calls) = scripted((0..1_000).map(|_| HandlerError::transient("lock timeout")).collect());
    let lease = Lease::new();
    let stop = lease.clone();
    let revoke = async move {
        tokio::time::sleep(Duration::from_millis(20)).await;
        stop.revoke();
    };
    let (result, ()) = tokio::join!(run(&s, &h, lease), revoke);
    assert_eq!(result, Err(Stopping));
    assert!(calls.load(Ordering::SeqCst) < 1_000, "stopped before its budget ran out");
}

#[tokio::test]
async fn a_dead_letter_write_is_skipped_under_a_revoked_lease() {
    let s = supervision(0);
    let lease = Lease::new();
    lease.revoke();
    let r = record();
    let write = lease.scope(s.dead_letters.publish(&r, dlt_kind::POISON, "bad", 1));
    assert_eq!(tokio::time::timeout(Duration::from_secs(5), write).await, Ok(Err(Stopping)));
}

/// Records what it is given; `Stopping` for every write when `refuse`.
#[derive(Default)]
struct RecordingSink {
    written: Mutex<Vec<(String, String, u32)>>,
    refuse: bool,
}

impl DeadLetterSink for RecordingSink {
    fn publish<'a>(
        &'a self,
        _: &'a Record,
        kind: &'a str,
        message: &'a str,
        attempts: u32,
    ) -> BoxFuture<'a, Result<(), Stopping>> {
        if !self.refuse {
            self.written.lock().expect("sink").push((kind.into(), message.into(), attempts));
        }
        let refuse = self.refuse;
        Box::pin(async move {
            if refuse {
                Err(Stopping)
            } else {
                Ok(())
            }
        })
    }

    fn is_stopping(&self) -> bool {
        false
    }
}

fn with_sink(max_retries: u32, sink: &Arc<RecordingSink>) -> Supervision {
    Supervision { dead_letters: Arc::clone(sink) as Arc<dyn DeadLetterSink>, ..supervision(max_retries) }
}

#[tokio::test]
async fn transient_errors_are_retried_then_dead_lettered_as_exhausted() {
    let sink = Arc::new(RecordingSink::default());
    let s = with_sink(3, &sink);
    let (h, calls) = scripted((0..10).map(|_| HandlerError::transient("lock timeout")).collect());
    assert_eq!(run(&s, &h, Lease::new()).await, Ok(Completion::DeadLettered));
    assert_eq!(calls.load(Ordering::SeqCst), 4, "the first attempt and three retries");
    let written = sink.written.lock().expect("sink").clone();
    assert_eq!(written, [(dlt_kind::EXHAUSTED.into(), "lock timeout".into(), 4)]);
    assert_eq!(s.in_retry.load(Ordering::SeqCst), 0, "no key left counted in retry");
}

#[tokio::test]
async fn poison_is_dead_lettered_at_once_and_a_success_never() {
    let sink = Arc::new(RecordingSink::default());
    let s = with_sink(5, &sink);
    let (h, calls) = scripted(vec![HandlerError::poison("undecodable")]);
    assert_eq!(run(&s, &h, Lease::new()).await, Ok(Completion::DeadLettered));
    assert_eq!(calls.load(Ordering::SeqCst), 1, "no retry for poison");
    let (h, _) = scripted(vec![HandlerError::transient("blip")]);
    assert_eq!(run(&s, &h, Lease::new()).await, Ok(Completion::Handled("handled")), "one retry got through");
    let written = sink.written.lock().expect("sink").clone();
    assert_eq!(written, [(dlt_kind::POISON.into(), "undecodable".into(), 1)]);
}

/// Panics on every call.
struct Panicking(Arc<AtomicU32>);

impl RecordHandler for Panicking {
    fn handle(&self, _: Arc<Record>) -> BoxFuture<'static, Result<&'static str, HandlerError>> {
        self.0.fetch_add(1, Ordering::SeqCst);
        Box::pin(async { panic!("boom") })
    }
}

#[tokio::test]
async fn a_record_whose_handler_panics_twice_is_dead_lettered_as_crashed() {
    let sink = Arc::new(RecordingSink::default());
    let s = with_sink(5, &sink);
    let calls = Arc::new(AtomicU32::new(0));
    let result =
        tokio::time::timeout(Duration::from_secs(5), s.run(&Panicking(Arc::clone(&calls)), record(), Lease::new()))
            .await;
    assert_eq!(result, Ok(Ok(Completion::DeadLettered)));
    assert_eq!(calls.load(Ordering::SeqCst), 2, "a retry, then the poison-pill rule; not 6 attempts");
    let written = sink.written.lock().expect("sink").clone();
    assert_eq!(written.len(), 1);
    assert_eq!(written[0].0, dlt_kind::POISON);
    assert!(written[0].1.starts_with("crashed: the handler panicked 2 times (last: boom)"), "{written:?}");
}

#[tokio::test]
async fn a_malformed_record_is_dead_lettered_as_poison_without_an_attempt() {
    let sink = Arc::new(RecordingSink::default());
    let s = with_sink(5, &sink);
    let (h, calls) = scripted(Vec::new());
    let malformed =
        Arc::new(Record { defect: Some("header 0 has a name that is not UTF-8".into()), ..(*record()).clone() });
    let result = tokio::time::timeout(Duration::from_secs(5), s.run(&h, malformed, Lease::new())).await;
    assert_eq!(result, Ok(Ok(Completion::DeadLettered)));
    assert_eq!(calls.load(Ordering::SeqCst), 0, "never handed to the handler");
    let written = sink.written.lock().expect("sink").clone();
    assert_eq!(written, [(dlt_kind::POISON.into(), "header 0 has a name that is not UTF-8".into(), 0)]);
}

#[tokio::test]
async fn a_dead_letter_that_cannot_be_written_leaves_the_record_unfinished() {
    let sink = Arc::new(RecordingSink { refuse: true, ..RecordingSink::default() });
    let s = with_sink(0, &sink);
    let (h, _) = scripted(vec![HandlerError::transient("lock timeout")]);
    assert_eq!(run(&s, &h, Lease::new()).await, Err(Stopping), "never reported as dead-lettered");
}

#[tokio::test]
async fn a_run_dropped_in_its_retry_wait_leaves_no_key_counted() {
    let sink = Arc::new(RecordingSink::default());
    let mut s = with_sink(3, &sink);
    s.policy.initial = Duration::from_secs(3_600);
    s.policy.max = Duration::from_secs(3_600);
    let (h, calls) = scripted(vec![HandlerError::transient("lock timeout")]);
    let mut attempt = Box::pin(run(&s, &h, Lease::new()));
    let polled = tokio::time::timeout(Duration::from_millis(200), &mut attempt).await;
    assert!(polled.is_err(), "the record waits out its hour");
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    assert_eq!(s.in_retry.load(Ordering::SeqCst), 1, "counted while it waits");
    drop(attempt);
    assert_eq!(s.in_retry.load(Ordering::SeqCst), 0, "no key left counted once its worker is gone");
}
