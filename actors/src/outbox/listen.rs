//! PostgreSQL LISTEN and NOTIFY on `tally_outbox`. The trigger on `outbox_events`
//! notifies at commit, except on the connections of tally's own writers, which ring a
//! [`super::CommitBell`] after their commit instead: the announcer sends that notification
//! then, outside the writing transaction. Every notification but this daemon's own wakes
//! the publisher. A lost connection is re-opened with backoff; the publisher's poll
//! interval covers the gap.

use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use futures_util::{stream, StreamExt};
use tokio::sync::{watch, Notify};
use tokio_postgres::AsyncMessage;
use tracing::{debug, warn};

use super::Doorbell;
use crate::backoff::{Backoff, Waits};
use crate::store::PgConnector;

/// The notification channel written by the `outbox_events_notify` trigger.
pub const CHANNEL: &str = "tally_outbox";

/// `application_name` of a daemon's LISTEN connection.
const LISTENER_NAME: &str = "tally-outbox-listen";
/// `application_name` of a daemon's announcer connection.
const ANNOUNCER_NAME: &str = "tally-outbox-notify";

/// This daemon on the channel: the token its announcer sends (its listener skips it), and
/// the backend pid of its LISTEN connection, 0 while it has none (its announcer looks for
/// listeners other than that one).
#[derive(Debug)]
pub struct Own {
    pub token: String,
    listener_pid: AtomicI32,
}

impl Own {
    /// A fresh random token.
    #[must_use]
    pub fn new() -> Self {
        Self { token: uuid::Uuid::new_v4().to_string(), listener_pid: AtomicI32::new(0) }
    }
}

impl Default for Own {
    fn default() -> Self {
        Self::new()
    }
}

/// Listens for outbox commits and notifies `wake` until `stop` turns true. Notifications
/// whose payload is `own`'s token (this daemon's announcer's) are skipped: its bell rang
/// already.
#[must_use]
pub fn spawn_listener(
    url: String,
    wake: Arc<Doorbell>,
    own: Arc<Own>,
    stop: watch::Receiver<bool>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(reconnecting(url, own, Session::Listen(wake), stop))
}

/// What a connection of [`reconnecting`] does.
enum Session {
    Listen(Arc<Doorbell>),
    Announce(Arc<Notify>),
}

/// Runs `session` on a connection until it ends well or `stop` turns true; after each
/// failure, logs it and waits with backoff (reset once a connection is up).
async fn reconnecting(url: String, own: Arc<Own>, session: Session, mut stop: watch::Receiver<bool>) {
    let mut waits = Backoff::doubling(Duration::from_millis(200), Duration::from_secs(10)).waits();
    while !*stop.borrow() {
        let (ended, lost) = match &session {
            Session::Listen(wake) => (
                listen_once(&url, wake, &own, &mut waits, &mut stop).await,
                "Outbox LISTEN connection lost; polling until it is back.",
            ),
            Session::Announce(announce) => (
                announce_once(&url, announce, &own, &mut waits, &mut stop).await,
                "Outbox NOTIFY connection lost; other daemons poll until it is back.",
            ),
        };
        match ended {
            Ok(()) => return,
            Err(e) => {
                warn!(error = %e, "{lost}");
                tokio::select! {
                    () = tokio::time::sleep(waits.next_wait()) => {}
                    _ = stop.changed() => return,
                }
            }
        }
    }
}

async fn listen_once(
    url: &str,
    wake: &Doorbell,
    own: &Own,
    waits: &mut Waits,
    stop: &mut watch::Receiver<bool>,
) -> anyhow::Result<()> {
    let (client, mut connection) = bounded(PgConnector::from_url(url)?.connect()).await?;
    let mut messages = stream::poll_fn(move |cx| connection.poll_message(cx));
    // Its own daemon's announcer must know it before it is named as a listener.
    let pid: i32 =
        bounded(while_driving(client.query_one("SELECT pg_backend_pid()", &[]), &mut messages)).await?.get(0);
    own.listener_pid.store(pid, Ordering::Relaxed);
    let _forgotten = ForgetOnDrop(&own.listener_pid);
    // Named like the pools' connections, so that it shows in pg_stat_activity, where the
    // announcers look for listeners.
    let sql = format!("SET application_name = '{LISTENER_NAME}'; LISTEN {CHANNEL}");
    bounded(while_driving(client.batch_execute(&sql), &mut messages)).await?;
    waits.reset();
    debug!(channel = CHANNEL, "Listening for outbox commits.");
    let _hearing = wake.hearing();
    // A commit may have happened before LISTEN took effect.
    wake.ring();
    async {
        loop {
            tokio::select! {
                msg = messages.next() => match msg {
                    Some(Ok(AsyncMessage::Notification(n))) if n.payload() != own.token => wake.ring(),
                    Some(Ok(_)) => {}
                    Some(Err(e)) => return Err(e.into()),
                    // A closed connection is opened again, as a failed one.
                    None => anyhow::bail!("the connection closed"),
                },
                _ = stop.changed() => return Ok(()),
            }
        }
    }
    .await
}

