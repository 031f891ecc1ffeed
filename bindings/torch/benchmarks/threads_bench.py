#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Threads allocating on their own streams through PyTorch's C++ allocator API
(c10::cuda::CUDACachingAllocator::raw_alloc_with_stream / raw_delete): million allocations a
second under PyTorch's allocator and under gpukit's, alternating inside one run.

    python3 bindings/torch/benchmarks/threads_bench.py [--threads 1,16] [--rounds 8]
            [--seconds 0.25] [--lib PATH] [--deadline 60] [--out DIR] [--dry-run]
    python3 bindings/torch/benchmarks/threads_bench.py --build-only --lib PATH

The C++ side is threads_bench.cpp, compiled once with g++ against the installed torch's headers
and c10 libraries into --lib (rebuilt only when missing or older than the source) and loaded
with ctypes into each worker. From Python threads the GIL would be measured instead: hence C++.

Each allocator runs in a worker process of its own that stays up for the whole run. A batch:
N threads, each with its own stream from PyTorch's stream pool, keep a ring of --live blocks and
replace the oldest with a new one, sizes cycling through a fixed mixed list (log-uniform 512 B
to 2 MiB, the same in every worker); --warmup-ops per thread first (the caches fill), then all
threads start together and run for --seconds. Every round runs one batch per thread count and
allocator, the allocators' order turning from round to round. Reported: the median over rounds
of million allocations a second, and the median of the rounds' ratios to native's (the target
for gpukit at 16 threads: at least 10).

The run stops starting rounds when the next would pass --deadline and says how many it skipped.
"""

import argparse
import ctypes
import math
import os
import random
import shlex
import subprocess
import sys

sys.dont_write_bytecode = True
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import harness  # noqa: E402

SOURCE = os.path.join(HERE, "threads_bench.cpp")
DEFAULT_LIB = os.path.join("/tmp", "gpukit_threads_bench.so")
DEFAULT_CONFIGS = ("native", "gpukit")
TARGET = 10.0  # gpukit's throughput over native's, at TARGET_THREADS
TARGET_THREADS = 16

_TORCH_QUERY = r"""
import os, sys, torch
from torch.utils import cpp_extension
print(os.path.dirname(torch.__file__))
print(int(torch._C._GLIBCXX_USE_CXX11_ABI))
print(cpp_extension.CUDA_HOME or "")
"""


def sizes_list(seed, count=64, lo=512, hi=2 << 20):
    rng = random.Random(seed)
    return [int(math.exp(rng.uniform(math.log(lo), math.log(hi)))) for _ in range(count)]


# ---- building the library --------------------------------------------------------------------

def cuda_include(torch_dir, cuda_home):
    """A folder holding cuda_runtime_api.h: CUDA_HOME's, /usr/local/cuda's, or the CUDA runtime
    wheel's beside torch."""
    site = os.path.dirname(torch_dir)
    candidates = [os.path.join(h, "include") for h in
                  (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), cuda_home,
                   "/usr/local/cuda") if h]
    for sub in ("cu13", "cuda_runtime", "cu12"):
        candidates.append(os.path.join(site, "nvidia", sub, "include"))
    for c in candidates:
        if os.path.isfile(os.path.join(c, "cuda_runtime_api.h")):
            return c
    raise SystemExit("threads_bench: no cuda_runtime_api.h in " + ", ".join(candidates) +
                     "; set CUDA_HOME")


def build(lib, force=False):
    """Compiles threads_bench.cpp into lib unless lib is newer than the source. Returns the
    compile command (None when the library was up to date)."""
    if (not force and os.path.isfile(lib)
            and os.path.getmtime(lib) >= os.path.getmtime(SOURCE)):
        return None
    q = subprocess.run([sys.executable, "-c", _TORCH_QUERY], capture_output=True, text=True,
                       timeout=300)
    if q.returncode != 0:
        raise SystemExit("threads_bench: cannot ask torch where it is:\n" + q.stderr[-2000:])
    torch_dir, abi, cuda_home = (q.stdout.strip().splitlines() + ["", "", ""])[:3]
    os.makedirs(os.path.dirname(os.path.abspath(lib)), exist_ok=True)
    tmp = f"{lib}.{os.getpid()}.tmp"
    cmd = [os.environ.get("CXX", "g++"), "-O2", "-std=c++17", "-shared", "-fPIC",
           f"-D_GLIBCXX_USE_CXX11_ABI={abi}", SOURCE,
           "-isystem", os.path.join(torch_dir, "include"),
           "-isystem", cuda_include(torch_dir, cuda_home),
           "-L" + os.path.join(torch_dir, "lib"), "-lc10", "-lc10_cuda",
           "-Wl,-rpath," + os.path.join(torch_dir, "lib"), "-o", tmp]
    print("threads_bench: " + " ".join(shlex.quote(a) for a in cmd), flush=True)
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if r.returncode != 0:
        raise SystemExit(f"threads_bench: the build failed ({r.returncode}):\n"
                         + (r.stderr or r.stdout)[-4000:])
    os.replace(tmp, lib)
    return cmd


