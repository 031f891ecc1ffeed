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
# TESTS="a_test b_test" runs only those test binaries (default: every one built).
tests=("$bin"/tests/*_test)
if [[ -n "${TESTS:-}" ]]; then
  tests=()
  for name in $TESTS; do tests+=("$bin/tests/$name"); done
fi
for t in "${tests[@]}"; do
  name="$(basename "$t")"
  [[ "$name" == ownership_test ]] && continue
  start=$SECONDS
  timeout "${TEST_TIMEOUT:-60}" "$t" >"$out/$name.log" 2>&1
  rc=$?
  echo "$name exit $rc ($((SECONDS - start)) s): $(grep -a 'test cases:' "$out/$name.log" | tail -1)" |
    tee -a "$summary"
done
if [[ -x "$bin/tests/ownership_test" ]]; then
  GPUKIT_OWNERSHIP_ROUNDS="${GPUKIT_OWNERSHIP_ROUNDS:-20000}" GPUKIT_OWNERSHIP_SECONDS="${GPUKIT_OWNERSHIP_SECONDS:-20}" \
    timeout 90 "$bin/tests/ownership_test" >"$out/ownership_test.log" 2>&1
  echo "ownership_test exit $? : $(grep -a 'ownership stress' "$out/ownership_test.log")" |
    tee -a "$summary"
fi
for p in examples/demo tools/gpukit-doctor; do
  [[ -x "$bin/$p" ]] || continue
  timeout 120 "$bin/$p" >"$out/$(basename "$p").log" 2>&1
  echo "$p exit $?" | tee -a "$summary"
done
# allocator_bench's gpukit rows, this tree against a baseline binary, alternating ROUNDS times on one
# pinned core (the host code is what is measured; the spread between unpinned runs on this VM is
# larger than any difference looked for). Medians and minimums in allocator_bench_summary.md.
filter='^(pair/gpukit/65536|threads/gpukit/|churn/gpukit/)'
pin=""
command -v taskset >/dev/null && pin="taskset -c ${BENCH_CPU:-3}"
if [[ -x "$bin/benchmarks/allocator_bench" && -x "$bin/benchmarks/allocator_bench_base" ]]; then
  for round in $(seq 1 "${ROUNDS:-6}"); do
    for v in base new; do
      b="$bin/benchmarks/allocator_bench"
      [[ $v == base ]] && b="${b}_base"
      timeout 60 $pin "$b" --benchmark_filter="$filter" --benchmark_min_time=0.2 \
        --benchmark_format=json >"$out/allocator_bench_${v}_$round.json" 2>"$out/allocator_bench_${v}_$round.err"
      echo "allocator_bench $v round $round exit $?" >>"$summary"
    done
  done
  python3 - "$out" >"$out/allocator_bench_summary.md" <<'PY'
import glob, json, statistics, sys
out = sys.argv[1]
runs = {"base": {}, "new": {}}
for v in runs:
    for f in sorted(glob.glob(f"{out}/allocator_bench_{v}_*.json")):
        try:
            data = json.load(open(f))
        except (OSError, ValueError):
            continue
        for b in data.get("benchmarks", []):
            runs[v].setdefault(b["name"], []).append(b["real_time"])
print("| benchmark | base median | new median | new/base (median) | base min | new min | new/base (min) | rounds |")
print("|---|---|---|---|---|---|---|---|")
for name in runs["base"]:
    a, b = runs["base"][name], runs["new"].get(name, [])
    if not a or not b:
        continue
    ma, mb = statistics.median(a), statistics.median(b)
    print(f"| {name} | {ma:.1f} | {mb:.1f} | {mb / ma:.3f} | {min(a):.1f} | {min(b):.1f} | "
          f"{min(b) / min(a):.3f} | {len(a)}/{len(b)} |")
PY
  cat "$out/allocator_bench_summary.md"
fi
