#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""benchmarks/checkpoint/torch_checkpoint.py --smoke, as CTest's gpukit_torch.checkpoint_bench
runs it: the benchmark's own code (anchors, torch.compile rows, gpukit on the compiled model) on
the CPU with stand-in measurements, so that a script error is found here and not in a GPU call.
Exits 77 (CTest: skipped), saying why, where this Python lacks torch, transformers or the means to
build gpukit's planner; otherwise the benchmark's status (1 where a row failed).

    python3 tests/pytorch/checkpoint_bench_smoke.py [--model llama] [torch_checkpoint.py options]
"""

import os
import runpy
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, "..", "..")
BENCH = os.path.join(ROOT, "benchmarks", "checkpoint", "torch_checkpoint.py")
sys.path.insert(0, HERE)
from checkpoint_pytest import require  # noqa: E402


def main():
    require(("torch", "transformers"))
    sys.path.insert(0, os.path.join(ROOT, "bindings", "torch"))
    args = sys.argv[1:]
    if "--model" not in args:
        args = ["--model", "llama", *args]
    sys.argv = [BENCH, *args, "--smoke", "--compile-budgets", "1.0"]
    runpy.run_path(BENCH, run_name="__main__")  # exits with the benchmark's status


if __name__ == "__main__":
    main()
