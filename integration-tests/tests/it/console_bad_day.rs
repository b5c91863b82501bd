//! The operator console on a bad day, in a real browser (Debian's headless Chromium over
//! WebDriver) against a running daemon with a real PostgreSQL: panels that cannot refresh
//! during a database outage are marked stale with their age; the partition table fits or
//! scrolls inside its card; a daemon without an admin token says so and how to set one;
//! errors read as sentences (the body's message); a favicon, so no 404 in the browser's
//! log; the transfer list by account and status; the throughput history kept by the
//! daemon across a reload; and the replay log of DLT topic records, with the warning
//! before a second replay. Screenshots go to `target/ui/`. Broker: librdkafka's mock
//! cluster.
#![allow(clippy::expect_used)] // tests: a failed expectation is a failed test, with its message

use serde_json::{json, Value};
use tally_integration_tests::{
    create_account, final_state, json_body, post_transfer, produce, producer, spawn_app, wait_until, Browser, Deadline,
    TestApp,
};

const TOKEN: &str = "bad-day-admin-token";
const DLT: &str = "transfers.analyzed-dlt";

fn with_token(c: &mut tally_integration_tests::tally_engine::Config) {
    c.http.admin_token = tally_integration_tests::tally_engine::config::Secret::new(TOKEN);
}

async fn admin(app: &TestApp, path: &str, token: Option<&str>) -> (u16, Value) {
    let mut req = app.client.get(format!("{}{path}", app.admin_url));
    if let Some(t) = token {
        req = req.bearer_auth(t);
    }
    let res = app.send(req).await;
    (res.status().as_u16(), json_body(res).await)
}

async fn admin_post(app: &TestApp, path: &str, body: &Value) -> (u16, Value) {
    let res = app.send(app.client.post(format!("{}{path}", app.admin_url)).bearer_auth(TOKEN).json(body)).await;
    (res.status().as_u16(), json_body(res).await)
}

/// What the console makes of an error body's message: a capital first letter and a full
/// stop.
fn as_sentence(message: &str) -> String {
    let t = message.trim();
    let mut chars = t.chars();
    let s = chars.next().map(|c| c.to_uppercase().collect::<String>()).unwrap_or_default() + chars.as_str();
    if s.ends_with(['.', '!', '?']) {
        s
    } else {
        format!("{s}.")
    }
}

/// Waits until `script` (a function body) returns `true` in the page.
async fn wait_js(browser: &Browser, what: &str, script: &str) {
    wait_until(what, Deadline::DEFAULT, || async {
        match browser.eval(script).await {
            Value::Bool(true) => Ok(()),
            other => Err(format!("{other}")),
        }
    })
    .await;
}

fn stale_seconds(text: &str) -> Option<u64> {
    text.strip_prefix("stale: ")?.strip_suffix(" s old")?.parse().ok()
}

