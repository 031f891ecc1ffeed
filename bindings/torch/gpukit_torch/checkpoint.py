# SPDX-License-Identifier: Apache-2.0
"""Activation checkpointing of a PyTorch chain of blocks, planned by gpukit under a memory budget.

    import gpukit_torch.checkpoint as ckpt
    model = nn.Sequential(*blocks).cuda()
    planned = ckpt.sequential(model, budget_bytes=2 << 30, example_input=x)
    loss = planned(x).sum()          # forward under the plan
    loss.backward()                  # recomputes what the plan dropped; gradients as without it
    print(planned.plan.schedule, planned.plan.predicted_peak, planned.plan.predicted_time_ms)

sequential() profiles each block on the device of `example_input` (profile()), plans with
gpukit's planner (gpukit::plan_best: the least time of any schedule on chains of up to 11 blocks,
rotor's dynamic program beyond; bound in gpukit_torch._C; where that extension is
not installed, as on a machine without CUDA, the same C++ planner is compiled from
csrc/planner.cpp on first use) and returns a module that runs the planned schedule inside
autograd.

The cost model (gpukit/checkpoint/chain.hpp): block i has forward time f_i, backward time b_i,
output size a_i (the bytes its output holds) and tape size t_i (what autograd keeps for its
backward beyond its input and output). The schedule's operations are run as they are written, by
one autograd.Function over the whole chain:

- ``Fn<i>``: the block's forward under no_grad;
- ``Fe<i>``: the block's forward with autograd recording, on its input detached (the graph of that
  one block is the tape);
- ``B<i>``: torch.autograd.backward through the block's graph: the gradient of its input, and
  its parameters' gradients accumulated into their ``.grad`` in place (as torch.utils.checkpoint's
  reentrant variant does, and as a backward without checkpointing accumulates them: no second
  copy of the parameter gradients is held). Use ``loss.backward()``; ``torch.autograd.grad(loss,
  params)`` does not see parameter gradients through the planned chain.

Every schedule the planner makes is therefore executed faithfully, recomputations included; no
schedule is restricted. Each activation and tape is dropped right after its last use, as the
planner's simulator counts. Recomputed forwards see the RNG state of the block's first forward
(CPU and the input's CUDA device, forked as torch.utils.checkpoint does: afterwards the generator
continues as if the recomputation had not run), and the autocast state of the forward.

Limits: each block takes one tensor and returns one tensor; the input's gradient is computed when
it requires grad; double backward (create_graph) is not supported; a block's side effects (e.g.
BatchNorm's running statistics) happen again when it is recomputed, as with torch.utils.checkpoint.
"""

import os
import statistics
import time
from dataclasses import dataclass, field
from typing import List, Optional, Sequence

import torch
from torch import nn

__all__ = [
    "BlockCost",
    "CheckpointPlan",
    "PlannedSequential",
    "infeasible_budget",
    "plan",
    "profile",
    "sequential",
    "simulate",
]

_HERE = os.path.dirname(os.path.abspath(__file__))
_planner_module = None


def _planner():
    """gpukit's planner: gpukit_torch._C, else csrc/planner.cpp compiled alone (no CUDA needed)."""
    global _planner_module
    if _planner_module is not None:
        return _planner_module
    try:
        from . import _C  # noqa: PLC0415

        if hasattr(_C, "plan"):
            _planner_module = _C
            return _C
    except ImportError:
        pass
    from torch.utils.cpp_extension import load  # noqa: PLC0415

    source = os.path.join(_HERE, "..", "csrc", "planner.cpp")
    include = os.environ.get("GPUKIT_INCLUDE_DIR") or os.path.join(_HERE, "..", "..", "..", "include")
    marker = os.path.join(include, "gpukit", "checkpoint", "planners.hpp")
    if not (os.path.isfile(source) and os.path.isfile(marker)):
        raise ImportError(
            "gpukit_torch.checkpoint: gpukit's planner is not available: gpukit_torch._C is not "
            "installed, and " + source + " or " + marker + " is missing to build it (set "
            "GPUKIT_INCLUDE_DIR to gpukit's include folder, or pip install ./bindings/torch)"
        )
    _planner_module = load(
        name="_gpukit_planner",
        sources=[os.path.abspath(source)],
        extra_cflags=["-O2", "-std=c++17", "-DGPUKIT_TORCH_PLANNER_MODULE"],
        extra_include_paths=[os.path.abspath(include)],
        verbose=False,
    )
    return _planner_module


