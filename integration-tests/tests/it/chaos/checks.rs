//! The invariants a chaos run is judged by, over its whole history and the final state of
//! the database and the topics. Each returns a [`Check`]; `super::tamper` shows each able
//! to fail.

use std::collections::{HashMap, HashSet};

use serde_json::Value;
use tally_integration_tests::{antifraud_decisions, read_topic, Deadline, KafkaRecord, TestEnv};
use uuid::Uuid;

use super::daemon::Daemon;
use super::load::{History, ACCOUNTS, OPENING};
use super::plan::Planned;
use super::{offsets, CONSUMED};

/// An invariant's outcome: how many cases were checked, and the violations.
pub(super) struct Check {
    pub name: &'static str,
    pub checked: usize,
    pub violations: Vec<String>,
}

/// A record's payload as JSON; `Null` for poison (or no payload).
pub(super) fn json_of(r: &KafkaRecord) -> Value {
    r.payload.as_deref().and_then(|p| serde_json::from_slice(p).ok()).unwrap_or(Value::Null)
}

/// A stored transfer: status, rejection reason, source, destination, amount, key.
struct Stored {
    status: String,
    reason: Option<String>,
    from: String,
    to: String,
    amount: i64,
    key: Option<String>,
}

pub(super) async fn check(env: &TestEnv, daemon: &Daemon, history: &History, plan: &[Planned]) -> Vec<Check> {
    let db = &env.db;
    let rows = db
        .query(
            "SELECT id, status, rejection_reason, source_account::text, destination_account::text, amount_cents, \
             idempotency_key FROM transfers WHERE kind = 'transfer'",
            &[],
        )
        .await;
    let stored: HashMap<Uuid, Stored> = rows
        .iter()
        .map(|r| {
            let t = Stored {
                status: r.get(1),
                reason: r.get(2),
                from: r.get(3),
                to: r.get(4),
                amount: r.get(5),
                key: r.get(6),
            };
            (r.get(0), t)
        })
        .collect();
    let postings = db
        .query(
            "SELECT p.transfer_id, p.account_id::text, p.kind::text, p.amount_cents, t.kind::text \
             FROM postings p JOIN transfers t ON t.id = p.transfer_id",
            &[],
        )
        .await;
    let all_postings: Vec<(Uuid, String, String, i64)> =
        postings.iter().map(|p| (p.get(0), p.get(1), p.get(2), p.get(3))).collect();
    // The transfers' own; issuance postings (the funding) are checked with the money.
    let postings: Vec<(Uuid, String, String, i64)> = postings
        .iter()
        .filter(|p| p.get::<_, String>(4) == "transfer")
        .map(|p| (p.get(0), p.get(1), p.get(2), p.get(3)))
        .collect();
    let outcomes = outcome_events(env, history).await;

    // First: it waits until every group has consumed everything, poison included.
    let offsets = offsets::at_the_end(env).await;
    let mut checks = vec![idempotency(history, &stored), final_status(history, &stored)];
    checks.push(postings_agree(&stored, &postings));
    checks.push(money(db.query("SELECT id::text, balance_cents, kind::text FROM accounts", &[]).await, &all_postings));
    checks.push(super::owners::only_owners_debit(env, history).await);
    let decisions = antifraud_decisions(env.bootstrap(), Deadline::secs(30)).await.expect("read decisions");
    let violations = decisions
        .iter()
        .filter(|(_, d)| d.len() > 1)
        .map(|(id, d)| format!("transfer {id}: decisions {d:?}"))
        .collect();
    checks.push(Check { name: "at most one antifraud decision per transfer", checked: decisions.len(), violations });
    let stored_decisions = db.query("SELECT transfer_id, outcome FROM antifraud_decisions", &[]).await;
    let stored_decisions: HashMap<Uuid, String> = stored_decisions.iter().map(|r| (r.get(0), r.get(1))).collect();
    checks.push(outcomes_agree(&stored, &stored_decisions, &outcomes));
    checks.push(dead_letters(env, history).await);
    checks.push(forged(env, history).await);
    checks.push(orders(env, history).await);
    checks.push(super::notified::notifications(env, history, &stored_statuses(&stored), &outcomes).await);
    checks.push(super::order::publish_order(env, history).await);
    checks.push(outbox(env).await);
    checks.push(offsets);
    checks.push(faults_fired(env, history, plan).await);
    checks.push(ledger_check(daemon).await);
    checks
}

