//! Kafka over TLS: every client tally makes speaks TLS to the broker when
//! `kafka.common."security.protocol" = "SSL"`, checks the broker's certificate, and presents
//! its own when one is configured (mutual TLS).
//!
//! Broker: librdkafka's mock cluster (one broker, in this process) behind a TLS-terminating
//! proxy (socat, `scripts/ensure-socat.sh`) on another port. The broker advertises the
//! proxy's address, so after the bootstrap connection every connection a client makes goes
//! through the proxy too: a client that spoke plaintext anywhere would reach nothing. The
//! certificates come from a test authority ([`TestCa`]).
#![allow(clippy::expect_used)] // tests: a failed expectation is a failed test, with its message

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rdkafka::client::ClientContext;
use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext};
use rdkafka::error::KafkaError;
use rdkafka::producer::BaseProducer;
use reqwest::StatusCode;
use tally_engine::config::Secret;
use tally_engine::Config;
use tally_integration_tests::kafka_tls::{spawn_on_cluster, use_tls, ClientAuth, TlsBroker};
use tally_integration_tests::tls::{path_str, TestCa};
use tally_integration_tests::{
    balance_of, create_account, final_state, json_body, post_transfer, tally_binary, wait_until, Deadline,
    GroupProtocol, TestDb, TestEnv,
};

const TOKEN: &str = "kafka-tls-admin-token";

/// A daemon configuration on `db` (the harness's defaults) for `tls`'s broker.
fn config_for(db: TestDb, tls: &TlsBroker) -> (TestEnv, Config) {
    let env = TestEnv { db, broker: Arc::clone(&tls.broker), protocol: GroupProtocol::Classic };
    let mut config = env.config();
    config.http.admin_token = Secret::new(TOKEN);
    // A refused handshake fails the start's topic lookup after this long.
    config.kafka.admin_timeout = Duration::from_secs(3);
    (env, config)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_stage_speaks_mutual_tls_to_the_broker() {
    let ca = TestCa::new("tally test Kafka CA");
    let tls = TlsBroker::start(&ca, ClientAuth::Required, &Config::default());
    let (client_cert, client_key) = ca.write("tally", &ca.sign(&["tally"]));
    let (env, mut config) = config_for(TestDb::new().await, &tls);
    use_tls(&mut config, &tls, &ca.cert_path(), Some((&client_cert, &client_key)));
    let app = spawn_on_cluster(config.clone()).await.expect("the daemon starts over TLS");

    // intake -> outbox (producer) -> antifraud (consumer, transactional producer) -> ledger
    // -> outbox -> projection: each hop's client reaches the broker only through TLS.
    create_account(&app, "TLS-A", 100_000_000, "BRL").await;
    create_account(&app, "TLS-B", 0, "BRL").await;
    let ok = post_transfer(&app, "TLS-A", "TLS-B", 25_000).await;
    let blocked = post_transfer(&app, "TLS-A", "TLS-B", 20_000_000).await;
    let v = final_state(&app, ok).await;
    assert_eq!(v["status"].as_str(), Some("SETTLED"), "{v}");
    let v = final_state(&app, blocked).await;
    assert_eq!((v["status"].as_str(), v["rejectionReason"].as_str()), (Some("REJECTED"), Some("BLOCKED_BY_ANTIFRAUD")));
    assert_eq!(balance_of(&app, "TLS-A").await, 100_000_000 - 25_000);
    assert_eq!(balance_of(&app, "TLS-B").await, 25_000);

    // The DLT admin's readers (watermarks of every -dlt topic).
    let res = app.send(app.client.get(format!("{}/admin/dlt", app.admin_url)).bearer_auth(TOKEN)).await;
    let status = res.status();
    let body = json_body(res).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert!(body.to_string().contains("transfers.analyzed-dlt"), "{body}");
    app.stop().await;

    // `tally topics list`, a process of its own, configured from the environment.
    let out = std::process::Command::new(tally_binary())
        .args(["topics", "list"])
        .env("TALLY__KAFKA__BROKERS", tls.addr.to_string())
        .env("TALLY__KAFKA__ADMIN_TIMEOUT_MS", "5000")
        .env("TALLY__KAFKA__COMMON__SECURITY.PROTOCOL", "SSL")
        .env("TALLY__KAFKA__COMMON__SSL.CA.LOCATION", path_str(&ca.cert_path()))
        .env("TALLY__KAFKA__COMMON__SSL.CERTIFICATE.LOCATION", path_str(&client_cert))
        .env("TALLY__KAFKA__COMMON__SSL.KEY.LOCATION", path_str(&client_key))
        .output()
        .expect("run tally topics list");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}{}", String::from_utf8_lossy(&out.stderr));
    let requested = stdout.lines().find(|l| l.starts_with("transfers.requested ")).unwrap_or_default();
    assert_eq!(requested.split_whitespace().collect::<Vec<_>>(), ["transfers.requested", "12", "12", "source"]);
    assert!(tls.tls_sessions() > 0, "the proxy saw no TLS session:\n{}", tls.log());
    drop(env);
}

