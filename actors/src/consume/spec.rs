//! What a pipeline consumes and how: its group, topics, bounds and consumer settings.

use std::time::Duration;

use rdkafka::config::ClientConfig;

/// What a pipeline consumes and how.
#[derive(Debug, Clone)]
pub struct PipelineSpec {
    /// Pipeline name, used in metrics labels and logs (e.g. `ledger`).
    pub name: String,
    pub group_id: String,
    pub topics: Vec<String>,
    /// Consumer settings ([`crate::kafka_clients::KafkaClients::group_consumer`]); the pipeline
    /// sets its group and manual offset storage on top.
    pub client: ClientConfig,
    /// Records in flight per partition; past it, as many again (at least 64) queue, and as
    /// many again are stashed before the partition stops fetching.
    pub max_in_flight: usize,
    /// Offsets at most between a partition's completed watermark and the newest record
    /// taken; past it the partition is held until the head of line completes.
    pub max_uncommitted: usize,
    /// Live keyed workers at most (least recently used idle ones are passivated first).
    pub max_live_workers: usize,
    /// Workers idle this long are passivated.
    pub idle_after: Duration,
    /// Longest wait for in-flight work when a partition is revoked or the pipeline stops.
    pub drain_timeout: Duration,
    /// How long records may wait with none finished, or the consumer stay out of a steady
    /// group, before the stage restarts from its committed offsets (see `stall.rs`).
    pub stall_after: Duration,
    /// Header holding a record's due time (epoch milliseconds), for retry topics: a record
    /// not yet due is held and its partition paused until then, without holding up other
    /// partitions.
    pub due_header: Option<String>,
    /// The keys a record's signature must be made with: a record that fails is poison
    /// (`bad signature`) and is never handed to the stage.
    pub keyring: crate::signing::Keyring,
}

impl PipelineSpec {
    /// Records a partition keeps queued for its consumer, not yet started (at least 64: a
    /// queue of one would pause and refetch per record). The stash may hold as many again
    /// before the partition stops fetching (see `stash.rs`).
    pub(super) fn queue_capacity(&self) -> usize {
        self.max_in_flight.max(64)
    }

    pub(super) fn consumer_config(&self) -> ClientConfig {
        let mut c = self.client.clone();
        // Not overridable: correctness depends on them.
        c.set("group.id", &self.group_id).set("enable.auto.offset.store", "false");
        c
    }
}
