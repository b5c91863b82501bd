//! Controlling a running stage: the handle that pauses, resumes and observes a pipeline
//! from anywhere, and the driver thread with its command channel.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use rdkafka::error::KafkaResult;

use super::PipelineStatus;
use crate::supervise::restart::Restarts;

/// Pause, resume and observe a running pipeline from anywhere (cheap to clone).
#[derive(Clone)]
pub struct PipelineControl {
    control: std::sync::mpsc::Sender<Control>,
    status: Arc<Mutex<PipelineStatus>>,
    restarts: Arc<Restarts>,
}

impl PipelineControl {
    pub(crate) fn new(
        control: std::sync::mpsc::Sender<Control>,
        status: Arc<Mutex<PipelineStatus>>,
        restarts: Arc<Restarts>,
    ) -> Self {
        Self { control, status, restarts }
    }

    #[must_use]
    pub fn name(&self) -> String {
        self.status.lock().unwrap_or_else(PoisonError::into_inner).name.clone()
    }

    /// Stops fetching; records in flight finish. Blocks until the driver applied it
    /// (returns false when it did not answer within 5 s).
    #[must_use]
    pub fn pause(&self) -> bool {
        self.status.lock().unwrap_or_else(PoisonError::into_inner).paused = true;
        self.request(Control::Pause)
    }

    /// Resumes fetching. Blocks until the driver applied it (false after 5 s).
    #[must_use]
    pub fn resume(&self) -> bool {
        self.status.lock().unwrap_or_else(PoisonError::into_inner).paused = false;
        self.request(Control::Resume)
    }

    fn request(&self, make: fn(std::sync::mpsc::Sender<()>) -> Control) -> bool {
        let (done, applied) = std::sync::mpsc::channel();
        self.control.send(make(done)).is_ok() && applied.recv_timeout(Duration::from_secs(5)).is_ok()
    }

    #[must_use]
    pub fn status(&self) -> PipelineStatus {
        let mut status = self.status.lock().unwrap_or_else(PoisonError::into_inner).clone();
        status.restart = self.restarts.status();
        status
    }
}

/// Commands to a driver thread.
pub(crate) enum Control {
    Stop(std::sync::mpsc::Sender<()>),
    /// Acknowledged once applied.
    Pause(std::sync::mpsc::Sender<()>),
    Resume(std::sync::mpsc::Sender<()>),
}

/// What a stop may take beyond the drain bound of its stage: the last commit, the group
/// leave and the client's close.
pub const STOP_MARGIN: Duration = Duration::from_secs(15);

/// The longest stop bound of the driver threads started so far, in ms.
static LONGEST_STOP_MS: AtomicU64 = AtomicU64::new(0);

/// The longest a stage started so far may take to stop: the bound the daemon's own stop
/// deadline is measured from.
#[must_use]
pub fn longest_stop() -> Duration {
    Duration::from_millis(LONGEST_STOP_MS.load(Ordering::Relaxed))
}

/// Stages whose stop outlasted its bound, each with the reason: the daemon exits non-zero.
static FORCED_STOPS: Mutex<Vec<String>> = Mutex::new(Vec::new());

/// The stops that gave their driver thread up after its bound, each with why: empty
/// after a clean drain.
#[must_use]
pub fn forced_stops() -> Vec<String> {
    FORCED_STOPS.lock().unwrap_or_else(PoisonError::into_inner).clone()
}

/// A stage's driver thread with its control channel: spawned with a body that serves the
/// channel, stopped in order (stop flag, `Stop` command, wait for it, join), the whole
/// stop bounded by `stop_within`.
pub(crate) struct DriverThread {
    name: String,
    control: std::sync::mpsc::Sender<Control>,
    thread: Option<std::thread::JoinHandle<()>>,
    stopping: Arc<AtomicBool>,
    stop_within: Duration,
}

impl DriverThread {
    /// Spawns `body` on a thread named `name`, handing it the receiving end of the
    /// control channel. Its stop waits at most `stop_within`.
    pub(crate) fn spawn(
        name: String,
        stopping: Arc<AtomicBool>,
        stop_within: Duration,
        body: impl FnOnce(std::sync::mpsc::Receiver<Control>) + Send + 'static,
    ) -> KafkaResult<Self> {
        LONGEST_STOP_MS.fetch_max(u64::try_from(stop_within.as_millis()).unwrap_or(u64::MAX), Ordering::Relaxed);
        let (control, control_rx) = std::sync::mpsc::channel();
        let thread = std::thread::Builder::new()
            .name(name.clone())
            .spawn(move || body(control_rx))
            .map_err(|e| rdkafka::error::KafkaError::ClientCreation(e.to_string()))?;
        Ok(Self { name, control, thread: Some(thread), stopping, stop_within })
    }

    /// A sender of commands to the thread.
    pub(crate) fn control(&self) -> std::sync::mpsc::Sender<Control> {
        self.control.clone()
    }

    /// Raises the stop flag, sends `Stop`, waits until it was served, joins the thread;
    /// all of it within `stop_within`. A thread that is not done by then (a broker or
    /// database call that does not come back) is given up: the stop goes on without it,
    /// logs why, and is recorded in [`forced_stops`]; its uncommitted records are
    /// redelivered to the next owner. Whether the stop was clean.
    ///
    /// The wait runs on a thread of its own, not `spawn_blocking`: a runtime waits for its
    /// blocking tasks when it is dropped, and a given-up wait must not hold the exit.
    pub(crate) async fn stop(mut self) -> bool {
        self.stopping.store(true, Ordering::Relaxed);
        let (control, thread) = (self.control.clone(), self.thread.take());
        let (joined, done) = tokio::sync::oneshot::channel();
        let waiter = std::thread::Builder::new().name(format!("{}-stop", self.name)).spawn(move || {
            let (served, wait) = std::sync::mpsc::channel();
            if control.send(Control::Stop(served)).is_ok() {
                let _ = wait.recv();
            }
            if let Some(thread) = thread {
                let _ = thread.join();
            }
            let _ = joined.send(());
        });
        if waiter.is_err() {
            // No thread to wait on: the stop cannot be observed, so it counts as forced.
            return self.forced("the stop could not be waited for (no thread)");
        }
        match tokio::time::timeout(self.stop_within, done).await {
            Ok(_) => true,
            Err(_) => self.forced(&format!("did not stop within {} ms", self.stop_within.as_millis())),
        }
    }

    fn forced(&self, why: &str) -> bool {
        tracing::error!(thread = %self.name, why, "A stage's stop was given up; its uncommitted records are redelivered.");
        FORCED_STOPS.lock().unwrap_or_else(PoisonError::into_inner).push(format!("{}: {why}", self.name));
        false
    }
}
