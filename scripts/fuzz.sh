#!/usr/bin/env bash
# AFL++ on one fuzz target (tests/fuzz/TARGET_fuzzer.cpp, built as TARGET_afl), from its corpus in
# tests/fuzz/corpus/TARGET, for about EXECS inputs:
#
#   scripts/fuzz.sh frame 1000000              (a long run: about 15 min on a 2-core machine)
#   scripts/fuzz.sh handshake 20000 build/tests (what ctest runs)
#
# Exits 1 naming each input that crashed (kept under BIN_DIR/afl-TARGET/default/crashes/: replay
# one with `BIN_DIR/TARGET_afl FILE`). With KEEP_QUEUE=1 the inputs AFL++ found new coverage with,
# minimised by afl-cmin, replace the corpus (review and commit them after a long run).
set -euo pipefail
target=${1:?usage: scripts/fuzz.sh TARGET [EXECS] [BIN_DIR]}
execs=${2:-1000000}
root=$(cd "$(dirname "$0")/.." && pwd)
bin_dir=$(cd "${3:-$root/build/tests}" && pwd)
bin=$bin_dir/${target}_afl
corpus=$root/tests/fuzz/corpus/$target
out=$bin_dir/afl-$target
[[ -x $bin ]] || { echo "fuzz: $bin is not built (cmake --build build --target ${target}_afl)" >&2; exit 2; }
[[ -d $corpus ]] || { echo "fuzz: no corpus at $corpus" >&2; exit 2; }
rm -rf "$out"

# No terminal UI, no CPU-governor or core-pattern checks (CI machines), no pinning to a core (two
# campaigns may run at once); a sanitizer report aborts, which AFL++ counts as a crash.
export AFL_NO_UI=1 AFL_SKIP_CPUFREQ=1 AFL_I_DONT_CARE_ABOUT_MISSING_CRASHES=1 AFL_NO_AFFINITY=1
export ASAN_OPTIONS=abort_on_error=1:symbolize=0:detect_leaks=0
export UBSAN_OPTIONS=halt_on_error=1:abort_on_error=1:print_stacktrace=1
start=$(date +%s)
# afl-fuzz leaves its persistent-mode target behind after a campaign that reaches -E: stopped
# (SIGSTOP between inputs), orphaned, in a session of its own (three were found after three CI
# runs). Those running this build's target binary go when this script does.
kill_targets() {
  local p
  for p in /proc/[0-9]*; do
    [[ $(readlink "$p/exe" 2>/dev/null) == "$bin" ]] && kill -KILL "${p#/proc/}" 2>/dev/null
  done
  return 0
}
trap kill_targets EXIT
afl-fuzz -i "$corpus" -o "$out" -m none -t 2000 -c 0 -E "$execs" -- "$bin" >"$out.log" 2>&1 || {
  echo "fuzz: afl-fuzz failed; its log:" >&2
  tail -40 "$out.log" >&2
  exit 1
}
stats=$out/default/fuzzer_stats
stat() { awk -F: -v k="$1" '$1 ~ "^"k" *$" {gsub(/ /, "", $2); print $2}' "$stats"; }
crashes=$(find "$out/default/crashes" -type f ! -name README.txt | sort)
echo "fuzz: $target: $(stat execs_done) inputs in $(($(date +%s) - start)) s, $(stat corpus_count) in the queue," \
     "edges found $(stat edges_found) of $(stat total_edges), $(printf '%s' "$crashes" | grep -c . || true) crashes"
if [[ -n $crashes ]]; then
  echo "fuzz: inputs that crashed $bin:" >&2
  printf '  %s\n' $crashes >&2
  exit 1
fi
if [[ ${KEEP_QUEUE:-0} == 1 ]]; then
  tmp=$(mktemp -d "$bin_dir/afl-cmin.XXXXXX")  # (afl-cmin refuses /tmp)
  afl-cmin -i "$out/default/queue" -o "$tmp/min" -m none -t 2000 -- "$bin" >/dev/null
  rm -rf "$corpus" && mv "$tmp/min" "$corpus" && rm -rf "$tmp"
  echo "fuzz: $corpus now holds $(ls "$corpus" | wc -l) inputs"
fi
