//! Supervision shared by every pipeline: wraps each handler call with the error policy of
//! DESIGN.md §5.3 (blocking exponential retry for transient errors, DLT for exhausted and
//! poison records) and contains panics, which are bugs, as transient failures so that the
//! record is retried and finally dead-lettered instead of lost.

mod dlt;
mod fallback;
mod policy;

use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::Instant;

use futures_util::future::BoxFuture;
use futures_util::FutureExt;
use tracing::warn;

pub use dlt::{dlt_headers, DeadLetters, Stopping};
pub use fallback::{headers_json, store_dead_letter, DeadLetterRow};
pub use policy::{classify_server_message, Classify, ErrorClass, HandlerError, RetryPolicy};

use crate::consume::Record;
use crate::metrics::Metrics;

/// The business logic of one pipeline, called once per record (and again on retry). It
/// must be idempotent: a record can be delivered more than once.
pub trait RecordHandler: Send + Sync + 'static {
    /// Handles `record`; returns the outcome label for metrics (`settled`, `rejected`,
    /// `duplicate`, ...). Business rejections are outcomes, not errors.
    fn handle(&self, record: Arc<Record>) -> BoxFuture<'static, Result<&'static str, HandlerError>>;
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
    pub dead_letters: DeadLetters,
    pub metrics: Metrics,
    /// Records currently waiting in blocking retry (keys held back).
    pub in_retry: Arc<std::sync::atomic::AtomicUsize>,
}

impl Supervision {
    /// Runs `handler` on `record` under the policy until it is handled or dead-lettered.
    ///
    /// # Errors
    /// [`Stopping`] when the pipeline stops while a DLT write is pending.
    pub async fn run(&self, handler: &dyn RecordHandler, record: Arc<Record>) -> Result<Completion, Stopping> {
        let started = Instant::now();
        let mut attempt: u32 = 1;
        let result = loop {
            let outcome = AssertUnwindSafe(handler.handle(Arc::clone(&record)))
                .catch_unwind()
                .await
                .unwrap_or_else(|_| Err(HandlerError::transient("handler panicked (a bug); retrying")));
            match outcome {
                Ok(label) => break Ok(Completion::Handled(label)),
                Err(e) if e.class == ErrorClass::Poison => {
                    self.dead_letters.publish(&record, ErrorClass::Poison.dlt_kind(), &e.message, attempt).await?;
                    break Ok(Completion::DeadLettered);
                }
                Err(e) => match self.policy.backoff(attempt) {
                    Some(wait) => {
                        warn!(pipeline = %self.pipeline, topic = %record.topic, partition = record.partition,
                              offset = record.offset, key = record.routing_key(), attempt,
                              wait_ms = wait.as_millis() as u64, error = %e.message,
                              "Retrying record after transient error.");
                        self.metrics.retries_total.with_label_values(&[&self.pipeline]).inc();
                        self.in_retry.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        tokio::time::sleep(wait).await;
                        self.in_retry.fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
                        attempt += 1;
                    }
                    None => {
                        self.dead_letters
                            .publish(&record, ErrorClass::Transient.dlt_kind(), &e.message, attempt)
                            .await?;
                        break Ok(Completion::DeadLettered);
                    }
                },
            }
        };
        let label = match result {
            Ok(Completion::Handled(label)) => label,
            Ok(Completion::DeadLettered) => "dead_lettered",
            Err(_) => return result,
        };
        self.metrics.records_total.with_label_values(&[&self.pipeline, label]).inc();
        self.metrics.handler_seconds.with_label_values(&[&self.pipeline]).observe(started.elapsed().as_secs_f64());
        result
    }
}
