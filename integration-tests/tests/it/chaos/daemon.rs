//! One `tally run` process of a chaos run, restartable under its instance id and ports.

use std::time::{Duration, Instant};

use tally_integration_tests::{spawn_tally_process, TallyProcess, TestEnv};

pub(super) struct Daemon {
    pub name: &'static str,
    env: Vec<(String, String)>,
    pub intake: String,
    pub admin: String,
    pub child: Option<TallyProcess>,
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).map(|a| a.port()).expect("free port")
}

impl Daemon {
    /// Daemon `name` of the run of `seed` (its instance id comes from both).
    pub fn new(name: &'static str, seed: u64, extra: &[(&str, &str)]) -> Self {
        let (intake, admin) = (free_port(), free_port());
        let id = super::load::hash(seed, name) & 0xff_ffff;
        let mut env: Vec<(String, String)> = vec![
            ("TALLY__INSTANCE__ID".into(), format!("chaos-{name}-{id:06x}")),
            ("TALLY__HTTP__INTAKE_ADDR".into(), format!("127.0.0.1:{intake}")),
            ("TALLY__HTTP__ADMIN_ADDR".into(), format!("127.0.0.1:{admin}")),
            ("TALLY__LOG__LEVEL".into(), std::env::var("TALLY_CHAOS_LOG").unwrap_or_else(|_| "warn".into())),
        ];
        env.extend(extra.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())));
        Self {
            name,
            env,
            intake: format!("http://127.0.0.1:{intake}"),
            admin: format!("http://127.0.0.1:{admin}"),
            child: None,
        }
    }

    pub fn start(&mut self, env: &TestEnv) {
        let vars: Vec<(&str, &str)> = self.env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        self.child = Some(spawn_tally_process(env, &vars));
    }

    /// How the process ended, when it did (without being asked to by [`Daemon::kill`] or
    /// [`Daemon::terminate`], which take it away first).
    pub fn exited(&mut self) -> Option<String> {
        let status = self.child.as_mut()?.try_wait().ok()??;
        self.child = None;
        Some(status.to_string())
    }

    /// kill -9, and reaped.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Sends `signal` (`STOP`, `CONT`, `TERM`); whether the process got it.
    pub fn signal(&self, signal: &str) -> bool {
        self.child.as_ref().is_some_and(|c| c.signal(signal))
    }

    /// SIGTERM and a wait of up to `within` for the exit: its status, or `None` when the
    /// daemon did not stop in time (it is then killed).
    pub async fn terminate(&mut self, within: Duration) -> Option<std::process::ExitStatus> {
        let mut child = self.child.take()?;
        if !child.signal("TERM") {
            return None;
        }
        let started = Instant::now();
        while started.elapsed() < within {
            if let Ok(Some(status)) = child.try_wait() {
                return Some(status);
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        None
    }

    pub async fn wait_ready(&self, http: &reqwest::Client) {
        let started = Instant::now();
        let mut last = String::new();
        while started.elapsed() < Duration::from_secs(60) {
            match http.get(format!("{}/readyz", self.admin)).send().await {
                Ok(r) if r.status().is_success() => return,
                Ok(r) => last = r.text().await.unwrap_or_default(),
                Err(e) => last = e.to_string(),
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        panic!("daemon {} not ready within 60 s: {last}", self.name);
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        self.kill();
    }
}
