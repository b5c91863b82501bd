//! Rebalances under cooperative (incremental) assignment: a member that joins, or one
//! that dies, moves only the partitions that change owner. A partition that stays where it
//! is is never revoked, so it is never drained nor read again from its committed offset.

use tally_integration_tests::*;

/// Partitions pipeline `pipeline` of `app` gave up (`event = "revoked"`) or was given
/// (`"assigned"`) in rebalances so far.
async fn moved(app: &TestApp, pipeline: &str, event: &str) -> u64 {
    let series = format!(r#"tally_rebalance_partitions_total{{event="{event}",pipeline="{pipeline}"}}"#);
    metric_value(&app.metrics().await, &series).unwrap_or(0.0) as u64
}

/// Waits until `app` holds exactly `want` partitions of each of `pipelines`.
async fn wait_holding(app: &TestApp, pipelines: &[&str], want: usize, what: &str) {
    wait_until(what, Deadline::DEFAULT, || async {
        let mut held = Vec::new();
        for p in pipelines {
            held.push(app.partitions_of(p).await);
        }
        if held.iter().all(|h| *h == want) {
            Ok(())
        } else {
            Err(format!("holding {held:?} of {pipelines:?}"))
        }
    })
    .await;
}

/// One member holds every partition; a second joins (half move to it), then dies by
/// SIGKILL (its half comes back once the broker expires it). Through both rebalances the
/// first member gives up exactly the partitions the newcomer takes, and none when the
/// other dies: its own partitions are never revoked. Eager assignment would revoke all of
/// them both times. The ledger (partition-consumer actors) and antifraud (the
/// transactional loop) are checked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn joining_and_dying_members_move_only_the_partitions_that_change_owner() {
    let env = TestEnv::new().await;
    tally_actors::store::migrate::prepare_blocking(env.db.url()).expect("migrate");
    let pipelines = ["ledger", "antifraud"];
    let stay = env.spawn(|c| run_only(c, &pipelines)).await;
    let total = stay.config.kafka.partitions as usize;
    wait_holding(&stay, &pipelines, total, "the first member holds every partition").await;
    let mut before = Vec::new();
    for p in pipelines {
        before.push(moved(&stay, p, "revoked").await);
    }

    let off = "false";
    let mut other = spawn_tally_process(
        &env,
        &[
            ("TALLY__PIPELINES__OUTBOX", off),
            ("TALLY__PIPELINES__PROJECTION", off),
            ("TALLY__PIPELINES__ORDERS", off),
            ("TALLY__PIPELINES__NOTIFICATIONS", off),
        ],
    );
    wait_holding(&stay, &pipelines, total / 2, "a second member takes half of the partitions").await;
    let mut after_join = Vec::new();
    for (p, was) in pipelines.iter().zip(&before) {
        let revoked = moved(&stay, p, "revoked").await;
        assert_eq!(
            revoked - was,
            (total - total / 2) as u64,
            "{p}: the first member gave up exactly the partitions the second took, not all {total}"
        );
        after_join.push(revoked);
    }

    other.kill().expect("SIGKILL the second member");
    let _ = other.wait();
    wait_holding(&stay, &pipelines, total, "the dead member's partitions come back").await;
    for (p, was) in pipelines.iter().zip(&after_join) {
        assert_eq!(moved(&stay, p, "revoked").await, *was, "{p}: the survivor's own partitions were revoked");
    }
    stay.stop().await;
}
