#!/usr/bin/env bash
# Prints the path of a promtool (Prometheus' rule checker) for the alert-rule test.
# Uses one on PATH when there is one; otherwise takes it out of Debian's `prometheus`
# package into target/promtool/ without installing the package (no service is set up or
# started). Idempotent: once extracted, nothing is fetched again. Exits 3 when neither
# works (no Debian apt, no network), so the caller can say why it skipped.
set -euo pipefail
cd "$(dirname "$0")/.."

if command -v promtool >/dev/null 2>&1; then
  command -v promtool
  exit 0
fi
dir=target/promtool
bin=$dir/usr/bin/promtool
if [ ! -x "$bin" ]; then
  command -v apt-get >/dev/null 2>&1 || { echo "no promtool and no apt-get" >&2; exit 3; }
  mkdir -p "$dir/deb"
  (
    cd "$dir/deb"
    apt-get download prometheus >/dev/null 2>&1 || {
      # The package lists may be missing on a fresh machine.
      apt-get update >/dev/null 2>&1 || true
      apt-get download prometheus >/dev/null 2>&1
    }
  ) || { echo "cannot download Debian's prometheus package" >&2; exit 3; }
  # Extracted beside, then moved into place: an interrupted run never leaves a truncated
  # promtool behind that the check above would take for a good one.
  rm -rf "$dir/extract"
  dpkg-deb -x "$(ls "$dir"/deb/prometheus_*.deb | head -n 1)" "$dir/extract"
  mkdir -p "$dir/usr/bin"
  mv "$dir/extract/usr/bin/promtool" "$bin"
  rm -rf "$dir/deb" "$dir/extract"
fi
echo "$PWD/$bin"