fn stored_statuses(stored: &HashMap<Uuid, Stored>) -> HashMap<Uuid, String> {
    stored.iter().map(|(id, t)| (*id, t.status.clone())).collect()
}

/// Idempotency from the database's side: every key a client sent maps to at most one
/// transfer (exactly one when any attempt was answered 201 or 200, and the one every
/// answer named), and every transfer row carries a key some client sent (no phantoms).
/// Keys answered 500 `outcome_unknown` and retried, and deliberate repeats answered by a
/// 200 replay, are among them.
fn idempotency(history: &History, stored: &HashMap<Uuid, Stored>) -> Check {
    let mut by_db: HashMap<&str, Vec<Uuid>> = HashMap::new();
    let mut violations = Vec::new();
    for (id, t) in stored {
        match t.key.as_deref() {
            Some(key) => by_db.entry(key).or_default().push(*id),
            None => violations.push(format!("transfer {id} has no Idempotency-Key")),
        }
    }
    let mut sent: HashMap<&str, (bool, HashSet<String>, &Value)> = HashMap::new();
    for c in history.calls.iter().filter(|c| c.path == "/transfers") {
        let entry = sent.entry(&c.key).or_insert((false, HashSet::new(), &c.request));
        if c.status == 201 || c.status == 200 {
            entry.0 = true;
            entry.1.insert(c.response["id"].as_str().unwrap_or_default().to_owned());
        }
    }
    for (key, (answered, ids, request)) in &sent {
        let rows = by_db.get(key).map_or(&[][..], Vec::as_slice);
        let named: HashSet<String> = rows.iter().map(Uuid::to_string).collect();
        if rows.len() > 1 || *answered && rows.len() != 1 || ids.iter().any(|id| !named.contains(id)) {
            violations.push(format!("key {key}: rows {rows:?}, answers named {ids:?}"));
        }
        // What was stored is what was asked for.
        for t in rows.iter().filter_map(|id| stored.get(id)) {
            let asked = (request["sourceAccount"].as_str(), request["destinationAccount"].as_str());
            if asked != (Some(t.from.as_str()), Some(t.to.as_str())) || request["amountCents"] != t.amount {
                violations.push(format!("key {key}: stored {} -> {} {}, asked {request}", t.from, t.to, t.amount));
            }
        }
    }
    for (key, rows) in &by_db {
        if !sent.contains_key(key) {
            violations.push(format!("phantom transfers {rows:?} under key {key}, which no client sent"));
        }
    }
    Check { name: "one transfer per Idempotency-Key, none without a request", checked: sent.len(), violations }
}

/// Every transfer an answer named exists, and every stored transfer (answered or not:
/// a client may never have heard of its commit) is final once the system is quiet.
fn final_status(history: &History, stored: &HashMap<Uuid, Stored>) -> Check {
    let accepted: HashSet<Uuid> = history
        .calls
        .iter()
        .filter(|c| c.path == "/transfers" && (c.status == 201 || c.status == 200))
        .filter_map(|c| c.response["id"].as_str().and_then(|id| id.parse().ok()))
        .collect();
    let mut violations: Vec<String> = accepted
        .iter()
        .filter(|id| !stored.contains_key(id))
        .map(|id| format!("accepted transfer {id} is not stored"))
        .collect();
    violations.extend(
        stored.iter().filter(|(_, t)| t.status == "PENDING").map(|(id, _)| format!("transfer {id} is still PENDING")),
    );
    violations.extend(history.not_quiet.clone());
    Check { name: "every accepted transfer has one final status", checked: stored.len(), violations }
}

