//! The fault schedule of a chaos run: drawn whole from the seed before the run starts,
//! each fault due after a number of answered requests (the logical clock), and each one
//! recorded when it fires with the work in flight at that moment.

use std::sync::atomic::Ordering;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{RngExt, SeedableRng};
use rdkafka::types::RDKafkaRespErr;
use tally_engine::broker::api_key;
use tally_integration_tests::TestEnv;

use super::daemon::Daemon;
use super::load::{History, Progress};

/// The kinds of scheduled fault.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
pub(super) enum Kind {
    /// kill -9 of a daemon, restarted after a while.
    Kill,
    /// SIGSTOP past the consumers' session timeout, then SIGCONT: a zombie that wakes with
    /// a stale generation and work in hand.
    Stop,
    /// SIGTERM mid-flow: the graceful stop must finish (or hand back) its work and exit 0.
    Term,
    /// Every database connection of tally ended.
    DbConnections,
    /// The database refuses tally for longer than a stage's whole retry budget.
    DbRefused,
    /// A failover as tally sees it: connections ended, the database read-only for as long.
    DbReadOnly,
    /// A few request errors on one broker API.
    BrokerErrors,
    /// Latency added to every answer of one broker.
    BrokerLatency,
    /// One broker down for a while.
    BrokerDown,
    /// The broker refuses one topic's records for a while (as an ACL would).
    TopicRefused,
}

impl Kind {
    pub const ALL: [Kind; 10] = [
        Kind::Kill,
        Kind::Stop,
        Kind::Term,
        Kind::DbConnections,
        Kind::DbRefused,
        Kind::DbReadOnly,
        Kind::BrokerErrors,
        Kind::BrokerLatency,
        Kind::BrokerDown,
        Kind::TopicRefused,
    ];
}

/// One fault of the schedule: its kind, when it is due on the logical clock, and what the
/// seed drew for it (which daemon, broker or topic, how long).
#[derive(Debug, Clone, serde::Serialize)]
pub(super) struct Planned {
    pub kind: Kind,
    /// Due once this many requests were answered.
    pub after: usize,
    /// Which daemon, broker, API or topic (an index into the matching list).
    pub target: usize,
    pub millis: u64,
}

/// A fault that fired.
#[derive(Debug, Clone, serde::Serialize)]
pub(super) struct Fired {
    pub kind: Kind,
    pub at_ms: u128,
    /// The logical clock when it fired.
    pub answered: usize,
    /// Requests in flight plus transfers not final yet, just before it fired.
    pub in_flight: i64,
    pub what: String,
    /// For `Term`: the daemon's exit (`None`: it did not stop within a minute).
    pub exit: Option<Option<i32>>,
}

/// The topics whose records only the outbox writes: refusing one for a while parks rows
/// (retried from 5 s on) and costs nothing. (Antifraud's outputs are not among them: a
/// topic it may not write costs the inputs bound for it, by design.)
const REFUSABLE: [&str; 3] = ["transfers.requested", "transfers.settled", "orders.received"];

/// The consumers' session timeout (`session.timeout.ms`, tally's default): a stopped
/// daemon stays stopped longer than this.
const SESSION_TIMEOUT: Duration = Duration::from_secs(10);

/// The schedule for `seed`: `count` faults (every kind at least once when `count` allows,
/// in an order the seed draws), each due 40 to 120 answered requests after the previous.
pub(super) fn plan(seed: u64, count: usize) -> Vec<Planned> {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut kinds = Kind::ALL.to_vec();
    kinds.shuffle(&mut rng);
    while kinds.len() < count {
        kinds.push(Kind::ALL[rng.random_range(0..Kind::ALL.len())]);
    }
    kinds.truncate(count.max(1));
    let mut after = 0;
    kinds
        .into_iter()
        .map(|kind| {
            after += rng.random_range(40..120);
            let (target, millis) = match kind {
                Kind::Kill | Kind::Term => (rng.random_range(0..2), rng.random_range(500..3_000)),
                Kind::Stop => (rng.random_range(0..2), rng.random_range(2_000..4_000)),
                Kind::DbConnections => (0, 0),
                // Longer than a stage's whole retry budget (0.5 + 1 + 2 + 4 + 8 s by
                // default): a stage that counted the outage against it would dead-letter.
                Kind::DbRefused | Kind::DbReadOnly => (0, rng.random_range(16_500..20_000)),
                Kind::BrokerErrors => (rng.random_range(0..3), 0),
                Kind::BrokerLatency => (rng.random_range(0..3), rng.random_range(50..400)),
                Kind::BrokerDown => (rng.random_range(0..3), rng.random_range(500..2_500)),
                Kind::TopicRefused => (rng.random_range(0..REFUSABLE.len()), rng.random_range(1_000..3_000)),
            };
            Planned { kind, after, target, millis }
        })
        .collect()
}