# ---------------------------------------------------------------------------------------------
# Costs


@dataclass
class BlockCost:
    """What profile() measured for one block (times in milliseconds, sizes in bytes)."""

    forward_ms: float
    backward_ms: float
    output_bytes: int
    tape_bytes: int
    transient_bytes: int = 0  # peak beyond what the operation leaves held (workspaces)

    def stage(self, time_unit_ms: float = 1e-3):
        """(f, b, a, t) for the planner: times in integer units of time_unit_ms (at least 1)."""
        return (
            max(1, round(self.forward_ms / time_unit_ms)),
            max(1, round(self.backward_ms / time_unit_ms)),
            int(self.output_bytes),
            int(self.tape_bytes),
        )


def _blocks_of(model) -> List[nn.Module]:
    blocks = list(model) if isinstance(model, (nn.Sequential, nn.ModuleList, list, tuple)) else None
    if not blocks:
        raise TypeError(
            "gpukit_torch.checkpoint: expected an nn.Sequential or a non-empty list of blocks, got "
            + type(model).__name__
        )
    return blocks


def _params(block) -> List[torch.Tensor]:
    if not isinstance(block, nn.Module):
        return []
    return [p for p in block.parameters() if p.requires_grad]


def _storage_bytes(tensors) -> int:
    seen, total = set(), 0
    for t in tensors:
        if isinstance(t, torch.Tensor):
            s = t.untyped_storage()
            if s.data_ptr() not in seen:
                seen.add(s.data_ptr())
                total += s.nbytes()
    return total


