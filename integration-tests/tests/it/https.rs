//! HTTPS listeners: the intake and admin over TLS with a test authority's certificates,
//! client certificates that name an intake client, and a certificate replaced while the
//! listener serves (on SIGHUP to a `tally run` process, and when the files change).
#![allow(clippy::expect_used)] // tests: a failed expectation is a failed test, with its message

use std::net::SocketAddr;
use std::path::Path;
use std::time::{Duration, SystemTime};

use reqwest::StatusCode;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::CertificateDer;
use serde_json::{json, Value};
use tally_engine::config::{ClientCert, Config, IntakeClientConfig};
use tally_integration_tests::tls::{path_str, Signed, TestCa};
use tally_integration_tests::{
    free_addr, json_body, spawn_tally_process, wait_until, Deadline, TallyProcess, TestApp, TestEnv,
};

/// The host name the listeners' certificates name; the clients resolve it to the listener.
const HOST: &str = "tally.test";

fn transfer(amount: i64) -> Value {
    transfer_from("acc-a", amount)
}

fn transfer_from(source: &str, amount: i64) -> Value {
    json!({ "sourceAccount": source, "destinationAccount": "acc-b", "amountCents": amount, "currency": "BRL" })
}

fn addr_of(url: &str) -> SocketAddr {
    url.rsplit('/').next().and_then(|a| a.parse().ok()).unwrap_or_else(|| panic!("no address in {url}"))
}

/// A client that trusts `ca` only, reaches [`HOST`] at `addr`, presents `identity` when
/// given, and keeps no connection (each request makes a new handshake).
fn https_client(ca: &TestCa, addr: SocketAddr, identity: Option<&Signed>) -> reqwest::Client {
    let root = std::fs::read(ca.cert_path()).expect("the CA certificate");
    let mut builder = reqwest::Client::builder()
        .tls_built_in_root_certs(false)
        .add_root_certificate(reqwest::Certificate::from_pem(&root).expect("CA PEM"))
        .resolve(HOST, addr)
        .pool_max_idle_per_host(0)
        .tls_info(true)
        .timeout(Duration::from_secs(30));
    if let Some(signed) = identity {
        let pem = format!("{}{}", signed.cert_pem, signed.key_pem);
        builder = builder.identity(reqwest::Identity::from_pem(pem.as_bytes()).expect("client identity"));
    }
    builder.build().expect("an HTTPS client")
}

fn url(addr: SocketAddr, path: &str) -> String {
    format!("https://{HOST}:{}{path}", addr.port())
}

/// The DER of the first certificate of a PEM text.
fn der_of(pem: &str) -> Vec<u8> {
    CertificateDer::from_pem_slice(pem.as_bytes()).expect("certificate PEM").to_vec()
}

/// The certificate the server at `addr` presents to a new connection.
async fn presented(ca: &TestCa, addr: SocketAddr) -> Result<Vec<u8>, String> {
    let res = https_client(ca, addr, None).get(url(addr, "/healthz")).send().await.map_err(|e| format!("{e:?}"))?;
    res.extensions()
        .get::<reqwest::tls::TlsInfo>()
        .and_then(reqwest::tls::TlsInfo::peer_certificate)
        .map(<[u8]>::to_vec)
        .ok_or_else(|| "no peer certificate".to_owned())
}

fn intake_tls(c: &mut Config, cert: &Path, key: &Path) {
    c.http.tls.cert_file = path_str(cert);
    c.http.tls.key_file = path_str(key);
}

