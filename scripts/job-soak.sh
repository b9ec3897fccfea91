#!/usr/bin/env bash
# Jobs that must not fail for nothing, run many times: plain 3-node `tepdist run` jobs two at a
# time, and the README's cross-region example one at a time. Prints each failure's reason and
# where its logs are, then "N passed, N failed"; exits non-zero on any failure.
#
#   scripts/job-soak.sh [BUILD_DIR] [PAIRS] [CROSS_REGION_RUNS]     (defaults: build 25 10)
#
# 25 pairs are the 50 concurrent 3-node jobs of issue 14's acceptance; each job trains 40 steps,
# so a pair takes about 10-20 s on 2 cores. Keeps the logs of failed runs under $SOAK_DIR
# (default: a fresh folder under /tmp) and removes the rest.
set -uo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
pairs=${2:-25}
cross=${3:-10}
tepdist="$build/cli/tepdist"
[[ -x $tepdist ]] || { echo "job-soak: $tepdist not built (bash scripts/build.sh)" >&2; exit 2; }
dir=${SOAK_DIR:-$(mktemp -d /tmp/tepdist-job-soak.XXXXXX)}
mkdir -p "$dir"
passed=0
failed=0

# One job; keeps its output folder only if it failed.
check() {
  local name=$1 out=$2 status=$3
  if [[ $status -eq 0 && -s $out/result.json ]]; then
    passed=$((passed + 1))
    rm -rf "$out"
  else
    failed=$((failed + 1))
    echo "job-soak: $name FAILED (exit $status): $(grep -h -m1 -E 'job_failed|job_refused|error' "$out"/run.log "$out"/logs/*.log 2>/dev/null | head -1)"
    echo "job-soak:   logs in $out"
  fi
}

for ((i = 1; i <= pairs; i++)); do
  pids=()
  for side in a b; do
    out="$dir/pair$i$side"
    mkdir -p "$out"
    "$tepdist" run configs/quickstart.toml --nodes 3 --set job.max_steps=40 --out "$out" >"$out/run.log" 2>&1 &
    pids+=($!)
  done
  for k in 0 1; do
    wait "${pids[$k]}"
    status=$?
    side=$([[ $k -eq 0 ]] && echo a || echo b)
    check "3-node pair $i$side" "$dir/pair$i$side" "$status"
  done
done

for ((i = 1; i <= cross; i++)); do
  out="$dir/cross$i"
  mkdir -p "$out"
  "$tepdist" run configs/cross_region.toml --set job.max_steps=60 --out "$out" >"$out/run.log" 2>&1
  check "cross-region run $i" "$out" $?
done

rmdir "$dir" 2>/dev/null || true
echo "job-soak: $passed passed, $failed failed"
[[ $failed -eq 0 ]]
