//! The Grafana dashboard and the Prometheus alert rules in `deploy/` against a running
//! daemon: every `tally_*` metric they reference is exposed on its `/metrics`, and the
//! rules pass `promtool check rules` and their unit tests (`promtool test rules`). Broker:
//! librdkafka's mock cluster.
#![allow(clippy::expect_used)] // tests: a failed expectation is a failed test, with its message

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use tally_integration_tests::{
    create_account, final_state, post_transfer, produce, producer, spawn_app, wait_until, Deadline, WebhookReceiver,
};

const TOKEN: &str = "deploy-admin-token";

fn deploy_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy")
}

/// Every `tally_*` and `process_*` metric family named in `text`, histogram suffixes
/// removed.
fn referenced(text: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    for prefix in ["tally_", "process_"] {
        let mut rest = text;
        while let Some(i) = rest.find(prefix) {
            let tail = &rest[i..];
            let end = tail.find(|c: char| !(c.is_ascii_alphanumeric() || c == '_')).unwrap_or(tail.len());
            let name = &tail[..end];
            let before = rest[..i].chars().last();
            let word_start = !before.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-' || c == '.');
            if word_start && name.len() > prefix.len() {
                let family = ["_bucket", "_sum", "_count"].iter().find_map(|s| name.strip_suffix(s)).unwrap_or(name);
                names.insert(family.to_owned());
            }
            rest = &tail[end.max(1)..];
        }
    }
    names
}

/// The metric families `/metrics` exposes.
fn exposed(metrics: &str) -> BTreeSet<String> {
    metrics
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.split(' ').next())
        .map(str::to_owned)
        .collect()
}

#[test]
fn the_reference_finder_finds_metric_names() {
    let found = referenced(
        r#"rate(tally_records_total[1m]) / tally_handler_seconds_bucket{x="y"} xtally_no tally-x tally_ process_cpu_seconds_total"#,
    );
    assert_eq!(
        found.into_iter().collect::<Vec<_>>(),
        ["process_cpu_seconds_total", "tally_handler_seconds", "tally_records_total"]
    );
}

/// The names in `deploy/` that `metrics` (one scrape) does not expose.
fn missing_from(metrics: &str) -> Vec<String> {
    let exposed = exposed(metrics);
    let mut missing = Vec::new();
    for file in ["grafana/tally.json", "prometheus/alerts.yml"] {
        let text = std::fs::read_to_string(deploy_dir().join(file)).expect("read a deploy file");
        let used = referenced(&text);
        assert!(used.len() >= 8, "{file} names only {used:?}");
        missing.extend(used.into_iter().filter(|n| !exposed.contains(n)).map(|n| format!("{file}: {n}")));
    }
    missing
}

/// The series an alert on `increase()` or an `== 0` needs from the start, at their value
/// before anything happened.
const AT_START: &[&str] = &[
    "tally_notification_deliveries_total{outcome=\"dead_lettered\"} 0",
    "tally_notification_deliveries_total{outcome=\"failed\"} 0",
    "tally_dlt_records_total{topic=\"transfers.analyzed-dlt\"} 0",
    "tally_records_total{outcome=\"dead_lettered\",pipeline=\"ledger\"} 0",
    "tally_stage_restarts_total{stage=\"ledger\"} 0",
    "tally_outbox_publish_failures_total 0",
    "tally_group_commit_refused_total{reason=\"overloaded\",writes=\"intake\"} 0",
    "tally_http_requests_total{route=\"/transfers\",status=\"503\"} 0",
    "tally_dlt_replayed_total{topic=\"transfers.analyzed-dlt\"} 0",
];

/// A healthy daemon without a webhook, scraped right after it is ready and again after one
/// settled transfer: every metric a panel or an alert reads is there from the start, at 0
/// for its known label sets (a counter that first appears at 1 is missed by `increase()`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fresh_daemon_exposes_every_metric_the_dashboard_and_the_alerts_use() {
    let (_env, app) = spawn_app(|c| c.http.admin_token = tally_engine::config::Secret::new(TOKEN)).await;
    wait_until("the daemon is ready", Deadline::DEFAULT, || async {
        let res = app.send(app.client.get(format!("{}/readyz", app.admin_url))).await;
        if res.status() == 200 {
            Ok(())
        } else {
            Err(res.text().await.unwrap_or_default())
        }
    })
    .await;
    let first = app.metrics().await;
    let missing = missing_from(&first);
    assert!(missing.is_empty(), "right after /readyz, /metrics lacks {missing:?}");
    let absent: Vec<&&str> = AT_START.iter().filter(|s| !first.lines().any(|l| l == **s)).collect();
    assert!(absent.is_empty(), "right after /readyz, /metrics lacks the series {absent:?}");

    create_account(&app, "DEP-A", 10_000, "BRL").await;
    create_account(&app, "DEP-B", 0, "BRL").await;
    let id = post_transfer(&app, "DEP-A", "DEP-B", 100).await;
    assert_eq!(final_state(&app, id).await["status"], "SETTLED");
    let missing = missing_from(&app.metrics().await);
    assert!(missing.is_empty(), "after a settled transfer, /metrics lacks {missing:?}");
}

