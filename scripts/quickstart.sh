#!/usr/bin/env bash
# Set-up, build, then the quickstart job: four local nodes train LeNet on Fashion-MNIST in sync
# mode (configs/quickstart.toml, built into `tepdist run`). Results land in out/quickstart
# (result.json, model.safetensors, cluster.toml, logs/).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh
"${BUILD_DIR:-build}/cli/tepdist" run --out out/quickstart
