# SPDX-License-Identifier: Apache-2.0
"""gpukit's checkpoint plans against torch.utils.checkpoint.checkpoint_sequential, on the GPU.

For two models, a stack of GPT-2 blocks and ResNet-50's bottleneck stages (both written here, so
neither transformers nor torchvision is needed), one table each over memory budgets:

- store-all (no checkpointing);
- checkpoint_sequential(blocks, segments) for every segments setting 1..L (use_reentrant=False);
- gpukit's plan (gpukit_torch.checkpoint) at the peak that each checkpoint_sequential setting
  measured, with its predicted peak and time beside the measured ones.

Peak = torch.cuda.max_memory_allocated() during a training step, beyond what is allocated when the
step starts (parameters, their gradients, the input); time = the median step time over >= 20
steps after a warm-up, with CUDA events. The tables go to stdout and, when $OUT is set, to
$OUT/torch_checkpoint.md (and .json). The last line is one JSON summary.

    PYTHONPATH=/tmp/gpukit_torch_site /opt/torch/.venv/bin/python \\
        benchmarks/checkpoint/torch_checkpoint.py [--steps 20] [--models gpt2,resnet50]

(after `/opt/torch/.venv/bin/python -m pip install --no-build-isolation --no-deps --target
/tmp/gpukit_torch_site ./bindings/torch`). Exits 2 at once without CUDA.
"""

import argparse
import json
import os
import statistics
import sys
import time

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint_sequential

MiB = 1 << 20


# ---- models --------------------------------------------------------------------------------------


class GPT2Block(nn.Module):
    """One GPT-2 block: pre-LN causal self-attention and MLP, each with a residual."""

    def __init__(self, d, heads, dropout=0.1):
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.ln2 = nn.LayerNorm(d)
        self.fc = nn.Linear(d, 4 * d)
        self.out = nn.Linear(4 * d, d)
        self.drop = nn.Dropout(dropout)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=2)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        a = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True,
                                                       dropout_p=0.1 if self.training else 0.0)
        x = x + self.drop(self.proj(a.transpose(1, 2).reshape(b, t, d)))
        return x + self.drop(self.out(nn.functional.gelu(self.fc(self.ln2(x)), approximate="tanh")))


def gpt2(device, layers=12, d=768, heads=12, batch=4, seq=1024):
    blocks = [GPT2Block(d, heads) for _ in range(layers)]
    x = torch.randn(batch, seq, d, device=device, requires_grad=True)
    return nn.Sequential(*blocks).to(device), x


