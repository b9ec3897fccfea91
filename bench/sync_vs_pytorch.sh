#!/usr/bin/env bash
# `tepdist run` in sync mode on 2 local nodes against PyTorch DDP (../shared/bench/torch_lenet.py
# --world 2) on this machine, in one run: same LeNet, batch 64 per worker, lr 0.01, momentum 0.9,
# cores/2 threads per worker, alternated.
#
#   throughput       STEPS global steps each (below one epoch, so no epoch-end evaluation),
#                    RUNS runs each: medians and their ratio
#   time to target   85% test accuracy, evaluated every 100 global steps, evaluation time left
#                    out of both (PyTorch pauses training to evaluate; tepdist evaluates a snapshot
#                    beside training and counts the training time at which it was taken), one run
#                    each unless TARGET_RUNS says more
#
# Usage: bench/sync_vs_pytorch.sh [BUILD_DIR] [STEPS] [RUNS]   (defaults: build 400 3)
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
steps=${2:-400}
runs=${3:-3}
target_runs=${TARGET_RUNS:-1}
baseline=${TORCH_LENET:-../shared/bench/torch_lenet.py}
[[ -f $baseline ]] || { echo "sync_vs_pytorch: $baseline not found (set TORCH_LENET)" >&2; exit 1; }
for p in python3-torch libopenblas0-pthread; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" ||
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$p" > /dev/null
done

out=$(mktemp -d /tmp/tepdist-sync-vs-pytorch.XXXXXX)
trap 'rm -rf "$out"' EXIT
common=(--mode sync --nodes 2 --set optimizer.lr=0.01 --set optimizer.warmup_steps=0 --set data.batch_size=64)
for i in $(seq 1 "$runs"); do
  "$build/cli/tepdist" run "${common[@]}" --set job.eval_every_steps=0 --set "job.max_steps=$steps" --out "$out/tepdist$i" > "$out/tepdist$i.log"
  /usr/bin/python3 "$baseline" --world 2 --steps "$steps" > "$out/torch$i.json"
done
for i in $(seq 1 "$target_runs"); do
  "$build/cli/tepdist" run "${common[@]}" --epochs 20 --set job.eval_every_steps=100 --set job.target_accuracy=0.85 \
    --set job.stop_at_target=true --out "$out/target$i" > "$out/target$i.log"
  /usr/bin/python3 "$baseline" --world 2 --steps 20000 --target-acc 0.85 --eval-every 100 > "$out/torch-target$i.json"
done

/usr/bin/python3 - "$out" "$runs" "$steps" "$target_runs" <<'PY'
import json, statistics, sys
out, runs, steps, target_runs = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
def torch(name): return json.loads(open(f"{out}/{name}.json").read().strip().splitlines()[-1])
ours = [json.load(open(f"{out}/tepdist{i}/result.json"))["samples_per_second"] for i in range(1, runs + 1)]
theirs = [torch(f"torch{i}")["samples_per_s"] for i in range(1, runs + 1)]
print(f"throughput: 2 workers x batch 64, {steps} global steps per run, {runs} runs each, alternated")
print("  tepdist sync samples/s:", ", ".join(f"{x:.0f}" for x in ours))
print("  pytorch ddp samples/s: ", ", ".join(f"{x:.0f}" for x in theirs))
m1, m2 = statistics.median(ours), statistics.median(theirs)
print(f"  median tepdist {m1:.0f}, median pytorch {m2:.0f}, ratio {m1 / m2:.2f}x (bar 1.3x, aim 2x)")
t1 = [json.load(open(f"{out}/target{i}/result.json")) for i in range(1, target_runs + 1)]
t2 = [torch(f"torch-target{i}") for i in range(1, target_runs + 1)]
print("time to 85% test accuracy (evaluation every 100 global steps, evaluation time excluded):")
for a, b in zip(t1, t2):
    ours_t, theirs_t = a["time_to_target_seconds"], b["time_to_target_s"]
    ratio = f"{theirs_t / ours_t:.2f}x sooner" if ours_t and theirs_t else "n/a"
    print(f"  tepdist {ours_t} s (step {a['steps']}, final accuracy {a['test_accuracy']:.4f}); "
          f"pytorch {theirs_t} s (step {b['steps']}, accuracy {b['test_acc']:.4f}); tepdist {ratio}")
PY
