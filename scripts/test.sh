#!/usr/bin/env bash
# Runs the tests with cargo-nextest (a process per test, a bound per test that names the
# stuck one; .config/nextest.toml), then the doc tests, then prints the run's slowest tests,
# the seed of every seeded test and where the logs of failed tests are
# (scripts/test-report.py). Arguments go to nextest: `scripts/test.sh -E 'test(/^flow::/)'`.
# TALLY_TEST_SET=quick runs the quick loop instead: the unit tests and the smoke subset
# of the integration tests.
set -uo pipefail
cd "$(dirname "$0")/.."
command -v cargo-nextest >/dev/null 2>&1 || scripts/ensure-nextest.sh || exit 1

rm -rf target/test-logs
# The property tests draw from this seed; the report prints it, and setting it replays them.
export PROPTEST_RNG_SEED=${PROPTEST_RNG_SEED:-$(od -An -N4 -tu4 /dev/urandom | tr -d ' ')}
mkdir -p target/test-logs/property-tests
echo "PROPTEST_RNG_SEED=$PROPTEST_RNG_SEED make test" > target/test-logs/property-tests/seed

# Every target, the tests' and the tally binary that tests run as a child process, built
# once with the same features (`cargo build` also puts the binary at target/debug/tally;
# nextest's own build is then a no-op).
started=$SECONDS
cargo build --workspace --all-targets || exit 1
echo "test.sh: the build took $((SECONDS - started)) s"
export TALLY_TEST_BINARY=$PWD/target/debug/tally
profile=${NEXTEST_PROFILE:-default}
if [ "${TALLY_TEST_SET:-all}" = quick ]; then
  profile=quick
fi
cargo nextest run --workspace --all-targets --profile "$profile" "$@"
status=$?
if [ "${TALLY_TEST_SET:-all}" != quick ] && [ $# -eq 0 ]; then
  cargo test --workspace --doc --quiet || status=1
fi
python3 scripts/test-report.py "target/nextest/$profile/junit.xml"
exit $status
