#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""PyTorch's answer to pageable host-to-device copies, measured as an anchor for transfer_bench.

    python3 benchmarks/transfer/torch_pin_anchor.py [--sizes-mib 512,1024] [--reps 5]

For pageable (ordinary) CPU tensors of each size, prints GB/s (1e9 bytes per second, as
transfer_bench's summary) of:
  torch/pin_memory+to_non_blocking/<MiB>   x.pin_memory().to('cuda', non_blocking=True), then a
                                           synchronize: what a DataLoader with pin_memory=True and a
                                           non_blocking copy costs per batch (the issue's anchor)
  torch/pin_memory+to_non_blocking_first/<MiB>  the same, first call (PyTorch pins new memory)
  torch/pin_memory/<MiB>                   pin_memory() alone (one thread copies into cached pinned
                                           memory)
  torch/to_non_blocking_from_pinned/<MiB>  .to('cuda', non_blocking=True) of a pinned tensor: the link
  torch/to_pageable/<MiB>                  .to('cuda') of the pageable tensor (cudaMemcpy from pageable)
Medians of --reps after one warm-up. Timed with a steady clock around each step and
torch.cuda.synchronize(). Exits 0 with a message when PyTorch or a GPU is missing.
"""
import argparse
import statistics
import sys
import time


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes-mib", default="512,1024", help="comma-separated sizes in MiB")
    ap.add_argument("--reps", type=int, default=5, help="repetitions (median reported)")
    args = ap.parse_args()
    try:
        sizes = [int(s) for s in args.sizes_mib.split(",") if s]
    except ValueError:
        ap.error(f"--sizes-mib: expected integers separated by commas, got {args.sizes_mib!r}")
    if not sizes or min(sizes) <= 0:
        ap.error(f"--sizes-mib: sizes must be positive, got {args.sizes_mib!r}")
    if args.reps < 1:
        ap.error(f"--reps: must be at least 1, got {args.reps}")

    try:
        import torch
    except ImportError:
        print("torch_pin_anchor: PyTorch is not installed: no anchor")
        return 0
    if not torch.cuda.is_available():
        print("torch_pin_anchor: no usable GPU: nothing to measure")
        return 0

    dev = torch.device("cuda", 0)
    print(f"# torch {torch.__version__}, CUDA {torch.version.cuda}, "
          f"{torch.cuda.get_device_name(dev)}; median of {args.reps}; GB/s = 1e9 bytes/s")

    def timed(fn):
        torch.cuda.synchronize(dev)
        t0 = time.perf_counter()
        out = fn()
        torch.cuda.synchronize(dev)
        return time.perf_counter() - t0, out

    def report(name, nbytes, seconds):
        print(f"{name:60s} {nbytes / seconds / 1e9:8.1f} GB/s")

    for mib in sizes:
        nbytes = mib << 20
        x = torch.ones(nbytes, dtype=torch.uint8)  # pageable, touched
        assert not x.is_pinned()

        first, y = timed(lambda: x.pin_memory().to(dev, non_blocking=True))
        del y
        both, pin_only, link, pageable = [], [], [], []
        for _ in range(args.reps + 1):  # the first round is a warm-up
            both.append(timed(lambda: x.pin_memory().to(dev, non_blocking=True))[0])
            t, p = timed(lambda: x.pin_memory())
            pin_only.append(t)
            link.append(timed(lambda: p.to(dev, non_blocking=True))[0])
            del p
            pageable.append(timed(lambda: x.to(dev))[0])
        med = lambda v: statistics.median(v[1:])
        report(f"torch/pin_memory+to_non_blocking/{mib}", nbytes, med(both))
        report(f"torch/pin_memory+to_non_blocking_first/{mib}", nbytes, first)
        report(f"torch/pin_memory/{mib}", nbytes, med(pin_only))
        report(f"torch/to_non_blocking_from_pinned/{mib}", nbytes, med(link))
        report(f"torch/to_pageable/{mib}", nbytes, med(pageable))
        del x
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