# ---- the worker ----------------------------------------------------------------------------

def worker(args):
    config = args.serve
    proto = harness.protocol_channel()
    settings = harness.install_allocator(config)
    import torch  # noqa: PLC0415 (loads libc10 before the library, which then shares it)

    torch.cuda.init()
    torch.empty(1, device="cuda")  # the allocator is set up
    lib = ctypes.CDLL(os.path.abspath(args.lib))
    fn = lib.gpukit_threads_bench
    fn.restype = ctypes.c_int
    fn.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.POINTER(ctypes.c_size_t),
                   ctypes.c_int, ctypes.c_long, ctypes.c_double, ctypes.POINTER(ctypes.c_double),
                   ctypes.c_char_p, ctypes.c_int]
    sizes = sizes_list(args.seed)
    c_sizes = (ctypes.c_size_t * len(sizes))(*sizes)
    device = torch.cuda.current_device()

    def handle(request):
        out = (ctypes.c_double * 4)()
        err = ctypes.create_string_buffer(1024)
        rc = fn(int(request["threads"]), device, int(request["live"]), c_sizes, len(sizes),
                int(request["warmup_ops"]), float(request["seconds"]), out, err, len(err))
        if rc != 0:
            return {"error": err.value.decode(errors="replace")}
        allocs, secs = out[0], out[1]
        return {"threads": int(request["threads"]), "allocs": int(allocs), "seconds": secs,
                "mallocs_per_s": allocs / secs / 1e6 if secs > 0 else None,
                "thread_min": int(out[2]), "thread_max": int(out[3]),
                "reserved_bytes": torch.cuda.memory_reserved()}

    handle({"threads": 1, "live": args.live, "warmup_ops": 100, "seconds": 0.01})  # first touch
    ready = {"settings": settings, "torch": torch.__version__, "device": device}
    return harness.serve(proto, ready, handle)


# ---- the driver ----------------------------------------------------------------------------

def summarize(records, configs, reference, thread_counts):
    rows = {}
    for t in thread_counts:
        case = f"threads={t}"
        for c in configs:
            ok = [r for r in records if r["case"] == case and r["config"] == c
                  and "error" not in r]
            errors = [r["error"] for r in records if r["case"] == case and r["config"] == c
                      and "error" in r]
            ratios = (harness.per_round_ratios(records, case, c, reference, "mallocs_per_s")
                      if c != reference else [])
            rows[f"{t}/{c}"] = {
                "threads": t, "config": c, "rounds": len(ok),
                "median_mallocs_per_s": harness.median_or_none([r["mallocs_per_s"] for r in ok]),
                "ratios": ratios, "median_ratio": harness.median_or_none(ratios),
                "ratio_q1": harness.quantile(ratios, 0.25),
                "ratio_q3": harness.quantile(ratios, 0.75),
                "fairness": harness.median_or_none([r["thread_min"] / r["thread_max"]
                                                    for r in ok if r.get("thread_max")]),
                "errors": errors,
            }
    return rows


def markdown(rows, configs, reference, thread_counts, skipped, failed):
    out = [f"| threads | allocator | million allocations/s (median of rounds) | vs {reference} "
           "(median of rounds' ratios) | ratios' quartiles | slowest/fastest thread | rounds "
           "| target |", "|---|---|---|---|---|---|---|---|"]
    for t in thread_counts:
        for c in configs:
            if c in failed:
                out.append(f"| {t} | {c} | did not start: {failed[c]['error']} | | | | | |")
                continue
            r = rows[f"{t}/{c}"]
            m = (f"{r['median_mallocs_per_s']:.3f}" if r["median_mallocs_per_s"] is not None
                 else "-")
            if c == reference:
                ratio, quart, target = "1 (reference)", "", ""
            elif r["median_ratio"] is None:
                ratio, quart, target = "-", "", ""
            else:
                ratio = f"{r['median_ratio']:.2f}"
                quart = f"{r['ratio_q1']:.2f} – {r['ratio_q3']:.2f}"
                target = ((f"≥ {TARGET:g}x: " + ("met" if r["median_ratio"] >= TARGET
                                                  else "missed"))
                          if c.startswith("gpukit") and t == TARGET_THREADS else "")
            fair = f"{r['fairness']:.2f}" if r["fairness"] is not None else "-"
            err = f" ({len(r['errors'])} failed: {r['errors'][0]})" if r["errors"] else ""
            out.append(f"| {t} | {c} | {m} | {ratio} | {quart} | {fair} | {r['rounds']}{err} "
                       f"| {target} |")
    if skipped:
        out.append(f"\n{skipped}.")
    return "\n".join(out)


