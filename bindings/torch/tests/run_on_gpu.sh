#!/bin/bash
# On a GPU machine with PyTorch: pip-installs gpukit_torch from this checkout (offline, against the
# installed PyTorch) and runs test_compat.py under both allocators. Results go to $OUT (default
# ./compat-out): pip.log, compat.log, compat.json, compat.md, env.txt.
#
#   bash bindings/torch/tests/run_on_gpu.sh [ROW ...]
#
# PY picks the interpreter (default /opt/torch/.venv/bin/python, else python3). When the pip build
# fails and FALLBACK names a folder holding a prebuilt gpukit_torch package, that one is tested.
set -u
OUT=${OUT:-$PWD/compat-out}
mkdir -p "$OUT"
PY=${PY:-/opt/torch/.venv/bin/python}
[ -x "$PY" ] || PY=python3
{
  date -u
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  "$PY" -c "import torch, sys; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'python', sys.version.split()[0])"
} > "$OUT/env.txt" 2>&1
start=$(date +%s)
MAX_JOBS=${MAX_JOBS:-16} timeout 400 "$PY" -m pip install --no-build-isolation --no-deps \
  --no-cache-dir --target /tmp/gpukit_torch_site ./bindings/torch > "$OUT/pip.log" 2>&1
rc=$?
echo "pip install rc=$rc in $(($(date +%s) - start)) s" | tee -a "$OUT/env.txt"
if [ $rc -eq 0 ] && PYTHONPATH=/tmp/gpukit_torch_site "$PY" -c "import torch, gpukit_torch._C"; then
  export PYTHONPATH=/tmp/gpukit_torch_site
  echo "testing the pip-installed package" | tee -a "$OUT/env.txt"
elif [ -n "${FALLBACK:-}" ]; then
  export PYTHONPATH=$FALLBACK
  echo "pip build unusable: testing the prebuilt package in $FALLBACK" | tee -a "$OUT/env.txt"
fi
"$PY" -c "import pytest; print('pytest', pytest.__version__)" >> "$OUT/env.txt" 2>&1
PYTHONUNBUFFERED=1 "$PY" bindings/torch/tests/test_compat.py --out "$OUT" "$@" 2>&1 | tee "$OUT/compat.log"
