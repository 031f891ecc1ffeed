#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""The cost of `torch.empty(n, device="cuda")` and its free, from Python, one thread: PyTorch's
allocator against gpukit's, alternating many times inside one run.

    python3 bindings/torch/benchmarks/empty_free.py [--configs native,gpukit] [--rounds 40]
            [--ops 20000] [--live 0] [--deadline 60] [--out DIR] [--dry-run]

Each allocator runs in a worker process of its own that stays up for the whole run (PyTorch
picks its allocator once per process). A batch is --ops calls of torch.empty(size,
dtype=torch.uint8, device="cuda") over a fixed list of mixed sizes (log-uniform, 512 B to
16 MiB, the same list and order in every worker), each tensor dropped at once (--live 0) or
kept in a ring of --live tensors, so that every call frees the tensor of --live calls ago; the
garbage collector is off during a batch. Every round runs one batch per allocator, the order
turning from round to round; nothing else runs meanwhile. Reported per allocator: the median
over rounds of ns per empty+free, and the median over rounds of its time over native's in the
same round (the target for gpukit: at most 0.8), with the ratios' quartiles.

`floor` is PyTorch's own allocator asked for torch.empty(0, ...): PyTorch's allocate() skips its
allocator's malloc for zero bytes (a null storage, whose free does nothing), and everything else
the call does (Python, dispatch, the tensor and its storage) stays. Its time is the least any
allocator's torch.empty + free could take; the table gives each allocator's share of what an
allocator could save, (native - it) / (native - floor).

