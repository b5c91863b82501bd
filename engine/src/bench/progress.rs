//! Progress of a bench phase on stderr: indicatif bars and spinners on a terminal, plain
//! lines otherwise.

use std::io::IsTerminal;
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

/// How often a plain progress line is printed when stderr is not a terminal.
const PLAIN_EVERY: Duration = Duration::from_secs(3);

/// Progress of one bench phase on stderr. On a terminal, an indicatif bar where the total
/// is known (records produced or processed of N, transfers finished of sent), else a
/// spinner with a message. When stderr is not a terminal (CI, `make bench | tee`), a plain
/// line every few seconds and one at the end instead.
pub struct Progress {
    bar: ProgressBar,
    /// Plain lines instead of drawing: when the last one was printed (`None`: never).
    plain: Option<Option<Instant>>,
}

impl Progress {
    /// A bar of `total` steps named `what`.
    #[must_use]
    pub fn bar(what: &str, total: u64) -> Self {
        Self::new(what, Some(total), "  {prefix} [{bar:30}] {human_pos}/{human_len} {msg} ({elapsed})")
    }

    /// A spinner named `what`, for a phase whose total is not known.
    #[must_use]
    pub fn spinner(what: &str) -> Self {
        Self::new(what, None, "  {spinner} {prefix}: {msg} ({elapsed})")
    }

    fn new(what: &str, total: Option<u64>, template: &str) -> Self {
        let terminal = std::io::stderr().is_terminal();
        let target = if terminal { ProgressDrawTarget::stderr() } else { ProgressDrawTarget::hidden() };
        let bar = ProgressBar::with_draw_target(total, target);
        let style = ProgressStyle::with_template(template).unwrap_or_else(|_| ProgressStyle::default_bar());
        bar.set_style(style.progress_chars("=> "));
        bar.set_prefix(what.to_owned());
        if terminal && total.is_none() {
            bar.enable_steady_tick(Duration::from_millis(120));
        }
        Self { bar, plain: (!terminal).then_some(None) }
    }

    /// Raises the total to `at_least` (a backlog that grew); returns the total.
    pub fn raise_total(&self, at_least: u64) -> u64 {
        let total = self.bar.length().unwrap_or(0).max(at_least);
        self.bar.set_length(total);
        total
    }

    /// Moves to `done` and shows `message`.
    pub fn update(&mut self, done: u64, message: impl FnOnce() -> String) {
        match &mut self.plain {
            None => {
                self.bar.set_message(message());
                self.bar.set_position(done);
            }
            Some(last) if last.is_none_or(|t| t.elapsed() >= PLAIN_EVERY) => {
                *last = Some(Instant::now());
                self.bar.set_position(done);
                eprintln!("  {}", self.line(&message()));
            }
            Some(_) => self.bar.set_position(done),
        }
    }

    /// Ends the phase: the bar stays drawn at its last state, or a last plain line.
    pub fn finish(self) {
        if self.plain.is_some() {
            eprintln!("  {} (done in {:.1} s)", self.line(""), self.bar.elapsed().as_secs_f64());
        } else {
            self.bar.finish();
        }
    }

    fn line(&self, message: &str) -> String {
        let what = self.bar.prefix();
        let line = match self.bar.length() {
            Some(total) => format!("{what}: {}/{total} {message}", self.bar.position()),
            None => format!("{what}: {message}"),
        };
        line.trim_end().to_owned()
    }
}
