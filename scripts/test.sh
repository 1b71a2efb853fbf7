#!/usr/bin/env bash
# Runs every test: unit, golden (vs HF transformers fixtures) and end-to-end, through CTest.
set -euo pipefail
cd "$(dirname "$0")/.."
for dir in tests/e2e tests/tokenizer_oracle; do
  if [ -f "$dir/package.json" ]; then
    (cd "$dir" && npm ci --no-audit --no-fund --loglevel=error)
  fi
done
cd build
ctest --output-on-failure -j "$(nproc)" "$@"
