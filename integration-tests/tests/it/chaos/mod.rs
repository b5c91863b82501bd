//! The history checker under faults (`make chaos`; a short profile runs in `make test`).
//!
//! Two `tally run` processes in one group on the embedded broker of this process (one of
//! them without the outbox and notifications), a webhook receiver that fails first
//! deliveries, clients posting transfers and orders over HTTP with `Idempotency-Key`
//! retries, bad requests, and poison and duplicate records produced straight to the
//! consumed topics, while faults drawn from a printed seed hit them:
//! kill -9 and restart of a daemon, the database connections of tally killed, the
//! database refusing tally for longer than any retry budget, the database read-only for a
//! while (a failover), broker request errors, added broker latency and a broker down for a
//! while. Besides poison, hostile records (header names that are not UTF-8, hundreds of
//! headers, keys that are not UTF-8) go to every consumed topic. Every request and response is recorded;
//! after the faults stop and the system is quiet, invariants are checked over the whole
//! history and the final database state, and a table of them is printed.
//!
//! `TALLY_CHAOS_SEED` replays a schedule (the same seed draws the same faults at the same
//! offsets; what the daemons do in between is not deterministic), `TALLY_CHAOS_SECS` sets
//! how long the faults last (default 30; `make chaos` runs 300), `TALLY_CHAOS_LOG` the daemons' log
//! filter (default `warn`; their logs are `tally-child-<instance>.log` next to the binary). On a violation the history is kept under
//! `target/chaos/<seed>/` and the test fails with the first violations.
//!
//! Each check is shown able to fail: after the verdict on the real run, the final state
//! and the history are tampered with (a balance, a posting, a status, a second decision,
//! a stray dead letter, a second transfer for one key) and every check must report it.
//!
//! Per-key publish order of the outbox is checked too, and `chaos_catches_each_broken_guarantee`
//! runs the daemon with fault switches (`TALLY_FAULT`, debug builds only) that break one
//! guarantee each, and requires the checker to catch every one.
//!
//! Not covered yet: committed offsets against effects, and noida-db as the broker (it
//! never expels a member killed with kill -9).
#![allow(clippy::expect_used)] // tests: a failed expectation is a failed test, with its message

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};
use rdkafka::types::RDKafkaRespErr;
use serde_json::{json, Value};
use tally_engine::broker::api_key;
use tally_integration_tests::{
    antifraud_decisions, producer, read_topic, spawn_tally_process, Deadline, ReceivedCall, TallyProcess, TestEnv,
    WebhookReceiver,
};
use uuid::Uuid;

const ACCOUNTS: usize = 8;
const OPENING: i64 = 1_000_000;
const CLIENTS: usize = 3;
const SECRET: &str = "chaos-webhook-secret";

/// One tally process, restartable under its instance id and ports.
struct Daemon {
    name: &'static str,
    env: Vec<(String, String)>,
    intake: String,
    admin: String,
    child: Option<TallyProcess>,
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).map(|a| a.port()).expect("free port")
}