fn postings_agree(stored: &HashMap<Uuid, Stored>, postings: &[(Uuid, String, String, i64)]) -> Check {
    let mut by_transfer: HashMap<Uuid, Vec<(String, String, i64)>> = HashMap::new();
    for (t, account, kind, amount) in postings {
        by_transfer.entry(*t).or_default().push((account.clone(), kind.clone(), *amount));
    }
    let mut violations = Vec::new();
    for (id, t) in stored {
        let mut got = by_transfer.remove(id).unwrap_or_default();
        got.sort();
        let mut want = Vec::new();
        if t.status == "SETTLED" {
            want = vec![(t.from.clone(), "D".to_owned(), t.amount), (t.to.clone(), "C".to_owned(), t.amount)];
            want.sort();
        }
        if got != want {
            violations.push(format!("transfer {id} {}: postings {got:?}, expected {want:?}", t.status));
        }
    }
    violations.extend(by_transfer.keys().map(|id| format!("postings of {id}, which is no transfer")));
    Check { name: "SETTLED: one D and one C of its amount; else none", checked: stored.len(), violations }
}

/// Money: every balance equals its postings (the funding is an issuance posting), no
/// customer balance is negative, and the balances of all accounts, the issuance account
/// included, sum to zero: what was issued is exactly the funding.
fn money(accounts: Vec<tokio_postgres::Row>, postings: &[(Uuid, String, String, i64)]) -> Check {
    let mut violations = Vec::new();
    let mut total = 0_i64;
    let mut issued = 0_i64;
    for a in &accounts {
        let (id, balance, kind): (String, i64, String) = (a.get(0), a.get(1), a.get(2));
        total += balance;
        let moved: i64 = postings.iter().filter(|p| p.1 == id).map(|p| if p.2 == "C" { p.3 } else { -p.3 }).sum();
        if kind == "issuance" {
            issued -= balance;
        }
        if (kind == "customer" && balance < 0) || balance != moved {
            violations.push(format!("account {id}: balance {balance}, postings {moved}"));
        }
    }
    if total != 0 {
        violations.push(format!("money not conserved: balances sum to {total} in {} accounts", accounts.len()));
    }
    if issued != OPENING * ACCOUNTS as i64 {
        violations.push(format!("issued {issued}, the funding was {}", OPENING * ACCOUNTS as i64));
    }
    Check { name: "money conserved, no negative balance, balances = postings", checked: accounts.len(), violations }
}

/// Every outcome event on `transfers.settled` and `transfers.rejected`, by transfer id:
/// the distinct (topic, event id) pairs and each event's payload. A redelivery or a
/// republished outbox row repeats an event under its id; two ids are two outcomes.
/// Every copy's payload is kept: copies of one event must agree byte for byte.
pub(super) type Outcomes = HashMap<String, HashMap<(String, String), Vec<Vec<u8>>>>;

async fn outcome_events(env: &TestEnv, history: &History) -> Outcomes {
    // What the harness forged is no outcome of tally's.
    let injected: std::collections::HashSet<&[u8]> = history.poison.iter().map(|i| i.marker.as_bytes()).collect();
    let mut out: Outcomes = HashMap::new();
    for topic in ["transfers.settled", "transfers.rejected"] {
        for r in read_topic(env.bootstrap(), topic, Deadline::secs(30)).await.expect("read an outcome topic") {
            if injected.contains(r.payload.as_deref().unwrap_or_default()) {
                continue;
            }
            let v = json_of(&r);
            let (Some(id), Some(event)) = (v["transferId"].as_str(), v["eventId"].as_str()) else { continue };
            let copies = out.entry(id.to_owned()).or_default().entry((topic.to_owned(), event.to_owned())).or_default();
            copies.push(r.payload.clone().unwrap_or_default());
        }
    }
    out
}

