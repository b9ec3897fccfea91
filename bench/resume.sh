#!/usr/bin/env bash
# A cluster job stopped and resumed on another node count, against the same job never stopped, on
# this machine: `tepdist run` of LeNet on Fashion-MNIST for EPOCHS epochs, in each mode of MODES
# (default "async gossip"). Per seed:
#   uninterrupted   FROM local nodes, start to end
#   resumed         FROM nodes stopped after the first epoch's local steps (job.max_steps), with
#                   a checkpoint every CKPT_STEPS of rank 0's steps, then `tepdist run --resume`
#                   on TO nodes to the end
# and, per mode, the medians over the seeds of both final test accuracies and their difference
# (issue 16's goal: the resumed run ends within noise of the uninterrupted one, median of 3).
#
#   bench/resume.sh [BUILD_DIR] [SEEDS] [EPOCHS]     (defaults: build 3 2; FROM=3 TO=2 CKPT_STEPS=100)
#
# Figures depend on the machine; the script prints what it ran on. A benchmark, not a test.
set -uo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
seeds=${2:-3}
epochs=${3:-2}
from=${FROM:-3}
to=${TO:-2}
every=${CKPT_STEPS:-100}
modes=${MODES:-async gossip}
tepdist="$(pwd)/$build/cli/tepdist"
[[ -x $tepdist ]] || { echo "resume: $tepdist not built" >&2; exit 2; }
dir=$(mktemp -d /tmp/tepdist-resume.XXXXXX)
trap '[[ ${KEEP:-0} == 1 ]] && echo "resume: everything in $dir" || rm -rf "$dir"' EXIT

job() {  # job FILE SEED
  cat >"$1" <<EOF
[job]
epochs = $epochs
seed = $2
eval_every_steps = 0
log_every_steps = 50
[model]
preset = "lenet"
[data]
dataset = "fashion-mnist"
dir = "/usr/share/datasets/fashion-mnist"
batch_size = 64
[optimizer]
lr = 0.04
momentum = 0.9
warmup_steps = 100
EOF
}

accuracy() { grep -o '"test_accuracy": [0-9.]*' "$1" | head -1 | awk '{print $2}'; }
median() { sort -g | awk '{v[NR] = $1} END {print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2}'; }

echo "resume: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $epochs epochs," \
  "$from nodes, stopped after epoch 1 and resumed on $to"
per_epoch=$((60000 / (from * 64)))  # each worker's local steps in an epoch
for mode in $modes; do
  : >"$dir/$mode.txt"
  for seed in $(seq "$seeds"); do
    out="$dir/$mode-$seed"
    mkdir -p "$out"
    job "$out/job.toml" "$seed"
    "$tepdist" run "$out/job.toml" --mode "$mode" --nodes "$from" --out "$out/whole" >"$out/whole.log" 2>&1 ||
      { echo "resume: $mode seed $seed: the uninterrupted run failed ($out/whole.log)"; continue; }
    "$tepdist" run "$out/job.toml" --mode "$mode" --nodes "$from" --set "job.max_steps=$per_epoch" \
      --set "elastic.checkpoint_every_steps=$every" --out "$out/parts" >"$out/stopped.log" 2>&1 ||
      { echo "resume: $mode seed $seed: the stopped run failed ($out/stopped.log)"; continue; }
    "$tepdist" run "$out/job.toml" --mode "$mode" --nodes "$to" --resume --out "$out/parts" >"$out/resumed.log" 2>&1 ||
      { echo "resume: $mode seed $seed: the resumed run failed ($out/resumed.log)"; continue; }
    whole=$(accuracy "$out/whole/result.json")
    resumed=$(accuracy "$out/parts/result.json")
    from_line=$(grep -m1 '^resuming from' "$out/resumed.log")
    echo "$whole $resumed" >>"$dir/$mode.txt"
    printf 'resume: %-6s seed %s: uninterrupted %.4f, resumed %.4f (%s)\n' "$mode" "$seed" "$whole" "$resumed" \
      "${from_line#resuming from }"
  done
  [[ -s $dir/$mode.txt ]] || continue
  w=$(awk '{print $1}' "$dir/$mode.txt" | median)
  r=$(awk '{print $2}' "$dir/$mode.txt" | median)
  printf 'resume: %-6s medians of %d: uninterrupted %.4f, resumed %s->%s nodes %.4f, difference %+.2f points\n' \
    "$mode" "$(wc -l <"$dir/$mode.txt")" "$w" "$from" "$to" "$r" "$(awk -v a="$r" -v b="$w" 'BEGIN {print 100 * (a - b)}')"
done