impl Daemon {
    fn new(name: &'static str, extra: &[(&str, &str)]) -> Self {
        let (intake, admin) = (free_port(), free_port());
        let mut env: Vec<(String, String)> = vec![
            ("TALLY__INSTANCE__ID".into(), format!("chaos-{name}-{}", &Uuid::new_v4().simple().to_string()[..6])),
            ("TALLY__HTTP__INTAKE_ADDR".into(), format!("127.0.0.1:{intake}")),
            ("TALLY__HTTP__ADMIN_ADDR".into(), format!("127.0.0.1:{admin}")),
            ("TALLY__LOG__LEVEL".into(), std::env::var("TALLY_CHAOS_LOG").unwrap_or_else(|_| "warn".into())),
        ];
        env.extend(extra.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())));
        Self {
            name,
            env,
            intake: format!("http://127.0.0.1:{intake}"),
            admin: format!("http://127.0.0.1:{admin}"),
            child: None,
        }
    }

    fn start(&mut self, env: &TestEnv) {
        let vars: Vec<(&str, &str)> = self.env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        self.child = Some(spawn_tally_process(env, &vars));
    }

    fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    async fn wait_ready(&self, http: &reqwest::Client) {
        let started = Instant::now();
        let mut last = String::new();
        while started.elapsed() < Duration::from_secs(60) {
            match http.get(format!("{}/readyz", self.admin)).send().await {
                Ok(r) if r.status().is_success() => return,
                Ok(r) => last = r.text().await.unwrap_or_default(),
                Err(e) => last = e.to_string(),
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        panic!("daemon {} not ready within 60 s: {last}", self.name);
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        self.kill();
    }
}

/// One client request and what came back.
#[derive(Debug, Clone, serde::Serialize)]
struct Call {
    client: usize,
    /// `/transfers` or `/orders`.
    path: &'static str,
    /// When the request was sent (`at_ms`: when its answer came), since the run started.
    sent_ms: u128,
    key: String,
    attempt: u32,
    at_ms: u128,
    request: Value,
    /// HTTP status, or 0 for no answer (refused, reset, timed out).
    status: u16,
    response: Value,
}

#[derive(Default)]
struct History {
    calls: Vec<Call>,
    faults: Vec<(u128, String)>,
    poison: Vec<String>,
    duplicates: usize,
    /// Every webhook call the receiver got.
    deliveries: Vec<ReceivedCall>,
}

/// The next request: mostly a transfer between two of the accounts, now and then one that
/// cannot settle (more than the balance, an unknown account), a request the intake must
/// refuse, or an order (its `externalReference` makes its retries idempotent).
fn next_request(rng: &mut StdRng) -> (&'static str, Value) {
    if rng.random_range(0..6) == 0 {
        let reference = format!("chaos-order-{}", Uuid::new_v4().simple());
        let order = json!({ "externalReference": reference, "customerId": format!("cust-{}", rng.random_range(0..50)),
                            "amountCents": rng.random_range(1..100_000), "currency": "BRL" });
        return ("/orders", order);
    }
    ("/transfers", next_transfer(rng))
}

fn next_transfer(rng: &mut StdRng) -> Value {
    let from = rng.random_range(0..ACCOUNTS);
    let to = (from + rng.random_range(1..ACCOUNTS)) % ACCOUNTS;
    let amount = match rng.random_range(0..20) {
        0 => OPENING * 3,
        _ => rng.random_range(1..5_000),
    };
    let mut body = json!({
        "sourceAccount": format!("C-{from}"), "destinationAccount": format!("C-{to}"),
        "amountCents": amount, "currency": "BRL",
    });
    match rng.random_range(0..25) {
        0 => body["destinationAccount"] = json!("C-NOPE"),
        1 => return json!({ "sourceAccount": "C-0", "amountCents": -5 }),
        _ => {}
    }
    body
}

async fn client(
    id: usize,
    seed: u64,
    until: Instant,
    started: Instant,
    daemons: Vec<String>,
    history: Arc<Mutex<History>>,
) {
    let http = reqwest::Client::builder().timeout(Duration::from_secs(3)).build().expect("http client");
    let mut rng = StdRng::seed_from_u64(seed ^ (id as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15));
    while Instant::now() < until {
        let (path, request) = next_request(&mut rng);
        let key = Uuid::new_v4().to_string();
        for attempt in 1..=8_u32 {
            let base = &daemons[(attempt as usize + id) % daemons.len()];
            let sent_ms = started.elapsed().as_millis();
            let sent = http.post(format!("{base}{path}")).header("Idempotency-Key", &key).json(&request).send().await;
            let (status, response) = match sent {
                Ok(r) => {
                    let status = r.status().as_u16();
                    (status, r.json::<Value>().await.unwrap_or(Value::Null))
                }
                Err(_) => (0, Value::Null),
            };
            let at_ms = started.elapsed().as_millis();
            history.lock().expect("history").calls.push(Call {
                client: id,
                path,
                sent_ms,
                key: key.clone(),
                attempt,
                at_ms,
                request: request.clone(),
                status,
                response,
            });
            // Answered for good: accepted (an order's repeat answers 200), or refused for a
            // reason a retry cannot change.
            if status == 201 || status == 200 || (400..500).contains(&status) && status != 429 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(200 * u64::from(attempt))).await;
        }
        tokio::time::sleep(Duration::from_millis(rng.random_range(5..60))).await;
    }
}

/// Kills the database connections of every tally process on the test database.
async fn kill_connections(env: &TestEnv) -> u64 {
    env.db
        .scalar_i64(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity \
             WHERE datname = current_database() AND application_name LIKE 'tally%' AND pid <> pg_backend_pid()",
            &[],
        )
        .await as u64
}

/// Makes the test database read-only for new sessions (or writable again) and ends
/// tally's connections, so that they come back to it as it now is.
async fn read_only(env: &TestEnv, on: bool) {
    let setting = if on { "on" } else { "off" };
    let name = env.db.name().to_owned();
    env.db.execute(&format!("ALTER DATABASE \"{name}\" SET default_transaction_read_only = {setting}"), &[]).await;
    kill_connections(env).await;
}

