//! CPU time of the processes a bench runs, read from `/proc`: `utime + stime` of
//! `/proc/<pid>/stat` (and of each thread, `/proc/<pid>/task/<tid>/stat`), in clock ticks
//! of `sysconf(_SC_CLK_TCK)`. A [`Clock`] is read at a phase's start and end; the
//! difference is the CPU each process spent in the phase, on any core, user and kernel
//! time together.
//!
//! The PostgreSQL figure is the sum over the server's backend processes serving the bench's
//! database (those whose title, `/proc/<pid>/cmdline`, names it): a backend that exits
//! during the phase takes its CPU with it, so it is a lower bound.

use std::collections::HashMap;

use serde::Serialize;

/// `utime + stime` (clock ticks) and the name (`comm`) of a process or thread, parsed from
/// the text of its `/proc/.../stat`. The name may hold spaces and parentheses: the fields
/// are read after the last `)`.
#[must_use]
pub fn parse_stat(stat: &str) -> Option<(String, u64)> {
    let open = stat.find('(')?;
    let close = stat.rfind(')')?;
    let comm = stat.get(open + 1..close)?.to_owned();
    // After ")": state (field 3), ppid, ..., utime (field 14), stime (field 15).
    let mut fields = stat.get(close + 1..)?.split_whitespace().skip(11);
    let utime: u64 = fields.next()?.parse().ok()?;
    let stime: u64 = fields.next()?.parse().ok()?;
    Some((comm, utime + stime))
}

/// `utime + stime` of process (or `task/<tid>` path) `path` under `/proc`, with its name.
fn read_stat(path: &str) -> Option<(String, u64)> {
    parse_stat(&std::fs::read_to_string(format!("/proc/{path}/stat")).ok()?)
}

/// Clock ticks per second (`sysconf(_SC_CLK_TCK)`).
fn ticks_per_second() -> f64 {
    procfs::ticks_per_second() as f64
}

/// Which processes to read: the daemon (its threads apart), the broker when it is a
/// process of its own, this process, and the backends of `database`.
#[derive(Debug, Clone)]
pub struct Watched {
    pub daemon: Option<u32>,
    pub broker: Option<u32>,
    pub database: String,
}

/// The CPU ticks of the watched processes at one moment.
#[derive(Debug, Clone)]
pub struct Clock {
    at: std::time::Instant,
    daemon: Option<u64>,
    /// Per thread id: its name and ticks.
    daemon_threads: HashMap<String, (String, u64)>,
    broker: Option<u64>,
    bench: Option<u64>,
    /// Per backend pid: its ticks.
    postgres: HashMap<String, u64>,
}

impl Clock {
    /// Reads every watched process now.
    #[must_use]
    pub fn read(w: &Watched) -> Self {
        let ticks = |pid: Option<u32>| pid.and_then(|p| read_stat(&p.to_string())).map(|(_, t)| t);
        Self {
            at: std::time::Instant::now(),
            daemon: ticks(w.daemon),
            daemon_threads: w.daemon.map(threads).unwrap_or_default(),
            broker: ticks(w.broker),
            bench: read_stat("self").map(|(_, t)| t),
            postgres: backends(&w.database),
        }
    }

