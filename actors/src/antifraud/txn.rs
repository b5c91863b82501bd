//! The antifraud stage's Kafka transactions: the transactional producer, one transaction
//! per batch (outputs plus the consumer offsets), and how a failure is told apart.

use std::collections::HashMap;
use std::fmt;
use std::ops::Deref;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use rdkafka::consumer::ConsumerGroupMetadata;
use rdkafka::error::{KafkaError, KafkaResult, RDKafkaErrorCode};
use rdkafka::producer::{BaseRecord, Producer, ThreadedProducer};
use rdkafka::{Offset, TopicPartitionList};

use super::output::Output;
use super::{AntifraudSpec, PIPELINE};
use crate::metrics::Metrics;
use crate::record::Record;
use deliveries::TxnContext;
use offsets::{GiveUp, NoAnswer, OffsetsCalls};

mod deliveries;
mod offsets;

/// The transactional producer. It serves its delivery reports on a thread of its own:
/// transaction calls (abort in particular) wait until every outstanding report was served,
/// which a producer polled only by the loop could never do while the loop waits in the
/// call. It is shared with the thread that adds offsets to transactions
/// ([`send_offsets`]), which the stage's producers hand on to their successors
/// ([`TxnProducer::take_over`]); once a call of it never came back it is `wedged`. Its
/// context keeps the errors of the open transaction's failed deliveries.
pub(super) struct TxnProducer {
    producer: Arc<ThreadedProducer<TxnContext>>,
    wedged: AtomicBool,
    offsets: Mutex<OffsetsCalls>,
    metrics: Metrics,
}

impl Deref for TxnProducer {
    type Target = ThreadedProducer<TxnContext>;

    fn deref(&self) -> &Self::Target {
        &self.producer
    }
}

pub(super) fn new_producer(spec: &AntifraudSpec, metrics: &Metrics) -> KafkaResult<TxnProducer> {
    let producer: ThreadedProducer<TxnContext> = spec.producer.create_with_context(TxnContext::default())?;
    producer.init_transactions(spec.transaction_timeout)?;
    Ok(TxnProducer {
        producer: Arc::new(producer),
        wedged: AtomicBool::new(false),
        offsets: Mutex::new(OffsetsCalls::new(metrics.kafka_producers_abandoned.clone())),
        metrics: metrics.clone(),
    })
}

/// Why a transaction call failed: librdkafka said so, or the call never came back.
#[derive(Debug)]
pub(super) enum TxnError {
    Kafka(KafkaError),
    /// A call of the producer blocked past its own timeout and then as long again: the
    /// producer is wedged ([`send_offsets`]) and must be replaced.
    Wedged,
}

impl TxnError {
    /// The librdkafka error, if that is what it is.
    pub(super) fn kafka(&self) -> Option<&KafkaError> {
        match self {
            Self::Kafka(e) => Some(e),
            Self::Wedged => None,
        }
    }
}

impl fmt::Display for TxnError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Kafka(e) => e.fmt(f),
            Self::Wedged => f.write_str("a call of the transactional producer never came back: it is wedged"),
        }
    }
}

impl From<KafkaError> for TxnError {
    fn from(e: KafkaError) -> Self {
        Self::Kafka(e)
    }
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
/// transaction is open (to abort), the index of the output whose send the producer
/// refused at once, if that was the cause, and the errors of its failed deliveries.
pub(super) struct TxnFailure {
    pub error: TxnError,
    pub phase: Phase,
    pub open: bool,
    pub refused: Option<usize>,
    pub deliveries: Box<[RDKafkaErrorCode]>,
}

impl TxnFailure {
    pub(super) fn new(error: TxnError, phase: Phase, open: bool, refused: Option<usize>) -> Self {
        Self { error, phase, open, refused, deliveries: Box::default() }
    }
}

impl TxnProducer {
    /// The distinct error codes of the deliveries that failed in the open (or last)
    /// transaction.
    pub(super) fn failed_deliveries(&self) -> Box<[RDKafkaErrorCode]> {
        self.producer.context().failed().into()
    }

    /// Whether this producer may be replaced now: a call of it that never came back may
    /// be given up (none given up earlier is still stuck), or there is none.
    pub(super) fn may_be_replaced(&self) -> bool {
        self.offsets.lock().unwrap_or_else(PoisonError::into_inner).may_give_up()
    }