/// Runs the fault schedule until `until`; returns once every daemon runs again.
async fn faults(
    env: &TestEnv,
    daemons: &mut [Daemon],
    (seed, kill_at): (u64, Option<Duration>),
    until: Instant,
    started: Instant,
    history: &Mutex<History>,
) {
    let mut rng = StdRng::seed_from_u64(seed);
    let http = reqwest::Client::new();
    let log = |what: String| {
        eprintln!("chaos +{:>6} ms: {what}", started.elapsed().as_millis());
        history.lock().expect("history").faults.push((started.elapsed().as_millis(), what));
    };
    if let Some(at) = kill_at {
        tokio::time::sleep_until((started + at).into()).await;
        log("kill -9 daemon a (scheduled)".into());
        daemons[0].kill();
        tokio::time::sleep(Duration::from_secs(2)).await;
        daemons[0].start(env);
        daemons[0].wait_ready(&http).await;
        log("daemon a ready again".into());
        return;
    }
    while Instant::now() < until {
        tokio::time::sleep(Duration::from_millis(rng.random_range(1_500..4_000))).await;
        match rng.random_range(0..8) {
            0 | 1 => {
                let i = rng.random_range(0..daemons.len());
                let down = Duration::from_millis(rng.random_range(500..3_000));
                log(format!("kill -9 daemon {} for {down:?}", daemons[i].name));
                daemons[i].kill();
                tokio::time::sleep(down).await;
                daemons[i].start(env);
                daemons[i].wait_ready(&http).await;
                log(format!("daemon {} ready again", daemons[i].name));
            }
            2 => {
                let n = kill_connections(env).await;
                log(format!("pg_terminate_backend: {n} tally connections killed"));
            }
            5 => {
                // Longer than the pipelines' retry budget: they must wait, not dead-letter.
                let down = Duration::from_millis(rng.random_range(2_000..5_000));
                env.db.refuse_tally(true).await;
                log(format!("database refuses tally for {down:?}"));
                tokio::time::sleep(down).await;
                env.db.refuse_tally(false).await;
            }
            7 => {
                // A failover onto a standby, as tally sees it: connections dropped, and the
                // database they come back to refuses writes. Waited out, never dead-lettered.
                let down = Duration::from_millis(rng.random_range(2_000..5_000));
                read_only(env, true).await;
                log(format!("database read-only for {down:?}"));
                tokio::time::sleep(down).await;
                read_only(env, false).await;
            }
            6 => {
                let id = rng.random_range(1..=env.broker.broker_count());
                let rtt = Duration::from_millis(rng.random_range(50..400));
                env.broker.set_rtt(id, rtt).expect("broker latency");
                log(format!("broker {id}: {rtt:?} added to every answer for 3 s"));
                tokio::time::sleep(Duration::from_secs(3)).await;
                env.broker.set_rtt(id, Duration::ZERO).expect("broker latency");
            }
            3 => {
                let api = [api_key::PRODUCE, api_key::FETCH, api_key::TXN_OFFSET_COMMIT][rng.random_range(0..3)];
                let errors = [RDKafkaRespErr::RD_KAFKA_RESP_ERR_NOT_LEADER_FOR_PARTITION; 3];
                env.broker.push_request_errors(api, &errors);
                log(format!("broker: 3 errors on API {api}"));
            }
            _ => {
                let id = rng.random_range(1..=env.broker.broker_count());
                let down = Duration::from_millis(rng.random_range(500..2_500));
                env.broker.broker_down(id).expect("broker down");
                log(format!("broker {id} down for {down:?}"));
                tokio::time::sleep(down).await;
                env.broker.broker_up(id).expect("broker up");
            }
        }
    }
}

/// The topics tally consumes: poison and duplicates go to each in turn.
const CONSUMED: [&str; 5] =
    ["transfers.requested", "transfers.analyzed", "transfers.settled", "transfers.rejected", "orders.received"];

/// Every few seconds a poison record and a copy of the newest record (same key, headers
/// and partition, as a redelivery) straight to the next consumed topic.
async fn inject_records(env: &TestEnv, until: Instant, history: &Mutex<History>) {
    let producer = producer(env.bootstrap());
    let mut n = 0;
    while Instant::now() < until {
        tokio::time::sleep(Duration::from_millis(3_000)).await;
        let topic = CONSUMED[n % CONSUMED.len()];
        n += 1;
        let marker = format!("chaos-poison-{n}-{}", Uuid::new_v4().simple());
        tally_integration_tests::produce(&producer, topic, None, "C-0", marker.as_bytes(), &[]).await;
        history.lock().expect("history").poison.push(marker);
        // A hostile record too (odd headers or key), its marker as its value.
        let marker = format!("chaos-hostile-{n}-{}", Uuid::new_v4().simple());
        let hostile = hostile_record(n, marker.as_bytes());
        let bootstrap = env.bootstrap().to_owned();
        tokio::task::spawn_blocking(move || {
            tally_integration_tests::hostile::produce_raw(&bootstrap, topic, (n % 2) as i32, &[hostile]);
        })
        .await
        .expect("produce a hostile record");
        history.lock().expect("history").poison.push(marker);
        let Ok(records) = read_topic(env.bootstrap(), topic, Deadline::secs(10)).await else {
            continue;
        };
        if let Some(r) = records.iter().rev().find(|r| !json_of(r).is_null()) {
            let payload = r.payload.clone().unwrap_or_default();
            let key = r.key.clone().unwrap_or_default();
            let headers: Vec<(String, String)> = ["event-id", "event-type", "traceparent"]
                .iter()
                .filter_map(|h| r.header(h).map(|v| ((*h).to_owned(), v.to_owned())))
                .collect();
            let headers: Vec<(&str, &str)> = headers.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
            tally_integration_tests::produce(&producer, topic, Some(r.partition), &key, &payload, &headers).await;
            history.lock().expect("history").duplicates += 1;
        }
    }
}

/// The `n`-th hostile record with `value`: a header name that is not UTF-8, more headers
/// than tally takes, or a key that is not UTF-8 with a null header value, in turn.
fn hostile_record(n: usize, value: &[u8]) -> tally_integration_tests::hostile::RawRecord {
    let (key, headers) = match n % 3 {
        0 => (b"C-0".to_vec(), vec![(b"\xff\xfe".to_vec(), Some(b"x".to_vec()))]),
        1 => (b"C-0".to_vec(), (0..300).map(|i| (format!("h{i}").into_bytes(), None)).collect()),
        _ => (b"\xc3\x28".to_vec(), vec![(b"event-id".to_vec(), None)]),
    };
    tally_integration_tests::hostile::RawRecord { key: Some(key), value: Some(value.to_vec()), headers }
}

