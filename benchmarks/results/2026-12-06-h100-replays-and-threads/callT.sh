#!/bin/bash
# Call 1: (a) replays old (fdf5f86) vs new2 (03cdd38) alternated, pinned, raw kept; backend_threads
# variants; (b) gpukit_torch built here; threads_bench native / gpukit / gpukit with 4 MiB thread
# cache; empty_free; site.tgz back for later calls.
D=build/gpu26
S=$(date +%s); el() { echo "[$(( $(date +%s) - S )) s] $*"; }
mkdir -p /tmp/d/torch
# (b0) the torch build first
PY=/opt/torch/.venv/bin/python; [ -x $PY ] || PY=python3
( MAX_JOBS=14 $PY -m pip install --no-build-isolation --no-deps --no-cache-dir \
   --target /tmp/site ./bindings/torch > /tmp/d/torch/pip.log 2>&1; echo "pip rc=$?" >> /tmp/d/torch/pip.log
  $PY bindings/torch/benchmarks/threads_bench.py --build-only --lib /tmp/site/gpukit_threads_bench.so >> /tmp/d/torch/pip.log 2>&1 )
el torch built; tail -3 /tmp/d/torch/pip.log
echo skip callD

export PYTHONPATH=/tmp/site
B=bindings/torch/benchmarks
timeout 120 $PY $B/threads_bench.py --lib /tmp/site/gpukit_threads_bench.so --rounds 12 --deadline 100 \
  --configs native,gpukit,gpukit:thread_cache_max_block_bytes:4MiB --out /tmp/d/torch/threads > /tmp/d/torch/threads.log 2>&1
el threads done; cat /tmp/d/torch/threads/threads_bench.md 2>/dev/null | tail -12
for c in native gpukit; do timeout 30 $PY build/gpu26/tb_probe.py /tmp/site/gpukit_threads_bench.so $c 3 16 >> /tmp/d/torch/probe.txt 2>&1; done
if command -v gdb >/dev/null; then
  ( timeout 40 $PY build/gpu26/tb_probe.py /tmp/site/gpukit_threads_bench.so gpukit 8 16 > /tmp/d/torch/probe_gdb_run.txt 2>&1 & )
  sleep 6; P=$(pgrep -f "tb_probe.py /tmp/site/gpukit_threads_bench.so gpukit 8" | head -1)
  [ -n "$P" ] && timeout 30 gdb -p $P -batch -ex "thread apply all bt 14" > /tmp/d/torch/gdb.txt 2>&1
  sleep 8
fi
el probe done; tail -3 /tmp/d/torch/probe.txt
find /tmp/site -name '*.so' -exec strip --strip-debug {} + 2>/dev/null
tar czf $OUT/site.tgz -C /tmp/site .
tar czf $OUT/d.tgz -C /tmp d
el packed; ls -la $OUT
