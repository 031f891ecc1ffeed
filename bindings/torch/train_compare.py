#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Trains ResNet-50 and GPT-2 small for a fixed number of steps on synthetic data under several
CUDA allocators, one subprocess per (model, allocator), and prints the median step time and the
peak reserved memory of each, as a table; writes the same as JSON.

    python3 bindings/torch/train_compare.py                       # every model and allocator
    python3 bindings/torch/train_compare.py --models gpt2_varlen --configs native,gpukit
    python3 bindings/torch/train_compare.py --json out/train_compare.json

Models (random initialisation, nothing downloaded):
    resnet50      torchvision.models.resnet50(weights=None), batch 64 of 224x224 images, SGD
    gpt2          transformers GPT2LMHeadModel(GPT2Config()) (124M), batch 8 x 1024 tokens, AdamW
    gpt2_varlen   the same with a sequence length drawn per step (128..1024, one fixed sequence
                  for every allocator): the shapes that vary from step to step, where allocators
                  fragment
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
import datetime
import json
import os
import random
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.dont_write_bytecode = True  # no __pycache__ in the source tree

MODELS = ("resnet50", "gpt2", "gpt2_varlen")
CONFIGS = ("native", "expandable", "native_async", "trivial", "gpukit")
ALLOC_CONF = {
    "native": None,
    "expandable": "expandable_segments:True",
    "native_async": "backend:cudaMallocAsync",
}
GiB = float(1 << 30)


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


def build(model_name, args):
    """The model and a step(i) function that trains one step on synthetic data."""
    import torch
    dev = torch.device("cuda")
    amp = torch.autocast("cuda", dtype=torch.bfloat16, enabled=not args.fp32)
    if model_name == "resnet50":
        import torchvision
        model = torchvision.models.resnet50(weights=None).to(dev)
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        x = torch.randn(args.batch_resnet, 3, 224, 224, device=dev)
        y = torch.randint(0, 1000, (args.batch_resnet,), device=dev)
        loss_fn = torch.nn.CrossEntropyLoss()

        def step(i):
            with amp:
                loss = loss_fn(model(x), y)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
        return model, step
    if model_name in ("gpt2", "gpt2_varlen"):
        import transformers
        config = transformers.GPT2Config()
        model = transformers.GPT2LMHeadModel(config).to(dev)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
        total = args.warmup + args.steps
        if model_name == "gpt2":
            lengths = [config.n_positions] * total
        else:  # one fixed sequence of lengths, the same for every allocator
            rng = random.Random(1234)
            lengths = [rng.randint(128, config.n_positions) for _ in range(total)]
        gen = torch.Generator(device=dev)
        gen.manual_seed(0)

        def step(i):
            ids = torch.randint(0, config.vocab_size, (args.batch_gpt2, lengths[i]), device=dev,
                                generator=gen)
            with amp:
                loss = model(input_ids=ids, labels=ids).loss
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
        return model, step
    raise SystemExit(f"train_compare: unknown model {model_name!r}: expected one of "
                     f"{', '.join(MODELS)}")


def worker(args):
    model_name, config = args.worker
    started = time.perf_counter()
    peaks = install_allocator(config, args.lib)
    import torch
    torch.manual_seed(0)
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    model, step = build(model_name, args)
    model.train()
    for i in range(args.warmup):
        step(i)
    torch.cuda.synchronize()
    times = []
    for i in range(args.warmup, args.warmup + args.steps):
        t0 = time.perf_counter()
        step(i)
        torch.cuda.synchronize()
        times.append((time.perf_counter() - t0) * 1e3)
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
    print("RESULT " + json.dumps(result), flush=True)


# ---- the driver: every (model, config) in its own process -------------------------------------

def run_one(model_name, config, args):
    env = dict(os.environ)
    env.pop("PYTORCH_CUDA_ALLOC_CONF", None)
    if ALLOC_CONF.get(config):
        env["PYTORCH_CUDA_ALLOC_CONF"] = ALLOC_CONF[config]
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", model_name, config,
           "--steps", str(args.steps), "--warmup", str(args.warmup), "--lib", args.lib,
           "--batch-resnet", str(args.batch_resnet), "--batch-gpt2", str(args.batch_gpt2)]
    if args.fp32:
        cmd.append("--fp32")
    t0 = time.perf_counter()
    try:
        p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=args.timeout)
    except subprocess.TimeoutExpired:
        return {"model": model_name, "config": config, "error": f"timed out after {args.timeout} s"}
    for line in p.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT "):])
    tail = (p.stderr or p.stdout).strip().splitlines()[-6:]
    return {"model": model_name, "config": config, "error": f"exit {p.returncode}",
            "stderr_tail": tail, "seconds": time.perf_counter() - t0}


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


def environment():
    info = {"date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d")}
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version",
                              "--format=csv,noheader"], capture_output=True, text=True, timeout=30)
        info["gpu"] = out.stdout.strip().splitlines()[0] if out.stdout.strip() else None
    except (OSError, subprocess.TimeoutExpired):
        info["gpu"] = None
    try:
        out = subprocess.run([sys.executable, "-c",
                              "import torch, torchvision, transformers; print(torch.__version__, "
                              "torch.version.cuda, torchvision.__version__, "
                              "transformers.__version__)"],
                             capture_output=True, text=True, timeout=120)
        v = out.stdout.split()
        if len(v) == 4:
            info.update(torch=v[0], cuda=v[1], torchvision=v[2], transformers=v[3])
    except (OSError, subprocess.TimeoutExpired):
        pass
    return info


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--configs", default=",".join(CONFIGS))
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--batch-resnet", type=int, default=64)
    ap.add_argument("--batch-gpt2", type=int, default=8)
    ap.add_argument("--fp32", action="store_true", help="no bf16 autocast")
    ap.add_argument("--lib", help="libgpukit_torch.so (default: as gpukit_torch.pluggable finds it); "
                                  "libgpukit_torch_trivial.so is taken from the same folder")
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("--timeout", type=int, default=150, help="seconds per subprocess")
    ap.add_argument("--worker", nargs=2, metavar=("MODEL", "CONFIG"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.steps < 1 or args.warmup < 0:
        ap.error(f"--steps {args.steps} / --warmup {args.warmup}: need steps >= 1, warmup >= 0")
    if args.lib is None:
        from gpukit_torch import pluggable as gpukit_torch
        args.lib = gpukit_torch.library_path()
    args.lib = os.path.realpath(args.lib)
    if args.worker:
        return worker(args)

    models = [m for m in args.models.split(",") if m]
    configs = [c for c in args.configs.split(",") if c]
    for m in models:
        if m not in MODELS:
            ap.error(f"--models: unknown model {m!r} (known: {', '.join(MODELS)})")
    for c in configs:
        if c not in CONFIGS and not c.startswith("gpukit:"):
            ap.error(f"--configs: unknown allocator {c!r} (known: {', '.join(CONFIGS)}, "
                     "gpukit:SOURCE)")
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