// Broker: embedded mock cluster (publisher off: the test is about HTTP and rows).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_listeners_serve_https_and_refuse_plain_http() {
    let ca = TestCa::new("tally test authority");
    let (cert, key) = ca.write("server", &ca.sign(&[HOST]));
    let env = TestEnv::new().await;
    let app = env
        .spawn(|c| {
            c.pipelines.set("outbox", false);
            intake_tls(c, &cert, &key);
            c.http.admin_tls.cert_file = path_str(&cert);
            c.http.admin_tls.key_file = path_str(&key);
            // Its certificate names a host, not an address: a name the listener answers.
            c.http.admin_hosts = vec![HOST.to_owned()];
        })
        .await;
    env.db.open_accounts(&["acc-a"]).await;
    let intake = addr_of(&app.intake_url);
    let client = https_client(&ca, intake, None);
    let res = client.post(url(intake, "/transfers")).json(&transfer(100)).send().await.expect("POST over HTTPS");
    assert_eq!(res.status(), StatusCode::CREATED);
    assert_eq!(json_body(res).await["amountCents"], 100);

    // Plain HTTP to the same port gets no HTTP answer.
    let plain = reqwest::Client::new().post(format!("http://{intake}/transfers")).json(&transfer(200)).send().await;
    assert!(plain.is_err(), "plain HTTP to the HTTPS intake answered: {plain:?}");
    // Nor does a client that does not trust the certificate's authority.
    let stranger = TestCa::new("another authority");
    let untrusted = https_client(&stranger, intake, None).get(url(intake, "/accounts/acc-a")).send().await;
    assert!(untrusted.is_err(), "a client of another authority was served: {untrusted:?}");
    assert_eq!(env.db.count("transfers").await, 1, "only the HTTPS request wrote");

    let admin = addr_of(&app.admin_url);
    let res = https_client(&ca, admin, None).get(url(admin, "/healthz")).send().await.expect("GET /healthz over HTTPS");
    assert_eq!(res.status(), StatusCode::OK);
    assert!(reqwest::Client::new().get(format!("http://{admin}/healthz")).send().await.is_err());
}

/// A daemon (publisher off) whose intake serves HTTPS with a certificate of its own
/// server authority and verifies client certificates of a client authority, configured
/// further by `configure`: the two authorities, the environment and the daemon.
async fn cert_intake(configure: impl FnOnce(&mut Config)) -> (TestCa, TestCa, TestEnv, TestApp) {
    let servers = TestCa::new("server authority");
    let clients = TestCa::new("client authority");
    let (cert, key) = servers.write("server", &servers.sign(&[HOST]));
    let env = TestEnv::new().await;
    let app = env
        .spawn(|c| {
            c.pipelines.set("outbox", false);
            intake_tls(c, &cert, &key);
            c.http.tls.client_ca_file = path_str(&clients.cert_path());
            configure(c);
        })
        .await;
    (servers, clients, env, app)
}

fn cert_client(name: &str) -> IntakeClientConfig {
    IntakeClientConfig { name: name.into(), ..IntakeClientConfig::default() }
}

// Broker: embedded mock cluster (publisher off).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_required_client_certificate_authenticates_the_intake_client_it_names() {
    let (servers, clients, env, app) = cert_intake(|c| {
        c.http.tls.client_cert = ClientCert::Required;
        c.http.intake_auth = true;
        c.http.clients = vec![cert_client("shop"), cert_client("market")];
    })
    .await;
    env.db.open_accounts_of("shop", &["acc-a"]).await;
    let intake = addr_of(&app.intake_url);
    let post = |client: reqwest::Client| async move {
        client.post(url(intake, "/transfers")).json(&transfer(100)).send().await
    };

    let without = post(https_client(&servers, intake, None)).await;
    assert!(without.is_err(), "a connection without a client certificate was served: {without:?}");
    let foreign = TestCa::new("another client authority").sign(&["shop"]);
    let forged = post(https_client(&servers, intake, Some(&foreign))).await;
    assert!(forged.is_err(), "a certificate of another authority was accepted: {forged:?}");
    // Verified, but naming no client: the intake authenticates, so 401.
    let stranger = clients.sign(&["stranger"]);
    let res = post(https_client(&servers, intake, Some(&stranger))).await.expect("a verified stranger is answered");
    assert_eq!(res.status(), StatusCode::UNAUTHORIZED);
    assert_eq!(env.db.count("transfers").await, 0, "refused requests wrote nothing");

    let shop = clients.sign(&["shop"]);
    let res = post(https_client(&servers, intake, Some(&shop))).await.expect("the shop is answered");
    assert_eq!(res.status(), StatusCode::CREATED);
    let created = json_body(res).await;
    assert_eq!(created["client"], "shop", "the transfer records the certificate's client");
    let row: String = env.db.query("SELECT client FROM transfers", &[]).await[0].get(0);
    assert_eq!(row, "shop");
    // A DNS name of the certificate names the client too, and sees its own transfers only.
    let market = clients.sign(&["market-gateway.example", "market"]);
    let id = created["id"].as_str().expect("an id");
    let res = https_client(&servers, intake, Some(&market))
        .get(url(intake, &format!("/transfers/{id}")))
        .send()
        .await
        .expect("the market is answered");
    assert_eq!(res.status(), StatusCode::NOT_FOUND, "the market does not see the shop's transfer");
}

