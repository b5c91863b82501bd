//! The embedded Kafka broker: librdkafka's mock cluster, a real Kafka-protocol server that
//! runs inside this process. `kafka.brokers = "embedded"` starts one inside
//! the daemon; `tally broker` runs one as a standalone process so that daemons can be
//! killed and restarted while the broker and its data live on.
//!
//! rdkafka's own `MockCluster` keeps its native handle private, and a fixed listening port
//! needs `rd_kafka_mock_broker_set_host_port`, so this module wraps the handful of
//! `rd_kafka_mock_*` functions tally needs. It is the only place with `unsafe` code.
#![allow(unsafe_code)]

use std::ffi::{CStr, CString};
use std::net::SocketAddr;
use std::ptr::NonNull;

use anyhow::{anyhow, bail, Context};
use rdkafka::config::ClientConfig;
use rdkafka::producer::{BaseProducer, Producer};
use rdkafka::types::RDKafkaRespErr;
use rdkafka_sys as rdsys;
use tokio::net::{TcpListener, TcpStream};
use tracing::{debug, info, warn};

/// Kafka protocol API keys used for fault injection (`request_errors`).
pub mod api_key {
    pub const PRODUCE: i16 = 0;
    pub const FETCH: i16 = 1;
    pub const OFFSET_COMMIT: i16 = 8;
    pub const INIT_PRODUCER_ID: i16 = 22;
    pub const ADD_PARTITIONS_TO_TXN: i16 = 24;
    pub const ADD_OFFSETS_TO_TXN: i16 = 25;
    pub const END_TXN: i16 = 26;
    pub const TXN_OFFSET_COMMIT: i16 = 28;
}

/// Member session and heartbeat interval of consumer-protocol (KIP-848) groups on the
/// embedded broker: those of tally's classic members (`session.timeout.ms`,
/// `heartbeat.interval.ms`), so that a member that dies is expired as soon under either
/// protocol. (The mock's own defaults are 30 s and 3 s; Kafka's are 45 s and 5 s.)
pub const CONSUMER_GROUP_SESSION_MS: i32 = 10_000;
pub const CONSUMER_GROUP_HEARTBEAT_MS: i32 = 1_000;

// Exported by the librdkafka that rdkafka-sys builds (rdkafka_mock.h), not in its bindings.
extern "C" {
    fn rd_kafka_mock_set_group_consumer_session_timeout_ms(mcluster: *mut rdsys::rd_kafka_mock_cluster_t, ms: i32);
    fn rd_kafka_mock_set_group_consumer_heartbeat_interval_ms(mcluster: *mut rdsys::rd_kafka_mock_cluster_t, ms: i32);
}

/// An in-process Kafka mock cluster. Dropping it stops the brokers.
pub struct EmbeddedBroker {
    cluster: NonNull<rdsys::rd_kafka_mock_cluster_t>,
    bootstrap: String,
    brokers: i32,
    /// The key that signs the events of daemons on this broker when no `signing.keys_dir`
    /// is set: drawn at start, it lives exactly as long as the records it signs.
    signing_key: tally_actors::signing::SigningKey,
    // The client handle the cluster was created from; it must outlive `cluster`.
    _owner: BaseProducer,
}

// SAFETY: the mock cluster runs on its own librdkafka thread. Every `rd_kafka_mock_*`
// function used here either posts an operation to that thread and waits for its reply, or
// takes the cluster's mutex (`set_host_port`), so calls from any thread are sound. The
// pointer is valid from construction until `Drop`, which is the only place that frees it.
unsafe impl Send for EmbeddedBroker {}
// SAFETY: see `Send`: no method hands out interior references, and all are thread-safe.
unsafe impl Sync for EmbeddedBroker {}

impl std::fmt::Debug for EmbeddedBroker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EmbeddedBroker").field("bootstrap", &self.bootstrap).finish()
    }
}

