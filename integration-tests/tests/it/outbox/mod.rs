//! Black-box tests of the outbox publisher: every committed row is published once, with
//! its key, headers and exact payload, in key order, marked published only after the
//! broker's acknowledgement, through broker outages and concurrent publishers; claims read
//! no published or held rows again. Rows the broker refuses for good are `parked`'s.
//!
//! Broker: every test runs on the embedded broker, librdkafka's mock cluster, one per
//! test. Database: a fresh PostgreSQL database per test.
#![allow(clippy::expect_used)] // tests: a failed expectation is a failed test, with its message

mod parked;
mod wake;

use crate::intake::{
    create_transfer, is_w3c_traceparent, transfer, wait_for_event_ids, wait_until_no_pending, TOPIC, TRACEPARENT,
};
use reqwest::StatusCode;
use serde_json::Value;
use std::collections::{BTreeSet, HashMap, HashSet};
use tally_integration_tests::{
    json_body, metric_value, spawn_app, wait_for_records, wait_until, Deadline, TestApp, TestDb, TestEnv,
};

// Broker: embedded mock cluster.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn published_record_carries_key_headers_and_the_exact_payload() {
    let (env, app) = spawn_app(|_| {}).await;
    env.db.open_accounts(&["acc-traced", "acc-untraced"]).await;

    let res = app
        .send(
            app.client
                .post(format!("{}/transfers", app.intake_url))
                .header("traceparent", TRACEPARENT)
                .json(&transfer("acc-traced", "acc-b", 700)),
        )
        .await;
    assert_eq!(res.status(), StatusCode::CREATED);
    let traced = json_body(res).await;
    let untraced = create_transfer(&app, "acc-untraced", "acc-b", 800).await;

    // The requests' rows (the ledger may have added its outcomes by now).
    let rows =
        env.db.query("SELECT id::text, payload FROM outbox_events WHERE event_type = 'TransferRequested'", &[]).await;
    let event_of: HashMap<String, String> = rows
        .iter()
        .map(|r| {
            let payload: Value = serde_json::from_str(&r.get::<_, String>(1)).expect("payload JSON");
            (payload["transferId"].as_str().expect("transferId").to_owned(), r.get::<_, String>(0))
        })
        .collect();
    let ids: HashSet<String> = event_of.values().cloned().collect();
    assert_eq!(ids.len(), 2);
    let records = wait_for_event_ids(&app.bootstrap, &ids, Deadline::DEFAULT).await;

    let expected_fields: BTreeSet<&str> = BTreeSet::from([
        "eventId",
        "transferId",
        "sourceAccount",
        "destinationAccount",
        "amountCents",
        "currency",
        "requestedAt",
    ]);
    for (created, amount, sent_traceparent) in [(&traced, 700, Some(TRACEPARENT)), (&untraced, 800, None)] {
        let transfer_id = created["id"].as_str().expect("id");
        let event_id = &event_of[transfer_id];
        let record =
            records.iter().find(|r| r.header("event-id") == Some(event_id.as_str())).expect("record of the transfer");
        let source = created["sourceAccount"].as_str().expect("source");
        assert_eq!(record.key.as_deref(), Some(source), "record key is the source account");

        for name in ["event-id", "event-type", "traceparent"] {
            assert_eq!(record.headers_named(name).len(), 1, "exactly one {name} header on {record:?}");
        }
        assert_eq!(record.header("event-type"), Some("TransferRequested"));
        let traceparent = record.header("traceparent").expect("traceparent header");
        assert!(is_w3c_traceparent(traceparent), "invalid traceparent {traceparent:?}");
        match sent_traceparent {
            Some(sent) => assert_eq!(traceparent, sent, "the caller's traceparent travels to Kafka"),
            None => assert_ne!(traceparent, TRACEPARENT),
        }

        let payload = record.payload_json();
        let fields: BTreeSet<&str> = payload.as_object().expect("payload object").keys().map(String::as_str).collect();
        assert_eq!(fields, expected_fields, "payload fields of {payload}");
        assert_eq!(payload["eventId"], event_id.as_str(), "payload eventId = event-id header = outbox row id");
        assert_eq!(payload["transferId"], transfer_id);
        assert_eq!(payload["sourceAccount"], source);
        assert_eq!(payload["destinationAccount"], "acc-b");
        assert_eq!(payload["amountCents"], amount);
        assert!(payload["amountCents"].is_i64(), "amountCents is an integer");
        assert_eq!(payload["currency"], "BRL");
        let requested_at = payload["requestedAt"].as_str().expect("requestedAt string");
        let parsed = chrono::DateTime::parse_from_rfc3339(requested_at).expect("requestedAt is RFC 3339");
        assert_eq!(parsed.offset().local_minus_utc(), 0, "requestedAt is UTC: {requested_at}");
        let created_at = chrono::DateTime::parse_from_rfc3339(created["createdAt"].as_str().expect("createdAt"))
            .expect("createdAt is RFC 3339");
        assert_eq!(parsed, created_at, "requestedAt is the transfer's creation time");
    }
}

