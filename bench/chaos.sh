#!/usr/bin/env bash
# Elastic training under chaos, against fault-free runs, on this machine: `tepdist run` of four
# local nodes training LeNet on Fashion-MNIST, in each mode of MODES (default "sync gossip async";
# async with its default replication 2). During the chaos run a
# fault comes every FAULT_GAP seconds, drawn from the seed: kill -9 of a launcher's node (the
# launcher restarts it), SIGSTOP for 3 s then SIGCONT, a join of a new node, a graceful leave
# (SIGTERM: a drain) of a node this script added, a crash of a node's trainer role (SIGUSR2: its
# supervisor restarts it and it rejoins), with CHAOS_HANG=1 also a hang of a node's trainer role
# (SIGRTMIN: its thread blocks for three times step_timeout_s = 5 s while membership holds the node
# live; it is evicted and taken back; each costs the ring 1.5-2 step timeouts by design, so it is
# not in the default mix the goodput goal is set for); and one partition of the link emulator (nodes 0, 1 in
# region a, 2, 3 in b) 25 s into the cluster's life, for 4 s. Beside it, fault-free runs at 4 and
# at 3 workers. Per mode, medians over the seeds:
#   completion        chaos runs that finished (exit 0)
#   accuracy          final test accuracy, chaos and fault-free (goal: within 0.5 points)
#   goodput           epochs x samples / wall time, chaos over fault-free at 4 and at 3 workers
#                     (goal >= 0.85 of the 4-worker run)
#   kill to step      a kill -9 (or a trainer crash) to the survivors' next committed step (the
#                     first step any node logs in a generation begun after it; goal <= 3 s)
#   join to step      a join to the joiner's first step (goal <= 5 s)
#   hang to step      a hang to the others' next committed step (the ring check's course: about
#                     1.5 x step_timeout_s)
#   unexplained       deaths of members no fault touched (must be 0), before the teardown (the
#                     launcher stopping its nodes after the job's end)
#
#   bench/chaos.sh [BUILD_DIR] [SEEDS] [EPOCHS]        (defaults: build 3; FAULT_GAP=4, CHAOS_HANG=0,
#                                                      MODES="sync gossip async")
#
# SCHEDULE sets the learning-rate schedule of every run (default "constant"; "cosine" decays it
# to 0 at the last step, so the final accuracy depends less on where the rate left the model).
#
# EPOCHS, if given, is every mode's; by default each mode trains long enough for at least ten
# faults a run at FAULT_GAP=3 on a 2-core machine: sync 4 epochs, async 5, gossip 7 (gossip and
# async train an epoch in about half of sync's time; with 3 epochs each, their runs saw 4 to 7
# faults). SYNC_EPOCHS, ASYNC_EPOCHS and GOSSIP_EPOCHS set one mode's.
#
# Figures depend on the machine; the script prints what it ran on. It is a benchmark, not a test.
set -uo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
seeds=${2:-3}
declare -A epochs_of=([sync]=${SYNC_EPOCHS:-${3:-4}} [async]=${ASYNC_EPOCHS:-${3:-5}} [gossip]=${GOSSIP_EPOCHS:-${3:-7}})
gap=${FAULT_GAP:-4}
kinds=$(( ${CHAOS_HANG:-0} == 1 ? 6 : 5 ))  # fault kinds drawn from: 0-4, and 5 (the hang) when asked
tepdist="$(pwd)/$build/cli/tepdist"
[[ -x $tepdist ]] || { echo "chaos: $tepdist not built" >&2; exit 2; }
dir=$(mktemp -d /tmp/tepdist-chaos.XXXXXX)
added=()
cleanup() {
  for p in "${added[@]}"; do kill -9 "$p" 2>/dev/null; done
  wait 2>/dev/null
  # A run with an unexplained death keeps its logs whatever KEEP says: it is the one to read.
  if [[ ${KEEP:-0} == 1 || -e $dir/unexplained ]]; then echo "chaos: everything in $dir"; else rm -rf "$dir"; fi
}
trap cleanup EXIT

now() { date +%s.%N; }

job() {  # job FILE EPOCHS: the benchmark's job, with the partition
  cat >"$1" <<EOF
[job]
epochs = $2
seed = 0
eval_every_steps = 0
log_every_steps = 20
step_timeout_s = 5
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
schedule = "${SCHEDULE:-constant}"
[nodes.node-00]
region = "a"
[nodes.node-01]
region = "a"
[nodes.node-02]
region = "b"
[nodes.node-03]
region = "b"
[[network.partition]]
at_s = 25
duration_s = 4
between = ["a", "b"]
EOF
}

