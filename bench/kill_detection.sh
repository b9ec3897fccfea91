#!/usr/bin/env bash
# Kill to everyone-knows on a real cluster: five `tepdist node` processes on loopback with the
# default LAN knobs; ROUNDS times, one node (not the seed) is killed with SIGKILL and the time until
# every other node logs it dead is measured, then it is restarted and taken back. Prints each
# round's time, the median, and any false death (a member_dead about a node not killed).
#
#   bench/kill_detection.sh [BUILD_DIR] [ROUNDS] [HOGS]     (defaults: build 10 0)
#
# HOGS busy loops run beside the cluster for the whole run (a loaded machine).
set -uo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
rounds=${2:-10}
hogs=${3:-0}
tepdist="$build/cli/tepdist"
[[ -x $tepdist ]] || { echo "kill_detection: $tepdist not built" >&2; exit 2; }
dir=$(mktemp -d /tmp/tepdist-kill.XXXXXX)
declare -A pid mark
hog_pids=()
cleanup() {
  for p in "${pid[@]}" "${hog_pids[@]}"; do kill -9 "$p" 2>/dev/null; done
  wait 2>/dev/null
  [[ ${KEEP:-0} == 1 ]] && echo "kill_detection: logs in $dir" || rm -rf "$dir"
}
trap cleanup EXIT
printf 'kill detection bench secret\n' >"$dir/secret"
chmod 600 "$dir/secret"
for ((h = 0; h < hogs; h++)); do
  sh -c 'while :; do :; done' &
  hog_pids+=($!)
done

start() {  # start NAME [SEED]: appends to the node's log
  local name=$1 seed=${2:-}
  local args=(node --set "cluster.secret_file=$dir/secret" --name "$name" --listen 127.0.0.1:0 --ready-file "$dir/$name.ready")
  [[ -n $seed ]] && args+=(--join "$seed")
  rm -f "$dir/$name.ready"
  "$tepdist" "${args[@]}" >>"$dir/$name.log" 2>&1 &
  pid[$name]=$!
  for _ in $(seq 200); do [[ -s $dir/$name.ready ]] && break; sleep 0.05; done
}
# wait_for PATTERN COUNT LIMIT_S FILES...: until COUNT of FILES hold PATTERN; prints the seconds.
wait_for() {
  local pattern=$1 count=$2 limit=$3
  shift 3
  local t0=$SECONDS
  while ((SECONDS - t0 < limit)); do
    (($(grep -l -- "$pattern" "$@" 2>/dev/null | wc -l) >= count)) && return 0
    sleep 0.02
  done
  return 1
}
seen_since() {  # PATTERN EXCEPT: how many nodes but EXCEPT logged PATTERN since their mark
  local n count=0
  for n in n1 n2 n3 n4 n5; do
    # Not `tail | grep -q` under pipefail: grep leaving at its first match fails tail's next write.
    [[ $n != "$2" ]] && grep -q -- "$1" < <(tail -n +"$((mark[$n] + 1))" "$dir/$n.log") && count=$((count + 1))
  done
  echo $count
}
log_ms() {  # the first line of FILE matching PATTERN after line N, as ms since the epoch
  local file=$1 pattern=$2 after=$3
  local stamp
  stamp=$(tail -n +"$((after + 1))" "$file" | grep -m1 -- "$pattern" | cut -d' ' -f1)
  [[ -n $stamp ]] && date -d "${stamp/T/ }" +%s%3N
}

start n1
seed=$(head -1 "$dir/n1.ready")
for n in n2 n3 n4 n5; do start $n "$seed"; done
wait_for "view members=5" 5 30 "$dir"/n?.log || { echo "kill_detection: the cluster did not form" >&2; exit 1; }

times=()
for ((r = 1; r <= rounds; r++)); do
  victim=n$((2 + RANDOM % 4))
  for n in n1 n2 n3 n4 n5; do mark[$n]=$(wc -l <"$dir/$n.log"); done
  killed_at=$(date +%s%3N)
  kill -9 "${pid[$victim]}"
  wait "${pid[$victim]}" 2>/dev/null
  t0=$SECONDS
  until (($(seen_since "member_dead id=$victim" "$victim") == 4)); do
    ((SECONDS - t0 > 30)) && { echo "kill_detection: round $r: $victim not known dead by all within 30 s" >&2; exit 1; }
    sleep 0.02
  done
  last=0
  for n in n1 n2 n3 n4 n5; do
    [[ $n == "$victim" ]] && continue
    t=$(log_ms "$dir/$n.log" "member_dead id=$victim" "${mark[$n]}")
    ((t > last)) && last=$t
  done
  times+=("$(((last - killed_at)))")
  echo "kill_detection: round $r: $victim known dead by all after $((last - killed_at)) ms"
  start "$victim" "$seed"
  # Taken back by all before the next kill: each other node logs the victim joined again.
  t0=$SECONDS
  until (($(seen_since "member_joined id=$victim" "$victim") == 4)); do
    ((SECONDS - t0 > 30)) && { echo "kill_detection: round $r: $victim not taken back within 30 s" >&2; exit 1; }
    sleep 0.05
  done
done
median=$(printf '%s\n' "${times[@]}" | sort -n | awk '{a[NR]=$1} END {print (NR % 2 ? a[(NR+1)/2] : (a[NR/2] + a[NR/2+1]) / 2)}')
# Each kill is one member_dead line on each of the four others; any more is a live node declared dead.
deaths=$(cat "$dir"/n?.log | grep -c "member_dead")
echo "kill_detection: median $median ms over $rounds rounds (hogs: $hogs); false deaths: $((deaths - 4 * rounds))"
((deaths == 4 * rounds))