// Broker: embedded mock cluster (publisher off).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_optional_client_certificate_leaves_bearer_tokens_working() {
    let market: IntakeClientConfig = serde_json::from_value(json!({
        "name": "market",
        "token_sha256": hex::encode(<sha2::Sha256 as sha2::Digest>::digest(b"market-token")),
    }))
    .expect("a client");
    let (servers, clients, env, app) = cert_intake(|c| {
        c.http.intake_auth = true;
        c.http.clients = vec![cert_client("shop"), market];
    })
    .await;
    env.db.open_accounts_of("shop", &["acc-a"]).await;
    env.db.open_accounts_of("market", &["acc-m"]).await;
    let intake = addr_of(&app.intake_url);
    let anonymous = https_client(&servers, intake, None);
    let res = anonymous.post(url(intake, "/transfers")).json(&transfer(100)).send().await.expect("answered");
    assert_eq!(res.status(), StatusCode::UNAUTHORIZED, "neither a certificate nor a token");
    let res = anonymous
        .post(url(intake, "/transfers"))
        .bearer_auth("market-token")
        .json(&transfer_from("acc-m", 100))
        .send()
        .await
        .expect("answered");
    assert_eq!(res.status(), StatusCode::CREATED);
    assert_eq!(json_body(res).await["client"], "market");
    // A certificate of one client with the token of another: neither is believed.
    let shop = https_client(&servers, intake, Some(&clients.sign(&["shop"])));
    let res = shop
        .post(url(intake, "/transfers"))
        .bearer_auth("market-token")
        .json(&transfer(100))
        .send()
        .await
        .expect("answered");
    assert_eq!(res.status(), StatusCode::UNAUTHORIZED);
    let res = shop.post(url(intake, "/transfers")).json(&transfer(100)).send().await.expect("answered");
    assert_eq!(res.status(), StatusCode::CREATED);
    assert_eq!(json_body(res).await["client"], "shop");
    assert_eq!(env.db.count("transfers").await, 2);
}

/// With `http.intake_auth` off an anonymous request is served, but a verified certificate
/// that names no client, or two, is refused: a renewed certificate with another name must
/// not move a client's retries into the anonymous scope, where their keys are new.
// Broker: embedded mock cluster (publisher off).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_intake_auth_a_certificate_naming_no_client_or_two_is_refused() {
    let (servers, clients, env, app) = cert_intake(|c| {
        c.http.intake_auth = false;
        c.http.clients = vec![cert_client("shop"), cert_client("market")];
    })
    .await;
    env.db.open_accounts(&["acc-a"]).await;
    env.db.open_accounts_of("shop", &["acc-s"]).await;
    let intake = addr_of(&app.intake_url);
    let post = |identity: Option<Signed>| {
        let client = https_client(&servers, intake, identity.as_ref());
        let source = if identity.is_some() { "acc-s" } else { "acc-a" };
        async move {
            client.post(url(intake, "/transfers")).json(&transfer_from(source, 100)).send().await.expect("answered")
        }
    };
    assert_eq!(post(Some(clients.sign(&["shop-2027"]))).await.status(), StatusCode::UNAUTHORIZED);
    assert_eq!(post(Some(clients.sign(&["shop", "market"]))).await.status(), StatusCode::UNAUTHORIZED);
    assert_eq!(env.db.count("transfers").await, 0, "refused requests wrote nothing");
    assert_eq!(post(None).await.status(), StatusCode::CREATED, "no certificate: anonymous");
    let res = post(Some(clients.sign(&["shop"]))).await;
    assert_eq!(res.status(), StatusCode::CREATED);
    assert_eq!(json_body(res).await["client"], "shop");
}

/// Writes `pem` to `path` padded to a fixed size with a fixed modification time: every
/// version of the file looks the same to a watcher of sizes and times, so that only a
/// signal can make the daemon read it again.
fn write_unnoticed(path: &Path, pem: &str) {
    const SIZE: usize = 8192;
    assert!(pem.len() < SIZE, "a PEM of {} bytes", pem.len());
    let padded = format!("{pem}{}", "\n".repeat(SIZE - pem.len()));
    std::fs::write(path, padded).expect("write the file");
    let file = std::fs::File::options().write(true).open(path).expect("open the file");
    file.set_modified(SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000_000)).expect("set its time");
}

