//! The antifraud stage (seed 001 §5): consume-transform-produce inside Kafka transactions.
//!
//! One driver thread polls `transfers.requested` (`read_committed`), scores each transfer
//! with the [`RiskEngine`], and writes `TransferAnalyzed` (score below the block limit) or
//! `TransferRejected` (BLOCKED_BY_ANTIFRAUD) keyed by the source account, with ids derived
//! from the transfer id (seed `idDerivado`). Several records form one transaction (bounded
//! by count and time): their outputs and the consumer offsets
//! (`send_offsets_to_transaction` with the group metadata) commit together. Undecodable
//! records go to the DLT inside the same transaction.
//!
//! A batch is scored once; a failed transaction is aborted and the same outputs are
//! produced again in a new one, so the risk state never counts a transfer twice. After a
//! fatal or timed-out transaction error the transactional producer is re-created. Polling
//! (and so rebalancing) happens only between transactions; records of partitions revoked
//! while a batch was gathered are dropped from it and go to the partition's new owner.
//!
//! This stage needs no per-key actors: the work per record is pure computation, and one
//! loop in partition order keeps per-key order and the transaction boundaries simple.

mod risk;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use chrono::Utc;
use rdkafka::config::{ClientConfig, RDKafkaLogLevel};
use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext, Rebalance};
use rdkafka::error::{KafkaError, KafkaResult, RDKafkaErrorCode};
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{BaseRecord, DefaultProducerContext, Producer, ThreadedProducer};
use rdkafka::{ClientContext, Offset, Statistics, TopicPartitionList};
use tally_schema::events::{derived_event_id, TransferAnalyzed, TransferRejected, TransferRequested};
use tally_schema::{headers, topics, AccountId, Currency, EventType};
use tracing::{info, warn};

pub use risk::{RiskEngine, RiskRules, RulesRiskEngine};

use crate::consume::{
    publish_lag, record_stats, Control, DriverThread, PartitionStatus, PipelineControl, PipelineStatus, Record,
    StatsView,
};
use crate::metrics::Metrics;
use crate::supervise::{dlt_headers, RetryPolicy};

/// The rejection reason of a blocked transfer.
pub const BLOCKED_BY_ANTIFRAUD: &str = "BLOCKED_BY_ANTIFRAUD";
/// Kinds of the derived event ids (seed: "analisada", "rejeitada-antifraude").
pub const ANALYZED_KIND: &str = "analyzed";
pub const REJECTED_KIND: &str = "rejected-antifraud";

const PIPELINE: &str = "antifraud";

#[derive(Debug, Clone)]
pub struct AntifraudSpec {
    pub group_id: String,
    pub input: String,
    pub analyzed: String,
    pub rejected: String,
    /// Consumer settings (bootstrap servers, pass-through properties).
    pub consumer: ClientConfig,
    /// Producer settings (bootstrap servers, pass-through properties).
    pub producer: ClientConfig,
    /// Unique per running instance.
    pub transactional_id: String,
    pub block_limit: i32,
    pub max_batch: usize,
    pub max_batch_wait: Duration,
    pub transaction_timeout: Duration,
    /// Backoff between attempts of a failed transaction.
    pub retry: RetryPolicy,
}

/// One output record, computed once per batch.
struct Output {
    topic: String,
    partition: Option<i32>,
    key: Option<Vec<u8>>,
    payload: Option<Vec<u8>>,
    headers: OwnedHeaders,
    outcome: &'static str,
}

