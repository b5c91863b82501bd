//! The table `tally bench stages` prints.

use super::Report;
use crate::bench::hops;

pub(super) fn print_table(r: &Report) {
    let opt = |v: Option<f64>| v.map_or("-".into(), |v| format!("{v:.1}"));
    let opt2 = |v: Option<f64>| v.map_or("-".into(), |v| format!("{v:.2}"));
    println!();
    println!("stages bench: {} records per stage alone, {} broker", r.records, r.broker.name());
    println!("{:<24} {:>9} {:>11} {:>9} {:>9}  p50/p99 of", "stage", "records", "records/s", "p50 ms", "p99 ms");
    for s in &r.stages {
        println!(
            "{:<24} {:>9} {:>11.0} {:>9} {:>9}  {}",
            s.stage,
            s.records,
            s.records_per_second,
            opt(s.p50_ms),
            opt(s.p99_ms),
            s.latency
        );
    }
    for (title, phase) in [("e2e", &r.e2e), ("e2e, seed configuration", &r.seed_e2e)] {
        println!("hops, {title}:");
        for line in hops::lines(&phase.hops) {
            println!("{line}");
        }
    }
    let x = r.ratios.clone();
    println!(
        "e2e / slowest stage alone ({}, {:.0}/s): {} (target >= {})",
        x.slowest_stage,
        x.slowest_stage_per_second,
        opt(x.e2e_over_slowest_stage),
        x.e2e_over_slowest_stage_target
    );
    println!(
        "e2e / slowest stage alone, the intake counted ({}): {}",
        x.slowest_stage_with_intake,
        opt(x.e2e_over_slowest_stage_with_intake)
    );
    println!("e2e / shared-machine bound ({:.0}/s): {}", x.shared_bound_per_second, opt(x.e2e_over_shared_bound));
    println!("e2e / seed e2e: {}x (target >= {}x)", opt(x.e2e_over_seed), x.e2e_over_seed_target);
    let f = &r.floors;
    println!(
        "floors ({} connections): ledger {:.0}/s, lifecycle {:.0}/s (invariants {})",
        f.clients,
        f.ledger.transfers_per_second,
        f.lifecycle.transfers_per_second,
        if f.ledger.invariants_ok && f.lifecycle.invariants_ok { "ok" } else { "VIOLATED" }
    );
    println!("ledger stage / ledger floor: {} (target >= {})", opt2(x.ledger_over_floor), x.ledger_over_floor_target);
    println!(
        "e2e / lifecycle floor: {} (target >= {})",
        opt2(x.e2e_over_lifecycle_floor),
        x.e2e_over_lifecycle_floor_target
    );
    println!("slowest hop at p50 (e2e): {} {} ms", x.slowest_hop.as_deref().unwrap_or("-"), opt(x.slowest_hop_p50_ms));
}