/// Each final status agrees with the stored antifraud decision, and with the one outcome
/// event published for it (its topic); a pending transfer has no outcome event.
fn outcomes_agree(stored: &HashMap<Uuid, Stored>, decisions: &HashMap<Uuid, String>, outcomes: &Outcomes) -> Check {
    let mut violations = Vec::new();
    for (id, t) in stored {
        let events: Vec<&(String, String)> =
            outcomes.get(&id.to_string()).map(|e| e.keys().collect()).unwrap_or_default();
        let decision = decisions.get(id).map(String::as_str);
        let blocked = t.reason.as_deref() == Some("BLOCKED_BY_ANTIFRAUD");
        let want_topic = match t.status.as_str() {
            "SETTLED" => Some("transfers.settled"),
            "REJECTED" => Some("transfers.rejected"),
            _ => None,
        };
        let agrees = match (t.status.as_str(), decision) {
            ("PENDING", _) => true,
            ("SETTLED", Some("ANALYZED")) => true,
            ("REJECTED", Some("BLOCKED")) => blocked,
            ("REJECTED", Some("ANALYZED")) => !blocked,
            _ => false,
        };
        let events_agree = match want_topic {
            Some(topic) => events.len() == 1 && events[0].0 == topic,
            None => events.is_empty(),
        };
        if !agrees || !events_agree {
            violations.push(format!(
                "transfer {id} {} ({:?}): stored decision {decision:?}, outcome events {events:?}",
                t.status, t.reason
            ));
        }
    }
    for (id, events) in outcomes {
        if !id.parse::<Uuid>().is_ok_and(|id| stored.contains_key(&id)) {
            violations.push(format!("outcome events {:?} for {id}, which is no transfer", events.keys()));
        }
        for ((topic, event), copies) in events {
            if copies.iter().any(|c| *c != copies[0]) {
                violations.push(format!("event {event} on {topic} published with different bytes"));
            }
        }
    }
    Check { name: "status, stored decision and outcome event agree", checked: stored.len(), violations }
}

/// The consumer groups of tally that read `topic` (default configuration): those whose
/// offsets are checked, and antifraud.
fn consumers_of(topic: &str) -> Vec<String> {
    let c = tally_engine::Config::default();
    let mut groups: Vec<String> =
        offsets::groups().into_iter().filter(|(_, topics)| topics.iter().any(|t| t == topic)).map(|(g, _)| g).collect();
    if topic == c.kafka.topics.transfers_requested {
        groups.push(c.antifraud.group_id);
    }
    groups
}

/// Every poison and hostile record is dead-lettered (DLT topic or fallback table) by
/// every group that consumes its topic, and every dead letter is one of them.
async fn dead_letters(env: &TestEnv, history: &History) -> Check {
    // (group, payload) of every dead letter.
    let mut dead: Vec<(String, String)> = Vec::new();
    for topic in CONSUMED {
        let dlt = tally_schema::topics::dlt(topic);
        for r in read_topic(env.bootstrap(), &dlt, Deadline::secs(30)).await.expect("read a DLT") {
            let group = r.header(tally_schema::headers::DLT_CONSUMER_GROUP).unwrap_or_default().to_owned();
            dead.push((group, String::from_utf8_lossy(r.payload.as_deref().unwrap_or_default()).into_owned()));
        }
    }
    for r in env.db.query("SELECT consumer_group, payload FROM dead_letters", &[]).await {
        let payload = r.get::<_, Option<Vec<u8>>>(1).unwrap_or_default();
        dead.push((r.get(0), String::from_utf8_lossy(&payload).into_owned()));
    }
    let mut violations = Vec::new();
    for injected in &history.poison {
        for group in consumers_of(&injected.topic) {
            if !dead.iter().any(|(g, p)| *g == group && *p == injected.marker) {
                violations
                    .push(format!("poison {} on {} not dead-lettered by {group}", injected.marker, injected.topic));
            }
        }
    }
    violations.extend(dead.iter().filter(|(_, p)| !history.poison.iter().any(|i| i.marker == *p)).map(|(g, p)| {
        format!("dead-lettered by {g} without being poison: {}", p.chars().take(120).collect::<String>())
    }));
    Check { name: "every poison record dead-lettered, and nothing else", checked: history.poison.len(), violations }
}

