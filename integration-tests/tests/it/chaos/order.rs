//! Per-key publish order of the outbox, as clients can observe it.

use std::collections::{HashMap, HashSet};

use tally_integration_tests::{read_topic, Deadline, TestEnv};

use super::checks::{json_of, Check};
use super::load::History;

/// Per key, transfer requests appear in the order clients saw them committed: when one
/// request's 201 came before another's first attempt was sent, both from one source
/// account, the first is published first. (Only the order clients can observe is
/// checked: `seq` is the insert order, commit order can differ, and PostgreSQL keeps no
/// commit times unless `track_commit_timestamp` is on.)
pub(super) async fn publish_order(env: &TestEnv, history: &History) -> Check {
    let mut timing: HashMap<String, (u128, u128)> = HashMap::new();
    let mut first_sent: HashMap<&str, u128> = HashMap::new();
    for c in history.calls.iter().filter(|c| c.path == "/transfers") {
        let sent = first_sent.entry(&c.key).or_insert(c.sent_ms);
        *sent = (*sent).min(c.sent_ms);
    }
    // A 200 replay proves the commit too.
    for c in history.calls.iter().filter(|c| c.path == "/transfers" && (c.status == 201 || c.status == 200)) {
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
    Check { name: "per key, requests published in the order clients saw them", checked: firsts.len(), violations }
}
