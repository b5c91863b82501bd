//! Kafka transactions and group membership on a real implementation.
//!
//! Broker: noida-db (see `tally_integration_tests::noida`), a Kafka implementation with
//! real transactions, transactional offsets, fencing by `transactional.id` and static
//! membership, none of which librdkafka's mock cluster has. With `TALLY_TEST_KAFKA=host:port`
//! (`make test-kafka`) the isolation test runs against that cluster instead.
#![allow(clippy::expect_used)] // tests: a failed expectation is a failed test, with its message

use std::collections::HashMap;
use std::time::{Duration, Instant};

use tally_integration_tests::noida::{self, NoidaBroker};
use tally_integration_tests::{assert_ledger_ok, create_account, final_state, post_transfer, postings_of, TestDb};
use uuid::Uuid;

/// Records of an aborted transaction are invisible to read_committed consumers; the
/// committed ones are visible.
#[test]
fn read_committed_hides_aborted_transactions() {
    use rdkafka::producer::{BaseRecord, Producer};
    let local = std::env::var("TALLY_TEST_KAFKA").is_err().then(NoidaBroker::start);
    let bootstrap =
        local.as_ref().map_or_else(|| std::env::var("TALLY_TEST_KAFKA").unwrap_or_default(), NoidaBroker::bootstrap);
    eprintln!("broker: {}", if local.is_some() { "noida-db" } else { "TALLY_TEST_KAFKA" });
    let topic = format!("tally-isolation-{}", Uuid::new_v4().simple());
    let producer = noida::transactional_producer(&bootstrap, &format!("tally-test-{}", Uuid::new_v4().simple()));
    producer.init_transactions(Duration::from_secs(30)).expect("init");
    producer.begin_transaction().expect("begin");
    producer.send(BaseRecord::to(&topic).key("k").payload("aborted")).map_err(|(e, _)| e).expect("send");
    producer.flush(Duration::from_secs(30)).expect("flush");
    producer.abort_transaction(Duration::from_secs(30)).expect("abort");
    producer.begin_transaction().expect("begin");
    producer.send(BaseRecord::to(&topic).key("k").payload("committed")).map_err(|(e, _)| e).expect("send");
    producer.commit_transaction(Duration::from_secs(30)).expect("commit");
    let seen = noida::read_committed(&bootstrap, &topic, Duration::from_secs(3), Duration::from_secs(30));
    let payloads: Vec<_> = seen.iter().map(|r| r.payload.clone()).collect();
    assert_eq!(payloads, vec![Some(b"committed".to_vec())], "only the committed record is visible");
}

/// Every decision record visible under read_committed, by transfer id: (event id, topic).
fn decisions_seen(bootstrap: &str) -> HashMap<String, Vec<(String, String)>> {
    let mut seen: HashMap<String, Vec<(String, String)>> = HashMap::new();
    for topic in ["transfers.analyzed", "transfers.rejected"] {
        for r in noida::read_committed(bootstrap, topic, Duration::from_secs(3), Duration::from_secs(30)) {
            let json = r.payload_json();
            // The ledger's rejections share the topic; antifraud's carry derived ids of
            // their own kind and no ledger reason.
            if topic == "transfers.rejected" && json["reason"] != "BLOCKED_BY_ANTIFRAUD" {
                continue;
            }
            let id = json["transferId"].as_str().unwrap_or_default().to_owned();
            seen.entry(id).or_default().push((r.header("event-id").unwrap_or_default().to_owned(), topic.to_owned()));
        }
    }
    seen
}

/// The whole flow on a broker with real transactions: every transfer ends final, and
/// under read_committed each transfer has exactly one antifraud decision.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_flow_on_a_transactional_broker_decides_each_transfer_once() {
    let broker = NoidaBroker::start();
    let db = TestDb::new().await;
    let app = noida::spawn(&db, &broker, |_| {}).await;
    create_account(&app, "N-A", 100_000_000, "BRL").await;
    create_account(&app, "N-B", 0, "BRL").await;
    let mut ids = Vec::new();
    for i in 0..20 {
        ids.push(post_transfer(&app, "N-A", "N-B", 100 + i).await);
    }
    let blocked = post_transfer(&app, "N-A", "N-B", 20_000_000).await;
    for id in &ids {
        assert_eq!(final_state(&app, *id).await["status"], "SETTLED", "{id}");
    }
    assert_eq!(final_state(&app, blocked).await["rejectionReason"], "BLOCKED_BY_ANTIFRAUD");
    assert_eq!(postings_of(&db, blocked).await, 0);
    let seen = decisions_seen(&broker.bootstrap());
    for id in ids.iter().chain([&blocked]) {
        let records = seen.get(&id.to_string()).cloned().unwrap_or_default();
        assert_eq!(records.len(), 1, "one decision for {id} under read_committed: {records:?}");
    }
    assert_ledger_ok(&app).await;
    app.stop().await;
}

