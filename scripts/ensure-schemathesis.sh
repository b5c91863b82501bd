#!/usr/bin/env bash
# Installs schemathesis (PyPI), the property-based API tester that the HTTP API's fuzz test
# runs against a daemon's OpenAPI documents, into a venv under target/, and prints the path
# of its command. Idempotent: once installed, nothing is fetched again.
set -euo pipefail
cd "$(dirname "$0")/.."

version=4.32.5
venv=target/schemathesis/venv
marker=target/schemathesis/installed-$version

# Tests run in processes of their own, several at once: one installs, the others wait.
mkdir -p target/schemathesis
exec 9>target/schemathesis/.lock
flock 9
if [ ! -f "$marker" ]; then
  echo "Installing schemathesis $version under target/schemathesis ..." >&2
  rm -rf "$venv"
  mkdir -p target/schemathesis
  if ! python3 -m venv "$venv" 2>/dev/null; then
    # Debian without python3-venv: install it (as root), then try again.
    apt-get install -y -qq python3-venv >&2 || { apt-get update -qq >&2 && apt-get install -y -qq python3-venv >&2; }
    python3 -m venv "$venv"
  fi
  "$venv/bin/pip" install --quiet --disable-pip-version-check "schemathesis==$version"
  touch "$marker"
fi
bin=$venv/bin/schemathesis
if [ ! -x "$bin" ]; then
  echo "schemathesis $version is installed but $bin was not found." >&2
  exit 1
fi
echo "$PWD/$bin"
