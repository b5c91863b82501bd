//! A daemon on a thread of its own, for tests and the bench: [`spawn`] prepares the
//! database, starts the daemon in its own actix `System`, waits until it serves, and hands
//! back a [`DaemonHandle`] that stops it when dropped.

use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::{anyhow, Context};
use tally_actors::store::migrate;

use super::{start, KafkaEndpoint};
use crate::broker::EmbeddedBroker;
use crate::config::Config;

/// A daemon running on a thread of its own (its own actix `System`), for tests and the
/// bench. Dropping the handle stops the daemon.
pub struct DaemonHandle {
    pub intake_addr: SocketAddr,
    pub admin_addr: SocketAddr,
    pub bootstrap: String,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl DaemonHandle {
    /// Shuts the daemon down in order and waits for its thread.
    pub fn stop(mut self) {
        self.stop_inner();
    }

    fn stop_inner(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl Drop for DaemonHandle {
    fn drop(&mut self) {
        self.stop_inner();
    }
}

/// Prepares the database, then starts a daemon on a new thread and waits until it serves.
/// `broker` reuses an embedded broker that outlives the daemon (tests that restart it).
///
/// # Errors
/// When the database cannot be prepared or the daemon cannot start.
pub fn spawn(config: Config, broker: Option<Arc<EmbeddedBroker>>) -> anyhow::Result<DaemonHandle> {
    let listeners = crate::http::Listeners::bind(&config.http)?;
    let expected = migrate::embedded_versions()?;
    migrate::prepare_blocking(&config.database.connect_url())?;
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let thread = std::thread::Builder::new()
        .name("tally-daemon".into())
        .spawn(move || {
            let system = actix::System::new();
            let endpoint = system.block_on(async move {
                let started = async {
                    let kafka = KafkaEndpoint::prepare(&config, broker).await?;
                    start(config, listeners, kafka, expected).await
                }
                .await;
                match started {
                    Ok(daemon) => {
                        let _ =
                            ready_tx.send(Ok((daemon.intake_addr, daemon.admin_addr, daemon.kafka.bootstrap.clone())));
                        let _ = stop_rx.await;
                        Some(daemon.shutdown().await)
                    }
                    Err(e) => {
                        let _ = ready_tx.send(Err(e));
                        None
                    }
                }
            });
            drop(system);
            if let Some(stopped) = endpoint {
                stopped.release();
            }
        })
        .context("cannot start the daemon thread")?;
    let (intake_addr, admin_addr, bootstrap) =
        ready_rx.recv().map_err(|_| anyhow!("the daemon thread ended before it started"))??;
    Ok(DaemonHandle { intake_addr, admin_addr, bootstrap, stop: Some(stop_tx), thread: Some(thread) })
}
