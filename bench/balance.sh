#!/usr/bin/env bash
# Load balancing across uneven nodes, on this machine: `tepdist run` of two local nodes (one kernel
# thread each, so one core each on a 2-core machine) training LeNet on Fashion-MNIST in MODE (sync
# by default; gossip or async).
# node-01 is made slower, by the emulation knob ([nodes.node-01] slowdown = SLOWDOWN, default 2)
# or, with REAL=1, by a busy loop pinned (taskset) to the core its process is pinned to. Per seed,
# one run with [elastic] balance = true and one with false, alternated; medians over the seeds:
#   efficiency   the job's samples/s over the sum of the two nodes' own speeds: each node's
#                samples/s training alone (one node, one thread, the same batch, 300 steps; the
#                slower one at the same slowdown or beside the same busy loop), measured per seed
#                next to the runs: 1.0 is a perfect split with free communication; equal shares give
#                2 x the slower / (sum) = 0.67 at slowdown 2 (goal >= 0.90)
#   at once      the two nodes alone but at the same time (two one-node runs side by side, as the
#                pair shares the machine), over the sum of their speeds one after the other: what
#                sharing the cores' caches and memory alone leaves of it, the ceiling on this
#                machine for a pair with free communication
#   speedup      balanced samples/s over unbalanced samples/s, in the same seed
#   accuracy     final test accuracy, balanced and unbalanced (goal: within 0.5 points)
#   shares       the final shares of the global batch (balanced run, sync)
#   epoch ends   gossip and async: per epoch, how far apart the two workers trained the last of
#                their positions of it, over the time from the first step to the later one
#                (goal: within 5%); the worst epoch of the run; and the rebalancing generations
#
#   bench/balance.sh [BUILD_DIR] [SEEDS] [EPOCHS]    (defaults: build 3 2; MODE=sync, SLOWDOWN=2, REAL=0,
#                                                     BATCH=64: each node's batch; sync's ring moves the
#                                                     same bytes a step whatever it is, so a larger one
#                                                     shows the split with less of the ring in the way;
#                                                     SETS="KEY=VALUE ...": more settings for every run,
#                                                     job.ring_overlap=false, say)
#
# Figures depend on the machine; the script prints what it ran on. It is a benchmark, not a test.
set -uo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
seeds=${2:-3}
epochs=${3:-2}
slowdown=${SLOWDOWN:-2}
real=${REAL:-0}
mode=${MODE:-sync}
batch=${BATCH:-64}
sets=()
for kv in ${SETS:-}; do sets+=(--set "$kv"); done
tepdist="$(pwd)/$build/cli/tepdist"
[[ -x $tepdist ]] || { echo "balance: $tepdist not built" >&2; exit 2; }
dir=$(mktemp -d /tmp/tepdist-balance.XXXXXX)
busy=()
started=()
cleanup() {
  for p in "${busy[@]}"; do kill "$p" 2>/dev/null; done
  wait 2>/dev/null
  [[ ${KEEP:-0} == 1 ]] && echo "balance: everything in $dir" || rm -rf "$dir"
}
trap cleanup EXIT

job() {  # job FILE SEED BALANCE [NODES]
  cat >"$1" <<EOF
[job]
mode = "$mode"
epochs = $epochs
seed = $2
eval_every_steps = 0
log_every_steps = 20
[model]
preset = "lenet"
[data]
dataset = "fashion-mnist"
dir = "/usr/share/datasets/fashion-mnist"
batch_size = $batch
[optimizer]
lr = 0.02
momentum = 0.9
warmup_steps = 50
[elastic]
balance = $3
[compute]
threads = 1
[cluster]
local_nodes = ${4:-2}
EOF
  if [[ $real != 1 && ${4:-2} == 2 ]]; then printf '[nodes.node-01]\nslowdown = %s\n' "$slowdown" >>"$1"; fi
}