impl EmbeddedBroker {
    /// Starts a mock cluster of `brokers` brokers on random loopback ports.
    ///
    /// # Errors
    /// When librdkafka cannot create the cluster.
    pub fn start(brokers: i32) -> anyhow::Result<Self> {
        let signing_key = tally_actors::signing::SigningKey::random("embedded")
            .context("cannot draw the embedded broker's event-signing key")?;
        let owner: BaseProducer = ClientConfig::new()
            .set("log_level", "3")
            .create()
            .context("cannot create the mock cluster's owner client")?;
        // SAFETY: `owner.client().native_ptr()` is a live rd_kafka_t for as long as `owner`
        // lives, and `owner` is stored next to the cluster and dropped after it.
        let raw = unsafe { rdsys::rd_kafka_mock_cluster_new(owner.client().native_ptr(), brokers) };
        let cluster = NonNull::new(raw).ok_or_else(|| anyhow!("librdkafka refused to create a mock cluster"))?;
        // SAFETY: the cluster is live; the returned string is owned by it and copied here.
        let bootstrap = unsafe { CStr::from_ptr(rdsys::rd_kafka_mock_cluster_bootstraps(cluster.as_ptr())) }
            .to_string_lossy()
            .into_owned();
        // SAFETY: the cluster is live; both setters take the cluster's lock.
        unsafe {
            rd_kafka_mock_set_group_consumer_session_timeout_ms(cluster.as_ptr(), CONSUMER_GROUP_SESSION_MS);
            rd_kafka_mock_set_group_consumer_heartbeat_interval_ms(cluster.as_ptr(), CONSUMER_GROUP_HEARTBEAT_MS);
        }
        Ok(Self { cluster, bootstrap, brokers, signing_key, _owner: owner })
    }

    /// The key that signs events on this broker when `signing.keys_dir` is not set (a
    /// random one, drawn when the broker started).
    #[must_use]
    pub fn signing_key(&self) -> &tally_actors::signing::SigningKey {
        &self.signing_key
    }

    /// The `bootstrap.servers` of this cluster.
    #[must_use]
    pub fn bootstrap_servers(&self) -> &str {
        &self.bootstrap
    }

    /// Number of brokers; broker ids are `1..=brokers`.
    #[must_use]
    pub fn broker_count(&self) -> i32 {
        self.brokers
    }

    /// Creates `topic` (the mock cannot create topics through the Admin API).
    ///
    /// # Errors
    /// When the mock refuses the topic (e.g. a replication factor above the broker count).
    pub fn create_topic(&self, topic: &str, partitions: i32, replication_factor: i32) -> anyhow::Result<()> {
        let err = self.topic_create(topic, partitions, replication_factor)?;
        check(err).with_context(|| format!("cannot create topic {topic}"))
    }

    fn topic_create(&self, topic: &str, partitions: i32, replication_factor: i32) -> anyhow::Result<RDKafkaRespErr> {
        let name = CString::new(topic).context("topic name contains NUL")?;
        // SAFETY: live cluster, NUL-terminated name that outlives the call.
        Ok(unsafe {
            rdsys::rd_kafka_mock_topic_create(self.cluster.as_ptr(), name.as_ptr(), partitions, replication_factor)
        })
    }

    /// Creates `topic` unless it exists; returns whether it was created. Existing topics are
    /// left as they are (a daemon restarted on a broker that outlived it, or a second daemon
    /// on a shared broker).
    ///
    /// # Errors
    /// When the mock refuses the topic for another reason.
    pub fn create_topic_if_missing(
        &self,
        topic: &str,
        partitions: i32,
        replication_factor: i32,
    ) -> anyhow::Result<bool> {
        let err = self.topic_create(topic, partitions, replication_factor)?;
        if err == RDKafkaRespErr::RD_KAFKA_RESP_ERR_TOPIC_ALREADY_EXISTS {
            return Ok(false);
        }
        check(err).with_context(|| format!("cannot create topic {topic}"))?;
        Ok(true)
    }

    /// Takes broker `id` down (connections closed, requests refused) until [`Self::broker_up`].
    ///
    /// # Errors
    /// When there is no such broker.
    pub fn broker_down(&self, id: i32) -> anyhow::Result<()> {
        // SAFETY: live cluster.
        check(unsafe { rdsys::rd_kafka_mock_broker_set_down(self.cluster.as_ptr(), id) })
    }

