# SPDX-License-Identifier: Apache-2.0
"""gpukit's checkpoint plans of real PyTorch models against PyTorch's own options, on the GPU.

One model a run (--model): transformers' GPT2LMHeadModel (12 layers), a small LlamaForCausalLM
(8 layers) or torchvision's ResNet-50 (its 16 Bottlenecks planned). One table, one row a
configuration, each measured in the same process:

- store-all (no checkpointing);
- torch.utils.checkpoint per block (use_reentrant=False);
- selective activation checkpointing per block (torch.utils.checkpoint with
  create_selective_checkpoint_contexts): the outputs of matrix products, attention and
  convolutions saved, everything else (norms, activations, dropout, casts) recomputed in the
  backward, the policy most training codebases start from;
- checkpoint_sequential at every segment count s = 1..L: the blocks cut as
  torch.utils.checkpoint.checkpoint_sequential cuts them (segments of L // s, the last one run
  without checkpointing), each segment run under torch.utils.checkpoint.checkpoint
  (use_reentrant=False). checkpoint_sequential itself takes one-tensor functions; transformers'
  blocks take keyword arguments, so the segments are checkpointed where the model calls them;
- torch.compile with torch._functorch.config.activation_memory_budget (the min-cut partitioner's
  budget) at each --compile-budgets value, where the model compiles;
- gpukit (gpukit_torch.checkpoint.apply) at --budgets budgets evenly from its least feasible
  budget to store-all's peak, and at the peak that each anchor above measured, with its
  predicted peak and time beside the measured ones; at each torch.compile row's peak also on
  torch.compile(model) ("gpukit, compiled": apply() compiles each block with the model's
  compiler and the steps run the compiled model; profiled once, timed in the first pass).

Peak = torch.cuda.max_memory_allocated() during one training step (forward, loss, backward;
parameters' .grad None at its start, as after zero_grad()) beyond what is allocated when it
starts, measured on the step after --warmup steps (for gpukit: after apply()'s own steps, which
close its loop). Time, with CUDA events: after a first pass over every configuration (--steps
steps each), --rounds alternated rounds install each configuration again in turn (gpukit's plans
with gpukit_torch.checkpoint.install, no new apply()) and time --round-steps steps of it, so that
the GPU's drift over the run is shared; a row's time is the median of its rounds' steps (the
torch.compile rows and gpukit's compiled rows keep their first pass's). The table goes to stdout
and to $OUT/torch_checkpoint_<model>.md, every number to $OUT/torch_checkpoint_<model>.json; the
last line is a one-line JSON summary. Configurations left when --deadline-s is near are listed as
skipped, so the run fits one GPU call.

    python3 benchmarks/checkpoint/torch_checkpoint.py --model gpt2 [--steps 20] [--deadline-s 540]
    python3 benchmarks/checkpoint/torch_checkpoint.py --model llama --dry-run   # no GPU: plans only
    python3 benchmarks/checkpoint/torch_checkpoint.py --model gpt2 --no-sweep   # the torch.compile rows
    python3 benchmarks/checkpoint/torch_checkpoint.py --model gpt2 --smoke --compile-budgets 1.0  # no GPU

--dry-run builds the model on the CPU with a small batch, profiles it there (sizes from storages)
and prints gpukit's plan at each budget; it measures nothing. --smoke runs the --no-sweep rows'
code (the per-block anchors, torch.compile rows, gpukit on the compiled model) on the CPU with stand-in measurements, to
find a broken script before a GPU call does; exit status 1 where a row failed.
"""

import argparse
import functools
import json
import os
import statistics
import sys
import time

import torch
import torch._dynamo
from torch import nn
from torch.utils.checkpoint import checkpoint

HERE = os.path.dirname(os.path.abspath(__file__))
try:  # the installed package (planner bound in gpukit_torch._C), else this checkout's
    import gpukit_torch.checkpoint as ckpt
except ImportError:
    sys.path.insert(0, os.path.join(HERE, "..", "..", "bindings", "torch"))
    import gpukit_torch.checkpoint as ckpt  # noqa: E402

MiB = 1 << 20
SELECTIVE = "selective checkpoint per block (matmul, attention, convolution outputs saved)"


# ---- models ----------------------------------------------------------------------------------


