//! One batch of the antifraud loop: its decisions (stored ones reused, new ones scored
//! and stored first, waiting out database failures), its outputs, then one Kafka
//! transaction for its outputs and offsets, retried until it commits; records refused for
//! good are set aside ([`refused`]: a decision the broker refuses goes to its input's DLT,
//! a dead letter the DLT refuses to the `dead_letters` table). Every wait holds the
//! partitions without leaving the group ([`Hold`]).

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use rdkafka::consumer::Consumer;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::producer::Producer;
use tally_schema::headers;
use tracing::{error, warn};

use super::hold::{drop_partitions, rewind, Hold, OfRecord};
use super::output::{self, Hops, Output};
use super::txn::{
    finish, lost_membership, new_producer, next_offsets, recovery, transact, Phase, Recovery, TxnFailure, TxnProducer,
};
use super::{AntifraudSpec, LoopIo, PIPELINE};
use crate::metrics::Metrics;
use crate::record::Record;
use refused::{set_aside, Parts};

mod decided;
mod refused;

pub(super) use decided::{decide, Decided};

/// One input record and what the stage writes for it.
pub(super) struct Item {
    pub record: Record,
    pub output: Output,
    /// The output is a dead letter the DLT refused, stored in the `dead_letters` table
    /// instead: it is not produced.
    pub stored: bool,
}

impl OfRecord for Item {
    fn record(&self) -> &Record {
        &self.record
    }
}

/// What the stage writes for each record of the batch: its decision's event, or a dead
/// letter for a record that cannot be decoded or contradicts its stored decision.
/// Each output is recorded on the record's hop span in `hops`.
pub(super) fn outputs(batch: Vec<Record>, decided: &Decided, spec: &AntifraudSpec, hops: &Hops) -> Vec<Item> {
    batch
        .into_iter()
        .map(|record| {
            let decoded = output::decode(&record);
            let output = match &decoded {
                Err(reason) => output::poison(&record, spec, reason.clone()),
                Ok(t) => match (decided.refusal(t), decided.decisions.get(&t.transfer_id)) {
                    (Some(refusal), _) => output::poison(&record, spec, refusal.to_owned()),
                    (None, Some(d)) if d.decides(t) => output::decided(t, d, spec, hops.traceparent(&record)),
                    (None, Some(_)) => output::poison(
                        &record,
                        spec,
                        format!(
                            "TransferRequested {} asks for other accounts, amount or currency than the request \
                             already decided under its id",
                            t.transfer_id
                        ),
                    ),
                    // decide() returns a decision for every transfer the intake took.
                    (None, None) => output::poison(&record, spec, "no decision could be made".into()),
                },
            };
            hops.decided(&record, decoded.ok().map(|t| t.transfer_id), output.outcome, output.dead_letter.as_deref());
            Item { record, output, stored: false }
        })
        .collect()
}

pub(super) fn backoff(spec: &AntifraudSpec, attempt: u32) -> Duration {
    spec.retry.backoff(attempt.min(spec.retry.max_retries.max(1))).unwrap_or(spec.retry.max)
}

