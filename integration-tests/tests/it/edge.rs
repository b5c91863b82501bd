//! The edge holds: a request that does not arrive in time is answered 408 and closed, one
//! address cannot hold more connections than its cap, a flood leaves `/readyz` answering,
//! failed authentication makes its address wait, and the admin listener answers only its
//! own host names.
//!
//! Client sockets bind other loopback addresses (127.0.0.2, ...) to play other clients.
//! Broker: the embedded broker (librdkafka's mock cluster, in this process).
#![allow(clippy::expect_used)] // tests: a failed expectation is a failed test, with its message

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use reqwest::StatusCode;
use sha2::{Digest, Sha256};
use tally_engine::config::IntakeClientConfig;
use tally_integration_tests::{metric_value, spawn_app, wait_until, Deadline, TestApp};

/// A connection to `to` from loopback address `from`.
fn connect_from(from: [u8; 4], to: SocketAddr) -> TcpStream {
    let socket = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).expect("socket");
    socket.bind(&SocketAddr::from((from, 0)).into()).expect("bind a loopback address");
    socket.connect(&to.into()).expect("connect");
    socket.into()
}

fn intake_addr(app: &TestApp) -> SocketAddr {
    app.intake_url.trim_start_matches("http://").parse().expect("intake address")
}

/// Whether the server closed `stream` (EOF or reset) within `within`, before answering.
fn closed_within(stream: &mut TcpStream, within: Duration) -> bool {
    stream.set_read_timeout(Some(within)).expect("read timeout");
    let mut buf = [0u8; 256];
    match stream.read(&mut buf) {
        Ok(0) => true,
        Ok(_) => false,
        Err(e) => !matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut),
    }
}

async fn readyz(app: &TestApp) -> StatusCode {
    app.admin_get("/readyz").await.status()
}

/// A body trickled byte by byte is cut at the deadline: 408, the connection closed, nothing
/// written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_that_does_not_arrive_in_time_is_answered_408_and_closed() {
    let (env, app) = spawn_app(|c| c.http.request_timeout = Duration::from_millis(1_000)).await;
    let addr = intake_addr(&app);
    let answer = tokio::task::spawn_blocking(move || {
        let mut s = connect_from([127, 0, 0, 1], addr);
        s.write_all(
            b"POST /transfers HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 50\r\n\r\n{",
        )
        .expect("headers and one byte");
        let started = Instant::now();
        // One more byte now and then, well within any per-read timeout.
        let mut answer = Vec::new();
        s.set_read_timeout(Some(Duration::from_millis(300))).expect("read timeout");
        let mut buf = [0u8; 1024];
        while started.elapsed() < Duration::from_secs(30) {
            match s.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => answer.extend_from_slice(&buf[..n]),
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    let _ = s.write_all(b" ");
                }
                Err(_) => break,
            }
        }
        String::from_utf8_lossy(&answer).into_owned()
    })
    .await
    .expect("the slow client");
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    assert!(answer.contains("request_timeout"), "{answer}");
    assert!(answer.to_ascii_lowercase().contains("connection: close"), "{answer}");
    assert_eq!(env.db.count("transfers").await, 0, "nothing written");
}

/// One address past its cap has every further connection closed at once; others, and the
/// admin listener, go on serving.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_address_cannot_hold_more_connections_than_its_cap() {
    const CAP: usize = 8;
    let (_env, app) = spawn_app(|c| {
        c.http.max_connections_per_address = CAP;
        c.http.request_timeout = Duration::from_secs(60);
    })
    .await;
    let addr = intake_addr(&app);
    let (held, refused) = tokio::task::spawn_blocking(move || {
        let held: Vec<TcpStream> = (0..CAP).map(|_| connect_from([127, 0, 0, 2], addr)).collect();
        // Let the server count them.
        std::thread::sleep(Duration::from_millis(500));
        let mut extra: Vec<TcpStream> = (0..40).map(|_| connect_from([127, 0, 0, 2], addr)).collect();
        let refused =
            extra.iter_mut().map(|s| closed_within(s, Duration::from_secs(5))).filter(|closed| *closed).count();
        (held, refused)
    })
    .await
    .expect("the flooding client");
    assert_eq!(refused, 40, "every connection past the cap is closed at once");
    // Another address is served, and so is the admin listener.
    let res = app
        .post_json("/accounts", &serde_json::json!({ "id": "EDGE-1", "currency": "BRL", "initialBalanceCents": 0 }))
        .await;
    assert_eq!(res.status(), StatusCode::CREATED);
    assert_ne!(readyz(&app).await, StatusCode::INTERNAL_SERVER_ERROR);
    let metrics = app.metrics().await;
    let counted = metric_value(&metrics, r#"tally_http_connections_refused_total{listener="intake"}"#);
    assert_eq!(counted, Some(40.0));
    drop(held);
}

