#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# benchmarks/check_h200.sh: the checks of one H200 session in one command. Every GPU test binary
# built into $BIN (default build/h200/bin), the demo and gpukit-doctor, the ownership stress test
# at a larger scale (GPUKIT_OWNERSHIP_ROUNDS), and allocator_bench's gpukit rows of this tree
# against a baseline binary ($BIN/benchmarks/allocator_bench_base, built from an earlier commit),
# alternating, so the two are compared in one run. Results go to $OUT; summary.txt lists every exit
# status. Google Benchmark's library is taken from $BIN/libs (shared/device/carry-libs.sh).
set -u
bin="${BIN:-build/h200/bin}"
out="${OUT:?set OUT}"
export LD_LIBRARY_PATH="$bin/libs:${LD_LIBRARY_PATH:-}"
mkdir -p "$out"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv >"$out/device.txt" 2>&1
summary="$out/summary.txt"
for t in "$bin"/tests/*_test; do
  name="$(basename "$t")"
  [[ "$name" == ownership_test ]] && continue
  start=$SECONDS
  timeout 240 "$t" >"$out/$name.log" 2>&1
  rc=$?
  echo "$name exit $rc ($((SECONDS - start)) s): $(grep -a 'test cases:' "$out/$name.log" | tail -1)" |
    tee -a "$summary"
done
if [[ -x "$bin/tests/ownership_test" ]]; then
  GPUKIT_OWNERSHIP_ROUNDS="${GPUKIT_OWNERSHIP_ROUNDS:-20000}" GPUKIT_OWNERSHIP_SECONDS=60 \
    timeout 200 "$bin/tests/ownership_test" >"$out/ownership_test.log" 2>&1
  echo "ownership_test exit $? : $(grep -a 'ownership stress' "$out/ownership_test.log")" |
    tee -a "$summary"
fi
for p in examples/demo tools/gpukit-doctor; do
  [[ -x "$bin/$p" ]] || continue
  timeout 120 "$bin/$p" >"$out/$(basename "$p").log" 2>&1
  echo "$p exit $?" | tee -a "$summary"
done
filter='^(pair/gpukit/65536|threads/gpukit/|churn/gpukit/)'
if [[ -x "$bin/benchmarks/allocator_bench" && -x "$bin/benchmarks/allocator_bench_base" ]]; then
  for round in 1 2 3; do
    for v in base new; do
      b="$bin/benchmarks/allocator_bench"
      [[ $v == base ]] && b="${b}_base"
      timeout 120 "$b" --benchmark_filter="$filter" --benchmark_min_time=0.3 \
        --benchmark_format=json >"$out/allocator_bench_${v}_$round.json" 2>"$out/allocator_bench_${v}_$round.err"
      echo "allocator_bench $v round $round exit $?" | tee -a "$summary"
    done
  done
fi
