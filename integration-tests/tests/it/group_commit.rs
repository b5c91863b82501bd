//! Group commit: `POST /transfers` requests that arrive while the intake's writer is busy
//! share one transaction, and idempotency keys hold inside a batch as across batches; the
//! projection's batched status moves stay monotonic.
//!
//! Broker: embedded mock cluster (publisher disabled: the tests are about HTTP and rows),
//! or none (the store function alone).
#![allow(clippy::expect_used)] // tests: a failed expectation is a failed test, with its message

use std::collections::HashSet;
use std::time::Duration;

use diesel_async::{AnsiTransactionManager, AsyncConnection, AsyncPgConnection, TransactionManager};
use futures_util::future::join_all;
use reqwest::StatusCode;
use serde_json::{json, Value};
use tally_actors::store::transfers::{create_transfers, finish_all, Created, Finish, Intake, TransferRequest};
use tally_integration_tests::{json_body, metric_value, run_only, spawn_app, wait_until, Deadline, TestDb};
use uuid::Uuid;

/// Outbox rows whose payload names a transfer that exists.
async fn outbox_rows_naming_a_transfer(db: &TestDb) -> i64 {
    db.scalar_i64(
        "SELECT count(*) FROM transfers t JOIN outbox_events o ON (o.payload::json->>'transferId')::uuid = t.id",
        &[],
    )
    .await
}

fn transfer(source: &str, amount: i64) -> Value {
    json!({ "sourceAccount": source, "destinationAccount": "acc-z", "amountCents": amount, "currency": "BRL" })
}

