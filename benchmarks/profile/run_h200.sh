#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# benchmarks/profile/run_h200.sh: gpukit/profile on the GPU machine, in under 2 minutes, from the
# repo root (as benchmarks/run_h200.sh: build here with the h200 preset, carry build/h200 and
# .device-libs). Writes to $OUT (default out/profile):
#   tests.log       the profile tests (sim and GPU ones; the GPU ones attach the test NVTX tool)
#   doctor.txt      the doctor on the real GPU, and doctor.json
#   doctor_no_visible_device.txt  the doctor with CUDA_VISIBLE_DEVICES=none (the no-device diagnosis)
#   nvtx_bench.json / .txt   range cost with no tool attached, compiled out, and the range timer
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
OUT=${OUT:-out/profile}
mkdir -p "$OUT"
B=${B:-build/h200/bin}
export LD_LIBRARY_PATH=$PWD/.device-libs:${LD_LIBRARY_PATH:-}
unset NVTX_INJECTION64_PATH
step() { echo; echo "=== $* ($(date -u +%H:%M:%S))"; }

step device
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/device.txt"
date -u +%Y-%m-%d | tee -a "$OUT/device.txt"

step tests
for t in nvtx_ranges_test nvtx_disabled_test memory_annotation_test range_timer_test doctor_test profile_gpu_test; do
  echo "--- $t"
  timeout 60 "$B/tests/$t" 2>&1
  echo "exit $?"
done > "$OUT/tests.log" 2>&1
grep -E "^(---|exit)|test cases:|ERROR|FAILED" "$OUT/tests.log"

step doctor
timeout 30 "$B/tools/gpukit-doctor" | tee "$OUT/doctor.txt"
echo "doctor exit ${PIPESTATUS[0]}"
timeout 30 "$B/tools/gpukit-doctor" --json > "$OUT/doctor.json"
echo "doctor --json exit $?"
# The driver-too-old and no-device diagnoses as a user would see them (real CUDA, hidden devices).
CUDA_VISIBLE_DEVICES=none timeout 30 "$B/tools/gpukit-doctor" | tee "$OUT/doctor_no_visible_device.txt"
echo "doctor (CUDA_VISIBLE_DEVICES=none) exit ${PIPESTATUS[0]}"

step nvtx_bench
timeout 60 "$B/benchmarks/nvtx_bench" --benchmark_min_time=0.2 --benchmark_repetitions=5 \
  --benchmark_report_aggregates_only=true --benchmark_out="$OUT/nvtx_bench.json" \
  --benchmark_out_format=json 2>&1 | grep -E "median|Run on|nvtx_tool" | tee "$OUT/nvtx_bench.txt"
step done