/// A record's payload as JSON; `Null` for poison (or no payload).
fn json_of(r: &tally_integration_tests::KafkaRecord) -> Value {
    r.payload.as_deref().and_then(|p| serde_json::from_slice(p).ok()).unwrap_or(Value::Null)
}

/// An invariant's outcome: how many cases were checked, and the violations.
struct Check {
    name: &'static str,
    checked: usize,
    violations: Vec<String>,
}

/// What one run does besides the load: how long the faults last, a fault switch inside the
/// daemons (test builds only), and how long quiescence may take.
struct Profile {
    secs: u64,
    fault: Option<&'static str>,
    /// A kill -9 of daemon a (every pipeline, the only outbox publisher) at this offset,
    /// instead of the drawn faults.
    kill_at: Option<Duration>,
    quiet_within: Duration,
}

/// A finished run: what it keeps alive for later looks, its history and its checks.
struct Run {
    env: TestEnv,
    daemons: Vec<Daemon>,
    history: History,
    checks: Vec<Check>,
}

/// The chaos runs of this binary take turns: each one loads both cores.
static TURN: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// `TALLY_CHAOS_SEED`, or a random seed when it is not set. A seed that does not parse is
/// an error, not a random run that looks like a replay.
fn seed() -> u64 {
    match std::env::var("TALLY_CHAOS_SEED") {
        Ok(s) => s.trim().parse().unwrap_or_else(|e| panic!("TALLY_CHAOS_SEED={s:?} is not a seed (a u64): {e}")),
        Err(_) => rand::random(),
    }
}

async fn run(seed: u64, profile: &Profile) -> Run {
    let secs = profile.secs;
    eprintln!(
        "chaos: seed {seed}, {secs} s of faults{} (replay with TALLY_CHAOS_SEED={seed})",
        profile.fault.map(|f| format!(", fault switch {f}")).unwrap_or_default()
    );
    let env = TestEnv::new().await;
    // The receiver fails the first delivery of one event in five, and nothing more, so
    // every event is delivered within its attempts.
    let failed_once = Mutex::new(HashSet::<Vec<u8>>::new());
    let receiver = WebhookReceiver::start(move |body, _| {
        let fail = body.iter().map(|b| u32::from(*b)).sum::<u32>() % 5 == 0;
        if fail && failed_once.lock().expect("receiver state").insert(body.to_vec()) {
            503
        } else {
            200
        }
    })
    .await;
    let mut config = tally_engine::Config::default();
    config.notifications.webhook_url = tally_engine::config::SecretUrl::new(receiver.url.clone());
    for spec in tally_engine::kafka::topic_specs(&config) {
        env.broker.create_topic_if_missing(&spec.name, spec.partitions, 1).expect("topic");
    }
    let fault = ("TALLY_FAULT", profile.fault.unwrap_or(""));
    let webhook = [
        ("TALLY__NOTIFICATIONS__WEBHOOK_URL", receiver.url.as_str()),
        ("TALLY__NOTIFICATIONS__WEBHOOK_SECRET", SECRET),
        fault,
    ];
    let mut daemons = vec![
        Daemon::new("a", &webhook),
        Daemon::new("b", &[("TALLY__PIPELINES__OUTBOX", "false"), ("TALLY__PIPELINES__NOTIFICATIONS", "false"), fault]),
    ];
    let http = reqwest::Client::builder().timeout(Duration::from_secs(5)).build().expect("http client");
    for d in &mut daemons {
        d.start(&env);
    }
    for d in &daemons {
        d.wait_ready(&http).await;
    }
    for i in 0..ACCOUNTS {
        let res = http
            .post(format!("{}/accounts", daemons[0].intake))
            .json(&json!({ "id": format!("C-{i}"), "currency": "BRL", "initialBalanceCents": OPENING }))
            .send()
            .await
            .expect("create account");
        assert_eq!(res.status(), 201, "create account C-{i}");
    }

    let history = Arc::new(Mutex::new(History::default()));
    let started = Instant::now();
    let until = started + Duration::from_secs(secs);
    let bases: Vec<String> = daemons.iter().map(|d| d.intake.clone()).collect();
    let clients: Vec<_> = (0..CLIENTS)
        .map(|i| tokio::spawn(client(i, seed, until, started, bases.clone(), Arc::clone(&history))))
        .collect();
    tokio::join!(
        faults(&env, &mut daemons, (seed, profile.kill_at), until, started, &history),
        inject_records(&env, until, &history)
    );
    for c in clients {
        c.await.expect("client task");
    }
    for d in &mut daemons {
        if d.child.is_none() {
            d.start(&env);
        }
    }
    for d in &daemons {
        d.wait_ready(&http).await;
    }
    eprintln!("chaos: faults over after {:.1} s; waiting for quiescence", started.elapsed().as_secs_f64());
    match quiesce(&env, &receiver, profile.quiet_within).await {
        Ok(quiet) => eprintln!("chaos: quiet after {:.1} s", quiet.as_secs_f64()),
        Err(e) => eprintln!("chaos: {e}"),
    }

    let mut history = std::mem::take(&mut *history.lock().expect("history"));
    history.deliveries = receiver.calls();
    let checks = check(&env, &daemons[0], &history).await;
    eprintln!("\n{:<58} {:>8} {:>10}", "invariant", "checked", "violated");
    for c in &checks {
        eprintln!("{:<58} {:>8} {:>10}", c.name, c.checked, c.violations.len());
    }
    let calls = history.calls.len();
    let accepted = history.calls.iter().filter(|c| c.status == 201).count();
    eprintln!(
        "history: {calls} calls ({accepted} answered 201), {} faults, {} poison and {} duplicate records",
        history.faults.len(),
        history.poison.len(),
        history.duplicates
    );
    Run { env, daemons, history, checks }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chaos_history_holds_every_invariant() {
    let _turn = TURN.lock().await;
    let seed = seed();
    let secs: u64 = std::env::var("TALLY_CHAOS_SECS").ok().and_then(|s| s.parse().ok()).unwrap_or(30);
    let profile = Profile { secs, fault: None, kill_at: None, quiet_within: Duration::from_secs(180) };
    let Run { env, mut daemons, history, checks } = run(seed, &profile).await;
    let failed: Vec<&Check> = checks.iter().filter(|c| !c.violations.is_empty()).collect();
    if !failed.is_empty() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("../target/chaos/{seed}"));
        let _ = std::fs::create_dir_all(&dir);
        let dump = json!({ "seed": seed, "calls": history.calls, "faults": history.faults, "poison": history.poison });
        let _ = std::fs::write(dir.join("history.json"), serde_json::to_vec_pretty(&dump).unwrap_or_default());
        let first: Vec<String> =
            failed.iter().flat_map(|c| c.violations.iter().take(3).map(move |v| format!("{}: {v}", c.name))).collect();
        panic!("chaos seed {seed}: invariants violated (history in {}):\n{}", dir.display(), first.join("\n"));
    }
    // The outbox runs on daemon a only: without it the tampered outbox row stays pending.
    daemons[0].kill();
    every_check_can_fail(&env, &daemons[1], history).await;
}