def gpt2(device, batch, seq):
    import transformers  # noqa: PLC0415

    config = transformers.GPT2Config(n_layer=12, n_embd=768, n_head=12, n_positions=1024, use_cache=False)
    model = transformers.GPT2LMHeadModel(config).to(device).train()
    ids = torch.randint(0, config.vocab_size, (batch, seq), device=device)
    return model, dict(input_ids=ids, labels=ids, use_cache=False), None


def llama(device, batch, seq):
    import transformers  # noqa: PLC0415

    config = transformers.LlamaConfig(
        hidden_size=1024, intermediate_size=2816, num_hidden_layers=8, num_attention_heads=16,
        num_key_value_heads=4, vocab_size=32000, max_position_embeddings=4096, use_cache=False)
    model = transformers.LlamaForCausalLM(config).to(device).train()
    ids = torch.randint(0, config.vocab_size, (batch, seq), device=device)
    return model, dict(input_ids=ids, labels=ids, use_cache=False), None


def resnet50(device, batch, size):
    import torchvision  # noqa: PLC0415

    model = torchvision.models.resnet50().to(device).to(memory_format=torch.channels_last).train()
    x = torch.randn(batch, 3, size, size, device=device).to(memory_format=torch.channels_last)
    y = torch.randint(0, 1000, (batch,), device=device)
    return model, (x,), lambda out: nn.functional.cross_entropy(out, y)


MODELS = {  # builder, batch, sequence (or image size), on the GPU and in --dry-run
    "gpt2": (gpt2, (4, 1024), (2, 256)),
    "llama": (llama, (4, 1024), (2, 256)),
    "resnet50": (resnet50, (64, 224), (4, 96)),
}


# ---- the anchors: PyTorch's own checkpointing, where the model calls its blocks ----------------


def _forward_of(block):
    return type(block).forward.__get__(block)


def per_block(blocks, **options):
    """torch.utils.checkpoint around every block, with `options` (e.g. context_fn)."""
    for b in blocks:
        own = _forward_of(b)
        b.forward = lambda *a, _own=own, **k: checkpoint(_own, *a, use_reentrant=False, **options, **k)


# The operations whose outputs selective checkpointing saves: the compute-bound ones, so that the
# backward recomputes only cheap, memory-bound work.
_SAVED_OPS = ("mm", "addmm", "bmm", "baddbmm", "convolution", "_scaled_dot_product_flash_attention",
              "_scaled_dot_product_efficient_attention", "_scaled_dot_product_cudnn_attention")


def selective(blocks):
    """Selective activation checkpointing around every block: _SAVED_OPS' outputs kept, the rest
    recomputed."""
    from torch.utils.checkpoint import create_selective_checkpoint_contexts  # noqa: PLC0415

    ops = [getattr(torch.ops.aten, n).default for n in _SAVED_OPS if hasattr(torch.ops.aten, n)]
    per_block(blocks, context_fn=functools.partial(create_selective_checkpoint_contexts, ops))


def segments(blocks, count):
    """checkpoint_sequential's cut: segments of L // count blocks, the remainder in the last one,
    which runs without checkpointing. The first block of a segment runs the whole segment under
    one checkpoint (the other blocks' calls, with the same other arguments, inside it); the
    segment's other blocks return its output when the model calls them."""
    L = len(blocks)
    size = L // count
    bounds = [(k * size, (k + 1) * size) for k in range(count - 1)]
    for s, e in bounds:
        owns = [_forward_of(b) for b in blocks[s:e]]
        cell = {}

        def run_segment(*a, _owns=owns, **k):
            out = None
            for own in _owns:
                out = own(*a, **k)
                h = out if isinstance(out, torch.Tensor) else out[0]
                a = (h,) + tuple(a[1:]) if a else a
                if not a:
                    k = dict(k, hidden_states=h)
            return out

        def first(*a, _run=run_segment, _cell=cell, _more=e - s > 1, **k):
            out = checkpoint(_run, *a, use_reentrant=False, **k)
            if _more:
                _cell["out"] = out
            return out

        def rest(*a, _cell=cell, _last=False, **k):
            # The segment's last block lets go of the output: held from one step to the next, it
            # would be freed in the next step and lower that step's measured peak.
            return _cell.pop("out") if _last else _cell["out"]

        blocks[s].forward = first
        for i in range(s + 1, e):
            blocks[i].forward = functools.partial(rest, _last=i == e - 1)


