#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Near the memory limit: a process capped at 8 GiB with torch.cuda.set_per_process_memory_fraction
whose live memory never exceeds 75% of the cap, in sizes that vary from step to step. Counts the
out-of-memory errors and the most memory reserved, as a share of the cap, under PyTorch's
allocator, its expandable segments and gpukit's.

    python3 bindings/torch/benchmarks/near_limit.py [--configs native,expandable,gpukit]
            [--cap-gib 8] [--live-fraction 0.75] [--steps 300] [--deadline 60] [--out DIR]
            [--dry-run]

The workload is a plan of allocations and frees made once from --seed, the same in every
process, shaped like training with a sequence length drawn per step:
    persistent  parameters (48 tensors, half of them small, 1-512 KiB; about 9% of the cap) and
                two optimizer states per parameter (28% in all); the parameters allocated
                before step 0, the states at the end of step 0 (as an optimizer's first step
                makes them, between that step's gradients), all kept
    per step    a scale s in [0.25, 1] (the step's sequence length); forward: 12 layers, each
                allocating 3 activations and one small one (4 KiB-1 MiB) kept for backward and
                a temporary freed after the layer, their sizes s times the layer's own (the
                large activations 45% of the cap at s = 1);
                backward, layers in reverse: each layer's parameter gradients (freed at the end
                of the step, as zero_grad(set_to_none=True)) and a temporary per activation,
                then its activations freed
An allocation that would take the plan's live bytes past --live-fraction of the cap is left out
of the plan, so no allocator is ever asked to hold more than that. Tensors are torch.empty
(uint8): only the allocator is measured. An allocation that raises torch.OutOfMemoryError is
counted and skipped (its later free is a no-op); the run goes on.

