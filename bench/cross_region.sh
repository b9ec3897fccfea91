#!/usr/bin/env bash
# The cross-region claim: on configs/cross_region.toml (four local nodes in three simulated
# regions; the link emulator delays real loopback traffic as the file models it), time to 85% test
# accuracy for sync, async and gossip. Same model, per-worker batch, learning rate and seeds in
# every mode; evaluation every 100 global steps (one global step = one batch from every worker),
# evaluation time excluded (rank 0 evaluates a snapshot beside training; time is the training
# time at which the snapshot was taken). Every run goes on to the fixed number of epochs and
# reports its final accuracy there; a run that never reaches 85% is reported as "not reached".
#
# Usage: bench/cross_region.sh [--quick] [BUILD_DIR]
#   full:    3 seeds per mode (SEEDS="1 2 3"), EPOCHS (default 3) epochs each
#   SET="section.key=value ..." adds the same overrides to every run (a variant: say so with its figures)
#   --quick: 1 seed per mode, capped at QUICK_STEPS (default 250) global steps, and a target of
#            QUICK_TARGET (default 0.75), which a capped run can reach: for development
set -euo pipefail
cd "$(dirname "$0")/.."
quick=0
if [[ ${1:-} == --quick ]]; then quick=1; shift; fi
build=${1:-build}
epochs=${EPOCHS:-3}
read -r -a seeds <<< "${SEEDS:-1 2 3}"
cap=()
target=0.85
extra=()
for kv in ${SET:-}; do extra+=(--set "$kv"); done
if ((quick)); then seeds=(1); cap=(--set "job.max_steps=${QUICK_STEPS:-250}"); target=${QUICK_TARGET:-0.75}; fi

out=$(mktemp -d /tmp/tepdist-cross-region.XXXXXX)
trap 'rm -rf "$out"' EXIT
for seed in "${seeds[@]}"; do
  for mode in sync async gossip; do
    "$build/cli/tepdist" run configs/cross_region.toml --mode "$mode" --epochs "$epochs" --set "job.seed=$seed" \
      --set job.eval_every_steps=100 --set "job.target_accuracy=$target" "${cap[@]}" "${extra[@]}" --out "$out/$mode-$seed" \
      > "$out/$mode-$seed.log" 2>&1 || { echo "cross_region: $mode seed $seed failed:" >&2; tail -5 "$out/$mode-$seed.log" >&2; exit 1; }
    echo "$mode seed $seed: $(grep '^done:' "$out/$mode-$seed.log")" >&2
  done
done

/usr/bin/python3 - "$out" "$quick" "$target" "${seeds[@]}" <<'PY'
import json, statistics, sys
out, quick, target, seeds = sys.argv[1], sys.argv[2] == "1", float(sys.argv[3]), sys.argv[4:]
pct = f"{target * 100:.0f}%"
modes = ["sync", "async", "gossip"]
runs = {m: [json.load(open(f"{out}/{m}-{s}/result.json")) for s in seeds] for m in modes}
print(f"cross-region (configs/cross_region.toml), {len(seeds)} seed(s) per mode"
      + (", quick: capped at a step budget" if quick else ""))
print(f"{'mode':8} {'time to ' + pct + ' (s) per seed':34} {'median':>8} {'final acc':>10} {'samples/s':>10} {'step ms':>8}")
medians = {}
for m in modes:
    times = [r["time_to_target_seconds"] for r in runs[m]]
    shown = ", ".join("not reached" if t is None else f"{t:.1f}" for t in times)
    reached = [t for t in times if t is not None]
    med = statistics.median(reached) if len(reached) == len(times) else None
    medians[m] = med
    acc = statistics.median(r["test_accuracy"] for r in runs[m])
    sps = statistics.median(r["samples_per_second"] for r in runs[m])
    step = statistics.median(r["wall_seconds"] / max(1, r["steps"]) for r in runs[m]) * 1000
    print(f"{m:8} {shown:34} {('%.1f' % med) if med else 'n/a':>8} {acc:10.4f} {sps:10.0f} {step:8.0f}")
sync_acc = statistics.median(r["test_accuracy"] for r in runs["sync"])
for m in ("async", "gossip"):
    acc = statistics.median(r["test_accuracy"] for r in runs[m])
    if medians["sync"] and medians[m]:
        print(f"{m} reaches {pct} {medians['sync'] / medians[m]:.2f}x sooner than sync "
              f"({(1 - medians[m] / medians['sync']) * 100:.0f}% less time); final accuracy {acc - sync_acc:+.4f} vs sync")
    else:
        print(f"{m}: no ratio (a median is missing: some run did not reach {pct}); final accuracy {acc - sync_acc:+.4f} vs sync")
print("claim to beat: async at least 30% sooner than sync; goal: async or gossip 3x sooner, final accuracy within 0.5 points")
PY
