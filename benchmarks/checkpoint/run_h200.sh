#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# benchmarks/checkpoint/run_h200.sh: activation checkpointing on the GPU machine, in one command
# from the repo root. Finishes in about 2 minutes.
#
# Build here first (cmake --preset h200 && cmake --build --preset h200) and take along build/h200
# (and .device-libs for Google Benchmark, as for benchmarks/run_h200.sh). Writes to $OUT (default:
# out/): device.txt; checkpoint_mlp.txt (the table over plans and budgets: peak memory from the
# caching allocator, step time, the bit-for-bit gradient check, offload against store-all) and
# checkpoint_mlp_large.txt (a larger batch, where each layer computes longer); tests.log (the
# checkpoint tests and the example's --quick run through CTest's binaries); planner_bench.txt
# (planning time, host only). Exit status: non-zero when a check failed.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
OUT=${OUT:-out}
mkdir -p "$OUT"
B=${B:-build/h200/bin}
export LD_LIBRARY_PATH=$PWD/.device-libs:${LD_LIBRARY_PATH:-}
step() { echo; echo "=== $* ($(date -u +%H:%M:%S))"; }
status=0

step device
{
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  nvcc --version 2>/dev/null | tail -1
  echo "host: $(nproc) CPUs, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)"
  date -u +%Y-%m-%d
} | tee "$OUT/device.txt"

step checkpoint tests
{
  timeout 300 "$B/tests/checkpoint_executor_test"; echo "checkpoint_executor_test exit $?"
  timeout 300 "$B/tests/checkpoint_planners_test"; echo "checkpoint_planners_test exit $?"
  timeout 120 "$B/examples/checkpoint_mlp" --quick; echo "checkpoint_mlp --quick exit $?"
} > "$OUT/tests.log" 2>&1
grep -E "test cases:|exit|ERROR|FAILED" "$OUT/tests.log"
grep -Eq "exit [^0]" "$OUT/tests.log" && status=1

step checkpoint_mlp
timeout 300 "$B/examples/checkpoint_mlp" 2>&1 | tee "$OUT/checkpoint_mlp.txt"
rc=${PIPESTATUS[0]}; echo "checkpoint_mlp exit $rc"; [[ $rc == 0 ]] || status=1

step checkpoint_mlp, batch 4096
timeout 300 "$B/examples/checkpoint_mlp" --batch 4096 --reps 3 2>&1 | tee "$OUT/checkpoint_mlp_large.txt"
rc=${PIPESTATUS[0]}; echo "checkpoint_mlp --batch 4096 exit $rc"; [[ $rc == 0 ]] || status=1

if [[ -x "$B/benchmarks/planner_bench" ]]; then
  step planner_bench
  timeout 120 "$B/benchmarks/planner_bench" --benchmark_filter='optimal' --benchmark_repetitions=3 \
    --benchmark_report_aggregates_only=true 2>&1 | grep -E "median|Run on|error" | tee "$OUT/planner_bench.txt"
fi
echo; echo "run_h200.sh (checkpoint) status $status"
exit $status
