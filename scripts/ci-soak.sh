#!/usr/bin/env bash
# CI, many times: RUNS fresh clones of this repository's HEAD, each running `.ci/run` (the
# README's second command: set-up, a clean Release build, `ctest -LE slow`) one after another, as
# issue 14's acceptance asks ("scripts/test.sh passes 10 full runs of 10 on a fresh clone").
# Prints each run's result and time, the names of the tests that failed, and "N passed, N failed";
# exits non-zero on any failure. Keeps the output of failed runs under $SOAK_DIR (default: a fresh
# folder under /tmp) and removes each clone afterwards.
#
#   scripts/ci-soak.sh [RUNS]        (default 10)
set -uo pipefail
cd "$(dirname "$0")/.."
runs=${1:-10}
[[ $runs =~ ^[1-9][0-9]*$ ]] || { echo "ci-soak: RUNS must be a positive number, not '$runs'" >&2; exit 2; }
repo=$(pwd)
head=$(git rev-parse --short HEAD)
dir=${SOAK_DIR:-$(mktemp -d /tmp/tepdist-ci-soak.XXXXXX)}
mkdir -p "$dir"
dir=$(cd "$dir" && pwd)
# Each clone builds in its own build/, as CI does; the clones' builds share ccache's entries
# (paths under $dir are hashed relative to it).
unset BUILD_DIR
export CCACHE_BASEDIR=$dir
clone=
trap '[[ -n $clone ]] && rm -rf "$clone"' EXIT
[[ -z $(git status --porcelain --untracked-files=no) ]] ||
  echo "ci-soak: the working tree has uncommitted changes; the clones run HEAD ($head) without them" >&2
passed=0
failed=0
for i in $(seq "$runs"); do
  clone="$dir/clone-$i"
  rm -rf "$clone"
  git clone -q "$repo" "$clone"
  commit=$(git -C "$clone" rev-parse --short HEAD)
  start=$(date +%s)
  if (cd "$clone" && bash .ci/run) >"$dir/run-$i.log" 2>&1; then
    passed=$((passed + 1))
    echo "run $i of $runs ($commit): passed in $(($(date +%s) - start)) s," \
      "$(grep -o '[0-9]*% tests passed, [0-9]* tests failed out of [0-9]*' "$dir/run-$i.log" | tail -1)"
    rm -f "$dir/run-$i.log"
  else
    failed=$((failed + 1))
    echo "run $i of $runs ($commit): FAILED after $(($(date +%s) - start)) s; output in $dir/run-$i.log"
    grep -E '^\s+[0-9]+ - ' "$dir/run-$i.log" | sed 's/^/    /'
  fi
  rm -rf "$clone"
done
echo "$passed passed, $failed failed ($(nproc) cores)"
[[ $failed -eq 0 ]]