// Broker: embedded mock cluster, all 3 brokers taken down and brought back up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn broker_outage_marks_nothing_published_and_everything_is_published_after_recovery() {
    let (env, app) = spawn_app(|c| c.outbox.send_timeout = std::time::Duration::from_millis(2_000)).await;
    env.broker.all_down().expect("take the brokers down");
    env.db.open_accounts(&["acc-0", "acc-1", "acc-2", "acc-3", "acc-4"]).await;

    for i in 0..5 {
        create_transfer(&app, &format!("acc-{i}"), "acc-z", 100 + i).await;
    }
    // Wait for a failed batch, or for any row marked published (which the next assertion
    // reports as the bug it is).
    wait_until("the publisher reports a failed batch", Deadline::DEFAULT, || async {
        let metrics = app.metrics().await;
        let failures = metric_value(&metrics, "tally_outbox_publish_failures_total");
        let published = env.db.count("outbox_events").await - env.db.pending_outbox().await;
        match failures {
            Some(n) if n > 0.0 => Ok(()),
            _ if published > 0 => Ok(()),
            other => Err(format!("tally_outbox_publish_failures_total = {other:?}")),
        }
    })
    .await;
    let published = env.db.scalar_i64("SELECT count(*) FROM outbox_events WHERE published_at IS NOT NULL", &[]).await;
    assert_eq!(published, 0, "rows marked published while no broker was up");
    let parked = env.db.scalar_i64("SELECT count(*) FROM outbox_events WHERE parked_at IS NOT NULL OR held", &[]).await;
    assert_eq!(parked, 0, "a broker outage is no refusal: nothing parked or held");
    assert_eq!(env.db.pending_outbox().await, 5);
    assert_eq!(metric_value(&app.metrics().await, "tally_outbox_pending"), Some(5.0));

    env.broker.all_up().expect("bring the brokers back");
    wait_until_no_pending(&env.db, Deadline::secs(120)).await;
    let ids: HashSet<String> =
        env.db.query("SELECT id::text FROM outbox_events", &[]).await.iter().map(|r| r.get(0)).collect();
    assert_eq!(ids.len(), 5);
    wait_for_event_ids(&app.bootstrap, &ids, Deadline::DEFAULT).await;
}