/// Turns one input record into its output (plain logic).
fn transform(record: &Record, spec: &AntifraudSpec, risk: &mut dyn RiskEngine, metrics: &Metrics) -> Output {
    match decode(record) {
        Err(reason) => Output {
            topic: topics::dlt(&record.topic),
            partition: Some(record.partition),
            key: record.key.clone(),
            payload: record.payload.clone(),
            headers: dlt_headers(record, &spec.group_id, "poison", &reason, 1),
            outcome: "dead_lettered",
        },
        Ok(t) => {
            let score = risk.score(&t);
            metrics.antifraud_score.observe(f64::from(score));
            let (topic, id, kind, payload, outcome) = if score >= spec.block_limit {
                let id = derived_event_id(REJECTED_KIND, t.transfer_id);
                let event = TransferRejected {
                    event_id: id,
                    transfer_id: t.transfer_id,
                    reason: BLOCKED_BY_ANTIFRAUD.into(),
                    rejected_at: Utc::now(),
                };
                (&spec.rejected, id, EventType::TransferRejected, serde_json::to_vec(&event), "blocked")
            } else {
                let id = derived_event_id(ANALYZED_KIND, t.transfer_id);
                let event = TransferAnalyzed {
                    event_id: id,
                    transfer_id: t.transfer_id,
                    source_account: t.source_account.clone(),
                    destination_account: t.destination_account.clone(),
                    amount_cents: t.amount_cents,
                    currency: t.currency.clone(),
                    score,
                    analyzed_at: Utc::now(),
                };
                (&spec.analyzed, id, EventType::TransferAnalyzed, serde_json::to_vec(&event), "analyzed")
            };
            let id = id.to_string();
            let mut hdrs = OwnedHeaders::new_with_capacity(3)
                .insert(Header { key: headers::EVENT_ID, value: Some(id.as_bytes()) })
                .insert(Header { key: headers::EVENT_TYPE, value: Some(kind.as_str().as_bytes()) });
            if let Some(tp) = record.header(headers::TRACEPARENT) {
                hdrs = hdrs.insert(Header { key: headers::TRACEPARENT, value: Some(tp) });
            }
            Output {
                topic: topic.clone(),
                partition: None,
                key: Some(t.source_account.into_bytes()),
                // Serialising tally's own event types cannot fail.
                payload: payload.ok(),
                headers: hdrs,
                outcome,
            }
        }
    }
}

fn decode(record: &Record) -> Result<TransferRequested, String> {
    let payload = record.payload.as_deref().ok_or("record has no value")?;
    let t: TransferRequested =
        serde_json::from_slice(payload).map_err(|e| format!("undecodable TransferRequested: {e}"))?;
    AccountId::parse("sourceAccount", &t.source_account)
        .and_then(|_| AccountId::parse("destinationAccount", &t.destination_account))
        .and_then(|_| Currency::parse("currency", &t.currency))
        .map_err(|e| format!("invalid TransferRequested: {e}"))?;
    if t.amount_cents <= 0 {
        return Err("invalid TransferRequested: amountCents must be positive".into());
    }
    Ok(t)
}

struct AntifraudContext {
    metrics: Metrics,
    topics: Vec<String>,
    /// Partitions revoked since the loop last looked.
    revoked: Mutex<Vec<(String, i32)>>,
    stats: Mutex<StatsView>,
}

impl ClientContext for AntifraudContext {
    fn stats(&self, stats: Statistics) {
        publish_lag(&self.metrics, PIPELINE, &self.topics, &stats);
        record_stats(&self.stats, &stats);
    }
}

impl ConsumerContext for AntifraudContext {
    fn pre_rebalance(&self, _: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        if let Rebalance::Revoke(tpl) = rebalance {
            let mut revoked = self.revoked.lock().unwrap_or_else(PoisonError::into_inner);
            revoked.extend(tpl.elements().iter().map(|e| (e.topic().to_owned(), e.partition())));
        }
    }

    fn post_rebalance(&self, _: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        if let Rebalance::Assign(tpl) = rebalance {
            info!(pipeline = PIPELINE, partitions = tpl.count(), "Partitions assigned.");
        }
    }
}

/// The running antifraud stage.
pub struct Antifraud {
    handle: PipelineControl,
    driver: DriverThread,
}

impl Antifraud {
    /// Subscribes and starts the transactional loop on its own thread.
    ///
    /// # Errors
    /// When the consumer or the transactional producer cannot be created or initialised.
    pub fn start(spec: AntifraudSpec, risk: Box<dyn RiskEngine>, metrics: Metrics) -> KafkaResult<Self> {
        let mut consumer_config = ClientConfig::new();
        consumer_config
            .set("auto.offset.reset", "earliest")
            .set("statistics.interval.ms", "5000")
            .set("session.timeout.ms", "10000")
            .set("heartbeat.interval.ms", "1000")
            .set("fetch.wait.max.ms", "25")
            .set("fetch.queue.backoff.ms", "5")
            .set_log_level(RDKafkaLogLevel::Warning);
        for (k, v) in spec.consumer.config_map() {
            consumer_config.set(k, v);
        }
        consumer_config
            .set("group.id", &spec.group_id)
            .set("isolation.level", "read_committed")
            .set("enable.auto.commit", "false")
            .set("enable.auto.offset.store", "false");
        let context = AntifraudContext {
            metrics: metrics.clone(),
            topics: vec![spec.input.clone()],
            revoked: Mutex::default(),
            stats: Mutex::default(),
        };
        let status = Arc::new(Mutex::new(PipelineStatus {
            name: PIPELINE.into(),
            group: spec.group_id.clone(),
            topics: vec![spec.input.clone()],
            ..PipelineStatus::default()
        }));
        let consumer: BaseConsumer<AntifraudContext> = consumer_config.create_with_context(context)?;
        consumer.subscribe(&[&spec.input])?;
        let producer = new_producer(&spec)?;
        let stopping = Arc::new(AtomicBool::new(false));
        let stop_flag = Arc::clone(&stopping);
        let loop_status = Arc::clone(&status);
        let driver = DriverThread::spawn("tally-antifraud".into(), stopping, move |control_rx| {
            let io = LoopIo {
                consumer: &consumer,
                spec: &spec,
                metrics: &metrics,
                control: &control_rx,
                stopping: &stop_flag,
                status: &loop_status,
            };
            drive(&io, producer, risk);
        })?;
        info!(pipeline = PIPELINE, "Antifraud stage started.");
        let handle = PipelineControl::new(driver.control(), status);
        Ok(Self { handle, driver })
    }

