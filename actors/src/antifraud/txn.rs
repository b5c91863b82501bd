//! The antifraud stage's Kafka transactions: the transactional producer, one transaction
//! per batch (outputs plus the consumer offsets), and how a failure is told apart.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use rdkafka::consumer::ConsumerGroupMetadata;
use rdkafka::error::{KafkaError, KafkaResult, RDKafkaErrorCode};
use rdkafka::producer::{BaseRecord, DefaultProducerContext, Producer, ThreadedProducer};
use rdkafka::{Offset, TopicPartitionList};

use super::output::Output;
use super::{AntifraudSpec, PIPELINE};
use crate::consume::Record;

/// A producer that serves its delivery reports on a thread of its own: transaction calls
/// (abort in particular) wait until every outstanding report was served, which a producer
/// polled only by the loop could never do while the loop waits in the call.
pub(super) type TxnProducer = ThreadedProducer<DefaultProducerContext>;

pub(super) fn new_producer(spec: &AntifraudSpec) -> KafkaResult<TxnProducer> {
    let producer: TxnProducer = spec.producer.create()?;
    producer.init_transactions(spec.transaction_timeout)?;
    Ok(producer)
}

/// How far a transaction got before it failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Phase {
    /// Beginning it, or producing its records.
    Produce,
    /// Adding the consumer offsets to it.
    SendOffsets,
    /// Committing it.
    Commit,
}

/// Why a transaction did not commit: the error, the phase it failed in, whether a
/// transaction is open (to abort), and the index of the output whose send the producer
/// refused at once, if that was the cause.
pub(super) struct TxnFailure {
    pub error: KafkaError,
    pub phase: Phase,
    pub open: bool,
    pub refused: Option<usize>,
}

/// What to do about a failed transaction call, as librdkafka documents its errors.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Recovery {
    /// Retriable (a timeout, say): make the same call again. A commit is resumed this way,
    /// never aborted: it may already be on its way to the coordinator.
    Retry,
    /// The transaction must be aborted; its records are produced again in a new one.
    Abort,
    /// The producer is unusable (fenced, or a fatal error): re-create it, which completes
    /// or aborts its open transaction, then redo only what the group's committed offsets
    /// say is not done.
    Renew,
}

pub(super) fn recovery(failure: &TxnFailure) -> Recovery {
    match &failure.error {
        KafkaError::Transaction(t) if t.is_fatal() => Recovery::Renew,
        KafkaError::Transaction(t) if t.txn_requires_abort() => Recovery::Abort,
        KafkaError::Transaction(t) if t.is_retriable() && failure.phase != Phase::Produce => Recovery::Retry,
        // rdkafka flushes before it commits: a flush that outlasts the call is a commit
        // still under way, as librdkafka's own flush timeout inside the commit would be.
        KafkaError::Flush(RDKafkaErrorCode::OperationTimedOut) if failure.phase == Phase::Commit => Recovery::Retry,
        _ => Recovery::Abort,
    }
}

/// Whether the error says this consumer is no longer the member whose offsets the
/// transaction carries: its batch is no longer its own to commit.
pub(super) fn lost_membership(e: &KafkaError) -> bool {
    matches!(
        e.rdkafka_error_code(),
        Some(
            RDKafkaErrorCode::UnknownMemberId
                | RDKafkaErrorCode::IllegalGeneration
                | RDKafkaErrorCode::FencedInstanceId
                | RDKafkaErrorCode::RebalanceInProgress
        )
    )
}

/// Whether a send refused at once will be refused every time: the record is too large, or
/// its topic or partition does not exist or may not be written.
pub(super) fn permanently_refused(e: &KafkaError) -> bool {
    matches!(
        e.rdkafka_error_code(),
        Some(
            RDKafkaErrorCode::MessageSizeTooLarge
                | RDKafkaErrorCode::UnknownPartition
                | RDKafkaErrorCode::UnknownTopic
                | RDKafkaErrorCode::UnknownTopicOrPartition
                | RDKafkaErrorCode::TopicAuthorizationFailed
                | RDKafkaErrorCode::InvalidRecord
                | RDKafkaErrorCode::InvalidMessageSize
        )
    )
}

