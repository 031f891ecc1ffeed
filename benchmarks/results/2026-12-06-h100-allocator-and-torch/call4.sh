#!/bin/bash
# GPU call 4: the one-thread pair, old (fdf5f86) / new (main) / nvtx_off (main with
# GPUKIT_DISABLE_INTERNAL_NVTX), each process pinned to one core, alternated ROUNDS times.
D=build/gpu-carry2
export LD_LIBRARY_PATH=$PWD/$D/libs
R=/tmp/r6; rm -rf $R; mkdir -p $R
lscpu | grep -E "Model name|MHz|NUMA node0" > $R/env.txt; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader >> $R/env.txt
for r in $(seq 1 ${ROUNDS:-8}); do for b in old new nvtx_off; do
  taskset -c ${CORE:-5} $D/$b/allocator_bench --benchmark_filter='pair/gpukit/(256|65536)/|threads/gpukit/real_time/threads:1$' \
    --benchmark_min_time=0.2 --benchmark_format=json > $R/pair-$b-$r.json 2>/dev/null
done; done
tar czf $OUT/r6.tgz -C /tmp r6
python3 - <<'PY'
import json,glob,statistics,collections
d=collections.defaultdict(list)
for f in sorted(glob.glob('/tmp/r6/pair-*.json')):
    b=f.split('pair-')[1].rsplit('-',1)[0]
    for x in json.load(open(f))['benchmarks']: d[(x['name'],b)].append(x['real_time'])
for k in sorted(d): print(k, [round(v,1) for v in d[k]], 'median', round(statistics.median(d[k]),2))
PY
cat $R/env.txt
