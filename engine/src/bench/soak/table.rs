//! The soak's table, printed at the end of a run.

use super::Report;

/// Prints the windows, the throughput and RSS verdicts, and the database line.
pub(super) fn print(r: &Report) {
    println!();
    println!(
        "soak bench: {} transfers over {} accounts, one daemon (ledger only), {} partitions, windows of {}",
        r.transfers, r.accounts, r.partitions, r.window
    );
    println!(
        "{:>6} {:>10} {:>10} {:>9} {:>8} {:>12} {:>12} {:>11} {:>10} {:>8} {:>10}",
        "window",
        "processed",
        "records/s",
        "vs first",
        "",
        "RSS end MiB",
        "RSS max MiB",
        "live actors",
        "postings",
        "WAL MiB",
        "ckpt (wal)"
    );
    let opt = |v: Option<f64>| v.map_or("-".into(), |v| format!("{v:.1}"));
    for w in &r.windows {
        let (wal, ckpt) = w.database.map_or(("-".into(), "-".into()), |d| {
            (format!("{:.0}", d.wal_mib), format!("{} ({})", d.checkpoints, d.checkpoints_requested))
        });
        println!(
            "{:>6} {:>10} {:>10.0} {:>8.2}x {:>8} {:>12} {:>12} {:>11.0} {:>10} {:>8} {:>10}",
            w.index,
            w.records,
            w.records_per_second,
            w.ratio_to_first,
            if w.slow { "SLOW" } else { "" },
            opt(w.rss_end_mib),
            opt(w.rss_max_mib),
            w.live_actors,
            w.postings,
            wal,
            ckpt
        );
    }
    let slow = r.windows.iter().filter(|w| w.slow).count();
    println!(
        "throughput: slowest window {:.2} of the first (target >= {:.2}): {}",
        r.slowest_ratio,
        r.slow_ratio,
        if slow == 0 { "ok".to_owned() } else { format!("{slow} window(s) below") }
    );
    println!(
        "daemon RSS: idle {} MiB, max {:.1} MiB (target <= {:.0} MiB): {}",
        opt(r.rss_idle_mib),
        r.max_rss_mib,
        r.target_rss_mib,
        if r.rss_within_target { "ok" } else { "OVER" }
    );
    if let (Some(with), without) = (r.ratio_with_wal_checkpoint, r.ratio_without_wal_checkpoint) {
        println!(
            "database: windows with a checkpoint for WAL volume ran at {with:.2} of the first on average, the others \
             at {}; checkpoints for WAL volume mean the server's max_wal_size is small for this load (see \
             docs/ARCHITECTURE.md, section 8)",
            without.map_or("-".into(), |w| format!("{w:.2}"))
        );
    }
    println!("{} records in {:.1} s", r.transfers, r.seconds);
}
