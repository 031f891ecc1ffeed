#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Training step time and peak device memory under PyTorch's allocator, its expandable segments
and gpukit's native backend, side by side in one run.

    python3 bindings/torch/benchmarks/train_table.py [--rounds 2] [--models ...] [--configs ...]
            [--out DIR]

Every (model, allocator) pair runs in its own process (an allocator is chosen before CUDA is
first used). Rounds alternate the order of the allocators (round r starts at allocator r), so
that drift of the machine during the run does not favour one of them; a pair's step times from
every round are pooled and their median reported.

Models (workloads.py; bf16 autocast): resnet50, vit_b16, gpt2, gpt2_varlen, compiled (the
last under torch.compile(mode="reduce-overhead"), CUDA graphs replayed from the allocator's graph
pools).
Allocators (--configs):
    native        PyTorch's caching allocator
    expandable    the same with PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
    gpukit        gpukit_torch.install() (GPUKIT_ALLOC_CONF from --gpukit-conf, default the
                  backend's own defaults)
    gpukit:CONF   gpukit with install(CONF), e.g. gpukit:segments:growable
Measured:
    step time     wall clock of one step (forward, backward, optimizer) between two
                  torch.cuda.synchronize() calls, after the warm-up steps
    peak device   NVML's used memory of the device, sampled every millisecond by a thread and
                  after every step, minus what was used before the process started CUDA (so the
                  CUDA context, cuBLAS/cuDNN workspaces and the allocator's reserve are counted)
    peak reserved torch.cuda.max_memory_reserved() (PyTorch's statistics, which gpukit's backend
                  fills too)
The table gives each pair's median against the better of native and expandable (the target is
within 2%) and its NVML peak against expandable's (the target is at or below it).
"""

import argparse
import ctypes
import json
import os
import statistics
import sys
import threading
import time

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import workloads  # noqa: E402
from workloads import GiB, build, environment, report, run_worker, time_steps  # noqa: E402

MODELS = ("resnet50", "vit_b16", "gpt2_varlen", "compiled")  # the default; any of workloads.MODELS
CONFIGS = ("native", "expandable", "gpukit")


# ---- NVML through ctypes (no pynvml needed) ------------------------------------------------------

class _Memory(ctypes.Structure):
    _fields_ = [("total", ctypes.c_ulonglong), ("free", ctypes.c_ulonglong),
                ("used", ctypes.c_ulonglong)]


class Nvml:
    """The device's used memory, as nvidia-smi reports it."""

    def __init__(self, index):
        self.lib = ctypes.CDLL("libnvidia-ml.so.1")
        self._check(self.lib.nvmlInit_v2(), "nvmlInit_v2")
        self.handle = ctypes.c_void_p()
        self._check(self.lib.nvmlDeviceGetHandleByIndex_v2(index, ctypes.byref(self.handle)),
                    f"nvmlDeviceGetHandleByIndex_v2({index})")

    @staticmethod
    def _check(rc, what):
        if rc != 0:
            raise RuntimeError(f"{what} failed: NVML error {rc}")

    def used(self):
        m = _Memory()
        self._check(self.lib.nvmlDeviceGetMemoryInfo(self.handle, ctypes.byref(m)),
                    "nvmlDeviceGetMemoryInfo")
        return m.used


class PeakSampler(threading.Thread):
    def __init__(self, nvml):
        super().__init__(daemon=True)
        self.nvml, self.peak, self.running = nvml, nvml.used(), True

    def sample(self):
        self.peak = max(self.peak, self.nvml.used())

    def run(self):
        while self.running:
            self.sample()
            time.sleep(0.001)


# ---- one (model, allocator) in this process ----------------------------------------------------

def worker(args):
    model_name, config = args.worker
    started = time.perf_counter()
    nvml = Nvml(int(os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0] or 0))
    baseline = nvml.used()
    if config.startswith("gpukit"):
        import gpukit_torch
        conf = config.split(":", 1)[1] if ":" in config else args.gpukit_conf
        settings = gpukit_torch.install(conf)
    else:
        settings = os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "")
    import torch
    torch.manual_seed(0)
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    torch.backends.cudnn.benchmark = False
    sampler = PeakSampler(nvml)
    sampler.start()
    step = build(model_name, torch, args)
    times = time_steps(torch, step, args.warmup, args.steps, after_step=sampler.sample)
    sampler.running = False
    sampler.join()
    result = {
        "model": model_name, "config": config, "settings": settings, "times_ms": times,
        "peak_device_bytes": int(sampler.peak - baseline),
        "peak_reserved_bytes": int(torch.cuda.max_memory_reserved()),
        "peak_allocated_bytes": int(torch.cuda.max_memory_allocated()),
        "seconds": time.perf_counter() - started,
    }
    if config.startswith("gpukit"):
        import gpukit_torch
        s = gpukit_torch.gpukit_stats()
        result["gpukit"] = {k: s[k] for k in ("segments", "num_ooms", "num_alloc_retries")
                            if k in s}
    report(result)
    return 0