    /// Makes broker `broker_id` the coordinator of `key`: a group id (`kind` "group") or a
    /// transactional id (`kind` "transaction"). Without it the mock picks one by hashing.
    ///
    /// # Errors
    /// When `kind` or `key` contains NUL, or the mock refuses.
    pub fn set_coordinator(&self, kind: &str, key: &str, broker_id: i32) -> anyhow::Result<()> {
        let kind = CString::new(kind).context("coordinator kind contains NUL")?;
        let key = CString::new(key).context("coordinator key contains NUL")?;
        // SAFETY: live cluster; NUL-terminated strings that outlive the call (the mock
        // copies them).
        check(unsafe {
            rdsys::rd_kafka_mock_coordinator_set(self.cluster.as_ptr(), kind.as_ptr(), key.as_ptr(), broker_id)
        })
    }

    /// Adds `rtt` to every answer of broker `id` (zero removes it).
    ///
    /// # Errors
    /// When there is no such broker or the delay is too long.
    pub fn set_rtt(&self, id: i32, rtt: std::time::Duration) -> anyhow::Result<()> {
        let ms = std::ffi::c_int::try_from(rtt.as_millis()).context("rtt too long")?;
        // SAFETY: live cluster.
        check(unsafe { rdsys::rd_kafka_mock_broker_set_rtt(self.cluster.as_ptr(), id, ms) })
    }

    /// Brings broker `id` back up.
    ///
    /// # Errors
    /// When there is no such broker.
    pub fn broker_up(&self, id: i32) -> anyhow::Result<()> {
        // SAFETY: live cluster.
        check(unsafe { rdsys::rd_kafka_mock_broker_set_up(self.cluster.as_ptr(), id) })
    }

    /// Takes every broker down.
    ///
    /// # Errors
    /// As [`Self::broker_down`].
    pub fn all_down(&self) -> anyhow::Result<()> {
        (1..=self.brokers).try_for_each(|id| self.broker_down(id))
    }

    /// Brings every broker up.
    ///
    /// # Errors
    /// As [`Self::broker_up`].
    pub fn all_up(&self) -> anyhow::Result<()> {
        (1..=self.brokers).try_for_each(|id| self.broker_up(id))
    }

    /// Makes the next `errors.len()` requests of protocol API `api_key` fail with `errors`,
    /// in order, cluster-wide.
    pub fn push_request_errors(&self, api_key: i16, errors: &[RDKafkaRespErr]) {
        // SAFETY: live cluster; the array is read during the call only.
        unsafe {
            rdsys::rd_kafka_mock_push_request_errors_array(
                self.cluster.as_ptr(),
                api_key,
                errors.len(),
                errors.as_ptr(),
            );
        }
    }

    /// Makes the next request of protocol API `api_key` to broker `broker_id` answer
    /// `error` (`RD_KAFKA_RESP_ERR_NO_ERROR` for a normal answer) after `rtt` more.
    ///
    /// # Errors
    /// When the broker does not exist.
    pub fn push_slow_answer(
        &self,
        broker_id: i32,
        api_key: i16,
        error: RDKafkaRespErr,
        rtt: std::time::Duration,
    ) -> anyhow::Result<()> {
        let rtt_ms = std::ffi::c_int::try_from(rtt.as_millis()).context("rtt too long")?;
        // SAFETY: live cluster. The function is variadic and reads `cnt` (error, rtt) pairs
        // as (`rd_kafka_resp_err_t`, `int`): one pair of exactly those types is passed.
        let err = unsafe {
            rdsys::rd_kafka_mock_broker_push_request_error_rtts(
                self.cluster.as_ptr(),
                broker_id,
                api_key,
                1,
                error,
                rtt_ms,
            )
        };
        if err != RDKafkaRespErr::RD_KAFKA_RESP_ERR_NO_ERROR {
            bail!("cannot slow down broker {broker_id}: {err:?}");
        }
        Ok(())
    }

    /// Makes the cluster answer for `topic` with `error` until it is set to
    /// `RD_KAFKA_RESP_ERR_NO_ERROR` again: in metadata, and when a transactional producer
    /// adds one of its partitions to a transaction. `TOPIC_AUTHORIZATION_FAILED` plays a
    /// topic that an ACL forbids writing to.
    ///
    /// # Errors
    /// When the topic name contains NUL.
    pub fn set_topic_error(&self, topic: &str, error: RDKafkaRespErr) -> anyhow::Result<()> {
        let name = CString::new(topic).context("topic name contains NUL")?;
        // SAFETY: live cluster; NUL-terminated name that outlives the call (the mock
        // copies it).
        unsafe { rdsys::rd_kafka_mock_topic_set_error(self.cluster.as_ptr(), name.as_ptr(), error) };
        Ok(())
    }

