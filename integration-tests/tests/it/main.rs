//! Every integration test, in one binary: the harness and the daemon are linked once, not
//! once per file. Each module is one area; `cargo test -p tally-integration-tests --test
//! it <module>::` runs one area (e.g. `chaos::`, as `make chaos` does).

mod bench;
mod broker;
mod chaos;
mod console;
mod deploy;
mod dlt_admin;
mod docs;
mod first_run;
mod flow;
mod foundation;
mod group_commit;
mod https;
mod ledger;
mod money_path;
mod noida;
mod notifications;
mod operator;
mod orders;
mod outage;
mod outbox;
mod pools;
mod rebalance;
mod security;
mod server;
mod stuck;
mod supervision;
mod traces;