/// Sets the listener's pid back to 0 however `listen_once` ends.
struct ForgetOnDrop<'a>(&'a AtomicI32);

impl Drop for ForgetOnDrop<'_> {
    fn drop(&mut self) {
        self.0.store(0, Ordering::Relaxed);
    }
}

/// Runs `work` on the connection whose messages are `messages`, driving it meanwhile.
async fn while_driving<T>(
    work: impl std::future::Future<Output = Result<T, tokio_postgres::Error>>,
    messages: &mut (impl futures_util::Stream<Item = Result<AsyncMessage, tokio_postgres::Error>> + Unpin),
) -> anyhow::Result<T> {
    tokio::pin!(work);
    loop {
        tokio::select! {
            done = &mut work => return Ok(done?),
            msg = messages.next() => match msg {
                Some(Ok(_)) => {}
                Some(Err(e)) => return Err(e.into()),
                None => anyhow::bail!("the connection closed"),
            },
        }
    }
}

/// Sends a notification on [`CHANNEL`], with this daemon's token as its payload, after
/// each ring of `announce` (see [`super::CommitBell`]), on a connection of its own, until
/// `stop` turns true. Rings that come while one is on its way are answered by one more
/// after it.
///
/// Only while another daemon listens: every [`LISTENERS_CHECK`] it looks in
/// `pg_stat_activity` for a LISTEN connection other than its own daemon's, and while there
/// is none it sends nothing (its own loops were rung already). A daemon that starts
/// listening sweeps every free shard first; the commits after that sweep and before the
/// next look are announced by one notification at that look.
///
/// A lost connection is re-opened with backoff; meanwhile other daemons' publishers find
/// the rows at their next claim or poll.
#[must_use]
pub fn spawn_announcer(
    url: String,
    announce: Arc<Notify>,
    own: Arc<Own>,
    stop: watch::Receiver<bool>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(reconnecting(url, own, Session::Announce(announce), stop))
}

/// How often the announcer looks for other daemons' LISTEN connections.
pub const LISTENERS_CHECK: Duration = Duration::from_secs(1);

/// Longest the listener and the announcer wait for a connection or one statement before
/// they open the connection again: one left half-open by a failover would otherwise hold
/// them (and the daemon's shutdown) until TCP gives up. The listener's wait for
/// notifications has no bound: it watches the stop meanwhile.
const SETUP_WAIT: Duration = Duration::from_secs(5);

async fn bounded<T, E: Into<anyhow::Error>>(
    work: impl std::future::Future<Output = Result<T, E>>,
) -> anyhow::Result<T> {
    match tokio::time::timeout(SETUP_WAIT, work).await {
        Ok(done) => done.map_err(Into::into),
        Err(_) => anyhow::bail!("no answer within {} s", SETUP_WAIT.as_secs()),
    }
}

async fn announce_once(
    url: &str,
    announce: &Notify,
    own: &Own,
    waits: &mut Waits,
    stop: &mut watch::Receiver<bool>,
) -> anyhow::Result<()> {
    let (client, connection) = bounded(PgConnector::from_url(url)?.connect()).await?;
    let driver = tokio::spawn(connection);
    let announced = async {
        // A notification takes a transaction ID and a server-wide lock at commit: without
        // waiting for the flush, the lock is held for a moment only. A notification needs
        // no durability.
        bounded(
            client.batch_execute(&format!("SET application_name = '{ANNOUNCER_NAME}'; SET synchronous_commit = off")),
        )
        .await?;
        let notify = bounded(client.prepare("SELECT pg_notify($1, $2)")).await?;
        let others = bounded(client.prepare(&format!(
            "SELECT EXISTS (SELECT 1 FROM pg_stat_activity WHERE datname = current_database() \
             AND application_name = '{LISTENER_NAME}' AND pid <> $1)"
        )))
        .await?;
        waits.reset();
        debug!(channel = CHANNEL, "Announcing outbox commits.");
        let mut check = tokio::time::interval(LISTENERS_CHECK);
        check.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut listened = false;
        loop {
            // The check is not starved by a steady stream of rings, and a ring that came
            // before the stop is announced first.
            tokio::select! {
                biased;
                _ = check.tick() => {
                    let pid = own.listener_pid.load(Ordering::Relaxed);
                    let was = listened;
                    listened = bounded(client.query_one(&others, &[&pid])).await?.get(0);
                    if listened && !was {
                        // The commits since the newcomer's first sweep went unannounced.
                        announce.notify_one();
                    }
                }
                () = announce.notified() => {
                    if !listened {
                        continue;
                    }
                    if let Err(e) = bounded(client.execute(&notify, &[&CHANNEL, &own.token])).await {
                        // Sent again once the connection is back.
                        announce.notify_one();
                        return Err(e);
                    }
                }
                _ = stop.changed() => return Ok::<(), anyhow::Error>(()),
            }
        }
    }
    .await;
    driver.abort();
    announced
}