/// The checker notices a daemon that breaks a guarantee: with each test fault switch on,
/// a short run reports the invariant that switch breaks.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chaos_catches_each_broken_guarantee() {
    let _turn = TURN.lock().await;
    // A record whose offset was committed before its effect is never redelivered: the
    // transfer or order it carried is never final. (On the embedded broker antifraud
    // re-reads its input after every rebalance, since the mock keeps no transactional
    // offsets, so a lost ledger record is often published again; a lost order is not.)
    for (fault, invariants) in [
        (tally_actors::faults::Fault::Rescore, &["at most one antifraud decision per transfer"][..]),
        (
            tally_actors::faults::Fault::OffsetBeforeCommit,
            &["every accepted transfer has one final status", "every accepted order received exactly once"][..],
        ),
        (
            tally_actors::faults::Fault::OutboxOutOfOrder,
            &["per key, requests published in the order clients saw them"][..],
        ),
        (
            tally_actors::faults::Fault::SkipInbox,
            &[
                "every poison record dead-lettered, and nothing else",
                "SETTLED: one D and one C of its amount; else none",
            ][..],
        ),
    ] {
        // The kill comes after the consumers' first auto-commit (5 s), so that offsets
        // stored early are committed when the daemon dies.
        let profile = Profile {
            secs: 20,
            fault: Some(fault.name()),
            kill_at: Some(Duration::from_secs(8)),
            quiet_within: Duration::from_secs(40),
        };
        let run = run(seed(), &profile).await;
        let seen: usize = run.checks.iter().filter(|c| invariants.contains(&c.name)).map(|c| c.violations.len()).sum();
        assert!(seen > 0, "with {} on, the checker reported nothing under {invariants:?}", fault.name());
    }
}