# run MODE NODES OUT [chaos SEED]: one `tepdist run`; faults when asked. Writes OUT/faults.txt
# (time kind node) and OUT/status.
run() {
  local mode=$1 nodes=$2 out=$3 chaos=${4:-} seed=${5:-0}
  mkdir -p "$out"
  job "$out/job.toml" "${epochs_of[$mode]}"
  now >"$out/started"
  "$tepdist" run "$out/job.toml" --mode "$mode" --nodes "$nodes" --out "$out/run" >"$out/launcher.log" 2>&1 &
  local launcher=$!
  : >"$out/faults.txt"
  if [[ $chaos == chaos ]]; then
    RANDOM=$seed
    local joined=0
    for _ in $(seq 600); do grep -q "samples/s" "$out/launcher.log" 2>/dev/null && break; sleep 0.1; done
    local seed_addr
    seed_addr=$(grep -o -m1 'join [0-9.:]*' "$out/launcher.log" | cut -d' ' -f2)
    while kill -0 "$launcher" 2>/dev/null; do
      sleep "$gap"
      kill -0 "$launcher" 2>/dev/null || break
      local kind=$((RANDOM % kinds)) victim="node-0$((RANDOM % nodes))"
      case $kind in
        0) pkill -9 -f -- "$out/run/cluster.toml --name $victim " && echo "$(now) kill $victim" >>"$out/faults.txt" ;;
        1) local p
           p=$(pgrep -f -- "$out/run/cluster.toml --name $victim ")
           [[ -n $p ]] && { echo "$(now) stop $victim" >>"$out/faults.txt"; kill -STOP $p; sleep 3; kill -CONT $p; } ;;
        2) local name="node-1$joined"
           joined=$((joined + 1))
           echo "$(now) join $name" >>"$out/faults.txt"
           "$tepdist" node "$out/run/cluster.toml" --name "$name" --join "$seed_addr" --set compute.threads=1 \
             >"$out/$name.log" 2>&1 &
           added+=($!) ;;
        3) local leaver
           leaver=$(for ((k = 0; k < joined; k++)); do pgrep -f -- "--name node-1$k " >/dev/null && echo "node-1$k"; done | head -1)
           [[ -n $leaver ]] && pkill -TERM -f -- "--name $leaver " && echo "$(now) leave $leaver" >>"$out/faults.txt" ;;
        4) pkill -USR2 -f -- "$out/run/cluster.toml --name $victim " && echo "$(now) crash $victim" >>"$out/faults.txt" ;;
        5) pkill -RTMIN -f -- "$out/run/cluster.toml --name $victim " && echo "$(now) hang $victim" >>"$out/faults.txt" ;;
      esac
    done
  fi
  wait "$launcher"
  echo $? >"$out/status"
  for p in "${added[@]}"; do kill -TERM "$p" 2>/dev/null; done
  wait 2>/dev/null
  added=()
}

echo "chaos: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), epochs: sync ${epochs_of[sync]}, async ${epochs_of[async]}, gossip ${epochs_of[gossip]}; faults every ${gap} s, $seeds seeds, schedule ${SCHEDULE:-constant}"
read -r -a modes <<< "${MODES:-sync gossip async}"
for mode in "${modes[@]}"; do
  for ((s = 1; s <= seeds; s++)); do
    run "$mode" 4 "$dir/$mode-$s-free4"
    run "$mode" 3 "$dir/$mode-$s-free3"
    run "$mode" 4 "$dir/$mode-$s-chaos" chaos "$s"
    echo "chaos: $mode seed $s: free4 exit $(cat "$dir/$mode-$s-free4/status"), free3 exit $(cat "$dir/$mode-$s-free3/status"), chaos exit $(cat "$dir/$mode-$s-chaos/status"), $(wc -l <"$dir/$mode-$s-chaos/faults.txt") faults"
  done
done

python3 - "$dir" "$seeds" "${modes[@]}" <<'EOF'
import glob, json, os, re, statistics, sys
from datetime import datetime
root, seeds, modes = sys.argv[1], int(sys.argv[2]), sys.argv[3:]

