//! The clients of a chaos run: every key, external reference, amount and deliberate
//! repeat is drawn from the run's seed, and the answers they get drive the run's logical
//! clock (faults fire after the Nth answered request, not at a wall-clock time).

use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};
use serde_json::{json, Value};
use tally_integration_tests::ReceivedCall;

use super::plan::Fired;

pub(super) const ACCOUNTS: usize = 8;
pub(super) const OPENING: i64 = 1_000_000;
pub(super) const CLIENTS: usize = 3;
/// The API client that funds the accounts (the only one with the `issue` scope).
pub(super) const ISSUER: &str = "chaos-issuer";

/// The name of client `id` (`chaos-<id>`).
pub(super) fn client_name(id: usize) -> String {
    format!("chaos-{id}")
}

/// The bearer token of client `name`.
pub(super) fn token_of(name: &str) -> String {
    format!("{name}-token")
}

/// The client that owns account `C-<i>`: account `i` belongs to client `i % CLIENTS`.
pub(super) fn owner_of(account: usize) -> usize {
    account % CLIENTS
}
/// A transfer whose amount ends in these digits has its intake commit cut once (see
/// `plan::cut_commits`): its first answer is 500 `outcome_unknown`, and its retry under
/// the same key must make exactly one transfer.
pub(super) const CUT_MARK: i64 = 777;

/// One client request and what came back.
#[derive(Debug, Clone, serde::Serialize)]
pub(super) struct Call {
    pub client: usize,
    /// `/transfers` or `/orders`.
    pub path: &'static str,
    /// When the request was sent (`at_ms`: when its answer came), since the run started.
    pub sent_ms: u128,
    pub key: String,
    pub attempt: u32,
    /// A deliberate repeat of a request that was already answered 201.
    pub repeat: bool,
    pub at_ms: u128,
    pub request: Value,
    /// HTTP status, or 0 for no answer (refused, reset, timed out).
    pub status: u16,
    pub response: Value,
}

#[derive(Default)]
pub(super) struct History {
    pub calls: Vec<Call>,
    /// What the fault schedule did, in order.
    pub fired: Vec<Fired>,
    /// Every poison and hostile record produced: its topic and marker (its value).
    pub poison: Vec<Injected>,
    /// Exits of a daemon that no fault asked for (a crash).
    pub crashes: Vec<String>,
    /// Why the system was not quiet in time after the faults, if it was not.
    pub not_quiet: Option<String>,
    pub duplicates: usize,
    /// Every forged event produced (each is also in `poison`).
    pub forged: Vec<Forged>,
    /// Every webhook call the receiver got.
    pub deliveries: Vec<ReceivedCall>,
}

/// A poison or hostile record produced straight to a consumed topic.
#[derive(Debug, Clone, serde::Serialize)]
pub(super) struct Injected {
    pub topic: String,
    pub marker: String,
}

/// A forged event: its topic, the transfer or order id it names, and what it claims.
#[derive(Debug, Clone, serde::Serialize)]
pub(super) struct Forged {
    pub topic: String,
    pub id: String,
    pub what: String,
}

/// The run's logical clock and the load's state, shared by clients and faults.
#[derive(Default)]
pub(super) struct Progress {
    /// Requests answered 201 or 200: the logical clock.
    pub answered: AtomicUsize,
    /// HTTP requests sent and not answered yet.
    pub in_flight: AtomicUsize,
    /// Set when the schedule is done: the clients finish their current request and stop.
    pub stop: AtomicBool,
    /// Transfer id -> the Idempotency-Key of the request that made it.
    pub keys: Mutex<HashMap<String, String>>,
}

impl Progress {
    pub fn now(&self) -> usize {
        self.answered.load(Ordering::SeqCst)
    }
}

/// A deterministic hash of `seed` and `what` (std's SipHash with its fixed keys).
pub(super) fn hash(seed: u64, what: &str) -> u64 {
    let mut h = std::hash::DefaultHasher::new();
    (seed, what).hash(&mut h);
    h.finish()
}

/// Whether the receiver fails the first delivery of the outcome of the transfer with
/// `key`: one transfer in five, chosen by the seed. (A transfer whose answer never reached
/// its client is chosen by its id, which the seed does not fix.)
pub(super) fn fails_first_delivery(seed: u64, key: &str) -> bool {
    hash(seed, key) % 5 == 0
}

/// The next request of client `client`: mostly a transfer from one of its accounts to any
/// other, now and then one that cannot settle (more than the balance, an unknown
/// account), one from another client's account (refused 403: not its to debit), a request
/// the intake must refuse, or an order (its `externalReference` makes its retries
/// idempotent).
fn next_request(rng: &mut StdRng, client: usize) -> (&'static str, Value) {
    if rng.random_range(0..6) == 0 {
        let reference = format!("chaos-order-{}", uuid_from(rng).simple());
        let order = json!({ "externalReference": reference, "customerId": format!("cust-{}", rng.random_range(0..50)),
                            "amountCents": rng.random_range(1..100_000), "currency": "BRL" });
        return ("/orders", order);
    }
    ("/transfers", next_transfer(rng, client))
}

