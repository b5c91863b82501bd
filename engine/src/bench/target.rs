//! What the HTTP load of [`super::e2e`] and [`super::stages`] is sent to: a daemon with its
//! pipelines on a fresh database, either inside the bench ([`Target::start`]) or a `tally
//! run` child process of its own ([`Target::spawn`]), whose CPU time is then read per load
//! phase ([`super::cpu`]).

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use serde_json::json;
use tokio::sync::Semaphore;

use super::child::{free_addr, Daemon};
use super::cluster::Cluster;
use super::cpu::{Clock, PhaseCpu, Watched};
use super::e2e::{measure, Load, Phase};
use super::{account, connect as db, quantile, sql, wait_for_zero, Progress};
use crate::config::Config;
use crate::DaemonHandle;

/// Where the daemon runs.
enum Running {
    /// On a thread of the bench.
    InProcess(DaemonHandle),
    /// A `tally run` child.
    Child(Daemon),
}

/// A daemon on a fresh database, warmed up: what the load phases POST to and measure.
pub struct Target {
    daemon: Running,
    url: String,
    intake: String,
    admin: String,
    client: reqwest::Client,
    accounts: usize,
    /// The processes whose CPU each phase reads (a child daemon only).
    watched: Option<Watched>,
}

impl Target {
    /// Starts a daemon inside the bench on `config` (its database fresh, from
    /// [`super::fresh_database`] with `accounts` accounts) and `cluster`, and lets every
    /// consumer group join: one transfer through every stage, then forgotten. The HTTP
    /// client keeps up to `clients` connections.
    ///
    /// # Errors
    /// When the daemon does not start or the first transfer does not reach a final status.
    pub fn start(
        config: Config,
        cluster: &Cluster,
        clients: usize,
        accounts: usize,
        runtime: &tokio::runtime::Runtime,
    ) -> anyhow::Result<Self> {
        let target = Self::unwarmed(config, cluster, clients, accounts)?;
        runtime.block_on(target.warm_up())?;
        Ok(target)
    }

    /// [`Target::start`] without the warm-up transfer: for a daemon whose pipelines do not
    /// take a transfer to a final status (the intake alone).
    ///
    /// # Errors
    /// When the daemon does not start.
    pub fn unwarmed(config: Config, cluster: &Cluster, clients: usize, accounts: usize) -> anyhow::Result<Self> {
        let url = config.database.connect_url();
        let daemon = crate::spawn(config, cluster.embedded())?;
        let intake = format!("http://{}", daemon.intake_addr);
        let admin = format!("http://{}", daemon.admin_addr);
        let client = reqwest::Client::builder().pool_max_idle_per_host(clients).build()?;
        Ok(Self { daemon: Running::InProcess(daemon), url, intake, admin, client, accounts, watched: None })
    }

    /// Starts `tally run` as a child process with every pipeline, on database `database`
    /// at `url` (fresh, with `accounts` accounts) and `cluster`, configured by `TALLY__*`
    /// variables over the bench's own, its log lines in `log`; then warms it up as
    /// [`Target::start`] does. Each phase reads the CPU time of the child, of the broker
    /// when it is a process of its own, of the bench and of the database's backends.
    ///
    /// # Errors
    /// When the daemon is not ready within 2 minutes or the first transfer does not reach
    /// a final status.
    pub fn spawn(
        base: &Config,
        (url, database): (&str, &str),
        cluster: &Cluster,
        (clients, accounts): (usize, usize),
        log: &str,
        runtime: &tokio::runtime::Runtime,
    ) -> anyhow::Result<Self> {
        let intake = free_addr()?;
        let env = [
            ("TALLY__DATABASE__URL", url.to_owned()),
            ("TALLY__SIGNING__KEYS_DIR", super::KEYS_DIR.to_owned()),
            ("TALLY__KAFKA__BROKERS", cluster.bootstrap()),
            ("TALLY__KAFKA__REPLICATION_FACTOR", "1".to_owned()),
            ("TALLY__KAFKA__GROUP_PROTOCOL", base.kafka.effective_group_protocol().name().to_owned()),
            ("TALLY__HTTP__INTAKE_ADDR", intake.clone()),
        ]
        .map(|(k, v)| (k.to_owned(), v));
        let mut env = env.to_vec();
        env.extend(cluster.mock_fetch_wait(base));
        let mut daemon = Daemon::spawn(&env, log)?;
        runtime.block_on(daemon.ready(Duration::from_secs(120), log))?;
        let watched = Watched { daemon: Some(daemon.pid()), broker: cluster.pid(), database: database.to_owned() };
        let target = Self {
            admin: daemon.admin.clone(),
            daemon: Running::Child(daemon),
            url: url.to_owned(),
            intake: format!("http://{intake}"),
            client: reqwest::Client::builder().pool_max_idle_per_host(clients).build()?,
            accounts,
            watched: Some(watched),
        };
        runtime.block_on(target.warm_up())?;
        Ok(target)
    }

    /// One transfer through every stage (before any phase: not counted).
    async fn warm_up(&self) -> anyhow::Result<()> {
        self.post(0).await?;
        wait_final(&self.url, None, Duration::from_secs(120)).await
    }

    /// The daemon's process id when it is a child.
    #[must_use]
    pub fn pid(&self) -> Option<u32> {
        match &self.daemon {
            Running::InProcess(_) => None,
            Running::Child(d) => Some(d.pid()),
        }
    }