/// Produces `outputs` and commits them with `offsets` in one transaction, the offsets
/// under the group metadata `group`.
pub(super) fn transact(
    producer: &TxnProducer,
    group: &ConsumerGroupMetadata,
    outputs: &[&Output],
    offsets: &TopicPartitionList,
    spec: &AntifraudSpec,
) -> Result<(), TxnFailure> {
    producer.begin_transaction().map_err(|error| TxnFailure {
        error,
        phase: Phase::Produce,
        open: false,
        refused: None,
    })?;
    for (index, o) in outputs.iter().enumerate() {
        let mut record: BaseRecord<'_, [u8], [u8]> = BaseRecord::to(&o.topic).headers(o.headers.clone());
        if let Some(p) = o.partition {
            record = record.partition(p);
        }
        if let Some(k) = &o.key {
            record = record.key(k.as_slice());
        }
        if let Some(p) = &o.payload {
            record = record.payload(p.as_slice());
        }
        let mut pending = record;
        loop {
            match producer.send(pending) {
                Ok(()) => break,
                Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), back)) => {
                    std::thread::sleep(Duration::from_millis(5));
                    pending = back;
                }
                Err((error, _)) => {
                    return Err(TxnFailure { error, phase: Phase::Produce, open: true, refused: Some(index) })
                }
            }
        }
    }
    let produced = Instant::now();
    finish(producer, group, offsets, spec, Phase::SendOffsets)?;
    tracing::debug!(
        pipeline = PIPELINE,
        records = outputs.len(),
        finish_ms = produced.elapsed().as_millis() as u64,
        "Transaction committed."
    );
    Ok(())
}

/// Completes the open transaction from `phase` on: adds the offsets, then commits. Called
/// again with the phase of a retriable failure, it resumes there. The group metadata is
/// the one taken for this transaction: should the member have moved to a new generation
/// meanwhile, the broker refuses the offsets instead of letting a batch of the old
/// generation commit.
pub(super) fn finish(
    producer: &TxnProducer,
    group: &ConsumerGroupMetadata,
    offsets: &TopicPartitionList,
    spec: &AntifraudSpec,
    phase: Phase,
) -> Result<(), TxnFailure> {
    if phase != Phase::Commit {
        producer.send_offsets_to_transaction(offsets, group, spec.call_timeout).map_err(|error| TxnFailure {
            error,
            phase: Phase::SendOffsets,
            open: true,
            refused: None,
        })?;
    }
    let left = await_deliveries(producer, spec.call_timeout);
    producer.commit_transaction(left).map_err(|error| TxnFailure {
        error,
        phase: Phase::Commit,
        open: true,
        refused: None,
    })
}

/// Waits (at most `limit`) until the broker acknowledged every record produced and the
/// producer's thread served their reports. rdkafka's `commit_transaction` flushes first,
/// and its flush, finding records still out, polls the event queue for 100 ms at a time,
/// a queue this producer's own thread serves: every commit with a record in flight (one
/// produced within `linger.ms`, i.e. nearly always) took 100 ms. Checked here every
/// millisecond instead, its flush finds nothing left. Returns what is left of `limit` (at
/// least 1 ms) for the commit call, which gives it to its flush and then to librdkafka's
/// commit: the wait adds nothing to how long a commit step may block. A flush or commit
/// that outlasts its time fails as retriable and is resumed, as before.
fn await_deliveries(producer: &TxnProducer, limit: Duration) -> Duration {
    let deadline = Instant::now() + limit;
    while producer.in_flight_count() > 0 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(1));
    }
    deadline.saturating_duration_since(Instant::now()).max(Duration::from_millis(1))
}

/// The offsets to commit: per partition, one past the highest offset of the batch.
pub(super) fn next_offsets<'a>(batch: impl IntoIterator<Item = &'a Record>) -> TopicPartitionList {
    let mut next: HashMap<(&str, i32), i64> = HashMap::new();
    for r in batch {
        let e = next.entry((r.topic.as_str(), r.partition)).or_insert(r.offset + 1);
        *e = (*e).max(r.offset + 1);
    }
    let mut tpl = TopicPartitionList::new();
    for ((topic, partition), offset) in next {
        let _ = tpl.add_partition_offset(topic, partition, Offset::Offset(offset));
    }
    tpl
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(offset: i64, partition: i32) -> Record {
        Record {
            topic: "transfers.requested".into(),
            partition,
            offset,
            key: None,
            payload: None,
            headers: vec![],
            timestamp: None,
        }
    }

    #[test]
    fn offsets_are_one_past_the_highest_per_partition() {
        let tpl = next_offsets(&[record(5, 1), record(9, 3), record(2, 3)]);
        assert_eq!(tpl.find_partition("transfers.requested", 1).map(|e| e.offset()), Some(Offset::Offset(6)));
        assert_eq!(tpl.find_partition("transfers.requested", 3).map(|e| e.offset()), Some(Offset::Offset(10)));
    }

    #[test]
    fn refusals_that_never_pass() {
        assert!(permanently_refused(&KafkaError::MessageProduction(RDKafkaErrorCode::MessageSizeTooLarge)));
        assert!(permanently_refused(&KafkaError::MessageProduction(RDKafkaErrorCode::UnknownPartition)));
        assert!(!permanently_refused(&KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull)));
        assert!(!permanently_refused(&KafkaError::MessageProduction(RDKafkaErrorCode::BrokerTransportFailure)));
    }
}