fn keep(shots: &mut Vec<std::path::PathBuf>, shot: std::path::PathBuf) {
    let bytes = std::fs::metadata(&shot).expect("a screenshot").len();
    assert!(bytes > 10_000, "{} is {bytes} bytes", shot.display());
    println!("screenshot: {}", shot.display());
    shots.push(shot);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn panels_that_cannot_refresh_during_a_database_outage_are_marked_stale_with_their_age() {
    let Some(browser) = Browser::start().await else { return };
    let (mut env, app) = spawn_app(with_token).await;
    create_account(&app, "ST-A", 10_000, "BRL").await;
    create_account(&app, "ST-B", 0, "BRL").await;
    let id = post_transfer(&app, "ST-A", "ST-B", 100).await;
    final_state(&app, id).await;

    browser.goto(&format!("{}/", app.admin_url)).await;
    browser.wait_text("#outbox [data-stat='outbox-pending'] .value", "nothing pending", |t| t == "0").await;
    browser.wait_text("#ledger-state", "the ledger check", |t| t == "all invariants hold").await;
    browser.wait_text("[data-stat='dlt-table'] .value", "the dead_letters count", |t| t == "0").await;
    assert!(browser.text("#outbox .stale").await.is_none(), "fresh panels are not marked");

    env.db.refuse_connections().await;
    browser.click("#ledger-run").await;
    for panel in ["outbox", "ledger", "dlt-summary"] {
        browser
            .wait_text(&format!("#{panel} .stale .age"), "marked stale with its age", |t| stale_seconds(t).is_some())
            .await;
    }
    // The age counts up while the outage lasts, and the old values stay, dimmed.
    browser
        .wait_text("#outbox .stale .age", "an age of 3 s or more", |t| stale_seconds(t).is_some_and(|s| s >= 3))
        .await;
    assert_eq!(browser.text("#outbox [data-stat='outbox-pending'] .value").await.as_deref(), Some("0"));
    assert_eq!(browser.text("#ledger-state").await.as_deref(), Some("all invariants hold"));
    let why = browser.text("#outbox .stale .why").await.expect("the reason");
    assert!(why.starts_with(|c: char| c.is_uppercase()) && why.ends_with('.'), "a sentence: {why}");
    assert!(browser.text("#pipelines-panel > .stale").await.is_none(), "the pipelines need no database");
    browser.wait_text("#ready-state", "not ready", |t| t == "not ready").await;
    let mut shots = vec![];
    keep(&mut shots, browser.screenshot("overview-stale-during-outage").await);

    env.db.allow_connections().await;
    // The other panels refresh on the next poll; the ledger check runs once a minute, or
    // when asked, as here once the daemon is ready again.
    browser.wait_text("#ready-state", "ready again", |t| t == "ready").await;
    wait_js(&browser, "the ledger check can be run again", "return !document.getElementById('ledger-run').disabled;")
        .await;
    browser.click("#ledger-run").await;
    wait_js(&browser, "the stale marks gone", "return document.querySelectorAll('.stale').length === 0;").await;
    browser.close().await;
}

/// Every pipeline card's partition table, opened: its widths, whether its box scrolls
/// sideways, whether every header can be scrolled into view, and whether the card holds it.
const MEASURE_PARTITION_TABLES: &str = r"
    document.querySelectorAll('.pipeline details').forEach((d) => { d.open = true; });
    const out = [];
    for (const card of document.querySelectorAll('.pipeline')) {
      const t = card.querySelector('details table');
      const box = t.parentElement;
      const scrolls = ['auto', 'scroll'].includes(getComputedStyle(box).overflowX);
      let reachable = true;
      for (const th of t.querySelectorAll('th')) {
        th.scrollIntoView({ block: 'nearest', inline: 'nearest' });
        const r = th.getBoundingClientRect();
        const b = box.getBoundingClientRect();
        if (r.left < b.left - 1 || r.right > b.right + 1) reachable = false;
      }
      box.scrollLeft = 0;
      out.push({ name: card.dataset.name, table: t.scrollWidth, box: box.clientWidth, scrolls, reachable,
                 headers: t.querySelectorAll('th').length, cardFits: card.scrollWidth <= card.clientWidth });
    }
    return out;";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_partition_table_fits_or_scrolls_inside_its_card() {
    let Some(browser) = Browser::start().await else { return };
    let (_env, app) = spawn_app(|_| {}).await;
    browser.goto(&format!("{}/", app.admin_url)).await;
    browser.wait_text(".pipeline[data-name='ledger'] .state", "running", |t| t == "running").await;
    let mut shots = vec![];
    // Wide (cards side by side) and narrow (one card, narrower than the partition table).
    for width in [1400, 480] {
        browser.resize(width, 1000).await;
        browser
            .eval("document.querySelectorAll('.pipeline details').forEach((d) => { d.open = true; }); return true;")
            .await;
        browser.wait_text(".pipeline[data-name='ledger'] details th", "the partition table", |t| t == "topic").await;
        let measured = browser.eval(MEASURE_PARTITION_TABLES).await;
        println!("partition tables at {width} px: {measured}");
        let cards = measured.as_array().expect("the measures");
        assert!(cards.len() >= 4, "{measured}");
        for c in cards {
            let fits = c["table"].as_i64() <= c["box"].as_i64();
            let scrolls = c["scrolls"] == true && c["reachable"] == true;
            assert!(fits || scrolls, "at {width} px the table neither fits nor scrolls to every header: {c}");
            assert_eq!(c["cardFits"], true, "at {width} px the card overflows: {c}");
            assert_eq!(c["headers"], 7, "{c}");
        }
        if width == 480 {
            let wider = cards.iter().any(|c| c["table"].as_i64() > c["box"].as_i64());
            assert!(wider, "at 480 px some table is wider than its card (else the scrolling is not checked)");
        }
        keep(&mut shots, browser.screenshot(&format!("overview-partitions-{width}px")).await);
    }
    browser.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_an_admin_token_the_console_says_none_is_configured_and_serves_a_favicon() {
    let Some(browser) = Browser::start().await else { return };
    let (_env, app) = spawn_app(|_| {}).await;
    // The daemon tells which case it is, and nothing else.
    assert_eq!(admin(&app, "/admin/token/status", None).await, (200, json!({ "configured": false })));
    let (_env2, other) = spawn_app(with_token).await;
    assert_eq!(admin(&other, "/admin/token/status", None).await, (200, json!({ "configured": true })));
    other.stop().await;
    for path in ["/favicon.ico", "/console/favicon.svg"] {
        let res = app.send(app.client.get(format!("{}{path}", app.admin_url))).await;
        assert_eq!(res.status(), 200, "{path}");
        let kind = res.headers().get("content-type").and_then(|v| v.to_str().ok()).unwrap_or("").to_owned();
        assert_eq!(kind, "image/svg+xml", "{path}");
    }

    browser.goto(&format!("{}/", app.admin_url)).await;
    browser.wait_text("#mode", "read-only without a token", |t| t == "read-only: no admin token configured").await;
    browser.wait_text(".pipeline[data-name='ledger'] .state", "running", |t| t == "running").await;
    browser.wait_text("#ready-state", "ready", |t| t == "ready").await;
    let log = browser.console_log().await;
    let not_found: Vec<_> = log.iter().filter(|(_, m)| m.contains("404") || m.contains("favicon")).collect();
    assert!(not_found.is_empty(), "the browser log shows a missing resource: {not_found:?}");

    browser.type_into("#token", "any-token-at-all").await;
    browser.click("#token-save").await;
    let said = browser.wait_text("#flash", "why no token is accepted", |t| t.contains("No admin token")).await;
    assert!(said.contains("http.admin_token") && said.contains("restart"), "{said}");
    assert!(!said.contains("not accepted."), "{said}");
    // The log is read for real: the refused token's request is in it.
    let later = browser.console_log().await;
    assert!(later.iter().any(|(_, m)| m.contains("/admin/token") && m.contains("403")), "{later:?}");
    assert_eq!(browser.text("#mode").await.as_deref(), Some("read-only: no admin token configured"));
    let mut shots = vec![];
    keep(&mut shots, browser.screenshot("token-none-configured").await);
    browser.close().await;
}

/// A transfer the test made, and where it ended.
struct Made {
    id: String,
    from: &'static str,
    to: &'static str,
    status: String,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_transfer_list_searches_by_account_and_status_a_page_at_a_time() {
    let (_env, app) = spawn_app(with_token).await;
    create_account(&app, "TL-A", 10_000, "BRL").await;
    create_account(&app, "TL-B", 0, "BRL").await;
    create_account(&app, "TL-C", 0, "BRL").await;
    create_account(&app, "TL-D", 0, "BRL").await;
    let mut made = vec![];
    for (from, to, amount) in
        [("TL-A", "TL-B", 100), ("TL-A", "TL-C", 200), ("TL-A", "TL-B", 300), ("TL-D", "TL-A", 500)]
    {
        let id = post_transfer(&app, from, to, amount).await;
        let status = final_state(&app, id).await["status"].as_str().expect("a status").to_owned();
        made.push(Made { id: id.to_string(), from, to, status });
    }
    // The list holds issuances too (TL-A's opening balance): set aside, but seen.
    let listed = |body: &Value, kind: &str| -> Vec<String> {
        body["transfers"]
            .as_array()
            .expect("transfers")
            .iter()
            .filter(|t| t["kind"] == kind)
            .map(|t| t["id"].as_str().expect("id").to_owned())
            .collect()
    };
    let ids = |body: &Value| listed(body, "transfer");
    let newest_first = |pick: &dyn Fn(&Made) -> bool| -> Vec<String> {
        made.iter().rev().filter(|t| pick(t)).map(|t| t.id.clone()).collect()
    };

    assert_eq!(admin(&app, "/admin/transfers", None).await.0, 401, "accounts and amounts need the token");
    let (status, body) = admin(&app, "/admin/transfers?account=TL-B", Some(TOKEN)).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(ids(&body), newest_first(&|t| t.from == "TL-B" || t.to == "TL-B"));
    assert_eq!(body["next"], Value::Null);
    for wanted in ["SETTLED", "REJECTED"] {
        let (_, body) = admin(&app, &format!("/admin/transfers?status={}", wanted.to_lowercase()), Some(TOKEN)).await;
        assert_eq!(ids(&body), newest_first(&|t| t.status == wanted), "{wanted}");
    }
    // A page at a time: every transfer of TL-A, one per page, newest first.
    let mut seen = vec![];
    let mut path = "/admin/transfers?account=TL-A&limit=1".to_owned();
    loop {
        let (status, body) = admin(&app, &path, Some(TOKEN)).await;
        assert_eq!(status, 200, "{body}");
        seen.extend(ids(&body));
        match body["next"].as_str() {
            Some(next) => path = format!("/admin/transfers?account=TL-A&limit=1&before={next}"),
            None => break,
        }
        assert!(seen.len() <= made.len(), "the pages end");
    }
    assert_eq!(seen, newest_first(&|t| t.from == "TL-A" || t.to == "TL-A"));
    let (_, body) = admin(&app, "/admin/transfers?account=TL-A", Some(TOKEN)).await;
    assert_eq!(listed(&body, "issuance").len(), 1, "TL-A's opening balance: {body}");
    for (query, names) in [
        ("limit=0", "limit"),
        ("limit=201", "limit"),
        ("limit=many", "limit"),
        ("status=done", "status"),
        ("before=yesterday", "before"),
        ("account=A%20B", "account"),
        ("acount=TL-A", "acount"),
    ] {
        let (status, body) = admin(&app, &format!("/admin/transfers?{query}"), Some(TOKEN)).await;
        assert_eq!((status, body["error"]["code"].as_str()), (400, Some("bad_request")), "{query}: {body}");
        let message = body["error"]["message"].as_str().expect("a message");
        assert!(message.contains(names) && message.ends_with('.'), "{query}: {message}");
    }

    let Some(browser) = Browser::start().await else { return };
    browser.goto(&format!("{}/#/transfer", app.admin_url)).await;
    browser.type_into("#token", TOKEN).await;
    browser.click("#token-save").await;
    browser.wait_text("#mode", "operator mode", |t| t == "operator").await;
    browser.type_into("#transfers-account", "TL-B").await;
    browser.eval("document.getElementById('transfers-status').value = 'SETTLED'; return true;").await;
    browser.click("#transfers-search").await;
    let expected = newest_first(&|t| (t.from == "TL-B" || t.to == "TL-B") && t.status == "SETTLED");
    let count =
        browser.wait_text("#transfers-count", "the list", |t| t.contains("shown") || t.contains("No transfer")).await;
    assert_eq!(count, format!("{} transfer(s) shown, newest first; no more.", expected.len()));
    let shown = browser
        .eval("return [...document.querySelectorAll('#transfers-table tbody tr')].map((r) => r.dataset.id);")
        .await;
    assert_eq!(shown, json!(expected));
    let mut shots = vec![];
    keep(&mut shots, browser.screenshot("transfer-list").await);
    browser.click("#transfers-table tbody tr a").await;
    browser.wait_text("#transfer-status", "the lookup of the first", |t| t == "SETTLED").await;

    // Errors read as the body's message, as a sentence: a bad search, a bad id.
    browser.type_into("#transfers-account", "A B").await;
    browser.click("#transfers-search").await;
    let (_, body) = admin(&app, "/admin/transfers?account=A%20B&limit=50", Some(TOKEN)).await;
    let want = as_sentence(body["error"]["message"].as_str().expect("a message"));
    browser.wait_text("#transfers-error", "the refusal", |t| t == want).await;
    browser.goto(&format!("{}/#/transfer/not-a-uuid", app.admin_url)).await;
    let (_, body) = admin(&app, "/admin/transfers/not-a-uuid", Some(TOKEN)).await;
    let want = as_sentence(body["error"]["message"].as_str().expect("a message"));
    let shown = browser.wait_text("#transfer-error", "the refusal", |t| !t.is_empty()).await;
    assert_eq!(shown, want, "the body's message, as a sentence");
    assert!(!shown.contains("HTTP 400") && !shown.contains('{'), "{shown}");
    keep(&mut shots, browser.screenshot("transfer-error-sentence").await);

    // The daemon gone: a sentence too, not "Failed to fetch".
    app.stop().await;
    browser.click("#transfers-search").await;
    browser
        .wait_text("#transfers-error", "the daemon unreachable", |t| {
            t == "The daemon cannot be reached: it may be down or restarting."
        })
        .await;
    browser.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_throughput_history_is_kept_by_the_daemon_and_survives_a_reload() {
    let Some(browser) = Browser::start().await else { return };
    let (_env, app) = spawn_app(|_| {}).await;
    create_account(&app, "TP-A", 10_000, "BRL").await;
    create_account(&app, "TP-B", 0, "BRL").await;
    for amount in [100, 200, 300] {
        let id = post_transfer(&app, "TP-A", "TP-B", amount).await;
        final_state(&app, id).await;
    }
    let total = |body: &Value, series: &str| -> u64 {
        body["points"].as_array().map_or(0, |ps| ps.iter().map(|p| p["counts"][series].as_u64().unwrap_or(0)).sum())
    };
    let body = wait_until("the daemon counted the transfers", Deadline::DEFAULT, || async {
        let (_, body) = admin(&app, "/admin/throughput", None).await;
        if total(&body, "intake") >= 3 && total(&body, "ledger") >= 3 {
            Ok(body)
        } else {
            Err(body.to_string())
        }
    })
    .await;
    assert_eq!(body["intervalSeconds"], 5, "{body}");
    assert_eq!(body["capacity"], 720, "{body}");

    let drawn = r"const row = document.querySelector(`#throughput [data-series='intake']`);
        return row ? { total: Number(row.dataset.total), intervals: Number(row.dataset.intervals) } : null;";
    browser.goto(&format!("{}/", app.admin_url)).await;
    wait_js(&browser, "the intake's throughput drawn", "const r = document.querySelector(`#throughput [data-series='intake']`); return !!r && Number(r.dataset.total) >= 3;").await;
    // A reload starts the page from nothing: what it draws comes from the daemon.
    browser.client.refresh().await.expect("reload");
    wait_js(&browser, "the history after the reload", "const r = document.querySelector(`#throughput [data-series='intake']`); return !!r && Number(r.dataset.total) >= 3;").await;
    let after = browser.eval(drawn).await;
    assert!(after["intervals"].as_u64().is_some_and(|n| n >= 1), "{after}");
    let ledger = browser.text("#throughput [data-series='ledger'] .label").await.expect("the ledger's row");
    assert!(ledger.contains("/s"), "{ledger}");
    assert!(browser.client.find(fantoccini::Locator::Css("#throughput svg.bars rect")).await.is_ok());
    let mut shots = vec![];
    keep(&mut shots, browser.screenshot("overview-throughput-after-reload").await);
    browser.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dlt_topic_record_replayed_once_is_logged_and_a_second_replay_is_warned_about() {
    let (env, app) = spawn_app(with_token).await;
    let p = producer(env.bootstrap());
    produce(&p, "transfers.analyzed", None, "RL-A", b"{not json", &[("event-type", "TransferAnalyzed")]).await;
    let first = wait_until("the poison record in the DLT", Deadline::DEFAULT, || async {
        let (status, body) = admin(&app, &format!("/admin/dlt/{DLT}"), Some(TOKEN)).await;
        match body["records"].as_array().map(Vec::len) {
            Some(1) => Ok(body["records"][0].clone()),
            _ => Err(format!("{status}: {body}")),
        }
    })
    .await;
    assert_eq!(first["replayedBefore"], Value::Null, "{first}");
    let (partition, offset) = (first["partition"].as_i64().expect("p"), first["offset"].as_i64().expect("o"));
    let selection = json!({ "partition": partition, "fromOffset": offset, "toOffset": offset });
    let replay = format!("/admin/dlt/{DLT}/replay");

    assert_eq!(admin(&app, "/admin/replays", None).await.0, 401, "the log shows record keys");
    assert_eq!(admin(&app, "/admin/replays?source=%00", Some(TOKEN)).await.0, 400);
    assert_eq!(admin(&app, "/admin/replays", Some(TOKEN)).await, (200, json!({ "replays": [], "next": null })));
    let (status, plan) = admin_post(&app, &format!("{replay}?dryRun=true"), &selection).await;
    assert_eq!(status, 200, "{plan}");
    assert_eq!((plan["alreadyReplayed"].as_i64(), plan["replayLog"].as_str()), (Some(0), Some("ok")), "{plan}");
    let (status, done) = admin_post(&app, &replay, &selection).await;
    assert_eq!((status, done["replayed"].as_i64(), done["logged"].as_bool()), (200, Some(1), Some(true)), "{done}");
    let landed = done["records"][0]["replayedOffset"].clone();

    let (_, log) = admin(&app, "/admin/replays", Some(TOKEN)).await;
    let entries = log["replays"].as_array().expect("the log");
    assert_eq!(entries.len(), 1, "{log}");
    let e = &entries[0];
    assert_eq!(
        (&e["source"], &e["sourcePartition"], &e["sourceOffset"], &e["originalTopic"], &e["key"], &e["replayedOffset"]),
        (&json!(DLT), &json!(partition), &json!(offset), &json!("transfers.analyzed"), &json!("RL-A"), &landed),
        "{log}"
    );
    let (_, plan) = admin_post(&app, &format!("{replay}?dryRun=true"), &selection).await;
    assert_eq!(plan["alreadyReplayed"], 1, "{plan}");
    assert_eq!(plan["records"][0]["replayedBefore"]["times"], 1, "{plan}");
    // The copy is poison again: a second DLT record, never replayed.
    let page = wait_until("the copy dead-lettered again", Deadline::DEFAULT, || async {
        let (_, body) = admin(&app, &format!("/admin/dlt/{DLT}"), Some(TOKEN)).await;
        match body["records"].as_array().map(Vec::len) {
            Some(2) => Ok(body),
            _ => Err(body.to_string()),
        }
    })
    .await;
    assert_eq!(page["records"][0]["replayedBefore"]["times"], 1, "{page}");
    assert_eq!(page["records"][1]["replayedBefore"], Value::Null, "{page}");
    assert_eq!(admin(&app, "/admin/replays?limit=0", Some(TOKEN)).await.0, 400);

    let Some(browser) = Browser::start().await else { return };
    browser.goto(&format!("{}/#/dlt/{DLT}", app.admin_url)).await;
    browser.type_into("#token", TOKEN).await;
    browser.click("#token-save").await;
    browser.wait_text("#mode", "operator mode", |t| t == "operator").await;
    browser.wait_text("#dlt-topic", "the DLT listed", |t| t.contains(DLT)).await;
    browser.wait_text("#replay-log", "the replay log", |t| t.contains(DLT) && t.contains("RL-A")).await;
    browser.click("#dlt-load").await;
    browser.wait_text("#dlt-count", "both records", |t| t == "2 record(s) shown").await;
    let marked = browser.text(&format!(".record[data-where='{partition}/{offset}'] .replayed")).await;
    assert!(marked.is_some_and(|m| m.starts_with("replayed 1×")), "the replayed record is marked");
    browser.type_into("#dlt-partition", &partition.to_string()).await;
    browser.type_into("#dlt-from", &offset.to_string()).await;
    browser.type_into("#dlt-to", &offset.to_string()).await;
    browser.click("#dlt-dry-run").await;
    browser
        .wait_text("#dlt-already", "the warning", |t| t.starts_with("1 of these record(s) were replayed before"))
        .await;
    assert_eq!(browser.enabled("#dlt-replay").await, Some(false), "no second replay without consent");
    let mut shots = vec![];
    keep(&mut shots, browser.screenshot("dlt-replayed-before-warning").await);
    browser.click("#dlt-again").await;
    browser.wait_text("#dlt-replay", "the replay offered again", |t| t == "Replay 1 record(s) again").await;
    browser.click("#dlt-replay").await;
    browser.wait_text("#dlt-replayed", "the second replay", |t| t == "Replayed 1 record(s).").await;
    wait_js(
        &browser,
        "both replays in the log",
        "return document.querySelectorAll('#replay-log tbody tr').length === 2;",
    )
    .await;
    keep(&mut shots, browser.screenshot("dlt-replay-log").await);
    browser.close().await;
}
