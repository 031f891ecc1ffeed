#!/bin/bash
# (a) allocator_bench + replays, old (fdf5f86) vs new4 (main f84f297), alternated, pinned on core 5,
#     nothing else running; (b) gpukit_torch.checkpoint on GPT-2 and ResNet-50 (time calibration);
# (c) test_checkpoint.py on the GPU with what time is left.
D=build/gpu26
S=$(date +%s); el() { echo "[$(( $(date +%s) - S )) s] $*"; }
mkdir -p $OUT/cmp $OUT/ckpt
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $OUT/gpu.txt 2>&1
export LD_LIBRARY_PATH=$PWD/$D/libs
BENCH=1 ROUNDS=${ROUNDS:-5} PIN_CORE=5 OUT=$OUT/cmp \
  timeout ${CMP_S:-120} bash benchmarks/memory/compare_builds.sh old=$D/old new4=$D/new4 > $OUT/cmp/log.txt 2>&1
el replays done; cat $OUT/cmp/summary.md 2>/dev/null || tail -30 $OUT/cmp/log.txt
unset LD_LIBRARY_PATH
export PYTHONPATH=$PWD/bindings/torch GPUKIT_INCLUDE_DIR=$PWD/include TORCH_EXTENSIONS_DIR=/tmp/gte
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PYTHONUNBUFFERED=1
for m in gpt2:${G_S:-170} resnet50:${R_S:-120}; do
  OUT=$OUT/ckpt timeout $(( ${m#*:} + 60 )) python3 benchmarks/checkpoint/torch_checkpoint.py --model ${m%:*} \
    --steps 20 --compile-budgets "" --deadline-s ${m#*:} > $OUT/ckpt/${m%:*}.txt 2>&1
  el ${m%:*} rc=$?; tail -4 $OUT/ckpt/${m%:*}.txt
done
left=$(( ${TOTAL:-560} - ($(date +%s) - S) ))
if [ $left -gt 60 ]; then
  timeout $left python3 -m pytest -q -rs bindings/torch/tests/test_checkpoint.py > $OUT/ckpt/pytest_gpu.log 2>&1
  el tests rc=$?; tail -5 $OUT/ckpt/pytest_gpu.log
fi
