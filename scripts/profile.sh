#!/usr/bin/env bash
# Where the CPU goes end to end, while `tally bench e2e` runs (the daemon and the broker
# are child processes of the bench, the bench is the HTTP load generator). Two recordings:
#
# - every CPU, 499 Hz, no call graphs: the share of each process and thread;
# - the daemon child alone, with call graphs (PROFILE_HZ, default 99 Hz): where its CPU
#   goes per stage and per function.
#
# Call graphs: the release build keeps no frame pointers, so perf unwinds each sample's
# copy of the stack with the DWARF unwind tables (`--call-graph dwarf`; the release
# profile's `line-tables-only` debug info names the functions). No rebuild with frame
# pointers is needed, and LBR is not there on a virtual machine. 16 KiB of stack per
# sample reaches the async task's own frame under actix and tokio; at 99 Hz a minute of
# one busy core is about 100 MB of perf data.
#
# Writes under target/bench/profile/:
#   bench.txt             the bench's own report (CPU ms per transfer per process)
#   by-process.txt        CPU share per process (tally run, tally broker, postgres, ...)
#   by-thread.txt         CPU share per thread name, every process
#   symbols.txt           the hottest functions over everything sampled (self time)
#   daemon-threads.txt    the daemon's CPU per thread name
#   by-stage.txt          the daemon's CPU per stage, and per library within each stage
#                         (scripts/profile-stages.awk says how a sample gets its stage)
#   daemon-functions.txt  the daemon's functions by inclusive time (with their callees)
#   daemon-callers.txt    the daemon's hottest functions (self time), each with its callers
# Arguments go to `tally bench e2e`. Installs Debian's linux-perf when perf is missing.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v perf >/dev/null 2>&1; then
  apt-get install -y linux-perf >/dev/null 2>&1 || { apt-get update >/dev/null 2>&1; apt-get install -y linux-perf >/dev/null; }
fi
if [ "$(cat /proc/sys/kernel/perf_event_paranoid)" -gt 0 ] && [ "$(id -u)" -ne 0 ]; then
  echo "perf needs root or kernel.perf_event_paranoid <= 0 to sample every CPU:" >&2
  echo "  sudo sysctl kernel.perf_event_paranoid=0" >&2
  exit 1
fi
out=target/bench/profile
mkdir -p "$out"
rm -f "$out/perf.data" "$out/daemon.data"

TALLY__LOG__LEVEL=warn perf record -q -F 499 -a -o "$out/perf.data" -- \
  ./target/release/tally bench e2e "$@" > "$out/bench.txt" &
everything=$!

# The daemon is the bench's `tally run` child: follow it once it is there.
daemon=""
while [ -z "$daemon" ] && kill -0 "$everything" 2>/dev/null; do
  sleep 0.2
  bench=$(pgrep -P "$everything" || true)
  if [ -n "$bench" ]; then
    daemon=$( (ps -o pid=,args= --ppid "$bench" || true) | awk '$3 == "run" { print $1 }')
  fi
done
if [ -n "$daemon" ]; then
  perf record -q -F "${PROFILE_HZ:-99}" --call-graph dwarf,16384 -p "$daemon" -o "$out/daemon.data" &
  follower=$!
fi
wait "$everything"
if [ -n "$daemon" ]; then
  kill -INT "$follower" 2>/dev/null || true
  wait "$follower" || true
fi

report() { perf report -i "$1" --stdio --no-children -g none --percent-limit "$2" --sort "$3" 2>/dev/null | grep -v '^$'; }
report "$out/perf.data" 0.5 pid > "$out/by-process.txt"
report "$out/perf.data" 0.5 comm > "$out/by-thread.txt"
report "$out/perf.data" 0.4 comm,dso,sym > "$out/symbols.txt"
echo "CPU by process:"; grep -v '^#' "$out/by-process.txt" | head -n 12
echo "CPU by thread:"; grep -v '^#' "$out/by-thread.txt" | head -n 16
if [ -s "$out/daemon.data" ]; then
  report "$out/daemon.data" 0.5 comm > "$out/daemon-threads.txt"
  perf report -i "$out/daemon.data" --stdio --children --no-inline --sort sym -g none --percent-limit 2 \
    2>/dev/null | grep -v '^$' > "$out/daemon-functions.txt"
  perf report -i "$out/daemon.data" --stdio --no-children --no-inline --sort sym -g caller,0.5,callee,function \
    --percent-limit 1 2>/dev/null | grep -v '^$' > "$out/daemon-callers.txt"
  perf script -i "$out/daemon.data" -F comm,ip,sym,dso --no-inline 2>/dev/null |
    awk -f scripts/profile-stages.awk > "$out/by-stage.txt"
  echo "The daemon's CPU by stage:"; cat "$out/by-stage.txt"
fi
grep -E '^(phase|[0-9]|open)|CPU per final|daemon threads' "$out/bench.txt" || true
echo "(all reports in $out/)"
