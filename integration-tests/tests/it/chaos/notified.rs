//! The notification invariants of a chaos run.

use std::collections::{HashMap, HashSet};

use serde_json::Value;
use tally_integration_tests::{ReceivedCall, TestEnv};
use uuid::Uuid;

use super::checks::{Check, Outcomes};
use super::load::History;
use super::SECRET;

/// The event ids answered 2xx, by transfer id.
pub(super) fn delivered(calls: &[ReceivedCall]) -> HashMap<String, HashSet<String>> {
    let mut by_transfer: HashMap<String, HashSet<String>> = HashMap::new();
    for c in calls.iter().filter(|c| (200..300).contains(&c.status)) {
        let body: Value = serde_json::from_slice(&c.body).unwrap_or(Value::Null);
        let event = c.headers.get("x-tally-event-id").cloned().unwrap_or_default();
        by_transfer.entry(body["transferId"].as_str().unwrap_or_default().to_owned()).or_default().insert(event);
    }
    by_transfer
}

/// Every final transfer is notified under exactly one event id (one outcome notification
/// per transfer), every delivery is signed and carries the published event's bytes, and
/// every delivery tally recorded is one the receiver answered 2xx.
pub(super) async fn notifications(
    env: &TestEnv,
    history: &History,
    statuses: &HashMap<Uuid, String>,
    outcomes: &Outcomes,
) -> Check {
    let delivered = delivered(&history.deliveries);
    let mut violations: Vec<String> = statuses
        .iter()
        .filter(|(_, status)| *status != "PENDING")
        .filter_map(|(id, status)| match delivered.get(&id.to_string()).map(HashSet::len) {
            Some(1) => None,
            n => Some(format!("{status} transfer {id} delivered under {n:?} event ids")),
        })
        .collect();
    let published: HashMap<&str, &Vec<Vec<u8>>> = outcomes
        .values()
        .flat_map(|events| events.iter().map(|((_, event), copies)| (event.as_str(), copies)))
        .collect();
    for c in &history.deliveries {
        if c.headers.get("x-tally-signature") != Some(&signature(&c.body)) {
            violations.push(format!("bad signature on {}", String::from_utf8_lossy(&c.body)));
        }
        let event = c.headers.get("x-tally-event-id").map_or("", String::as_str);
        if published.get(event).is_none_or(|copies| !copies.contains(&c.body)) {
            violations.push(format!("delivery of event {event} is not the published event: {}", body_of(c)));
        }
    }
    let answered: HashSet<(String, String)> = history
        .deliveries
        .iter()
        .filter(|c| (200..300).contains(&c.status))
        .map(|c| {
            let body: Value = serde_json::from_slice(&c.body).unwrap_or(Value::Null);
            let event = c.headers.get("x-tally-event-id").cloned().unwrap_or_default();
            (event, body["transferId"].as_str().unwrap_or_default().to_owned())
        })
        .collect();
    let recorded = env.db.query("SELECT event_id, transfer_id FROM notification_deliveries", &[]).await;
    for r in &recorded {
        let (event, transfer): (Uuid, Uuid) = (r.get(0), r.get(1));
        if !answered.contains(&(event.to_string(), transfer.to_string())) {
            violations.push(format!("delivery of event {event} (transfer {transfer}) recorded, never answered 2xx"));
        }
    }
    Check {
        name: "every final transfer notified once, signed, as published",
        checked: history.deliveries.len() + recorded.len(),
        violations,
    }
}

/// `sha256=<hex of HMAC-SHA256(secret, body)>`, computed here rather than by tally's own
/// function.
fn signature(body: &[u8]) -> String {
    use hmac::{Hmac, Mac};
    let mut mac = Hmac::<sha2::Sha256>::new_from_slice(SECRET.as_bytes()).expect("HMAC takes any key length");
    mac.update(body);
    format!("sha256={}", hex::encode(mac.finalize().into_bytes()))
}

fn body_of(c: &ReceivedCall) -> String {
    String::from_utf8_lossy(&c.body).chars().take(160).collect()
}
