#!/bin/bash
# ViT-B/16's extra reserved memory: gpukit's thread caches (both paths) off, and capped, against
# expandable segments, alternated; gpukit_torch built once here. Beside the build: the checkpoint
# cost model's peak against a step's (diag_peak.py), and the backend's allocate+free pair.
set -u
cd "$(dirname "$0")/../.."
T0=$(date +%s)
el() { echo $(( $(date +%s) - T0 )); }
O=$OUT/v; mkdir -p $O
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PYTHONUNBUFFERED=1
PY=/opt/torch/.venv/bin/python; [ -x $PY ] || PY=python3
SITE=/tmp/site; rm -rf $SITE; mkdir -p $SITE
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u; git log --oneline -1; } | tee $O/gpu.txt
MAX_JOBS=12 timeout 200 $PY -m pip install --no-build-isolation --no-deps --no-cache-dir --target $SITE ./bindings/torch > $O/pip.log 2>&1 &
PIP=$!
# meanwhile (GPU memory, not CPU time): where the checkpoint cost model's peak differs from a step's
GPUKIT_INCLUDE_DIR=$PWD/include TORCH_EXTENSIONS_DIR=/tmp/te PYTHONPATH=$PWD/bindings/torch timeout 150 \
  python3 build/gpu29/diag_peak.py > $O/diag.txt 2>&1; echo "diag rc=$? at $(el) s"
grep -v "^   *[FBh]" $O/diag.txt | cut -c1-250 | head -70
wait $PIP; echo "pip rc=$? at $(el) s"; tail -2 $O/pip.log
export PYTHONPATH=$SITE
B=bindings/torch/benchmarks
for a in "" "- 64"; do
  echo "pair sim  ${a:-0 live}: $(build/gpu29/pair_sim $a 2>&1)"
  echo "pair real ${a:-0 live}: $(build/gpu29/pair_real $a 2>&1 | tr '\n' ' ')"
done | tee $O/pair.txt
mkdir -p $O/tr
for g in "" 1; do
  CAPTURE_WITH_GPUKIT=$g timeout 90 $PY benchmarks/traces/capture_trace.py vit_b16 $O/tr > $O/tr/capture$g.log 2>&1
  echo "capture [${g:-native}] rc=$? at $(el) s: $(tail -1 $O/tr/capture$g.log)"
done
for c in "thread_cache:off,thread_cache_contended_max_block_bytes:0" "" "thread_cache_bytes:16MiB"; do
  left=$(( 560 - $(el) )); [ $left -lt 60 ] && { echo "skip [$c]"; continue; }
  d=$(( left < 150 ? left - 10 : 140 ))
  n=$(echo "${c:-default}" | tr -c 'a-zA-Z0-9_\n' '_')
  timeout $(( d + 15 )) $PY $B/train_table.py --models vit_b16 --rounds 2 --configs expandable,gpukit \
    --gpukit-conf "$c" --deadline $d --out $O/$n > $O/$n.log 2>&1
  echo "[$c] rc=$? at $(el) s"
  $PY - $O/$n/train_table.json "$c" <<'PYEOF'
import json, sys
d = json.load(open(sys.argv[1]))
for x in d["results"]:
    print(f"  {x['config']:10s} [{sys.argv[2]}] round {x['round']}: NVML {x['peak_device_bytes']/2**20:.0f} MiB, reserved {x['peak_reserved_bytes']/2**20:.0f}, allocated {x['peak_allocated_bytes']/2**20:.0f}, median {sorted(x['times_ms'])[len(x['times_ms'])//2]:.2f} ms")
PYEOF
done
cd $OUT && tar czf $OUT/v.tgz v && rm -rf v
