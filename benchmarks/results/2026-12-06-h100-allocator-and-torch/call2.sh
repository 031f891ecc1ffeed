#!/bin/bash
# GPU call 2: gpukit_torch built on the machine, then near_limit, threads_bench, empty_free.
O=/tmp/o; rm -rf $O; mkdir -p $O
OUT=$O TOTAL=${TOTAL:-450} BENCH_S=${BENCH_S:-300} MAX_JOBS=16 bash bindings/torch/benchmarks/run_h200.sh bench > $O/run.log 2>&1
echo "run_h200 rc=$?"
cp $O/summary.md $O/results.tgz $O/site.tgz $OUT/ 2>/dev/null
tail -5 $O/run.log; cat $O/summary.md
