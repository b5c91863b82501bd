//! Supervision shared by every pipeline: wraps each handler call with the error policy
//! (blocking exponential retry for transient errors, DLT for exhausted and
//! poison records, waiting out an unavailable dependency without spending the record's
//! retries) and contains panics, which are bugs, as transient failures so that the record
//! is retried and finally dead-lettered instead of lost. Every attempt and every
//! dead-letter write first checks the record's [`Lease`]: after its partition was revoked
//! nothing more happens for it here.

mod health;
mod policy;
mod probe;
pub mod restart;

use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::future::BoxFuture;
use futures_util::FutureExt;
use tracing::warn;

pub use crate::dlt::{dlt_headers, is_permanent_dlt_error, DeadLetters, Stopping};
pub use crate::store::dead_letters::{headers_json, store_dead_letter, DeadLetterRow};

pub use health::{Degradation, DependencyHealth, DependencyWait};
pub use policy::{classify_server_message, Classify, ErrorClass, HandlerError, RetryPolicy, PROBE_MAX};
pub use probe::{DependencyProbe, PROBE_FRESH};

use crate::counted::Counted;
use crate::metrics::Metrics;
use crate::record::{Lease, Record};

/// The business logic of one pipeline, called once per record (and again on retry). It
/// must be idempotent: a record can be delivered more than once.
pub trait RecordHandler: Send + Sync + 'static {
    /// Handles `record`; returns the outcome label for metrics (`settled`, `rejected`,
    /// `duplicate`, ...). Business rejections are outcomes, not errors.
    fn handle(&self, record: Arc<Record>) -> BoxFuture<'static, Result<&'static str, HandlerError>>;
}

/// Where supervision sends a record it gives up on (exhausted or poison). The daemon's is
/// [`DeadLetters`]; the retry-then-dead-letter loop is tested over a sink that records
/// what it got.
pub trait DeadLetterSink: Send + Sync {
    /// Writes `record` as a dead letter of `kind` after `attempts` attempts.
    ///
    /// # Errors
    /// [`Stopping`] when the write could not happen before the pipeline stopped or the
    /// record's lease ended: the record stays uncommitted.
    fn publish<'a>(
        &'a self,
        record: &'a Record,
        kind: &'a str,
        message: &'a str,
        attempts: u32,
    ) -> BoxFuture<'a, Result<(), Stopping>>;

    /// Whether the pipeline is stopping.
    fn is_stopping(&self) -> bool;
}

impl DeadLetterSink for DeadLetters {
    fn publish<'a>(
        &'a self,
        record: &'a Record,
        kind: &'a str,
        message: &'a str,
        attempts: u32,
    ) -> BoxFuture<'a, Result<(), Stopping>> {
        DeadLetters::publish(self, record, kind, message, attempts).boxed()
    }

    fn is_stopping(&self) -> bool {
        DeadLetters::is_stopping(self)
    }
}

/// How a record ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Completion {
    Handled(&'static str),
    DeadLettered,
}

/// The error policy of one pipeline.
pub struct Supervision {
    pub pipeline: String,
    pub policy: RetryPolicy,
    pub dead_letters: Arc<dyn DeadLetterSink>,
    pub metrics: Metrics,
    /// Records currently waiting in blocking retry (keys held back).
    pub in_retry: Arc<std::sync::atomic::AtomicUsize>,
    /// Whether the pipeline waits for an unavailable dependency.
    pub health: Arc<DependencyHealth>,
    /// Asked before a failure that is not known poison is counted against a record: when
    /// it fails, the dependency is down, not the record at fault.
    pub probe: Option<Arc<DependencyProbe>>,
}

impl Supervision {
    /// `e` as the record's fault, unless the probe finds the dependency down: then it is
    /// [`ErrorClass::Unavailable`], whatever its text said. Known poison is not probed.
    async fn blame(&self, e: HandlerError) -> HandlerError {
        let Some(probe) = self.probe.as_ref().filter(|_| e.class == ErrorClass::Transient) else { return e };
        match probe.check().await {
            Ok(()) => e,
            Err(reason) => HandlerError::unavailable(format!("{reason} ({})", e.message)),
        }
    }

    /// Runs `handler` on `record` under the policy until it is handled or dead-lettered.
    /// An attempt that finds a dependency unavailable does not count: the record waits
    /// (capped backoff) and probes again, for as long as it takes.
    ///
    /// # Errors
    /// [`Stopping`] when the pipeline stops or `lease` ends first: the record stays
    /// uncommitted and is redelivered.
    pub async fn run(
        &self,
        handler: &dyn RecordHandler,
        record: Arc<Record>,
        lease: Lease,
    ) -> Result<Completion, Stopping> {
        let started = Instant::now();
        crate::faults::hang_on_marked(&record).await;
        let result = lease.clone().scope(self.attempts(handler, &record, &lease)).await;
        let label = match result {
            Ok(Completion::Handled(label)) => label,
            Ok(Completion::DeadLettered) => "dead_lettered",
            Err(_) => return result,
        };
        self.metrics.records_total.with_label_values(&[&self.pipeline, label]).inc();
        self.metrics.handler_seconds.with_label_values(&[&self.pipeline]).observe(started.elapsed().as_secs_f64());
        result
    }

