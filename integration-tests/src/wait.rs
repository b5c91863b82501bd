//! Deadline-bounded waiting: every wait in a test polls a condition and fails with its
//! last observation, never a fixed sleep used as an assertion.

use super::*;

/// How long a wait may take before the test fails. Generous on purpose: these are
/// failure bounds for a loaded 2-core machine, not performance assertions.
#[derive(Debug, Clone, Copy)]
pub struct Deadline(pub Duration);

impl Deadline {
    /// The default bound of [`wait_until`] and [`read_topic`]: 60 s.
    pub const DEFAULT: Deadline = Deadline(Duration::from_secs(60));

    #[must_use]
    pub const fn secs(secs: u64) -> Self {
        Self(Duration::from_secs(secs))
    }
}

/// Polls `check` every 50 ms until it returns `Ok`, and returns that value. `check`
/// returns `Err(observation)` while the condition does not hold; when `deadline` passes,
/// the test fails with `what` and the last observation.
///
/// # Panics
/// When the deadline passes.
pub async fn wait_until<T, F, Fut>(what: &str, deadline: Deadline, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, String>>,
{
    let started = Instant::now();
    loop {
        match check().await {
            Ok(value) => return value,
            Err(observation) => {
                if started.elapsed() >= deadline.0 {
                    panic!("timed out after {:?} waiting until {what}; last observation: {observation}", deadline.0);
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Whether a test whose tool cannot be installed here may skip, as `var=1` asks: never
/// under CI (`CI=true`), where a skipped test would report ok for something never run.
///
/// # Panics
/// When `var=1` is set under CI.
#[must_use]
pub fn skip_asked(var: &str) -> bool {
    match skip_decision(std::env::var(var).ok().as_deref(), std::env::var("CI").ok().as_deref()) {
        Ok(skip) => skip,
        Err(refusal) => panic!("{var}: {refusal}"),
    }
}

fn skip_decision(value: Option<&str>, ci: Option<&str>) -> Result<bool, &'static str> {
    match (value == Some("1"), ci == Some("true")) {
        (true, true) => Err("skipping is refused under CI (CI=true): the test must run there"),
        (skip, _) => Ok(skip),
    }
}

#[cfg(test)]
mod tests {
    use super::skip_decision;

    #[test]
    fn skips_are_refused_under_ci() {
        assert_eq!(skip_decision(Some("1"), None), Ok(true));
        assert_eq!(skip_decision(Some("1"), Some("false")), Ok(true));
        assert_eq!(skip_decision(None, Some("true")), Ok(false));
        assert_eq!(skip_decision(Some("0"), None), Ok(false));
        assert!(skip_decision(Some("1"), Some("true")).is_err());
    }
}
