//! Controlling a running stage: the handle that pauses, resumes and observes a pipeline
//! from anywhere, and the driver thread with its command channel.

use std::sync::atomic::{AtomicBool, Ordering};
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

/// A stage's driver thread with its control channel: spawned with a body that serves the
/// channel, stopped in order (stop flag, `Stop` command, wait for it, join).
pub(crate) struct DriverThread {
    control: std::sync::mpsc::Sender<Control>,
    thread: Option<std::thread::JoinHandle<()>>,
    stopping: Arc<AtomicBool>,
}

impl DriverThread {
    /// Spawns `body` on a thread named `name`, handing it the receiving end of the
    /// control channel.
    pub(crate) fn spawn(
        name: String,
        stopping: Arc<AtomicBool>,
        body: impl FnOnce(std::sync::mpsc::Receiver<Control>) + Send + 'static,
    ) -> KafkaResult<Self> {
        let (control, control_rx) = std::sync::mpsc::channel();
        let thread = std::thread::Builder::new()
            .name(name)
            .spawn(move || body(control_rx))
            .map_err(|e| rdkafka::error::KafkaError::ClientCreation(e.to_string()))?;
        Ok(Self { control, thread: Some(thread), stopping })
    }

    /// A sender of commands to the thread.
    pub(crate) fn control(&self) -> std::sync::mpsc::Sender<Control> {
        self.control.clone()
    }

    /// Raises the stop flag, sends `Stop`, waits until it was served, joins the thread.
    pub(crate) async fn stop(mut self) {
        self.stopping.store(true, Ordering::Relaxed);
        let (done, wait) = std::sync::mpsc::channel();
        if self.control.send(Control::Stop(done)).is_ok() {
            let _ = tokio::task::spawn_blocking(move || wait.recv()).await;
        }
        if let Some(thread) = self.thread.take() {
            let _ = tokio::task::spawn_blocking(move || thread.join()).await;
        }
    }
}