fn next_transfer(rng: &mut StdRng, client: usize) -> Value {
    // Now and then someone else's account: refused, and nothing may move.
    let foreign = rng.random_range(0..25) == 0;
    let sources: Vec<usize> = (0..ACCOUNTS).filter(|a| (owner_of(*a) == client) != foreign).collect();
    let from = sources[rng.random_range(0..sources.len())];
    let to = (from + rng.random_range(1..ACCOUNTS)) % ACCOUNTS;
    let amount = match rng.random_range(0..100) {
        0..=4 => OPENING * 3,
        5 => rng.random_range(1..5) * 1_000 + CUT_MARK,
        _ => match rng.random_range(1..5_000) {
            a if a % 1_000 == CUT_MARK => a + 1,
            a => a,
        },
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

fn uuid_from(rng: &mut StdRng) -> uuid::Uuid {
    uuid::Builder::from_random_bytes(rng.random()).into_uuid()
}

/// One client: requests drawn from its own stream of the seed, each retried under its key
/// until answered for good, some repeated on purpose after their 201 (a transfer under
/// the same key, an order under a new key and the same external reference).
pub(super) async fn client(id: usize, seed: u64, started: Instant, daemons: Vec<String>, shared: Shared) {
    let (progress, history) = shared;
    let http = reqwest::Client::builder().timeout(Duration::from_secs(3)).build().expect("http client");
    let mut rng = StdRng::seed_from_u64(seed ^ (id as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15));
    while !progress.stop.load(Ordering::SeqCst) {
        let (path, request) = next_request(&mut rng, id);
        // Drawn whatever the answers are, so that the stream of requests is the seed's.
        let mut key = uuid_from(&mut rng).to_string();
        let repeat_key = uuid_from(&mut rng).to_string();
        let repeats = u32::from(rng.random_range(0..8) == 0);
        let mut repeat = false;
        for _ in 0..=repeats {
            let Some(status) =
                send(id, &http, &daemons, (path, &key, &request, repeat), started, &progress, &history).await
            else {
                break;
            };
            if status != 201 {
                break;
            }
            repeat = true;
            if path == "/orders" {
                key.clone_from(&repeat_key);
            }
        }
        tokio::time::sleep(Duration::from_millis(rng.random_range(5..60))).await;
    }
}

pub(super) type Shared = (Arc<Progress>, Arc<Mutex<History>>);

/// Sends one request until it is answered for good (at most 8 attempts); its last status,
/// or `None` when it never was.
async fn send(
    id: usize,
    http: &reqwest::Client,
    daemons: &[String],
    (path, key, request, repeat): (&'static str, &str, &Value, bool),
    started: Instant,
    progress: &Progress,
    history: &Mutex<History>,
) -> Option<u16> {
    for attempt in 1..=8_u32 {
        let base = &daemons[(attempt as usize + id) % daemons.len()];
        let sent_ms = started.elapsed().as_millis();
        progress.in_flight.fetch_add(1, Ordering::SeqCst);
        let sent = http
            .post(format!("{base}{path}"))
            .header("Idempotency-Key", key)
            .bearer_auth(token_of(&client_name(id)))
            .json(request)
            .send()
            .await;
        let (status, response) = match sent {
            Ok(r) => {
                let status = r.status().as_u16();
                (status, r.json::<Value>().await.unwrap_or(Value::Null))
            }
            Err(_) => (0, Value::Null),
        };
        progress.in_flight.fetch_sub(1, Ordering::SeqCst);
        let at_ms = started.elapsed().as_millis();
        if status == 201 || status == 200 {
            if let Some(transfer) = response["id"].as_str().filter(|_| path == "/transfers") {
                progress.keys.lock().expect("keys").insert(transfer.to_owned(), key.to_owned());
            }
            progress.answered.fetch_add(1, Ordering::SeqCst);
        }
        let call = Call {
            client: id,
            path,
            sent_ms,
            key: key.to_owned(),
            attempt,
            repeat,
            at_ms,
            request: request.clone(),
            status,
            response,
        };
        history.lock().expect("history").calls.push(call);
        // Answered for good: accepted (a repeat answers 200), or refused for a reason a
        // retry cannot change.
        if status == 201 || status == 200 || (400..500).contains(&status) && status != 429 {
            return Some(status);
        }
        tokio::time::sleep(Duration::from_millis(200 * u64::from(attempt))).await;
    }
    None
}
