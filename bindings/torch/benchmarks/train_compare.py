#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Trains ResNet-50 and GPT-2 small for a fixed number of steps on synthetic data under several
CUDA allocators, one subprocess per (model, allocator), and prints the median step time and the
peak reserved memory of each, as a table; writes the same as JSON.

    python3 bindings/torch/benchmarks/train_compare.py             # every model and allocator
    python3 bindings/torch/benchmarks/train_compare.py --models gpt2_varlen --configs native,gpukit
    python3 bindings/torch/benchmarks/train_compare.py --json out/train_compare.json

This is the CUDAPluggableAllocator path (PLUGGABLE.md); train_table.py measures the native backend.
Models (workloads.py): resnet50, gpt2, gpt2_varlen by default, any of workloads.MODELS.
Allocators (--configs):
    native        PyTorch's caching allocator
    expandable    the same with PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
    native_async  PyTorch's own cudaMallocAsync backend (PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync)
    trivial       libgpukit_torch_trivial.so: cudaMallocAsync through torch.cuda.memory.
                  CUDAPluggableAllocator; against native_async, the cost of the pluggable path alone
    gpukit        libgpukit_torch.so through CUDAPluggableAllocator (gpukit:SOURCE picks the segment
                  source, e.g. gpukit:stream_ordered; default: the library's, growable where gpukit
                  has it)