    /// A handle to pause, resume and observe this stage.
    #[must_use]
    pub fn control(&self) -> PipelineControl {
        self.handle.clone()
    }

    /// Finishes the transaction in hand, then leaves the group.
    pub async fn stop(self) {
        self.driver.stop().await;
        info!(pipeline = PIPELINE, "Antifraud stage stopped.");
    }
}

/// A producer that serves its delivery reports on a thread of its own: transaction calls
/// (abort in particular) wait until every outstanding report was served, which a producer
/// polled only by this loop could never do while the loop waits in the call.
type TxnProducer = ThreadedProducer<DefaultProducerContext>;

fn new_producer(spec: &AntifraudSpec) -> KafkaResult<TxnProducer> {
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

/// What the antifraud loop works with, besides its producer and risk engine.
struct LoopIo<'a> {
    consumer: &'a BaseConsumer<AntifraudContext>,
    spec: &'a AntifraudSpec,
    metrics: &'a Metrics,
    control: &'a std::sync::mpsc::Receiver<Control>,
    stopping: &'a AtomicBool,
    status: &'a Mutex<PipelineStatus>,
}

fn drive(io: &LoopIo<'_>, mut producer: TxnProducer, mut risk: Box<dyn RiskEngine>) {
    let LoopIo { consumer, spec, metrics, control, stopping, status } = *io;
    let mut last_status = Instant::now();
    loop {
        if last_status.elapsed() >= Duration::from_millis(500) {
            last_status = Instant::now();
            publish_status(consumer, status);
        }
        while let Ok(c) = control.try_recv() {
            match c {
                Control::Stop(done) => {
                    consumer.unsubscribe();
                    let _ = producer.flush(Duration::from_secs(10));
                    let _ = done.send(());
                    return;
                }
                Control::Pause(applied) => {
                    if let Ok(tpl) = consumer.assignment() {
                        let _ = consumer.pause(&tpl);
                    }
                    status.lock().unwrap_or_else(PoisonError::into_inner).paused = true;
                    info!(pipeline = PIPELINE, "Pipeline paused.");
                    let _ = applied.send(());
                }
                Control::Resume(applied) => {
                    if let Ok(tpl) = consumer.assignment() {
                        let _ = consumer.resume(&tpl);
                    }
                    status.lock().unwrap_or_else(PoisonError::into_inner).paused = false;
                    info!(pipeline = PIPELINE, "Pipeline resumed.");
                    let _ = applied.send(());
                }
            }
        }
        let batch = gather(consumer, spec);
        if batch.is_empty() {
            continue;
        }
        metrics.inflight.with_label_values(&[PIPELINE, "all"]).set(batch.len() as i64);
        let outputs: Vec<Output> = batch.iter().map(|r| transform(r, spec, risk.as_mut(), metrics)).collect();
        let offsets = next_offsets(&batch);
        let mut attempt = 0_u32;
        loop {
            match transact(&producer, consumer, &outputs, &offsets, spec) {
                Ok(()) => {
                    metrics.kafka_transactions_total.with_label_values(&["committed"]).inc();
                    for o in &outputs {
                        metrics.records_total.with_label_values(&[PIPELINE, o.outcome]).inc();
                        if o.outcome == "dead_lettered" {
                            metrics.dlt_records_total.with_label_values(&[&o.topic]).inc();
                        }
                    }
                    break;
                }
                Err(e) => {
                    metrics.kafka_transactions_total.with_label_values(&["aborted"]).inc();
                    attempt += 1;
                    let renew = needs_new_producer(&e);
                    warn!(pipeline = PIPELINE, error = %e, attempt, records = outputs.len(), renew,
                          "Transaction failed; aborting and producing the batch again.");
                    if renew {
                        match new_producer(spec) {
                            Ok(p) => producer = p,
                            Err(e) => {
                                warn!(pipeline = PIPELINE, error = %e, "Cannot re-create the transactional producer.")
                            }
                        }
                    } else if let Err(e) = producer.abort_transaction(spec.transaction_timeout) {
                        warn!(pipeline = PIPELINE, error = %e, "Abort failed; re-creating the producer.");
                        if let Ok(p) = new_producer(spec) {
                            producer = p;
                        }
                    }
                    if stopping.load(Ordering::Relaxed) {
                        // Uncommitted: the batch is redelivered to whoever consumes next.
                        // Return rather than gather again, so no later transaction commits
                        // offsets past this batch.
                        return;
                    }
                    // Broker trouble is nobody's record's fault: retry with capped backoff.
                    let wait = spec.retry.backoff(attempt.min(spec.retry.max_retries.max(1))).unwrap_or(spec.retry.max);
                    metrics.retries_total.with_label_values(&[PIPELINE]).inc();
                    std::thread::sleep(wait);
                }
            }
        }
        metrics.inflight.with_label_values(&[PIPELINE, "all"]).set(0);
    }
}