/// Runs `plan` on the logical clock; gives up on what is not due by `deadline` (the
/// checker then reports it as not fired). Returns once every daemon runs again.
pub(super) async fn execute(
    env: &TestEnv,
    daemons: &mut [Daemon],
    plan: &[Planned],
    (progress, history): (&Progress, &Mutex<History>),
    started: Instant,
    deadline: Instant,
) {
    let http = reqwest::Client::new();
    for p in plan {
        while progress.now() < p.after && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        if Instant::now() >= deadline {
            eprintln!("chaos: the logical clock stood at {} when the run's time was up", progress.now());
            return;
        }
        restart_crashed(env, daemons, history, &http).await;
        // A fault is meant to hit work in flight: wait (a little) for some.
        let mut in_flight = 0;
        let waited = Instant::now();
        while in_flight == 0 && waited.elapsed() < Duration::from_secs(5) {
            let pending = env.db.scalar_i64("SELECT count(*) FROM transfers WHERE status = 'PENDING'", &[]).await;
            in_flight = pending + progress.in_flight.load(Ordering::SeqCst) as i64;
            if in_flight == 0 {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
        let mut fired = Fired {
            kind: p.kind,
            at_ms: started.elapsed().as_millis(),
            answered: progress.now(),
            in_flight,
            what: String::new(),
            exit: None,
        };
        let millis = Duration::from_millis(p.millis);
        let broker = i32::try_from(p.target).unwrap_or(0) % env.broker.broker_count() + 1;
        match p.kind {
            Kind::Kill => {
                let d = &mut daemons[p.target];
                fired.what = format!("kill -9 daemon {} for {millis:?}", d.name);
                d.kill();
                tokio::time::sleep(millis).await;
                d.start(env);
                d.wait_ready(&http).await;
            }
            Kind::Stop => {
                let d = &daemons[p.target];
                let stopped = SESSION_TIMEOUT + millis;
                fired.what = format!("SIGSTOP daemon {} for {stopped:?}, then SIGCONT", d.name);
                assert!(d.signal("STOP"), "SIGSTOP daemon {}", d.name);
                tokio::time::sleep(stopped).await;
                assert!(d.signal("CONT"), "SIGCONT daemon {}", d.name);
                d.wait_ready(&http).await;
            }
            Kind::Term => {
                let d = &mut daemons[p.target];
                let exit = d.terminate(Duration::from_secs(60)).await;
                fired.what = format!("SIGTERM daemon {}: {exit:?}; restarted after {millis:?}", d.name);
                fired.exit = Some(exit.map(|s| s.code().unwrap_or(-1)));
                d.kill();
                tokio::time::sleep(millis).await;
                d.start(env);
                d.wait_ready(&http).await;
            }
            Kind::DbConnections => {
                let n = kill_connections(env).await;
                fired.what = format!("pg_terminate_backend: {n} tally connections killed");
            }
            Kind::DbRefused => {
                fired.what = format!("database refuses tally for {millis:?}");
                env.db.refuse_tally(true).await;
                tokio::time::sleep(millis).await;
                env.db.refuse_tally(false).await;
            }
            Kind::DbReadOnly => {
                fired.what = format!("database read-only for {millis:?}");
                read_only(env, true).await;
                tokio::time::sleep(millis).await;
                read_only(env, false).await;
            }
            Kind::BrokerErrors => {
                let api = [api_key::PRODUCE, api_key::FETCH, api_key::TXN_OFFSET_COMMIT][p.target % 3];
                env.broker.push_request_errors(api, &[RDKafkaRespErr::RD_KAFKA_RESP_ERR_NOT_LEADER_FOR_PARTITION; 3]);
                fired.what = format!("broker: 3 errors on API {api}");
            }
            Kind::BrokerLatency => {
                let rtt = Duration::from_millis(p.millis);
                fired.what = format!("broker {broker}: {rtt:?} added to every answer for 3 s");
                env.broker.set_rtt(broker, rtt).expect("broker latency");
                tokio::time::sleep(Duration::from_secs(3)).await;
                env.broker.set_rtt(broker, Duration::ZERO).expect("broker latency");
            }
            Kind::BrokerDown => {
                fired.what = format!("broker {broker} down for {millis:?}");
                env.broker.broker_down(broker).expect("broker down");
                tokio::time::sleep(millis).await;
                env.broker.broker_up(broker).expect("broker up");
            }
            Kind::TopicRefused => {
                let topic = REFUSABLE[p.target];
                fired.what = format!("broker refuses {topic} for {millis:?}");
                let refused = RDKafkaRespErr::RD_KAFKA_RESP_ERR_TOPIC_AUTHORIZATION_FAILED;
                env.broker.set_topic_error(topic, refused).expect("refuse a topic");
                tokio::time::sleep(millis).await;
                env.broker.set_topic_error(topic, RDKafkaRespErr::RD_KAFKA_RESP_ERR_NO_ERROR).expect("accept a topic");
            }
        }
        eprintln!(
            "chaos +{:>6} ms (answered {:>5}, in flight {:>4}): {}",
            fired.at_ms, fired.answered, fired.in_flight, fired.what
        );
        history.lock().expect("history").fired.push(fired);
    }
}

/// Records and restarts every daemon that exited without a fault asking it to.
pub(super) async fn restart_crashed(
    env: &TestEnv,
    daemons: &mut [Daemon],
    history: &Mutex<History>,
    http: &reqwest::Client,
) {
    for d in daemons.iter_mut() {
        if let Some(exit) = d.exited() {
            eprintln!("chaos: daemon {} exited on its own: {exit}", d.name);
            history.lock().expect("history").crashes.push(format!("daemon {} exited on its own: {exit}", d.name));
            d.start(env);
            d.wait_ready(http).await;
        }
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

/// Makes the intake's commit of a transfer whose amount ends in [`super::load::CUT_MARK`]
/// wait (a deferred constraint trigger, so inside COMMIT) until [`cut_commits`] ends
/// its connection: the client gets 500 `outcome_unknown` and retries under its key.
pub(super) async fn arm_commit_cuts(env: &TestEnv) {
    env.db
        .batch(&format!(
            "CREATE TABLE chaos_cut (key text PRIMARY KEY);
             CREATE FUNCTION chaos_cut_commit() RETURNS trigger LANGUAGE plpgsql AS $$
             BEGIN
               IF NEW.amount_cents % 1000 = {mark} AND NEW.idempotency_key IS NOT NULL
                  AND NOT EXISTS (SELECT 1 FROM chaos_cut WHERE key = NEW.idempotency_key) THEN
                 PERFORM set_config('application_name', 'tally-cut ' || NEW.idempotency_key, true);
                 PERFORM pg_sleep(60);
               END IF;
               RETURN NULL;
             END $$;
             CREATE CONSTRAINT TRIGGER chaos_cut_commit AFTER INSERT ON transfers
               DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION chaos_cut_commit();",
            mark = super::load::CUT_MARK
        ))
        .await;
}

/// Ends every connection caught inside a cut commit, remembering its key so that the
/// retry commits; returns when `progress.stop` is set. (The history shows each cut as a
/// 500 `outcome_unknown` answer, and `chaos_cut` holds every key cut.) Its own task and
/// connection, so that nothing the schedule blocks on delays a cut.
pub(super) async fn cut_commits(url: String, progress: std::sync::Arc<Progress>, started: Instant) {
    let (db, connection) = tokio_postgres::connect(&url, tokio_postgres::NoTls).await.expect("connect the cutter");
    tokio::spawn(connection);
    while !progress.stop.load(Ordering::SeqCst) {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let Ok(rows) = db
            .query(
                "SELECT pid, substr(application_name, 11) FROM pg_stat_activity \
                 WHERE datname = current_database() AND application_name LIKE 'tally-cut %'",
                &[],
            )
            .await
        else {
            continue;
        };
        for row in rows {
            let (pid, key): (i32, String) = (row.get(0), row.get(1));
            if db.execute("INSERT INTO chaos_cut VALUES ($1) ON CONFLICT DO NOTHING", &[&key]).await.is_err() {
                continue;
            }
            let _ = db.execute("SELECT pg_terminate_backend($1)", &[&pid]).await;
            eprintln!("chaos +{:>6} ms: intake commit of key {key} cut", started.elapsed().as_millis());
        }
    }
}
