//! `tally broker`: the standalone in-memory broker (librdkafka's mock cluster in its own
//! process) serves Kafka clients on a fixed loopback port, with every tally topic created.
#![allow(clippy::expect_used)] // tests: a failed expectation is a failed test, with its message

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::Duration;

use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::{Message, Offset, TopicPartitionList};
use tally_integration_tests::{produce, producer, tally_binary};

/// Kills the broker process however the test ends.
struct KillOnDrop(std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_standalone_broker_serves_a_fixed_port_with_every_topic() {
    let port = std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).expect("free port").port();
    let listen = format!("127.0.0.1:{port}");
    let mut child = KillOnDrop(
        Command::new(tally_binary())
            .args(["broker", "--listen", &listen])
            .env("TALLY__LOG__LEVEL", "warn")
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("start tally broker"),
    );
    let stdout = child.0.stdout.take().expect("stdout");
    let first = tokio::task::spawn_blocking(move || {
        let mut line = String::new();
        BufReader::new(stdout).read_line(&mut line).map(|_| line)
    })
    .await
    .expect("read task")
    .expect("the broker prints its bootstrap address");
    assert_eq!(first.trim(), format!("bootstrap.servers={listen}"));

    // Only the fixed address is given: metadata must advertise it too, or clients fail.
    let producer = producer(&listen);
    let (partition, offset) =
        produce(&producer, "transfers.requested", None, "K", b"hello", &[("event-type", "X")]).await;
    let listen_for_consumer = listen.clone();
    let payload = tokio::task::spawn_blocking(move || {
        let consumer: BaseConsumer = ClientConfig::new()
            .set("bootstrap.servers", &listen_for_consumer)
            .set("group.id", "broker-test")
            .create()
            .expect("consumer");
        let metadata = consumer.fetch_metadata(None, Duration::from_secs(10)).expect("metadata");
        let topics: Vec<(String, usize)> =
            metadata.topics().iter().map(|t| (t.name().to_owned(), t.partitions().len())).collect();
        let mut tpl = TopicPartitionList::new();
        tpl.add_partition_offset("transfers.requested", partition, Offset::Offset(offset)).expect("offset");
        consumer.assign(&tpl).expect("assign");
        let message = consumer.poll(Duration::from_secs(10)).expect("a record").expect("no error");
        (topics, message.payload().map(<[u8]>::to_vec))
    })
    .await
    .expect("consumer task");
    drop(child);
    let (topics, payload) = payload;
    assert_eq!(payload.as_deref(), Some(b"hello".as_slice()));
    for topic in ["transfers.requested", "transfers.requested-dlt", "orders.received", "transfers.settled-retry-1000"] {
        assert!(topics.iter().any(|(t, n)| t == topic && *n == 12), "{topic} with 12 partitions in {topics:?}");
    }
}