/// Records what librdkafka reports to the application (errors) and logs.
#[derive(Default, Clone)]
struct Reports(Arc<Mutex<Vec<String>>>);

impl Reports {
    fn all(&self) -> String {
        self.0.lock().map(|r| r.join("\n")).unwrap_or_default()
    }
}

impl ClientContext for Reports {
    fn log(&self, _: rdkafka::config::RDKafkaLogLevel, fac: &str, line: &str) {
        if let Ok(mut r) = self.0.lock() {
            r.push(format!("log {fac}: {line}"));
        }
    }

    fn error(&self, error: KafkaError, reason: &str) {
        if let Ok(mut r) = self.0.lock() {
            r.push(format!("error {error}: {reason}"));
        }
    }
}

impl ConsumerContext for Reports {}

/// What a DLT reader (built by tally's client builder from `config`) reports while it
/// fails to reach the broker, once a report contains `expected`.
async fn reader_reports(config: &Config, expected: &str) -> String {
    let reports = Reports::default();
    let client = config.kafka.clients(&config.kafka.brokers).reader("tally-dlt-admin", None);
    let consumer: BaseConsumer<Reports> = client.create_with_context(reports.clone()).expect("a reader");
    let metadata = tokio::task::block_in_place(|| consumer.fetch_metadata(None, Duration::from_secs(3)));
    assert!(metadata.is_err(), "the broker answered a client it should not have");
    wait_until(&format!("the reader reports {expected:?}"), Deadline::DEFAULT, || {
        let _ = consumer.poll(Duration::from_millis(10));
        let seen = reports.all();
        async move {
            if seen.contains(expected) {
                Ok(seen)
            } else {
                Err(seen)
            }
        }
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broker_certificate_from_another_authority_fails_the_handshake() {
    let ca = TestCa::new("tally test Kafka CA");
    let other = TestCa::new("someone else's CA");
    let tls = TlsBroker::start(&ca, ClientAuth::None, &Config::default());
    let (_env, mut config) = config_for(TestDb::new().await, &tls);
    use_tls(&mut config, &tls, &other.cert_path(), None);
    let seen = reader_reports(&config, "SSL handshake failed").await;
    assert!(seen.contains("certificate verify failed"), "{seen}");
    let e = spawn_on_cluster(config.clone()).await.expect_err("the daemon refuses to start");
    assert!(e.contains("cannot look the topics up"), "{e}");

    // The same broker with the right authority: the handshake was the only problem.
    use_tls(&mut config, &tls, &ca.cert_path(), None);
    let app = spawn_on_cluster(config).await.expect("the daemon starts over TLS");
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_without_its_certificate_or_without_tls_reaches_nothing() {
    let ca = TestCa::new("tally test Kafka CA");
    let tls = TlsBroker::start(&ca, ClientAuth::Required, &Config::default());
    let (_env, mut config) = config_for(TestDb::new().await, &tls);
    use_tls(&mut config, &tls, &ca.cert_path(), None);
    // The proxy asks for a certificate the client does not have: under TLS 1.3 the client
    // finishes its side of the handshake, and reads the proxy's alert on its first request.
    let seen = reader_reports(&config, "alert certificate required").await;
    assert!(!seen.contains("certificate verify failed"), "the client trusted the broker: {seen}");
    assert!(spawn_on_cluster(config.clone()).await.is_err(), "the daemon refuses to start without its certificate");
    // Plaintext to a TLS listener: the proxy drops the connection at the first request.
    config.kafka.common.clear();
    let seen = reader_reports(&config, "All broker connections are down").await;
    assert!(!seen.contains("SSL"), "a plaintext client: {seen}");
    assert!(spawn_on_cluster(config).await.is_err(), "the daemon refuses to start in plaintext");
    assert_eq!(tls.tls_sessions(), 0, "{}", tls.log());
}

/// What managed clusters ask for is accepted by this build's librdkafka, for producers and
/// group members alike. (Built without OpenSSL, creating the client failed: `Unsupported
/// value "SASL_SSL" for configuration property "security.protocol": OpenSSL not available at
/// build time`.)
#[test]
fn clients_for_sasl_over_tls_with_each_mechanism_can_be_made() {
    for mechanism in ["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "OAUTHBEARER"] {
        let mut config = Config::default();
        config.kafka.brokers = "127.0.0.1:9".into();
        let common = &mut config.kafka.common;
        common.insert("security.protocol".into(), "SASL_SSL".into());
        common.insert("sasl.mechanism".into(), mechanism.into());
        if mechanism != "OAUTHBEARER" {
            common.insert("sasl.username".into(), "tally".into());
            common.insert("sasl.password".into(), "s3cret".into());
        }
        let clients = config.kafka.clients(&config.kafka.brokers);
        let producer = clients.producer("tally-outbox", Duration::from_secs(5)).create::<BaseProducer>();
        assert!(producer.is_ok(), "{mechanism}: {:?}", producer.err());
        let member = clients.group_consumer("ledger").set("group.id", "tally-ledger").create::<BaseConsumer>();
        assert!(member.is_ok(), "{mechanism}: {:?}", member.err());
    }
}

/// Every Kafka client of the daemon and its commands takes its settings from the shared
/// builder (`tally_actors::kafka_clients::KafkaClients`), so that `kafka.common` (security) reaches
/// each one: a `ClientConfig::new()` anywhere else in the daemon's code is a client that
/// would connect in plaintext. The exceptions make no connection to the configured cluster:
/// the embedded broker's owner handle, and the bench, which runs its own loopback broker.
#[test]
fn no_kafka_client_bypasses_the_shared_builder() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let allowed = ["actors/src/kafka_clients.rs", "engine/src/broker.rs", "engine/src/bench/"];
    let mut found = Vec::new();
    let mut dirs = vec![root.join("engine/src"), root.join("actors/src")];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).expect("read a source directory") {
            let path = entry.expect("a directory entry").path();
            if path.is_dir() {
                dirs.push(path);
                continue;
            }
            let name = path.file_name().and_then(|n| n.to_str()).unwrap_or_default();
            // Unit tests build clients of their own for the embedded broker.
            if path.extension().is_none_or(|e| e != "rs") || name == "tests.rs" || name.ends_with("_tests.rs") {
                continue;
            }
            let relative = path.strip_prefix(&root).expect("under the root").to_string_lossy().replace('\\', "/");
            if allowed.iter().any(|a| relative.starts_with(a)) {
                continue;
            }
            let text = std::fs::read_to_string(&path).expect("read a source file");
            let code = text.split("#[cfg(test)]").next().unwrap_or_default();
            if ["ClientConfig::new", "ClientConfig::default", "ClientConfig::from_config_map"]
                .iter()
                .any(|c| code.contains(c))
            {
                found.push(relative);
            }
        }
    }
    assert!(found.is_empty(), "Kafka clients built without the shared builder: {found:?}");
}