/// Waits until the server at `addr` presents `der`.
async fn wait_presented(ca: &TestCa, addr: SocketAddr, der: &[u8], what: &str) {
    wait_until(what, Deadline::DEFAULT, || async {
        match presented(ca, addr).await {
            Ok(seen) if seen == der => Ok(()),
            Ok(_) => Err("another certificate".to_owned()),
            Err(e) => Err(e),
        }
    })
    .await;
}

async fn env_with_topics() -> TestEnv {
    let env = TestEnv::new().await;
    let config = env.config();
    let specs = tally_engine::topics::topic_specs(&config);
    tally_engine::topics::prepare_topics(&config.kafka, &specs, env.bootstrap(), Some(&env.broker), true)
        .await
        .expect("create the topics");
    env
}

fn signal(child: &TallyProcess, name: &str) {
    assert!(child.signal(name), "kill -{name}");
}

// Broker: embedded mock cluster, as an external cluster of a `tally run` process.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_replaces_the_certificate_without_closing_the_listener() {
    let ca = TestCa::new("tally test authority");
    let (first, second) = (ca.sign(&[HOST]), ca.sign(&[HOST]));
    let (cert, key) = ca.write("server", &first);
    write_unnoticed(&cert, &first.cert_pem);
    write_unnoticed(&key, &first.key_pem);
    let env = env_with_topics().await;
    let (intake, admin) = (free_addr(), free_addr());
    let instance = format!("test-hup-{}", &uuid::Uuid::new_v4().simple().to_string()[..8]);
    let (cert_s, key_s) = (path_str(&cert), path_str(&key));
    let child = spawn_tally_process(
        &env,
        &[
            ("TALLY__INSTANCE__ID", &instance),
            ("TALLY__PIPELINES__OUTBOX", "false"),
            ("TALLY__HTTP__INTAKE_ADDR", &intake),
            ("TALLY__HTTP__ADMIN_ADDR", &admin),
            ("TALLY__HTTP__TLS__CERT_FILE", &cert_s),
            ("TALLY__HTTP__TLS__KEY_FILE", &key_s),
        ],
    );
    let intake: SocketAddr = intake.parse().expect("an address");
    wait_presented(&ca, intake, &der_of(&first.cert_pem), "the daemon serves the first certificate").await;
    env.db.open_accounts(&["acc-a"]).await;

    // A broken certificate: the reload fails, and the first one stays.
    write_unnoticed(&cert, "-----BEGIN CERTIFICATE-----\nbroken\n-----END CERTIFICATE-----\n");
    signal(&child, "HUP");
    wait_until("the daemon logs the failed reload", Deadline::DEFAULT, || async {
        let text = child.log_text();
        if text.contains("Cannot reload the TLS certificate") {
            Ok(())
        } else {
            Err("not yet".to_owned())
        }
    })
    .await;
    assert_eq!(presented(&ca, intake).await, Ok(der_of(&first.cert_pem)), "the first certificate stays");

    // The new pair: served from the next handshake on, by the same listener.
    write_unnoticed(&cert, &second.cert_pem);
    write_unnoticed(&key, &second.key_pem);
    signal(&child, "HUP");
    wait_presented(&ca, intake, &der_of(&second.cert_pem), "the daemon serves the second certificate").await;
    let res = https_client(&ca, intake, None)
        .post(url(intake, "/transfers"))
        .json(&transfer(100))
        .send()
        .await
        .expect("POST after the reload");
    assert_eq!(res.status(), StatusCode::CREATED);
    let text = child.log_text();
    let reloaded = text.lines().filter(|l| l.contains("Reloaded the TLS certificate"));
    assert!(reloaded.clone().count() == 1 && reloaded.clone().all(|l| l.contains("SIGHUP")), "{text}");
    drop(child);
}

// Broker: embedded mock cluster (publisher off).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_changed_certificate_file_is_served_without_a_signal() {
    let ca = TestCa::new("tally test authority");
    let (first, second) = (ca.sign(&[HOST]), ca.sign(&[HOST]));
    let (cert, key) = ca.write("server", &first);
    let env = TestEnv::new().await;
    let app: TestApp = env
        .spawn(|c| {
            c.pipelines.set("outbox", false);
            intake_tls(c, &cert, &key);
        })
        .await;
    let intake = addr_of(&app.intake_url);
    assert_eq!(presented(&ca, intake).await, Ok(der_of(&first.cert_pem)));
    let _ = ca.write("server", &second);
    wait_presented(&ca, intake, &der_of(&second.cert_pem), "the daemon serves the changed certificate").await;
}
