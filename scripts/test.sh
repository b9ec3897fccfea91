#!/usr/bin/env bash
# Set-up, build, then the fast test suite (everything not labelled slow).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh
ctest --test-dir "${BUILD_DIR:-build}" -LE slow --output-on-failure --parallel "$(nproc)"
