#!/usr/bin/env bash
# Runs every example command of the README, as written there, from the repository root, and says
# which passed. Slow (tens of minutes on 2 cores: several are whole training runs); the fast test
# suite covers the same paths on small jobs. Outputs go to a fresh folder, removed at the end
# unless KEEP=1; the node commands use 127.0.0.1:7001 as the README does, so that port must be free.
#
#   scripts/readme-examples.sh            (needs build/ from scripts/build.sh)
set -uo pipefail
cd "$(dirname "$0")/.."
[[ -x build/cli/tepdist ]] || { echo "readme-examples: build/cli/tepdist not built (bash scripts/build.sh)" >&2; exit 2; }
work=$(mktemp -d /tmp/tepdist-readme.XXXXXX)
passed=0
failed=0
nodes=()
cleanup() {
  for p in "${nodes[@]}"; do kill "$p" 2>/dev/null; done
  wait 2>/dev/null
  [[ ${KEEP:-0} == 1 ]] || rm -rf "$work" secret job.toml model.safetensors out/quickstart out/three out/single out/elastic out/ckpt \
    tepdist-run tepdist-results
}
trap cleanup EXIT

# example NAME COMMAND...: runs one command with its output in $work/NAME.log.
example() {
  local name=$1
  shift
  echo "readme-examples: $name: $*"
  if "$@" >"$work/$name.log" 2>&1; then
    passed=$((passed + 1))
  else
    failed=$((failed + 1))
    echo "readme-examples: $name FAILED; last lines of $work/$name.log:"
    tail -5 "$work/$name.log" | sed 's/^/    /'
  fi
}

# Quickstart.
example quickstart build/cli/tepdist run --out out/quickstart
example three build/cli/tepdist run configs/quickstart.toml --nodes 3 --epochs 1 --out out/three
example cross-region build/cli/tepdist run configs/cross_region.toml --set job.max_steps=60
example async build/cli/tepdist run configs/async.toml --epochs 1
example gossip build/cli/tepdist run configs/gossip.toml --epochs 1
example cross-region-gossip build/cli/tepdist run configs/cross_region.toml --mode gossip
example train build/cli/tepdist train --epochs 10 --set optimizer.name=adam --set optimizer.lr=0.001 --out out/single
example train-resume build/cli/tepdist train --resume --epochs 15 --set optimizer.name=adam --set optimizer.lr=0.001 --out out/single

# Elastic training: a worker added and one killed while the job trains (the launcher restarts it),
# the status with the job's generation, and the added worker drained out with `tepdist leave`.
elastic() {
  rm -rf out/elastic
  build/cli/tepdist run configs/quickstart.toml --epochs 6 --out out/elastic >"$work/elastic-run.log" 2>&1 &
  local run=$!
  nodes+=($run)  # cleanup() stops it should a step below fail (its own nodes go with it)
  for _ in $(seq 600); do grep -q "samples/s" "$work/elastic-run.log" 2>/dev/null && break; sleep 0.1; done
  build/cli/tepdist node out/elastic/cluster.toml --name extra --join "$(head -1 out/elastic/run/node-0.ready)" \
    >"$work/elastic-extra.log" 2>&1 &
  local extra=$!
  nodes+=($extra)  # else a failure below leaves it running, and cleanup()'s wait with it
  for _ in $(seq 600); do grep -q "joined extra" "$work/elastic-run.log" 2>/dev/null && break; sleep 0.1; done
  pkill -9 -f 'out/elastic/cluster.toml --name node-02 '
  for _ in $(seq 600); do grep -q "restarted it" "$work/elastic-run.log" 2>/dev/null && break; sleep 0.1; done
  local seed
  seed="$(head -1 out/elastic/run/node-0.ready)"
  build/cli/tepdist status out/elastic/cluster.toml --peer "$seed" || return 1
  # Watching a job: node-00's endpoint, from its ready file.
  local http
  http=$(sed -n 's/^http=//p' out/elastic/run/node-0.ready)
  # Each answer whole in a variable first: `curl | grep -q` under pipefail fails whenever grep finds
  # its line and exits before curl has written the rest (curl then exits 23, a write error).
  local metrics status_doc
  metrics=$(curl -sf "http://$http/metrics") || return 1
  grep -q '^tepdist_train_steps_total' <<<"$metrics" || return 1
  status_doc=$(curl -sf "http://$http/status") || return 1
  grep -q '"job"' <<<"$status_doc" || return 1
  build/cli/tepdist leave extra out/elastic/cluster.toml --peer "$seed" || return 1
  wait $run
  local status=$?
  wait $extra 2>/dev/null
  cat "$work/elastic-run.log"
  grep -q "restarted it" "$work/elastic-run.log" && grep -q "joined extra" "$work/elastic-run.log" &&
    grep -q "gone extra" "$work/elastic-run.log" && return $status
  return 1
}
example elastic elastic

# Checkpoints: a job that writes them, resumed on another node count, and the newest exported.
example checkpoint build/cli/tepdist run configs/quickstart.toml --set elastic.checkpoint_every_steps=50 --out out/ckpt
example checkpoint-resume build/cli/tepdist run configs/quickstart.toml --resume --nodes 2 --out out/ckpt
example checkpoint-export build/cli/tepdist export out/ckpt/checkpoints --out model.safetensors

# Nodes, status, and a job submitted to the running cluster (job.toml: the quickstart's job with
# the cluster's secret file, 40 steps).
printf 'a long random secret\n' > secret && chmod 600 secret
build/cli/tepdist node --set cluster.secret_file=secret --name n1 --listen 127.0.0.1:7001 >"$work/n1.log" 2>&1 &
nodes+=($!)
for n in n2 n3; do
  build/cli/tepdist node --set cluster.secret_file=secret --name $n --join 127.0.0.1:7001 >"$work/$n.log" 2>&1 &
  nodes+=($!)
done
for _ in $(seq 100); do  # each node logs its view; all three: the cluster formed (at most 10 s)
  [[ $(grep -l "view members=3" "$work"/n?.log 2>/dev/null | wc -l) -eq 3 ]] && break
  sleep 0.1
done
example status build/cli/tepdist status --set cluster.secret_file=secret --peer 127.0.0.1:7001
sed -e 's/^\[job\]$/[job]\nmax_steps = 40/' -e 's/^\[cluster\]$/[cluster]\nsecret_file = "secret"/' \
  configs/quickstart.toml > job.toml
example running-cluster build/cli/tepdist run job.toml --set cluster.local_nodes=0 --set 'cluster.seeds=["127.0.0.1:7001"]'
example running-cluster-detach build/cli/tepdist run job.toml --set cluster.local_nodes=0 --set 'cluster.seeds=["127.0.0.1:7001"]' --detach

# Simulation.
example sim-kill build/cli/tepdist sim sims/scenarios/kill_one_of_100.toml
example sim-churn build/cli/tepdist sim sims/scenarios/churn.toml --seed 7 --json

echo "readme-examples: $passed passed, $failed failed"
[[ $failed -eq 0 ]]
