//! The history checker under faults (`make chaos`; a short profile runs in `make test`).
//!
//! Two `tally run` processes in one group on the embedded broker of this process (one of
//! them without the outbox and notifications), a webhook receiver that fails first
//! deliveries, clients posting transfers and orders over HTTP with `Idempotency-Key`
//! retries, deliberate repeats, bad requests, and poison, hostile and duplicate records
//! produced straight to the consumed topics, while a schedule of faults hits them:
//! kill -9, SIGSTOP past the session timeout then SIGCONT, SIGTERM mid-flow, the database
//! connections of tally killed, the database refusing tally or read-only (a failover)
//! for longer than a stage's whole retry budget, the intake's commit cut
//! (its client gets 500 `outcome_unknown` and retries), broker request errors, added
//! broker latency, a broker down for a while and a topic refused for a while. Every
//! request, answer and fault is recorded; after the faults stop and the system is quiet,
//! invariants are checked over the whole history and the final state of the database
//! and the topics, and a table of them is printed.
//!
//! **Replay.** What the harness decides comes from the seed (`TALLY_CHAOS_SEED`, printed
//! at the start; a value that does not parse is an error): the schedule, each client's
//! keys, references, amounts and repeats, the markers of poison records, the daemons'
//! instance ids and which deliveries the webhook fails. Faults, injected records and the
//! end of the load are due on a logical clock, the count of answered requests, not at
//! wall-clock times. What the daemons do in between is not deterministic, nor are the
//! clients' interleaving, the record copied as a duplicate (the newest on its topic) and
//! the failed delivery of a transfer whose answer had not reached its client yet. A run
//! whose checks fail prints the command that replays it and keeps its history under
//! `target/chaos/<seed>/`. `TALLY_CHAOS_SECS` sets the size of the schedule (one fault
//! per 5 s, every kind at least once; `make chaos` runs 300), `TALLY_CHAOS_LOG` the
//! daemons' log filter (default `warn`; their logs are `tally-<instance>.log` under
//! `target/test-logs/<test>/`), `TALLY_FAULT` a fault switch for a replay of a switch's run.
//!
//! **Every check can fail.** After the verdict on the real run, the final state and the
//! history are tampered with once per check (`tamper.rs`) and every check must report
//! it; `each_broken_guarantee_is_caught::<switch>` runs the daemons with a fault switch
//! (`TALLY_FAULT`, debug builds only) that breaks one guarantee, a test per switch, and
//! requires the checker to catch it. docs/ARCHITECTURE.md has the table of checks, what trips
//! each and the line it prints.
//!
//! Not covered: noida-db as the broker (it never expels a member killed with kill -9),
//! static membership (the embedded broker's coordinator ignores `group.instance.id`: a
//! restarted static member is a new member there, and its rejoin stalled for over a
//! minute in one run), and antifraud's committed offsets (the embedded broker does not
//! store transactional ones).
#![allow(clippy::expect_used)] // tests: a failed expectation is a failed test, with its message

mod checks;
mod daemon;
mod inject;
mod load;
mod notified;
mod offsets;
mod order;
mod owners;
mod plan;
mod tamper;

use std::collections::HashSet;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::json;
use tally_integration_tests::{TestEnv, WebhookReceiver};

use checks::Check;
use daemon::Daemon;
use load::{History, Progress, ACCOUNTS, CLIENTS, OPENING};
use plan::{Kind, Planned};

const SECRET: &str = "chaos-webhook-secret";

/// The topics tally consumes: poison and duplicates go to each in turn.
const CONSUMED: [&str; 5] =
    ["transfers.requested", "transfers.analyzed", "transfers.settled", "transfers.rejected", "orders.received"];

