#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# benchmarks/checkpoint/run_torch_h200.sh: checkpoint costs measured on the GPU, and PyTorch models
# under gpukit's plans, on the GPU machine in one command from the repo root (about 8 minutes:
# 3 to 4 of them building gpukit_torch._C).
#
# Build the C++ parts here first (cmake --preset h200 && cmake --build --preset h200 --target
# checkpoint_profile_gpu_test profile_mlp) and carry build/h200/bin; without them those steps are
# left out. Writes to $OUT (default out/ckpt_torch): device.txt; profile_gpu_test.log
# (profile_chain's GPU test on the MLP example's stages); profile_mlp.txt (predicted against
# measured peak and step time, targets 3% and 5%); pip.log; pytest.log (bindings/torch/tests/
# test_checkpoint.py with CUDA); torch_checkpoint_gpt2.{txt,md,json} (GPT-2's table without the
# torch.compile anchors; run_torch_models_h200.sh MODEL gives each model's whole table in one call).
# Each program's last line is its one-line summary. Exit status: non-zero when a step failed.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
OUT=${OUT:-out/ckpt_torch}
mkdir -p "$OUT"
B=${B:-build/h200/bin}
PY=${PY:-/opt/torch/.venv/bin/python}
SITE=${SITE:-/tmp/gpukit_torch_site}
step() { echo; echo "=== $* ($(date -u +%H:%M:%S))"; }
status=0

step device
{
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  "$PY" -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)"
  date -u +%Y-%m-%d
} | tee "$OUT/device.txt"

# The extension builds while the C++ programs run.
MAX_JOBS=${MAX_JOBS:-12} timeout 480 "$PY" -m pip install --no-build-isolation --no-deps \
  --no-cache-dir --target "$SITE" ./bindings/torch > "$OUT/pip.log" 2>&1 &
pip_pid=$!

if [[ -x "$B/tests/checkpoint_profile_gpu_test" ]]; then
  step profile_chain GPU test
  timeout 120 "$B/tests/checkpoint_profile_gpu_test" > "$OUT/profile_gpu_test.log" 2>&1
  rc=$?; tail -3 "$OUT/profile_gpu_test.log"; [[ $rc -eq 0 ]] || status=1
fi
if [[ -x "$B/benchmarks/profile_mlp" ]]; then
  step profile_mlp
  timeout 180 "$B/benchmarks/profile_mlp" 2>&1 | tee "$OUT/profile_mlp.txt"
  [[ ${PIPESTATUS[0]} -eq 0 ]] || status=1
fi

step pip install ./bindings/torch
wait $pip_pid; rc=$?
tail -2 "$OUT/pip.log"; echo "pip exit $rc"
[[ $rc -eq 0 ]] || status=1

step pytest test_checkpoint.py
PYTHONPATH=$SITE timeout 300 "$PY" -m pytest -q -rs bindings/torch/tests/test_checkpoint.py \
  > "$OUT/pytest.log" 2>&1 || status=1
tail -3 "$OUT/pytest.log"

step torch_checkpoint.py --model gpt2
PYTHONPATH=$SITE OUT=$OUT timeout 400 "$PY" benchmarks/checkpoint/torch_checkpoint.py --model gpt2 \
  --compile-budgets '' --deadline-s 330 2>&1 | tee "$OUT/torch_checkpoint_gpt2.txt"
[[ ${PIPESTATUS[0]} -eq 0 ]] || status=1
exit $status
