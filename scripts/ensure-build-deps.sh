#!/usr/bin/env bash
# Makes sure what the build needs besides Rust is installed: Debian's libssl-dev and
# pkg-config, the OpenSSL that librdkafka (Kafka's TLS and SASL) links against.
# Idempotent: once pkg-config finds OpenSSL, nothing is fetched. Exits 3 when they cannot
# be installed (no apt-get, not root, no network).
set -euo pipefail

if command -v pkg-config >/dev/null 2>&1 && pkg-config --exists openssl; then
  exit 0
fi
command -v apt-get >/dev/null 2>&1 || { echo "no OpenSSL headers (libssl-dev) and no apt-get to install them" >&2; exit 3; }
sudo=""
if [ "$(id -u)" -ne 0 ]; then
  command -v sudo >/dev/null 2>&1 || { echo "installing libssl-dev and pkg-config needs root" >&2; exit 3; }
  sudo="sudo -n"
fi
export DEBIAN_FRONTEND=noninteractive
install() { $sudo apt-get install -y -q --no-install-recommends libssl-dev pkg-config >&2; }
# The package lists may be missing or stale on a fresh machine.
install || { $sudo apt-get update -q >&2 && install; } || {
  echo "cannot install Debian's libssl-dev and pkg-config" >&2
  exit 3
}
