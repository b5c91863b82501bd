//! PostgreSQL LISTEN on `tally_outbox`: the trigger on `outbox_events` notifies at commit,
//! and every notification wakes the publisher. A lost connection is re-opened with backoff;
//! the publisher's poll interval covers the gap.

use std::sync::Arc;
use std::time::Duration;

use futures_util::{stream, StreamExt};
use tokio::sync::watch;
use tokio_postgres::AsyncMessage;
use tracing::{debug, warn};

use super::Doorbell;
use crate::backoff::Backoff;
use crate::store::PgConnector;

/// The notification channel written by the `outbox_events_notify` trigger.
pub const CHANNEL: &str = "tally_outbox";

/// Listens for outbox commits and notifies `wake` until `stop` turns true.
#[must_use]
pub fn spawn_listener(
    url: String,
    wake: Arc<Doorbell>,
    mut stop: watch::Receiver<bool>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut waits = Backoff::doubling(Duration::from_millis(200), Duration::from_secs(10)).waits();
        while !*stop.borrow() {
            match listen_once(&url, &wake, &mut stop).await {
                Ok(()) => return,
                Err(e) => {
                    warn!(error = %e, "Outbox LISTEN connection lost; polling until it is back.");
                    tokio::select! {
                        () = tokio::time::sleep(waits.next_wait()) => {}
                        _ = stop.changed() => return,
                    }
                }
            }
        }
    })
}

async fn listen_once(url: &str, wake: &Doorbell, stop: &mut watch::Receiver<bool>) -> anyhow::Result<()> {
    let (client, mut connection) = PgConnector::from_url(url)?.connect().await?;
    let mut messages = stream::poll_fn(move |cx| connection.poll_message(cx));
    // Named like the pools' connections, so that it shows in pg_stat_activity.
    let sql = format!("SET application_name = 'tally-outbox-listen'; LISTEN {CHANNEL}");
    let listen = client.batch_execute(&sql);
    tokio::pin!(listen);
    // Drive the connection while the LISTEN command runs.
    loop {
        tokio::select! {
            done = &mut listen => { done?; break; }
            msg = messages.next() => match msg {
                Some(Ok(_)) => {}
                Some(Err(e)) => return Err(e.into()),
                None => return Ok(()),
            },
        }
    }
    debug!(channel = CHANNEL, "Listening for outbox commits.");
    // A commit may have happened before LISTEN took effect.
    wake.ring();
    loop {
        tokio::select! {
            msg = messages.next() => match msg {
                Some(Ok(AsyncMessage::Notification(_))) => wake.ring(),
                Some(Ok(_)) => {}
                Some(Err(e)) => return Err(e.into()),
                None => return Ok(()),
            },
            _ = stop.changed() => return Ok(()),
        }
    }
}