    /// What each process spent from `self` to `end`, over `finished` transfers.
    #[must_use]
    pub fn until(&self, end: &Self, finished: i64) -> PhaseCpu {
        let hz = ticks_per_second();
        let wall = end.at.duration_since(self.at).as_secs_f64();
        let used = |ticks: u64| Used::new(ticks as f64 * 1000.0 / hz, finished, wall);
        let delta = |a: Option<u64>, b: Option<u64>| Some(b?.saturating_sub(a?));
        let started = |map: &HashMap<String, u64>, k: &String| map.get(k).copied().unwrap_or(0);
        let postgres: u64 = end.postgres.iter().map(|(k, t)| t.saturating_sub(started(&self.postgres, k))).sum();
        let mut by_name: HashMap<String, u64> = HashMap::new();
        for (tid, (name, t)) in &end.daemon_threads {
            let before = self.daemon_threads.get(tid).map_or(0, |(_, t)| *t);
            *by_name.entry(thread_kind(name)).or_default() += t.saturating_sub(before);
        }
        let mut daemon_threads: Vec<ThreadCpu> = by_name
            .into_iter()
            .filter(|(_, t)| *t > 0)
            .map(|(name, t)| ThreadCpu { name, ms: t as f64 * 1000.0 / hz })
            .collect();
        daemon_threads.sort_by(|a, b| b.ms.total_cmp(&a.ms));
        PhaseCpu {
            wall_seconds: wall,
            ticks_per_second: hz,
            daemon: delta(self.daemon, end.daemon).map(used),
            broker: delta(self.broker, end.broker).map(used),
            bench: delta(self.bench, end.bench).map(used),
            postgres: (!end.postgres.is_empty()).then(|| used(postgres)),
            daemon_threads,
        }
    }
}

/// CPU one process (or group) spent in a phase.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Used {
    /// CPU time, user and kernel, in ms.
    pub ms: f64,
    /// `ms` over the transfers that reached a final status in the phase.
    pub ms_per_transfer: Option<f64>,
    /// `ms` over the phase's wall time: cores kept busy on average.
    pub cores: f64,
}

impl Used {
    fn new(ms: f64, finished: i64, wall_seconds: f64) -> Self {
        Self {
            ms,
            ms_per_transfer: (finished > 0).then(|| ms / finished as f64),
            cores: if wall_seconds > 0.0 { ms / 1000.0 / wall_seconds } else { 0.0 },
        }
    }
}

/// CPU of the daemon's threads of one kind (their names with the digits taken out).
#[derive(Debug, Clone, Serialize)]
pub struct ThreadCpu {
    pub name: String,
    pub ms: f64,
}

/// The CPU of one phase, per process.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PhaseCpu {
    /// From the phase's first POST until every transfer had its final status.
    pub wall_seconds: f64,
    pub ticks_per_second: f64,
    /// The `tally run` child (`None` when the daemon ran inside the bench).
    pub daemon: Option<Used>,
    /// The `tally broker` child (`None` when the broker ran inside the bench).
    pub broker: Option<Used>,
    /// The bench itself: the HTTP load generator and its database polls.
    pub bench: Option<Used>,
    /// PostgreSQL backends serving the bench's database (a lower bound, see the module).
    pub postgres: Option<Used>,
    /// The daemon's CPU per kind of thread, most first.
    pub daemon_threads: Vec<ThreadCpu>,
}

impl PhaseCpu {
    /// Table lines: CPU ms per final transfer of each process (cores busy alone when no
    /// transfer finished), then the daemon's threads.
    #[must_use]
    pub fn lines(&self) -> Vec<String> {
        let cell = |name: &str, u: &Option<Used>| {
            u.as_ref().map(|u| match u.ms_per_transfer {
                Some(per) => format!("{name} {per:.3} ms ({:.2} cores)", u.cores),
                None => format!("{name} {:.2} cores", u.cores),
            })
        };
        let procs: Vec<String> = [
            cell("daemon", &self.daemon),
            cell("broker", &self.broker),
            cell("bench", &self.bench),
            cell("postgres", &self.postgres),
        ]
        .into_iter()
        .flatten()
        .collect();
        let what = if self.daemon.as_ref().is_some_and(|d| d.ms_per_transfer.is_some()) {
            "CPU per final transfer"
        } else {
            "CPU"
        };
        let mut lines = vec![format!("  {what} over {:.1} s: {}", self.wall_seconds, procs.join(", "))];
        let total: f64 = self.daemon_threads.iter().map(|t| t.ms).sum();
        if total > 0.0 {
            let top: Vec<String> = self
                .daemon_threads
                .iter()
                .take(8)
                .map(|t| format!("{} {:.0}%", t.name, 100.0 * t.ms / total))
                .collect();
            lines.push(format!("  daemon threads: {}", top.join(", ")));
        }
        lines
    }
}