/// What tally's restart relies on: a new producer with the same `transactional.id` fences
/// the old one and aborts its open transaction, so read_committed consumers see what
/// comes after it.
#[test]
fn a_new_producer_with_the_same_transactional_id_aborts_the_open_transaction() {
    use rdkafka::producer::{BaseRecord, Producer};
    let broker = NoidaBroker::start();
    let bootstrap = broker.bootstrap();
    let topic = format!("tally-fencing-{}", Uuid::new_v4().simple());
    let id = format!("tally-test-{}", Uuid::new_v4().simple());
    let make = || noida::transactional_producer(&bootstrap, &id);
    let zombie = make();
    zombie.init_transactions(Duration::from_secs(30)).expect("init");
    zombie.begin_transaction().expect("begin");
    zombie.send(BaseRecord::to(&topic).key("k").payload("open")).map_err(|(e, _)| e).expect("send");
    zombie.flush(Duration::from_secs(30)).expect("flush");
    let successor = make();
    successor.init_transactions(Duration::from_secs(30)).expect("init fences the zombie");
    successor.begin_transaction().expect("begin");
    successor.send(BaseRecord::to(&topic).key("k").payload("after")).map_err(|(e, _)| e).expect("send");
    successor.commit_transaction(Duration::from_secs(30)).expect("commit");
    let seen = noida::read_committed(&bootstrap, &topic, Duration::from_secs(3), Duration::from_secs(30));
    let payloads: Vec<_> = seen.iter().map(|r| r.payload.clone()).collect();
    assert_eq!(payloads, vec![Some(b"after".to_vec())], "the zombie's open transaction was aborted");
    assert!(zombie.commit_transaction(Duration::from_secs(10)).is_err(), "the zombie is fenced");
}

/// What tally's restart relies on: offsets sent in a transaction that is aborted (here by
/// fencing) are not committed, so the successor re-reads that batch.
#[test]
fn offsets_of_an_aborted_transaction_are_not_committed() {
    use rdkafka::config::ClientConfig;
    use rdkafka::consumer::{BaseConsumer, Consumer};
    use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
    use rdkafka::{Offset, TopicPartitionList};
    let broker = NoidaBroker::start();
    let bootstrap = broker.bootstrap();
    let topic = format!("tally-offsets-{}", Uuid::new_v4().simple());
    let group = format!("tally-test-{}", Uuid::new_v4().simple());
    let id = format!("tally-test-{}", Uuid::new_v4().simple());
    let plain: BaseProducer = ClientConfig::new().set("bootstrap.servers", &bootstrap).create().expect("producer");
    for i in 0..10 {
        plain
            .send(BaseRecord::to(&topic).partition(0).key("k").payload(&format!("{i}")))
            .map_err(|(e, _)| e)
            .expect("send");
    }
    plain.flush(Duration::from_secs(30)).expect("flush");
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", &bootstrap)
        .set("group.id", &group)
        .set("enable.auto.commit", "false")
        .set("auto.offset.reset", "earliest")
        .create()
        .expect("consumer");
    consumer.subscribe(&[&topic]).expect("subscribe");
    let deadline = Instant::now() + Duration::from_secs(20);
    while consumer.assignment().map(|a| a.count()).unwrap_or(0) == 0 && Instant::now() < deadline {
        let _ = consumer.poll(Duration::from_millis(100));
    }
    let make = || noida::transactional_producer(&bootstrap, &id);
    let mut offsets = TopicPartitionList::new();
    offsets.add_partition_offset(&topic, 0, Offset::Offset(5)).expect("offsets");
    let group_meta = consumer.group_metadata().expect("group metadata");
    let zombie = make();
    zombie.init_transactions(Duration::from_secs(30)).expect("init");
    zombie.begin_transaction().expect("begin");
    zombie.send(BaseRecord::to(&topic).partition(0).key("k").payload("out")).map_err(|(e, _)| e).expect("send");
    zombie.send_offsets_to_transaction(&offsets, &group_meta, Duration::from_secs(30)).expect("offsets in txn");
    let successor = make();
    successor.init_transactions(Duration::from_secs(30)).expect("init fences the zombie");
    let committed = consumer.committed(Duration::from_secs(10)).expect("committed offsets");
    let at = committed.find_partition(&topic, 0).map(|e| e.offset());
    assert!(!matches!(at, Some(Offset::Offset(5))), "the aborted transaction's offsets must not be committed: {at:?}");
}

