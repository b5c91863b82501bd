//! The two HTTP listeners: intake (transfers, accounts, orders) and admin (health, readiness,
//! metrics, operations). Both answer errors as JSON and count requests per route.

pub mod accounts;
pub mod admin;
mod admin_dead_letters;
mod admin_dlt;
pub mod auth;
pub mod auth_guard;
pub mod connections;
mod console;
mod dlt_replays;
pub mod edge;
pub mod error;
pub mod intake;
pub mod issuances;
pub mod openapi;
pub mod orders;
pub mod tls;
mod transfer_list;

use std::net::SocketAddr;
use std::time::Instant;

use actix_web::body::MessageBody;
use actix_web::dev::{Server, ServiceRequest, ServiceResponse};
use actix_web::middleware::{from_fn, Next};
use actix_web::{web, App, HttpRequest, HttpServer};
use rdkafka::producer::FutureProducer;
use tally_actors::store::group_commit::GroupCommit;
use tally_actors::store::PgPool;
use tally_actors::Metrics;
use tally_schema::values::is_valid_traceparent;

use crate::config::{HttpConfig, Secret, TopicsConfig};

/// Shared state of both listeners.
pub struct AppState {
    /// The HTTP pool (`database.pools.http`): intake and admin requests but for the writes
    /// of `POST /transfers` (their group commit has a pool of its own).
    pub pool: PgPool,
    /// The pool of every stage that runs here, by name, for the `tally_db_pool_*` gauges.
    pub pools: Vec<(&'static str, PgPool)>,
    /// Where `POST /transfers` writes: the intake's group commit.
    pub intake: GroupCommit<intake::IntakeBatch>,
    pub topics: TopicsConfig,
    pub metrics: Metrics,
    /// Versions of the embedded migrations, for `/readyz`.
    pub expected_migrations: Vec<String>,
    /// A client used to fetch Kafka metadata for `/readyz`.
    pub kafka_probe: FutureProducer,
    pub admin_token: Secret,
    /// The intake's API clients (`http.clients`, `http.intake_auth`).
    pub clients: auth::IntakeClients,
    /// Failed authentications on each listener, by client address.
    pub intake_guard: auth_guard::AuthGuard,
    pub admin_guard: auth_guard::AuthGuard,
    /// The ceiling of balances and amounts (`ledger.max_balance_cents`).
    pub max_balance_cents: i64,
    /// The currencies of new accounts and orders.
    pub currencies: Currencies,
    /// Kafka bootstrap servers and settings, for admin operations (DLT browsing, replay).
    pub bootstrap: String,
    pub kafka: crate::config::KafkaConfig,
    /// What the DLT endpoints work on: the clients and the source topics.
    pub dlt: tally_actors::dlt::DltScope,
    /// Every topic of this configuration (sources, `-dlt` twins, retry topics): where a
    /// `dead_letters` row may be replayed to.
    pub known_topics: Vec<String>,
    /// Every running consumer stage, for `/admin/pipelines`.
    pub stages: Vec<tally_actors::consume::PipelineControl>,
    /// A long-lived assign-only consumer for DLT watermarks (`/admin/dlt`, `/metrics`), so
    /// that a scrape does not pay for a new Kafka connection. Never assigned, never commits.
    pub dlt_probe: std::sync::Arc<rdkafka::consumer::BaseConsumer>,
    /// Records and accepted transfers per interval, for `/admin/throughput`.
    pub throughput: crate::throughput::History,
    /// Keep last: fields drop in declaration order, so when this sender is dropped (its
    /// receiver disconnects) every Kafka client above is destroyed. The daemon stops an
    /// embedded broker only after that.
    pub dropped: std::sync::mpsc::Sender<()>,
}

/// The sockets of both listeners, bound before anything else starts (database, broker,
/// pipelines), so that a taken port fails the start at once.
#[derive(Debug)]
pub struct Listeners {
    intake: std::net::TcpListener,
    admin: std::net::TcpListener,
}

impl Listeners {
    /// Binds `http.intake_addr` and `http.admin_addr`.
    ///
    /// # Errors
    /// When an address cannot be bound (taken, or not this host's), naming it and its key.
    pub fn bind(config: &HttpConfig) -> anyhow::Result<Self> {
        use anyhow::Context;
        connections::raise_open_files(config);
        let bind = |addr: SocketAddr, key: &str| {
            std::net::TcpListener::bind(addr).with_context(|| format!("cannot listen on {addr} ({key})"))
        };
        Ok(Self {
            intake: bind(config.intake_addr, "http.intake_addr")?,
            admin: bind(config.admin_addr, "http.admin_addr")?,
        })
    }