/// The daemons' configuration file: an authenticated intake, a client per load client
/// (every scope but `issue`) and the issuer (`accounts:open`, `issue`, `read`).
fn clients_config() -> std::path::PathBuf {
    use sha2::Digest;
    let digest = |name: &str| hex::encode(sha2::Sha256::digest(load::token_of(name).as_bytes()));
    let mut toml = String::from("[http]\nintake_auth = true\n");
    for id in 0..CLIENTS {
        let name = load::client_name(id);
        toml.push_str(&format!("[[http.clients]]\nname = \"{name}\"\ntoken_sha256 = \"{}\"\n", digest(&name)));
    }
    toml.push_str(&format!(
        "[[http.clients]]\nname = \"{}\"\ntoken_sha256 = \"{}\"\nscopes = [\"accounts:open\", \"issue\", \"read\"]\n",
        load::ISSUER,
        digest(load::ISSUER)
    ));
    let path = std::env::temp_dir().join(format!("tally-chaos-{}.toml", uuid::Uuid::new_v4().simple()));
    std::fs::write(&path, toml).expect("write the chaos configuration");
    path
}

/// What one run does besides the load.
struct Profile {
    /// Sets the size of the schedule drawn from the seed.
    secs: u64,
    /// Requests answered after the last fault before the load stops.
    tail: usize,
    /// A fault switch inside the daemons (test builds only).
    fault: Option<&'static str>,
    /// The schedule; `None` draws one from the seed, one fault per 5 s of `secs`.
    plan: Option<Vec<Planned>>,
    quiet_within: Duration,
}

/// A finished run: what it keeps alive for later looks, its history and its checks.
struct Run {
    env: TestEnv,
    daemons: Vec<Daemon>,
    history: History,
    plan: Vec<Planned>,
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

fn secs() -> u64 {
    match std::env::var("TALLY_CHAOS_SECS") {
        Ok(s) => s.trim().parse().unwrap_or_else(|e| panic!("TALLY_CHAOS_SECS={s:?} is not a number of seconds: {e}")),
        Err(_) => 30,
    }
}

/// The one command that replays a run of `seed`.
fn replay_command(seed: u64, profile: &Profile) -> String {
    match (profile.plan.is_some(), profile.fault) {
        // A fault switch's run of its test.
        (true, fault) => format!(
            "TALLY_CHAOS_SEED={seed} cargo test -p tally-integration-tests --test it \
             chaos::each_broken_guarantee_is_caught::{} -- --exact --nocapture",
            fault.unwrap_or_default().replace('-', "_")
        ),
        (false, fault) => format!(
            "{}TALLY_CHAOS_SEED={seed} TALLY_CHAOS_SECS={} cargo test -p tally-integration-tests --test it \
             chaos::chaos_history_holds_every_invariant -- --nocapture",
            fault.map(|f| format!("TALLY_FAULT={f} ")).unwrap_or_default(),
            profile.secs
        ),
    }
}

/// `TALLY_FAULT` for a replay of a run with a fault switch; a name that is no switch is
/// an error, not a clean run.
fn fault_switch() -> Option<&'static str> {
    let name = std::env::var("TALLY_FAULT").ok().filter(|f| !f.is_empty())?;
    let known = tally_actors::faults::Fault::ALL.iter().find(|k| k.name() == name).map(|k| k.name());
    Some(known.unwrap_or_else(|| panic!("TALLY_FAULT={name:?} is no fault switch")))
}