// Broker: embedded mock cluster, shared by two daemons.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_publishers_on_one_database_keep_per_key_order() {
    const KEYS: i32 = 100;
    const ROWS: i32 = 10_000;
    const TRANSACTIONS: i32 = 20;
    let env = TestEnv::new().await;
    let mut daemons =
        vec![env.spawn(|c| c.outbox.batch_size = 100).await, env.spawn(|c| c.outbox.batch_size = 100).await];
    let bootstrap = env.bootstrap().to_owned();
    let insert = |t: i32| {
        // Row n has key n % KEYS and per-key sequence n / KEYS; each statement commits on
        // its own, rows in increasing n, so per key the sequence increases with commit order.
        let per_transaction = ROWS / TRANSACTIONS;
        let (from, to) = (t * per_transaction, (t + 1) * per_transaction - 1);
        let db = &env.db;
        async move {
            db.execute(
                "INSERT INTO outbox_events (id, topic, key, event_type, payload) \
                 SELECT gen_random_uuid(), $3, 'key-' || (n % $4), 'TransferRequested', \
                        json_build_object('key', 'key-' || (n % $4), 'keySeq', n / $4)::text \
                 FROM generate_series($1::int, $2::int) AS n ORDER BY n",
                &[&from, &to, &TOPIC, &KEYS],
            )
            .await
        }
    };
    async fn published_by(app: &TestApp) -> f64 {
        metric_value(&app.metrics().await, "tally_outbox_published_total").unwrap_or(0.0)
    }

    for t in 0..TRANSACTIONS / 2 {
        insert(t).await;
    }
    // One shard-lock holder may do all the work while the other idles; to make both publish,
    // stop (gracefully) a daemon that has published, then commit the second half of the rows,
    // which only the other daemon can publish. Per-key order must survive the hand-over.
    let active = wait_until("a daemon publishes", Deadline::DEFAULT, || async {
        for (i, app) in daemons.iter().enumerate() {
            if published_by(app).await > 0.0 {
                return Ok(i);
            }
        }
        Err("no daemon has published yet".to_owned())
    })
    .await;
    let stopped = daemons.remove(active);
    let by_stopped = published_by(&stopped).await;
    stopped.stop().await;
    for t in TRANSACTIONS / 2..TRANSACTIONS {
        insert(t).await;
    }
    assert_eq!(env.db.count("outbox_events").await, i64::from(ROWS));

    wait_until_no_pending(&env.db, Deadline::secs(180)).await;
    let remaining = &daemons[0];
    let by_remaining = published_by(remaining).await;
    assert!(by_stopped > 0.0 && by_remaining > 0.0, "both publishers worked: {by_stopped} and {by_remaining}");
    let records = wait_for_records(&bootstrap, TOPIC, Deadline::secs(120), |records| {
        let distinct: HashSet<&str> = records.iter().filter_map(|r| r.header("event-id")).collect();
        if distinct.len() == ROWS as usize {
            Ok(())
        } else {
            Err(format!("{} distinct event ids of {ROWS} ({} records)", distinct.len(), records.len()))
        }
    })
    .await;

    // Records are sorted by partition and offset, and a key lives in one partition, so this
    // walks each key's records in log order.
    let mut seen: HashMap<String, HashSet<i64>> = HashMap::new();
    let mut first_occurrences: HashMap<String, Vec<i64>> = HashMap::new();
    let mut duplicates = 0;
    for record in &records {
        let payload = record.payload_json();
        let key = record.key.clone().expect("record key");
        assert_eq!(payload["key"], key.as_str(), "record key matches the row key");
        let seq = payload["keySeq"].as_i64().expect("keySeq");
        if seen.entry(key.clone()).or_default().insert(seq) {
            first_occurrences.entry(key).or_default().push(seq);
        } else {
            duplicates += 1;
        }
    }
    assert_eq!(first_occurrences.len(), KEYS as usize, "every key was published");
    let expected: Vec<i64> = (0..i64::from(ROWS / KEYS)).collect();
    for (key, order) in &first_occurrences {
        assert_eq!(order, &expected, "per-key order of first occurrences for {key}");
    }
    eprintln!(
        "published by the stopped daemon (before its stop): {by_stopped}, by the other: {by_remaining}, \
         duplicates on the topic: {duplicates}"
    );
}