fn publish_status(consumer: &BaseConsumer<AntifraudContext>, status: &Mutex<PipelineStatus>) {
    let stats = consumer.context().stats.lock().unwrap_or_else(PoisonError::into_inner).clone();
    let partitions: Vec<PartitionStatus> = consumer
        .assignment()
        .map(|tpl| {
            tpl.elements()
                .iter()
                .map(|e| {
                    let (committed, lag) =
                        stats.get(&(e.topic().to_owned(), e.partition())).copied().unwrap_or((-1, -1));
                    PartitionStatus {
                        topic: e.topic().to_owned(),
                        partition: e.partition(),
                        committed_offset: (committed >= 0).then_some(committed),
                        stored_offset: None,
                        lag: (lag >= 0).then_some(lag),
                        in_flight: 0,
                        held: false,
                    }
                })
                .collect()
        })
        .unwrap_or_default();
    status.lock().unwrap_or_else(PoisonError::into_inner).partitions = partitions;
}

/// Polls until `max_batch` records or `max_batch_wait` after the first one.
fn gather(consumer: &BaseConsumer<AntifraudContext>, spec: &AntifraudSpec) -> Vec<Record> {
    let mut batch = Vec::new();
    let mut deadline: Option<Instant> = None;
    while batch.len() < spec.max_batch {
        let timeout = deadline.map_or(Duration::from_millis(100), |d| d.saturating_duration_since(Instant::now()));
        let polled = consumer.poll(timeout);
        // Rebalance callbacks ran inside that poll: records gathered earlier from a
        // revoked partition are no longer ours to commit (the partition's owner reads them
        // again from the committed offset, even when that owner is this consumer again).
        // The record the poll returned comes after the rebalance and is kept.
        let revoked = std::mem::take(&mut *consumer.context().revoked.lock().unwrap_or_else(PoisonError::into_inner));
        if !revoked.is_empty() {
            batch.retain(|r: &Record| !revoked.iter().any(|(t, p)| *t == r.topic && *p == r.partition));
        }
        match polled {
            Some(Ok(m)) => {
                batch.push(Record::from_message(&m));
                deadline.get_or_insert_with(|| Instant::now() + spec.max_batch_wait);
            }
            Some(Err(e)) => warn!(pipeline = PIPELINE, error = %e, "Consumer error."),
            None => {}
        }
        if deadline.is_none_or(|d| Instant::now() >= d) {
            break;
        }
    }
    batch
}