/// One writer is held on a table lock while requests pile up behind it; once released,
/// they are written in batches. Each key makes one transfer whatever its batch: ten
/// identical requests with one key make one transfer (one 201, nine 200 replays of it);
/// five different requests with one key make one transfer and four 409s. Every transfer
/// has exactly one outbox row.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_that_wait_share_a_transaction_and_keys_make_one_transfer_each() {
    let (env, app) = spawn_app(|c| {
        c.pipelines.set("outbox", false);
        c.http.intake_writers = 1;
        c.http.intake_batch_max = 64;
    })
    .await;
    let post = |body: Value, key: Option<String>| {
        let mut request = app.client.post(format!("{}/transfers", app.intake_url)).json(&body);
        if let Some(key) = key {
            request = request.header("Idempotency-Key", key);
        }
        async move { request.send().await.expect("POST /transfers") }
    };

    let sources: Vec<String> = (0..30).map(|i| format!("acc-{i}")).collect();
    let sources: Vec<&str> = sources.iter().map(String::as_str).chain(["acc-first", "acc-same", "acc-diff"]).collect();
    env.db.open_accounts(&sources).await;
    // Hold inserts into `transfers` until every request has been sent.
    let holder = env.db.connect().await;
    holder.batch_execute("BEGIN; LOCK TABLE transfers IN SHARE MODE").await.expect("lock transfers");
    let first = tokio::spawn(post(transfer("acc-first", 1), None));
    env.db.wait_lock_waiters(1, "the writer waits on the lock").await;

    let mut requests = Vec::new();
    for i in 0..30 {
        requests.push((format!("plain-{i}"), post(transfer(&format!("acc-{i}"), 100 + i), None)));
    }
    for i in 0..10 {
        requests.push((format!("same-{i}"), post(transfer("acc-same", 500), Some("key-same".into()))));
    }
    for i in 0..5 {
        requests.push((format!("diff-{i}"), post(transfer("acc-diff", 700 + i), Some("key-diff".into()))));
    }
    let (labels, futures): (Vec<_>, Vec<_>) = requests.into_iter().unzip();
    let all = tokio::spawn(async move {
        let responses = join_all(futures).await;
        let mut answers = Vec::new();
        for (label, res) in labels.into_iter().zip(responses) {
            let status = res.status();
            answers.push((label, status, json_body(res).await));
        }
        answers
    });
    // Let the requests reach the queue behind the held writer, then let it go.
    tokio::time::sleep(std::time::Duration::from_secs(1)).await;
    holder.batch_execute("COMMIT").await.expect("release the lock");

    let first = first.await.expect("first request");
    assert_eq!(first.status(), StatusCode::CREATED);
    let answers = all.await.expect("the other requests");

    let of =
        |prefix: &'static str| -> Vec<_> { answers.iter().filter(|(label, _, _)| label.starts_with(prefix)).collect() };
    assert!(of("plain-").iter().all(|(_, status, _)| *status == StatusCode::CREATED), "{answers:?}");

    let same = of("same-");
    let created: Vec<_> = same.iter().filter(|(_, s, _)| *s == StatusCode::CREATED).collect();
    assert_eq!(created.len(), 1, "one of ten identical keyed requests creates: {same:?}");
    let id = &created[0].2["id"];
    assert!(
        same.iter().all(|(_, s, body)| *s == StatusCode::CREATED || (*s == StatusCode::OK && &body["id"] == id)),
        "the other nine replay it: {same:?}"
    );

    let diff = of("diff-");
    let created = diff.iter().filter(|(_, s, _)| *s == StatusCode::CREATED).count();
    let conflicts = diff.iter().filter(|(_, s, _)| *s == StatusCode::CONFLICT).count();
    assert_eq!((created, conflicts), (1, 4), "five different requests with one key: {diff:?}");

    // 1 + 30 + 1 + 1 transfers, each with one outbox row naming it.
    assert_eq!(env.db.count("transfers").await, 33);
    let joined = outbox_rows_naming_a_transfer(&env.db).await;
    assert_eq!(joined, 33, "each outbox row names its transfer");
    let rows = env.db.query("SELECT payload FROM outbox_events", &[]).await;
    let ids: HashSet<String> = rows
        .iter()
        .map(|r| {
            let payload: String = r.get(0);
            serde_json::from_str::<Value>(&payload).expect("payload")["transferId"].as_str().expect("id").to_owned()
        })
        .collect();
    assert_eq!((rows.len(), ids.len()), (33, 33), "one outbox row per transfer");
    let keyed = env.db.scalar_i64("SELECT count(*) FROM transfers WHERE idempotency_key IS NOT NULL", &[]).await;
    assert_eq!(keyed, 2);

    // 46 requests written in fewer transactions than requests: the waiting ones were grouped.
    let metrics = app.metrics().await;
    let count = metric_value(&metrics, r#"tally_group_commit_batch_size_count{writes="intake"}"#).expect("batch count");
    let sum = metric_value(&metrics, r#"tally_group_commit_batch_size_sum{writes="intake"}"#).expect("batch sum");
    assert_eq!(sum, 46.0, "every request was written in some batch");
    assert!(count < 46.0, "requests that waited shared transactions: {count} batches");
}

/// The projection's batched status moves: only PENDING transfers move, each at most once
/// per batch (the first move of a transfer wins, as if they came one after the other), a
/// transfer the database does not hold moves nothing, and a second batch moves nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_of_status_moves_moves_each_pending_transfer_once() {
    let db = TestDb::new().await;
    let [a, b, c, absent] = [Uuid::now_v7(), Uuid::now_v7(), Uuid::now_v7(), Uuid::now_v7()];
    for (id, status) in [(a, "PENDING"), (b, "PENDING"), (c, "SETTLED")] {
        db.execute(
            "INSERT INTO transfers (id, source_account, destination_account, amount_cents, currency, status) \
             VALUES ($1, 'acc-a', 'acc-b', 100, 'BRL', $2)",
            &[&id, &status],
        )
        .await;
    }
    let moves = [
        Finish { id: a, status: "SETTLED", reason: None },
        Finish { id: a, status: "REJECTED", reason: Some("LATE".into()) },
        Finish { id: b, status: "REJECTED", reason: Some("INSUFFICIENT_FUNDS".into()) },
        Finish { id: c, status: "REJECTED", reason: Some("TOO_LATE".into()) },
        Finish { id: absent, status: "SETTLED", reason: None },
    ];
    let mut conn = AsyncPgConnection::establish(db.url()).await.expect("diesel connection");
    let moved = finish_all(&mut conn, &moves).await.expect("first batch");
    assert_eq!(moved, [true, false, true, false, false]);
    let again = finish_all(&mut conn, &moves).await.expect("second batch");
    assert_eq!(again, [false; 5], "a final transfer never moves again");

    let status = |id: Uuid| {
        let db = &db;
        async move {
            let row = db.query("SELECT status, rejection_reason FROM transfers WHERE id = $1", &[&id]).await;
            (row[0].get::<_, String>(0), row[0].get::<_, Option<String>>(1))
        }
    };
    assert_eq!(status(a).await, ("SETTLED".to_owned(), None));
    assert_eq!(status(b).await, ("REJECTED".to_owned(), Some("INSUFFICIENT_FUNDS".to_owned())));
    assert_eq!(status(c).await, ("SETTLED".to_owned(), None));
}