/// Tampers with the final state and the history in one way per check, and asserts that
/// every check then reports a violation. `daemon` runs no outbox publisher.
async fn every_check_can_fail(env: &TestEnv, daemon: &Daemon, mut history: History) {
    let db = &env.db;
    let settled: Uuid = db
        .query("SELECT id FROM transfers WHERE status = 'SETTLED' ORDER BY created_at LIMIT 2", &[])
        .await
        .first()
        .map(|r| r.get(0))
        .expect("a settled transfer");
    let other: Uuid = db
        .query("SELECT id FROM transfers WHERE status <> 'PENDING' ORDER BY created_at DESC LIMIT 1", &[])
        .await
        .first()
        .map(|r| r.get(0))
        .expect("a final transfer");
    db.execute("UPDATE accounts SET balance_cents = balance_cents + 1 WHERE id = 'C-0'", &[]).await;
    db.execute("DELETE FROM postings WHERE transfer_id = $1 AND kind = 'C'", &[&settled]).await;
    db.execute("UPDATE transfers SET status = 'PENDING' WHERE id = $1", &[&other]).await;
    db.execute("DELETE FROM received_orders WHERE order_id = (SELECT order_id FROM received_orders LIMIT 1)", &[])
        .await;
    let producer = producer(env.bootstrap());
    let second = json!({ "eventId": Uuid::new_v4(), "transferId": settled, "reason": "BLOCKED_BY_ANTIFRAUD",
                         "rejectedAt": "2026-11-30T00:00:00Z" });
    tally_integration_tests::produce(&producer, "transfers.rejected", None, "C-0", second.to_string().as_bytes(), &[])
        .await;
    tally_integration_tests::produce(&producer, "transfers.requested-dlt", None, "C-0", b"not poison", &[]).await;
    history.poison.push("a poison record that never reached a DLT".into());
    if let Some(first) = history.deliveries.first_mut() {
        first.headers.insert("x-tally-signature".into(), "sha256=forged".into());
    }
    let mut twin =
        history.calls.iter().find(|c| c.status == 201 && c.path == "/transfers").cloned().expect("an accepted call");
    twin.response["id"] = json!(Uuid::new_v4());
    history.calls.push(twin);
    // As if every transfer had been answered at once: then any request published after
    // another of its key was sent later than its answer.
    for c in history.calls.iter_mut().filter(|c| c.path == "/transfers") {
        c.at_ms = 0;
    }
    db.execute(
        "INSERT INTO outbox_events (id, topic, key, event_type, payload) \
         VALUES (gen_random_uuid(), 'transfers.requested', 'C-0', 'TransferRequested', '{}')",
        &[],
    )
    .await;
    let tampered = check(env, daemon, &history).await;
    for c in &tampered {
        eprintln!("tampered: {:<58} {:>10} violated", c.name, c.violations.len());
    }
    let blind: Vec<&str> = tampered.iter().filter(|c| c.violations.is_empty()).map(|c| c.name).collect();
    assert!(blind.is_empty(), "checks that did not see their tampering: {blind:?}");
}

