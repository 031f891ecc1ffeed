#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Training step time and peak device memory under PyTorch's allocator, its expandable segments
and gpukit's native backend, side by side in one run.

    python3 bindings/torch/benchmarks/train_table.py [--rounds 2] [--models ...] [--configs ...]
            [--deadline 300] [--out DIR] [--dry-run]

Every (model, allocator) pair runs in its own process (an allocator is chosen before CUDA is
first used), one at a time (the device's memory is measured). Rounds alternate the order of the
allocators (round r starts at allocator r), so that drift of the machine during the run does not
favour one of them; a pair's step times from every round are pooled and their median reported.
A process starts only while --deadline (seconds since the start) leaves time for it (as long as
that model's longest process so far, or 20 s before there was one); the rest are skipped, and
the table says which.

Models (workloads.py; bf16 autocast): resnet50 (batch 128), vit_b16 (batch 64), gpt2_varlen
(sequence length 64..1024 per step), bert_varlen (64..512 per step), compiled (under
torch.compile(mode="reduce-overhead"), CUDA graphs replayed from the allocator's graph pools) by
default; gpt2 (fixed length) on request.
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
within 2%) and its NVML peak against expandable's (the target is at most 0.5% above it). As step i
has the same shapes under every allocator, it also gives the median over steps of the paired ratio
(step i against the same step under native, and under expandable), which the drift of the machine
between processes disturbs less, and, for gpukit, the segment maps and unmaps (growable: pages)
per timed step, from gpukit's own counters: in a steady state they are 0.
"""

import argparse
import ctypes
import os
import statistics
import sys
import threading
import time

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
import workloads  # noqa: E402
from workloads import GiB, build, environment, report, run_worker, time_steps  # noqa: E402

# The default; any of workloads.MODELS.
MODELS = ("resnet50", "vit_b16", "gpt2_varlen", "bert_varlen", "compiled")
CONFIGS = ("native", "expandable", "gpukit")
TARGET_PEAK = 1.005  # gpukit's NVML peak over expandable's
TARGET_STEP = 1.02  # gpukit's median step over the better of native's and expandable's
FIRST_GUESS_S = 20  # a model's process, before one has run
# gpukit's segment counters, counted over the timed steps (growable: pages mapped and unmapped).
SEGMENT_COUNTERS = ("num_device_allocs", "num_device_frees", "num_pages_created",
                    "num_pages_released")


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
    counts = {}

    def gpukit_counts():
        if not config.startswith("gpukit"):
            return {}
        import gpukit_torch
        s = gpukit_torch.gpukit_stats()
        return {k: s[k] for k in SEGMENT_COUNTERS if k in s}

    times = time_steps(torch, step, args.warmup, args.steps, after_step=sampler.sample,
                       before_timed=lambda: counts.update(gpukit_counts()))
    timed_counts = {k: v - counts.get(k, 0) for k, v in gpukit_counts().items()}
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
        result["gpukit"]["timed_steps"] = timed_counts
    report(result)
    return 0


# ---- the driver --------------------------------------------------------------------------------

def run_one(model_name, config, args, timeout):
    env = dict(os.environ)
    env.pop("PYTORCH_CUDA_ALLOC_CONF", None)
    if config == "expandable":
        env["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", model_name, config,
           "--steps", str(args.steps), "--warmup", str(args.warmup),
           "--gpukit-conf", args.gpukit_conf] + workloads.batch_options(args)
    return run_worker(cmd, env, timeout, model_name, config)


def summarize(results, models, configs):
    """Per (model, config): pooled median over rounds, NVML peak (max over rounds)."""
    rows = {}
    for m in models:
        for c in configs:
            runs = [r for r in results if r["model"] == m and r["config"] == c
                    and "skipped" not in r]
            ok = [r for r in runs if "error" not in r]
            if not ok:
                rows[(m, c)] = ({"error": runs[0]["error"]} if runs
                                else {"skipped": "not run: the deadline came first"})
                continue
            times = [t for r in ok for t in r["times_ms"]]
            rows[(m, c)] = {
                "median_ms": statistics.median(times),
                "round_medians_ms": [statistics.median(r["times_ms"]) for r in ok],
                "peak_device_bytes": max(r["peak_device_bytes"] for r in ok),
                "peak_reserved_bytes": max(r["peak_reserved_bytes"] for r in ok),
                "rounds": len(ok), "failed_rounds": len(runs) - len(ok),
                # Step i has the same shapes under every allocator (the lengths are drawn from a
                # fixed seed), so per-step medians over rounds pair up across allocators.
                "step_medians_ms": [statistics.median(ts) for ts in zip(*(r["times_ms"]
                                                                          for r in ok))],
            }
            timed = [r["gpukit"]["timed_steps"] for r in ok
                     if "timed_steps" in r.get("gpukit", {})]
            if timed:
                steps = sum(len(r["times_ms"]) for r in ok)
                rows[(m, c)]["maps_per_step"] = sum(t.get("num_device_allocs", 0)
                                                    for t in timed) / steps
                rows[(m, c)]["unmaps_per_step"] = sum(t.get("num_device_frees", 0)
                                                      for t in timed) / steps
    return rows


def paired_ratio(row, anchor):
    """Median over step indices of row's step time over anchor's at the same step; None when
    either has no steps."""
    pairs = [a / b for a, b in zip(row.get("step_medians_ms", []),
                                   anchor.get("step_medians_ms", [])) if b > 0]
    return statistics.median(pairs) if pairs else None


def markdown(rows, models, configs, skipped):
    out = ["| model | allocator | median step (ms) | rounds' medians | vs best of native, expandable "
           "| paired per step vs native, expandable | segment maps / unmaps per timed step "
           "| peak device (GiB, NVML) | vs expandable | peak reserved (GiB) | target |",
           "|---|---|---|---|---|---|---|---|---|---|---|"]
    for m in models:
        base = [rows[(m, c)]["median_ms"] for c in ("native", "expandable")
                if c in configs and "median_ms" in rows[(m, c)]]
        best = min(base) if base else None
        exp = rows.get((m, "expandable"), {}).get("peak_device_bytes")
        for c in configs:
            r = rows[(m, c)]
            if "error" in r or "skipped" in r:
                what = f"error: {r['error']}" if "error" in r else r["skipped"]
                out.append(f"| {m} | {c} | {what} | | | | | | | | |")
                continue
            vs_best = f"{r['median_ms'] / best:.3f}" if best else "-"
            vs_exp = f"{r['peak_device_bytes'] / exp:.3f}" if exp else "-"
            rm = ", ".join(f"{v:.1f}" for v in r["round_medians_ms"])
            target = ""
            if c.startswith("gpukit") and best and exp:
                met = (r["peak_device_bytes"] / exp <= TARGET_PEAK
                       and r["median_ms"] / best <= TARGET_STEP)
                target = (f"peak ≤ {TARGET_PEAK:g}x, step ≤ {TARGET_STEP:g}x: "
                          + ("met" if met else "missed"))
            failed = f" ({r['failed_rounds']} failed)" if r["failed_rounds"] else ""
            paired = []
            for a in ("native", "expandable"):
                ratio = (paired_ratio(r, rows[(m, a)]) if c != a and (m, a) in rows else None)
                paired.append(f"{ratio:.3f}" if ratio else "-")
            maps = (f"{r['maps_per_step']:.1f} / {r['unmaps_per_step']:.1f}"
                    if "maps_per_step" in r else "")
            out.append(f"| {m} | {c} | {r['median_ms']:.2f} | {rm}{failed} | {vs_best} | "
                       f"{', '.join(paired)} | {maps} | "
                       f"{r['peak_device_bytes'] / GiB:.2f} | {vs_exp} | "
                       f"{r['peak_reserved_bytes'] / GiB:.2f} | {target} |")
    if skipped:
        out.append("")
        out.append(f"Skipped at the deadline ({len(skipped)}): "
                   + ", ".join(f"round {r} {m}/{c}" for r, m, c in skipped) + ".")
    return "\n".join(out)


def plan(args, models, configs):
    runs = args.rounds * len(models) * len(configs)
    print(f"train_table plan: {args.rounds} rounds x {len(models)} models x {len(configs)} "
          f"allocators = {runs} processes, one at a time; {args.warmup} warm-up + {args.steps} "
          f"timed steps each; deadline {args.deadline:g} s (about {args.deadline / runs:.1f} s a "
          f"process), at most {args.timeout} s a process; results in "
          f"{args.out or '(stdout only)'}")
    for m in models:
        batch = workloads.batch_of(m, args) if m in workloads.BATCH else "32 x 256 (fixed)"
        print(f"  model {m:<12} batch {batch}")
    for rnd in range(args.rounds):
        order = configs[rnd % len(configs):] + configs[:rnd % len(configs)]
        print(f"  round {rnd}: every model under {', '.join(order)}, in that order")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=__doc__.split("\n\n", 2)[2])
    workloads.add_arguments(ap, MODELS, CONFIGS, timeout=180)
    ap.set_defaults(steps=12, warmup=4)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--gpukit-conf", default="", help="install()'s settings for config gpukit")
    ap.add_argument("--deadline", type=float, default=300.0,
                    help="seconds for the whole run; processes that would not fit are skipped")
    ap.add_argument("--out", help="folder for train_table.{json,md}")
    ap.add_argument("--dry-run", action="store_true", help="print the plan; import no torch")
    args = ap.parse_args()
    if args.steps < 1 or args.warmup < 0 or args.rounds < 1:
        ap.error(f"--steps {args.steps}, --warmup {args.warmup}, --rounds {args.rounds}: need "
                 "steps >= 1, warmup >= 0, rounds >= 1")
    if args.worker:
        return worker(args)
    models, configs = workloads.selection(ap, args, CONFIGS, "gpukit:CONF")
    plan(args, models, configs)
    if args.dry_run:
        return 0
    deadline = harness.Deadline(args.deadline)
    # The versions are asked of a Python that imports torch, torchvision and transformers (some
    # seconds): meanwhile the first process runs, since the deadline counts them.
    info = {}
    asker = threading.Thread(target=lambda: info.update(environment()), daemon=True)
    asker.start()
    print(f"train_table: {args.rounds} rounds of {args.steps} steps after {args.warmup} warm-up",
          flush=True)
    results, skipped, longest = [], [], {}
    for rnd in range(args.rounds):
        order = configs[rnd % len(configs):] + configs[:rnd % len(configs)]
        for m in models:
            for c in order:
                need = longest.get(m, FIRST_GUESS_S)
                if not deadline.allows(need):
                    skipped.append((rnd, m, c))
                    results.append({"model": m, "config": c, "round": rnd,
                                    "skipped": f"deadline: {deadline.left():.0f} s left, "
                                               f"{need:.0f} s needed"})
                    print(f"  round {rnd} {m:<12} {c:<12} skipped (deadline)", flush=True)
                    continue
                t0 = time.monotonic()
                timeout = max(10, int(min(args.timeout, deadline.left())))
                r = run_one(m, c, args, timeout)
                longest[m] = max(longest.get(m, 0), time.monotonic() - t0)
                r["round"] = rnd
                results.append(r)
                state = r.get("error") or (f"{statistics.median(r['times_ms']):.2f} ms, "
                                           f"{r['peak_device_bytes'] / GiB:.2f} GiB device")
                print(f"  round {rnd} {m:<12} {c:<12} {state}  ({r.get('seconds', 0):.0f} s)",
                      flush=True)
                for line in r.get("stderr_tail", []):
                    print(f"      | {line}", flush=True)
    asker.join(timeout=120)
    print(f"train_table: {harness.header_line(info)}", flush=True)
    rows = summarize(results, models, configs)
    table = markdown(rows, models, configs, skipped)
    print()
    print(table)
    print(f"\ntotal {deadline.elapsed():.0f} s")
    harness.write_outputs(args.out, "train_table", harness.command_line(), info, table,
                          {"args": {k: v for k, v in vars(args).items() if k != "worker"},
                           "results": results, "skipped": skipped,
                           "rows": [dict(v, model=m, config=c) for (m, c), v in rows.items()]})
    return 1 if any("error" in r for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