/// Two intake writers and small batches, so that requests with one key race in different
/// transactions: every key makes exactly one transfer (one 201, the others 200 replays of
/// it), and every transfer has exactly one outbox row, naming it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_hold_across_concurrent_batches() {
    let (env, app) = spawn_app(|c| {
        c.pipelines.set("outbox", false);
        c.http.intake_writers = 2;
        c.http.intake_batch_max = 4;
    })
    .await;
    env.db.open_accounts(&["acc-0", "acc-1", "acc-2", "acc-3", "acc-4", "acc-5"]).await;
    let requests = (0..60).map(|i| {
        let key = format!("key-{}", i % 6);
        let body = transfer(&format!("acc-{}", i % 6), 100 + i64::from(i % 6));
        let request =
            app.client.post(format!("{}/transfers", app.intake_url)).header("Idempotency-Key", &key).json(&body);
        async move {
            let res = request.send().await.expect("POST /transfers");
            let status = res.status();
            (key, status, json_body(res).await)
        }
    });
    let answers = join_all(requests).await;
    for k in 0..6 {
        let key = format!("key-{k}");
        let of_key: Vec<_> = answers.iter().filter(|(k, _, _)| *k == key).collect();
        let created: Vec<_> = of_key.iter().filter(|(_, s, _)| *s == StatusCode::CREATED).collect();
        assert_eq!(created.len(), 1, "{key}: {of_key:?}");
        let id = &created[0].2["id"];
        assert!(
            of_key.iter().all(|(_, s, body)| *s == StatusCode::CREATED || (*s == StatusCode::OK && &body["id"] == id)),
            "{key}: {of_key:?}"
        );
    }
    assert_eq!(env.db.count("transfers").await, 6);
    let joined = outbox_rows_naming_a_transfer(&env.db).await;
    assert_eq!((joined, env.db.count("outbox_events").await), (6, 6), "one outbox row per transfer, naming it");
}