/// Waits until every transfer is final, every outbox row is published and the receiver
/// has a successful delivery for every final transfer.
async fn quiesce(env: &TestEnv, receiver: &WebhookReceiver, within: Duration) -> Result<Duration, String> {
    let started = Instant::now();
    loop {
        let pending = env.db.scalar_i64("SELECT count(*) FROM transfers WHERE status = 'PENDING'", &[]).await;
        let outbox = env.db.pending_outbox().await;
        let notified = delivered(&receiver.calls()).len() as i64;
        let fin = env.db.scalar_i64("SELECT count(*) FROM transfers WHERE status <> 'PENDING'", &[]).await;
        if pending == 0 && outbox == 0 && notified >= fin {
            return Ok(started.elapsed());
        }
        if started.elapsed() >= within {
            return Err(format!(
                "not quiet {within:?} after the faults: {pending} transfers pending, {outbox} outbox rows \
                 unpublished, {notified} of {fin} final transfers notified"
            ));
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// The event ids answered 2xx, by transfer id.
fn delivered(calls: &[ReceivedCall]) -> HashMap<String, HashSet<String>> {
    let mut by_transfer: HashMap<String, HashSet<String>> = HashMap::new();
    for c in calls.iter().filter(|c| (200..300).contains(&c.status)) {
        let body: Value = serde_json::from_slice(&c.body).unwrap_or(Value::Null);
        let event = c.headers.get("x-tally-event-id").cloned().unwrap_or_default();
        by_transfer.entry(body["transferId"].as_str().unwrap_or_default().to_owned()).or_default().insert(event);
    }
    by_transfer
}

async fn check(env: &TestEnv, daemon: &Daemon, history: &History) -> Vec<Check> {
    let db = &env.db;
    let mut checks = Vec::new();

    // Idempotency: one transfer per key, however many attempts were answered.
    let mut by_key: HashMap<&str, HashSet<String>> = HashMap::new();
    for c in history.calls.iter().filter(|c| c.status == 201 && c.path == "/transfers") {
        by_key.entry(&c.key).or_default().insert(c.response["id"].as_str().unwrap_or_default().to_owned());
    }
    let violations =
        by_key.iter().filter(|(_, ids)| ids.len() > 1).map(|(k, ids)| format!("key {k}: {ids:?}")).collect();
    checks.push(Check {
        name: "an Idempotency-Key retry never made a second transfer",
        checked: by_key.len(),
        violations,
    });

    // Every transfer the intake accepted exists, and every stored one is final.
    let rows = db
        .query("SELECT id, status, source_account::text, destination_account::text, amount_cents FROM transfers", &[])
        .await;
    let stored: HashMap<Uuid, (String, String, String, i64)> =
        rows.iter().map(|r| (r.get(0), (r.get(1), r.get(2), r.get(3), r.get(4)))).collect();
    let accepted: HashSet<Uuid> = by_key.values().flatten().filter_map(|id| id.parse().ok()).collect();
    let violations = accepted
        .iter()
        .filter(|id| stored.get(id).is_none_or(|t| t.0 == "PENDING"))
        .map(|id| format!("accepted transfer {id} is {:?}", stored.get(id).map(|t| &t.0)))
        .collect();
    checks.push(Check { name: "every accepted transfer has one final status", checked: accepted.len(), violations });

    // Postings agree with the status.
    let postings = db.query("SELECT transfer_id, account_id::text, kind::text, amount_cents FROM postings", &[]).await;
    let mut by_transfer: HashMap<Uuid, Vec<(String, String, i64)>> = HashMap::new();
    for p in &postings {
        by_transfer.entry(p.get(0)).or_default().push((p.get(1), p.get(2), p.get(3)));
    }
    let mut violations = Vec::new();
    for (id, (status, from, to, amount)) in &stored {
        let mut got = by_transfer.get(id).cloned().unwrap_or_default();
        got.sort();
        let want = match status.as_str() {
            "SETTLED" => {
                let mut w = vec![(from.clone(), "D".to_owned(), *amount), (to.clone(), "C".to_owned(), *amount)];
                w.sort();
                w
            }
            _ => Vec::new(),
        };
        if got != want {
            violations.push(format!("transfer {id} {status}: postings {got:?}, expected {want:?}"));
        }
    }
    checks.push(Check { name: "SETTLED: one D and one C of its amount; else none", checked: stored.len(), violations });

    // Money: conserved, never negative, balances equal opening + credits - debits.
    let accounts = db.query("SELECT id::text, balance_cents FROM accounts", &[]).await;
    let mut violations = Vec::new();
    let mut total = 0_i64;
    for a in &accounts {
        let (id, balance): (String, i64) = (a.get(0), a.get(1));
        total += balance;
        let moved: i64 = postings
            .iter()
            .filter(|p| p.get::<_, String>(1) == id)
            .map(|p| if p.get::<_, String>(2) == "C" { p.get::<_, i64>(3) } else { -p.get::<_, i64>(3) })
            .sum();
        if balance < 0 || balance != OPENING + moved {
            violations.push(format!("account {id}: balance {balance}, opening {OPENING} + postings {moved}"));
        }
    }
    if total != OPENING * accounts.len() as i64 {
        violations.push(format!("money not conserved: {total} in {} accounts", accounts.len()));
    }
    checks.push(Check {
        name: "money conserved, no negative balance, balances = postings",
        checked: accounts.len(),
        violations,
    });

    // One antifraud decision per transfer, over everything ever published.
    let decisions = antifraud_decisions(env.bootstrap(), Deadline::secs(30)).await.expect("read decisions");
    let violations = decisions
        .iter()
        .filter(|(_, d)| d.len() > 1)
        .map(|(id, d)| format!("transfer {id}: decisions {d:?}"))
        .collect();
    checks.push(Check { name: "at most one antifraud decision per transfer", checked: decisions.len(), violations });

    // Every poison record is dead-lettered (DLT topic or fallback table), nothing else.
    let mut dlt_payloads: Vec<String> = Vec::new();
    for topic in CONSUMED {
        let dlt = tally_schema::topics::dlt(topic);
        for r in read_topic(env.bootstrap(), &dlt, Deadline::secs(30)).await.expect("read a DLT") {
            dlt_payloads.push(String::from_utf8_lossy(r.payload.as_deref().unwrap_or_default()).into_owned());
        }
    }
    let fallback = db.query("SELECT payload FROM dead_letters", &[]).await;
    let table: Vec<String> = fallback
        .iter()
        .map(|r| String::from_utf8_lossy(&r.get::<_, Option<Vec<u8>>>(0).unwrap_or_default()).into_owned())
        .collect();
    let mut violations: Vec<String> = history
        .poison
        .iter()
        .filter(|m| !dlt_payloads.contains(m) && !table.contains(m))
        .map(|m| format!("poison {m} is in no DLT"))
        .collect();
    violations.extend(
        dlt_payloads
            .iter()
            .filter(|p| !history.poison.contains(p))
            .map(|p| format!("dead-lettered without being poison: {}", p.chars().take(120).collect::<String>())),
    );
    checks.push(Check {
        name: "every poison record dead-lettered, and nothing else",
        checked: history.poison.len(),
        violations,
    });

    // Orders: one per external reference however often it was sent, and every order the
    // intake took is received exactly once.
    let mut by_reference: HashMap<String, HashSet<String>> = HashMap::new();
    for c in history.calls.iter().filter(|c| c.path == "/orders" && (c.status == 201 || c.status == 200)) {
        let reference = c.request["externalReference"].as_str().unwrap_or_default().to_owned();
        by_reference.entry(reference).or_default().insert(c.response["id"].as_str().unwrap_or_default().to_owned());
    }
    let orders = db
        .query("SELECT o.id, count(r.order_id) FROM orders o LEFT JOIN received_orders r ON r.order_id = o.id GROUP BY o.id", &[])
        .await;
    let received: HashMap<Uuid, i64> = orders.iter().map(|r| (r.get(0), r.get(1))).collect();
    let mut violations: Vec<String> = by_reference
        .iter()
        .filter(|(_, ids)| ids.len() > 1)
        .map(|(r, ids)| format!("reference {r}: orders {ids:?}"))
        .collect();
    for id in by_reference.values().flatten().filter_map(|id| id.parse::<Uuid>().ok()) {
        match received.get(&id) {
            Some(1) => {}
            n => violations.push(format!("order {id} received {n:?} times")),
        }
    }
    let strays = db
        .scalar_i64(
            "SELECT count(*) FROM received_orders r WHERE NOT EXISTS (SELECT 1 FROM orders o WHERE o.id = r.order_id)",
            &[],
        )
        .await;
    if strays > 0 {
        violations.push(format!("{strays} received orders without an order"));
    }
    checks.push(Check { name: "every accepted order received exactly once", checked: by_reference.len(), violations });

    // Notifications: every final transfer delivered, signed, under one event id.
    let delivered = delivered(&history.deliveries);
    let mut violations: Vec<String> = stored
        .iter()
        .filter(|(_, t)| t.0 != "PENDING")
        .filter_map(|(id, t)| match delivered.get(&id.to_string()).map(HashSet::len) {
            Some(1) => None,
            n => Some(format!("{} transfer {id} delivered under {n:?} event ids", t.0)),
        })
        .collect();
    violations.extend(
        history
            .deliveries
            .iter()
            .filter(|c| c.headers.get("x-tally-signature") != Some(&tally_actors::notify::signature(SECRET, &c.body)))
            .map(|c| format!("bad signature on {}", String::from_utf8_lossy(&c.body))),
    );
    checks.push(Check {
        name: "every final transfer notified, signed, under one event id",
        checked: history.deliveries.len(),
        violations,
    });

    // Per key, transfer requests appear in the order clients saw them committed: when one
    // request's 201 came before another's first attempt was sent, both from one source
    // account, the first is published first. (Only the order clients can observe is
    // checked: `seq` is the insert order, commit order can differ, and PostgreSQL keeps no
    // commit times unless `track_commit_timestamp` is on.)
    let mut timing: HashMap<String, (u128, u128)> = HashMap::new();
    let mut first_sent: HashMap<&str, u128> = HashMap::new();
    for c in history.calls.iter().filter(|c| c.path == "/transfers") {
        let sent = first_sent.entry(&c.key).or_insert(c.sent_ms);
        *sent = (*sent).min(c.sent_ms);
    }
    for c in history.calls.iter().filter(|c| c.path == "/transfers" && c.status == 201) {
        let id = c.response["id"].as_str().unwrap_or_default().to_owned();
        let sent = first_sent.get(c.key.as_str()).copied().unwrap_or(c.sent_ms);
        let t = timing.entry(id).or_insert((sent, c.at_ms));
        t.1 = t.1.min(c.at_ms);
    }
    let mut violations = Vec::new();
    let mut firsts: HashSet<String> = HashSet::new();
    // Per (partition, key): the latest "sent" among the requests published so far.
    let mut latest_sent: HashMap<(i32, String), (u128, String)> = HashMap::new();
    for r in read_topic(env.bootstrap(), "transfers.requested", Deadline::secs(30)).await.expect("read requests") {
        let v = json_of(&r);
        let id = v["transferId"].as_str().unwrap_or_default().to_owned();
        let Some(&(sent, answered)) = timing.get(&id) else { continue };
        if !firsts.insert(id.clone()) {
            continue;
        }
        let slot = latest_sent.entry((r.partition, r.key.clone().unwrap_or_default())).or_insert((0, String::new()));
        if slot.0 > answered {
            violations.push(format!(
                "transfer {id} (answered at {answered} ms) published after {} (sent at {} ms)",
                slot.1, slot.0
            ));
        }
        if sent > slot.0 {
            *slot = (sent, id);
        }
    }
    checks.push(Check {
        name: "per key, requests published in the order clients saw them",
        checked: firsts.len(),
        violations,
    });

    // Every outbox row published, and on its topic.
    let rows = db.query("SELECT id, topic, published_at IS NOT NULL FROM outbox_events", &[]).await;
    let outbox: HashMap<String, (String, bool)> =
        rows.iter().map(|r| (r.get::<_, Uuid>(0).to_string(), (r.get(1), r.get(2)))).collect();
    let mut on_topics: HashSet<String> = HashSet::new();
    for topic in outbox.values().map(|r| r.0.as_str()).collect::<HashSet<_>>() {
        for r in read_topic(env.bootstrap(), topic, Deadline::secs(30)).await.expect("read an outbox topic") {
            on_topics.extend(r.header("event-id").map(str::to_owned));
        }
    }
    let mut violations = Vec::new();
    for (id, (topic, published)) in &outbox {
        if !published {
            violations.push(format!("row {id} on {topic} unpublished"));
        } else if !on_topics.contains(id) {
            violations.push(format!("row {id} marked published but not on {topic}"));
        }
    }
    checks.push(Check { name: "every outbox row published, and on its topic", checked: outbox.len(), violations });

    let http = reqwest::Client::new();
    let body: Value = http
        .get(format!("{}/admin/ledger/check", daemon.admin))
        .send()
        .await
        .expect("ledger check")
        .json()
        .await
        .expect("ledger check JSON");
    let violations = if body["ok"] == true { vec![] } else { vec![body.to_string()] };
    checks.push(Check { name: "the daemon's own ledger check", checked: 1, violations });
    checks
}