    /// Takes the offsets thread over from the producer this one replaces, giving up the
    /// call of it that never came back, if any: the call's thread keeps the old producer
    /// until it returns (`tally_kafka_producers_abandoned`).
    pub(super) fn take_over(&mut self, old: &mut TxnProducer) {
        let calls = old.offsets.get_mut().unwrap_or_else(PoisonError::into_inner);
        if calls.give_up() == GiveUp::Abandoned {
            tracing::warn!(
                pipeline = PIPELINE,
                "Gave up the wedged producer's call; its thread keeps it until it returns."
            );
        }
        std::mem::swap(self.offsets.get_mut().unwrap_or_else(PoisonError::into_inner), calls);
    }
}

/// What to do about a failed transaction call, as librdkafka documents its errors.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Recovery {
    /// Retriable (a timeout, say): make the same call again. A commit is resumed this way,
    /// never aborted: it may already be on its way to the coordinator.
    Retry,
    /// The transaction must be aborted; its records are produced again in a new one.
    Abort,
    /// The producer is unusable (fenced, a fatal error, or wedged): re-create it, which
    /// completes or aborts its open transaction, then redo only what the group's committed
    /// offsets say is not done.
    Renew,
}

pub(super) fn recovery(failure: &TxnFailure) -> Recovery {
    let error = match &failure.error {
        TxnError::Kafka(e) => e,
        TxnError::Wedged => return Recovery::Renew,
    };
    match error {
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
    group: &Arc<ConsumerGroupMetadata>,
    outputs: &[&Output],
    offsets: &TopicPartitionList,
    spec: &AntifraudSpec,
) -> Result<(), TxnFailure> {
    if producer.wedged.load(Ordering::Relaxed) {
        return Err(TxnFailure::new(TxnError::Wedged, Phase::Produce, false, None));
    }
    producer.context().begin();
    producer.begin_transaction().map_err(|error| TxnFailure::new(error.into(), Phase::Produce, false, None))?;
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
                Err((error, _)) => return Err(TxnFailure::new(error.into(), Phase::Produce, true, Some(index))),
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
    group: &Arc<ConsumerGroupMetadata>,
    offsets: &TopicPartitionList,
    spec: &AntifraudSpec,
    phase: Phase,
) -> Result<(), TxnFailure> {
    if phase != Phase::Commit {
        send_offsets(producer, offsets, group, spec.call_timeout)
            .map_err(|error| TxnFailure::new(error, Phase::SendOffsets, true, None))?;
    }
    let left = await_deliveries(producer, spec.call_timeout);
    producer.commit_transaction(left).map_err(|error| TxnFailure::new(error.into(), Phase::Commit, true, None))
}

/// `send_offsets_to_transaction` on the offsets thread ([`offsets`]), waited for at most
/// twice `timeout`: librdkafka 2.12 may block in it for good. Past the wait the producer is
/// marked wedged and the call fails as [`TxnError::Wedged`]: the loop re-creates the
/// producer (whose `init_transactions` fences this one and aborts its open transaction),
/// giving the call up, and redoes what the committed offsets do not cover.
///
/// A healthy call can outlast the wait too (librdkafka checks the timeout only when an
/// answer comes, and a request may take `socket.timeout.ms`): such a producer is renewed
/// all the same, which is safe (it is fenced) and costs a batch done again; a call that
/// answered by then is not given up, and its thread serves on.
fn send_offsets(
    producer: &TxnProducer,
    offsets: &TopicPartitionList,
    group: &Arc<ConsumerGroupMetadata>,
    timeout: Duration,
) -> Result<(), TxnError> {
    let (shared, offsets, group) = (Arc::clone(&producer.producer), offsets.clone(), Arc::clone(group));
    let limit = timeout.saturating_mul(2);
    let call = Box::new(move || shared.send_offsets_to_transaction(&offsets, &group, timeout));
    let mut calls = producer.offsets.lock().unwrap_or_else(PoisonError::into_inner);
    match calls.call(call, limit) {
        Ok(result) => return result.map_err(TxnError::Kafka),
        // An earlier call of this producer never came back: it is wedged already.
        Err(NoAnswer::Busy) => {}
        Err(NoAnswer::TimedOut) => {
            producer.metrics.kafka_transactions_total.with_label_values(&["producer_wedged"]).inc();
            tracing::error!(
                pipeline = PIPELINE,
                waited_ms = limit.as_millis() as u64,
                "Adding the offsets to the transaction did not come back; the producer is wedged and is re-created."
            );
        }
    }
    producer.wedged.store(true, Ordering::Relaxed);
    Err(TxnError::Wedged)
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
            defect: None,
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
