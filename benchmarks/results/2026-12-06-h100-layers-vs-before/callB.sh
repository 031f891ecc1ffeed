#!/bin/bash
# Pair old vs new2 (push and flow counters inlined again), pinned, alternated; then the backend
# threads harness (core allocator vs gpukit_torch backend, one stream per thread).
D=build/gpu26
export LD_LIBRARY_PATH=$PWD/$D/libs
R=$OUT/b; mkdir -p $R/pp
for r in $(seq 1 ${ROUNDS:-8}); do for b in old new2; do
  taskset -c ${CORE:-5} $D/$b/allocator_bench --benchmark_filter='pair/gpukit/(256|65536)/|churn/gpukit/' \
    --benchmark_min_time=0.3 --benchmark_format=json > $R/pp/pair-$b-$r.json 2>/dev/null
done; done
python3 - <<'PY' | tee $R/pair_summary.txt
import json,glob,collections,statistics,os
R=os.environ['OUT']+'/b/pp'
d=collections.defaultdict(dict)
for f in glob.glob(R+'/*.json'):
  b,r=os.path.basename(f)[5:-5].rsplit('-',1)
  for x in json.load(open(f))['benchmarks']: d[x['name']].setdefault(b,{})[int(r)]=x['real_time']
for n in sorted(d):
  o,nw=d[n]['old'],d[n]['new2']
  print(n,'old',[round(o[k],1) for k in sorted(o)],'new',[round(nw[k],1) for k in sorted(nw)],'median old',round(statistics.median(o.values()),2),'median new',round(statistics.median(nw.values()),2),'median paired diff',round(statistics.median(nw[k]-o[k] for k in o),2))
PY
for conf in "" "thread_cache_max_block_bytes:4MiB"; do
  timeout 120 $D/tb_cuda cuda ${TB_S:-0.5} "$conf" 1 4 8 16 2>&1 | tee -a $R/tb.txt
done
tar czf $OUT/b.tgz -C $OUT b && rm -rf $R