/// Commits the batch's outputs and offsets in one transaction, retrying until it commits
/// (broker trouble is no record's fault), as librdkafka documents its errors: a retriable
/// call is made again (a commit is never aborted while it may be under way), an abortable
/// transaction is aborted and produced again, a fatal error re-creates the producer and
/// redoes only what the group's committed offsets say is not done. Between attempts the
/// partitions are held ([`Hold`]): records of partitions revoked meanwhile leave the batch.
/// Records refused for good are no broker trouble: a batch whose records the broker
/// refused is committed in parts until the input whose output is refused is alone, and
/// that input is set aside ([`refused`]: its decision goes to its DLT instead, a dead
/// letter the DLT refuses to the `dead_letters` table). Returns false when the stage stops
/// first.
pub(super) fn commit_batch(io: &LoopIo<'_>, producer: &mut TxnProducer, mut items: Vec<Item>) -> bool {
    let LoopIo { consumer, spec, metrics, stopping, .. } = *io;
    let mut hold: Option<Hold<'_>> = None;
    let mut attempt = 0_u32;
    // Partitions revoked while a call was retried: their records leave the batch before
    // anything is produced again.
    let mut revoked: Vec<(String, i32)> = Vec::new();
    // Set after a failure whose transaction may have committed after all: what the
    // group's committed offsets cover is dropped before anything is produced again.
    let mut must_rewind = false;
    // One transaction for the whole batch, unless the broker refuses some of its records.
    let mut parts = Parts::new(items.len());
    loop {
        let dropped = drop_partitions(&mut items, &std::mem::take(&mut revoked));
        if dropped > 0 {
            warn!(
                pipeline = PIPELINE,
                dropped, "Partitions revoked while retrying; their records go to their new owner."
            );
            parts.reset(items.len());
        }
        if must_rewind {
            match rewind(consumer, &mut items, spec.call_timeout) {
                Ok(done) => {
                    must_rewind = false;
                    if !done.is_empty() {
                        warn!(
                            pipeline = PIPELINE,
                            dropped = done.len(),
                            "Records committed by an earlier transaction after all; not producing them again."
                        );
                        record_committed(metrics, &done);
                        parts.reset(items.len());
                    }
                }
                Err(e) => warn!(pipeline = PIPELINE, error = %e, "Cannot read the committed offsets; retrying."),
            }
        }
        if items.is_empty() {
            // Every record was revoked or is already committed: nothing left to commit.
            return true;
        }
        if !must_rewind {
            let part = parts.front(items.len());
            match attempt_transaction(io, producer, &mut hold, &mut attempt, &items[..part], &mut revoked) {
                Ok(()) => {
                    metrics.kafka_transactions_total.with_label_values(&["committed"]).inc();
                    record_committed(metrics, &items[..part]);
                    items.drain(..part);
                    parts.committed();
                    if items.is_empty() {
                        return true;
                    }
                    // The next part at once, as a transaction of its own.
                    attempt = 0;
                    continue;
                }
                Err(failure) => {
                    if stopping.load(Ordering::Relaxed)
                        && failure.phase == Phase::Commit
                        && recovery(&failure) == Recovery::Retry
                    {
                        // A commit that may be under way is left to complete; the
                        // successor's `init_transactions` completes or aborts it.
                        return false;
                    }
                    attempt += 1;
                    metrics.kafka_transactions_total.with_label_values(&["failed"]).inc();
                    must_rewind = recover(producer, spec, metrics, &failure, attempt, part);
                    if let Some(item) = failure.refused.and_then(|index| items.get_mut(index)) {
                        // The producer refused this output at once: it names its input.
                        if refused::refused_at_once(item, &failure.error)
                            && set_aside(io, item, &failure.error.to_string())
                        {
                            continue;
                        }
                    } else if refused::refused_by_broker(&failure) {
                        if parts.split() {
                            warn!(pipeline = PIPELINE, error = %failure.error, records = part,
                                  "The broker refused records of the transaction; committing its batch in halves.");
                            continue;
                        }
                        // Alone, so its input's output is the refused one.
                        let refusal = refused::refusal(&failure);
                        if items.first_mut().is_some_and(|item| set_aside(io, item, &refusal)) {
                            continue;
                        }
                    }
                }
            }
        }
        if stopping.load(Ordering::Relaxed) {
            // Uncommitted: the batch is redelivered to whoever consumes next. Return
            // rather than gather again, so no later transaction commits offsets past it.
            return false;
        }
        metrics.retries_total.with_label_values(&[PIPELINE]).inc();
        revoked.extend(hold.get_or_insert_with(|| Hold::begin(consumer)).wait(io, backoff(spec, attempt)));
    }
}

