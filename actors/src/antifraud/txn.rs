//! The antifraud stage's Kafka transactions: the transactional producer, one transaction
//! per batch (outputs plus the consumer offsets), and how a failure is told apart.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext};
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
    let mut config = ClientConfig::new();
    config.set("acks", "all").set("linger.ms", "5").set("compression.type", "zstd");
    for (k, v) in spec.producer.config_map() {
        config.set(k, v);
    }
    config
        .set("transactional.id", &spec.transactional_id)
        .set("enable.idempotence", "true")
        .set("transaction.timeout.ms", spec.transaction_timeout.as_millis().to_string());
    let producer: TxnProducer = config.create()?;
    producer.init_transactions(spec.transaction_timeout)?;
    Ok(producer)
}

/// Why a transaction did not commit: the error, and the index of the output whose send
/// the producer refused at once, if that was the cause.
pub(super) struct TxnFailure {
    pub error: KafkaError,
    pub refused: Option<usize>,
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

/// Produces `outputs` (those not `skip`ped) and commits them with `offsets` in one
/// transaction.
pub(super) fn transact<C: ConsumerContext>(
    producer: &TxnProducer,
    consumer: &BaseConsumer<C>,
    outputs: &[Output],
    skip: &[bool],
    offsets: &TopicPartitionList,
    spec: &AntifraudSpec,
) -> Result<(), TxnFailure> {
    let fail = |error| TxnFailure { error, refused: None };
    producer.begin_transaction().map_err(fail)?;
    for (index, o) in outputs.iter().enumerate() {
        if skip.get(index).copied().unwrap_or(false) {
            continue;
        }
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
                Err((error, _)) => return Err(TxnFailure { error, refused: Some(index) }),
            }
        }
    }
    // Without group metadata the offsets cannot join the transaction: abort and retry.
    let group =
        consumer.group_metadata().ok_or(KafkaError::ConsumerCommit(RDKafkaErrorCode::InvalidGroupId)).map_err(fail)?;
    let produced = Instant::now();
    producer.send_offsets_to_transaction(offsets, &group, spec.transaction_timeout).map_err(fail)?;
    let offsets_sent = Instant::now();
    producer.commit_transaction(spec.transaction_timeout).map_err(fail)?;
    tracing::debug!(
        pipeline = PIPELINE,
        records = outputs.len(),
        send_offsets_ms = (offsets_sent - produced).as_millis() as u64,
        commit_ms = offsets_sent.elapsed().as_millis() as u64,
        "Transaction committed."
    );
    Ok(())
}

/// The offsets to commit: per partition, one past the highest offset of the batch.
pub(super) fn next_offsets(batch: &[Record]) -> TopicPartitionList {
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

pub(super) fn needs_new_producer(e: &KafkaError) -> bool {
    match e {
        KafkaError::Transaction(t) => {
            t.is_fatal()
                || matches!(
                    t.code(),
                    RDKafkaErrorCode::OperationTimedOut
                        | RDKafkaErrorCode::MessageTimedOut
                        | RDKafkaErrorCode::RequestTimedOut
                )
        }
        _ => false,
    }
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
