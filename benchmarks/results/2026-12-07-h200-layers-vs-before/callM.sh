#!/bin/bash
# (a) allocator_bench pair and churn, old (fdf5f86) vs new4 (main f84f297), 10 alternated rounds,
#     pinned on core 5, per-round raw.jsonl kept; (b) the PyTorch training table, reusing site.tgz.
D=build/gpu26
S=$(date +%s); el() { echo "[$(( $(date +%s) - S )) s] $*"; }
mkdir -p /tmp/cmp $OUT/cmp
export LD_LIBRARY_PATH=$PWD/$D/libs
BENCH=1 BENCH_FILTER='^(pair|churn)/gpukit/' ROUNDS=${ROUNDS:-10} PIN_CORE=5 OUT=/tmp/cmp \
  timeout ${CMP_S:-110} bash benchmarks/memory/compare_builds.sh old=$D/old new4=$D/new4 > /tmp/cmp/log.txt 2>&1
cp /tmp/cmp/raw.jsonl /tmp/cmp/summary.md /tmp/cmp/log.txt $OUT/cmp/ 2>/dev/null
el pairs done; head -12 /tmp/cmp/summary.md
unset LD_LIBRARY_PATH
SITE=$D/site.tgz OUT=$OUT/torch TOTAL=${TOTAL:-360} bash bindings/torch/benchmarks/run_h200.sh train > /tmp/run.log 2>&1
el train done; tail -25 $OUT/torch/summary.md