    /// The intake's socket and the admin's.
    #[must_use]
    pub fn into_parts(self) -> (std::net::TcpListener, std::net::TcpListener) {
        (self.intake, self.admin)
    }
}

/// A bound, not yet running, HTTP server and its address.
pub struct Bound {
    pub server: Server,
    pub addr: SocketAddr,
}

fn json_config(limit: usize) -> web::JsonConfig {
    web::JsonConfig::default().limit(limit).error_handler(error::json_error)
}

/// The intake server on its bound socket.
///
/// # Errors
/// When the socket cannot be set up for serving.
pub fn intake_server(
    state: web::Data<AppState>,
    config: &HttpConfig,
    listener: std::net::TcpListener,
) -> std::io::Result<Bound> {
    let limit = config.body_limit_bytes;
    let edge = web::Data::new(edge::Edge {
        request_timeout: config.request_timeout,
        trusted: config.trusted_networks(),
        hosts: None,
    });
    let connections = connections::Connections::new(
        "intake",
        config.max_connections_per_address,
        config.trusted_networks(),
        &state.metrics,
    );
    let server = HttpServer::new(move || {
        App::new()
            .app_data(state.clone())
            .app_data(edge.clone())
            .app_data(json_config(limit))
            .app_data(web::PayloadConfig::new(limit))
            .app_data(web::PathConfig::default().error_handler(error::path_error))
            .app_data(web::QueryConfig::default().error_handler(error::query_error))
            .wrap(from_fn(edge::guard_requests))
            .wrap(from_fn(error::json_errors))
            .wrap(from_fn(count_requests))
            .route("/issuances", web::post().to(issuances::create_issuance))
            .route("/transfers", web::post().to(intake::create_transfer))
            .route("/transfers/{id}", web::get().to(intake::get_transfer))
            .route("/accounts", web::post().to(accounts::create_account))
            .route("/accounts/{id}", web::get().to(accounts::get_account))
            .route("/orders", web::post().to(orders::create_order))
            .route("/orders/{id}", web::get().to(orders::get_order))
            .route("/openapi.json", web::get().to(openapi::intake_document))
            .default_service(web::to(openapi::intake_fallback))
    })
    .workers(config.workers)
    .max_connections(per_worker(config.max_connections, config.workers))
    .client_request_timeout(config.request_timeout)
    .disable_signals()
    .shutdown_timeout(10)
    .on_connect(move |connection, data| {
        tls::peer_names(connection, data);
        connections.admit(connection, data);
    });
    let server = match tls::server_tls(&config.tls, "http.tls")? {
        Some(tls) => server.listen_rustls_0_23(listener, tls)?,
        None => server.listen(listener)?,
    };
    let addr = first_addr(&server.addrs(), config.intake_addr);
    Ok(Bound { server: server.run(), addr })
}

/// The admin server on its bound socket.
///
/// # Errors
/// When the socket cannot be set up for serving.
pub fn admin_server(
    state: web::Data<AppState>,
    config: &HttpConfig,
    listener: std::net::TcpListener,
) -> std::io::Result<Bound> {
    let limit = config.body_limit_bytes;
    let edge = web::Data::new(edge::Edge {
        request_timeout: config.request_timeout,
        trusted: config.trusted_networks(),
        hosts: Some(config.admin_hosts.clone()),
    });
    let server = HttpServer::new(move || {
        App::new()
            .app_data(state.clone())
            .app_data(edge.clone())
            .app_data(json_config(limit))
            .app_data(web::PathConfig::default().error_handler(error::path_error))
            .app_data(web::QueryConfig::default().error_handler(error::query_error))
            .wrap(from_fn(edge::guard_requests))
            .wrap(from_fn(error::json_errors))
            .wrap(from_fn(count_requests))
            .configure(admin::routes)
            .route("/openapi.json", web::get().to(openapi::admin_document))
            .configure(console::routes)
            .default_service(web::to(openapi::admin_fallback))
    })
    .workers(1)
    .max_connections(config.admin_max_connections)
    .client_request_timeout(config.request_timeout)
    .disable_signals()
    .shutdown_timeout(5);
    let server = match tls::server_tls(&config.admin_tls.listener(), "http.admin_tls")? {
        Some(tls) => server.listen_rustls_0_23(listener, tls)?,
        None => server.listen(listener)?,
    };
    let addr = first_addr(&server.addrs(), config.admin_addr);
    Ok(Bound { server: server.run(), addr })
}

/// Each worker's share of a listener's connection cap (actix counts per worker).
fn per_worker(total: usize, workers: usize) -> usize {
    total.div_ceil(workers.max(1)).max(1)
}

fn first_addr(addrs: &[SocketAddr], fallback: SocketAddr) -> SocketAddr {
    addrs.first().copied().unwrap_or(fallback)
}

/// Counts every request by route pattern and status, and times it.
async fn count_requests(
    req: ServiceRequest,
    next: Next<impl MessageBody>,
) -> Result<ServiceResponse<impl MessageBody>, actix_web::Error> {
    let started = Instant::now();
    let metrics = req.app_data::<web::Data<AppState>>().map(|s| s.metrics.clone());
    let route = req.match_pattern().unwrap_or_else(|| "unmatched".into());
    let res = next.call(req).await?;
    if let Some(m) = metrics {
        let status = res.status().as_u16().to_string();
        m.http_requests_total.with_label_values(&[&route, &status]).inc();
        m.http_request_seconds.with_label_values(&[&route]).observe(started.elapsed().as_secs_f64());
    }
    Ok(res)
}

/// The request's W3C `traceparent` when valid, otherwise a new trace started here.
#[must_use]
pub fn traceparent(req: &HttpRequest) -> String {
    incoming_traceparent(req).map_or_else(tally_actors::trace::new_traceparent, str::to_owned)
}

/// The request's W3C `traceparent` header, when valid.
#[must_use]
pub fn incoming_traceparent(req: &HttpRequest) -> Option<&str> {
    req.headers()
        .get(tally_schema::headers::TRACEPARENT)
        .and_then(|v| v.to_str().ok())
        .filter(|v| is_valid_traceparent(v))
}

/// The currencies of new accounts and orders: ISO 4217's active codes and
/// `ledger.extra_currencies`. (Transfers and issuances take any well-formed code: they move
/// money in the currency of accounts that exist, checked when each opened.)
#[derive(Debug, Clone, Default)]
pub struct Currencies {
    extra: std::sync::Arc<[String]>,
}

impl Currencies {
    #[must_use]
    pub fn new(extra: &[String]) -> Self {
        Self { extra: extra.into() }
    }

    /// `value` as a currency the intake accepts; `field` names it in the error.
    ///
    /// # Errors
    /// 422 for a code that is malformed, or neither active in ISO 4217 nor configured.
    pub fn parse(&self, field: &'static str, value: &str) -> Result<tally_schema::Currency, error::ApiError> {
        let currency = tally_schema::Currency::parse(field, value)?;
        if currency.is_iso_4217_active() || self.extra.iter().any(|c| c == currency.as_str()) {
            Ok(currency)
        } else {
            Err(error::ApiError::Validation(format!(
                "{field} {currency} is no currency: not an active ISO 4217 code, nor one of ledger.extra_currencies"
            )))
        }
    }
}