def restore(blocks):
    for b in blocks:
        b.__dict__.pop("forward", None)


# ---- measurement ---------------------------------------------------------------------------------


class Deadline:
    def __init__(self, seconds):
        self.end = time.time() + seconds
        self.longest = 0.0

    def allows(self):
        return time.time() + 1.5 * self.longest < self.end

    def took(self, seconds):
        self.longest = max(self.longest, seconds)


def measure(model, batch, loss_fn, steps, warmup):
    """(peak bytes beyond the step's start on the step after `warmup`, median step ms)."""
    params = [p for p in model.parameters() if p.requires_grad]

    def step():
        for p in params:
            p.grad = None
        loss_fn(run(model, batch)).backward()

    for _ in range(warmup):
        step()
    torch.cuda.synchronize()
    for p in params:
        p.grad = None
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    step()
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - base
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(steps):
        start.record()
        step()
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop))
    for p in params:
        p.grad = None
    return peak, statistics.median(times), times


def alternate(model, batch, loss_fn, rows, installs, rounds, round_steps, end):
    """Step times in alternated rounds: every measured configuration, installed again in turn,
    one untimed step and `round_steps` timed ones a round (the order rotated and reversed from
    round to round), so that a drift of the GPU's speed over the run falls on every
    configuration alike. Each row's ms
    becomes the median of its rounds' steps (the first pass's stays as first_ms); rounds stop
    where the next would pass `end`. Returns how many rounds ran."""
    measured = [r for r in rows if "peak" in r and r["config"] in installs]
    if not rounds or not measured:
        return 0
    params = [p for p in model.parameters() if p.requires_grad]
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    samples = {r["config"]: [] for r in measured}
    done, longest = 0, 0.0
    for k in range(rounds):
        if time.time() + 1.2 * longest > end:
            break
        t0 = time.time()
        shift = k * len(measured) // rounds
        order = measured[shift:] + measured[:shift]
        for r in (order if k % 2 == 0 else order[::-1]):
            install, uninstall = installs[r["config"]]
            install()
            try:
                for j in range(round_steps + 1):
                    for p in params:
                        p.grad = None
                    start.record()
                    loss_fn(run(model, batch)).backward()
                    stop.record()
                    stop.synchronize()
                    if j:
                        samples[r["config"]].append(start.elapsed_time(stop))
            finally:
                uninstall()
        for p in params:
            p.grad = None
        done += 1
        longest = max(longest, time.time() - t0)
    for r in measured:
        if samples[r["config"]]:
            r["first_ms"], r["ms"] = r["ms"], statistics.median(samples[r["config"]])
            r["round_times"] = samples[r["config"]]
    print(f"  {done} alternated rounds of {round_steps} steps, {longest:.1f} s each", file=sys.stderr, flush=True)
    return done


def run(model, batch):
    return model(**batch) if isinstance(batch, dict) else model(*batch)


def default_loss(out):
    return ckpt._default_loss(out)