/// Slow connections from many addresses fill the intake's cap: the admin listener still
/// answers `/readyz` and `/metrics` at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flooded_intake_leaves_readyz_answering() {
    let (_env, app) = spawn_app(|c| {
        c.http.max_connections = 64;
        c.http.max_connections_per_address = 4;
        c.http.request_timeout = Duration::from_secs(60);
    })
    .await;
    wait_until("the daemon is ready", Deadline::DEFAULT, || async {
        match readyz(&app).await {
            StatusCode::OK => Ok(()),
            other => Err(other.to_string()),
        }
    })
    .await;
    let addr = intake_addr(&app);
    let held = tokio::task::spawn_blocking(move || {
        // 150 slow clients on 50 addresses, headers never finished: 64 taken, the rest in
        // the listen backlog (128, std's), where a connect completes without being taken.
        (0..150_u8)
            .map(|i| {
                let mut s = connect_from([127, 0, 1, 1 + i % 50], addr);
                let _ = s.write_all(b"POST /transfers HTTP/1.1\r\nHost: x\r\n");
                s
            })
            .collect::<Vec<_>>()
    })
    .await
    .expect("the flood");
    for _ in 0..5 {
        let started = Instant::now();
        assert_eq!(readyz(&app).await, StatusCode::OK, "readiness answers as before the flood");
        assert!(app.metrics().await.contains("tally_http_requests_total"));
        assert!(started.elapsed() < Duration::from_secs(10), "answered while flooded");
    }
    drop(held);
}

fn token_client(name: &str) -> IntakeClientConfig {
    IntakeClientConfig {
        name: name.into(),
        token_sha256: vec![tally_engine::config::Secret::new(hex::encode(Sha256::digest(
            format!("{name}-token").as_bytes(),
        )))],
        ..IntakeClientConfig::default()
    }
}

/// Wrong tokens from one address: each counted; past ten the address waits (429 with
/// Retry-After, even with a right token); another address is not held; the admin
/// listener's token is guarded the same way.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_authentication_makes_its_address_wait() {
    let (_env, app) = spawn_app(|c| {
        c.http.intake_auth = true;
        c.http.clients = vec![token_client("shop")];
        c.http.admin_token = tally_engine::config::Secret::new("admin-token");
    })
    .await;
    let get = |token: &'static str| {
        let req = app.client.get(format!("{}/transfers/{}", app.intake_url, uuid::Uuid::nil())).bearer_auth(token);
        app.send(req)
    };
    let mut statuses = Vec::new();
    for _ in 0..12 {
        statuses.push(get("wrong").await.status().as_u16());
    }
    assert_eq!(statuses[..10], [401; 10], "{statuses:?}");
    assert!(statuses[10..].contains(&429), "{statuses:?}");
    let held = get("shop-token").await;
    assert_eq!(held.status(), StatusCode::TOO_MANY_REQUESTS, "a right token waits too");
    let wait: u64 = held
        .headers()
        .get("retry-after")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok())
        .expect("Retry-After");
    tokio::time::sleep(Duration::from_secs(wait + 1)).await;
    assert_eq!(get("shop-token").await.status(), StatusCode::NOT_FOUND, "after the wait, the right token is served");
    let metrics = app.metrics().await;
    let failures = metric_value(&metrics, r#"tally_http_auth_failures_total{listener="intake"}"#).unwrap_or(0.0);
    assert!(failures >= 11.0, "{failures}");
    assert!(metric_value(&metrics, r#"tally_http_auth_refused_total{listener="intake"}"#).unwrap_or(0.0) >= 1.0);

    let admin =
        |token: &'static str| app.send(app.client.get(format!("{}/admin/token", app.admin_url)).bearer_auth(token));
    let mut statuses = Vec::new();
    for _ in 0..12 {
        statuses.push(admin("wrong").await.status().as_u16());
    }
    assert_eq!(statuses[..10], [403; 10], "{statuses:?}");
    assert!(statuses[10..].contains(&429), "{statuses:?}");
}

/// The admin listener answers IP addresses, `localhost` and `http.admin_hosts`; a page
/// that rebinds its own name to loopback gets 421 and nothing else.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_admin_listener_refuses_host_names_it_does_not_serve() {
    let (_env, app) = spawn_app(|c| c.http.admin_hosts = vec!["tally-admin.internal".into()]).await;
    let with_host = |host: &'static str| {
        let req = app.client.get(format!("{}/healthz", app.admin_url)).header("Host", host);
        app.send(req)
    };
    for host in ["127.0.0.1", "localhost:9090", "tally-admin.internal"] {
        assert_eq!(with_host(host).await.status(), StatusCode::OK, "{host}");
    }
    let refused = with_host("attacker.example").await;
    assert_eq!(refused.status(), StatusCode::MISDIRECTED_REQUEST);
    let body: serde_json::Value = refused.json().await.expect("json");
    assert_eq!(body["error"]["code"], "misdirected_host", "{body}");
}
