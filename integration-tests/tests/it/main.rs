//! Every integration test, in one binary: the harness and the daemon are linked once, not
//! once per file. Each module is one area; `cargo test -p tally-integration-tests --test
//! it <module>::` runs one area (e.g. `chaos::`, as `make chaos` does).

mod api_docs;
mod backpressure;
mod bench;
mod broker;
mod chaos;
mod cli;
mod console;
mod console_bad_day;
mod deploy;
mod dlt_admin;
mod docs;
mod edge;
mod flow;
mod forged;
mod group_commit;
mod https;
mod intake;
mod kafka_tls;
mod ledger;
mod lookalikes;
mod money_path;
mod noida;
mod notifications;
mod orders;
mod outage;
mod outbox;
mod ownership;
mod pools;
mod rebalance;
mod security;
mod server;
mod startup;
mod stuck;
mod supervision;
mod traces;
mod upgrade;
