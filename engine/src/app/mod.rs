//! Wiring: builds the database pools, Kafka clients, actors and HTTP listeners from the
//! configuration, and owns the shutdown order: stop intake -> stop fetching
//! -> drain actors -> commit offsets -> flush producers -> stop HTTP.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use actix::prelude::*;
use actix_web::dev::ServerHandle;
use actix_web::web;
use anyhow::Context;
use rdkafka::producer::FutureProducer;
use tally_actors::backoff::Backoff;
use tally_actors::outbox::{self, OutboxPublisher, OutboxRelay, PublisherSettings, StopPublishing};
use tally_actors::store::group_commit::{GroupCommit, GroupCommitSettings};
use tally_actors::Metrics;
use tokio::sync::watch;
use tracing::info;

use crate::broker::{self, EmbeddedBroker};
use crate::config::{Config, DbPool};
use crate::http::intake::IntakeBatch;
use crate::http::{self, AppState};
use crate::stages;
use crate::topics;

/// Where the daemon's Kafka clients connect.
mod handle;
mod initial;
pub(crate) mod pools;

pub use handle::{spawn, DaemonHandle};
pub use pools::Pools;

#[derive(Clone)]
pub struct KafkaEndpoint {
    pub bootstrap: String,
    /// The in-process broker, when `kafka.brokers = "embedded"`; kept alive by the daemon.
    pub embedded: Option<Arc<EmbeddedBroker>>,
    /// Signs every event the daemon produces and checks every one it consumes.
    pub keyring: tally_actors::signing::Keyring,
}

impl KafkaEndpoint {
    /// Starts the embedded broker when configured (or reuses `existing`), creates the
    /// topics, and returns the endpoint.
    ///
    /// # Errors
    /// When the broker cannot start or a topic cannot be created.
    pub async fn prepare(config: &Config, existing: Option<Arc<EmbeddedBroker>>) -> anyhow::Result<Self> {
        let embedded = match existing {
            Some(b) => Some(b),
            None if config.kafka.is_embedded() => {
                let b = Arc::new(EmbeddedBroker::start(config.kafka.embedded_brokers)?);
                broker::announce(&b);
                Some(b)
            }
            None => None,
        };
        let keyring = config
            .signing
            .keyring(embedded.as_deref().map(EmbeddedBroker::signing_key))
            .context("cannot load the event-signing keys")?;
        info!(
            signing_key = keyring.signing_id(),
            accepted = keyring.accepted_ids().collect::<Vec<_>>().join(","),
            accept_unsigned = config.signing.accept_unsigned,
            "Events are signed and checked."
        );
        let bootstrap =
            embedded.as_ref().map_or_else(|| config.kafka.brokers.clone(), |b| b.bootstrap_servers().to_owned());
        let create = config.kafka.create_topics || embedded.is_some();
        topics::prepare_topics(&config.kafka, &topics::topic_specs(config), &bootstrap, embedded.as_deref(), create)
            .await?;
        if embedded.is_none() {
            // The embedded broker speaks both protocols.
            let topic = &config.kafka.topics.transfers_requested;
            topics::check_group_protocol(&config.kafka, &bootstrap, topic, &config.instance.id).await?;
        }
        Ok(Self { bootstrap, embedded, keyring })
    }
}

/// A running daemon inside an actix `System`.
pub struct Daemon {
    pub intake_addr: SocketAddr,
    pub admin_addr: SocketAddr,
    intake: ServerHandle,
    admin: ServerHandle,
    servers: Vec<tokio::task::JoinHandle<std::io::Result<()>>>,
    publisher: Option<Addr<OutboxPublisher>>,
    stages: Vec<stages::Running>,
    dlt_producer: FutureProducer,
    /// Stops the outbox's LISTEN and NOTIFY connections.
    notify_stop: watch::Sender<bool>,
    listener: Option<tokio::task::JoinHandle<()>>,
    announcer: tokio::task::JoinHandle<()>,
    kafka: KafkaEndpoint,
    /// Disconnects once the HTTP state (it holds Kafka clients) is dropped, which HTTP
    /// worker threads do a moment after the servers stopped.
    state_dropped: std::sync::mpsc::Receiver<()>,
}