# ---- the driver --------------------------------------------------------------------------------

def run_one(model_name, config, args):
    env = dict(os.environ)
    env.pop("PYTORCH_CUDA_ALLOC_CONF", None)
    if config == "expandable":
        env["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", model_name, config,
           "--steps", str(args.steps), "--warmup", str(args.warmup),
           "--batch-image", str(args.batch_image), "--batch-gpt2", str(args.batch_gpt2),
           "--gpukit-conf", args.gpukit_conf]
    return run_worker(cmd, env, args.timeout, model_name, config)


def summarize(results, models, configs):
    """Per (model, config): pooled median over rounds, NVML peak (max over rounds)."""
    rows = {}
    for m in models:
        for c in configs:
            runs = [r for r in results if r["model"] == m and r["config"] == c]
            ok = [r for r in runs if "error" not in r]
            if not ok:
                rows[(m, c)] = {"error": runs[0]["error"] if runs else "not run"}
                continue
            times = [t for r in ok for t in r["times_ms"]]
            rows[(m, c)] = {
                "median_ms": statistics.median(times),
                "round_medians_ms": [statistics.median(r["times_ms"]) for r in ok],
                "peak_device_bytes": max(r["peak_device_bytes"] for r in ok),
                "peak_reserved_bytes": max(r["peak_reserved_bytes"] for r in ok),
                "rounds": len(ok), "failed_rounds": len(runs) - len(ok),
            }
    return rows


def markdown(rows, models, configs):
    out = ["| model | allocator | median step (ms) | rounds' medians | vs best of native, expandable "
           "| peak device (GiB, NVML) | vs expandable | peak reserved (GiB) |",
           "|---|---|---|---|---|---|---|---|"]
    for m in models:
        base = [rows[(m, c)]["median_ms"] for c in ("native", "expandable")
                if c in configs and "median_ms" in rows[(m, c)]]
        best = min(base) if base else None
        exp = rows.get((m, "expandable"), {}).get("peak_device_bytes")
        for c in configs:
            r = rows[(m, c)]
            if "error" in r:
                out.append(f"| {m} | {c} | error: {r['error']} | | | | | |")
                continue
            vs_best = f"{r['median_ms'] / best:.3f}" if best else "-"
            vs_exp = f"{r['peak_device_bytes'] / exp:.3f}" if exp else "-"
            rm = ", ".join(f"{v:.1f}" for v in r["round_medians_ms"])
            out.append(f"| {m} | {c} | {r['median_ms']:.2f} | {rm} | {vs_best} | "
                       f"{r['peak_device_bytes'] / GiB:.2f} | {vs_exp} | "
                       f"{r['peak_reserved_bytes'] / GiB:.2f} |")
    return "\n".join(out)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    workloads.add_arguments(ap, MODELS, CONFIGS, timeout=180)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--gpukit-conf", default="", help="install()'s settings for config gpukit")
    ap.add_argument("--out", help="folder for train_table.{json,md}")
    args = ap.parse_args()
    if args.steps < 1 or args.warmup < 0 or args.rounds < 1:
        ap.error(f"--steps {args.steps}, --warmup {args.warmup}, --rounds {args.rounds}: need "
                 "steps >= 1, warmup >= 0, rounds >= 1")
    if args.worker:
        return worker(args)
    models, configs = workloads.selection(ap, args, CONFIGS, "gpukit:CONF")
    started = time.perf_counter()
    info = environment()
    date = info["date"]
    print(f"train_table: {info.get('gpu')}, torch {info.get('torch')} (CUDA {info.get('cuda')}), "
          f"{date}; {args.rounds} rounds of {args.steps} steps after {args.warmup} warm-up",
          flush=True)
    results = []
    for rnd in range(args.rounds):
        order = configs[rnd % len(configs):] + configs[:rnd % len(configs)]
        for m in models:
            for c in order:
                r = run_one(m, c, args)
                r["round"] = rnd
                results.append(r)
                state = r.get("error") or (f"{statistics.median(r['times_ms']):.2f} ms, "
                                           f"{r['peak_device_bytes'] / GiB:.2f} GiB device")
                print(f"  round {rnd} {m:<12} {c:<12} {state}  ({r.get('seconds', 0):.0f} s)",
                      flush=True)
                for line in r.get("stderr_tail", []):
                    print(f"      | {line}", flush=True)
    rows = summarize(results, models, configs)
    table = markdown(rows, models, configs)
    print()
    print(table)
    print(f"\ntotal {time.perf_counter() - started:.0f} s")
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "train_table.md"), "w") as f:
            f.write(f"{date}\n\n{table}\n")
        with open(os.path.join(args.out, "train_table.json"), "w") as f:
            json.dump({"date": date, "environment": info, "args": {k: v for k, v in vars(args).items() if k != "worker"},
                       "results": results}, f, indent=1)
    return 1 if any("error" in r for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
