#!/usr/bin/env bash
# Installs the system packages dsinfer needs to build and test on Debian 12 / Ubuntu.
# Idempotent: packages already present are skipped by apt.
set -euo pipefail
SUDO=""
if [ "$(id -u)" != 0 ]; then SUDO="sudo"; fi
PKGS=(
  build-essential cmake ninja-build ccache pkg-config git
  libboost1.81-dev libopenblas-dev nlohmann-json3-dev libcli11-dev
  libpcre2-dev libxxhash-dev liburing-dev libspdlog-dev libfmt-dev
  libgtest-dev libgmock-dev libbenchmark-dev zlib1g-dev
  python3 python3-jinja2
)
missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
# Node.js >= 20 with npm drives the end-to-end tests with the official API clients.
if ! command -v npm >/dev/null 2>&1; then
  $SUDO apt-get install -y -qq --no-install-recommends nodejs npm
fi
