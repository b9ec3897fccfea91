#!/usr/bin/env bash
# Hostile inputs against a node of a training job, for the README's table: each attack of
# tepdist_hostile (tests/tools/hostile_peer.cpp) in turn against node-01 of a 2-node sync job on
# synthetic data, with the node's memory after each (VmRSS, its peak VmHWM, VmSize) and the job's
# steps during it. Prints a Markdown table.
#
#   bench/hostile.sh [BUILD_DIR] [SECONDS_PER_ATTACK]        (defaults: build, 3)
set -euo pipefail
build=${1:-build}
seconds=${2:-3}
bin=$build/cli/tepdist
hostile=$build/tests/tepdist_hostile
work=$(mktemp -d)
trap 'kill $run_pid 2>/dev/null || true; wait $run_pid 2>/dev/null || true; rm -rf "$work"' EXIT
cat >"$work/job.toml" <<'TOML'
[job]
mode = "sync"
epochs = 1000
log_every_steps = 20
[data]
dataset = "synthetic"
[cluster]
local_nodes = 2
TOML
"$bin" run "$work/job.toml" --out "$work/out" >"$work/run.log" 2>&1 &
run_pid=$!
for _ in $(seq 600); do grep -q "samples/s" "$work/run.log" 2>/dev/null && break; sleep 0.1; done
target=$(head -1 "$work/out/run/node-1.ready")
pid=$(pgrep -f -- "--name node-01 " | head -1)
mem() { awk '/^(VmRSS|VmHWM|VmSize):/ {printf "%s %.0f MiB, ", $1, $2 / 1024}' "/proc/$pid/status" | sed 's/, $//'; }
step() { grep -o 'step [0-9]*' "$work/run.log" | tail -1 | cut -d' ' -f2; }
echo "node-01 at $target (pid $pid): $(mem)"
echo
echo "| input | what the node did | node-01 after it | job steps during it |"
echo "|---|---|---|---|"
for attack in garbage idle hellos amplify announce flood; do
  before=$(step)
  line=$("$hostile" "$target" "$work/out/secret" "$attack" "$seconds")
  sent=$(sed -n 's/.*sent="\([^"]*\)".*/\1/p' <<<"$line")
  closed=$(sed -n 's/.*closed_by_node=\([0-9]*\) of=\([0-9]*\).*/closed \1 of its \2 connections/p' <<<"$line")
  echo "| $attack: $sent | $closed | $(mem) | $before to $(step) |"
done
echo
kill -0 "$pid" 2>/dev/null && echo "node-01 is alive, pid $pid" || echo "node-01 is gone"