/// Starts every part of the daemon. Must run inside an actix `System`; the database must
/// already be prepared ([`tally_actors::store::migrate::prepare_blocking`]). Over 80 lines
/// because it is the start order, read top to bottom: pools and producers, the stages in
/// their registry order ([`stages::STAGES`]: antifraud's fencing precedes every consumer's
/// reads), the outbox publisher, then the listeners.
///
/// # Errors
/// When a client cannot be created or a listener cannot be bound.
pub async fn start(
    config: Config,
    listeners: http::Listeners,
    kafka: KafkaEndpoint,
    expected_migrations: Vec<String>,
) -> anyhow::Result<Daemon> {
    let metrics = Metrics::new().context("cannot register metrics")?;
    let pools = Pools::build(&config)?;
    let running_pools = pools::in_use(&config);
    pools::log(&config, &running_pools);

    let producer: FutureProducer = config
        .kafka
        .clients(&kafka.bootstrap)
        .producer("tally-outbox", config.outbox.send_timeout)
        .create()
        .context("cannot create the outbox producer (check kafka.producer settings)")?;

    let dlt_producer: FutureProducer = config
        .kafka
        .clients(&kafka.bootstrap)
        .producer("tally-dlt", Duration::from_secs(30))
        .create()
        .context("cannot create the dead-letter producer (check kafka.producer settings)")?;
    // The intake and the ledger wake the publishers after their commits: this daemon's
    // through the doorbell, other daemons' through the announcer's notification, which
    // carries this daemon's own token so that its own listener can skip it.
    let wake = Arc::new(outbox::Doorbell::default());
    let commits = outbox::CommitBell::new(Arc::clone(&wake));
    let own = Arc::new(outbox::Own::new());
    let (notify_stop, notify_rx) = watch::channel(false);
    let announcer = outbox::spawn_announcer(
        config.database.connect_url(),
        commits.announcements(),
        Arc::clone(&own),
        notify_rx.clone(),
    );
    let wiring = stages::Wiring {
        config: &config,
        bootstrap: &kafka.bootstrap,
        pools: pools.clone(),
        metrics: metrics.clone(),
        dlt_producer: dlt_producer.clone(),
        outbox_commits: commits.clone(),
        keyring: kafka.keyring.clone(),
    };
    let running = stages::start_all(&wiring)?;
    let controls = running.iter().flat_map(stages::Running::controls).collect();

    let mut listener = None;
    let mut publisher = None;
    if config.pipelines.runs(crate::config::OUTBOX) {
        let relay = OutboxRelay::new(
            pools.get(DbPool::OUTBOX).clone(),
            producer.clone(),
            metrics.clone(),
            config.outbox.batch_size,
            Backoff::doubling(config.outbox.parked_retry_initial, config.outbox.parked_retry_max),
            kafka.keyring.clone(),
        );
        let settings = PublisherSettings {
            poll_interval: config.outbox.poll_interval,
            retention: config.outbox.retention,
            cleanup_interval: config.outbox.cleanup_interval,
            backoff_initial: config.outbox.backoff_initial,
            backoff_max: config.outbox.backoff_max,
            concurrency: config.outbox.concurrency,
        };
        if config.outbox.listen {
            listener = Some(outbox::spawn_listener(config.database.connect_url(), Arc::clone(&wake), own, notify_rx));
        }
        publisher = Some(OutboxPublisher::new(relay, settings, wake).start());
    } else {
        info!("Outbox publisher disabled by pipelines.outbox = false.");
    }

    let dlt_scope = tally_actors::dlt::DltScope {
        clients: config.kafka.clients(&kafka.bootstrap),
        sources: config.kafka.topics.sources().into_iter().map(str::to_owned).collect(),
    };
    let dlt_probe = Arc::new(dlt_scope.reader().context("cannot create the DLT watermark consumer")?);
    initial::publish(&config, &metrics, dlt_scope.dlt_topics().into_iter().map(|(dlt, _)| dlt));
    let (state_dropped_tx, state_dropped) = std::sync::mpsc::channel();
    let intake = GroupCommit::start(
        "intake",
        IntakeBatch { topic: config.kafka.topics.transfers_requested.clone(), committed: commits },
        pools.get(DbPool::INTAKE).clone(),
        GroupCommitSettings {
            max_batch: config.http.intake_batch_max,
            writers: config.http.intake_writers,
            max_wait: config.database.connect_timeout,
        },
        &metrics,
    );
    let throughput = crate::throughput::History::default();
    throughput.spawn_sampler(metrics.clone());
    let clients = crate::http::auth::IntakeClients::new(&config.http);
    clients.log();
    let state = web::Data::new(AppState {
        pool: pools.get(DbPool::HTTP).clone(),
        pools: pools.named(&running_pools),
        intake,
        topics: config.kafka.topics.clone(),
        metrics: metrics.clone(),
        expected_migrations,
        kafka_probe: producer,
        admin_token: config.http.admin_token.clone(),
        clients,
        intake_guard: crate::http::auth_guard::AuthGuard::new("intake", &metrics),
        admin_guard: crate::http::auth_guard::AuthGuard::new("admin", &metrics),
        max_balance_cents: config.ledger.max_balance_cents,
        currencies: crate::http::Currencies::new(&config.ledger.extra_currencies),
        bootstrap: kafka.bootstrap.clone(),
        kafka: config.kafka.clone(),
        dlt: dlt_scope,
        known_topics: config.topics_to_create(),
        stages: controls,
        dlt_probe,
        throughput,
        dropped: state_dropped_tx,
    });
    let (intake, admin) = listeners.into_parts();
    let intake = http::intake_server(state.clone(), &config.http, intake)
        .with_context(|| format!("cannot serve the intake listener on {}", config.http.intake_addr))?;
    let admin = http::admin_server(state, &config.http, admin)
        .with_context(|| format!("cannot serve the admin listener on {}", config.http.admin_addr))?;
    info!(intake = %intake.addr, admin = %admin.addr, "HTTP listeners started.");
    let daemon = Daemon {
        intake_addr: intake.addr,
        admin_addr: admin.addr,
        intake: intake.server.handle(),
        admin: admin.server.handle(),
        servers: vec![tokio::spawn(intake.server), tokio::spawn(admin.server)],
        publisher,
        stages: running,
        dlt_producer,
        notify_stop,
        listener,
        announcer,
        kafka,
        state_dropped,
    };
    Ok(daemon)
}