/// No forged event moved money or changed a status: nothing exists of a transfer or an
/// order that only a forgery named (no row, decision, settlement or posting), and no
/// transfer carries a forged rejection's reason.
async fn forged(env: &TestEnv, history: &History) -> Check {
    let db = &env.db;
    let mut violations = Vec::new();
    for f in &history.forged {
        let traces = if f.what == super::inject::FORGED_REASON {
            db.scalar_i64("SELECT count(*) FROM transfers WHERE rejection_reason = $1", &[&f.what]).await
        } else if f.topic == "orders.received" {
            db.scalar_i64("SELECT count(*) FROM received_orders WHERE order_id::text = $1", &[&f.id]).await
        } else {
            db.scalar_i64(
                "SELECT (SELECT count(*) FROM transfers WHERE id::text = $1)                       + (SELECT count(*) FROM antifraud_decisions WHERE transfer_id::text = $1)                       + (SELECT count(*) FROM processed_transfers WHERE transfer_id::text = $1)                       + (SELECT count(*) FROM postings WHERE transfer_id::text = $1)",
                &[&f.id],
            )
            .await
        };
        if traces > 0 {
            violations.push(format!("forged {} ({}) on {}: {traces} rows", f.id, f.what, f.topic));
        }
    }
    Check { name: "no forged event moved money or changed a status", checked: history.forged.len(), violations }
}

/// Orders: one per external reference however often it was sent (clients repeat some on
/// purpose under a new key), and every order the intake took is received exactly once.
async fn orders(env: &TestEnv, history: &History) -> Check {
    let db = &env.db;
    let mut by_reference: HashMap<String, HashSet<String>> = HashMap::new();
    let mut requests: HashMap<&str, &Value> = HashMap::new();
    for c in history.calls.iter().filter(|c| c.path == "/orders") {
        let reference = c.request["externalReference"].as_str().unwrap_or_default();
        requests.insert(reference, &c.request);
        if c.status == 201 || c.status == 200 {
            let id = c.response["id"].as_str().unwrap_or_default().to_owned();
            by_reference.entry(reference.to_owned()).or_default().insert(id);
        }
    }
    let orders = db
        .query(
            "SELECT o.id, o.external_reference, count(r.order_id) FROM orders o \
             LEFT JOIN received_orders r ON r.order_id = o.id GROUP BY o.id",
            &[],
        )
        .await;
    // Every order taken, answered or not, is received once, as it was asked for.
    let mut violations: Vec<String> = Vec::new();
    for r in &orders {
        let (id, reference, n): (Uuid, String, i64) = (r.get(0), r.get(1), r.get(2));
        if n != 1 {
            violations.push(format!("order {id} ({reference}) received {n} times"));
        }
        if !requests.contains_key(reference.as_str()) {
            violations.push(format!("order {id} under {reference}, which no client sent"));
        }
    }
    for r in db.query("SELECT external_reference, customer_id, amount_cents FROM received_orders", &[]).await {
        let (reference, customer, amount): (String, String, i64) = (r.get(0), r.get(1), r.get(2));
        let asked = requests.get(reference.as_str());
        if asked.is_none_or(|a| a["customerId"] != customer.as_str() || a["amountCents"] != amount) {
            violations.push(format!("received {reference} {customer} {amount}, asked {asked:?}"));
        }
    }
    violations.extend(
        by_reference.iter().filter(|(_, ids)| ids.len() > 1).map(|(r, ids)| format!("reference {r}: orders {ids:?}")),
    );
    let mut rows_by_reference: HashMap<String, usize> = HashMap::new();
    let received: HashMap<Uuid, i64> = orders
        .iter()
        .map(|r| {
            *rows_by_reference.entry(r.get(1)).or_default() += 1;
            (r.get(0), r.get(2))
        })
        .collect();
    violations.extend(
        rows_by_reference.iter().filter(|(_, n)| **n > 1).map(|(r, n)| format!("reference {r}: {n} order rows")),
    );
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
    Check { name: "every accepted order received exactly once", checked: by_reference.len(), violations }
}

