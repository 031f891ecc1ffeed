#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# benchmarks/torch/run_h200.sh: gpukit as PyTorch's and CuPy's allocator on the GPU machine, in
# about 4 minutes, from the repo root. Build here first with the h200 preset
# (cmake --preset h200 && cmake --build --preset h200) and carry build/h200/bin: the libraries are
# build/h200/bin/bindings/libgpukit_torch.so and libgpukit_torch_trivial.so, the simulated-GPU test
# build/h200/bin/tests/gpukit_torch_abi_test with libgpukit_torch_sim.so beside it. Needs PyTorch,
# torchvision, transformers and CuPy on the machine; nothing is downloaded. Writes to $OUT
# (default out/torch):
#   device.txt          GPU, driver, versions, date
#   abi_test.log        the C ABI over the simulated GPU (doctest) and gpukit_torch.py's ctypes layer
#   check_torch.txt     real PyTorch and CuPy: OOM as PyTorch reports it, bad frees, install after
#                       CUDA init, empty_cache, snapshots, CuPy (PASS/FAIL lines)
#   gpukit_torch_snapshot.{pickle,json,html}, trace_plot.html   a recorded snapshot, and PyTorch's
#                       memory_viz drawing of it
#   train_compare.txt / .json   ResNet-50, GPT-2 and GPT-2 with varying sequence lengths under
#                       native, expandable segments, native cudaMallocAsync, the trivial pluggable
#                       allocator and gpukit: median step ms and peak reserved memory
# Switches: CHECKS=0, TRAIN=0 leave parts out; TRAIN_ARGS adds train_compare.py arguments (e.g.
# TRAIN_ARGS="--configs native,expandable,gpukit:growable,gpukit:stream_ordered").
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
OUT=${OUT:-out/torch}
mkdir -p "$OUT"
B=${B:-build/h200/bin}
LIB="$B/bindings/libgpukit_torch.so"
unset NVTX_INJECTION64_PATH PYTORCH_CUDA_ALLOC_CONF GPUKIT_TORCH_SEGMENTS
step() { echo; echo "=== $* ($(date -u +%H:%M:%S))"; }

if [[ ! -f "$LIB" || ! -f "$B/bindings/libgpukit_torch_trivial.so" ]]; then
  echo "run_h200.sh: $LIB or libgpukit_torch_trivial.so missing: build with the h200 preset and carry $B" >&2
  exit 2
fi

step device
{
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  python3 -c "import torch, torchvision, transformers; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'torchvision', torchvision.__version__, 'transformers', transformers.__version__)"
  python3 -c "import cupy; print('cupy', cupy.__version__)" 2>&1 | tail -1
  date -u +%Y-%m-%d
} 2>&1 | tee "$OUT/device.txt"

step the C ABI over the simulated GPU
{
  timeout 120 "$B/tests/gpukit_torch_abi_test" 2>/dev/null
  echo "gpukit_torch_abi_test exit $?"
  GPUKIT_SIM_DEVICES=2 GPUKIT_SIM_CAPACITY=1G timeout 120 python3 tests/pytorch/gpukit_torch_ctypes_test.py "$B/tests/libgpukit_torch_sim.so" 2>&1 | tail -3
} > "$OUT/abi_test.log" 2>&1
grep -E "test cases:|exit|^Ran|^OK|FAILED" "$OUT/abi_test.log"

if [[ ${CHECKS:-1} == 1 ]]; then
  step check_torch: PyTorch and CuPy through gpukit
  timeout 400 python3 bindings/torch/check_torch.py --lib "$LIB" --out "$OUT" 2>&1 | tee "$OUT/check_torch.txt"
  if [[ -f "$OUT/gpukit_torch_snapshot.pickle" ]]; then
    timeout 60 python3 -m torch.cuda._memory_viz trace_plot "$OUT/gpukit_torch_snapshot.pickle" \
      -o "$OUT/trace_plot.html" && echo "memory_viz trace_plot: $OUT/trace_plot.html"
  fi
fi

if [[ ${TRAIN:-1} == 1 ]]; then
  step train_compare
  # shellcheck disable=SC2086
  timeout 540 python3 bindings/torch/benchmarks/train_compare.py --lib "$LIB" --json "$OUT/train_compare.json" \
    ${TRAIN_ARGS:-} 2>&1 | tee "$OUT/train_compare.txt"
fi
step done
