#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# benchmarks/transfer/run_h200.sh: the pinned pool and transfer pipeline on the GPU machine, in one
# command from the repo root. Finishes in about 6 minutes (SWEEP=0: about 3).
#
# Build here first (cmake --preset h200 && cmake --build --preset h200) and take along build/h200
# and .device-libs (Google Benchmark), as for benchmarks/run_h200.sh. Writes to $OUT (default:
# out/): device.txt, transfer_gpu_test.log, transfer_bench.{txt,json} (with pool growth rates),
# summary.txt, torch_pin_anchor.txt (PyTorch's pin_memory + non_blocking copy, when PyTorch
# imports), sweep.{txt,json} + sweep_summary.txt (the staging knobs over a grid, SWEEP=1),
# copy_compute_{32,128}.txt (copy-plus-compute overlap) and prefetch_training_loop.txt.
# BENCH_ARGS passes staging knobs to transfer_bench (e.g. "--chunk_kib=8192 --copy=nt"; see the
# top of benchmarks/transfer/transfer_bench.cpp); SWEEP_ARGS narrows the sweep's grid.
# Parts, each on unless set to 0: TESTS (GPU tests and the example), BENCH (transfer_bench and its
# summary), TORCH, SWEEP, COPY_COMPUTE. Two calls under 10 minutes each: SWEEP=0, then
# TESTS=0 BENCH=0 TORCH=0 COPY_COMPUTE=0.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
OUT=${OUT:-out}
mkdir -p "$OUT"
B=${B:-build/h200/bin}
export LD_LIBRARY_PATH=$PWD/.device-libs:${LD_LIBRARY_PATH:-}
step() { echo; echo "=== $* ($(date -u +%H:%M:%S))"; }

step device
{
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  nvcc --version 2>/dev/null | tail -1
  echo "host: $(nproc) CPUs, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)"
  echo "NUMA nodes: $(ls -d /sys/devices/system/node/node* 2>/dev/null | wc -l);" \
    "transparent huge pages: $(cat /sys/kernel/mm/transparent_hugepage/enabled 2>/dev/null)"
  echo "locked memory limit: $(ulimit -l)"
  date -u +%Y-%m-%d
} | tee "$OUT/device.txt"

if [[ ${TESTS:-1} == 1 ]]; then
step transfer_gpu_test
timeout 120 "$B/tests/transfer_gpu_test" > "$OUT/transfer_gpu_test.log" 2>&1
echo "transfer_gpu_test exit $?"
grep -E "test cases:|assertions:|ERROR|FAILED" "$OUT/transfer_gpu_test.log" | tail -20

step prefetch_training_loop
timeout 60 "$B/examples/prefetch_training_loop" 2>&1 | tee "$OUT/prefetch_training_loop.txt"
fi

if [[ ${BENCH:-1} == 1 ]]; then
step transfer_bench
# Medians of 3 repetitions; bytes_per_second is the figure (manual time: CUDA events).
# shellcheck disable=SC2086
timeout 300 "$B/benchmarks/transfer_bench" ${BENCH_ARGS:-} --benchmark_filter="${BENCH_FILTER:-.}" \
  --benchmark_min_time=0.1 --benchmark_repetitions=3 --benchmark_report_aggregates_only=true \
  --benchmark_out="$OUT/transfer_bench.json" --benchmark_out_format=json 2>&1 |
  grep -E "median|Run on|Load|no usable" | tee "$OUT/transfer_bench.txt"
echo "transfer_bench exit ${PIPESTATUS[0]}"
fi

if [[ ${TORCH:-1} != 1 ]]; then
  :
elif python3 -c 'import torch' 2>/dev/null; then
  step torch_pin_anchor
  # PyTorch's pin_memory() + .to('cuda', non_blocking=True), same units as the summary below.
  timeout 180 python3 benchmarks/transfer/torch_pin_anchor.py --sizes-mib 512,1024 --reps 5 2>&1 |
    tee "$OUT/torch_pin_anchor.txt"
else
  echo "(PyTorch does not import: no torch_pin_anchor)"
fi

if [[ ${SWEEP:-1} == 1 ]]; then
  step transfer_sweep
  # The staging knobs (threads x chunk x guided min piece x non-temporal copies) on 1 GiB pageable
  # host -> device, and the host memcpy ceiling beside them. One pipeline at a time.
  # shellcheck disable=SC2086
  timeout 420 "$B/benchmarks/transfer_bench" ${BENCH_ARGS:-} --sweep ${SWEEP_ARGS:-} \
    --benchmark_filter='^(sweep/|ceiling/)' --benchmark_min_time=0.1 --benchmark_repetitions=3 \
    --benchmark_report_aggregates_only=true --benchmark_out="$OUT/sweep.json" \
    --benchmark_out_format=json 2>&1 | grep -E "median|no usable" > "$OUT/sweep.txt"
  echo "sweep exit ${PIPESTATUS[0]}"
  python3 - "$OUT/sweep.json" <<'PY' | tee "$OUT/sweep_summary.txt"
import json, sys
try:
    runs = json.load(open(sys.argv[1]))["benchmarks"]
except Exception as e:
    sys.exit(f"no sweep JSON: {e}")
med = [r for r in runs if r.get("aggregate_name") == "median" and "bytes_per_second" in r]
ceil = max((r["bytes_per_second"] for r in med if r["run_name"].startswith("ceiling/")), default=0)
sweep = sorted((r for r in med if r["run_name"].startswith("sweep/")),
               key=lambda r: -r["bytes_per_second"])
print(f"host memcpy ceiling (best thread count): {ceil / 1e9:.1f} GB/s")
for r in sweep:
    gb = r["bytes_per_second"] / 1e9
    share = f"{100 * r['bytes_per_second'] / ceil:5.1f}% of ceiling" if ceil else ""
    print(f"{r['run_name']:80s} {gb:6.1f} GB/s {share}")
PY
fi

if [[ ${COPY_COMPUTE:-1} == 1 ]]; then
  step copy_compute
  # Loops of 64 MiB batches through the prefetcher, each followed by a kernel on another stream:
  # total vs max(copy alone, compute alone), target <= 1.05. 32 batches (the fill, one batch's copy
  # before the first kernel, is 1/32 of the balanced case) and 128 (an epoch's worth: the fill
  # amortized), each with --timeline (where each case's time went).
  for n in 32 128; do
    timeout 240 "$B/benchmarks/copy_compute_bench" --batches=$n --batch_mib=64 --reps=5 \
      --timeline 2>&1 | tee "$OUT/copy_compute_$n.txt"
    echo "copy_compute_bench --batches=$n exit ${PIPESTATUS[0]}"
  done
fi

[[ ${BENCH:-1} == 1 ]] && step summary
# GB/s per benchmark (median), for the README table: pipeline vs the anchors, and the ceiling.
[[ ${BENCH:-1} == 1 ]] && python3 - "$OUT/transfer_bench.json" <<'PY' | tee "$OUT/summary.txt"
import json, sys
try:
    runs = json.load(open(sys.argv[1]))["benchmarks"]
except Exception as e:
    sys.exit(f"no benchmark JSON: {e}")
for r in runs:
    if r.get("aggregate_name") != "median":
        continue
    name = r["run_name"]
    if "bytes_per_second" in r:
        unit = "GB/s pinned" if name.startswith("grow/") else "GB/s"
        print(f"{name:60s} {r['bytes_per_second'] / 1e9:8.1f} {unit}")
    elif "items_per_second" in r:
        print(f"{name:60s} {1e9 / r['items_per_second']:10.0f} ns per acquire+release")
PY
step done