class _Timer:
    """Milliseconds of work on the device: CUDA events on CUDA, a steady clock elsewhere."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        if self.cuda:
            self.start = torch.cuda.Event(enable_timing=True)
            self.stop = torch.cuda.Event(enable_timing=True)

    def __call__(self, work):
        if self.cuda:
            self.start.record()
            out = work()
            self.stop.record()
            self.stop.synchronize()
            return self.start.elapsed_time(self.stop), out
        t0 = time.perf_counter()
        out = work()
        return (time.perf_counter() - t0) * 1e3, out


def _recorded_forward(block, x, keep_saved=True):
    """The block's forward with autograd recording, on x detached: (input leaf, output, saved).
    saved lists the tensors autograd saved when keep_saved, else it is empty: a list of them keeps
    them alive after the backward has freed the graph, which memory measurements must not see."""
    xin = x.detach().requires_grad_(x.is_floating_point() or x.is_complex())
    saved = []
    if not keep_saved:
        with torch.enable_grad():
            return xin, block(xin), saved

    def pack(t):
        saved.append(t)
        return t

    with torch.enable_grad(), torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = block(xin)
    return xin, out, saved


def _grad_inputs(block, xin):
    return ([xin] if xin.requires_grad else []) + _params(block)


def _measure_sizes(block, x, cuda: bool):
    """(output bytes, tape bytes, transient bytes, the output) of one block on input x."""
    if cuda:
        # One untimed forward and backward first: libraries allocate their workspaces (cuBLAS)
        # and tune (cuDNN) on first use, memory that belongs to no activation.
        xin, out, _ = _recorded_forward(block, x, keep_saved=False)
        inputs = _grad_inputs(block, xin)
        if out.requires_grad and inputs:
            torch.autograd.grad(out, inputs, torch.ones_like(out), allow_unused=True)
        del xin, out, inputs
        torch.cuda.synchronize()
        before = torch.cuda.memory_allocated()
        with torch.no_grad():
            y = block(x)
        torch.cuda.synchronize()
        a = torch.cuda.memory_allocated() - before
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        xin, out, _ = _recorded_forward(block, x, keep_saved=False)
        torch.cuda.synchronize()
        held = torch.cuda.memory_allocated() - base
        fwd_transient = torch.cuda.max_memory_allocated() - base - held
        t = max(0, held - a)
        inputs = _grad_inputs(block, xin)
        if out.requires_grad and inputs:
            g = torch.ones_like(out)
            start = torch.cuda.memory_allocated()
            torch.cuda.reset_peak_memory_stats()
            grads = torch.autograd.grad(out, inputs, g, allow_unused=True)
            torch.cuda.synchronize()
            bwd_transient = torch.cuda.max_memory_allocated() - start - _storage_bytes(grads)
            del grads, g
        else:
            bwd_transient = 0
        return max(0, a), t, max(0, fwd_transient, bwd_transient), y
    # Elsewhere: the bytes of the output's storage, and of the tensors autograd saves beyond the
    # input's, the output's and the block's parameters and buffers.
    with torch.no_grad():
        y = block(x)
    xin, out, saved = _recorded_forward(block, x)
    known = {xin.untyped_storage().data_ptr(), out.untyped_storage().data_ptr()}
    if isinstance(block, nn.Module):  # parameters and buffers are not activations
        known |= {t.untyped_storage().data_ptr() for t in (*block.parameters(), *block.buffers())}
    tape = [s for s in saved if s.untyped_storage().data_ptr() not in known]
    return _storage_bytes([y]), _storage_bytes(tape), 0, y


def _time_block(timer, block, x):
    """(forward ms, backward ms) of one run: the forward under no_grad, the backward through a
    recorded forward (not timed)."""
    with torch.no_grad():
        ms_f = timer(lambda: block(x))[0]
    xin, out, _ = _recorded_forward(block, x, keep_saved=False)
    inputs = _grad_inputs(block, xin)
    if not (out.requires_grad and inputs):
        return ms_f, 0.0
    g = torch.ones_like(out)
    return ms_f, timer(lambda: torch.autograd.grad(out, inputs, g, allow_unused=True))[0]


def profile(model, example_input: torch.Tensor, repetitions: int = 5, warmup: int = 2) -> List[BlockCost]:
    """Measures each block of `model` (an nn.Sequential or a list of blocks) on the device of
    `example_input`, each block on the previous block's output.

    Times: the median of `repetitions` runs after `warmup` runs, with CUDA events on CUDA (a
    steady clock elsewhere); forward under no_grad, backward as torch.autograd.grad through a
    recorded forward (parameter .grad fields are not touched). Sizes on CUDA: from
    torch.cuda.memory_allocated / max_memory_allocated around the block's forward without and with
    grad (output = what a forward without grad leaves allocated; tape = what a recording forward
    leaves allocated beyond that; transient = the peak beyond what an operation leaves held);
    elsewhere, from the storages of the output and of the tensors autograd saves. The RNG state is
    restored afterwards. Synchronizes the device.
    """
    if repetitions < 1 or warmup < 0:
        raise ValueError(f"gpukit_torch.checkpoint.profile: repetitions={repetitions}, warmup={warmup}")
    blocks = _blocks_of(model)
    device = example_input.device
    cuda = device.type == "cuda"
    timer = _Timer(device)
    costs = []
    devices = [device] if cuda else []
    with torch.random.fork_rng(devices=devices):
        x = example_input.detach()
        for block in blocks:
            a, t, transient, y = _measure_sizes(block, x, cuda)
            fwd, bwd = [], []
            for rep in range(warmup + repetitions):
                ms_f, ms_b = _time_block(timer, block, x)
                if rep >= warmup:
                    fwd.append(ms_f)
                    bwd.append(ms_b)
            costs.append(BlockCost(statistics.median(fwd), statistics.median(bwd), a, t, transient))
            x = y.detach()
    return costs


# ---------------------------------------------------------------------------------------------
# Plans


@dataclass
class CheckpointPlan:
    """A schedule of gpukit's planner with its predictions.

    schedule: the operations ("Fn1 Fe2 B2 ..."); budget: the budget asked for (bytes);
    predicted_peak: the simulator's peak plus the largest transient (bytes beyond what is
    allocated when the forward starts); predicted_time_ms: the simulator's time of the step.
    """

    schedule: str
    budget: int
    predicted_peak: int
    predicted_time_ms: float
    stages: list = field(default_factory=list)
    transient_bytes: int = 0
    exact: bool = True

    @property
    def ops(self):
        return _parse(self.schedule)


class infeasible_budget(ValueError):
    """No schedule fits the budget; minimum_budget is the least budget (bytes) that has one."""

    def __init__(self, message: str, minimum_budget: int):
        super().__init__(message)
        self.minimum_budget = minimum_budget


_TIME_UNIT_MS = 1e-3  # the planner's time unit: microseconds


def plan(costs: Sequence[BlockCost], budget_bytes: int) -> CheckpointPlan:
    """gpukit::plan_best for the blocks' costs under `budget_bytes` (activation memory beyond
    what is allocated when the forward starts, transients included). Raises infeasible_budget."""
    stages = [c.stage(_TIME_UNIT_MS) for c in costs]
    transient = max((c.transient_bytes for c in costs), default=0)
    budget = int(budget_bytes)
    r = _planner().plan(stages, max(0, budget - transient))
    if r["infeasible"] or budget < transient:
        least = int(r.get("minimum_budget", 0)) + transient
        raise infeasible_budget(
            f"gpukit_torch.checkpoint: no schedule fits {budget} bytes; the least budget with one "
            f"is {least} bytes (activations {least - transient}, transients {transient})",
            least,
        )
    return CheckpointPlan(
        schedule=r["schedule"],
        budget=budget,
        predicted_peak=int(r["peak"]) + transient,
        predicted_time_ms=r["time"] * _TIME_UNIT_MS,
        stages=stages,
        transient_bytes=transient,
        exact=bool(r["exact"]),
    )


def simulate(costs: Sequence[BlockCost], schedule: str):
    """(time in ms, peak in bytes, transients included) of any schedule text in gpukit's
    simulator: to predict torch.utils.checkpoint settings as well."""
    stages = [c.stage(_TIME_UNIT_MS) for c in costs]
    t, peak = _planner().simulate_schedule(stages, schedule)
    return t * _TIME_UNIT_MS, peak + max((c.transient_bytes for c in costs), default=0)


def _parse(schedule: str):
    ops = []
    for word in schedule.split():
        kind = "Fn" if word.startswith("Fn") else "Fe" if word.startswith("Fe") else "B"
        ops.append((kind, int(word[len(kind):])))
    return ops


def _last_uses(ops, L):
    """For each operation, the objects whose last use it is: ("x", j) or ("tape", j)."""
    x_last, tape_last = [None] * (L + 1), [None] * (L + 1)
    out = [[] for _ in ops]

    def flush(last, j, what):
        if last[j] is not None:
            out[last[j]].append((what, j))
        last[j] = None

    for k, (kind, i) in enumerate(ops):
        if i > 1:
            x_last[i - 1] = k
        if kind == "B":
            tape_last[i] = None  # the backward frees it
        else:
            flush(x_last, i, "x")
            x_last[i] = k
            if kind == "Fe":
                flush(tape_last, i, "tape")
                tape_last[i] = k
    for j in range(1, L + 1):
        flush(x_last, j, "x")
        flush(tape_last, j, "tape")
    return out


# ---------------------------------------------------------------------------------------------
# Execution


class _Step:
    """The state of one training step under a schedule (activations, tapes, RNG states)."""

    def __init__(self, owner, x0):
        L = len(owner.blocks)
        self.owner = owner
        self.x = [None] * (L + 1)
        self.x[0] = x0.detach()
        self.tape = [None] * (L + 1)  # (input leaf, output with its graph)
        self.rng = [None] * (L + 1)
        self.grad = None  # δ of the stage whose backward runs next
        self.device = x0.device
        self.autocast = (
            torch.is_autocast_enabled(x0.device.type),
            torch.get_autocast_dtype(x0.device.type),
        ) if x0.device.type in ("cuda", "cpu") else (False, None)
        self.x0_needs_grad = x0.requires_grad

    def _rng_state(self):
        cuda = torch.cuda.get_rng_state(self.device) if self.device.type == "cuda" else None
        return torch.get_rng_state(), cuda

    def _set_rng_state(self, state):
        torch.set_rng_state(state[0])
        if state[1] is not None:
            torch.cuda.set_rng_state(state[1], self.device)

    def forward_op(self, kind, i):
        block = self.owner.blocks[i - 1]
        x_in = self.x[i - 1]
        recomputing = self.rng[i] is not None
        if recomputing:
            now = self._rng_state()
            self._set_rng_state(self.rng[i])
        else:
            self.rng[i] = self._rng_state()
        try:
            enabled, dtype = self.autocast
            with torch.autocast(self.device.type, dtype=dtype, enabled=enabled):
                if kind == "Fn":
                    with torch.no_grad():
                        self.x[i] = block(x_in)
                else:
                    xin = x_in.detach().requires_grad_(
                        (i > 1 or self.x0_needs_grad) and (x_in.is_floating_point() or x_in.is_complex())
                    )
                    with torch.enable_grad():
                        out = block(xin)
                    self.tape[i] = (xin, out)
                    self.x[i] = out.detach()
        finally:
            if recomputing:
                self._set_rng_state(now)

    def backward_op(self, i):
        block = self.owner.blocks[i - 1]
        xin, out = self.tape[i]
        self.tape[i] = None
        params = _params(block)
        inputs = ([xin] if xin.requires_grad else []) + params
        if not out.requires_grad or not inputs:
            self.grad = None
            return
        grad = self.grad if self.grad is not None else torch.zeros_like(out)
        # Parameter gradients accumulate into .grad here, in place, as in a backward without
        # checkpointing (no second copy of them lives until the end of the step).
        with torch.enable_grad():
            torch.autograd.backward(out, grad, inputs=inputs)
        self.grad = xin.grad if xin.requires_grad else None

    def run(self, ops, last, start, stop):
        for k in range(start, stop):
            kind, i = ops[k]
            if kind == "B":
                self.backward_op(i)
            else:
                self.forward_op(kind, i)
            for what, j in last[k]:
                if what == "tape":
                    self.tape[j] = None
                elif j != len(self.x) - 1 or k >= self.owner._first_backward:
                    self.x[j] = None  # x_L goes out of the forward as the output


class _ScheduledChain(torch.autograd.Function):
    @staticmethod
    def forward(ctx, owner, x0, *params):
        step = _Step(owner, x0)
        ops, last, first_b = owner._ops, owner._last, owner._first_backward
        step.run(ops, last, 0, first_b)
        ctx.step = step
        out, step.x[len(owner.blocks)] = step.x[len(owner.blocks)], None
        return out

    @staticmethod
    def backward(ctx, grad_out):
        step = ctx.step
        del ctx.step
        owner = step.owner
        step.grad = grad_out
        step.run(owner._ops, owner._last, owner._first_backward, len(owner._ops))
        dx0 = step.grad if step.x0_needs_grad else None
        return (None, dx0, *([None] * len(owner._all_params)))


class PlannedSequential(nn.Module):
    """Blocks run under a checkpoint plan (see the module's docstring). Under no_grad, or when
    nothing needs a gradient, the blocks simply run in order."""

    def __init__(self, blocks, checkpoint_plan: CheckpointPlan, costs: Optional[List[BlockCost]] = None):
        super().__init__()
        self.blocks = nn.ModuleList(blocks)
        self.costs = costs
        self.set_plan(checkpoint_plan)

    def set_plan(self, checkpoint_plan: CheckpointPlan):
        """Runs under another plan (e.g. one planned for another budget) from the next forward."""
        ops = _parse(checkpoint_plan.schedule)
        L = len(self.blocks)
        if not ops or any(i < 1 or i > L for _, i in ops):
            raise ValueError(f"gpukit_torch.checkpoint: schedule {checkpoint_plan.schedule!r} is not for {L} blocks")
        stages = checkpoint_plan.stages or [(1, 1, 1, 1)] * L
        _planner().simulate_schedule(stages, checkpoint_plan.schedule)  # validates it
        self.plan = checkpoint_plan
        self._ops = ops
        self._last = _last_uses(ops, L)
        self._first_backward = next(k for k, (kind, _) in enumerate(ops) if kind == "B")
        seen, params = set(), []
        for b in self.blocks:
            for p in _params(b):
                if id(p) not in seen:
                    seen.add(id(p))
                    params.append(p)
        self._all_params = params

    def forward(self, x):
        if not torch.is_grad_enabled() or not (x.requires_grad or self._all_params):
            for b in self.blocks:
                x = b(x)
            return x
        return _ScheduledChain.apply(self, x, *self._all_params)


def sequential(model, budget_bytes: int, example_input: torch.Tensor, repetitions: int = 5, warmup: int = 2):
    """`model` (an nn.Sequential or a list of blocks) checkpointed under gpukit's optimal plan for
    `budget_bytes`: the activation memory a training step may use beyond what is allocated when
    its forward starts (parameters, their gradients, the input). Profiles the blocks on the device
    of `example_input` (profile()), plans (plan()) and returns a PlannedSequential sharing the
    blocks; its .plan holds the schedule and the predicted peak and time. Raises infeasible_budget
    (a ValueError) naming the least budget that has a plan.
    """
    blocks = _blocks_of(model)
    costs = profile(blocks, example_input, repetitions=repetitions, warmup=warmup)
    return PlannedSequential(blocks, plan(costs, budget_bytes), costs)
