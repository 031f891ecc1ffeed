#!/bin/bash
# SPDX-License-Identifier: Apache-2.0
# On a GPU machine with PyTorch: pip-installs gpukit_torch from this checkout (offline, against the
# installed PyTorch) and runs test_compat.py. Results go to $OUT (default ./compat-out): env.txt,
# pip.log, compat.{log,json,md} and, for the pip-built package, pip/compat.{log,json,md}.
#
#   bash bindings/torch/tests/run_on_gpu.sh [ROW ...]
#
# PY picks the interpreter (default /opt/torch/.venv/bin/python, else python3). When FALLBACK
# names a folder holding a prebuilt gpukit_torch package, the table runs with it (both allocators)
# while pip builds, then again with the pip-built package (gpukit only); without FALLBACK, it runs
# once, with the pip-built package.
set -u
OUT=${OUT:-$PWD/compat-out}
mkdir -p "$OUT/pip"
PY=${PY:-/opt/torch/.venv/bin/python}
[ -x "$PY" ] || PY=python3
JOBS=${JOBS:-8}
SITE=/tmp/gpukit_torch_site
{
  date -u
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  "$PY" -c "import torch, sys; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'python', sys.version.split()[0])"
  "$PY" -c "import pytest; print('pytest', pytest.__version__)"
} > "$OUT/env.txt" 2>&1
start=$(date +%s)
(
  MAX_JOBS=${MAX_JOBS:-6} timeout 400 "$PY" -m pip install --no-build-isolation --no-deps \
    --no-cache-dir --target "$SITE" ./bindings/torch
  echo "pip install rc=$? in $(($(date +%s) - start)) s"
) > "$OUT/pip.log" 2>&1 &
pip_pid=$!
if [ -n "${FALLBACK:-}" ]; then
  echo "table 1: the prebuilt package in $FALLBACK" >> "$OUT/env.txt"
  PYTHONPATH=$FALLBACK PYTHONUNBUFFERED=1 "$PY" bindings/torch/tests/test_compat.py \
    --out "$OUT" --jobs "$JOBS" "$@" > "$OUT/compat.log" 2>&1
  echo "table 1 rc=$? at $(($(date +%s) - start)) s" >> "$OUT/env.txt"
fi
wait $pip_pid
tail -1 "$OUT/pip.log" >> "$OUT/env.txt"
if PYTHONPATH=$SITE "$PY" -c "import torch, gpukit_torch._C" >> "$OUT/env.txt" 2>&1; then
  allocators=native,gpukit
  [ -n "${FALLBACK:-}" ] && allocators=gpukit
  PYTHONPATH=$SITE PYTHONUNBUFFERED=1 "$PY" bindings/torch/tests/test_compat.py --out "$OUT/pip" \
    --jobs "$JOBS" --allocators "$allocators" "$@" > "$OUT/pip/compat.log" 2>&1
  echo "table 2 (pip-built) rc=$? at $(($(date +%s) - start)) s" >> "$OUT/env.txt"
fi
cat "$OUT/env.txt"; cat "$OUT/compat.md" "$OUT/pip/compat.md" 2>/dev/null