/// Every outbox row published, and on its topic.
async fn outbox(env: &TestEnv) -> Check {
    let rows = env.db.query("SELECT id, topic, published_at IS NOT NULL FROM outbox_events", &[]).await;
    let outbox: HashMap<String, (String, bool)> =
        rows.iter().map(|r| (r.get::<_, Uuid>(0).to_string(), (r.get(1), r.get(2)))).collect();
    let mut on_topics: HashSet<(String, String)> = HashSet::new();
    for topic in outbox.values().map(|r| r.0.as_str()).collect::<HashSet<_>>() {
        for r in read_topic(env.bootstrap(), topic, Deadline::secs(30)).await.expect("read an outbox topic") {
            on_topics.extend(r.header("event-id").map(|id| (topic.to_owned(), id.to_owned())));
        }
    }
    let mut violations = Vec::new();
    for (id, (topic, published)) in &outbox {
        if !published {
            violations.push(format!("row {id} on {topic} unpublished"));
        } else if !on_topics.contains(&(topic.clone(), id.clone())) {
            violations.push(format!("row {id} marked published but not on {topic}"));
        }
    }
    Check { name: "every outbox row published, and on its topic", checked: outbox.len(), violations }
}

/// Every scheduled fault fired, while work was in flight; every graceful stop exited 0
/// within its minute; no daemon exited on its own; the intake's commit was cut (a key in
/// `chaos_cut`) and the cut key's retry answered 201.
async fn faults_fired(env: &TestEnv, history: &History, plan: &[Planned]) -> Check {
    let mut violations = history.crashes.clone();
    for (i, p) in plan.iter().enumerate() {
        match history.fired.get(i) {
            None => violations.push(format!("{:?} due after {} answers never fired", p.kind, p.after)),
            Some(f) if f.kind != p.kind => violations.push(format!("fault {i} is {:?}, planned {:?}", f.kind, p.kind)),
            Some(f) if f.in_flight <= 0 => violations.push(format!("{:?} fired with nothing in flight", f.kind)),
            Some(f) if f.exit.is_some_and(|e| e != Some(0)) => {
                violations.push(format!("a graceful stop did not exit 0 within a minute: {}", f.what));
            }
            Some(_) => {}
        }
    }
    let cut: HashSet<String> = env.db.query("SELECT key FROM chaos_cut", &[]).await.iter().map(|r| r.get(0)).collect();
    let unknown = |c: &&super::load::Call| c.status == 500 && c.response["error"]["code"] == "outcome_unknown";
    let answered_unknown: HashSet<&str> = history.calls.iter().filter(unknown).map(|c| c.key.as_str()).collect();
    let retried = history
        .calls
        .iter()
        .filter(|c| c.status == 201 && cut.contains(&c.key) && answered_unknown.contains(c.key.as_str()))
        .count();
    if retried == 0 {
        violations.push(format!(
            "no cut commit answered 500 outcome_unknown and then 201 ({} keys cut, {} answered outcome_unknown)",
            cut.len(),
            answered_unknown.len()
        ));
    }
    Check { name: "every scheduled fault fired while work was in flight", checked: plan.len() + 1, violations }
}

async fn ledger_check(daemon: &Daemon) -> Check {
    let body: Value = reqwest::Client::new()
        .get(format!("{}/admin/ledger/check", daemon.admin))
        .send()
        .await
        .expect("ledger check")
        .json()
        .await
        .expect("ledger check JSON");
    let violations = if body["ok"] == true { vec![] } else { vec![body.to_string()] };
    Check { name: "the daemon's own ledger check", checked: 1, violations }
}

/// The history's dump for a failed run's post-mortem.
pub(super) fn dump(history: &History, seed: u64, plan: &[Planned]) -> Value {
    serde_json::json!({ "seed": seed, "plan": plan, "fired": history.fired, "calls": history.calls,
                        "poison": history.poison })
}
