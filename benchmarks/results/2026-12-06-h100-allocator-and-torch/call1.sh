#!/bin/bash
# GPU call 1: allocator builds side by side (old fdf5f86 / new main / new with gpukit's NVTX ranges
# compiled out), the GPU test binaries, the driver's VMM call costs, growable page sizes.
D=build/gpu-carry
export LD_LIBRARY_PATH=$PWD/$D/libs
R=/tmp/r; rm -rf $R; mkdir -p $R/tests
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader; date -u; nproc; } > $R/env.txt 2>&1
pack() { tar czf $OUT/r.tgz -C /tmp r; }
T0=$(date +%s); left() { echo $(( ${TOTAL:-330} - ($(date +%s) - T0) )); }
step() { echo "[$(date +%T)] $*" | tee -a $R/steps.log; }
step compare; OUT=$R/cmp ROUNDS=${ROUNDS:-5} timeout 240 benchmarks/memory/compare_builds.sh old=$D/old new=$D/new nvtx_off=$D/nvtx_off > $R/cmp.log 2>&1; step "compare rc=$?"; pack
for t in $D/tests/*_test; do
  n=$(basename $t); step "test $n"; [ $(left) -gt 40 ] || { echo "$n skipped (time)" >> $R/tests/summary.txt; continue; }
  timeout $(( $(left) < 90 ? $(left) - 20 : 90 )) $t > $R/tests/$n.log 2>&1; echo "$n rc=$?" >> $R/tests/summary.txt
done
pack
[ $(left) -gt 60 ] && { step vmm_cost; timeout 60 $D/vmm_cost --rounds 3 > $R/vmm_cost.jsonl 2>&1; step "vmm_cost rc=$?"; pack; }
[ $(left) -gt 60 ] && step pages &&
for pb in 8 20 32; do [ $(left) -gt 20 ] || break; for t in benchmarks/traces/*.trace; do
  timeout 30 $D/new/replay_trace --trace $t --runtime cuda --allocator gpukit_vmm --page-bytes $((pb<<20)) --repeat 3 2>&1 | tail -1
done; done > $R/pages.jsonl
step "pages done"; pack
cat $R/tests/summary.txt; cat $R/steps.log; head -40 $R/cmp/summary.md; cat $R/vmm_cost.jsonl