impl Daemon {
    /// The embedded broker, when the daemon runs one.
    #[must_use]
    pub fn embedded_broker(&self) -> Option<&Arc<EmbeddedBroker>> {
        self.kafka.embedded.as_ref()
    }

    /// Stops everything in the shutdown order, logging each step, and hands back
    /// what must outlive the actix `System`: see [`Stopped`].
    #[must_use = "call Stopped::release after the actix System has stopped"]
    pub async fn shutdown(self) -> Stopped {
        info!("Shutdown: stopping intake (no new requests).");
        self.intake.stop(true).await;
        info!(
            pipelines = self.stages.iter().map(stages::Running::len).sum::<usize>(),
            "Shutdown: stopping fetching, draining in-flight records, committing offsets."
        );
        // Concurrently: each drain is bounded by its own timeout, so the slowest pipeline,
        // not the sum of them, bounds this step. Order between stages does not matter:
        // every stage is at-least-once with idempotent effects.
        futures_util::future::join_all(self.stages.into_iter().map(stages::Running::stop)).await;
        if let Some(publisher) = self.publisher {
            info!("Shutdown: stopping the outbox publisher (finish the batch in hand, flush the producer).");
            let _ = publisher.send(StopPublishing).await;
        }
        info!("Shutdown: flushing the dead-letter producer.");
        let dlt = self.dlt_producer.clone();
        let _ = tokio::task::spawn_blocking(move || rdkafka::producer::Producer::flush(&dlt, Duration::from_secs(10)))
            .await;
        let _ = self.notify_stop.send(true);
        if let Some(listener) = self.listener {
            let _ = listener.await;
        }
        let _ = self.announcer.await;
        info!("Shutdown: stopping the admin listener.");
        self.admin.stop(true).await;
        for server in self.servers {
            let _ = server.await;
        }
        info!("Shutdown complete.");
        Stopped { kafka: self.kafka, state_dropped: self.state_dropped }
    }
}

/// A stopped daemon's Kafka endpoint. Actors hold Kafka clients until the actix `System`
/// is gone, and HTTP worker threads hold the HTTP state's clients a moment after the
/// servers stopped; an embedded broker that stops before its clients makes them log
/// `AllBrokersDown` errors. So: drop the System, then [`Stopped::release`].
pub struct Stopped {
    kafka: KafkaEndpoint,
    state_dropped: std::sync::mpsc::Receiver<()>,
}

impl Stopped {
    /// Waits (at most 5 s) until the HTTP state is dropped, then drops the endpoint: an
    /// embedded broker (when this was its last user) stops after every client.
    pub fn release(self) {
        // Nothing is ever sent: the receiver returns when the sender is dropped.
        let _ = self.state_dropped.recv_timeout(Duration::from_secs(5));
        if let Some(broker) = self.kafka.embedded {
            if Arc::strong_count(&broker) == 1 {
                info!("Stopping the embedded broker.");
            }
            drop(broker);
        }
    }
}
