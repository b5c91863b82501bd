//! How the publishers hear of new rows. A notification inside a transaction makes its
//! commit take a lock that every committing transaction with a notification takes in
//! turn, held through the commit's flush; so the intake and the ledger, which write outbox
//! rows on every transfer, send none in their transactions. Their daemon rings its own
//! publish loops after each commit, and announces the commit to the other daemons that
//! listen, with a notification sent outside the writing transaction.
//!
//! Broker: the embedded mock cluster, one per test. Database: a fresh PostgreSQL database
//! per test. The publishers' poll is ten minutes away in every test, so only a ring or a
//! notification gets a row out in time.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::intake::wait_until_no_pending;
use futures_util::{stream, StreamExt};
use tally_actors::outbox::LISTENERS_CHECK;
use tally_integration_tests::{
    create_account, final_state, post_transfer, run_only, spawn_app, Deadline, TestApp, TestDb,
};
use tokio_postgres::AsyncMessage;

const POLL: Duration = Duration::from_secs(600);

/// Every notification on the publishers' channel from now on, heard on a connection of
/// the test's own named `name`: the connection (to rename it) and the payloads, in order.
async fn heard(db: &TestDb, name: &str) -> (tokio_postgres::Client, Arc<Mutex<Vec<String>>>) {
    let (client, mut connection) =
        tokio_postgres::connect(db.url(), tokio_postgres::NoTls).await.expect("a listening connection");
    let payloads = Arc::new(Mutex::new(Vec::new()));
    let sink = Arc::clone(&payloads);
    tokio::spawn(async move {
        let mut messages = stream::poll_fn(move |cx| connection.poll_message(cx));
        while let Some(Ok(message)) = messages.next().await {
            if let AsyncMessage::Notification(n) = message {
                sink.lock().expect("the payloads").push(n.payload().to_owned());
            }
        }
    });
    client.batch_execute(&format!("SET application_name = '{name}'; LISTEN tally_outbox")).await.expect("LISTEN");
    (client, payloads)
}

fn taken(payloads: &Mutex<Vec<String>>) -> Vec<String> {
    std::mem::take(&mut *payloads.lock().expect("the payloads"))
}

/// Accounts `<prefix>-A` (funded) and `<prefix>-B` on `app`, and three transfers between
/// them, each waited for until it settles: its TransferRequested row (the intake's) and
/// its TransferSettled row (the ledger's) must both be published for that.
async fn settle_three(app: &TestApp, prefix: &str) {
    let (a, b) = (format!("{prefix}-A"), format!("{prefix}-B"));
    create_account(app, &a, 100_000, "BRL").await;
    create_account(app, &b, 0, "BRL").await;
    for amount in [100, 200, 300] {
        let id = post_transfer(app, &a, &b, amount).await;
        assert_eq!(final_state(app, id).await["status"], "SETTLED", "transfer of {amount}");
    }
}

// Broker: embedded mock cluster.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_intakes_and_the_ledgers_commits_notify_only_other_daemons_after_commit() {
    let (env, app) = spawn_app(|c| c.outbox.poll_interval = POLL).await;
    // A listener that is no daemon's: the daemon is alone. Its announcer may have counted
    // its own listener while it was connecting, until its next look.
    let (listener, payloads) = heard(&env.db, "tally-test-listen").await;
    tokio::time::sleep(LISTENERS_CHECK * 2).await;
    settle_three(&app, "ALONE").await;
    // Its own loops were rung; no notification was sent, from inside a commit (the
    // trigger's) or after it (no other daemon listens).
    assert_eq!(taken(&payloads), Vec::<String>::new(), "notifications while the daemon is alone");

    // Now named as a daemon's listener: the daemon announces its commits to it once its
    // next look at the listeners has found it.
    listener.batch_execute("SET application_name = 'tally-outbox-listen'").await.expect("rename");
    tokio::time::sleep(LISTENERS_CHECK * 2).await;
    // At the look that found it, one notification for whatever was committed and not
    // announced before: a newcomer sweeps when it starts listening, and this covers the
    // commits between that sweep and the look.
    let found = taken(&payloads);
    assert!(found.len() == 1 && !found[0].is_empty(), "one announcement when a listener appears: {found:?}");
    settle_three(&app, "HEARD").await;
    let payloads = taken(&payloads);
    assert!(!payloads.is_empty(), "the daemon announced none of its commits to another listener");
    // The trigger's notification has an empty payload; the announcer sends its daemon's
    // token.
    assert!(
        payloads.iter().all(|p| !p.is_empty()),
        "a notification came from inside a commit of the intake or the ledger: {payloads:?}"
    );
}

// Broker: embedded mock cluster, shared by both daemons.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_daemons_commits_wake_this_daemons_publisher() {
    // Only the first daemon publishes; the second takes the transfers and settles them, so
    // every outbox row is committed there and must be announced to the first.
    let (env, _publisher) = spawn_app(|c| {
        run_only(c, &["outbox"]);
        c.outbox.poll_interval = POLL;
    })
    .await;
    let writer = env
        .spawn(|c| {
            c.pipelines.set("outbox", false);
            c.outbox.poll_interval = POLL;
        })
        .await;
    settle_three(&writer, "AWAY").await;
    // The publisher publishes them all (the last mark may commit after the projection
    // read its record).
    wait_until_no_pending(&env.db, Deadline::DEFAULT).await;
}
