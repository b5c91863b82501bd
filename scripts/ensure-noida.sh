#!/usr/bin/env bash
# Installs noida-db, a Kafka implementation with real transactions (read_committed,
# transactional offsets, fencing, static membership), into a venv under target/, and prints
# the path of its broker binary. Tests start that binary per test on loopback. Idempotent:
# once installed, nothing is fetched again.
set -euo pipefail
cd "$(dirname "$0")/.."

version=0.2.3
venv=target/noida/venv
site=target/noida/site
marker=target/noida/installed-$version

# Tests run in processes of their own, several at once: one installs, the others wait.
mkdir -p target/noida
exec 9>target/noida/.lock
flock 9
if [ ! -f "$marker" ]; then
  echo "Installing noida-db $version under target/noida ..." >&2
  rm -rf "$venv" "$site"
  if python3 -m venv "$venv" 2>/dev/null; then
    "$venv/bin/pip" install --quiet --disable-pip-version-check "noida-db==$version"
  else
    # No venv module (Debian without python3-venv): a plain target directory will do.
    python3 -m pip install --quiet --disable-pip-version-check --target "$site" "noida-db==$version"
  fi
  touch "$marker"
fi
bin=$(ls "$venv"/lib/python3*/site-packages/noida_db/noida-db "$site"/noida_db/noida-db 2>/dev/null | head -n 1 || true)
if [ -z "$bin" ]; then
  echo "noida-db $version is installed but its broker binary was not found under target/noida." >&2
  exit 1
fi
chmod +x "$bin"
echo "$PWD/$bin"
