#!/bin/bash
# GPU call: old (fdf5f86, before the layers) vs new (main) allocator, alternated per round:
# allocator_bench pair/churn pinned to one core, threads unpinned; replays of the three traces with
# fixed segments, growable at the default page and at 8 MiB.
D=build/gpu26
export LD_LIBRARY_PATH=$PWD/$D/libs
mkdir -p $OUT/cmp
{ date -u; nproc; lscpu | grep -E "Model name|NUMA node0"; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader; } > $OUT/cmp/env.txt
cat $OUT/cmp/env.txt
ROUNDS=${ROUNDS:-6} PIN_CORE=${PIN_CORE:-5} REPLAY_PAGES="8388608" OUT=$OUT/cmp \
  timeout ${TOTAL:-520} bash benchmarks/memory/compare_builds.sh old=$D/old new=$D/new 2>&1 | tail -60