def stamp(line):  # node logs: "2026-11-30T17:37:02.562 ..." in local time
    return datetime.strptime(line[:23], "%Y-%m-%dT%H:%M:%S.%f").timestamp()

def result(d):
    f = os.path.join(d, "run", "result.json")
    return json.load(open(f)) if os.path.exists(f) else None

def med(v):
    return statistics.median(v) if v else float("nan")

rows = []
for mode in modes:
    done = 0
    accs_c, accs_f, goods4, goods3, kills, joins, hangs, unexplained, faults = [], [], [], [], [], [], [], 0, 0
    for s in range(1, seeds + 1):
        base = os.path.join(root, f"{mode}-{s}")
        free4, free3, chaos = (result(base + x) for x in ("-free4", "-free3", "-chaos"))
        lines = [l.split() for l in open(base + "-chaos/faults.txt")]
        faults += len(lines)
        if not chaos or not free4:
            continue
        done += 1
        accs_c.append(chaos["test_accuracy"]); accs_f.append(free4["test_accuracy"])
        goods4.append(free4["wall_seconds"] / chaos["wall_seconds"])
        if free3: goods3.append(free3["wall_seconds"] / chaos["wall_seconds"])
        logs = glob.glob(base + "-chaos/run/logs/node-*.log") + glob.glob(base + "-chaos/node-*.log")
        firsts, deaths, stops = [], [], []
        for log in logs:
            name = os.path.basename(log)
            for line in open(log, errors="replace"):
                if "generation_first_step" in line:
                    firsts.append((stamp(line), log))
                elif "member_dead" in line:
                    deaths.append((stamp(line), re.search(r"id=(\S+)", line).group(1)))
                elif "node_stopping" in line and "/run/logs/" in log:
                    stops.append(stamp(line))
        # The teardown: the job is over and the launcher stops its nodes (no fault stops them: a
        # leave is of a node this script added). A node the faults had stopped (SIGSTOP) across it
        # wakes to peers that are gone, and declares them dead: true, and not a failure.
        teardown = min(stops) if stops else float("inf")
        late = {who for t, who in deaths if t >= teardown}
        if late:
            print(f"chaos: {base}-chaos: declared dead after the teardown began (not counted): {', '.join(sorted(late))}")
        deaths = [(t, who) for t, who in deaths if t < teardown]
        for t, kind, node in ((float(a), b, c) for a, b, c in lines):
            if kind in ("kill", "crash"):  # both: the survivors' next committed step
                after = [f for f, _ in firsts if f > t]
                if after: kills.append(min(after) - t)
            if kind == "hang":
                after = [f for f, log in firsts if f > t and os.path.basename(log) != f"{node}.log"]
                if after: hangs.append(min(after) - t)
            if kind == "join":
                mine = [f for f, log in firsts if f > t and os.path.basename(log) == f"{node}.log"]
                if mine: joins.append(min(mine) - t)
        touched = {node for _, _, node in lines}
        started = float(open(base + "-chaos/started").read())
        for who in {who for t, who in deaths
                    # The partition, 25 to 29 s into the cluster's life, may make anyone dead for a while.
                    if who not in touched and not who.startswith("submitter") and not 20 <= t - started <= 40}:
            unexplained += 1
            when = sorted({round(t - started, 1) for t, w in deaths if w == who})
            with open(os.path.join(root, "unexplained"), "a") as out:
                out.write(f"{base}-chaos: {who} declared dead at {', '.join(f'{x:.1f}' for x in when)} s\n")
            print(f"chaos: unexplained death: {who} in {base}-chaos at {when[0]:.1f} s (its logs are kept)")
    rows.append((mode, f"{done}/{seeds}", med(accs_c), med(accs_f), med(goods4), med(goods3), med(kills),
                 len(kills), med(joins), len(joins), med(hangs), len(hangs), unexplained, faults))

print("\n| mode | completed | accuracy chaos / fault-free | goodput vs 4 / vs 3 workers | kill to next step (median, n) | join to first step (median, n) | hang to next step (median, n) | unexplained deaths | faults |")
print("|---|---|---|---|---|---|---|---|---|")
for m, c, ac, af, g4, g3, k, kn, j, jn, h, hn, u, f in rows:
    print(f"| {m} | {c} | {ac:.4f} / {af:.4f} | {g4:.2f} / {g3:.2f} | {k:.2f} s ({kn}) | {j:.2f} s ({jn}) | {h:.2f} s ({hn}) | {u} | {f} |")
EOF
