//! Where log lines go during a bench: to `target/bench/<scenario>-<run's stamp>.log`, so
//! that the daemons' lines do not break up the progress bars on stderr; the path is
//! printed when the run ends.

use std::path::PathBuf;
use std::sync::Mutex;

use anyhow::Context;
use tracing_subscriber::EnvFilter;

use crate::config::Config;

/// Sends this process's log lines (`RUST_LOG`, else `log.level`) to the bench's log file
/// of `scenario`, without colours; returns its path.
///
/// # Errors
/// When the file cannot be created.
pub fn to_file(config: &Config, scenario: &str) -> anyhow::Result<PathBuf> {
    let path = super::output_dir()?.join(format!("{scenario}-{}.log", super::stamp()));
    let file = std::fs::File::create(&path).with_context(|| format!("cannot create {}", path.display()))?;
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(&config.log.level));
    // Only the first subscriber of a process is installed; a second call changes nothing.
    let _ = tracing_subscriber::fmt()
        .compact()
        .with_ansi(false)
        .with_env_filter(filter)
        .with_writer(Mutex::new(file))
        .try_init();
    Ok(path)
}
