//! Test-only fault switches. Each breaks one guarantee on purpose, so that the history
//! checker under faults (`integration-tests/tests/it/chaos/`) can show that it notices.
//! They exist only in debug builds (`cfg(debug_assertions)`): a release build compiles
//! every switch to `false`. In a debug build, `TALLY_FAULT=<name>` turns one on for the
//! process, and the daemon says so at start.

/// One broken guarantee.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// Antifraud scores every delivery again instead of publishing the stored decision.
    Rescore,
    /// A consumed record's offset is stored as soon as it is handed to its worker, before
    /// its effect is committed to the database.
    OffsetBeforeCommit,
    /// The outbox publisher produces each batch it claimed in reverse order.
    OutboxOutOfOrder,
    /// The ledger skips its inbox and its check of the intake's row: a transfer already
    /// settled is applied again (the postings' unique key still refuses a second debit, so
    /// it ends in the DLT).
    SkipInbox,
    /// A stage's thread panics on every record carrying the header [`CRASH_HEADER`], as a
    /// bug would (the stage must restart, and dead-letter the record after two crashes).
    CrashOnMarkedRecord,
    /// The handling of a record carrying the header [`HANG_HEADER`] never ends the first
    /// time this process sees the record, as a call that never returns would (the
    /// pipeline's watchdog must restart the stage, and the record go through the second
    /// time).
    HangOnMarkedRecord,
    /// A stage's driver thread never answers its stop, as a broker or database call that
    /// never returns would (the stop must be given up within its bound, and the daemon
    /// exit non-zero naming the stage).
    HangOnStop,
}

/// The header that marks a record for [`Fault::CrashOnMarkedRecord`].
pub const CRASH_HEADER: &str = "tally-fault-crash";

/// Panics when [`Fault::CrashOnMarkedRecord`] is on and `record` carries [`CRASH_HEADER`].
///
/// # Panics
/// On purpose, as described.
pub fn crash_on_marked(record: &crate::record::Record) {
    if is_on(Fault::CrashOnMarkedRecord) && record.header(CRASH_HEADER).is_some() {
        panic!("test fault: a record marked {CRASH_HEADER} crashes its stage");
    }
}

/// Never returns when [`Fault::HangOnStop`] is on: called by a stage's driver thread when
/// it is told to stop.
pub fn hang_on_stop() {
    if is_on(Fault::HangOnStop) {
        loop {
            std::thread::park();
        }
    }
}

/// The header that marks a record for [`Fault::HangOnMarkedRecord`].
pub const HANG_HEADER: &str = "tally-fault-hang";

/// Never returns when [`Fault::HangOnMarkedRecord`] is on and `record` carries
/// [`HANG_HEADER`] and was not seen before by this process; returns at once otherwise.
pub async fn hang_on_marked(record: &crate::record::Record) {
    if !is_on(Fault::HangOnMarkedRecord) || record.header(HANG_HEADER).is_none() {
        return;
    }
    static SEEN: std::sync::Mutex<Vec<(String, i32, i64)>> = std::sync::Mutex::new(Vec::new());
    let at = (record.topic.clone(), record.partition, record.offset);
    let first = {
        let mut seen = SEEN.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let first = !seen.contains(&at);
        if first {
            seen.push(at);
        }
        first
    };
    if first {
        std::future::pending::<()>().await;
    }
}

impl Fault {
    /// Every switch.
    pub const ALL: [Fault; 7] = [
        Self::Rescore,
        Self::OffsetBeforeCommit,
        Self::OutboxOutOfOrder,
        Self::SkipInbox,
        Self::CrashOnMarkedRecord,
        Self::HangOnMarkedRecord,
        Self::HangOnStop,
    ];

    /// The value of `TALLY_FAULT` that turns it on.
    #[must_use]
    pub const fn name(self) -> &'static str {
        match self {
            Self::Rescore => "rescore",
            Self::OffsetBeforeCommit => "offset-before-commit",
            Self::OutboxOutOfOrder => "outbox-out-of-order",
            Self::SkipInbox => "skip-inbox",
            Self::CrashOnMarkedRecord => "crash-on-marked-record",
            Self::HangOnMarkedRecord => "hang-on-marked-record",
            Self::HangOnStop => "hang-on-stop",
        }
    }
}

/// The fault turned on for this process, if any (always `None` in release builds).
#[must_use]
pub fn active() -> Option<Fault> {
    #[cfg(debug_assertions)]
    {
        static ACTIVE: std::sync::OnceLock<Option<Fault>> = std::sync::OnceLock::new();
        *ACTIVE.get_or_init(|| {
            let wanted = std::env::var("TALLY_FAULT").ok()?;
            Fault::ALL.into_iter().find(|f| f.name() == wanted)
        })
    }
    #[cfg(not(debug_assertions))]
    {
        None
    }
}

/// Whether `fault` is turned on.
#[must_use]
pub fn is_on(fault: Fault) -> bool {
    active() == Some(fault)
}
