//! Kafka client configuration and topic creation. librdkafka settings stay librdkafka
//! settings: tally sets safe defaults, then applies `kafka.producer` / `kafka.consumer`
//! pass-through maps on top.

use std::time::Duration;

use anyhow::Context;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::error::RDKafkaErrorCode;
use tracing::info;

use crate::broker::EmbeddedBroker;
use crate::config::KafkaConfig;

/// Producer settings for the outbox publisher: idempotent, acks=all, zstd, linger 5 ms
/// (seed 001 §4), then the pass-through map.
#[must_use]
pub fn producer_config(kafka: &KafkaConfig, bootstrap: &str, client_id: &str, send_timeout_ms: u64) -> ClientConfig {
    let mut c = ClientConfig::new();
    c.set("bootstrap.servers", bootstrap)
        .set("client.id", client_id)
        .set("acks", "all")
        .set("enable.idempotence", "true")
        .set("compression.type", "zstd")
        .set("linger.ms", "5")
        .set("message.timeout.ms", send_timeout_ms.to_string());
    for (k, v) in &kafka.producer {
        c.set(k, v);
    }
    c
}

/// Creates every topic (and its `-dlt` twin) that is missing. Existing topics are left as
/// they are.
///
/// # Errors
/// When the cluster refuses to create a topic.
pub async fn create_topics(
    kafka: &KafkaConfig,
    topics: &[String],
    bootstrap: &str,
    embedded: Option<&EmbeddedBroker>,
) -> anyhow::Result<()> {
    if let Some(broker) = embedded {
        let mut created = 0;
        for topic in topics {
            if broker.create_topic_if_missing(topic, kafka.partitions, kafka.replication_factor)? {
                created += 1;
            }
        }
        info!(
            created,
            existing = topics.len() - created,
            partitions = kafka.partitions,
            "Topics ready on the embedded broker."
        );
        return Ok(());
    }
    let mut config = ClientConfig::new();
    config.set("bootstrap.servers", bootstrap);
    for (k, v) in &kafka.producer {
        config.set(k, v);
    }
    let admin: AdminClient<DefaultClientContext> = config.create().context("cannot create the Kafka admin client")?;
    let new_topics: Vec<NewTopic<'_>> = topics
        .iter()
        .map(|t| NewTopic::new(t, kafka.partitions, TopicReplication::Fixed(kafka.replication_factor)))
        .collect();
    let options = AdminOptions::new().operation_timeout(Some(Duration::from_secs(30)));
    let results = admin.create_topics(&new_topics, &options).await.context("CreateTopics request failed")?;
    for result in results {
        match result {
            Ok(topic) => info!(topic, "Created topic."),
            Err((topic, RDKafkaErrorCode::TopicAlreadyExists)) => info!(topic, "Topic exists."),
            Err((topic, code)) => anyhow::bail!("cannot create topic {topic}: {code}"),
        }
    }
    Ok(())
}
