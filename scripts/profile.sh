#!/usr/bin/env bash
# Where the CPU goes end to end: samples every CPU with perf while `tally bench e2e` runs
# (every pipeline in one daemon, HTTP load from the same process), then writes under
# target/bench/profile/:
#   by-process.txt   CPU share per process (tally, postgres backends, ...)
#   by-thread.txt    CPU share per thread name (actix workers, librdkafka threads, ...)
#   symbols.txt      the hottest functions over everything sampled
#   bench.txt        the bench's own report
# Arguments go to `tally bench e2e`. Installs Debian's linux-perf when perf is missing.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v perf >/dev/null 2>&1; then
  apt-get install -y linux-perf >/dev/null 2>&1 || { apt-get update >/dev/null 2>&1; apt-get install -y linux-perf >/dev/null; }
fi
out=target/bench/profile
mkdir -p "$out"
# 499 Hz on every CPU, no call graphs (release builds keep no frame pointers): a flat,
# self-time profile, which is what the summary reports.
TALLY__LOG__LEVEL=warn perf record -q -F 499 -a -o "$out/perf.data" -- \
  ./target/release/tally bench e2e "$@" > "$out/bench.txt"
report() { perf report -i "$out/perf.data" --stdio --no-children --percent-limit "$1" --sort "$2" 2>/dev/null | grep -v '^$'; }
report 0.5 pid > "$out/by-process.txt"
report 0.5 comm > "$out/by-thread.txt"
report 0.4 comm,dso,sym > "$out/symbols.txt"
echo "CPU by process:"; grep -v '^#' "$out/by-process.txt" | head -n 12
echo "CPU by thread:"; grep -v '^#' "$out/by-thread.txt" | head -n 16
echo "(all reports in $out/)"
