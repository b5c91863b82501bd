#!/usr/bin/env bash
# Makes sure the local PostgreSQL answers on 127.0.0.1:5432 (user postgres, trust auth), as
# on the machines this project runs on. Idempotent: does nothing when it already answers.
set -euo pipefail

ready() { pg_isready -q -h 127.0.0.1 -p 5432 -U postgres 2>/dev/null; }

if ready; then exit 0; fi
if ! command -v pg_ctlcluster >/dev/null 2>&1; then
  echo "PostgreSQL is not running and pg_ctlcluster is missing: install postgresql (apt-get install postgresql)." >&2
  exit 1
fi
version=$(ls /etc/postgresql | sort -V | tail -n 1)
echo "Starting PostgreSQL ${version}/main..." >&2
pg_ctlcluster --skip-systemctl-redirect "$version" main start || true
for _ in $(seq 1 30); do
  if ready; then exit 0; fi
  sleep 1
done
echo "PostgreSQL did not become ready on 127.0.0.1:5432." >&2
exit 1
