//! `tally status`: a terminal summary of a running daemon from its admin API (readiness,
//! pipelines with lag and in-flight records, outbox backlog, dead letters, ledger check),
//! for people at a shell. Only open endpoints are read, so no token is needed.

use std::fmt::Write as _;
use std::time::Duration;

use anyhow::{anyhow, Context};
use serde_json::Value;

/// What the admin API answered.
#[derive(Debug, Clone, Default)]
pub struct Snapshot {
    pub admin: String,
    /// `GET /readyz`: `None` when ready, else the reasons.
    pub not_ready: Option<Vec<String>>,
    pub pipelines: Value,
    pub outbox: Value,
    pub dlt: Value,
    pub ledger: Value,
}

impl Snapshot {
    /// Whether everything looks healthy: ready, no pipeline degraded, the ledger check holds.
    #[must_use]
    pub fn healthy(&self) -> bool {
        let degraded = self.pipelines["pipelines"]
            .as_array()
            .is_some_and(|all| all.iter().any(|p| p["degraded"].as_bool().unwrap_or(false)));
        let unavailable = [&self.outbox, &self.dlt, &self.ledger].iter().any(|v| v.get("unavailable").is_some());
        self.not_ready.is_none() && !degraded && !unavailable && self.ledger["ok"].as_bool().unwrap_or(false)
    }
}

/// Reads every part of the summary from the admin listener at `admin` (e.g.
/// `http://127.0.0.1:9090`).
///
/// # Errors
/// When the daemon does not answer or answers something that is not its admin API.
pub async fn fetch(admin: &str) -> anyhow::Result<Snapshot> {
    let admin = admin.trim_end_matches('/').to_owned();
    let client = reqwest::Client::builder().timeout(Duration::from_secs(30)).build()?;
    let get = |path: &'static str| {
        let (client, url) = (client.clone(), format!("{admin}{path}"));
        async move {
            let res = client.get(&url).send().await.with_context(|| format!("no answer from {url}"))?;
            let status = res.status();
            let body: Value =
                res.json().await.with_context(|| format!("{url} answered {status} with something not JSON"))?;
            anyhow::Ok((status, body))
        }
    };
    let (ready, readyz) = get("/readyz").await?;
    let not_ready = (!ready.is_success()).then(|| {
        readyz["reasons"]
            .as_array()
            .map(|p| p.iter().filter_map(Value::as_str).map(str::to_owned).collect())
            .unwrap_or_else(|| vec![readyz.to_string()])
    });
    let (_, pipelines) = get("/admin/pipelines").await?;
    if !pipelines["pipelines"].is_array() {
        return Err(anyhow!("{admin} does not look like a tally admin listener (no pipelines in /admin/pipelines)"));
    }
    // An endpoint that answers with an error shows as unavailable, never as zeros. The
    // ledger check answers 409 with its findings when an invariant does not hold.
    let part = |(status, body): (reqwest::StatusCode, Value), ok: &[u16]| {
        if status.is_success() || ok.contains(&status.as_u16()) {
            body
        } else {
            let error = body["error"]["message"].as_str().map_or_else(|| body.to_string(), str::to_owned);
            serde_json::json!({ "unavailable": format!("{status}: {error}") })
        }
    };
    let outbox = part(get("/admin/outbox").await?, &[]);
    let dlt = part(get("/admin/dlt").await?, &[]);
    let ledger = part(get("/admin/ledger/check").await?, &[409]);
    Ok(Snapshot { admin, not_ready, pipelines, outbox, dlt, ledger })
}

fn count(v: &Value) -> i64 {
    v.as_i64().unwrap_or(0)
}