/// The offsets to commit: per partition, one past the highest offset of the batch.
fn next_offsets(batch: &[Record]) -> TopicPartitionList {
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

fn transact(
    producer: &TxnProducer,
    consumer: &BaseConsumer<AntifraudContext>,
    outputs: &[Output],
    offsets: &TopicPartitionList,
    spec: &AntifraudSpec,
) -> KafkaResult<()> {
    producer.begin_transaction()?;
    for o in outputs {
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
                Err((e, _)) => return Err(e),
            }
        }
    }
    // Without group metadata the offsets cannot join the transaction: abort and retry.
    let group = consumer.group_metadata().ok_or(KafkaError::ConsumerCommit(RDKafkaErrorCode::InvalidGroupId))?;
    let produced = Instant::now();
    producer.send_offsets_to_transaction(offsets, &group, spec.transaction_timeout)?;
    let offsets_sent = Instant::now();
    producer.commit_transaction(spec.transaction_timeout)?;
    tracing::debug!(
        pipeline = PIPELINE,
        records = outputs.len(),
        send_offsets_ms = (offsets_sent - produced).as_millis() as u64,
        commit_ms = offsets_sent.elapsed().as_millis() as u64,
        "Transaction committed."
    );
    Ok(())
}

fn needs_new_producer(e: &KafkaError) -> bool {
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

    fn spec() -> AntifraudSpec {
        AntifraudSpec {
            group_id: "g".into(),
            input: "transfers.requested".into(),
            analyzed: "transfers.analyzed".into(),
            rejected: "transfers.rejected".into(),
            consumer: ClientConfig::new(),
            producer: ClientConfig::new(),
            transactional_id: "t".into(),
            block_limit: 80,
            max_batch: 10,
            max_batch_wait: Duration::from_millis(10),
            transaction_timeout: Duration::from_secs(10),
            retry: RetryPolicy::default(),
        }
    }

    fn record(payload: &str, offset: i64) -> Record {
        Record {
            topic: "transfers.requested".into(),
            partition: 3,
            offset,
            key: Some(b"A".to_vec()),
            payload: Some(payload.as_bytes().to_vec()),
            headers: vec![(
                "traceparent".into(),
                Some(b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01".to_vec()),
            )],
            timestamp: Some(1),
        }
    }

    fn requested(amount: i64) -> String {
        format!(
            r#"{{"eventId":"00000000-0000-0000-0000-000000000001","transferId":"00000000-0000-0000-0000-000000000002","sourceAccount":"A","destinationAccount":"B","amountCents":{amount},"currency":"BRL","requestedAt":"2026-01-01T00:00:00Z"}}"#
        )
    }

    #[test]
    fn scores_route_to_analyzed_or_rejected_with_derived_ids() {
        let metrics = Metrics::new().unwrap();
        let mut risk = RulesRiskEngine::new(RiskRules::default());
        let spec = spec();
        let ok = transform(&record(&requested(100), 0), &spec, &mut risk, &metrics);
        assert_eq!((ok.topic.as_str(), ok.outcome), ("transfers.analyzed", "analyzed"));
        let json: serde_json::Value = serde_json::from_slice(ok.payload.as_deref().unwrap()).unwrap();
        let tid = uuid::Uuid::from_u128(2);
        assert_eq!(json["eventId"], serde_json::json!(derived_event_id(ANALYZED_KIND, tid)));
        assert_eq!(json["score"], 5);
        assert_eq!(ok.key.as_deref(), Some(b"A".as_slice()));
        let blocked = transform(&record(&requested(10_000_000), 1), &spec, &mut risk, &metrics);
        assert_eq!((blocked.topic.as_str(), blocked.outcome), ("transfers.rejected", "blocked"));
        let json: serde_json::Value = serde_json::from_slice(blocked.payload.as_deref().unwrap()).unwrap();
        assert_eq!(json["reason"], BLOCKED_BY_ANTIFRAUD);
        assert_eq!(json["eventId"], serde_json::json!(derived_event_id(REJECTED_KIND, tid)));
    }

    #[test]
    fn poison_goes_to_the_dlt_on_the_same_partition() {
        let metrics = Metrics::new().unwrap();
        let mut risk = RulesRiskEngine::new(RiskRules::default());
        let out = transform(&record("{nope", 7), &spec(), &mut risk, &metrics);
        assert_eq!(
            (out.topic.as_str(), out.partition, out.outcome),
            ("transfers.requested-dlt", Some(3), "dead_lettered")
        );
    }

    #[test]
    fn offsets_are_one_past_the_highest_per_partition() {
        let mut a = record("x", 5);
        let b = record("x", 9);
        a.partition = 1;
        let tpl = next_offsets(&[a, b.clone(), record("x", 2)]);
        assert_eq!(tpl.find_partition("transfers.requested", 1).map(|e| e.offset()), Some(Offset::Offset(6)));
        assert_eq!(tpl.find_partition("transfers.requested", 3).map(|e| e.offset()), Some(Offset::Offset(10)));
    }
}
