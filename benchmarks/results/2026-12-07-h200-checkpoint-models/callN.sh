#!/bin/bash
# gpukit_torch.checkpoint on GPT-2: time scales measured on two warm steps of the first plan only.
export PYTHONPATH=$PWD/bindings/torch GPUKIT_INCLUDE_DIR=$PWD/include TORCH_EXTENSIONS_DIR=/tmp/gte
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PYTHONUNBUFFERED=1
mkdir -p $OUT/ckpt
OUT=$OUT/ckpt timeout ${T:-170} python3 benchmarks/checkpoint/torch_checkpoint.py --model gpt2 \
  --steps 20 --compile-budgets "" --deadline-s ${G_S:-110} > $OUT/ckpt/gpt2.txt 2>&1
echo rc=$?; tail -25 $OUT/ckpt/gpt2.txt | cut -c1-200