/// One transaction for `items`; a retriable failure has its call made again (holding
/// meanwhile) until it completes or fails otherwise, or, while the offsets are not sent
/// yet, until a partition is revoked (the transaction is then aborted rather than let its
/// offsets go to the broker). Partitions revoked while waiting go to `revoked`. On
/// failure, `refused` indexes `items`.
fn attempt_transaction<'a>(
    io: &LoopIo<'a>,
    producer: &TxnProducer,
    hold: &mut Option<Hold<'a>>,
    attempt: &mut u32,
    items: &[Item],
    revoked: &mut Vec<(String, i32)>,
) -> Result<(), TxnFailure> {
    let LoopIo { consumer, spec, metrics, stopping, .. } = *io;
    // Taken once: retries of this transaction send its offsets under this generation.
    let Some(group) = consumer.group_metadata().map(Arc::new) else {
        let error = KafkaError::ConsumerCommit(RDKafkaErrorCode::InvalidGroupId).into();
        return Err(TxnFailure::new(error, Phase::Produce, false, None));
    };
    let sending: Vec<usize> = (0..items.len()).filter(|&i| !items[i].stored).collect();
    let outs: Vec<&Output> = sending.iter().map(|&i| &items[i].output).collect();
    let offsets = next_offsets(items.iter().map(|i| &i.record));
    let mut result = transact(producer, &group, &outs, &offsets, spec);
    while let Err(failure) = &result {
        if recovery(failure) != Recovery::Retry
            || stopping.load(Ordering::Relaxed)
            || (failure.phase == Phase::SendOffsets && !revoked.is_empty())
        {
            break;
        }
        *attempt += 1;
        metrics.kafka_transactions_total.with_label_values(&["retried"]).inc();
        warn!(pipeline = PIPELINE, error = %failure.error, phase = ?failure.phase, attempt = *attempt,
              "Transaction call failed with a retriable error; making it again.");
        let phase = failure.phase;
        revoked.extend(hold.get_or_insert_with(|| Hold::begin(consumer)).wait(io, backoff(spec, *attempt)));
        if phase == Phase::SendOffsets && !revoked.is_empty() {
            // Not sent yet: abort rather than commit offsets of a partition now another's.
            break;
        }
        result = finish(producer, &group, &offsets, spec, phase);
    }
    result.map_err(|mut f| {
        f.refused = f.refused.and_then(|j| sending.get(j).copied());
        f.deliveries = producer.failed_deliveries();
        f
    })
}

/// Aborts the failed transaction, or re-creates the producer when it cannot go on. Returns
/// whether the batch must be rewound to the committed offsets first: the transaction may
/// have committed after all, or (a member that lost its place) another member may have
/// committed past its records meanwhile.
fn recover(
    producer: &mut TxnProducer,
    spec: &AntifraudSpec,
    metrics: &Metrics,
    failure: &TxnFailure,
    attempt: u32,
    records: usize,
) -> bool {
    let lost = failure.error.kafka().is_some_and(lost_membership);
    if recovery(failure) == Recovery::Renew {
        warn!(pipeline = PIPELINE, error = %failure.error, attempt, records,
              "Transaction failed fatally; re-creating the producer, then redoing what is not committed.");
        renew(producer, spec, metrics);
        return true;
    }
    if !failure.open {
        warn!(pipeline = PIPELINE, error = %failure.error, attempt, records, "Cannot begin a transaction; retrying.");
        return lost;
    }
    warn!(pipeline = PIPELINE, error = %failure.error, attempt, records, lost,
          "Transaction failed; aborting it and producing the batch again.");
    if let Err(e) = producer.abort_transaction(spec.transaction_timeout) {
        warn!(pipeline = PIPELINE, error = %e, "Abort failed; re-creating the producer.");
        renew(producer, spec, metrics);
        return true;
    }
    metrics.kafka_transactions_total.with_label_values(&["aborted"]).inc();
    lost
}

fn renew(producer: &mut TxnProducer, spec: &AntifraudSpec, metrics: &Metrics) {
    if !producer.may_be_replaced() {
        // At most one producer is given up at a time: this one stays, wedged, and the
        // batch waits (holding) until its call or the earlier one returns.
        warn!(pipeline = PIPELINE, "The producer is wedged and the one given up before is still stuck; waiting.");
        return;
    }
    match new_producer(spec, metrics) {
        Ok(mut p) => {
            p.take_over(producer);
            *producer = p;
            metrics.kafka_transactions_total.with_label_values(&["producer_renewed"]).inc();
        }
        Err(e) => warn!(pipeline = PIPELINE, error = %e, "Cannot re-create the transactional producer."),
    }
}

/// Counts the records of a committed transaction by outcome.
fn record_committed(metrics: &Metrics, items: &[Item]) {
    for item in items {
        let o = &item.output;
        metrics.records_total.with_label_values(&[PIPELINE, o.outcome]).inc();
        if o.outcome == "dead_lettered" {
            let place = if item.stored { DEAD_LETTERS_TABLE } else { o.topic.as_str() };
            metrics.dlt_records_total.with_label_values(&[place]).inc();
            let r = &item.record;
            // As the other stages' dead letters are logged (`DeadLetters::publish`).
            error!(topic = %r.topic, partition = r.partition, offset = r.offset, kind = headers::dlt_kind::POISON,
                   attempts = 1, reason = o.dead_letter.as_deref().unwrap_or(""), stored_in = place, "Record dead-lettered.");
        }
    }
}

/// The `dlt_records_total` label of records stored in the `dead_letters` table.
const DEAD_LETTERS_TABLE: &str = "dead_letters";