def plan(args, configs, thread_counts):
    sizes = sizes_list(args.seed)
    per_round = len(configs) * len(thread_counts) * (args.seconds + 0.1)
    print(f"threads_bench plan: allocators {', '.join(configs)} (one worker process each); "
          f"threads {', '.join(map(str, thread_counts))}; {args.rounds} rounds of one batch per "
          f"thread count and allocator (about {per_round:.1f} s a round); a batch: each thread "
          f"on its own stream, a ring of {args.live} blocks, {args.warmup_ops} warm-up "
          f"operations, then {args.seconds} s timed; {len(sizes)} sizes {min(sizes)} B .. "
          f"{max(sizes) / harness.MiB:.1f} MiB; library {args.lib} (built from "
          f"{os.path.basename(SOURCE)} if missing or older); deadline {args.deadline} s; results "
          f"in {args.out or '(stdout only)'}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=__doc__.split("\n\n", 2)[2])
    ap.add_argument("--configs", default=",".join(DEFAULT_CONFIGS),
                    help="allocators; native (if named) is the reference, else the first")
    ap.add_argument("--threads", default=f"1,{TARGET_THREADS}", help="thread counts")
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--seconds", type=float, default=0.25, help="timed part of a batch")
    ap.add_argument("--warmup-ops", type=int, default=2000, help="per thread, before timing")
    ap.add_argument("--live", type=int, default=8, help="blocks each thread keeps")
    ap.add_argument("--seed", type=int, default=11)
    ap.add_argument("--lib", default=DEFAULT_LIB, help="the compiled threads_bench.cpp")
    ap.add_argument("--build-only", action="store_true", help="build --lib and stop")
    ap.add_argument("--deadline", type=float, default=60.0, help="seconds for the whole run")
    ap.add_argument("--out", help="folder for threads_bench.{md,json} and the workers' logs")
    ap.add_argument("--dry-run", action="store_true", help="print the plan; import no torch")
    ap.add_argument("--serve", metavar="CONFIG", help=argparse.SUPPRESS)
    args = ap.parse_args()
    try:
        thread_counts = [int(t) for t in args.threads.split(",") if t]
    except ValueError:
        ap.error(f"--threads {args.threads!r}: a comma-separated list of numbers")
    if (not thread_counts or min(thread_counts) < 1 or args.rounds < 1 or args.seconds <= 0
            or args.live < 1 or args.warmup_ops < 0):
        ap.error("need --threads >= 1 each, --rounds >= 1, --seconds > 0, --live >= 1, "
                 "--warmup-ops >= 0")
    if args.serve:
        return worker(args)
    configs = harness.parse_configs(ap, args.configs)
    reference = "native" if "native" in configs else configs[0]
    args.lib = os.path.abspath(args.lib)
    plan(args, configs, thread_counts)
    if args.dry_run:
        return 0
    deadline = harness.Deadline(args.deadline)
    build(args.lib)
    if args.build_only:
        print(f"threads_bench: {args.lib} is built", flush=True)
        return 0
    info = harness.environment()
    print(harness.header_line(info), flush=True)
    log_dir = args.out or os.path.join("/tmp", f"threads_bench-{os.getpid()}")
    extra = ["--lib", args.lib, "--live", str(args.live), "--seed", str(args.seed)]
    workers, failed = harness.start_workers(os.path.abspath(__file__), configs, extra, log_dir,
                                            deadline)

    def progress(rec):
        state = rec.get("error") or (f"{rec['mallocs_per_s']:.3f} M allocations/s "
                                     f"(threads {rec['thread_min']}..{rec['thread_max']})")
        print(f"  round {rec['round']:>2} {rec['case']:<11} {rec['config']:<24} {state}",
              flush=True)

    cases = [(f"threads={t}", {"threads": t, "live": args.live, "warmup_ops": args.warmup_ops,
                               "seconds": args.seconds}) for t in thread_counts]
    try:
        records, skipped = harness.alternate(workers, cases, args.rounds, deadline, timeout=120,
                                             progress=progress)
    finally:
        harness.close_all(workers)
    rows = summarize(records, configs, reference, thread_counts)
    table = markdown(rows, configs, reference, thread_counts, skipped, failed)
    return harness.finish(args.out, "threads_bench", info, table, deadline, rows, failed,
                          {"args": vars(args), "records": records, "rounds_skipped": skipped})


if __name__ == "__main__":
    sys.exit(main())