    async fn attempts(
        &self,
        handler: &dyn RecordHandler,
        record: &Arc<Record>,
        lease: &Lease,
    ) -> Result<Completion, Stopping> {
        if let Some(defect) = &record.defect {
            // Malformed as it came (or it crashed its stage before): never handed to the
            // handler.
            if !lease.is_live() || self.dead_letters.is_stopping() {
                return Err(Stopping);
            }
            self.dead_letters.publish(record, ErrorClass::Poison.dlt_kind(), defect, 0).await?;
            crate::trace::poison(&self.pipeline, record, defect);
            return Ok(Completion::DeadLettered);
        }
        // Attempts charged to the record (those that found the dependency down are not).
        let mut attempt: u32 = 1;
        let mut panics: u32 = 0;
        let mut waiting: Option<(DependencyWait, Duration)> = None;
        loop {
            if !lease.is_live() || self.dead_letters.is_stopping() {
                return Err(Stopping);
            }
            let (outcome, panicked) = match AssertUnwindSafe(handler.handle(Arc::clone(record))).catch_unwind().await {
                Ok(outcome) => (outcome, false),
                Err(panic) => {
                    // A bug: retried once, and the second time the record is the poison pill.
                    panics += 1;
                    let cause = restart::panic_message(&*panic);
                    warn!(pipeline = %self.pipeline, topic = %record.topic, partition = record.partition,
                          offset = record.offset, panics, cause, "Handler panicked (a bug).");
                    if panics >= restart::CRASHES_BEFORE_POISON {
                        let message = format!("crashed: the handler panicked {panics} times (last: {cause})");
                        self.dead_letters.publish(record, ErrorClass::Poison.dlt_kind(), &message, attempt).await?;
                        crate::trace::poison(&self.pipeline, record, &message);
                        return Ok(Completion::DeadLettered);
                    }
                    (Err(HandlerError::transient(format!("handler panicked (a bug): {cause}"))), true)
                }
            };
            let e = match outcome {
                Ok(label) => return Ok(Completion::Handled(label)),
                // A bug, not the database: nothing to probe.
                Err(e) if panicked => e,
                Err(e) => self.blame(e).await,
            };
            let e = match e {
                e if e.class == ErrorClass::Unavailable => {
                    // Nobody's record's fault: wait and probe again, unless the partition
                    // is being given up (the record cannot finish; it stays uncommitted).
                    if lease.is_ending() {
                        return Err(Stopping);
                    }
                    let previous = waiting.as_ref().map(|(_, wait)| *wait);
                    let wait = self.policy.probe_backoff(previous);
                    match waiting.as_mut() {
                        Some((_, w)) => {
                            self.health.still_failing(&e.message);
                            *w = wait;
                        }
                        None => waiting = Some((self.health.wait(&e.message), wait)),
                    }
                    warn!(pipeline = %self.pipeline, topic = %record.topic, partition = record.partition,
                          offset = record.offset, key = record.routing_key(), wait_ms = wait.as_millis() as u64,
                          error = %e.message, "Dependency unavailable; the record waits without spending its retries.");
                    self.metrics.dependency_waits_total.with_label_values(&[&self.pipeline]).inc();
                    tokio::time::sleep(wait).await;
                    continue;
                }
                e => e,
            };
            waiting = None;
            if e.class == ErrorClass::Poison {
                self.dead_letters.publish(record, ErrorClass::Poison.dlt_kind(), &e.message, attempt).await?;
                return Ok(Completion::DeadLettered);
            }
            let Some(wait) = self.policy.backoff(attempt) else {
                self.dead_letters.publish(record, ErrorClass::Transient.dlt_kind(), &e.message, attempt).await?;
                return Ok(Completion::DeadLettered);
            };
            warn!(pipeline = %self.pipeline, topic = %record.topic, partition = record.partition,
                  offset = record.offset, key = record.routing_key(), attempt,
                  wait_ms = wait.as_millis() as u64, error = %e.message,
                  "Retrying record after transient error.");
            self.metrics.retries_total.with_label_values(&[&self.pipeline]).inc();
            // Counted until the wait ends, or its future is dropped (its worker stopped).
            let counted = Counted::new(&self.in_retry);
            tokio::time::sleep(wait).await;
            drop(counted);
            attempt += 1;
        }
    }
}

#[cfg(test)]
pub(crate) mod tests;
