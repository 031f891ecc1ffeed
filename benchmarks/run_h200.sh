#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# benchmarks/run_h200.sh: what gpukit runs on the GPU machine, in one command, from the repo root.
#
# Build here first (cmake --preset h200 && cmake --build --preset h200) and take along
# build/h200 and .device-libs (../shared/device/carry-libs.sh .device-libs: Google Benchmark).
# Writes everything to $OUT (default: out/): the test log, replay JSON lines, allocator_bench
# JSON, PyTorch's allocator on the same workloads, and (with CAPTURE=1) a varying-shape trace.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
OUT=${OUT:-out}
mkdir -p "$OUT"
B=build/h200/bin
export LD_LIBRARY_PATH=$PWD/.device-libs:${LD_LIBRARY_PATH:-}
step() { echo; echo "=== $* ($(date -u +%H:%M:%S))"; }

step device
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/device.txt"
nvcc --version 2>/dev/null | tail -1 | tee -a "$OUT/device.txt"
date -u +%Y-%m-%d | tee -a "$OUT/device.txt"

if [[ ${TESTS:-1} == 1 ]]; then
  step tests
  scripts/run-test-binaries "$B/tests" > "$OUT/tests.log" 2>&1
  echo "run-test-binaries exit $?"
  grep -E "^(===|---)|test cases:|FAILED|ERROR" "$OUT/tests.log" | tail -60
fi

if [[ ${REPLAY:-1} == 1 ]]; then
  step replay
  for t in benchmarks/traces/*.trace; do
    for a in gpukit cuda_malloc_async cub cuda_malloc; do
      timeout 120 "$B/benchmarks/replay_trace" --trace "$t" --runtime cuda --allocator "$a" | tail -1
    done
    # Growable segments (virtual memory), at each page size of the large pool (VMM_PAGES).
    for p in ${VMM_PAGES:-8388608}; do
      timeout 120 "$B/benchmarks/replay_trace" --trace "$t" --runtime cuda --allocator gpukit_vmm \
        --page-bytes "$p" | tail -1 | sed "s/}\$/, \"page_bytes\": $p}/"
    done
    "$B/benchmarks/replay_trace" --trace "$t" --runtime sim | tail -1
    "$B/benchmarks/replay_trace" --trace "$t" --runtime sim --allocator gpukit_vmm | tail -1
  done | tee "$OUT/replay.jsonl"
fi

if [[ ${BENCH:-1} == 1 ]]; then
  step allocator_bench
  "$B/benchmarks/allocator_bench" --benchmark_filter="${BENCH_FILTER:-^(pair|threads|churn)/(gpukit|gpukit_recording|cudaMalloc|cudaMallocAsync|cub)/}" \
    --benchmark_min_time=0.2 --benchmark_repetitions=5 --benchmark_report_aggregates_only=true \
    --benchmark_out="$OUT/allocator_bench.json" --benchmark_out_format=json 2>&1 | grep -E "median|Run on|Load" | tee "$OUT/allocator_bench.txt"
fi
if [[ ${BENCH:-1} == 1 && ${TORCH:-1} == 1 ]]; then
  step torch_anchor
  T=$(python3 -c "import torch,os;print(os.path.dirname(torch.__file__))")
  g++ -O2 -std=c++17 benchmarks/memory/torch_anchor.cpp -I"$T/include" -I/usr/local/cuda/include -L"$T/lib" \
    -lc10 -lc10_cuda -Wl,-rpath,"$T/lib" -L/usr/local/cuda/lib64 -lcudart -o /tmp/torch_anchor &&
    /tmp/torch_anchor | tee "$OUT/torch_anchor.txt"
fi

if [[ ${HISTORY:-1} == 1 ]]; then
  step memory_report and PyTorch memory_viz
  mkdir -p "$OUT/history"
  "$B/examples/memory_report" --out "$OUT/history"
  python3 -m torch.cuda._memory_viz trace_plot "$OUT/history/memory.pickle" -o "$OUT/history/trace_plot.html" &&
    python3 -m torch.cuda._memory_viz segment_plot "$OUT/history/memory.pickle" -o "$OUT/history/segment_plot.html" &&
    python3 -m torch.cuda._memory_viz stats "$OUT/history/memory.pickle" 2>&1 | tail -5
  ls -la "$OUT/history"
fi

if [[ ${SANITIZER:-1} == 1 ]]; then
  step compute-sanitizer sees an overflow inside a segment only with NVTX memory annotation
  CS=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
  for arg in "" --no-annotate; do
    echo "--- compute-sanitizer --tool memcheck --nvtx yes sanitizer_overflow $arg"
    timeout 120 "$CS" --tool memcheck --nvtx yes "$B/examples/sanitizer_overflow" $arg 2>&1 | tee "$OUT/sanitizer${arg}.txt" |
      grep -E "Invalid|ERROR SUMMARY|sanitizer_overflow:" | head -8
  done
fi

if [[ ${CAPTURE:-0} == 1 ]]; then
  step capture llama_varlen
  PYTHONUNBUFFERED=1 timeout 200 python3 benchmarks/traces/capture_trace.py llama_varlen "$OUT" 2>&1 | tail -3
  PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True PYTHONUNBUFFERED=1 timeout 150 \
    python3 benchmarks/traces/capture_trace.py llama_varlen "$OUT" 2>&1 | tail -2
  if [[ -f "$OUT/llama_varlen.trace" ]]; then
    for a in gpukit cuda_malloc_async; do
      "$B/benchmarks/replay_trace" --trace "$OUT/llama_varlen.trace" --runtime cuda --allocator "$a" | tail -1
    done | tee -a "$OUT/replay.jsonl"
  fi
fi
step done
