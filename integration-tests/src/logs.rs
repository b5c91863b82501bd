//! Logs that say why a test failed. Everything a test runs logs into a folder of its own,
//! `target/test-logs/<test name>/`: the daemons it runs in this process
//! (`daemons.log`, the `tally` log lines at `info`, or `RUST_LOG`), the `tally run`
//! children (`tally-<instance>.log`) and the brokers it starts (`noida-<port>.log`). When
//! the test fails, the last lines of each are printed with the failure
//! ([`print_tails_on_failure`], called by the drop of whichever of the test's daemons,
//! children or database goes first while it unwinds: every test that runs a daemon or a
//! broker holds one); the files stay for a closer look, and CI keeps them with the rest
//! of `target/`.

use std::collections::VecDeque;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, OnceLock};

/// Lines of each log printed when a test fails.
const TAIL_LINES: usize = 40;

/// The name of the running test: nextest's `NEXTEST_TEST_NAME`, else the name of the
/// test harness's thread (libtest names it after the test), else `unnamed`.
#[must_use]
pub fn test_name() -> String {
    std::env::var("NEXTEST_TEST_NAME")
        .ok()
        .or_else(|| {
            std::thread::current().name().filter(|n| *n != "main" && !n.starts_with("tokio")).map(str::to_owned)
        })
        .unwrap_or_else(|| "unnamed".to_owned())
}

/// `target/test-logs/<test name>/`, created on first use in this process (and emptied of
/// an earlier run's files then).
///
/// # Panics
/// When the folder cannot be created.
#[must_use]
pub fn test_log_dir() -> PathBuf {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let name: String =
            test_name().chars().map(|c| if c.is_ascii_alphanumeric() || "_-.".contains(c) { c } else { '-' }).collect();
        let dir = target_dir().join("test-logs").join(name);
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("create {}: {e}", dir.display()));
        dir
    })
    .clone()
}

/// The workspace's `target/` (`CARGO_TARGET_DIR` when set).
#[must_use]
pub fn target_dir() -> PathBuf {
    let dir = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../target"));
    std::fs::create_dir_all(&dir).ok().and_then(|()| dir.canonicalize().ok()).unwrap_or(dir)
}

/// A file in [`test_log_dir`] a child process writes its log to (appended, so a daemon
/// restarted under the same name keeps one file).
///
/// # Panics
/// When the file cannot be opened.
#[must_use]
pub fn child_log(name: &str) -> (PathBuf, std::process::Stdio) {
    let path = test_log_dir().join(name);
    let file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path)
        .unwrap_or_else(|e| panic!("open {}: {e}", path.display()));
    (path, std::process::Stdio::from(file))
}

/// Installs, once per process, the log subscriber of the daemons run in this process: their
/// lines go to `daemons.log` in [`test_log_dir`] (and to stderr as well when `RUST_LOG` is
/// set, which also sets the level).
pub fn init_logging() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        use tracing_subscriber::layer::SubscriberExt;
        use tracing_subscriber::util::SubscriberInitExt;
        use tracing_subscriber::Layer as _;
        let asked = std::env::var("RUST_LOG").ok();
        let filter = tracing_subscriber::EnvFilter::new(asked.as_deref().unwrap_or("info"));
        let path = test_log_dir().join("daemons.log");
        let Ok(file) = std::fs::File::create(&path) else { return };
        let to_file = tracing_subscriber::fmt::layer()
            .compact()
            .with_ansi(false)
            .with_writer(Mutex::new(file))
            .with_filter(filter);
        let to_stderr = asked.as_deref().map(|level| {
            tracing_subscriber::fmt::layer()
                .compact()
                .with_writer(std::io::stderr)
                .with_filter(tracing_subscriber::EnvFilter::new(level))
        });
        let _ = tracing_subscriber::registry().with(to_file).with(to_stderr).try_init();
    });
}

/// Records that this test ran under a seed: `replay` (the command that replays it) is
/// appended to `seed` in [`test_log_dir`], which `make test` prints at the end of the run.
pub fn record_seed(replay: &str) {
    let path = test_log_dir().join("seed");
    if let Ok(mut file) = std::fs::OpenOptions::new().create(true).append(true).open(&path) {
        let _ = writeln!(file, "{replay}");
    }
}

/// Prints the last lines of every log in [`test_log_dir`] to stderr, once per process,
/// when the current thread is unwinding from a panic (a failing test); does nothing
/// otherwise.
pub fn print_tails_on_failure() {
    static PRINTED: AtomicBool = AtomicBool::new(false);
    if !std::thread::panicking() || PRINTED.swap(true, Ordering::AcqRel) {
        return;
    }
    let dir = test_log_dir();
    let mut files: Vec<PathBuf> =
        std::fs::read_dir(&dir).map(|d| d.flatten().map(|e| e.path()).collect()).unwrap_or_default();
    files.sort();
    let mut out = std::io::stderr().lock();
    for path in files {
        let tail = tail(&path, TAIL_LINES);
        if tail.is_empty() {
            continue;
        }
        let _ = writeln!(out, "\n---- last {} lines of {} ----", tail.len(), path.display());
        for line in tail {
            let _ = writeln!(out, "{line}");
        }
    }
    let _ = writeln!(out, "---- the whole logs: {} ----", dir.display());
}

/// The last `n` lines of the file at `path` (none when it cannot be read).
#[must_use]
pub fn tail(path: &Path, n: usize) -> Vec<String> {
    let Ok(bytes) = std::fs::read(path) else { return Vec::new() };
    let text = String::from_utf8_lossy(&bytes);
    let mut last: VecDeque<&str> = VecDeque::with_capacity(n);
    for line in text.lines() {
        if last.len() == n {
            last.pop_front();
        }
        last.push_back(line);
    }
    last.into_iter().map(str::to_owned).collect()
}

#[cfg(test)]
mod tests {
    use super::tail;

    #[test]
    fn the_tail_is_the_last_lines_in_order() {
        let path = std::env::temp_dir().join(format!("tally-tail-{}", uuid::Uuid::new_v4().simple()));
        std::fs::write(&path, "a\nb\nc\nd\n").expect("write");
        assert_eq!(tail(&path, 2), ["c", "d"]);
        assert_eq!(tail(&path, 10), ["a", "b", "c", "d"]);
        assert!(tail(&path.with_extension("missing"), 3).is_empty());
        let _ = std::fs::remove_file(path);
    }
}