def bench(name, steps, warmup, deadline_s, n_budgets, compile_budgets, rounds, round_steps, sweep=True):
    builder, shape, _ = MODELS[name]
    device = torch.device("cuda")
    torch.manual_seed(0)
    model, batch, loss_fn = builder(device, *shape)
    loss_fn = loss_fn or default_loss
    names = ckpt.find_blocks(model)
    blocks = [model.get_submodule(n) for n in names]
    L = len(blocks)
    # The first pass (peaks, plans, first times) takes up to 60% of the time; the alternated
    # rounds of step times the rest.
    deadline_end = time.time() + deadline_s
    deadline = Deadline(deadline_s * (0.6 if rounds else 1.0))
    rows = []

    def row(config, fn, **extra):
        if not deadline.allows():
            rows.append(dict(config=config, note="skipped: deadline", **extra))
            return None
        t0 = time.time()
        try:
            r = fn()
        except Exception as e:  # noqa: BLE001 (a configuration that fails is a row, not the end)
            torch.cuda.empty_cache()
            rows.append(dict(config=config, note=f"failed: {type(e).__name__}: {str(e)[:160]}", **extra))
            return None
        finally:
            deadline.took(time.time() - t0)
        r = dict(config=config, **extra, **r)
        rows.append(r)
        print(f"  {config}: peak {r.get('peak', 0) / MiB:.1f} MiB, {r.get('ms', 0):.2f} ms", file=sys.stderr, flush=True)
        return r

    installs = {}  # configuration -> (install, uninstall), for the alternated rounds

    def anchor_row(config, patch):
        def fn():
            patch()
            try:
                peak, ms, times = measure(model, batch, loss_fn, steps, warmup)
            finally:
                restore(blocks)
            return dict(peak=peak, ms=ms, times=times)

        installs[config] = (patch, lambda: restore(blocks))
        return row(config, fn, kind="anchor")

    anchors = [anchor_row("store-all", lambda: None)]
    anchors.append(anchor_row("torch.utils.checkpoint per block", lambda: per_block(blocks)))
    anchors.append(anchor_row(SELECTIVE, lambda: selective(blocks)))
    for s in range(1, L + 1) if sweep else []:
        anchors.append(anchor_row(f"checkpoint_sequential({s})", lambda s=s: segments(blocks, s)))

    # gpukit: one profile, then plans for each budget (the closed loop runs inside apply()).
    t0 = time.time()
    first = ckpt.apply(model, 1 << 40, batch, loss_fn=loss_fn)
    profile_s = time.time() - t0
    ckpt.remove(model)
    costs, outside = first.costs, first.outside
    store_all = first.predicted_peak
    try:
        ckpt.plan(costs, 0, outside)
        least = 0
    except ckpt.infeasible_budget as e:
        least = e.minimum_budget
    # The least budget as the model sees it before a step has measured what it leaves out; the
    # closed loop may find that it does not fit and name the least that does: that one is taken.
    try:
        ckpt.apply(model, least, batch, loss_fn=loss_fn, costs=costs, outside=outside)
    except ckpt.infeasible_budget as e:
        print(f"least budget {least / MiB:.1f} MiB raised by the closed loop to "
              f"{e.minimum_budget / MiB:.1f} MiB: {e}", file=sys.stderr)
        least = e.minimum_budget
    finally:
        ckpt.remove(model)
    budgets = sorted({int(least + (store_all - least) * k / (n_budgets - 1)) for k in range(n_budgets)})

    def gpukit(budget, config, costs=costs, outside=outside, runner=model):
        """gpukit's plan at `budget` applied to `runner` (the model, or torch.compile of it) and
        measured; a plan of the eager model also goes into the alternated rounds."""
        def fn():
            p = ckpt.apply(runner, budget, batch, loss_fn=loss_fn, costs=costs, outside=outside)
            try:
                peak, ms, times = measure(runner, batch, loss_fn, steps, warmup)
            finally:
                ckpt.remove(runner)
            if runner is model:
                installs[config] = (lambda: ckpt.install(model, p), lambda: ckpt.remove(model))
            return dict(peak=peak, ms=ms, times=times, pred_peak=p.predicted_peak, pred_ms=p.predicted_time_ms,
                        recomputed=p.recomputations, correction=p.correction_bytes, rounds=p.rounds,
                        schedule=p.schedule)
        return fn

    for b in budgets if sweep else []:
        row(f"gpukit @ {b / MiB:.1f} MiB", gpukit(b, f"gpukit @ {b / MiB:.1f} MiB"), kind="gpukit", budget=b)
    for a in [a for a in anchors if sweep and a is not None and "peak" in a]:
        if a["peak"] >= least:
            r = row(f"gpukit @ {a['config']}", gpukit(a["peak"], f"gpukit @ {a['config']}"), kind="gpukit",
                    budget=a["peak"])
            if r is not None:
                r["anchor"] = a["config"]

    # torch.compile with the partitioner's activation memory budget, last: it takes longest. Each
    # row is followed by gpukit's eager plan at its peak.
    compiled_anchors = []
    for frac in compile_budgets:
        def compiled(frac=frac):
            import torch._functorch.config as fconfig  # noqa: PLC0415

            torch._dynamo.reset()
            old = fconfig.activation_memory_budget
            fconfig.activation_memory_budget = frac
            try:
                cm = torch.compile(model)
                peak, ms, times = measure(cm, batch, loss_fn, steps, warmup)
            finally:
                fconfig.activation_memory_budget = old
                torch._dynamo.reset()
            return dict(peak=peak, ms=ms, times=times)

        a = row(f"torch.compile activation_memory_budget={frac}", compiled, kind="anchor")
        if a is None:
            continue
        compiled_anchors.append(a)
        if a["peak"] >= least:
            r = row(f"gpukit @ {a['config']}", gpukit(a["peak"], f"gpukit @ {a['config']}"), kind="gpukit",
                    budget=a["peak"])
            if r is not None:
                r["anchor"] = a["config"]
    # gpukit on torch.compile(model) (apply() compiles each block with the model's compiler; the
    # model's forward around the blocks runs compiled): profiled once, then planned at each
    # torch.compile row's peak. Like those rows, timed in the first pass only.
    if compiled_anchors and deadline.allows():
        torch._dynamo.reset()
        cm = torch.compile(model)
        t0 = time.time()
        try:
            first_c = ckpt.apply(cm, 1 << 40, batch, loss_fn=loss_fn)
            ckpt.remove(cm)
        except Exception as e:  # noqa: BLE001 (reported as a row)
            first_c = None
            torch.cuda.empty_cache()
            rows.append(dict(config="gpukit, compiled", note=f"failed: {type(e).__name__}: {str(e)[:160]}"))
        finally:
            deadline.took(time.time() - t0)
        for a in compiled_anchors if first_c is not None else []:
            config = f"gpukit, compiled @ {a['config']}"
            r = row(config, gpukit(a["peak"], config, first_c.costs, first_c.outside, cm), kind="gpukit",
                    budget=a["peak"])
            if r is not None:
                r["anchor"] = a["config"]
        torch._dynamo.reset()
    rounds_done = alternate(model, batch, loss_fn, rows, installs, rounds, round_steps, deadline_end)
    times = {r["config"]: r["ms"] for r in rows if "ms" in r}
    for r in rows:  # each gpukit row made at an anchor's peak, against that anchor's time
        if "anchor" in r and r["anchor"] in times:
            r["anchor_ms"] = times[r["anchor"]]
    # What gpukit's cost model says of each checkpoint_sequential setting's schedule and of
    # checkpointing every block (for reading the anchors against the model; its runtime can run
    # the same schedules).
    segment = ckpt._segment_schedules(L)
    every_block = ckpt._last_block_later(segment[-1], L)  # every block's input kept, each recomputed
    for r in rows:
        if r["config"].startswith("checkpoint_sequential(") and r["config"] != "checkpoint_sequential(1)":
            s = int(r["config"][len("checkpoint_sequential("):-1])
            r["model_ms"], r["model_peak"] = ckpt.simulate(costs, segment[s - 2], outside)
        elif r["config"] == "torch.utils.checkpoint per block" and every_block is not None:
            r["model_ms"], r["model_peak"] = ckpt.simulate(costs, every_block, outside)
    return dict(model=name, blocks=names, batch=list(shape), profile_s=profile_s, least=least,
                rounds_done=rounds_done, round_steps=round_steps,
                store_all_predicted=store_all, outside=first.outside.__dict__, rows=rows,
                costs=[c.__dict__ for c in costs])


