#!/usr/bin/env bash
# tepdist train against the PyTorch baseline (../shared/bench/torch_lenet.py --world 1) on this
# machine, in one run: same LeNet, batch 64, same number of steps, 2 threads each, evaluation left
# out of both timings. The two alternate, RUNS times each; medians and their ratio are printed.
#
# Usage: bench/vs_pytorch.sh [BUILD_DIR] [STEPS] [RUNS]   (defaults: build 900 3)
# Needs python3-torch and libopenblas0-pthread (installed here if missing: without OpenBLAS the
# baseline runs on the reference BLAS, about twice as slow as what a user would have).
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
steps=${2:-900}
runs=${3:-3}
baseline=${TORCH_LENET:-../shared/bench/torch_lenet.py}
[[ -f $baseline ]] || { echo "vs_pytorch: $baseline not found (set TORCH_LENET)" >&2; exit 1; }

missing=()
for p in python3-torch libopenblas0-pthread; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "vs_pytorch: installing ${missing[*]}"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" > /dev/null
fi

out=$(mktemp -d /tmp/tepdist-vs-pytorch.XXXXXX)
trap 'rm -rf "$out"' EXIT
threads=$(nproc)
for i in $(seq 1 "$runs"); do
  # max_steps below one epoch (937 full batches) keeps every evaluation out of the timed stretch.
  "$build/cli/tepdist" train --threads "$threads" --set "job.max_steps=$steps" --out "$out/tepdist$i" \
    > "$out/tepdist$i.log"
  /usr/bin/python3 "$baseline" --world 1 --steps "$steps" > "$out/torch$i.json"
done

/usr/bin/python3 - "$out" "$runs" "$steps" <<'PY'
import json, statistics, sys
out, runs, steps = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
ours = [json.load(open(f"{out}/tepdist{i}/result.json"))["samples_per_second"] for i in range(1, runs + 1)]
torch = [json.loads(open(f"{out}/torch{i}.json").read().strip().splitlines()[-1])["samples_per_s"] for i in range(1, runs + 1)]
print(f"steps per run: {steps}, batch 64, runs alternated: {runs} each")
print("tepdist samples/s:", ", ".join(f"{x:.0f}" for x in ours))
print("pytorch samples/s:", ", ".join(f"{x:.0f}" for x in torch))
m1, m2 = statistics.median(ours), statistics.median(torch)
print(f"median tepdist {m1:.0f}, median pytorch {m2:.0f}, ratio {m1 / m2:.2f}x (bar 1.3x)")
PY