# alone OUT SEED SLOW [BG [STEPS]]: one node alone, STEPS steps (300); SLOW=1: at the slowdown, or
# beside the busy loop (REAL=1: pinned to a core as in the pair's run). BG=1: in the background
# (the caller waits and stops the busy loop).
alone() {
  local out=$1 bg=${4:-0} steps=${5:-300}
  mkdir -p "$out"
  job "$out/job.toml" "$2" false 1
  if [[ $3 == 1 && $real != 1 ]]; then printf '[nodes.node-00]\nslowdown = %s\n' "$slowdown" >>"$out/job.toml"; fi
  local pin=()
  if [[ $real == 1 ]]; then
    pin=(taskset -c "$3")
    if [[ $3 == 1 ]]; then
      taskset -c 1 bash -c 'while :; do :; done' &
      busy+=($!)
    fi
  fi
  if [[ $bg == 1 ]]; then
    ("${pin[@]}" "$tepdist" run "$out/job.toml" "${sets[@]}" --set job.max_steps="$steps" --out "$out/run" >"$out/launcher.log" 2>&1
     echo $? >"$out/status") &
    started+=($!)
    return
  fi
  "${pin[@]}" "$tepdist" run "$out/job.toml" "${sets[@]}" --set job.max_steps="$steps" --out "$out/run" >"$out/launcher.log" 2>&1
  echo $? >"$out/status"
  stop_busy
}

stop_busy() {
  for p in "${busy[@]}"; do kill "$p" 2>/dev/null; done
  busy=()
}