Reported per allocator: out-of-memory errors (target for gpukit: 0), the step of the first,
torch.cuda.max_memory_reserved() as a share of the cap (target for gpukit: at most 80%), and the
allocator's retries (memory_stats()["num_alloc_retries"]). The allocators run at the same time,
each in its own process (each has its own cap: none measures another; --sequential runs them one
after another), --rounds times, the worst round reported. The run stops starting rounds when the
next would pass --deadline and says so.
"""

import argparse
import math
import os
import random
import sys
import time

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402

DEFAULT_CONFIGS = ("native", "expandable", "gpukit")
TARGET_RESERVED = 0.80  # of the cap, for gpukit
ALIGN = 512
LAYERS = 12
PARAMS_PER_LAYER = 4
ACTS_PER_LAYER = 3


def _log_uniform(rng, lo, hi):
    return math.exp(rng.uniform(math.log(lo), math.log(hi)))


def _scaled(sizes, total):
    k = total / sum(sizes)
    return [max(ALIGN, int(s * k) // ALIGN * ALIGN) for s in sizes]


def make_plan(seed, steps, cap, live_fraction):
    """The workload, as lists of operations per step: ("a", id, bytes) or ("f", id). Step -1
    (the first list) is the persistent state. Returns (steps' lists, statistics of the plan)."""
    rng = random.Random(seed)
    budget = int(cap * live_fraction)
    n_params = LAYERS * PARAMS_PER_LAYER
    params = _scaled([_log_uniform(rng, 0.5, 32) for _ in range(n_params)], 0.20 * cap)
    for k in range(0, n_params, 2):  # every other one small: biases, norms
        params[k] = int(_log_uniform(rng, 1 << 10, 512 << 10)) // ALIGN * ALIGN + ALIGN
    acts = _scaled([_log_uniform(rng, 4, 96) for _ in range(LAYERS * ACTS_PER_LAYER)],
                   0.45 * cap)
    stats_sizes = [int(_log_uniform(rng, 4 << 10, 1 << 20)) for _ in range(LAYERS)]
    temps = _scaled([_log_uniform(rng, 4, 64) for _ in range(LAYERS)], 0.06 * cap)
    live, next_id, left_out, peak, n_alloc, total = {}, 0, 0, 0, 0, 0
    plan = []

    def alloc(ops, nbytes):
        nonlocal next_id, left_out, peak, n_alloc, total
        nbytes = max(ALIGN, int(nbytes) // ALIGN * ALIGN)
        if total + nbytes > budget:
            left_out += 1
            return None
        i = next_id
        next_id += 1
        live[i] = nbytes
        total += nbytes
        ops.append(("a", i, nbytes))
        n_alloc += 1
        peak = max(peak, total)
        return i

    def free(ops, i):
        nonlocal total
        if i is not None:
            total -= live.pop(i)
            ops.append(("f", i))

    ops = []
    for p in params:
        alloc(ops, p)
    plan.append(ops)
    scales = []
    for step in range(steps):
        s = rng.uniform(0.25, 1.0)
        scales.append(s)
        ops, saved, grads = [], [], []
        for layer in range(LAYERS):
            t = alloc(ops, s * temps[layer] * rng.uniform(0.9, 1.1))
            layer_saved = [alloc(ops, s * acts[layer * ACTS_PER_LAYER + k])
                           for k in range(ACTS_PER_LAYER)]
            layer_saved.append(alloc(ops, s * stats_sizes[layer]))  # small: norm statistics
            free(ops, t)
            saved.append(layer_saved)
        for layer in reversed(range(LAYERS)):
            for k in range(PARAMS_PER_LAYER):
                grads.append(alloc(ops, params[layer * PARAMS_PER_LAYER + k]))
            for i in saved[layer]:
                if i is not None:
                    free(ops, alloc(ops, live[i]))
            for i in saved[layer]:
                free(ops, i)
        if step == 0:  # the optimizer's state, made at its first step (as AdamW does)
            for p in params:
                alloc(ops, p)
                alloc(ops, p)
        for g in grads:
            free(ops, g)
        plan.append(ops)
    stats = {"allocations": n_alloc, "left_out": left_out, "peak_live_bytes": peak,
             "peak_live_of_cap": peak / cap, "budget_bytes": budget,
             "persistent_bytes": total,
             "scale_min": min(scales) if scales else None,
             "scale_max": max(scales) if scales else None,
             "largest_bytes": max(b for step in plan for op in step if op[0] == "a"
                                  for b in [op[2]])}
    return plan, stats


# ---- the worker ----------------------------------------------------------------------------

def worker(args):
    config = args.serve
    proto = harness.protocol_channel()
    settings = harness.install_allocator(config)
    import torch  # noqa: PLC0415

    torch.cuda.init()
    cap = int(args.cap_gib * harness.GiB)
    total = torch.cuda.get_device_properties(0).total_memory
    if cap >= total:
        raise SystemExit(f"near_limit: the cap {cap} B is not below the device's {total} B")
    torch.cuda.set_per_process_memory_fraction(cap / total, 0)
    plan, plan_stats = make_plan(args.seed, args.steps, cap, args.live_fraction)

    def handle(request):
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        live, ooms, first_oom, reserved_trace = {}, 0, None, []
        started = time.perf_counter()
        empty, u8, dev = torch.empty, torch.uint8, torch.device("cuda", 0)
        for step, ops in enumerate(plan, start=-1):
            for op in ops:
                if op[0] == "a":
                    try:
                        live[op[1]] = empty(op[2], dtype=u8, device=dev)
                    except torch.OutOfMemoryError:
                        ooms += 1
                        if first_oom is None:
                            first_oom = step
                else:
                    live.pop(op[1], None)
            if step % 10 == 0 or step == len(plan) - 2:
                reserved_trace.append([step, torch.cuda.memory_reserved()])
        torch.cuda.synchronize()
        seconds = time.perf_counter() - started
        stats = torch.cuda.memory_stats()
        result = {
            "ooms": ooms, "first_oom_step": first_oom, "cap_bytes": cap,
            "max_reserved_bytes": torch.cuda.max_memory_reserved(),
            "max_allocated_bytes": torch.cuda.max_memory_allocated(),
            "max_reserved_of_cap": torch.cuda.max_memory_reserved() / cap,
            "alloc_retries": stats.get("num_alloc_retries"),
            "torch_num_ooms": stats.get("num_ooms"),
            "seconds": seconds, "reserved_trace": reserved_trace,
            "gpukit": harness.gpukit_counters(config),
        }
        live.clear()
        return result

    ready = {"settings": settings, "torch": torch.__version__, "cap_bytes": cap,
             "fraction": cap / total, "plan": plan_stats}
    return harness.serve(proto, ready, handle)


# ---- the driver ----------------------------------------------------------------------------

def run_rounds(workers, rounds, sequential, deadline, progress):
    """Each round asks every worker once (harness.Rounds: the order turns each round, and the
    deadline decides whether another starts): all at the same time unless sequential. Returns
    (records, skipped)."""
    records, schedule = [], harness.Rounds(workers, rounds, deadline)
    for r, order in schedule:
        for group in [[c] for c in order] if sequential else [order]:
            sent = []
            for c in group:
                try:
                    workers[c].send({"round": r})
                    sent.append(c)
                except harness.WorkerError as e:
                    records.append({"config": c, "round": r, "error": str(e),
                                    "log_tail": workers[c].log_tail()})
                    workers.pop(c).close()
            for c in sent:
                try:
                    answer = workers[c].receive(max(30.0, deadline.left() + 60))
                except (harness.WorkerError, ValueError) as e:
                    answer = {"error": str(e), "log_tail": workers[c].log_tail()}
                    workers.pop(c).close()
                rec = dict(answer, config=c, round=r)
                records.append(rec)
                progress(rec)
    return records, schedule.skipped()


def summarize(records, configs):
    rows = {}
    for c in configs:
        ok = [r for r in records if r["config"] == c and "error" not in r]
        errors = [r["error"] for r in records if r["config"] == c and "error" in r]
        if not ok:
            rows[c] = {"rounds": 0, "errors": errors}
            continue
        worst = max(ok, key=lambda r: (r["ooms"], r["max_reserved_of_cap"]))
        firsts = [r["first_oom_step"] for r in ok if r["first_oom_step"] is not None]
        rows[c] = {
            "rounds": len(ok), "errors": errors,
            "ooms": [r["ooms"] for r in ok],
            "first_oom_step": min(firsts) if firsts else None,
            "max_reserved_of_cap": max(r["max_reserved_of_cap"] for r in ok),
            "max_allocated_of_cap": max(r["max_allocated_bytes"] / r["cap_bytes"] for r in ok),
            "alloc_retries": worst.get("alloc_retries"),
            "seconds": [round(r["seconds"], 2) for r in ok],
            "gpukit": worst.get("gpukit") or {},
        }
    return rows


def markdown(rows, configs, cap_gib, skipped, failed, plan_stats):
    out = [f"Cap {cap_gib:g} GiB (set_per_process_memory_fraction); the plan's live memory peaks at "
           f"{plan_stats['peak_live_of_cap'] * 100:.1f}% of the cap "
           f"({plan_stats['allocations']} allocations).", "",
           "| allocator | OOMs (per round) | first OOM at step | max reserved, % of cap | "
           "max allocated, % of cap | allocator retries | seconds | target |",
           "|---|---|---|---|---|---|---|---|"]
    for c in configs:
        if c in failed:
            out.append(f"| {c} | did not start: {failed[c]['error']} | | | | | | |")
            continue
        r = rows[c]
        if not r["rounds"]:
            out.append(f"| {c} | failed: {(r['errors'] or ['not run'])[0]} | | | | | | |")
            continue
        target = ""
        if c.startswith("gpukit"):
            met = max(r["ooms"]) == 0 and r["max_reserved_of_cap"] <= TARGET_RESERVED
            target = f"0 OOMs, ≤ {TARGET_RESERVED:.0%}: " + ("met" if met else "missed")
        first = "-" if r["first_oom_step"] is None else str(r["first_oom_step"])
        out.append(f"| {c} | {', '.join(map(str, r['ooms']))} | {first} | "
                   f"{r['max_reserved_of_cap'] * 100:.1f} | {r['max_allocated_of_cap'] * 100:.1f} "
                   f"| {r['alloc_retries']} | {', '.join(map(str, r['seconds']))} | {target} |")
    if skipped:
        out.append(f"\n{skipped}.")
    return "\n".join(out)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=__doc__.split("\n\n", 2)[2])
    ap.add_argument("--configs", default=",".join(DEFAULT_CONFIGS))
    ap.add_argument("--cap-gib", type=float, default=8.0)
    ap.add_argument("--live-fraction", type=float, default=0.75)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--seed", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--sequential", action="store_true", help="one allocator at a time")
    ap.add_argument("--deadline", type=float, default=60.0, help="seconds for the whole run")
    ap.add_argument("--out", help="folder for near_limit.{md,json} and the workers' logs")
    ap.add_argument("--dry-run", action="store_true", help="print the plan; import no torch")
    ap.add_argument("--serve", metavar="CONFIG", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if (args.cap_gib <= 0 or not 0 < args.live_fraction <= 1 or args.steps < 1
            or args.rounds < 1):
        ap.error("need --cap-gib > 0, 0 < --live-fraction <= 1, --steps >= 1, --rounds >= 1")
    if args.serve:
        return worker(args)
    configs = harness.parse_configs(ap, args.configs)
    cap = int(args.cap_gib * harness.GiB)
    _, plan_stats = make_plan(args.seed, args.steps, cap, args.live_fraction)
    print(f"near_limit plan: allocators {', '.join(configs)} "
          f"({'one after another' if args.sequential else 'at the same time'}, a process each); "
          f"cap {args.cap_gib:g} GiB, live at most {args.live_fraction:.0%} of it; "
          f"{args.steps} steps, {plan_stats['allocations']} allocations (largest "
          f"{plan_stats['largest_bytes'] / harness.MiB:.1f} MiB, {plan_stats['left_out']} left "
          f"out to stay under the live limit), live peak "
          f"{plan_stats['peak_live_of_cap'] * 100:.1f}% of the cap, persistent "
          f"{plan_stats['persistent_bytes'] / cap * 100:.1f}%; {args.rounds} round(s); deadline "
          f"{args.deadline} s; results in {args.out or '(stdout only)'}", flush=True)
    if args.dry_run:
        return 0
    deadline = harness.Deadline(args.deadline)
    info = harness.environment()
    print(harness.header_line(info), flush=True)
    log_dir = args.out or os.path.join("/tmp", f"near_limit-{os.getpid()}")
    extra = ["--cap-gib", str(args.cap_gib), "--live-fraction", str(args.live_fraction),
             "--steps", str(args.steps), "--seed", str(args.seed)]
    workers, failed = harness.start_workers(
        os.path.abspath(__file__), configs, extra, log_dir, deadline,
        describe=lambda ready: f"{ready.get('settings')}; fraction "
                 f"{ready.get('fraction', 0):.4f}")

    def progress(rec):
        state = rec.get("error") or (f"{rec['ooms']} OOMs, reserved max "
                                     f"{rec['max_reserved_of_cap'] * 100:.1f}% of the cap, "
                                     f"{rec['seconds']:.1f} s")
        print(f"  round {rec['round']} {rec['config']:<24} {state}", flush=True)

    try:
        records, skipped = run_rounds(workers, args.rounds, args.sequential, deadline, progress)
    finally:
        harness.close_all(workers)
    rows = summarize(records, configs)
    table = markdown(rows, configs, args.cap_gib, skipped, failed, plan_stats)
    return harness.finish(args.out, "near_limit", info, table, deadline, rows, failed,
                          {"args": vars(args), "plan": plan_stats, "records": records, "rounds_skipped": skipped})


if __name__ == "__main__":
    sys.exit(main())
