#!/usr/bin/env bash
# The GPU check, in two halves.
#
#   scripts/gpu-check.sh --prepare [BUILD]   here, on a development machine with CUDA but no GPU:
#       builds tepdist_cuda_tests and tepdist_gpu_bench (the core and the cuda backend only, none
#       of the Debian libraries the GPU machine lacks) and copies them, with libfmt, into .gpu/
#       (ignored by git; the device tool carries it with `carry: [".gpu"]`).
#   scripts/gpu-check.sh                     on the GPU machine, from the repository root, in one
#       call of under 4 minutes: the [cuda] tests, then LeNet and the wider CNN for a fixed number
#       of steps on tepdist's cuda backend and in PyTorch on the same GPU, and a table of both.
#       Full output goes under $OUT (the device tool brings it back), else under .gpu/out.
set -euo pipefail
cd "$(dirname "$0")/.."

if [[ "${1:-}" == "--prepare" ]]; then
  build=${2:-build}
  cmake --build "$build" -j2 --target tepdist_cuda_tests tepdist_gpu_bench
  rm -rf .gpu && mkdir -p .gpu/lib
  cp "$build/tests/tepdist_cuda_tests" "$build/bench/tepdist_gpu_bench" .gpu/
  cp -L /usr/lib/x86_64-linux-gnu/libfmt.so.9 .gpu/lib/
  # The tepdist binary itself, with the Debian libraries it links (CAF, Cap'n Proto, libuv, oneDNN,
  # OpenSSL, ...) but not the C runtime or CUDA's, packed small: the GPU machine then runs
  # `tepdist train` and a two-node `tepdist run` on the cuda backend.
  if [[ -x "$build/cli/tepdist" ]]; then
    stage=$(mktemp -d)
    mkdir -p "$stage/lib"
    cp "$build/cli/tepdist" "$stage/"
    ldd "$build/cli/tepdist" | awk '$3 ~ /^\// {print $3}' \
      | grep -v -E '/(libc|libm|libstdc\+\+|libgcc_s|libpthread|librt|libdl|ld-linux[^/]*)\.so|/usr/local/cuda' \
      | xargs -r -I{} cp -L {} "$stage/lib/"
    tar -C "$stage" -cf - . | xz -T2 -3 > .gpu/tepdist.tar.xz
    rm -rf "$stage"
  fi
  grep -qx '/.gpu/' .git/info/exclude 2>/dev/null || echo '/.gpu/' >> .git/info/exclude
  du -sh .gpu
  echo "carried: $(ls .gpu .gpu/lib | tr '\n' ' ')"
  echo "their libraries besides the C runtime (cuDNN, cuBLAS, NCCL come from the GPU machine):"
  ldd .gpu/tepdist_cuda_tests | grep -v -E 'linux-vdso|libc.so|libm.so|ld-linux|libgcc_s|libstdc|libpthread|libdl|librt'
  exit 0
fi

out=${OUT:-.gpu/out}
mkdir -p "$out"
steps=${STEPS:-300}
[[ -x .gpu/tepdist_cuda_tests ]] || { echo "gpu-check: .gpu/tepdist_cuda_tests missing: run scripts/gpu-check.sh --prepare first" >&2; exit 2; }

