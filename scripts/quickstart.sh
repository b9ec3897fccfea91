#!/usr/bin/env bash
# Set-up, build, then the quickstart job: LeNet on Fashion-MNIST in this process.
# Results land in out/quickstart (result.json, model.safetensors, checkpoint).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh
"${BUILD_DIR:-build}/cli/tepdist" train configs/train.toml --out out/quickstart
