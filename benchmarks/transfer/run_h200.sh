#!/usr/bin/env bash
# benchmarks/transfer/run_h200.sh: the pinned pool and transfer pipeline on the GPU machine, in one
# command from the repo root (issue 6). Finishes in under 3 minutes.
#
# Build here first (cmake --preset h200 && cmake --build --preset h200) and take along build/h200
# and .device-libs (Google Benchmark), as for benchmarks/run_h200.sh. Writes to $OUT (default:
# out/): device.txt, transfer_gpu_test.log, transfer_bench.{txt,json}, prefetch_training_loop.txt.
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
  date -u +%Y-%m-%d
} | tee "$OUT/device.txt"

step transfer_gpu_test
timeout 120 "$B/tests/transfer_gpu_test" > "$OUT/transfer_gpu_test.log" 2>&1
echo "transfer_gpu_test exit $?"
grep -E "test cases:|assertions:|ERROR|FAILED" "$OUT/transfer_gpu_test.log" | tail -20

step prefetch_training_loop
timeout 60 "$B/examples/prefetch_training_loop" 2>&1 | tee "$OUT/prefetch_training_loop.txt"

step transfer_bench
# Medians of 3 repetitions; bytes_per_second is the figure (manual time: CUDA events).
timeout 150 "$B/benchmarks/transfer_bench" --benchmark_filter="${BENCH_FILTER:-.}" \
  --benchmark_min_time=0.1 --benchmark_repetitions=3 --benchmark_report_aggregates_only=true \
  --benchmark_out="$OUT/transfer_bench.json" --benchmark_out_format=json 2>&1 |
  grep -E "median|Run on|Load|no usable" | tee "$OUT/transfer_bench.txt"
echo "transfer_bench exit ${PIPESTATUS[0]}"

step summary
# GB/s per benchmark (median), for the README table: pipeline vs the anchors, and the ceiling.
python3 - "$OUT/transfer_bench.json" <<'PY' | tee "$OUT/summary.txt"
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
        print(f"{name:60s} {r['bytes_per_second'] / 1e9:8.1f} GB/s")
    elif "items_per_second" in r:
        print(f"{name:60s} {1e9 / r['items_per_second']:10.0f} ns per acquire+release")
PY
step done
