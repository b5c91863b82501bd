//! One batch of the antifraud loop: its decisions (stored ones reused, new ones scored
//! and stored first, waiting out database failures), then one Kafka transaction for its
//! outputs and offsets, retried until it commits; a poison record the DLT refuses for good
//! goes to the `dead_letters` table instead.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::Ordering;
use std::time::Duration;

use chrono::{SubsecRound, Utc};
use rdkafka::consumer::Consumer;
use rdkafka::producer::Producer;
use tally_schema::events::TransferRequested;
use tracing::warn;
use uuid::Uuid;

use super::decisions::{self, Decision};
use super::output::Output;
use super::txn::{needs_new_producer, new_producer, next_offsets, permanently_refused, transact, TxnProducer};
use super::{AntifraudSpec, LoopIo, RiskEngine, BLOCKED_BY_ANTIFRAUD, PIPELINE};
use crate::consume::Record;
use crate::supervise::{store_dead_letter, DeadLetterRow, HandlerError};

/// The decision of every decoded transfer of the batch: stored ones as they are, new ones
/// scored and stored first. Rebuilds the velocity window first after an assignment.
/// Waits out database failures with capped backoff; `None` when the stage stops meanwhile.
pub(super) fn decide(
    io: &LoopIo<'_>,
    inputs: &[Result<TransferRequested, String>],
    risk: &mut dyn RiskEngine,
) -> Option<HashMap<Uuid, Decision>> {
    let requests: Vec<&TransferRequested> = inputs.iter().filter_map(|i| i.as_ref().ok()).collect();
    if requests.is_empty() {
        // Nothing to decide (every record is poison): no need for the database.
        return Some(HashMap::new());
    }
    let mut attempt = 0_u32;
    loop {
        match io.runtime.block_on(decide_stored(io, &requests, risk)) {
            Ok(decided) => return Some(decided),
            Err(e) => {
                attempt += 1;
                warn!(pipeline = PIPELINE, error = %e, attempt, "Cannot read or store antifraud decisions; retrying.");
                if io.stopping.load(Ordering::Relaxed) {
                    return None;
                }
                io.metrics.retries_total.with_label_values(&[PIPELINE]).inc();
                std::thread::sleep(backoff(io.spec, attempt));
            }
        }
    }
}

async fn decide_stored(
    io: &LoopIo<'_>,
    requests: &[&TransferRequested],
    risk: &mut dyn RiskEngine,
) -> Result<HashMap<Uuid, Decision>, HandlerError> {
    let mut conn = io.pool.get().await.map_err(|e| HandlerError::classified("no database connection", &e))?;
    let db = |e: diesel::result::Error| HandlerError::classified("antifraud decisions", &e);
    if io.consumer.context().assigned.load(Ordering::Relaxed) {
        if let Some(window) = risk.window() {
            let recent = decisions::recent(&mut conn, window).await.map_err(db)?;
            risk.rebuild(
                &recent.into_iter().map(|r| (r.source_account, r.transfer_id, r.requested_at)).collect::<Vec<_>>(),
            );
        }
        io.consumer.context().assigned.store(false, Ordering::Relaxed);
    }
    let mut seen = HashSet::new();
    let ids: Vec<Uuid> = requests.iter().map(|t| t.transfer_id).filter(|id| seen.insert(*id)).collect();
    let stored = decisions::load(&mut conn, &ids).await.map_err(db)?;
    // Stored with microsecond precision: keep the same precision, so the first delivery
    // and every later one publish the same time.
    let now = Utc::now().trunc_subsecs(6);
    let (mut all, new) =
        decisions::decide_batch(requests, &stored, risk, io.spec.block_limit, BLOCKED_BY_ANTIFRAUD, now);
    let inserted = decisions::store(&mut conn, &new).await.map_err(db)?;
    let lost: Vec<Uuid> = new.iter().map(|d| d.transfer_id).filter(|id| !inserted.contains(id)).collect();
    if !lost.is_empty() {
        // Another instance decided these first: its decision stands.
        all.extend(decisions::load(&mut conn, &lost).await.map_err(db)?);
    }
    Ok(all)
}

