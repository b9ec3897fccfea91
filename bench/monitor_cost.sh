#!/usr/bin/env bash
# What watching a job costs it: sync throughput of `tepdist run` (two local nodes, LeNet on
# Fashion-MNIST, STEPS steps) with nobody looking, against the same job with the dashboard open
# (/status fetched every 2 s, as the page does) and every node's /metrics scraped every second, as
# Prometheus would. PAIRS runs of each, alternated; the median of the per-pair ratios is the
# figure (goal: within 3%, so >= 0.97).
#
#   bench/monitor_cost.sh [BUILD_DIR] [PAIRS] [STEPS]    (defaults: build 5 600)
#
# Figures depend on the machine; the script prints what it ran on. It is a benchmark, not a test.
set -uo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
pairs=${2:-5}
steps=${3:-600}
tepdist="$(pwd)/$build/cli/tepdist"
[[ -x $tepdist ]] || { echo "monitor_cost: $tepdist not built" >&2; exit 2; }
command -v curl >/dev/null || { echo "monitor_cost: needs curl (scripts/setup.sh installs it)" >&2; exit 2; }
dir=$(mktemp -d /tmp/tepdist-monitor-cost.XXXXXX)
watchers=()
cleanup() {
  for p in "${watchers[@]}"; do kill "$p" 2>/dev/null; done
  wait 2>/dev/null
  [[ ${KEEP:-0} == 1 ]] && echo "monitor_cost: everything in $dir" || rm -rf "$dir"
}
trap cleanup EXIT

cat >"$dir/job.toml" <<EOF
[job]
mode = "sync"
epochs = 1000
max_steps = $steps
seed = 1
eval_every_steps = 0
log_every_steps = 20
[model]
preset = "lenet"
[data]
dataset = "fashion-mnist"
dir = "/usr/share/datasets/fashion-mnist"
batch_size = 64
[optimizer]
lr = 0.02
momentum = 0.9
[cluster]
local_nodes = 2
EOF

# run NAME WATCHED: one job; WATCHED=1: the dashboard's and a scraper's requests while it trains.
run() {
  local out="$dir/$1"
  "$tepdist" run "$dir/job.toml" --out "$out" >"$dir/$1.log" 2>&1 &
  local launcher=$!
  if [[ $2 == 1 ]]; then
    local http=()
    for _ in $(seq 600); do
      mapfile -t http < <(sed -n 's/^http=//p' "$out"/run/node-*.ready 2>/dev/null)
      [[ ${#http[@]} -ge 2 ]] && break
      sleep 0.05
    done
    (while :; do curl -s -o /dev/null "http://${http[0]}/status"; sleep 2; done) &
    watchers+=($!)
    (while :; do for h in "${http[@]}"; do curl -s -o /dev/null "http://$h/metrics"; done; sleep 1; done) &
    watchers+=($!)
  fi
  wait "$launcher"
  local status=$?
  for p in "${watchers[@]}"; do kill "$p" 2>/dev/null; done
  watchers=()
  [[ $status == 0 ]] || { echo "monitor_cost: $1 exited $status" >&2; tail -5 "$dir/$1.log" >&2; return 1; }
  python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['samples_per_second'])" "$out/result.json"
}

median() { sort -g | awk '{a[NR]=$1} END {if (NR%2) print a[(NR+1)/2]; else print (a[NR/2]+a[NR/2+1])/2}'; }

echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')"
echo "sync, 2 local nodes, $steps steps; watched: /status every 2 s, both nodes' /metrics every 1 s"
for i in $(seq 1 "$pairs"); do
  closed=$(run "closed-$i" 0) || exit 1
  watched=$(run "watched-$i" 1) || exit 1
  ratio=$(awk -v a="$watched" -v b="$closed" 'BEGIN {print a / b}')
  echo "pair $i: closed $closed samples/s, watched $watched samples/s, ratio $ratio"
  echo "$closed" >>"$dir/closed"
  echo "$watched" >>"$dir/watched"
  echo "$ratio" >>"$dir/ratios"
done
echo
echo "| closed samples/s | watched samples/s | watched / closed (median of $pairs pairs) |"
echo "|---|---|---|"
echo "| $(median <"$dir/closed") | $(median <"$dir/watched") | $(median <"$dir/ratios") |"