    /// Drops injected errors for `api_key` that were not consumed yet.
    pub fn clear_request_errors(&self, api_key: i16) {
        // SAFETY: live cluster.
        unsafe { rdsys::rd_kafka_mock_clear_request_errors(self.cluster.as_ptr(), api_key) }
    }

    /// Advertises broker `id` at `addr` in metadata responses, while it goes on listening
    /// where it did: for a proxy in front of it (the fixed-port forwarder, or a
    /// TLS-terminating proxy), through which clients then make every connection after the
    /// bootstrap one.
    ///
    /// # Errors
    /// When `addr`'s host cannot be passed to librdkafka.
    pub fn advertise(&self, id: i32, addr: SocketAddr) -> anyhow::Result<()> {
        let host = CString::new(addr.ip().to_string()).context("host contains NUL")?;
        // SAFETY: live cluster, NUL-terminated host that outlives the call.
        unsafe {
            rdsys::rd_kafka_mock_broker_set_host_port(self.cluster.as_ptr(), id, host.as_ptr(), i32::from(addr.port()));
        }
        Ok(())
    }

    /// Serves the single broker of this cluster on the fixed address `listen`: broker 1 is
    /// advertised at `listen`, and a loopback forwarder relays connections to the mock's
    /// own random port. Runs until the returned task is dropped or aborted.
    ///
    /// # Errors
    /// When the cluster has more than one broker or `listen` cannot be bound.
    pub async fn serve_fixed(&self, listen: SocketAddr) -> anyhow::Result<tokio::task::JoinHandle<()>> {
        if self.brokers != 1 {
            bail!("a fixed listening address needs a single-broker cluster");
        }
        let target: SocketAddr =
            self.bootstrap.parse().with_context(|| format!("unexpected mock bootstrap address {}", self.bootstrap))?;
        let listener = TcpListener::bind(listen).await.with_context(|| format!("cannot listen on {listen}"))?;
        self.advertise(1, listen)?;
        Ok(tokio::spawn(forward(listener, target)))
    }
}

impl Drop for EmbeddedBroker {
    fn drop(&mut self) {
        // SAFETY: the cluster was created by `rd_kafka_mock_cluster_new`, is destroyed once,
        // here, and its owner client is dropped afterwards (field order).
        unsafe { rdsys::rd_kafka_mock_cluster_destroy(self.cluster.as_ptr()) }
    }
}

fn check(err: RDKafkaRespErr) -> anyhow::Result<()> {
    if err == RDKafkaRespErr::RD_KAFKA_RESP_ERR_NO_ERROR {
        Ok(())
    } else {
        Err(anyhow!("mock cluster error: {}", rdkafka::error::RDKafkaErrorCode::from(err)))
    }
}

async fn forward(listener: TcpListener, target: SocketAddr) {
    loop {
        match listener.accept().await {
            Ok((mut inbound, peer)) => {
                tokio::spawn(async move {
                    match TcpStream::connect(target).await {
                        Ok(mut outbound) => {
                            let _ = inbound.set_nodelay(true);
                            let _ = outbound.set_nodelay(true);
                            if let Err(e) = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await {
                                debug!(%peer, error = %e, "Forwarded connection closed.");
                            }
                        }
                        Err(e) => warn!(%peer, %target, error = %e, "Cannot reach the mock broker."),
                    }
                });
            }
            Err(e) => {
                warn!(error = %e, "Accept failed on the broker listener.");
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            }
        }
    }
}

/// Logs where the embedded broker listens and that it keeps everything in memory.
pub fn announce(broker: &EmbeddedBroker) {
    info!(
        bootstrap = broker.bootstrap_servers(),
        brokers = broker.broker_count(),
        "Embedded Kafka broker (librdkafka mock cluster) started; other clients can connect to the bootstrap address."
    );
    warn!("The embedded broker keeps every record in memory: they are lost when the process exits. Set kafka.brokers for a real cluster.");
}