def table(result):
    def mib(v):
        return "-" if v is None else f"{v / MiB:.1f}"

    def ms(v):
        return "-" if v is None else f"{v:.2f}"

    def err(m, p):
        return "-" if m is None or p is None or m == 0 else f"{100.0 * (p - m) / m:+.1f}%"

    lines = [
        f"### {result['model']} ({len(result['blocks'])} blocks, batch {result['batch']}; profiled in "
        f"{result['profile_s']:.1f} s; least feasible {mib(result['least'])} MiB; step times: median of "
        f"{result.get('rounds_done', 0)} alternated rounds of {result['round_steps']} steps)", "",
        "| configuration | budget MiB | peak MiB | predicted MiB | peak error | step ms | predicted ms | time error | note |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---|"]
    for r in result["rows"]:
        note = r.get("note", "")
        if r.get("kind") == "gpukit" and "peak" in r:
            note = f"{r['recomputed']} recomputed, correction {r['correction'] / MiB:.1f} MiB, {len(r['rounds'])} steps in apply"
            if r["peak"] > r["budget"]:
                note += ", OVER BUDGET"
            if "anchor_ms" in r:
                note += f", {r['anchor_ms'] / r['ms']:.2f}x the anchor"
        lines.append(f"| {r['config']} | {mib(r.get('budget'))} | {mib(r.get('peak'))} | {mib(r.get('pred_peak'))} | "
                     f"{err(r.get('peak'), r.get('pred_peak'))} | {ms(r.get('ms'))} | {ms(r.get('pred_ms'))} | "
                     f"{err(r.get('ms'), r.get('pred_ms'))} | {note} |")
    return "\n".join(lines) + "\n"