class Bottleneck(nn.Module):
    """ResNet-50's bottleneck: 1x1, 3x3 (stride), 1x1 convolutions with batch norm, a residual."""

    def __init__(self, cin, width, stride=1):
        super().__init__()
        cout = width * 4
        self.conv1 = nn.Conv2d(cin, width, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.conv2 = nn.Conv2d(width, width, 3, stride=stride, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(width)
        self.conv3 = nn.Conv2d(width, cout, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(cout)
        self.relu = nn.ReLU(inplace=True)
        self.down = None
        if stride != 1 or cin != cout:
            self.down = nn.Sequential(nn.Conv2d(cin, cout, 1, stride=stride, bias=False),
                                      nn.BatchNorm2d(cout))

    def forward(self, x):
        y = self.relu(self.bn1(self.conv1(x)))
        y = self.relu(self.bn2(self.conv2(y)))
        y = self.bn3(self.conv3(y))
        return self.relu(y + (x if self.down is None else self.down(x)))


class Head(nn.Module):
    def __init__(self, cin, classes=1000):
        super().__init__()
        self.fc = nn.Linear(cin, classes)

    def forward(self, x):
        return self.fc(torch.flatten(nn.functional.adaptive_avg_pool2d(x, 1), 1))


def resnet50(device, batch=64, size=224):
    """ResNet-50 as a chain: the stem, the 16 bottlenecks (3, 4, 6, 3), the head: 18 blocks."""
    stem = nn.Sequential(nn.Conv2d(3, 64, 7, stride=2, padding=3, bias=False), nn.BatchNorm2d(64),
                         nn.ReLU(inplace=True), nn.MaxPool2d(3, stride=2, padding=1))
    blocks, cin = [stem], 64
    for width, count, stride in ((64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2)):
        for k in range(count):
            blocks.append(Bottleneck(cin, width, stride if k == 0 else 1))
            cin = width * 4
    blocks.append(Head(cin))
    x = torch.randn(batch, 3, size, size, device=device, requires_grad=True)
    return nn.Sequential(*blocks).to(device).to(memory_format=torch.channels_last), \
        x.detach().to(memory_format=torch.channels_last).requires_grad_()


# ---- measurement ---------------------------------------------------------------------------------


def measure(step, params, steps, warmup=3):
    """(peak bytes beyond the step's start, median step ms) of `step()` (forward + backward)."""
    for p in params:
        p.grad = torch.zeros_like(p)
    for _ in range(warmup):
        step()
    torch.cuda.synchronize()
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
    return peak, statistics.median(times)


def sequential_schedule(L, segments):
    """checkpoint_sequential(segments) as a gpukit schedule: the last segment recorded, each other
    run without recording and recomputed (recorded) before its backward."""
    size = L // segments  # as torch: segments of L // segments, the remainder in the last one
    bounds, start = [], 1
    for _ in range(segments - 1):
        bounds.append((start, start + size - 1))
        start += size
    bounds.append((start, L))
    ops = []
    for s, e in bounds[:-1]:
        ops += [f"Fn{i}" for i in range(s, e + 1)]
    s, e = bounds[-1]
    ops += [f"Fe{i}" for i in range(s, e + 1)] + [f"B{i}" for i in range(e, s - 1, -1)]
    for s, e in reversed(bounds[:-1]):
        ops += [f"Fe{i}" for i in range(s, e + 1)] + [f"B{i}" for i in range(e, s - 1, -1)]
    return " ".join(ops)


def run_model(name, model, x, steps, ckpt):
    blocks = list(model)
    L = len(blocks)
    params = [p for p in model.parameters() if p.requires_grad]

    def plain():
        model(x).sum().backward()

    t0 = time.time()
    costs = ckpt.profile(blocks, x, repetitions=5, warmup=2)
    profile_s = time.time() - t0
    all_time, all_pred = ckpt.simulate(costs, sequential_schedule(L, 1))  # store-all
    rows = []
    peak, ms = measure(plain, params, steps)
    rows.append(dict(config="store-all", peak=peak, ms=ms, pred_peak=all_pred, pred_ms=all_time))
    for segments in range(1, L + 1):
        def seq(segments=segments):
            checkpoint_sequential(model, segments, x, use_reentrant=False).sum().backward()

        peak, ms = measure(seq, params, steps)
        pt, pp = ckpt.simulate(costs, sequential_schedule(L, segments))
        rows.append(dict(config=f"checkpoint_sequential({segments})", peak=peak, ms=ms,
                         pred_peak=pp, pred_ms=pt))
    seq_rows = list(rows[1:])
    for r in seq_rows:
        try:
            plan = ckpt.plan(costs, r["peak"])
        except ckpt.infeasible_budget as e:
            rows.append(dict(config=f"gpukit @ {r['config']}", budget=r["peak"], peak=None, ms=None,
                             pred_peak=None, pred_ms=None, note=f"infeasible (least {e.minimum_budget / MiB:.0f} MiB)"))
            continue
        planned = ckpt.PlannedSequential(blocks, plan, costs)

        def step(planned=planned):
            planned(x).sum().backward()

        peak, ms = measure(step, params, steps)
        recomputed = sum(1 for k, _ in plan.ops if k != "B") - L
        rows.append(dict(config=f"gpukit @ {r['config']}", budget=r["peak"], peak=peak, ms=ms,
                         pred_peak=plan.predicted_peak, pred_ms=plan.predicted_time_ms,
                         note=f"{recomputed} recomputed", vs_seq_ms=r["ms"]))
    return dict(model=name, blocks=L, profile_s=profile_s, rows=rows)


def table(result):
    def mib(v):
        return "-" if v is None else f"{v / MiB:.1f}"

    def ms(v):
        return "-" if v is None else f"{v:.2f}"

    def err(m, p):
        return "-" if m is None or p is None or m == 0 else f"{100.0 * (p - m) / m:+.1f}%"

    lines = [f"### {result['model']} ({result['blocks']} blocks; profiled in {result['profile_s']:.1f} s)", "",
             "| configuration | budget MiB | peak MiB | predicted MiB | peak error | step ms | predicted ms | time error | note |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---|"]
    for r in result["rows"]:
        lines.append(f"| {r['config']} | {mib(r.get('budget'))} | {mib(r['peak'])} | {mib(r['pred_peak'])} | "
                     f"{err(r['peak'], r['pred_peak'])} | {ms(r['ms'])} | {ms(r['pred_ms'])} | "
                     f"{err(r['ms'], r['pred_ms'])} | {r.get('note', '')} |")
    return "\n".join(lines) + "\n"


def summary(results):
    """Per model: gpukit's plans at each checkpoint_sequential peak, how many were faster, the
    largest peak over budget, and the largest prediction errors."""
    out = {}
    for res in results:
        g = [r for r in res["rows"] if r["config"].startswith("gpukit") and r["peak"] is not None]
        out[res["model"]] = dict(
            plans=len(g),
            faster=sum(1 for r in g if r["ms"] <= r["vs_seq_ms"]),
            over_budget_max=max((r["peak"] / r["budget"] - 1 for r in g), default=0.0),
            peak_error_max=max((abs(r["pred_peak"] / r["peak"] - 1) for r in g), default=0.0),
            time_error_max=max((abs(r["pred_ms"] / r["ms"] - 1) for r in g), default=0.0),
            speedup_median=statistics.median([r["vs_seq_ms"] / r["ms"] for r in g]) if g else 0.0,
        )
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--models", default="gpt2,resnet50")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("torch_checkpoint: needs a CUDA GPU (torch.cuda.is_available() is False)", file=sys.stderr)
        sys.exit(2)
    if args.steps < 20:
        print("torch_checkpoint: --steps must be at least 20", file=sys.stderr)
        sys.exit(2)
    try:  # the installed package (planner bound in gpukit_torch._C), else this checkout's
        import gpukit_torch.checkpoint as ckpt  # noqa: PLC0415
    except ImportError:
        sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bindings", "torch"))
        import gpukit_torch.checkpoint as ckpt  # noqa: PLC0415
    print(f"planner: {ckpt._planner().__name__}", file=sys.stderr)

    torch.manual_seed(0)
    torch.backends.cudnn.benchmark = True
    torch.backends.cuda.matmul.allow_tf32 = True  # step times of a realistic training setup
    device = torch.device("cuda")
    builders = {"gpt2": gpt2, "resnet50": resnet50}
    prop = torch.cuda.get_device_properties(device)
    header = (f"device {prop.name}, torch {torch.__version__}, CUDA {torch.version.cuda}, "
              f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}\n")
    results, text = [], header + "\n"
    for name in args.models.split(","):
        model, x = builders[name](device)
        res = run_model(name, model, x, args.steps, ckpt)
        results.append(res)
        t = table(res)
        print(t, flush=True)
        text += t + "\n"
        del model, x
        torch.cuda.empty_cache()
    s = summary(results)
    out = os.environ.get("OUT")
    if out:
        os.makedirs(out, exist_ok=True)
        with open(os.path.join(out, "torch_checkpoint.md"), "w") as f:
            f.write(text)
        with open(os.path.join(out, "torch_checkpoint.json"), "w") as f:
            json.dump(dict(results=results, summary=s), f, indent=1)
    print(json.dumps(dict(torch_checkpoint=s)))


if __name__ == "__main__":
    main()
