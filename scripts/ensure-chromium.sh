#!/usr/bin/env bash
# Makes sure Debian's Chromium and ChromeDriver are installed, for the web console's
# browser tests, and prints the path of chromedriver. Idempotent: once both are there,
# nothing is fetched. Exits 3 when they cannot be installed (no apt-get, not root, no
# network), so the caller can say why it skipped.
set -euo pipefail

if command -v chromium >/dev/null 2>&1 && command -v chromedriver >/dev/null 2>&1; then
  command -v chromedriver
  exit 0
fi
command -v apt-get >/dev/null 2>&1 || { echo "no chromium and no apt-get" >&2; exit 3; }
sudo=""
if [ "$(id -u)" -ne 0 ]; then
  command -v sudo >/dev/null 2>&1 || { echo "installing chromium needs root" >&2; exit 3; }
  sudo="sudo -n"
fi
export DEBIAN_FRONTEND=noninteractive
install() { $sudo apt-get install -y -q --no-install-recommends chromium chromium-driver >&2; }
# The package lists may be missing or stale on a fresh machine.
install || { $sudo apt-get update -q >&2 && install; } || {
  echo "cannot install Debian's chromium and chromium-driver" >&2
  exit 3
}
command -v chromedriver
