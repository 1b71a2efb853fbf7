#!/usr/bin/env bash
# Runs every test: unit, golden (vs HF transformers fixtures) and end-to-end, through CTest.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -f tests/e2e/package.json ]; then
  (cd tests/e2e && npm ci --no-audit --no-fund --loglevel=error)
fi
cd build
ctest --output-on-failure -j "$(nproc)" "$@"
