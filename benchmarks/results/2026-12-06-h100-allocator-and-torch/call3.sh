#!/bin/bash
# GPU call 3: the adaptor suite, vmm_cost, pair new vs nvtx_off (main), replays at the new default,
# then gpukit_torch built here: compat (native, default) and the training rows that missed.
D=build/gpu-carry2
export LD_LIBRARY_PATH=$PWD/$D/libs
R=/tmp/r5; rm -rf $R; mkdir -p $R
T0=$(date +%s); TOTAL=${TOTAL:-560}
left() { echo $(( TOTAL - ($(date +%s) - T0) )); }
pack() { tar czf $OUT/r5.tgz -C /tmp r5; }
step() { echo "[$(date +%T)] $*" | tee -a $R/steps.log; }
{ nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv; date -u; nproc; env | grep -i -E "nvtx|nsys|cuda" ; } > $R/env.txt 2>&1
step adaptors; timeout 90 $D/resource_adaptors_gpu_test > $R/adaptors.log 2>&1; step "adaptors rc=$?"
step vmm_cost; timeout 60 $D/vmm_cost --rounds 3 > $R/vmm_cost.jsonl 2>&1; step "vmm_cost rc=$?"
pack
step pair
for r in 1 2 3; do for b in new nvtx_off; do
  timeout 30 $D/$b/allocator_bench --benchmark_filter='pair/gpukit/(256|65536|16777216)/|threads/gpukit/real_time/threads:1$' --benchmark_min_time=0.3 --benchmark_format=json > $R/pair-$b-$r.json 2>$R/pair-$b-$r.err
done; done
step replays
for t in benchmarks/traces/*.trace; do for a in gpukit gpukit_vmm; do
  timeout 40 $D/new/replay_trace --trace $t --runtime cuda --allocator $a --repeat 3 2>&1 | tail -1
done; done > $R/replay.jsonl
step "c++ done"; pack
mkdir -p $R/torch
OUT=$R/torch TOTAL=$(( $(left) - 15 )) COMPAT_S=110 TRAIN_S=400 COMPAT_ALLOCATORS=native,gpukit MAX_JOBS=16 \
  TRAIN_ARGS="--models vit_b16,gpt2_varlen,bert_varlen --configs native,expandable,gpukit,gpukit:page_size:8MiB" \
  bash bindings/torch/benchmarks/run_h200.sh compat train > $R/torch.log 2>&1
step "torch rc=$?"; pack
cat $R/steps.log; grep -h rc= $R/adaptors.log | tail -3; tail -3 $R/adaptors.log; cat $R/vmm_cost.jsonl; cat $R/replay.jsonl
python3 - <<'PY'
import json,glob,statistics,collections
d=collections.defaultdict(list)
for f in sorted(glob.glob('/tmp/r5/pair-*.json')):
    b=f.split('pair-')[1].rsplit('-',1)[0]
    try:
        for x in json.load(open(f))['benchmarks']: d[(x['name'],b)].append(x['real_time'])
    except Exception as e: print(f, e)
for k in sorted(d): print(k, [round(v,1) for v in d[k]], round(statistics.median(d[k]),1))
PY
sed -n '/## Compat/,$p' $R/torch/summary.md | grep -v "| pass | pass |" | head -80
