# tally: see README.md. `make help` lists the targets.
.DEFAULT_GOAL := help
SHELL := /bin/bash
CARGO ?= cargo
# Tests create a fresh database per test on this server.
export TALLY_TEST_DATABASE_URL ?= postgres://postgres@127.0.0.1:5432/postgres

.PHONY: help run test test-quick test-kafka chaos lint fmt migrate broker schema db build-deps bench soak profile noida schemathesis browser socat package

help: ## Show the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-10s %s\n", $$1, $$2}'

db: ## Make sure the local PostgreSQL is running
	@scripts/ensure-postgres.sh

build-deps: ## Install what the build needs besides Rust (Debian's libssl-dev and pkg-config), once
	@scripts/ensure-build-deps.sh

run: db build-deps ## Run the daemon on the embedded defaults (local PostgreSQL, in-process Kafka)
	$(CARGO) run -p tally-engine --bin tally -- run

test: db build-deps noida schemathesis browser socat ## Run every test (unit and integration, real PostgreSQL and Kafka protocol), then print the slowest and the seeds
	@scripts/test.sh

test-quick: db build-deps browser ## The quick loop: unit tests and the smoke tests (intake to settled, a poison record dead-lettered, the console in a browser)
	@TALLY_TEST_SET=quick scripts/test.sh

test-kafka: db build-deps ## The transaction tests against another cluster (set TALLY_TEST_KAFKA=host:port)
	@test -n "$$TALLY_TEST_KAFKA" || { echo "Set TALLY_TEST_KAFKA=host:port of a real cluster."; exit 2; }
	scripts/test.sh -E 'binary(it) & test(/read_committed/)'

CHAOS_SECS ?= 300
chaos: db build-deps ## The history checker under faults, long profile (CHAOS_SECS=300; CHAOS_SEED=n replays a schedule)
	TALLY_CHAOS_SECS=$(CHAOS_SECS) $(if $(CHAOS_SEED),TALLY_CHAOS_SEED=$(CHAOS_SEED)) \
		NEXTEST_PROFILE=chaos scripts/test.sh -E 'binary(it) & test(/^chaos::/)' --no-capture

browser: ## Install Debian's Chromium and ChromeDriver (the console's browser tests), once; TALLY_SKIP_BROWSER=1 skips them (refused under CI)
	@scripts/ensure-chromium.sh >/dev/null || [ "$$TALLY_SKIP_BROWSER" = 1 ]

socat: ## Install Debian's socat (the TLS-terminating proxy of the Kafka TLS tests), once
	@scripts/ensure-socat.sh >/dev/null

noida: ## Install noida-db (a Kafka with real transactions, for tests) under target/, once
	@scripts/ensure-noida.sh >/dev/null

schemathesis: ## Install schemathesis (fuzzes the HTTP API from its OpenAPI documents, for tests) under target/, once
	@scripts/ensure-schemathesis.sh >/dev/null

package: build-deps ## Build the Debian package (release binary, man page, unit, /etc/tally/tally.toml) into target/debian/; installs cargo-deb under target/ once
	@test "$$(uname -s)" = Linux || { echo "The package is a Debian one: build it on Linux."; exit 2; }
	$(CARGO) build --release --locked -p tally-engine --bin tally
	target/release/tally man > target/release/tally.1
	$$(scripts/ensure-cargo-deb.sh) -p tally-engine --no-build

lint: build-deps ## fmt check, clippy -D warnings on all targets, docs, commit subjects
	scripts/check-commits.sh
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings
	RUSTDOCFLAGS="-D warnings" $(CARGO) doc --workspace --no-deps

fmt: ## Format the code
	$(CARGO) fmt --all

migrate: db build-deps ## Create the database if missing and apply pending migrations
	$(CARGO) run -p tally-engine --bin tally -- migrate

bench: db build-deps ## Load scenarios ledger (vs seed-style baseline), e2e, outbox (vs seed relay), stages (each alone vs e2e vs seed, against the PostgreSQL-alone floors), scale (1..3 daemons, kill one); release build; JSON, plots and logs in target/bench/ (docs/BENCHMARKS.md)
	$(CARGO) build --release -p tally-engine --bin tally
	TALLY__LOG__LEVEL=warn ./target/release/tally bench ledger $(BENCH_LEDGER_ARGS)
	TALLY__LOG__LEVEL=warn ./target/release/tally bench e2e $(BENCH_E2E_ARGS)
	TALLY__LOG__LEVEL=warn ./target/release/tally bench outbox $(BENCH_OUTBOX_ARGS)
	TALLY__LOG__LEVEL=warn ./target/release/tally bench stages $(BENCH_STAGES_ARGS)
	TALLY__LOG__LEVEL=warn ./target/release/tally bench scale $(BENCH_SCALE_ARGS)

soak: db build-deps ## Cost as work grows: 2M transfers over 1M accounts on one daemon, records/s and RSS per window (long; not in bench); SVGs in target/bench/
	$(CARGO) build --release -p tally-engine --bin tally
	TALLY__LOG__LEVEL=warn ./target/release/tally bench soak $(BENCH_SOAK_ARGS)

profile: db build-deps ## Where the CPU goes end to end: perf over `tally bench e2e` (PROFILE_ARGS), CPU per process and thread, the daemon's per stage and function (call graphs), in target/bench/profile/
	$(CARGO) build --release -p tally-engine --bin tally
	scripts/profile.sh $(PROFILE_ARGS)

broker: build-deps ## Run a standalone in-memory Kafka broker on 127.0.0.1:19092
	$(CARGO) run -p tally-engine --bin tally -- broker --listen 127.0.0.1:19092

schema: db ## Regenerate schema/src/schema.rs from the migrations (needs diesel_cli)
	@command -v diesel >/dev/null || $(CARGO) install diesel_cli --version '~2.2' --no-default-features --features postgres --locked
	psql -h 127.0.0.1 -U postgres -qc 'DROP DATABASE IF EXISTS tally_schema' -c 'CREATE DATABASE tally_schema'
	DATABASE_URL=postgres://postgres@127.0.0.1:5432/tally_schema diesel migration run
	DATABASE_URL=postgres://postgres@127.0.0.1:5432/tally_schema diesel print-schema > schema/src/schema.rs