/// The summary as text. Over 80 lines because it is the screen, top to bottom: readiness,
/// the pipeline table, then one line each for the outbox, dead letters and the ledger.
#[must_use]
pub fn render(s: &Snapshot) -> String {
    let mut out = String::new();
    match &s.not_ready {
        None => {
            let _ = writeln!(out, "tally at {}: ready", s.admin);
        }
        Some(problems) => {
            let _ = writeln!(out, "tally at {}: NOT READY", s.admin);
            for p in problems {
                let _ = writeln!(out, "  - {p}");
            }
        }
    }
    let _ = writeln!(out);
    let _ = writeln!(
        out,
        "{:<24} {:<10} {:>10} {:>8} {:>9} {:>13} {:>8}",
        "pipeline", "state", "partitions", "lag", "in flight", "keys in retry", "workers"
    );
    for p in s.pipelines["pipelines"].as_array().into_iter().flatten() {
        let state = if p["degraded"].as_bool().unwrap_or(false) {
            "DEGRADED"
        } else if p["paused"].as_bool().unwrap_or(false) {
            "paused"
        } else if !p["assigned"].as_bool().unwrap_or(false) {
            "joining"
        } else {
            "running"
        };
        let partitions = p["partitions"].as_array().map_or(&[][..], Vec::as_slice);
        let lag: i64 = partitions.iter().map(|q| count(&q["lag"]).max(0)).sum();
        let in_flight: i64 = partitions.iter().map(|q| count(&q["inFlight"])).sum();
        let _ = writeln!(
            out,
            "{:<24} {:<10} {:>10} {:>8} {:>9} {:>13} {:>8}",
            p["name"].as_str().unwrap_or("?"),
            state,
            partitions.len(),
            lag,
            in_flight,
            count(&p["keysInRetry"]),
            count(&p["liveWorkers"]),
        );
        if let Some(reason) = p["degradedReason"].as_str() {
            let _ = writeln!(out, "  waiting for: {reason}");
        }
    }
    let _ = writeln!(out);
    for (what, v) in [("outbox", &s.outbox), ("dead letters", &s.dlt), ("ledger check", &s.ledger)] {
        if let Some(why) = v["unavailable"].as_str() {
            let _ = writeln!(out, "{what}: UNAVAILABLE ({why})");
        }
    }
    if s.outbox.get("unavailable").is_none() {
        let parked = count(&s.outbox["parked"]);
        let _ = writeln!(
            out,
            "outbox: {} pending, oldest {:.1} s{}",
            count(&s.outbox["pending"]),
            s.outbox["oldestAgeSeconds"].as_f64().unwrap_or(0.0),
            if parked > 0 {
                format!(
                    "; {parked} parked (refused by the broker, GET /admin/outbox), {} held behind them",
                    count(&s.outbox["held"])
                )
            } else {
                String::new()
            }
        );
    }
    let topics: Vec<String> = s.dlt["topics"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|t| count(&t["records"]) > 0)
        .map(|t| format!("{} {}", t["topic"].as_str().unwrap_or("?"), count(&t["records"])))
        .collect();
    if s.dlt.get("unavailable").is_none() {
        let _ = writeln!(
            out,
            "dead letters: {} in topics{}; {} in the dead_letters table ({} not replayed)",
            count(&s.dlt["records"]),
            if topics.is_empty() { String::new() } else { format!(" ({})", topics.join(", ")) },
            count(&s.dlt["deadLetters"]["records"]),
            count(&s.dlt["deadLetters"]["notReplayed"]),
        );
    }
    let invariants = s.ledger["invariants"].as_array().map_or(&[][..], Vec::as_slice);
    let failed: Vec<&str> =
        invariants.iter().filter(|i| !i["ok"].as_bool().unwrap_or(false)).filter_map(|i| i["name"].as_str()).collect();
    if s.ledger.get("unavailable").is_some() {
        // Said above.
    } else if s.ledger["ok"].as_bool().unwrap_or(false) {
        let _ = writeln!(out, "ledger check: ok ({} invariants hold)", invariants.len());
    } else {
        let _ = writeln!(out, "ledger check: FAILED ({})", failed.join(", "));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn snapshot() -> Snapshot {
        Snapshot {
            admin: "http://a:9090".into(),
            not_ready: None,
            pipelines: json!({ "pipelines": [
                { "name": "ledger", "assigned": true, "paused": false, "degraded": false, "keysInRetry": 1, "liveWorkers": 3,
                  "partitions": [{ "lag": 5, "inFlight": 2 }, { "lag": null, "inFlight": 1 }] },
                { "name": "antifraud", "assigned": true, "paused": true, "degraded": false, "partitions": [] },
                { "name": "projection", "assigned": true, "paused": false, "degraded": true,
                  "degradedReason": "connection refused", "partitions": [] }
            ]}),
            outbox: json!({ "pending": 7, "oldestAgeSeconds": 1.25 }),
            dlt: json!({ "records": 2, "topics": [{ "topic": "transfers.analyzed-dlt", "records": 2 }, { "topic": "x-dlt", "records": 0 }],
                         "deadLetters": { "records": 1, "notReplayed": 1 } }),
            ledger: json!({ "ok": true, "invariants": [{ "name": "money_conserved", "ok": true }] }),
        }
    }

    #[test]
    fn the_summary_shows_each_part() {
        let text = render(&snapshot());
        assert!(text.starts_with("tally at http://a:9090: ready"), "{text}");
        let ledger = text.lines().find(|l| l.starts_with("ledger ")).expect("a ledger row");
        assert_eq!(ledger.split_whitespace().collect::<Vec<_>>(), ["ledger", "running", "2", "5", "3", "1", "3"]);
        assert!(text.contains("antifraud                paused"), "{text}");
        assert!(text.contains("DEGRADED") && text.contains("waiting for: connection refused"), "{text}");
        assert!(
            text.contains("outbox: 7 pending, oldest 1.2 s\n") || text.contains("outbox: 7 pending, oldest 1.3 s\n")
        );
        assert!(text.contains("dead letters: 2 in topics (transfers.analyzed-dlt 2); 1 in the dead_letters table"));
        assert!(text.contains("ledger check: ok (1 invariants hold)"), "{text}");
        assert!(!snapshot().healthy(), "a degraded pipeline is not healthy");
    }

    #[test]
    fn parked_outbox_rows_are_named() {
        let mut s = snapshot();
        s.outbox = json!({ "pending": 9, "oldestAgeSeconds": 30.0, "parked": 2, "held": 5 });
        let text = render(&s);
        assert!(
            text.contains(
                "outbox: 9 pending, oldest 30.0 s; 2 parked (refused by the broker, GET /admin/outbox), 5 held behind them\n"
            ),
            "{text}"
        );
    }

    #[test]
    fn problems_are_named() {
        let mut s = snapshot();
        s.not_ready = Some(vec!["database unreachable".into()]);
        s.ledger = json!({ "ok": false, "invariants": [{ "name": "money_conserved", "ok": false }, { "name": "b", "ok": true }] });
        let text = render(&s);
        assert!(text.contains("NOT READY") && text.contains("  - database unreachable"), "{text}");
        assert!(text.contains("ledger check: FAILED (money_conserved)"), "{text}");
        s.dlt = json!({ "unavailable": "503 Service Unavailable: Kafka timed out" });
        let text = render(&s);
        assert!(text.contains("dead letters: UNAVAILABLE (503 Service Unavailable: Kafka timed out)"), "{text}");
        assert!(!text.contains("dead letters: 0"), "never zeros for an error: {text}");
        s.not_ready = None;
        s.pipelines = json!({ "pipelines": [] });
        s.ledger = json!({ "ok": true, "invariants": [] });
        assert!(!s.healthy(), "an unavailable part is not healthy");
    }
}
