#!/usr/bin/env bash
# The main job: serve the bundled demo model (models/demo) on http://127.0.0.1:8000.
set -euo pipefail
cd "$(dirname "$0")/.."
exec ./build/dsinfer serve "$@"
