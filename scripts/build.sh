#!/usr/bin/env bash
# Installs what tepdist needs (scripts/setup.sh), then configures and builds it in Release under
# BUILD_DIR (default: build). Idempotent: a second run rebuilds only what changed.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${BUILD_DIR:-build}

bash scripts/setup.sh
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release
cmake --build "$build" --parallel "$(nproc)"
