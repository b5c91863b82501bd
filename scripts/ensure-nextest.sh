#!/usr/bin/env bash
# Makes sure cargo-nextest (the test runner of `make test`) is installed. Machines of this
# kind have it; elsewhere it is built from crates.io once (a few minutes). Idempotent.
set -euo pipefail

if command -v cargo-nextest >/dev/null 2>&1; then
  exit 0
fi
echo "Installing cargo-nextest from crates.io (once) ..." >&2
cargo install cargo-nextest --locked >&2