/// The names stay exposed once things happen: a dead letter, webhook retries, a ledger
/// check, a pause and a resume.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_metric_the_dashboard_and_the_alerts_use_is_exposed() {
    // The first delivery of every notification fails: the retry topics get used.
    let receiver = WebhookReceiver::start(|_, n| if n < 2 { 500 } else { 200 }).await;
    let url = receiver.url.clone();
    let (env, app) = spawn_app(move |c| {
        c.notifications.webhook_url = tally_engine::config::SecretUrl::new(url);
        c.notifications.webhook_secret = tally_engine::config::Secret::new("s3cret");
        c.http.admin_token = tally_engine::config::Secret::new(TOKEN);
        // The daemon's own ledger check publishes tally_ledger_invariant_ok.
        c.ledger.check_interval = std::time::Duration::from_secs(1);
    })
    .await;
    create_account(&app, "DEP-A", 10_000, "BRL").await;
    create_account(&app, "DEP-B", 0, "BRL").await;
    let id = post_transfer(&app, "DEP-A", "DEP-B", 100).await;
    assert_eq!(final_state(&app, id).await["status"], "SETTLED");
    // A poison record: the ledger dead-letters it.
    let p = producer(env.bootstrap());
    produce(&p, "transfers.analyzed", None, "DEP-A", b"{not json", &[("event-type", "TransferAnalyzed")]).await;
    wait_until("a dead letter, a notification retry and a periodic ledger check", Deadline::DEFAULT, || async {
        let m = app.metrics().await;
        let seen = [
            "tally_dlt_records_total{topic=\"transfers.analyzed-dlt\"} 1",
            "tally_retry_records_total{attempt=\"2\",topic=\"transfers.settled-retry-",
            "tally_ledger_invariant_ok{invariant=\"money_conserved\"} 1",
        ];
        let counted = |prefix: &str| m.lines().any(|l| l.starts_with(prefix) && !l.ends_with(" 0"));
        if seen.iter().all(|s| counted(s)) {
            Ok(())
        } else {
            Err(format!("not all of {seen:?} yet"))
        }
    })
    .await;
    for path in ["/admin/pipelines/projection/pause", "/admin/pipelines/projection/resume"] {
        let res = app.send(app.client.post(format!("{}{path}", app.admin_url)).bearer_auth(TOKEN)).await;
        assert_eq!(res.status(), 200, "{path}");
    }
    assert_eq!(app.admin_get("/admin/dlt").await.status(), 200);
    let missing = missing_from(&app.metrics().await);
    assert!(missing.is_empty(), "/metrics lacks {missing:?}");
}

/// `promtool check rules` and the rules' unit tests, with the promtool of
/// `scripts/ensure-promtool.sh` (on PATH, or taken from Debian's package). Where neither is
/// possible the test fails, unless `TALLY_SKIP_PROMTOOL=1` says to skip it on purpose (refused
/// under CI).
#[test]
fn the_alert_rules_pass_promtool() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let found = std::process::Command::new(root.join("scripts/ensure-promtool.sh")).output().expect("run the script");
    if found.status.code() == Some(3) && tally_integration_tests::skip_asked("TALLY_SKIP_PROMTOOL") {
        eprintln!("promtool skipped on purpose: {}", String::from_utf8_lossy(&found.stderr));
        return;
    }
    assert!(found.status.success(), "ensure-promtool.sh: {}", String::from_utf8_lossy(&found.stderr));
    let promtool = String::from_utf8(found.stdout).expect("a path").trim().to_owned();
    for args in [
        &["check", "rules", "alerts.yml"][..],
        &["check", "config", "prometheus.yml"],
        &["test", "rules", "alerts_test.yml"],
    ] {
        let out = std::process::Command::new(&promtool)
            .args(args)
            .current_dir(deploy_dir().join("prometheus"))
            .output()
            .expect("run promtool");
        assert!(
            out.status.success(),
            "promtool {args:?}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}