    /// Stops the daemon (a child is killed).
    pub fn stop(self) {
        match self.daemon {
            Running::InProcess(d) => d.stop(),
            Running::Child(d) => drop(d),
        }
    }

    async fn post(&self, n: usize) -> anyhow::Result<()> {
        post(&self.client, &self.intake, n, self.accounts).await
    }

    /// The CPU of each process over `seconds` without load (`None` for a daemon inside
    /// the bench, or no wait).
    pub async fn idle(&self, seconds: Duration) -> Option<PhaseCpu> {
        let watched = self.watched.as_ref().filter(|_| !seconds.is_zero())?;
        eprintln!("e2e bench: idle for {} s", seconds.as_secs());
        let started = Clock::read(watched);
        tokio::time::sleep(seconds).await;
        Some(started.until(&Clock::read(watched), 0))
    }

    /// Runs one load phase and measures it from the database (and the CPU of the
    /// processes, for a child daemon): the transfers requested since it started.
    ///
    /// # Errors
    /// When a query fails or the transfers do not all reach a final status in 10 minutes.
    pub async fn load(&self, load: &Load) -> anyhow::Result<Phase> {
        let name = load.name();
        eprintln!(
            "e2e bench: {name} for {} s{}",
            load.seconds,
            load.limit.map_or(String::new(), |l| format!(" or {l} transfers"))
        );
        let since: f64 = db(&self.url).await?.query_one(sql::NOW_EPOCH, &[]).await?.get(0);
        let started = self.watched.as_ref().map(Clock::read);
        let (sent, mut post_ms, errors) = self.send(load, &name).await?;
        post_ms.sort_by(f64::total_cmp);
        let created = u64::try_from(sent - errors)?;
        wait_final(&self.url, Some(created), Duration::from_secs(600)).await?;
        let ended = self.watched.as_ref().map(Clock::read);
        let mut phase = measure(&db(&self.url).await?, name, since).await?;
        phase.cpu = started.zip(ended).map(|(s, e)| s.until(&e, phase.finished));
        phase.offered_per_second = load.rate;
        phase.sent = sent;
        phase.http_errors = errors;
        phase.post_p50_ms = quantile(&post_ms, 0.5);
        phase.post_p99_ms = quantile(&post_ms, 0.99);
        Ok(phase)
    }

    /// POSTs for the phase; returns how many were sent, each one's latency in ms, and how
    /// many failed.
    pub(crate) async fn send(&self, load: &Load, name: &str) -> anyhow::Result<(usize, Vec<f64>, usize)> {
        let permits = Arc::new(Semaphore::new(if load.rate.is_some() { 1_000 } else { load.clients }));
        let started = Instant::now();
        let until = started + Duration::from_secs(load.seconds);
        let mut tasks = Vec::new();
        let mut n = 0_usize;
        let mut progress = match load.limit {
            Some(limit) => Progress::bar(&format!("{name}: transfers sent"), limit as u64),
            None => Progress::spinner(name),
        };
        while Instant::now() < until && load.limit.is_none_or(|l| n < l) {
            if let Some(r) = load.rate {
                let due = started + Duration::from_secs_f64(n as f64 / f64::from(r));
                tokio::time::sleep_until(due.into()).await;
            }
            let permit = Arc::clone(&permits).acquire_owned().await.context("load permits")?;
            let (client, intake, accounts) = (self.client.clone(), self.intake.clone(), self.accounts);
            tasks.push(tokio::spawn(async move {
                let sent = Instant::now();
                let result = post(&client, &intake, n + 1, accounts).await;
                drop(permit);
                (sent.elapsed().as_secs_f64() * 1000.0, result.is_ok())
            }));
            n += 1;
            progress.update(n as u64, || format!("sent {n}"));
        }
        progress.finish();
        let mut post_ms = Vec::with_capacity(tasks.len());
        let mut errors = 0;
        for t in tasks {
            let (ms, ok) = t.await?;
            post_ms.push(ms);
            errors += usize::from(!ok);
        }
        Ok((n, post_ms, errors))
    }

    /// Whether the ledger invariants hold (`/admin/ledger/check`).
    ///
    /// # Errors
    /// When the admin endpoint does not answer JSON.
    pub async fn ledger_ok(&self) -> anyhow::Result<bool> {
        Ok(super::ledger_check(&self.admin).await?["ok"] == true)
    }
}

async fn post(client: &reqwest::Client, intake: &str, n: usize, accounts: usize) -> anyhow::Result<()> {
    let (from, to) = super::pair(n, accounts);
    let body = json!({
        "sourceAccount": account(from), "destinationAccount": account(to),
        "amountCents": 1 + (n % 500) as i64, "currency": "BRL",
    });
    let res = client.post(format!("{intake}/transfers")).json(&body).send().await?;
    if res.status() != reqwest::StatusCode::CREATED {
        bail!("POST /transfers answered {}", res.status());
    }
    Ok(())
}

/// Waits until no transfer is PENDING (a bar of the `total` created, when known).
async fn wait_final(url: &str, total: Option<u64>, limit: Duration) -> anyhow::Result<()> {
    let client = db(url).await?;
    wait_for_zero(&client, sql::TRANSFERS_PENDING, "transfers finished", total, limit).await
}