# run OUT SEED BALANCE: one `tepdist run`. REAL=1: each node pinned to its own core, a busy loop
# beside node-01.
run() {
  local out=$1
  mkdir -p "$out"
  job "$out/job.toml" "$2" "$3"
  "$tepdist" run "$out/job.toml" "${sets[@]}" --out "$out/run" >"$out/launcher.log" 2>&1 &
  local launcher=$!
  if [[ $real == 1 ]]; then
    local pids=()
    for _ in $(seq 300); do
      mapfile -t pids < <(pgrep -f -- "--name node-0[01] " | sort -n)
      [[ ${#pids[@]} -ge 2 ]] && break
      sleep 0.1
    done
    taskset -pc 0 "${pids[0]}" >/dev/null && taskset -apc 0 "${pids[0]}" >/dev/null
    taskset -apc 1 "${pids[1]}" >/dev/null
    taskset -c 1 bash -c 'while :; do :; done' &
    busy+=($!)
  fi
  wait "$launcher"
  echo $? >"$out/status"
  for p in "${busy[@]}"; do kill "$p" 2>/dev/null; done
  busy=()
}

median() { sort -g | awk '{a[NR]=$1} END {if (NR==0) print "nan"; else if (NR%2) print a[(NR+1)/2]; else print (a[NR/2]+a[NR/2+1])/2}'; }

field() { python3 -c "import json,sys; r=json.load(open(sys.argv[1])); print($2)" "$1"; }

# The worst epoch's spread of the workers' ends of it, over the time from the first step (node logs).
spread() {
  python3 - "$1" <<'PY'
import re, sys, glob, datetime
t = lambda s: datetime.datetime.fromisoformat(s).timestamp()
first, ends = None, {}
for f in glob.glob(sys.argv[1] + "/node-*.log"):
    for line in open(f):
        m = re.match(r"(\S+) generation_first_step .*generation=1 ", line)
        if m: first = min(first or t(m.group(1)), t(m.group(1)))
        m = re.match(r"(\S+) epoch_part_done .*epoch=(\d+)", line)
        if m: ends.setdefault(int(m.group(2)), {})[f] = t(m.group(1))
worst = 0
for e, by in ends.items():
    if len(by) < 2 or first is None: continue
    worst = max(worst, (max(by.values()) - min(by.values())) / (max(by.values()) - first))
print(f"{worst:.3f}")
PY
}

echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')"
echo "batch: $batch per node${SETS:+; settings: $SETS}"
echo "slower node: $([[ $real == 1 ]] && echo 'node-01 beside a busy loop on its core (taskset)' || echo "node-01 at slowdown $slowdown (emulated)")"
for seed in $(seq 1 "$seeds"); do
  own=0
  for slow in 0 1; do
    alone "$dir/$seed-alone-$slow" "$seed" "$slow"
    r="$dir/$seed-alone-$slow/run/result.json"
    [[ $(cat "$dir/$seed-alone-$slow/status") == 0 ]] || { echo "seed $seed alone $slow: tepdist run failed"; continue; }
    sps=$(field "$r" 'r["samples_per_second"]')
    own=$(awk -v a="$own" -v b="$sps" 'BEGIN {print a + b}')
    echo "seed $seed: $([[ $slow == 1 ]] && echo 'the slower node' || echo 'the faster node') alone: $sps samples/s"
  done
  # Both alone at once, the faster one for as many more steps as it is faster, so that the two
  # runs take about as long and each is measured beside the other throughout.
  if [[ -f $dir/$seed-alone-0/run/result.json && -f $dir/$seed-alone-1/run/result.json ]]; then
    ratio=$(field "$dir/$seed-alone-0/run/result.json" 'r["samples_per_second"]')/$(field "$dir/$seed-alone-1/run/result.json" 'r["samples_per_second"]')
    started=()
    alone "$dir/$seed-once-0" "$seed" 0 1 "$(python3 -c "print(round(300 * $ratio))")"
    alone "$dir/$seed-once-1" "$seed" 1 1
    wait "${started[@]}"  # not the busy loop
  fi
  stop_busy
  if [[ $(cat "$dir/$seed-once-0/status" 2>/dev/null) == 0 && $(cat "$dir/$seed-once-1/status" 2>/dev/null) == 0 ]]; then
    a=$(field "$dir/$seed-once-0/run/result.json" 'r["samples_per_second"]')
    b=$(field "$dir/$seed-once-1/run/result.json" 'r["samples_per_second"]')
    awk -v a="$a" -v b="$b" -v o="$own" 'BEGIN {print (a + b) / o}' >"$dir/$seed.once"
    echo "seed $seed: both alone at once: $a + $b samples/s, $(cat "$dir/$seed.once") of the sum one after the other"
  fi
  for balance in true false; do
    run "$dir/$seed-$balance" "$seed" "$balance"
    st=$(cat "$dir/$seed-$balance/status")
    [[ $st == 0 ]] || { echo "seed $seed balance $balance: tepdist run exited $st"; tail -5 "$dir/$seed-$balance/launcher.log"; continue; }
    r="$dir/$seed-$balance/run/result.json"
    field "$r" 'r["samples_per_second"]' >"$dir/$seed-$balance/sps"
    field "$r" "r['samples_per_second'] / $own" >"$dir/$seed-$balance/eff"
    field "$r" 'r["test_accuracy"]' >"$dir/$seed-$balance/acc"
    field "$r" '"/".join(str(w["share"]) for w in r["loads"])' >"$dir/$seed-$balance/shares"
    field "$r" 'len(r["generations"]) - 1' >"$dir/$seed-$balance/rebalances"
    spread "$dir/$seed-$balance/run/logs" >"$dir/$seed-$balance/spread"
    echo "seed $seed balance $balance: $(cat "$dir/$seed-$balance/sps") samples/s, efficiency $(cat "$dir/$seed-$balance/eff"), accuracy $(cat "$dir/$seed-$balance/acc"), shares $(cat "$dir/$seed-$balance/shares"), epoch ends apart $(cat "$dir/$seed-$balance/spread"), generations after the first $(cat "$dir/$seed-$balance/rebalances")"
  done
  if [[ -f $dir/$seed-true/sps && -f $dir/$seed-false/sps ]]; then
    awk -v a="$(cat "$dir/$seed-true/sps")" -v b="$(cat "$dir/$seed-false/sps")" 'BEGIN {print a / b}' >"$dir/$seed.speedup"
  fi
done
m() { cat "$dir"/$1 2>/dev/null | median; }
echo
echo "mode $mode"
echo "| balance | samples/s | efficiency (samples/s over the sum of the nodes' speeds alone) | accuracy | final shares | epoch ends apart (worst epoch) | rebalancing generations |"
echo "|---|---|---|---|---|---|---|"
echo "| on  | $(m '*-true/sps') | $(m '*-true/eff') | $(m '*-true/acc') | $(cat "$dir"/1-true/shares 2>/dev/null) | $(m '*-true/spread') | $(m '*-true/rebalances') |"
echo "| off | $(m '*-false/sps') | $(m '*-false/eff') | $(m '*-false/acc') | $(cat "$dir"/1-false/shares 2>/dev/null) | $(m '*-false/spread') | $(m '*-false/rebalances') |"
echo "speedup of balancing (same seed, median): $(m '*.speedup')"
echo "both alone at once over one after the other (median): $(m '*.once')"
