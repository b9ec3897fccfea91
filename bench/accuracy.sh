#!/usr/bin/env bash
# The accuracy bars of single-node training on the full Fashion-MNIST data:
#   LeNet reaches >= 88% test accuracy after 3 epochs (median of seeds 0, 1, 2)
#   and >= 90% after 10 epochs (seed 0).
# Usage: bench/accuracy.sh [BUILD_DIR] [BACKEND] [SEEDS]   (defaults: build onednn "0 1 2")
# The first seed trains for 10 epochs, the others for 3. Extra overrides for every run go in
# TEPDIST_SET, space-separated: TEPDIST_SET="optimizer.schedule=cosine" bench/accuracy.sh
# Prints every run's figures and the medians; exits non-zero if a bar is missed.
set -euo pipefail
build=${1:-build}
backend=${2:-onednn}
read -r -a seeds <<< "${3:-0 1 2}"
extra=()
for kv in ${TEPDIST_SET:-}; do extra+=(--set "$kv"); done
tepdist="$build/cli/tepdist"
out=$(mktemp -d /tmp/tepdist-accuracy.XXXXXX)
trap 'rm -rf "$out"' EXIT

run() {  # seed epochs
  "$tepdist" train --threads 1 --epochs "$2" --set "job.seed=$1" --set "compute.backend=$backend" "${extra[@]}" --out "$out/seed$1" > "$out/seed$1.log"
}
run "${seeds[0]}" 10 &
first=$!
# Two runs at a time, one thread each: the 2-core machines this project runs on stay busy.
for seed in "${seeds[@]:1}"; do run "$seed" 3; done
wait $first

python3 - "$out" "${seeds[@]}" <<'PY'
import json, statistics, sys
out, seeds = sys.argv[1], [int(s) for s in sys.argv[2:]]
at3, rows = [], []
for seed in seeds:
    r = json.load(open(f"{out}/seed{seed}/result.json"))
    e3 = next(e for e in r["evaluations"] if e["epoch"] == 3)
    at3.append(e3["test_accuracy"])
    rows.append((seed, r["epochs"], e3["test_accuracy"], r["test_accuracy"], r["samples_per_second"], r["peak_rss_mb"], r["backend"]))
print("seed  epochs  acc@3   acc@end  samples/s  peak_rss_MB  backend")
for s, ep, a3, a, sps, rss, be in rows:
    print(f"{s:>4}  {ep:>6}  {a3:.4f}  {a:.4f}   {sps:>8.0f}  {rss:>11.0f}  {be}")
median3 = statistics.median(at3)
acc10 = rows[0][3]
print(f"median test accuracy after 3 epochs: {median3:.4f} (bar 0.88)")
print(f"test accuracy after 10 epochs (seed {seeds[0]}): {acc10:.4f} (bar 0.90)")
sys.exit(0 if median3 >= 0.88 and acc10 >= 0.90 else 1)
PY