async fn run(seed: u64, profile: &Profile) -> Run {
    let plan = profile.plan.clone().unwrap_or_else(|| plan::plan(seed, Kind::ALL.len().max(profile.secs as usize / 5)));
    let replay = replay_command(seed, profile);
    let header = format!(
        "chaos: seed {seed}, {} faults (TALLY_CHAOS_SECS={}){}\nchaos: replay with {replay}",
        plan.len(),
        profile.secs,
        profile.fault.map(|f| format!(", fault switch {f}")).unwrap_or_default(),
    );
    eprintln!("{header}");
    // What a failure prints with its logs, and `make test` at the end of the run.
    tally_integration_tests::logs::record_seed(&replay);
    let schedule: String = plan.iter().map(|p| format!("chaos: planned {p:?}\n")).collect();
    let _ = std::fs::write(
        tally_integration_tests::logs::test_log_dir().join(format!("chaos-{seed}-schedule.log")),
        format!("{header}\n{schedule}"),
    );
    let env = TestEnv::new().await;
    plan::arm_commit_cuts(&env).await;
    let progress = Arc::new(Progress::default());
    let receiver = receiver(seed, Arc::clone(&progress)).await;
    let mut config = tally_engine::Config::default();
    config.notifications.webhook_url = tally_engine::config::SecretUrl::new(receiver.url.clone());
    for spec in tally_engine::topics::topic_specs(&config) {
        env.broker.create_topic_if_missing(&spec.name, spec.partitions, 1).expect("topic");
    }
    let fault = ("TALLY_FAULT", profile.fault.unwrap_or(""));
    let clients_config = clients_config();
    let clients_config = clients_config.to_str().expect("a UTF-8 path");
    let webhook = [
        ("TALLY__NOTIFICATIONS__WEBHOOK_URL", receiver.url.as_str()),
        ("TALLY__NOTIFICATIONS__WEBHOOK_SECRET", SECRET),
        ("TALLY_CONFIG", clients_config),
        fault,
    ];
    let mut daemons = vec![
        Daemon::new("a", seed, &webhook),
        Daemon::new(
            "b",
            seed,
            &[
                ("TALLY__PIPELINES__OUTBOX", "false"),
                ("TALLY__PIPELINES__NOTIFICATIONS", "false"),
                ("TALLY_CONFIG", clients_config),
                fault,
            ],
        ),
    ];
    let http = reqwest::Client::builder().timeout(Duration::from_secs(5)).build().expect("http client");
    for d in &mut daemons {
        d.start(&env);
    }
    for d in &daemons {
        d.wait_ready(&http).await;
    }
    // Each client opens its own accounts; the issuer funds them.
    for i in 0..ACCOUNTS {
        let owner = load::client_name(load::owner_of(i));
        let res = http
            .post(format!("{}/accounts", daemons[0].intake))
            .bearer_auth(load::token_of(&owner))
            .json(&json!({ "id": format!("C-{i}"), "currency": "BRL", "initialBalanceCents": 0 }))
            .send()
            .await
            .expect("create account");
        assert_eq!(res.status(), 201, "create account C-{i}");
        let res = http
            .post(format!("{}/issuances", daemons[0].intake))
            .bearer_auth(load::token_of(load::ISSUER))
            .header("Idempotency-Key", format!("fund-C-{i}"))
            .json(&json!({ "destinationAccount": format!("C-{i}"), "amountCents": OPENING, "currency": "BRL" }))
            .send()
            .await
            .expect("fund account");
        assert_eq!(res.status(), 201, "fund account C-{i}");
    }

    let history = Arc::new(Mutex::new(History::default()));
    let started = Instant::now();
    // A bound on the whole load, far beyond what the schedule needs: a schedule that
    // cannot finish is reported, not waited for.
    let deadline = started + Duration::from_secs(profile.secs * 6 + 180);
    let last = plan.last().map_or(0, |p| p.after) + profile.tail;
    let bases: Vec<String> = daemons.iter().map(|d| d.intake.clone()).collect();
    let clients: Vec<_> = (0..CLIENTS)
        .map(|i| {
            let shared = (Arc::clone(&progress), Arc::clone(&history));
            tokio::spawn(load::client(i, seed, started, bases.clone(), shared))
        })
        .collect();
    let cutter = tokio::spawn(plan::cut_commits(env.db.url().to_owned(), Arc::clone(&progress), started));
    let shared = (&*progress, &*history);
    tokio::join!(
        async {
            plan::execute(&env, &mut daemons, &plan, shared, started, deadline).await;
            while progress.now() < last && Instant::now() < deadline {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            progress.stop.store(true, Ordering::SeqCst);
        },
        inject::records(&env, seed, shared),
    );
    for c in clients {
        c.await.expect("client task");
    }
    cutter.await.expect("commit cutter");
    plan::restart_crashed(&env, &mut daemons, &history, &http).await;
    eprintln!("chaos: faults over after {:.1} s; waiting for quiescence", started.elapsed().as_secs_f64());
    let quiet = quiesce(&env, &receiver, profile.quiet_within).await;
    match &quiet {
        Ok(quiet) => eprintln!("chaos: quiet after {:.1} s", quiet.as_secs_f64()),
        Err(e) => eprintln!("chaos: {e}"),
    }

    let mut history = std::mem::take(&mut *history.lock().expect("history"));
    history.deliveries = receiver.calls();
    history.not_quiet = quiet.err();
    let checks = checks::check(&env, &daemons[0], &history, &plan).await;
    print_verdict(&history, &checks);
    Run { env, daemons, history, plan, checks }
}

/// The webhook receiver: it fails the first delivery of the transfers the seed picks
/// (by the key of the request that made each) and nothing more, so every event is
/// delivered within its attempts.
async fn receiver(seed: u64, progress: Arc<Progress>) -> WebhookReceiver {
    let failed_once = Mutex::new(HashSet::<String>::new());
    WebhookReceiver::start(move |body, _| {
        let v: serde_json::Value = serde_json::from_slice(body).unwrap_or_default();
        let transfer = v["transferId"].as_str().unwrap_or_default().to_owned();
        let key = progress.keys.lock().expect("keys").get(&transfer).cloned().unwrap_or(transfer);
        let event = v["eventId"].as_str().unwrap_or_default().to_owned();
        if load::fails_first_delivery(seed, &key) && failed_once.lock().expect("receiver state").insert(event) {
            503
        } else {
            200
        }
    })
    .await
}

fn print_verdict(history: &History, checks: &[Check]) {
    eprintln!("\n{:<62} {:>8} {:>10}", "invariant", "checked", "violated");
    for c in checks {
        eprintln!("{:<62} {:>8} {:>10}", c.name, c.checked, c.violations.len());
    }
    let mut kinds: Vec<(String, usize)> = Vec::new();
    for f in &history.fired {
        let name = format!("{:?}", f.kind);
        match kinds.iter_mut().find(|(k, _)| *k == name) {
            Some((_, n)) => *n += 1,
            None => kinds.push((name, 1)),
        }
    }
    let cut: HashSet<&str> = history
        .calls
        .iter()
        .filter(|c| c.status == 500 && c.response["error"]["code"] == "outcome_unknown")
        .map(|c| c.key.as_str())
        .collect();
    let repeats = history.calls.iter().filter(|c| c.repeat && (c.status == 200 || c.status == 201)).count();
    eprintln!(
        "history: {} calls ({} answered 201, {repeats} repeats answered, {} keys answered outcome_unknown), \
         {} poison and hostile and {} duplicate records; faults fired: {kinds:?}",
        history.calls.len(),
        history.calls.iter().filter(|c| c.status == 201).count(),
        cut.len(),
        history.poison.len(),
        history.duplicates,
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chaos_history_holds_every_invariant() {
    let _turn = TURN.lock().await;
    let seed = seed();
    let profile =
        Profile { secs: secs(), tail: 200, fault: fault_switch(), plan: None, quiet_within: Duration::from_secs(180) };
    let Run { env, mut daemons, history, plan, checks } = run(seed, &profile).await;
    let failed: Vec<&Check> = checks.iter().filter(|c| !c.violations.is_empty()).collect();
    if !failed.is_empty() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("../target/chaos/{seed}"));
        let _ = std::fs::create_dir_all(&dir);
        let dump = checks::dump(&history, seed, &plan);
        let _ = std::fs::write(dir.join("history.json"), serde_json::to_vec_pretty(&dump).unwrap_or_default());
        let first: Vec<String> =
            failed.iter().flat_map(|c| c.violations.iter().take(3).map(move |v| format!("{}: {v}", c.name))).collect();
        panic!(
            "chaos seed {seed}: invariants violated (history in {}):\n{}\nreplay: {}",
            dir.display(),
            first.join("\n"),
            replay_command(seed, &profile)
        );
    }
    // The outbox runs on daemon a only: without it the tampered outbox row stays pending.
    daemons[0].kill();
    tamper::every_check_can_fail(&env, &daemons[1], history, &plan).await;
}

/// The checker notices a daemon that breaks a guarantee: with each test fault switch on,
/// a short run reports the invariant that switch breaks. One test per switch, so that each
/// stays short and a failure names its switch.
mod each_broken_guarantee_is_caught {
    use tally_actors::faults::Fault;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn rescore() {
        super::caught(Fault::Rescore).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn offset_before_commit() {
        super::caught(Fault::OffsetBeforeCommit).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn outbox_out_of_order() {
        super::caught(Fault::OutboxOutOfOrder).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn skip_inbox() {
        super::caught(Fault::SkipInbox).await;
    }
}

/// A short run with `fault` on reports a violation under one of the checks that
/// [`tamper::SWITCHES`] names for it.
async fn caught(fault: tally_actors::faults::Fault) {
    let _turn = TURN.lock().await;
    let (_, invariants) = tamper::SWITCHES
        .iter()
        .find(|(f, _)| *f == fault)
        .unwrap_or_else(|| panic!("{} has no checks named in tamper::SWITCHES", fault.name()));
    // A record whose offset was committed before its effect is never redelivered: the
    // transfer or order it carried is never final. (On the embedded broker antifraud
    // re-reads its input after every rebalance, since the mock keeps no transactional
    // offsets, so a lost ledger record is often published again; a lost order is not.)
    // One kill -9 of daemon a (every pipeline, the only outbox publisher), after the
    // consumers' first auto-commit (5 s), so that offsets stored early are committed when
    // the daemon dies, and so that daemon b reads again what a had read.
    let kill = Planned { kind: Kind::Kill, after: 250, target: 0, millis: 2_000 };
    let profile = Profile {
        secs: 20,
        tail: 600,
        fault: Some(fault.name()),
        plan: Some(vec![kill]),
        quiet_within: Duration::from_secs(40),
    };
    let run = run(seed(), &profile).await;
    let seen: usize = run.checks.iter().filter(|c| invariants.contains(&c.name)).map(|c| c.violations.len()).sum();
    let reported: Vec<String> = run
        .checks
        .iter()
        .filter(|c| !c.violations.is_empty())
        .map(|c| format!("{} ({})", c.name, c.violations.len()))
        .collect();
    assert!(
        seen > 0,
        "with {} on, the checker reported nothing under {invariants:?}; it reported: {reported:?}",
        fault.name()
    );
}

/// Waits until every transfer is final, every order received, every outbox row is
/// published and the receiver has a successful delivery for every final transfer.
async fn quiesce(env: &TestEnv, receiver: &WebhookReceiver, within: Duration) -> Result<Duration, String> {
    let started = Instant::now();
    loop {
        let pending = env
            .db
            .scalar_i64("SELECT count(*) FROM transfers WHERE status = 'PENDING' AND kind = 'transfer'", &[])
            .await;
        let outbox = env.db.pending_outbox().await;
        let notified = notified::delivered(&receiver.calls()).len() as i64;
        let fin = env
            .db
            .scalar_i64("SELECT count(*) FROM transfers WHERE status <> 'PENDING' AND kind = 'transfer'", &[])
            .await;
        let orders = env
            .db
            .scalar_i64(
                "SELECT count(*) FROM orders o WHERE NOT EXISTS (SELECT 1 FROM received_orders r WHERE r.order_id = o.id)",
                &[],
            )
            .await;
        if pending == 0 && outbox == 0 && orders == 0 && notified >= fin {
            return Ok(started.elapsed());
        }
        if started.elapsed() >= within {
            return Err(format!(
                "not quiet {within:?} after the faults: {pending} transfers pending, {orders} orders not \
                 received, {outbox} outbox rows unpublished, {notified} of {fin} final transfers notified"
            ));
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}