/// A poison status move (one the ledger recorded, which a CHECK the test adds refuses) in a
/// batch with good ones: the batch is written again in halves, the good moves land, and
/// only the poison record is dead-lettered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_poison_move_fails_alone_and_the_rest_of_its_batch_lands() {
    let (env, app) = spawn_app(|c| run_only(c, &["projection"])).await;
    let ids: Vec<Uuid> = (0..30).map(|_| Uuid::now_v7()).collect();
    for id in &ids {
        env.db
            .execute(
                "INSERT INTO transfers (id, source_account, destination_account, amount_cents, currency, status) \
                 VALUES ($1, 'acc-a', 'acc-b', 100, 'BRL', 'PENDING')",
                &[id],
            )
            .await;
    }
    let poison = ids[15];
    env.db.batch("ALTER TABLE transfers ADD CONSTRAINT test_unstorable CHECK (rejection_reason <> 'UNSTORABLE')").await;
    let reason = |id: &Uuid| if *id == poison { "UNSTORABLE" } else { "INSUFFICIENT_FUNDS" };
    for id in &ids {
        env.db.record_rejected(*id, "acc-a", reason(id)).await;
    }
    // Hold the projection's statements until every record is in, so they batch.
    let holder = env.db.connect().await;
    holder.batch_execute("BEGIN; LOCK TABLE transfers IN SHARE MODE").await.expect("lock transfers");
    let upstream = env.upstream();
    for id in &ids {
        let event = json!({ "eventId": tally_schema::derived_event_id("rejected", *id), "transferId": id,
                            "reason": reason(id), "rejectedAt": "2026-11-30T00:00:00Z" });
        upstream
            .signed("transfers.rejected", None, &id.to_string(), event.to_string().as_bytes(), "TransferRejected")
            .await;
    }
    env.db.wait_lock_waiters(1, "the projection's writers wait on the lock").await;
    tokio::time::sleep(std::time::Duration::from_secs(1)).await;
    holder.batch_execute("COMMIT").await.expect("release the lock");

    wait_until("29 rejections projected", Deadline::DEFAULT, || async {
        match env.db.scalar_i64("SELECT count(*) FROM transfers WHERE status = 'REJECTED'", &[]).await {
            29 => Ok(()),
            n => Err(format!("{n} rejected")),
        }
    })
    .await;
    wait_until("the poison record dead-lettered", Deadline::DEFAULT, || async {
        let m = app.metrics().await;
        match metric_value(&m, r#"tally_dlt_records_total{topic="transfers.rejected-dlt"}"#) {
            Some(n) if n >= 1.0 => Ok(()),
            other => Err(format!("{other:?} dead letters")),
        }
    })
    .await;
    let status = env.db.query("SELECT status FROM transfers WHERE id = $1", &[&poison]).await;
    assert_eq!(status[0].get::<_, String>(0), "PENDING", "the poison move did not land");
    let m = app.metrics().await;
    assert_eq!(metric_value(&m, r#"tally_dlt_records_total{topic="transfers.rejected-dlt"}"#), Some(1.0));
    let batches = metric_value(&m, r#"tally_group_commit_batch_size_count{writes="projection"}"#).unwrap_or(0.0);
    let moves = metric_value(&m, r#"tally_group_commit_batch_size_sum{writes="projection"}"#).unwrap_or(0.0);
    assert_eq!(moves, 29.0, "every good move committed once, in {batches} statements");
}

/// One request of a transfer, as the intake hands it to the store.
fn cut_over_intake(client: &str, adopts_anonymous: bool) -> Intake {
    Intake {
        request: TransferRequest {
            source_account: "acc-a".into(),
            destination_account: "acc-b".into(),
            amount_cents: 100,
            currency: "BRL".into(),
        },
        client: client.into(),
        adopts_anonymous,
        idempotency_key: Some("K-cut-over".into()),
        traceparent: None,
    }
}

/// During the cut-over to an authenticated intake, an anonymous request (a daemon still
/// without authentication) and the adopting client's retry of it (a daemon with it) meet in
/// two transactions, or in one batch: either way exactly one transfer is written, and the
/// adopting request replays it. Without the per-key lock the retry reads before the
/// anonymous transfer commits and writes a second one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_anonymous_request_and_its_adopting_retry_make_one_transfer() {
    let db = TestDb::new().await;
    db.open_accounts(&["acc-a"]).await;
    let mut anonymous = AsyncPgConnection::establish(db.url()).await.expect("diesel connection");
    let mut adopting = AsyncPgConnection::establish(db.url()).await.expect("diesel connection");
    // The anonymous batch's transaction stays open (create_transfers' own is a savepoint
    // in it).
    AnsiTransactionManager::begin_transaction(&mut anonymous).await.expect("begin");
    let first = create_transfers(&mut anonymous, &[cut_over_intake("", false)], "t").await.expect("anonymous");
    assert!(matches!(first[..], [Created::New(_)]), "{first:?}");
    let retry = tokio::spawn(async move {
        let out = create_transfers(&mut adopting, &[cut_over_intake("shop", true)], "t").await;
        (out, adopting)
    });
    // The retry waits for the anonymous transaction's lock (or, without it, is done).
    let waiting = "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted";
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while !retry.is_finished() && db.scalar_i64(waiting, &[]).await == 0 {
        assert!(std::time::Instant::now() < deadline, "the retry neither finished nor waited");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    AnsiTransactionManager::commit_transaction(&mut anonymous).await.expect("commit");
    let (second, _conn) = retry.await.expect("the retry task");
    let second = second.expect("the retry");
    assert!(matches!(second[..], [Created::Replayed(_)]), "the retry replays the anonymous transfer: {second:?}");
    let count = "SELECT count(*) FROM transfers WHERE idempotency_key = 'K-cut-over'";
    assert_eq!(db.scalar_i64(count, &[]).await, 1);

    // Both in one batch, the adopting request first: one transfer, the retry replays it.
    db.execute("DELETE FROM outbox_events", &[]).await;
    db.execute("DELETE FROM transfers", &[]).await;
    let mut conn = AsyncPgConnection::establish(db.url()).await.expect("diesel connection");
    let batch = [cut_over_intake("shop", true), cut_over_intake("", false)];
    let both = create_transfers(&mut conn, &batch, "t").await.expect("one batch");
    assert!(matches!(both[..], [Created::Replayed(_), Created::New(_)]), "{both:?}");
    assert_eq!(db.scalar_i64(count, &[]).await, 1);
    assert_eq!(db.scalar_i64("SELECT count(*) FROM outbox_events", &[]).await, 1, "one TransferRequested");
}