// Broker: embedded mock cluster.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_row_committed_after_later_rows_is_still_published() {
    let (env, app) = spawn_app(|_| {}).await;
    let insert = "INSERT INTO outbox_events (id, topic, key, event_type, payload) \
                  VALUES (gen_random_uuid(), $1, $2, 'TransferRequested', $3) RETURNING id::text, seq";

    // The early row takes its sequence number now but commits last.
    let late = env.db.connect().await;
    late.batch_execute("BEGIN").await.expect("BEGIN");
    let row = late.query_one(insert, &[&TOPIC, &"key-late", &r#"{"n":"late"}"#]).await.expect("insert the late row");
    let (late_id, late_seq): (String, i64) = (row.get(0), row.get(1));

    let mut later_ids = HashSet::new();
    for i in 0..20 {
        let key = if i % 2 == 0 { "key-late" } else { "key-other" };
        let rows = env.db.query(insert, &[&TOPIC, &key, &format!(r#"{{"n":{i}}}"#)]).await;
        let seq: i64 = rows[0].get(1);
        assert!(seq > late_seq, "the later rows have higher sequence numbers");
        later_ids.insert(rows[0].get::<_, String>(0));
    }
    // Every committed row gets published while the early row is still uncommitted.
    wait_until_no_pending(&env.db, Deadline::DEFAULT).await;
    wait_for_event_ids(&app.bootstrap, &later_ids, Deadline::DEFAULT).await;

    late.batch_execute("COMMIT").await.expect("COMMIT the late row");
    wait_until("the late row is marked published", Deadline::DEFAULT, || async {
        let published = env
            .db
            .scalar_i64(
                "SELECT count(*) FROM outbox_events WHERE id = $1::text::uuid AND published_at IS NOT NULL",
                &[&late_id],
            )
            .await;
        if published == 1 {
            Ok(())
        } else {
            Err("still pending".to_owned())
        }
    })
    .await;
    let records = wait_for_event_ids(&app.bootstrap, &HashSet::from([late_id.clone()]), Deadline::DEFAULT).await;

    // On its key it comes after the rows that committed before it.
    let key_events: Vec<&str> =
        records.iter().filter(|r| r.key.as_deref() == Some("key-late")).filter_map(|r| r.header("event-id")).collect();
    assert_eq!(key_events.last().copied(), Some(late_id.as_str()), "commit order on key-late: {key_events:?}");
}

// Broker: embedded mock cluster.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_committed_row_is_published_on_its_notification_not_at_the_next_poll() {
    // The poll is ten minutes away: only a commit's notification gets a row out in time.
    let (env, _app) = spawn_app(|c| {
        tally_integration_tests::run_only(c, &["outbox"]);
        c.outbox.poll_interval = std::time::Duration::from_secs(600);
    })
    .await;
    let insert = "INSERT INTO outbox_events (id, topic, key, event_type, payload) \
                  VALUES (gen_random_uuid(), $1, $2, 'TransferRequested', $3)";
    // One row at a time, on keys spread over the shards: each publisher wake-up has to
    // find its row wherever its shard is.
    for i in 0..24 {
        env.db.execute(insert, &[&TOPIC, &format!("wake-{i}"), &format!(r#"{{"n":{i}}}"#)]).await;
        wait_until_no_pending(&env.db, Deadline::secs(30)).await;
    }
}

// Broker: embedded mock cluster.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_row_committed_alone_costs_its_publisher_one_claim() {
    // Rows committed one at a time, each published before the next: each wake-up should
    // be one transaction that finds the row and publishes it, not that claim followed by
    // claims that look again for rows already published. Two loops, as by default: a ring
    // wakes one of them.
    let (env, app) = spawn_app(|c| {
        tally_integration_tests::run_only(c, &["outbox"]);
        c.outbox.poll_interval = std::time::Duration::from_secs(600);
        c.outbox.concurrency = 2;
    })
    .await;
    let insert = "INSERT INTO outbox_events (id, topic, key, event_type, payload) \
                  VALUES (gen_random_uuid(), $1, $2, 'TransferRequested', $3)";
    let claims = || async {
        let metrics = app.metrics().await;
        ["rows", "nothing", "held"]
            .iter()
            .map(|found| metric_value(&metrics, &format!(r#"tally_outbox_claims_total{{found="{found}"}}"#)))
            .collect::<Option<Vec<f64>>>()
            .unwrap_or_else(|| panic!("tally_outbox_claims_total by found:\n{metrics}"))
    };
    // A first row, so that the loops' claims at start are behind us.
    env.db.execute(insert, &[&TOPIC, &"alone-first", &r#"{"n":-1}"#]).await;
    wait_until_no_pending(&env.db, Deadline::secs(30)).await;
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    let before = claims().await;
    const ROWS: u32 = 24;
    for i in 0..ROWS {
        env.db.execute(insert, &[&TOPIC, &format!("alone-{i}"), &format!(r#"{{"n":{i}}}"#)]).await;
        wait_until_no_pending(&env.db, Deadline::secs(30)).await;
    }
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    let after = claims().await;
    let by_found: Vec<f64> = after.iter().zip(&before).map(|(a, b)| a - b).collect();
    let total: f64 = by_found.iter().sum();
    eprintln!("claims for {ROWS} rows committed one at a time (rows, nothing, held): {by_found:?}");
    assert_eq!(by_found[0], f64::from(ROWS), "each row published by a claim of its own");
    // A commit that comes while a batch is ending costs one more look now and then; three
    // or four claims a row is the fault this guards against.
    assert!(total <= f64::from(ROWS) * 1.5, "{total} claims for {ROWS} rows: {by_found:?}");
}

// Broker: embedded mock cluster, every broker answering 40 ms late while rows are
// published.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rows_committed_while_every_shard_is_held_are_published_without_the_poll() {
    // Three loops and a slow broker: a claim holds its shards while it waits for the broker,
    // a sweep holds every free one, and a loop that a commit wakes meanwhile often finds none
    // free and waits. The poll is ten minutes away, so only the holders' own sweeps can get
    // the rows committed meanwhile out.
    let (env, _app) = spawn_app(|c| {
        tally_integration_tests::run_only(c, &["outbox"]);
        c.outbox.poll_interval = std::time::Duration::from_secs(600);
        c.outbox.concurrency = 3;
    })
    .await;
    let brokers = 1..=env.broker.broker_count();
    for id in brokers.clone() {
        env.broker.set_rtt(id, std::time::Duration::from_millis(40)).expect("broker latency");
    }
    let insert = "INSERT INTO outbox_events (id, topic, key, event_type, payload) \
                  VALUES (gen_random_uuid(), $1, $2, 'TransferRequested', $3)";
    // Bursts of rows from four committers, a row per transaction at uneven gaps, each burst
    // published before the next: the end of a burst is where a row committed during a
    // holder's claim has no later commit to wake a loop for it.
    for burst in 0..30_u64 {
        let committers = (0..4_u64).map(|c| {
            let db = &env.db;
            async move {
                for i in 0..4_u64 {
                    let key = format!("held-{burst}-{c}-{i}");
                    db.execute(insert, &[&TOPIC, &key, &format!(r#"{{"n":{i}}}"#)]).await;
                    tokio::time::sleep(std::time::Duration::from_millis((i * 7 + c + burst) % 10)).await;
                }
            }
        });
        futures_util::future::join_all(committers).await;
        wait_until_no_pending(&env.db, Deadline::secs(20)).await;
    }
    assert_eq!(env.db.count("outbox_events").await, 30 * 16);
    for id in brokers {
        env.broker.set_rtt(id, std::time::Duration::ZERO).expect("broker latency");
    }
}

// Broker: embedded mock cluster, every broker answering 300 ms late while the row is
// published.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_row_is_marked_published_after_the_broker_acknowledged_its_record() {
    let (env, app) = spawn_app(|c| tally_integration_tests::run_only(c, &["outbox"])).await;
    let rtt = std::time::Duration::from_millis(300);
    let brokers = 1..=env.broker.broker_count();
    for id in brokers.clone() {
        env.broker.set_rtt(id, rtt).expect("broker latency");
    }
    let id: String = env
        .db
        .query(
            "INSERT INTO outbox_events (id, topic, key, event_type, payload) \
             VALUES (gen_random_uuid(), $1, 'acked', 'TransferRequested', '{}') RETURNING id::text",
            &[&TOPIC],
        )
        .await[0]
        .get(0);
    wait_until_no_pending(&env.db, Deadline::secs(30)).await;
    for id in brokers {
        env.broker.set_rtt(id, std::time::Duration::ZERO).expect("broker latency");
    }
    let records = wait_for_event_ids(&app.bootstrap, &HashSet::from([id.clone()]), Deadline::DEFAULT).await;
    let sent_ms = records.iter().find(|r| r.header("event-id") == Some(id.as_str())).and_then(|r| r.timestamp_ms);
    let sent_ms = sent_ms.expect("the record's timestamp");
    let published_ms = env
        .db
        .scalar_i64(
            "SELECT (extract(epoch FROM published_at) * 1000)::int8 FROM outbox_events WHERE id::text = $1",
            &[&id],
        )
        .await;
    // The acknowledgement cannot come before a round trip after the send (1 ms for the
    // rounding of both times).
    assert!(
        published_ms + 1 >= sent_ms + i64::try_from(rtt.as_millis()).expect("ms"),
        "published_at is {} ms after the record was sent; the broker answered {} ms after it at the earliest",
        published_ms - sent_ms,
        rtt.as_millis()
    );
}

/// Heap blocks of `outbox_events` that one claim of every shard reads, in a transaction
/// that is rolled back (the claim's row locks go with it; the index entries it marked dead
/// stay marked).
async fn blocks_read_by_a_claim(conn: &mut diesel_async::AsyncPgConnection) -> (i64, usize) {
    use diesel::sql_types::BigInt;
    use diesel_async::{AsyncConnection, RunQueryDsl};

    #[derive(diesel::QueryableByName)]
    struct Blocks {
        #[diesel(sql_type = BigInt)]
        n: i64,
    }
    let read = "SELECT pg_stat_get_xact_blocks_fetched('outbox_events'::regclass) AS n";
    let shards: Vec<i32> = (0..tally_actors::outbox::SHARDS).collect();
    let mut seen = (0, 0);
    let rolled_back = conn
        .transaction::<(), diesel::result::Error, _>(|conn| {
            let (seen, shards) = (&mut seen, &shards);
            Box::pin(async move {
                let before = diesel::sql_query(read).get_result::<Blocks>(conn).await?.n;
                let claimed = tally_actors::store::outbox::claim_pending(conn, shards, 500).await?;
                let after = diesel::sql_query(read).get_result::<Blocks>(conn).await?.n;
                *seen = (after - before, claimed.len());
                Err(diesel::result::Error::RollbackTransaction)
            })
        })
        .await;
    assert!(matches!(rolled_back, Err(diesel::result::Error::RollbackTransaction)), "{rolled_back:?}");
    seen
}

// Broker: none (the store's claim alone).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_after_a_drained_backlog_does_not_read_the_published_rows_again() {
    use diesel_async::AsyncConnection;

    let db = TestDb::new().await;
    // A backlog of 20,000 rows, published and then deleted, on a table with no statistics
    // and no autovacuum to clean up behind it; then five rows pending.
    db.batch(
        "ALTER TABLE outbox_events SET (autovacuum_enabled = false); \
         INSERT INTO outbox_events (id, topic, key, event_type, payload) \
           SELECT gen_random_uuid(), 'transfers.requested', 'K-' || (i % 100), 'TransferRequested', repeat('x', 200) \
           FROM generate_series(1, 20000) AS i; \
         UPDATE outbox_events SET published_at = now(); \
         DELETE FROM outbox_events; \
         INSERT INTO outbox_events (id, topic, key, event_type, payload) \
           SELECT gen_random_uuid(), 'transfers.requested', 'P-' || i, 'TransferRequested', '{}' \
           FROM generate_series(1, 5) AS i",
    )
    .await;
    let dead_pages = db.scalar_i64("SELECT pg_relation_size('outbox_events') / 8192", &[]).await;
    let conn = diesel_async::AsyncPgConnection::establish(db.url()).await.expect("diesel connection");
    let conn = std::sync::Arc::new(tokio::sync::Mutex::new(conn));
    let (first, claimed) = blocks_read_by_a_claim(&mut *conn.lock().await).await;
    assert_eq!(claimed, 5, "every pending row is claimed");
    // An index entry is marked only once no open transaction of the database can still see
    // its row, so a claim may come too early to mark; the next ones then do. A bitmap scan
    // never marks: every claim reads the dead rows again.
    wait_until("a claim reads the pages of the live rows only", Deadline::secs(30), || {
        let conn = std::sync::Arc::clone(&conn);
        async move {
            let (blocks, claimed) = blocks_read_by_a_claim(&mut *conn.lock().await).await;
            assert_eq!(claimed, 5, "every pending row is claimed again after the rollback");
            // The five live rows sit on one or two pages; the dead ones on hundreds.
            if blocks < 20 {
                Ok(())
            } else {
                Err(format!(
                    "a claim read {blocks} heap blocks (the first {first}; the table has {dead_pages} pages): \
                     the dead rows again, not skipping the index entries an earlier claim marked"
                ))
            }
        }
    })
    .await;
}

// Broker: none (the store's claim alone).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rows_held_behind_a_parked_row_are_not_read_by_later_claims() {
    use diesel_async::AsyncConnection;
    use tally_actors::store::{outbox, outbox_parked};

    let db = TestDb::new().await;
    // A parked row of key H, 5,000 later rows of H behind it, and five rows of other keys.
    db.batch(
        "INSERT INTO outbox_events (id, topic, key, event_type, payload, attempts, parked_at, park_reason, retry_at) \
           VALUES (gen_random_uuid(), 'transfers.requested', 'H', 'TransferRequested', '{}', 1, now(), \
                   'topic_authorization_failed', now() + interval '1 hour'); \
         INSERT INTO outbox_events (id, topic, key, event_type, payload) \
           SELECT gen_random_uuid(), 'transfers.requested', 'H', 'TransferRequested', repeat('x', 200) \
           FROM generate_series(1, 5000); \
         INSERT INTO outbox_events (id, topic, key, event_type, payload) \
           SELECT gen_random_uuid(), 'transfers.requested', 'P-' || i, 'TransferRequested', '{}' \
           FROM generate_series(1, 5) AS i",
    )
    .await;
    let mut conn = diesel_async::AsyncPgConnection::establish(db.url()).await.expect("diesel connection");
    let shards: Vec<i32> = (0..tally_actors::outbox::SHARDS).collect();
    // Claims as the publisher makes them: each holds the rows it finds behind the parked
    // one (500 a claim, oldest first), until a claim finds none.
    let mut held = 0;
    for _ in 0..20 {
        let behind = conn
            .transaction::<usize, diesel::result::Error, _>(|conn| {
                let shards = &shards;
                Box::pin(async move {
                    let claimed = outbox::claim_pending(conn, shards, 500).await?;
                    let behind: Vec<uuid::Uuid> =
                        claimed.iter().filter(|r| r.behind_parked).map(|r| r.event.id).collect();
                    outbox_parked::hold(conn, &behind).await?;
                    Ok(behind.len())
                })
            })
            .await
            .expect("claim and hold");
        held += behind;
        if behind == 0 {
            break;
        }
    }
    assert_eq!(held, 5_000, "every row behind the parked one is held");
    // A claim marks an index entry dead only once no open transaction anywhere on the
    // server may still see its row, and another test's transactions can hold that back
    // for a moment: claims are measured until one reads fewer than 20 blocks.
    let mut read = Vec::new();
    for _ in 0..20 {
        let (blocks, claimed) = blocks_read_by_a_claim(&mut conn).await;
        assert_eq!(claimed, 5, "the other keys' rows are claimed, none of the held ones");
        read.push(blocks);
        if blocks < 20 {
            return;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    panic!("claims read {read:?} heap blocks: the held rows (on ~100 pages) again and again");
}