/// A read_committed consumer that resumes inside an aborted transaction (as a restarted
/// consumer does, from its committed offset) reads on past it.
#[test]
fn a_consumer_resuming_inside_an_aborted_transaction_reads_past_it() {
    use rdkafka::producer::{BaseRecord, Producer};
    let broker = NoidaBroker::start();
    let bootstrap = broker.bootstrap();
    let topic = format!("tally-resume-{}", Uuid::new_v4().simple());
    let id = format!("tally-test-{}", Uuid::new_v4().simple());
    let make = || noida::transactional_producer(&bootstrap, &id);
    let first = make();
    first.init_transactions(Duration::from_secs(30)).expect("init");
    first.begin_transaction().expect("begin");
    for i in 0..5 {
        first
            .send(BaseRecord::to(&topic).partition(0).key("k").payload(&format!("c{i}")))
            .map_err(|(e, _)| e)
            .expect("send");
    }
    first.commit_transaction(Duration::from_secs(30)).expect("commit");
    first.begin_transaction().expect("begin");
    for i in 0..5 {
        first
            .send(BaseRecord::to(&topic).partition(0).key("k").payload(&format!("z{i}")))
            .map_err(|(e, _)| e)
            .expect("send");
    }
    first.flush(Duration::from_secs(30)).expect("flush");
    let successor = make();
    successor.init_transactions(Duration::from_secs(30)).expect("init fences and aborts");
    successor.begin_transaction().expect("begin");
    for i in 0..5 {
        successor
            .send(BaseRecord::to(&topic).partition(0).key("k").payload(&format!("s{i}")))
            .map_err(|(e, _)| e)
            .expect("send");
    }
    successor.commit_transaction(Duration::from_secs(30)).expect("commit");
    let all = noida::read_committed(&bootstrap, &topic, Duration::from_secs(2), Duration::from_secs(20));
    let offsets: Vec<i64> = all.iter().map(|r| r.offset).collect();
    eprintln!("visible offsets from the start: {offsets:?}");
    // Resume at the first offset after the committed batch: inside the aborted one.
    let resume = all.iter().take(5).map(|r| r.offset).max().unwrap_or(0) + 2;
    let later = noida::read_committed_from(
        &bootstrap,
        &topic,
        rdkafka::Offset::Offset(resume),
        Duration::from_secs(3),
        Duration::from_secs(20),
    );
    let payloads: Vec<String> =
        later.iter().map(|r| String::from_utf8_lossy(r.payload.as_deref().unwrap_or_default()).into_owned()).collect();
    assert_eq!(payloads, vec!["s0", "s1", "s2", "s3", "s4"], "resumed at offset {resume}");
}

/// Topics are created with the durability settings tally asks for, read back from a broker
/// that answers DescribeConfigs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn topics_are_created_with_their_configs() {
    use rdkafka::admin::{AdminClient, AdminOptions, ResourceSpecifier};
    use rdkafka::client::DefaultClientContext;
    use rdkafka::config::ClientConfig;
    let broker = NoidaBroker::start();
    let db = TestDb::new().await;
    let app = noida::spawn(&db, &broker, |c| {
        c.kafka.retention_ms = 86_400_000;
        c.kafka.topic_configs.insert("transfers.requested-dlt".into(), [("retention.ms".into(), "-1".into())].into());
    })
    .await;
    let admin: AdminClient<DefaultClientContext> =
        ClientConfig::new().set("bootstrap.servers", broker.bootstrap()).create().expect("admin client");
    let described = admin
        .describe_configs(
            [&ResourceSpecifier::Topic("transfers.requested"), &ResourceSpecifier::Topic("transfers.requested-dlt")],
            &AdminOptions::new().request_timeout(Some(Duration::from_secs(10))),
        )
        .await
        .expect("DescribeConfigs");
    let value = |i: usize, name: &str| -> Option<String> { described.get(i)?.as_ref().ok()?.get(name)?.value.clone() };
    assert_eq!(value(0, "retention.ms").as_deref(), Some("86400000"));
    assert_eq!(value(0, "min.insync.replicas").as_deref(), Some("1"), "min(2, replication_factor = 1)");
    assert_eq!(value(1, "retention.ms").as_deref(), Some("-1"), "the per-topic override");
    app.stop().await;
}
