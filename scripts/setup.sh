#!/usr/bin/env bash
# Installs every Debian package tepdist needs to build, test and run its quickstart.
# Idempotent: packages already present are left alone. Needs root (or sudo) on Debian 12.
set -euo pipefail

packages=(
  build-essential cmake ninja-build ccache pkg-config git python3
  iproute2  # the link-down tests put a node in a network namespace of its own
  libcaf-dev libcapnp-dev capnproto libuv1-dev libtoml11-dev
  libdnnl-dev ocl-icd-opencl-dev  # Debian's oneDNN CMake package insists on finding OpenCL
  catch2 libcli11-dev nlohmann-json3-dev libspdlog-dev libfmt-dev libcpp-httplib-dev libssl-dev zlib1g-dev
  python3-prometheus-client  # the tests check /metrics with its exposition-format parser
  curl  # the README's examples of the monitor endpoint
  chromium chromium-driver  # the dashboard's test in a real browser (headless, over WebDriver)
  libbenchmark-dev clang afl++  # AFL++: the fuzz targets in tests/fuzz
  dataset-fashion-mnist
)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done

if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}"
  sudo=""
  [[ $(id -u) -eq 0 ]] || sudo="sudo"
  export DEBIAN_FRONTEND=noninteractive
  $sudo apt-get update -qq
  $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
else
  echo "setup: all ${#packages[@]} packages present"
fi

data=/usr/share/datasets/fashion-mnist
for f in train-images-idx3-ubyte train-labels-idx1-ubyte t10k-images-idx3-ubyte t10k-labels-idx1-ubyte; do
  [[ -s $data/$f.gz ]] || { echo "setup: $data/$f.gz missing after installing dataset-fashion-mnist" >&2; exit 1; }
done
