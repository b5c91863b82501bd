//! The supervisor of a pipeline's driver thread: runs the driver loop under
//! `catch_unwind` and, after a panic, gives the partitions up (finished work committed),
//! waits a capped backoff while still answering control commands, and starts a new
//! consumer from the committed offsets (see [`crate::supervise::restart`]).

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::Ordering;
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::sync::{Arc, PoisonError};
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaResult;
use tracing::{error, info, warn};

use super::assignment::{DriverContext, DriverState, TopicPartition};
use super::driver::drive;
use super::{Control, Release};
use crate::supervise::restart::{give_up, panic_message, MAX_START_FAILURES};

/// A consumer of the pipeline's group, subscribed to its topics.
pub(crate) fn subscribe(shared: &Arc<DriverState>) -> KafkaResult<BaseConsumer<DriverContext>> {
    let consumer: BaseConsumer<DriverContext> =
        shared.spec.consumer_config().create_with_context(DriverContext { shared: Arc::clone(shared) })?;
    let topics: Vec<&str> = shared.spec.topics.iter().map(String::as_str).collect();
    consumer.subscribe(&topics)?;
    Ok(consumer)
}

/// Runs the driver with `first`, and again with a new consumer after each panic, until
/// the pipeline is stopped.
pub(super) fn supervised(first: BaseConsumer<DriverContext>, shared: &Arc<DriverState>, control: &Receiver<Control>) {
    let name = shared.spec.name.clone();
    let mut next = Some(first);
    let mut failures = 0_u32;
    loop {
        let consumer = match next.take().map_or_else(|| subscribe(shared), Ok) {
            Ok(consumer) => consumer,
            Err(e) => {
                failures += 1;
                if failures >= MAX_START_FAILURES {
                    give_up(format!("pipeline {name}: cannot create its consumer again ({failures} tries): {e}"));
                    serve_until_stop(shared, control, None);
                    return;
                }
                let wait = shared.restarts.crashed(&format!("cannot create the consumer: {e}"));
                warn!(pipeline = %name, error = %e, wait_ms = wait.as_millis() as u64, "Cannot restart the stage; trying again.");
                if serve_until_stop(shared, control, Some(wait)) {
                    return;
                }
                continue;
            }
        };
        failures = 0;
        shared.restarts.started();
        let (cause, record) = match catch_unwind(AssertUnwindSafe(|| drive(&consumer, shared, control))) {
            Ok(Ok(())) => return,
            // Not a record's fault: nothing was in hand.
            Ok(Err(reason)) => (reason, None),
            Err(panic) => {
                let cause = panic_message(&*panic);
                let record = shared.crashes.crashed(&cause);
                (cause, record)
            }
        };
        shared.metrics.stage_restarts_total.with_label_values(&[&name]).inc();
        let wait = shared.restarts.crashed(&cause);
        error!(pipeline = %name, cause, record = ?record, wait_ms = wait.as_millis() as u64,
               "Stage stopped; its partitions are given up and it restarts from the committed offsets.");
        // After a stall its records were waited for long enough: a moment lets the other
        // partitions' drains finish, not the stalled ones'.
        let stalled = shared.stalled.swap(false, Ordering::AcqRel);
        let drain = if stalled { Duration::from_secs(1) } else { shared.spec.drain_timeout };
        let all: Vec<TopicPartition> = shared.slots().keys().cloned().collect();
        let released = catch_unwind(AssertUnwindSafe(|| {
            shared.revoke_within(&consumer, &all, drain);
            consumer.unsubscribe();
            drop(consumer);
        }));
        if released.is_err() {
            // Whatever was not committed is redelivered to the partition's next owner; the
            // old partition consumers do nothing more for it.
            for (_, slot) in shared.slots().drain() {
                slot.lease.revoke();
                slot.addr.do_send(Release);
            }
            warn!(pipeline = %name, "The crashed stage's partitions could not be released cleanly.");
        }
        if serve_until_stop(shared, control, Some(wait)) {
            return;
        }
        info!(pipeline = %name, "Restarting the stage.");
    }
}

/// Answers control commands while the stage is down, for `wait` (or until stopped when
/// `None`). True when the stage was stopped meanwhile.
fn serve_until_stop(shared: &DriverState, control: &Receiver<Control>, wait: Option<Duration>) -> bool {
    let deadline = wait.map(|w| Instant::now() + w);
    loop {
        let left = deadline.map_or(Duration::from_secs(3_600), |d| d.saturating_duration_since(Instant::now()));
        if deadline.is_some() && left.is_zero() {
            return false;
        }
        match control.recv_timeout(left) {
            Ok(Control::Stop(done)) => {
                let _ = done.send(());
                return true;
            }
            // Applied when the stage runs again: new assignments follow the admin pause.
            Ok(Control::Pause(applied)) => {
                shared.status.lock().unwrap_or_else(PoisonError::into_inner).paused = true;
                shared.metrics.pipeline_paused.with_label_values(&[&shared.spec.name]).set(1);
                let _ = applied.send(());
            }
            Ok(Control::Resume(applied)) => {
                shared.status.lock().unwrap_or_else(PoisonError::into_inner).paused = false;
                shared.metrics.pipeline_paused.with_label_values(&[&shared.spec.name]).set(0);
                let _ = applied.send(());
            }
            Err(RecvTimeoutError::Timeout) => {}
            Err(RecvTimeoutError::Disconnected) => return true,
        }
    }
}
