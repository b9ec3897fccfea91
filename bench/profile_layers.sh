#!/usr/bin/env bash
# Where a LeNet training step's time goes, per oneDNN primitive, and the achieved FLOP/s against
# the machine's peak. Uses oneDNN's own instrumentation (ONEDNN_VERBOSE=1 prints every primitive
# execution with its time) on a short `tepdist train` run, skipping the first 20 steps (warm-up).
#
# The plans' own AVX2 kernels (the fused first convolution and pool, the blocked 2x2 pool) do not
# appear in oneDNN's log: their time is in the gap between the primitives' total and the step.
#
# Usage: [THREADS=N] bench/profile_layers.sh [BUILD_DIR] [STEPS]   (defaults: all cores, build 220)
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
steps=${2:-220}
out=$(mktemp -d /tmp/tepdist-profile.XXXXXX)
trap 'rm -rf "$out"' EXIT

ONEDNN_VERBOSE=1 "$build/cli/tepdist" train ${THREADS:+--threads $THREADS} --set "job.max_steps=$steps" --set job.log_every_steps=1000000 \
  --out "$out/run" > "$out/verbose.log"
# A second, quiet run gives the step rate without the logging's own cost.
"$build/cli/tepdist" train ${THREADS:+--threads $THREADS} --set "job.max_steps=$steps" --out "$out/quiet" > /dev/null

python3 - "$out" "$steps" <<'PY'
import collections, json, os, sys
out, steps = sys.argv[1], int(sys.argv[2])
warm = 20
rows = collections.OrderedDict()
execs = 0
for line in open(f"{out}/verbose.log"):
    if not line.startswith("onednn_verbose,exec,cpu,"):
        continue
    f = line.strip().split(",")
    prim, impl, prop, shape, ms = f[3], f[4], f[5], f[-2], float(f[-1])
    key = (prim, prop, shape)
    rows.setdefault(key, [0.0, 0, impl])
    rows[key][0] += ms
    rows[key][1] += 1
# Every primitive runs once per training step (evaluation batches have other shapes and are
# dropped below by keeping only shapes seen about once per step); scale to per-step time.
per_step = {k: (v[0] / v[1], v[1], v[2]) for k, v in rows.items() if v[1] >= steps - 1}
total = sum(t for t, _, _ in per_step.values())
print(f"per training step at batch 64 (mean over {steps} steps, oneDNN's own timer):")
print(f"{'ms':>7} {'share':>6}  primitive")
for (prim, prop, shape), (t, n, impl) in sorted(per_step.items(), key=lambda kv: -kv[1][0]):
    print(f"{t:7.3f} {100 * t / total:5.1f}%  {prim} {prop} {impl} {shape}")
print(f"{total:7.3f} ms in primitives per step")
r = json.load(open(f"{out}/quiet/result.json"))
sps = r["samples_per_second"]
step_ms = 64 / sps * 1000
flops = 13.2e6 * sps
cores = int(os.environ.get("THREADS") or os.cpu_count())  # the cores the run used
mhz = max(float(l.split(":")[1]) for l in open("/proc/cpuinfo") if l.startswith("cpu MHz"))
peak = cores * mhz * 1e6 * 32  # AVX2: 2 FMA units x 8 floats x 2 FLOP per cycle per core
print(f"quiet run: {sps:.0f} samples/s = {step_ms:.2f} ms per step ({100 * total / step_ms:.0f}% of it in oneDNN primitives)")
print(f"achieved {flops / 1e9:.1f} GFLOP/s at 13.2 MFLOP per sample; peak {peak / 1e9:.1f} GFLOP/s "
      f"({cores} cores x {mhz:.0f} MHz x 32 FLOP/cycle) -> {100 * flops / peak:.1f}% of peak")
PY
