#!/usr/bin/env bash
# Makes sure Debian's socat is installed, for the Kafka TLS tests (a TLS-terminating proxy
# in front of the embedded broker), and prints its path. Idempotent: once socat is there,
# nothing is fetched. Exits 3 when it cannot be installed (no apt-get, not root, no
# network).
set -euo pipefail

if command -v socat >/dev/null 2>&1; then
  command -v socat
  exit 0
fi
command -v apt-get >/dev/null 2>&1 || { echo "no socat and no apt-get" >&2; exit 3; }
sudo=""
if [ "$(id -u)" -ne 0 ]; then
  command -v sudo >/dev/null 2>&1 || { echo "installing socat needs root" >&2; exit 3; }
  sudo="sudo -n"
fi
export DEBIAN_FRONTEND=noninteractive
install() { $sudo apt-get install -y -q --no-install-recommends socat >&2; }
# The package lists may be missing or stale on a fresh machine.
install || { $sudo apt-get update -q >&2 && install; } || {
  echo "cannot install Debian's socat" >&2
  exit 3
}
command -v socat