def _paired_ratios(row, anchor, round_steps):
    """Per alternated round, the row's median step over the anchor's in the same round, sorted
    (empty where either has no rounds)."""
    def rounds(r):
        t = r.get("round_times", [])
        return [statistics.median(t[i:i + round_steps]) for i in range(0, len(t) - round_steps + 1, round_steps)]

    return sorted(x / y for x, y in zip(rounds(row), rounds(anchor)))


def summary(result):
    """gpukit's rows: how many, over budget, the largest prediction errors; and against the
    fastest anchor that fits each gpukit row's measured peak: slower by the medians, and slower
    in at least three quarters of the alternated rounds (the first quartile of the paired
    per-round ratios above 1), which a difference within the rounds' noise is not."""
    g = [r for r in result["rows"] if r.get("kind") == "gpukit" and "peak" in r]
    a = [r for r in result["rows"] if r.get("kind") == "anchor" and "peak" in r]
    slower = beyond_noise = 0
    ratios = []
    for r in g:
        fitting = [x for x in a if x["peak"] <= r["budget"]]
        if fitting:
            best = min(fitting, key=lambda x: x["ms"])
            ratios.append(best["ms"] / r["ms"])
            slower += r["ms"] > best["ms"]
            paired = _paired_ratios(r, best, result.get("round_steps", 1))
            beyond_noise += bool(paired) and paired[len(paired) // 4] > 1.0
    return dict(
        plans=len(g),
        over_budget=sum(1 for r in g if r["peak"] > r["budget"]),
        over_budget_max=max((r["peak"] / r["budget"] - 1 for r in g), default=0.0),
        peak_error_max=max((abs(r["pred_peak"] / r["peak"] - 1) for r in g), default=0.0),
        time_error_max=max((abs(r["pred_ms"] / r["ms"] - 1) for r in g), default=0.0),
        slower_than_fastest_fitting_anchor=slower,
        slower_in_three_quarters_of_rounds=beyond_noise,
        speedup_vs_fastest_fitting_anchor_median=statistics.median(ratios) if ratios else 0.0,
    )


def dry_run(name, n_budgets):
    builder, _, shape = MODELS[name]
    torch.manual_seed(0)
    model, batch, loss_fn = builder(torch.device("cpu"), *shape)
    p = ckpt.apply(model, 1 << 40, batch, loss_fn=loss_fn, repetitions=1, warmup=0)
    ckpt.remove(model)
    costs, outside = p.costs, p.outside
    try:
        ckpt.plan(costs, 0, outside)
        least = 0
    except ckpt.infeasible_budget as e:
        least = e.minimum_budget
    print(f"{name}: {len(p.blocks)} blocks {p.blocks[0]} .. {p.blocks[-1]}, batch {list(shape)} on the CPU "
          f"(sizes from storages; times of this CPU)")
    for c in costs[:3]:
        print(f"  {c}")
    for k in range(n_budgets):
        b = int(least + (p.predicted_peak - least) * k / (n_budgets - 1))
        q = ckpt.plan(costs, b, outside)
        print(f"  budget {b / MiB:8.2f} MiB: predicted {q.predicted_peak / MiB:8.2f} MiB, "
              f"{q.predicted_time_ms:9.2f} ms, {q.recomputations} recomputed: {q.schedule}")


def smoke(name, compile_budgets):
    """bench() on the CPU with a small batch, with measure() and alternate() in stand-ins that
    need no CUDA (peaks 1 TiB, so that every plan is store-all's) and torch.compile's backend
    aot_eager: every row's code runs."""
    global measure, alternate
    placeholder = 1 << 40

    def cpu_measure(model, batch, loss_fn, steps, warmup):
        times = []
        for _ in range(max(steps, 1)):
            t0 = time.perf_counter()
            loss_fn(run(model, batch)).backward()
            times.append((time.perf_counter() - t0) * 1e3)
        for p in model.parameters():
            p.grad = None
        return placeholder, statistics.median(times), times

    measure, alternate = cpu_measure, (lambda *a, **k: 0)
    # aot_eager: dynamo and AOT autograd as on the GPU (graph breaks, the partitioner, saved
    # tensors), without inductor's minutes of C++ compilation on a CPU.
    torch.compile = functools.partial(torch.compile, backend="aot_eager")
    builder = MODELS[name][0]
    shape = (2, 32) if name == "resnet50" else (1, 32)  # the models' own sizes, a small batch
    MODELS[name] = (lambda device, *s: builder(torch.device("cpu"), *s), shape, shape)
    result = bench(name, 1, 0, 3600, 8, compile_budgets, 0, 1, sweep=False)
    failed = [r for r in result["rows"] if r.get("note", "").startswith("failed")]
    for r in result["rows"]:
        print(f"  {r['config']}: {r.get('note') or 'ran'}")
    print(f"torch_checkpoint --smoke: {len(result['rows'])} rows, {len(failed)} failed")
    sys.exit(1 if failed else 0)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", choices=sorted(MODELS), required=True)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--budgets", type=int, default=8)
    ap.add_argument("--compile-budgets", default="1.0,0.5,0.2,0.0",
                    help="activation_memory_budget values for torch.compile ('' for none)")
    ap.add_argument("--deadline-s", type=float, default=540.0)
    ap.add_argument("--rounds", type=int, default=6,
                    help="alternated rounds of step times after the first pass (0: the first pass's times)")
    ap.add_argument("--round-steps", type=int, default=5)
    ap.add_argument("--no-sweep", action="store_true",
                    help="only store-all, per-block (whole and selective) checkpointing and the "
                         "torch.compile rows, each torch.compile row with gpukit's at its peak")
    ap.add_argument("--dry-run", action="store_true")
    ap.add_argument("--smoke", action="store_true",
                    help="no GPU: the whole run's code on the CPU with a small batch, steps timed on "
                         "the CPU, every peak a placeholder of 1 TiB (checks the script, measures nothing)")
    args = ap.parse_args()
    if args.budgets < 8:
        print(f"torch_checkpoint: --budgets {args.budgets}: at least 8", file=sys.stderr)
        sys.exit(2)
    print(f"planner: {ckpt._planner().__name__}", file=sys.stderr)
    if args.dry_run:
        dry_run(args.model, args.budgets)
        return
    if args.smoke:
        smoke(args.model, [float(v) for v in args.compile_budgets.split(",") if v.strip()])
        return
    if not torch.cuda.is_available():
        print("torch_checkpoint: needs a CUDA GPU (torch.cuda.is_available() is False); --dry-run plans without one",
              file=sys.stderr)
        sys.exit(2)
    if args.steps < (3 if args.rounds else 20) or args.round_steps < 1:
        print(f"torch_checkpoint: --steps {args.steps} --round-steps {args.round_steps}: the first pass's steps "
              "must be at least 20 without alternated rounds, 3 with them; --round-steps at least 1",
              file=sys.stderr)
        sys.exit(2)
    torch.backends.cudnn.benchmark = True
    torch.backends.cuda.matmul.allow_tf32 = True  # step times of a realistic training setup
    torch.backends.cudnn.allow_tf32 = True
    prop = torch.cuda.get_device_properties(0)
    header = (f"device {prop.name}, torch {torch.__version__}, CUDA {torch.version.cuda}, "
              f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; command: "
              f"python3 benchmarks/checkpoint/torch_checkpoint.py {' '.join(sys.argv[1:])}\n")
    budgets = [float(v) for v in args.compile_budgets.split(",") if v.strip()]
    result = bench(args.model, args.steps, args.warmup, args.deadline_s, args.budgets, budgets, args.rounds,
                   args.round_steps, sweep=not args.no_sweep)
    result["header"] = header
    text = header + "\n" + table(result)
    print(text, flush=True)
    s = summary(result)
    out = os.environ.get("OUT")
    if out:
        os.makedirs(out, exist_ok=True)
        with open(os.path.join(out, f"torch_checkpoint_{args.model}.md"), "w") as f:
            f.write(text)
        with open(os.path.join(out, f"torch_checkpoint_{args.model}.json"), "w") as f:
            json.dump(dict(result=result, summary=s), f, indent=1)
    print(json.dumps({f"torch_checkpoint_{args.model}": s}))


if __name__ == "__main__":
    main()