/// The name of a kind of thread: `comm` without its digits (`rdk:broker12` and
/// `rdk:broker3` are one kind).
fn thread_kind(comm: &str) -> String {
    comm.chars().filter(|c| !c.is_ascii_digit()).collect()
}

/// Every thread of `pid`: id -> (name, ticks).
fn threads(pid: u32) -> HashMap<String, (String, u64)> {
    let Ok(dir) = std::fs::read_dir(format!("/proc/{pid}/task")) else { return HashMap::new() };
    dir.filter_map(Result::ok)
        .filter_map(|e| e.file_name().into_string().ok())
        .filter_map(|tid| read_stat(&format!("{pid}/task/{tid}")).map(|s| (tid, s)))
        .collect()
}

/// Every PostgreSQL backend serving `database`: pid -> ticks. A backend's title is
/// `postgres: [<cluster name>:] <user> <database> <client> <state>`.
fn backends(database: &str) -> HashMap<String, u64> {
    let Ok(dir) = std::fs::read_dir("/proc") else { return HashMap::new() };
    dir.filter_map(Result::ok)
        .filter_map(|e| e.file_name().into_string().ok())
        .filter(|pid| pid.bytes().all(|b| b.is_ascii_digit()))
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|c| serves(&String::from_utf8_lossy(&c), database))
        })
        .filter_map(|pid| read_stat(&pid).filter(|(comm, _)| comm == "postgres").map(|(_, t)| (pid, t)))
        .collect()
}

/// Whether a process title is a PostgreSQL backend's serving `database`.
fn serves(title: &str, database: &str) -> bool {
    let mut words = title.split(|c: char| c == '\0' || c.is_whitespace()).filter(|w| !w.is_empty()).peekable();
    if words.next() != Some("postgres:") {
        return false;
    }
    // A server with `cluster_name` set puts it first.
    if words.peek().is_some_and(|w| w.ends_with(':')) {
        words.next();
    }
    words.nth(1) == Some(database)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_stat_fields_are_read_after_the_last_parenthesis() {
        let tail = "S 1 2 3 4 5 6 7 8 9 10 250 75 0 0 20 0 12 0 100 1000 50";
        assert_eq!(parse_stat(&format!("42 (tally) {tail}")), Some(("tally".into(), 325)));
        // A name with spaces and parentheses of its own.
        assert_eq!(parse_stat(&format!("42 (a) b (c)) {tail}")), Some(("a) b (c)".into(), 325)));
        assert_eq!(parse_stat(&format!("7 (rdk:broker1) {tail}")), Some(("rdk:broker1".into(), 325)));
        assert_eq!(parse_stat("42 (tally) S 1 2"), None);
        assert_eq!(parse_stat("garbage"), None);
    }

    #[test]
    fn this_process_has_a_stat_and_threads() {
        assert!(read_stat("self").is_some());
        assert!(!threads(std::process::id()).is_empty());
        assert!(ticks_per_second() > 0.0);
    }

    #[test]
    fn backends_are_told_by_their_database() {
        assert!(serves("postgres: postgres tally_bench_e2e 127.0.0.1(5532) idle\0\0", "tally_bench_e2e"));
        assert!(!serves("postgres: postgres tally_bench_e2e_x 127.0.0.1(5532) idle", "tally_bench_e2e"));
        assert!(serves("postgres: 15/main: postgres tally_bench_e2e 127.0.0.1(48368) SELECT", "tally_bench_e2e"));
        assert!(!serves("postgres: 15/main: checkpointer", "tally_bench_e2e"));
        assert!(!serves("postgres: checkpointer", "tally_bench_e2e"));
        assert!(!serves("/usr/lib/postgresql/15/bin/postgres -D /var/lib", "tally_bench_e2e"));
        assert_eq!(thread_kind("rdk:broker12"), "rdk:broker");
    }
}