Peak reserved memory, per allocator, over the whole run (model, optimizer state and steps):
    native, expandable     torch.cuda.max_memory_reserved() (and max_memory_allocated())
    gpukit                 gpukit's reserved_bytes_peak (PyTorch cannot see the memory a pluggable
                           allocator holds: its memory_stats raise) and allocated_bytes_peak
    trivial, native_async  the device's default CUDA memory pool, which both allocate from:
                           cudaMemPoolAttrReservedMemHigh (what the driver's pool held) and
                           cudaMemPoolAttrUsedMemHigh (as "allocated"); PyTorch sees nothing of
                           the trivial allocator's memory
Step time: wall clock of one step (forward, backward, optimizer, zero_grad) between two
torch.cuda.synchronize() calls, after --warmup steps; the median of --steps steps.
"""

import argparse
import json
import os
import statistics
import sys
import time

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))  # gpukit_torch.pluggable from this source tree
import workloads  # noqa: E402
from workloads import GiB, build, environment, report, run_worker, time_steps  # noqa: E402

MODELS = ("resnet50", "gpt2", "gpt2_varlen")  # the default; any of workloads.MODELS
CONFIGS = ("native", "expandable", "native_async", "trivial", "gpukit")
ALLOC_CONF = {
    "native": None,
    "expandable": "expandable_segments:True",
    "native_async": "backend:cudaMallocAsync",
}


# ---- the worker: one model under one allocator ------------------------------------------------

def install_allocator(config, lib_path):
    """Before anything touches CUDA. Returns a function giving (peak reserved, peak allocated)."""
    import torch
    trivial_path = os.path.join(os.path.dirname(lib_path), "libgpukit_torch_trivial.so")

    def pool_peaks():
        """The device's default CUDA memory pool, which cudaMallocAsync serves from: reserved
        high-water and used high-water (the trivial allocator and PyTorch's cudaMallocAsync
        backend both allocate from it)."""
        import ctypes
        lib = ctypes.CDLL(trivial_path)
        out = (ctypes.c_ulonglong * 4)()
        rc = lib.gpukit_trivial_pool_stats(torch.cuda.current_device(), out)
        if rc != 0:
            raise RuntimeError(f"gpukit_trivial_pool_stats: cudaError {rc}")
        return out[1], out[3]

    if config == "native_async":
        return pool_peaks  # measured as for `trivial`, so that the two compare
    if config in ALLOC_CONF:
        def peaks():
            return torch.cuda.max_memory_reserved(), torch.cuda.max_memory_allocated()
        return peaks
    if config == "trivial":
        alloc = torch.cuda.memory.CUDAPluggableAllocator(trivial_path, "gpukit_trivial_malloc",
                                                         "gpukit_trivial_free")
        torch.cuda.memory.change_current_allocator(alloc)
        return pool_peaks
    if config == "gpukit" or config.startswith("gpukit:"):
        from gpukit_torch import pluggable as gpukit_torch
        segments = config.split(":", 1)[1] if ":" in config else None
        gpukit_torch.install(lib_path, segments=segments)

        def peaks():
            s = gpukit_torch.stats()
            return s["reserved_bytes_peak"], s["allocated_bytes_peak"]
        return peaks
    raise SystemExit(f"train_compare: unknown allocator config {config!r}: expected one of "
                     f"{', '.join(CONFIGS)} or gpukit:SOURCE")


def worker(args):
    model_name, config = args.worker
    started = time.perf_counter()
    peaks = install_allocator(config, args.lib)
    import torch
    torch.manual_seed(0)
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    step = build(model_name, torch, args, amp=not args.fp32)
    times = time_steps(torch, step, args.warmup, args.steps)
    reserved, allocated = peaks()
    result = {
        "model": model_name, "config": config,
        "step_ms_median": statistics.median(times), "step_ms_mean": statistics.fmean(times),
        "step_ms_min": min(times), "steps": args.steps, "warmup": args.warmup,
        "peak_reserved_bytes": int(reserved), "peak_allocated_bytes": int(allocated),
        "seconds": time.perf_counter() - started,
        "alloc_conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF"),
    }
    if config.startswith("gpukit"):
        from gpukit_torch import pluggable as gpukit_torch
        s = gpukit_torch.stats()
        result["gpukit"] = {k: s[k] for k in ("segments", "num_allocs", "num_device_allocs",
                                              "num_device_frees", "num_alloc_retries", "num_ooms",
                                              "bad_frees", "segment_count_peak", "num_pages_created",
                                              "num_pages_reused", "num_cache_hits")}
    report(result)


# ---- the driver: every (model, config) in its own process -------------------------------------

def run_one(model_name, config, args):
    env = dict(os.environ)
    env.pop("PYTORCH_CUDA_ALLOC_CONF", None)
    if ALLOC_CONF.get(config):
        env["PYTORCH_CUDA_ALLOC_CONF"] = ALLOC_CONF[config]
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", model_name, config,
           "--steps", str(args.steps), "--warmup", str(args.warmup), "--lib", args.lib,
           ] + workloads.batch_options(args)
    if args.fp32:
        cmd.append("--fp32")
    return run_worker(cmd, env, args.timeout, model_name, config, tail_lines=6)


def table(results):
    rows = []
    head = (f"{'model':<12} {'allocator':<22} {'step ms':>9} {'vs native':>9} {'vs trivial':>10} "
            f"{'peak reserved GiB':>17} {'peak alloc GiB':>14} {'reserved/alloc':>14}")
    rows.append(head)
    rows.append("-" * len(head))
    ok = [r for r in results if "error" not in r]
    native = {r["model"]: r for r in ok if r["config"] == "native"}
    trivial = {r["model"]: r for r in ok if r["config"] == "trivial"}
    for r in results:
        name = r["config"]
        if "error" in r:
            rows.append(f"{r['model']:<12} {name:<22} ERROR {r['error']}")
            for line in r.get("stderr_tail", []):
                rows.append(f"{'':<12} {'':<22} | {line}")
            continue
        if name.startswith("gpukit") and "gpukit" in r:
            name = f"gpukit ({r['gpukit']['segments']})"
        def ratio(base):
            return f"{r['step_ms_median'] / base['step_ms_median']:.3f}" if base else "-"
        res, alloc = r["peak_reserved_bytes"], r["peak_allocated_bytes"]
        rows.append(f"{r['model']:<12} {name:<22} {r['step_ms_median']:>9.2f} "
                    f"{ratio(native.get(r['model'])):>9} {ratio(trivial.get(r['model'])):>10} "
                    f"{res / GiB:>17.2f} {alloc / GiB:>14.2f} "
                    f"{(res / alloc if alloc else float('nan')):>14.3f}")
    # The pluggable path's own cost: the same cudaMallocAsync pool, through PyTorch's native
    # backend and through CUDAPluggableAllocator.
    for m in dict.fromkeys(r["model"] for r in ok):
        a = {r["config"]: r for r in ok if r["model"] == m}
        if "trivial" in a and "native_async" in a:
            t, n = a["trivial"]["step_ms_median"], a["native_async"]["step_ms_median"]
            rows.append(f"{m}: pluggable path (trivial vs native_async): {t:.2f} vs {n:.2f} ms, "
                        f"{(t / n - 1) * 100:+.1f}%")
    return "\n".join(rows)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    workloads.add_arguments(ap, MODELS, CONFIGS, timeout=150)
    ap.add_argument("--fp32", action="store_true", help="no bf16 autocast")
    ap.add_argument("--lib", help="libgpukit_torch.so (default: as gpukit_torch.pluggable finds it); "
                                  "libgpukit_torch_trivial.so is taken from the same folder")
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args()
    if args.steps < 1 or args.warmup < 0:
        ap.error(f"--steps {args.steps} / --warmup {args.warmup}: need steps >= 1, warmup >= 0")
    if args.lib is None:
        from gpukit_torch import pluggable as gpukit_torch
        args.lib = gpukit_torch.library_path()
    args.lib = os.path.realpath(args.lib)
    if args.worker:
        return worker(args)

    models, configs = workloads.selection(ap, args, CONFIGS, "gpukit:SOURCE")
    started = time.perf_counter()
    info = environment()
    print(f"train_compare: {info.get('gpu')}, torch {info.get('torch')} (CUDA {info.get('cuda')}), "
          f"{info['date']}; {args.steps} steps after {args.warmup} warm-up; lib {args.lib}",
          flush=True)
    results = []
    for m in models:
        for c in configs:
            r = run_one(m, c, args)
            results.append(r)
            state = r.get("error") or f"{r['step_ms_median']:.2f} ms, " \
                f"{r['peak_reserved_bytes'] / GiB:.2f} GiB reserved"
            print(f"  {m:<12} {c:<22} {state}  ({r.get('seconds', 0):.0f} s)", flush=True)
    print()
    print(table(results))
    print(f"\ntotal {time.perf_counter() - started:.0f} s")
    if args.json:
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, "w") as f:
            json.dump({"environment": info, "args": {k: v for k, v in vars(args).items()
                                                     if k != "worker"},
                       "results": results}, f, indent=1)
    return 1 if any("error" in r for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