The run stops starting rounds when the next would pass --deadline (seconds since the start,
worker start-up included) and says how many it skipped.
"""

import argparse
import gc
import math
import os
import random
import statistics
import sys
import time

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402

DEFAULT_CONFIGS = ("native", "gpukit", "floor")
CONFIGS = harness.CONFIGS + ("floor",)
TARGET = 0.8  # gpukit's time over native's


def sizes_list(seed, count, lo=512, hi=16 << 20):
    """`count` sizes, log-uniform in [lo, hi], the same for a given seed in every process."""
    rng = random.Random(seed)
    return [int(math.exp(rng.uniform(math.log(lo), math.log(hi)))) for _ in range(count)]


# ---- the worker ----------------------------------------------------------------------------

def run_batch(torch, seq, live):
    """ns per torch.empty + free over seq (a list of sizes)."""
    empty, u8, dev = torch.empty, torch.uint8, torch.device("cuda", 0)
    gc.disable()
    try:
        if live <= 0:
            t0 = time.perf_counter_ns()
            for n in seq:
                empty(n, dtype=u8, device=dev)
            t1 = time.perf_counter_ns()
        else:
            ring = [None] * live
            j = 0
            t0 = time.perf_counter_ns()
            for n in seq:
                ring[j] = empty(n, dtype=u8, device=dev)
                j = j + 1 if j + 1 < live else 0
            t1 = time.perf_counter_ns()
            del ring
    finally:
        gc.enable()
    return (t1 - t0) / len(seq)


def worker(args):
    config = args.serve
    proto = harness.protocol_channel()
    settings = harness.install_allocator(config)
    import torch  # noqa: PLC0415

    torch.cuda.init()
    sizes = sizes_list(args.seed, args.distinct)
    seq = [0 if config == "floor" else sizes[i % len(sizes)] for i in range(args.ops)]
    warm = run_batch(torch, seq, args.live)  # fills the caches; not reported

    def handle(request):
        ns = run_batch(torch, seq, request.get("live", args.live))
        return {"ns_per_op": ns, "reserved_bytes": torch.cuda.memory_reserved()}

    ready = {"settings": settings, "torch": torch.__version__, "warmup_ns_per_op": warm}
    return harness.serve(proto, ready, handle)


# ---- the driver ----------------------------------------------------------------------------

def summarize(records, configs, reference):
    rows = {}
    for c in configs:
        ok = [r for r in records if r["config"] == c and "error" not in r]
        errors = [r["error"] for r in records if r["config"] == c and "error" in r]
        ratios = (harness.per_round_ratios(records, "empty_free", c, reference, "ns_per_op")
                  if c != reference else [])
        rows[c] = {
            "rounds": len(ok),
            "median_ns_per_op": harness.median_or_none([r["ns_per_op"] for r in ok]),
            "ratios": ratios,
            "median_ratio": harness.median_or_none(ratios),
            "ratio_q1": harness.quantile(ratios, 0.25),
            "ratio_q3": harness.quantile(ratios, 0.75),
            "errors": errors,
        }
    return rows


def share_of_savings(rows, config, reference):
    """(reference - config) / (reference - floor) of the median times: how much of what any
    allocator could save `config` saves; None without a floor below the reference."""
    ref, floor = rows.get(reference, {}), rows.get("floor", {})
    a, f, x = ref.get("median_ns_per_op"), floor.get("median_ns_per_op"), rows[config]["median_ns_per_op"]
    if a is None or f is None or x is None or a <= f:
        return None
    return (a - x) / (a - f)


def markdown(rows, configs, reference, skipped, failed):
    out = [f"| allocator | median ns per empty+free | time vs {reference} (median of rounds' "
           "ratios) | ratios' quartiles | share of what an allocator can save | rounds | target |",
           "|---|---|---|---|---|---|---|"]
    for c in configs:
        if c in failed:
            out.append(f"| {c} | did not start: {failed[c]['error']} | | | | | |")
            continue
        r = rows[c]
        ns = f"{r['median_ns_per_op']:.0f}" if r["median_ns_per_op"] is not None else "-"
        if c == reference:
            ratio, quart, target = "1 (reference)", "", ""
        elif r["median_ratio"] is None:
            ratio, quart, target = "-", "", ""
        else:
            ratio = f"{r['median_ratio']:.3f}"
            quart = f"{r['ratio_q1']:.3f} – {r['ratio_q3']:.3f}"
            target = ((f"≤ {TARGET}: " + ("met" if r["median_ratio"] <= TARGET else "missed"))
                      if c.startswith("gpukit") else "")
        share = share_of_savings(rows, c, reference) if c not in (reference, "floor") else None
        share = f"{share:.2f}" if share is not None else ""
        if c == "floor":
            share = "1 (torch.empty(0): no allocator work)"
        err = f" ({len(r['errors'])} failed: {r['errors'][0]})" if r["errors"] else ""
        out.append(f"| {c} | {ns} | {ratio} | {quart} | {share} | {r['rounds']}{err} | {target} |")
    if skipped:
        out.append(f"\n{skipped}.")
    return "\n".join(out)


def plan(args, configs):
    sizes = sizes_list(args.seed, args.distinct)
    print(f"empty_free plan: allocators {', '.join(configs)} (one worker process each, started "
          f"together); {args.rounds} rounds, each one batch per allocator in turning order; a "
          f"batch: {args.ops} torch.empty + free, {args.distinct} distinct sizes "
          f"({min(sizes)} B .. {max(sizes) / harness.MiB:.1f} MiB, median "
          f"{statistics.median(sizes) / 1024:.0f} KiB), live ring {args.live}; deadline "
          f"{args.deadline} s; results in {args.out or '(stdout only)'}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=__doc__.split("\n\n", 2)[2])
    ap.add_argument("--configs", default=",".join(DEFAULT_CONFIGS),
                    help="allocators; native (if named) is the reference, else the first")
    ap.add_argument("--rounds", type=int, default=40)
    ap.add_argument("--ops", type=int, default=20000, help="empty+free calls per batch")
    ap.add_argument("--distinct", type=int, default=1000, help="distinct sizes in the list")
    ap.add_argument("--live", type=int, default=0, help="tensors kept alive (0: freed at once)")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--deadline", type=float, default=60.0, help="seconds for the whole run")
    ap.add_argument("--out", help="folder for empty_free.{md,json} and the workers' logs")
    ap.add_argument("--dry-run", action="store_true", help="print the plan; import no torch")
    ap.add_argument("--serve", metavar="CONFIG", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.rounds < 1 or args.ops < 1 or args.distinct < 1 or args.live < 0:
        ap.error("need --rounds >= 1, --ops >= 1, --distinct >= 1, --live >= 0")
    if args.serve:
        return worker(args)
    configs = harness.parse_configs(ap, args.configs, CONFIGS)
    reference = "native" if "native" in configs else configs[0]
    plan(args, configs)
    if args.dry_run:
        return 0
    deadline = harness.Deadline(args.deadline)
    info = harness.environment()
    print(harness.header_line(info), flush=True)
    log_dir = args.out or os.path.join("/tmp", f"empty_free-{os.getpid()}")
    extra = ["--ops", str(args.ops), "--distinct", str(args.distinct), "--live", str(args.live),
             "--seed", str(args.seed)]
    workers, failed = harness.start_workers(
        os.path.abspath(__file__), configs, extra, log_dir, deadline,
        describe=lambda ready: f"{ready.get('settings')}; warm-up "
                 f"{ready.get('warmup_ns_per_op', 0):.0f} ns/op")

    def progress(rec):
        state = rec.get("error") or f"{rec['ns_per_op']:.0f} ns/op"
        print(f"  round {rec['round']:>3} {rec['config']:<24} {state}", flush=True)

    try:
        records, skipped = harness.alternate(workers, [("empty_free", {"live": args.live})],
                                             args.rounds, deadline, timeout=120,
                                             progress=progress)
    finally:
        harness.close_all(workers)
    rows = summarize(records, configs, reference)
    table = markdown(rows, configs, reference, skipped, failed)
    return harness.finish(args.out, "empty_free", info, table, deadline, rows, failed,
                          {"args": vars(args), "records": records, "rounds_skipped": skipped})


if __name__ == "__main__":
    sys.exit(main())
