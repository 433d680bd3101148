#!/usr/bin/env bash
# Install Prometheus and promtool for the alert-rule tests, once, into their own folder (never temper's venv):
#   tests/tools/prometheus.sh [DEST]     (DEST defaults to .cache/prometheus under the repo root)
# It prints DEST, which holds the two binaries.
#
# Why Debian's package: Prometheus ships no wheel, and Debian 12's prometheus (2.42) holds both static binaries;
# `apt-get download` and `dpkg-deb -x` take them without installing anything system-wide.
# Needs apt-get and dpkg-deb; a failed download fails the script, exit 3.
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
dest="${1:-$root/.cache/prometheus}"
if [ -x "$dest/promtool" ] && [ -x "$dest/prometheus" ] && "$dest/promtool" --version >/dev/null 2>&1; then
  echo "$dest"; exit 0
fi
fail() { echo "prometheus set-up: $1" >&2; exit 3; }
rm -rf "$dest.partial" && mkdir -p "$dest.partial/downloads"
cd "$dest.partial/downloads"
apt-get download prometheus >/dev/null 2>&1 \
  || fail "cannot download Debian's prometheus (apt-get download); run apt-get update first"
dpkg-deb -x prometheus_*.deb unpacked || fail "cannot unpack prometheus (dpkg-deb)"
cp unpacked/usr/bin/prometheus unpacked/usr/bin/promtool ..
cd .. && rm -rf downloads
./promtool --version >/dev/null 2>&1 || fail "promtool does not start: $(./promtool --version 2>&1 | head -1)"
cd "$root" && rm -rf "$dest" && mv "$dest.partial" "$dest"
echo "$dest"