fn backoff(spec: &AntifraudSpec, attempt: u32) -> Duration {
    spec.retry.backoff(attempt.min(spec.retry.max_retries.max(1))).unwrap_or(spec.retry.max)
}

/// Commits the batch's outputs and offsets in one transaction, retrying until it commits
/// (broker trouble is no record's fault). A dead-letter output the DLT refuses for good is
/// stored in the `dead_letters` table instead. Returns false when the stage stops first.
pub(super) fn commit_batch(io: &LoopIo<'_>, producer: &mut TxnProducer, batch: &[Record], outputs: &[Output]) -> bool {
    let LoopIo { consumer, spec, metrics, stopping, .. } = *io;
    let offsets = next_offsets(batch);
    let mut skip = vec![false; outputs.len()];
    let mut attempt = 0_u32;
    loop {
        match transact(producer, consumer, outputs, &skip, &offsets, spec) {
            Ok(()) => {
                metrics.kafka_transactions_total.with_label_values(&["committed"]).inc();
                for (o, stored) in outputs.iter().zip(&skip) {
                    metrics.records_total.with_label_values(&[PIPELINE, o.outcome]).inc();
                    if o.outcome == "dead_lettered" {
                        let place = if *stored { DEAD_LETTERS_TABLE } else { o.topic.as_str() };
                        metrics.dlt_records_total.with_label_values(&[place]).inc();
                    }
                }
                return true;
            }
            Err(failure) => {
                metrics.kafka_transactions_total.with_label_values(&["aborted"]).inc();
                attempt += 1;
                let renew = needs_new_producer(&failure.error);
                warn!(pipeline = PIPELINE, error = %failure.error, attempt, records = outputs.len(), renew,
                      "Transaction failed; aborting and producing the batch again.");
                if renew {
                    match new_producer(spec) {
                        Ok(p) => *producer = p,
                        Err(e) => {
                            warn!(pipeline = PIPELINE, error = %e, "Cannot re-create the transactional producer.")
                        }
                    }
                } else if let Err(e) = producer.abort_transaction(spec.transaction_timeout) {
                    warn!(pipeline = PIPELINE, error = %e, "Abort failed; re-creating the producer.");
                    if let Ok(p) = new_producer(spec) {
                        *producer = p;
                    }
                }
                if let Some(index) = failure.refused.filter(|_| permanently_refused(&failure.error)) {
                    if let Some(o) = outputs.get(index).filter(|o| o.dead_letter.is_some()) {
                        if store_refused(io, batch, o, &failure.error.to_string()) {
                            skip[index] = true;
                            continue;
                        }
                    }
                }
                if stopping.load(Ordering::Relaxed) {
                    // Uncommitted: the batch is redelivered to whoever consumes next.
                    // Return rather than gather again, so no later transaction commits
                    // offsets past this batch.
                    return false;
                }
                metrics.retries_total.with_label_values(&[PIPELINE]).inc();
                std::thread::sleep(backoff(spec, attempt));
            }
        }
    }
}

/// The `dlt_records_total` label of records stored in the `dead_letters` table.
const DEAD_LETTERS_TABLE: &str = "dead_letters";

/// Stores the poison record behind `o` in the `dead_letters` table; true once stored (or
/// already there).
fn store_refused(io: &LoopIo<'_>, batch: &[Record], o: &Output, dlt_error: &str) -> bool {
    let Some((index, reason)) = &o.dead_letter else { return false };
    let Some(record) = batch.get(*index) else { return false };
    let row =
        DeadLetterRow { record, group: &io.spec.group_id, kind: "poison", message: reason, attempts: 1, dlt_error };
    let result = io.runtime.block_on(async {
        let mut conn = io.pool.get().await.map_err(|e| e.to_string())?;
        store_dead_letter(&mut conn, &row).await.map_err(|e| e.to_string())
    });
    match result {
        Ok(_) => {
            warn!(pipeline = PIPELINE, topic = %record.topic, partition = record.partition, offset = record.offset,
                  error = dlt_error, "The DLT refused a poison record; stored it in the dead_letters table.");
            true
        }
        Err(e) => {
            warn!(pipeline = PIPELINE, error = %e, "Cannot store a refused poison record; retrying the batch.");
            false
        }
    }
}
