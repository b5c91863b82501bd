#!/usr/bin/env bash
# Installs noida-db, a Kafka implementation with real transactions (read_committed,
# transactional offsets, fencing, static membership), into a venv under target/, and prints
# the path of its broker binary. Tests start that binary per test on loopback. Idempotent:
# once installed, nothing is fetched again.
set -euo pipefail
cd "$(dirname "$0")/.."

version=0.2.3
venv=target/noida/venv
marker=target/noida/installed-$version

if [ ! -f "$marker" ]; then
  echo "Installing noida-db $version into $venv ..." >&2
  rm -rf "$venv"
  python3 -m venv "$venv"
  "$venv/bin/pip" install --quiet --disable-pip-version-check "noida-db==$version"
  touch "$marker"
fi
bin=$(ls "$venv"/lib/python3*/site-packages/noida_db/noida-db 2>/dev/null | head -n 1)
if [ -z "$bin" ]; then
  echo "noida-db $version is installed but its broker binary was not found under $venv." >&2
  exit 1
fi
chmod +x "$bin"
echo "$PWD/$bin"