# cuDNN, cuBLAS and NCCL: the system's where it has them, else PyTorch's wheels.
libdirs=$(find /usr/local/cuda*/targets/*/lib /usr/lib/x86_64-linux-gnu /opt -maxdepth 7 \
  \( -name 'libcudnn.so.9' -o -name 'libcublas.so.13' -o -name 'libnccl.so.2' \) 2>/dev/null | xargs -r -n1 dirname | awk '!seen[$0]++' | tr '\n' ':')
plain_path=${LD_LIBRARY_PATH:-}  # PyTorch loads its own cuDNN: it runs with the path as it was
export LD_LIBRARY_PATH="${libdirs}${LD_LIBRARY_PATH:-}:$PWD/.gpu/lib"

{
  date -u +"gpu-check %Y-%m-%d %H:%M UTC"
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm --format=csv,noheader
  echo "libraries: $LD_LIBRARY_PATH"
} | tee "$out/machine.txt"

set +e
timeout 150 .gpu/tepdist_cuda_tests '[cuda]' --durations yes 2>&1 | tee "$out/cuda_tests.txt"
tests_rc=${PIPESTATUS[0]}
timeout 90 .gpu/tepdist_gpu_bench "$steps" 2>&1 | tee "$out/tepdist.jsonl"
LD_LIBRARY_PATH=$plain_path PYTHONUNBUFFERED=1 timeout 90 python3 -W ignore bench/gpu_torch.py "$steps" 2>"$out/torch.err" \
  | tee "$out/torch.jsonl"
tail -3 "$out/torch.err"
set -e

# The product on the GPU: `tepdist train` and two-node sync and gossip `tepdist run`s (each worker's
# state on the device: sync's gradient comes down for the ring and the average goes back up), on
# synthetic data (no data set is carried).
if [[ -f .gpu/tepdist.tar.xz ]]; then
  td=$(mktemp -d)
  tar -C "$td" -xJf .gpu/tepdist.tar.xz
  LD_LIBRARY_PATH="$td/lib:$LD_LIBRARY_PATH" timeout 60 "$td/tepdist" train configs/gpu.toml --set data.dataset=synthetic \
    --epochs 2 --out "$out/train" > "$out/train.log" 2>&1
  echo "tepdist train (cuda, synthetic): exit $?; $(grep -E '^(compute path|training state|done)' "$out/train.log" | cut -c1-300)"
  # The sync points of a checkpoint: one epoch, then --resume to the second, must end with the
  # model of the two epochs run straight, bit for bit (the algorithms are deterministic).
  LD_LIBRARY_PATH="$td/lib:$LD_LIBRARY_PATH" timeout 60 "$td/tepdist" train configs/gpu.toml --set data.dataset=synthetic \
    --epochs 1 --out "$out/resumed" > "$out/resume.log" 2>&1 &&
    LD_LIBRARY_PATH="$td/lib:$LD_LIBRARY_PATH" timeout 60 "$td/tepdist" train configs/gpu.toml --set data.dataset=synthetic \
      --epochs 2 --resume --out "$out/resumed" >> "$out/resume.log" 2>&1
  echo "tepdist train, 1 epoch then --resume to 2: exit $?; the model $(cmp -s "$out/train/model.safetensors" \
    "$out/resumed/model.safetensors" && echo 'equals' || echo 'DIFFERS from') the straight run's"
  LD_LIBRARY_PATH="$td/lib:$LD_LIBRARY_PATH" timeout 90 "$td/tepdist" run configs/quickstart.toml --nodes 2 \
    --set compute.backend=cuda --set data.dataset=synthetic --set job.max_steps=150 --set job.eval_every_steps=0 \
    --out "$out/run" > "$out/run.log" 2>&1
  echo "tepdist run (2 nodes, sync, cuda, synthetic): exit $?; $(tail -2 "$out/run.log" | cut -c1-300)"
  echo "  where each worker kept its state: $(grep -h -o 'training_state .*' "$out"/run/logs/node-*.log | sort -u | cut -c1-200)"
  python3 -c "import json, sys; r = json.load(open(sys.argv[1])); c = {w['parameter_checksum'] for w in r['workers']}; \
print('  replicas:', 'bit-identical' if len(c) == 1 else 'DIFFER', sorted(c), 'test accuracy', r['test_accuracy'])" \
    "$out/run/result.json" || echo "  no result.json"
  # Gossip keeps its state on the device too: local steps move only the batch and the loss, a
  # mixing brings the parameters down once and sends the mixed ones up once.
  rc=0
  LD_LIBRARY_PATH="$td/lib:$LD_LIBRARY_PATH" timeout 90 "$td/tepdist" run configs/quickstart.toml --nodes 2 --mode gossip \
    --set compute.backend=cuda --set data.dataset=synthetic --set job.max_steps=150 --set job.eval_every_steps=0 \
    --out "$out/gossip" > "$out/gossip.log" 2>&1 || rc=$?
  echo "tepdist run (2 nodes, gossip, cuda, synthetic): exit $rc; $(tail -2 "$out/gossip.log" | cut -c1-300)"
  echo "  where each worker kept its state: $(grep -h -o 'training_state .*' "$out"/gossip/logs/node-*.log | sort -u | cut -c1-200)"
  python3 -c "import json, sys; r = json.load(open(sys.argv[1])); c = {w['parameter_checksum'] for w in r['workers']}; \
print('  final average:', 'bit-identical' if len(c) == 1 else 'DIFFER', 'exchanges', r.get('gossip_exchanges'), 'test accuracy', r['test_accuracy'])" \
    "$out/gossip/result.json" || echo "  no result.json"
  rm -rf "$td"
fi

python3 - "$out" <<'PY'
import json, sys, pathlib
out = pathlib.Path(sys.argv[1])
def rows(name):
    r = []
    for line in (out / name).read_text().splitlines():
        try:
            d = json.loads(line)
        except ValueError:
            continue
        if "model" in d:
            r.append(d)
    return r
ours = {(d["model"], d["batch"]): d for d in rows("tepdist.jsonl")}
torch = {(d["model"], d["batch"], d["math"]): d for d in rows("torch.jsonl")}
print("\nmodel    batch  tepdist cuda (fp32)  of fp32 peak  host-level  non-deterministic  pytorch fp32  ratio  pytorch default (tf32 convs)")
for (model, batch), d in sorted(ours.items()):
    t = torch.get((model, batch, "fp32"), {}).get("samples_per_s", float("nan"))
    t2 = torch.get((model, batch, "default (tf32 convolutions)"), {}).get("samples_per_s", float("nan"))
    print(f"{model:8} {batch:5}  {d['samples_per_s']:17.0f}/s  {d['fraction_of_fp32_peak']:11.2%}  "
          f"{d['host_level_samples_per_s']:8.0f}/s  {d['fastest_samples_per_s']:15.0f}/s  {t:10.0f}/s  "
          f"{d['samples_per_s'] / t:5.2f}  {t2:10.0f}/s")
PY
echo "cuda tests exit code: $tests_rc"
exit "$tests_rc"
