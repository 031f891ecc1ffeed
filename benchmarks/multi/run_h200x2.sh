#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# benchmarks/multi/run_h200x2.sh: gpukit on two GPUs, in one command from the repo root
# on the two-GPU machine (nvidia-h200-x2). About 3 minutes.
#
# Build here first (cmake --preset h200 && cmake --build --preset h200 --target nccl_allreduce
# multi_gpu_test) and take build/h200 along. NCCL is not carried (libnccl.so is 218 MB): the
# example loads the toolkit's /usr/local/cuda/lib*/libnccl.so.2 on the GPU machine (see nccl.txt).
# Writes to $OUT (default: out/): device.txt, nccl.txt (where libnccl was found),
# multi_gpu_test.log, allreduce_<source>.txt for the segment sources automatic (cudaMallocAsync
# segments), growable and synchronous, and summary.txt: per source, the sums and the ratio of
# gpukit's bus bandwidth to cudaMalloc's at each size (1 MiB .. 1 GiB).
# SOURCES="automatic growable" narrows the sources; ARGS passes more options to nccl_allreduce.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
OUT=${OUT:-out}
mkdir -p "$OUT"
B=${B:-build/h200/bin}
step() { echo; echo "=== $* ($(date -u +%H:%M:%S))"; }

step device
{
  nvidia-smi --query-gpu=index,name,driver_version,memory.total,pci.bus_id --format=csv,noheader
  nvidia-smi topo -m 2>/dev/null
  nvcc --version 2>/dev/null | tail -1
  echo "host: $(nproc) CPUs"
  date -u +%Y-%m-%d
} | tee "$OUT/device.txt"

step nccl
for d in /usr/local/cuda/lib64 /usr/local/cuda/lib /usr/lib/x86_64-linux-gnu; do
  [[ -e $d/libnccl.so.2 ]] && export LD_LIBRARY_PATH=$d:${LD_LIBRARY_PATH:-}
done
ldd "$B/examples/nccl_allreduce" | grep -E "nccl|not found" | tee "$OUT/nccl.txt"
if grep -q "not found" "$OUT/nccl.txt"; then
  echo "libnccl.so.2 is not on this machine: nccl_allreduce cannot run" | tee -a "$OUT/nccl.txt"
fi

step multi_gpu_test
timeout 300 "$B/tests/multi_gpu_test" > "$OUT/multi_gpu_test.log" 2>&1
echo "multi_gpu_test exit $?"
grep -E "test cases:|assertions:|ERROR|FAILED|fewer than" "$OUT/multi_gpu_test.log" | tail -20

for src in ${SOURCES:-automatic growable synchronous}; do
  step "nccl_allreduce --source $src"
  # The unique id is made by the parent before it forks; should that ever touch CUDA (the ranks
  # then fail to initialize), rank 0 makes it instead.
  timeout 600 "$B/examples/nccl_allreduce" --source "$src" ${ARGS:-} > "$OUT/allreduce_$src.txt" 2>&1
  rc=$?
  if [[ $rc != 0 && $rc != 77 ]]; then
    echo "exit $rc with --id-from parent; again with --id-from rank0" | tee -a "$OUT/allreduce_$src.txt"
    timeout 600 "$B/examples/nccl_allreduce" --source "$src" --id-from rank0 ${ARGS:-} \
      >> "$OUT/allreduce_$src.txt" 2>&1
    rc=$?
  fi
  echo "nccl_allreduce --source $src exit $rc"
  cat "$OUT/allreduce_$src.txt"
done

step summary
{
  for src in ${SOURCES:-automatic growable synchronous}; do
    f="$OUT/allreduce_$src.txt"
    [[ -f $f ]] || continue
    echo "# $src: $(grep -E '^nccl_allreduce: [0-9]+ ranks, all sums right|failed|wrong' "$f" | tail -1)"
    awk '/^size_bytes=/ {
      for (i = 1; i <= NF; ++i) { split($i, kv, "="); v[kv[1]] = kv[2] }
      printf "%10.0f MiB  gpukit %7.2f GB/s  cudaMalloc %7.2f GB/s  ratio %.3f  sums %s\n",
             v["size_bytes"] / 1048576, v["gpukit_busbw_GBps"], v["cudamalloc_busbw_GBps"],
             v["ratio"], v["sums"] }' "$f"
  done
} | tee "$OUT/summary.txt"
