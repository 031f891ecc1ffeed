#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# benchmarks/checkpoint/run_torch_models_h200.sh MODEL [OPTION ...]: one model's table of gpukit's
# checkpoint plans against PyTorch's own options (benchmarks/checkpoint/torch_checkpoint.py), in
# one GPU call of under 10 minutes, from the repo root. MODEL: gpt2, llama or resnet50; OPTIONs go
# to torch_checkpoint.py (e.g. `gpt2 --no-sweep --rounds 0 --compile-budgets 1.0,0.5`: the
# torch.compile rows alone, with gpukit on the compiled model at their peaks). `tests` runs
# bindings/torch/tests/test_checkpoint.py instead (the CPU and the GPU cases).
#
# Uses the machine's python3 (PyTorch, transformers, torchvision) and this checkout's
# gpukit_torch; gpukit's planner is compiled from bindings/torch/csrc/planner.cpp on first use
# (seconds, ninja), so no extension build is needed. Writes to $OUT (default out/ckpt_models):
# device.txt, torch_checkpoint_MODEL.{txt,md,json} (or pytest.log). The last line of the run is
# its one-line JSON summary. Exit status: the program's.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
model=${1:?usage: run_torch_models_h200.sh gpt2|llama|resnet50|tests [OPTION ...]}
shift
OUT=${OUT:-out/ckpt_models}
mkdir -p "$OUT"
PY=${PY:-python3}
export PYTHONPATH="$PWD/bindings/torch${PYTHONPATH:+:$PYTHONPATH}"
export GPUKIT_INCLUDE_DIR="$PWD/include" TORCH_EXTENSIONS_DIR=${TORCH_EXTENSIONS_DIR:-/tmp/gpukit_torch_extensions}
{
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  "$PY" -c "import torch, transformers, torchvision; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'transformers', transformers.__version__, 'torchvision', torchvision.__version__)"
  date -u +%Y-%m-%d
} | tee "$OUT/device.txt"
if [[ "$model" == tests ]]; then
  PYTHONUNBUFFERED=1 timeout 560 "$PY" -m pytest -q -rs bindings/torch/tests/test_checkpoint.py \
    > "$OUT/pytest.log" 2>&1
  rc=$?
  tail -15 "$OUT/pytest.log"
  exit $rc
fi
PYTHONUNBUFFERED=1 OUT=$OUT timeout 580 "$PY" benchmarks/checkpoint/torch_checkpoint.py \
  --model "$model" --deadline-s "${DEADLINE_S:-450}" "$@" 2>&1 | tee "$OUT/torch_checkpoint_$model.txt"
exit "${PIPESTATUS[0]}"
