# SPDX-License-Identifier: Apache-2.0
"""Activation checkpointing of PyTorch models, planned by gpukit under a memory budget.

    import gpukit_torch.checkpoint as ckpt
    model = transformers.GPT2LMHeadModel(config).cuda()
    batch = dict(input_ids=ids, labels=ids, use_cache=False)
    plan = ckpt.apply(model, budget_bytes=6 << 30, example_inputs=batch)
    model(**batch).loss.backward()     # the blocks run under the plan; gradients as without it
    print(plan)                        # schedule, predicted and measured peak and time, corrections

apply() finds the model's repeated blocks (find_blocks(): the children of an nn.ModuleList or
nn.Sequential that are all of one class, e.g. transformers' GPT-2 `transformer.h` and Llama
`model.layers`, torchvision ResNet's Bottlenecks in layer1..layer4), measures each of them
(profile()), plans with gpukit's planner (gpukit::plan_best: the least time of any schedule on
chains of up to 11 blocks, rotor's dynamic program beyond; bound in gpukit_torch._C, or compiled
from csrc/planner.cpp on first use where that extension is not installed; checkpoint_sequential's
schedules compete with its plans under the whole cost model) and replaces the blocks' forward in
place. It then runs training steps on `example_inputs` and closes the loop:
the first step measures what runs around the blocks (embeddings, head, loss) and compares the
measured peak with the prediction; where the step went over what the model predicts for it, the
overshoot is added to the model as a correction and the plan is made again, until a measured
step is within the model's prediction and the budget. The returned CheckpointPlan reports every round. sequential() and
PlannedSequential do the same for an nn.Sequential of one-tensor blocks, without the loop.

## The cost model

Block i has forward time f_i, backward time b_i, output size a_i (its output, and the gradient
of it), tape size t_i (what autograd keeps for its backward beyond its input and output), the
peak inside its forward and inside its backward beyond what they leave allocated (temporaries,
cuBLAS and cuDNN workspaces, autocast's casted weights), and the bytes of its parameters'
gradients. On CUDA every size is read from PyTorch's caching allocator (memory_allocated, and
max_memory_allocated after reset_peak_memory_stats around the block's forward and its
backward), so the allocator's 512-byte rounding is in it; elsewhere sizes are the storages'
bytes rounded the same way. gpukit's simulator (gpukit/checkpoint/chain.hpp) gives each
operation of a schedule its memory; this module adds to each operation the block's transient,
the gradients that the backward has left allocated (when the step starts with .grad None, as
after zero_grad()), the gradient of the last block's output, and what the step holds around the
blocks (OutsideCost: what is allocated when the first block starts, the head's and loss's peak
between the forward and the backward, the gradients the head's backward leaves, the peak after
the blocks' backward). The head runs after the schedule's first L operations (the forward); a
schedule may recompute the last block after it (`Fn<L> Fe<L>`: its tape is then not held
through the head's peak, as with torch.utils.checkpoint per block). A block's backward is
profiled as a step runs it: its output's gradient and its output go when autograd lets them go.
The RNG states that recomputation replays are kept on the host and cost no device memory.

Times are the profile's, each block alone (a forward under no_grad, a backward through its own
torch.autograd.grad), scaled by what whole steps measured: a recording forward and a backward
inside the step's one backward take longer or shorter than alone (OutsideCost.forward_scale and
backward_scale, which apply() measures once, on steps of its plan after the first, and which
plans made later from the same costs and outside reuse).

## Execution

A planned block runs the planner's schedule inside autograd with saved-tensor hooks (as
torch.utils.checkpoint's non-reentrant variant does, never re-entering the engine): in the
forward, `Fe<i>` runs the block as it is; `Fn<i>` runs it with autograd recording but replaces
every tensor it saves by a placeholder, so its graph keeps nothing. When the backward reaches
block i (the gradient of its output is ready), the schedule's forward operations up to `B<i>`
run: `Fn<j>` recomputes x_j without recording, `Fe<j>` recomputes block j recording and keeps
what it saves for the placeholders. Parameters' gradients flow through autograd's own graph:
`loss.backward()` accumulates them into .grad and `torch.autograd.grad(loss, params)` returns
them. Blocks may take several tensors and keyword arguments (attention masks, position
embeddings, flags): the hidden state is the first positional argument (or `hidden_states=`),
everything else is passed again unchanged on recomputation; a block may return a tuple, whose
first element is the hidden state. Recomputed forwards see the RNG state (CPU and the hidden
state's CUDA device) and the autocast state of the block's first forward; afterwards the
generator continues as if the recomputation had not run. Each kept activation and recomputed
tape is dropped right after its last use, as the planner's simulator counts.

Limits: the model must pass each block's output unchanged to the next block (checked); double
backward (create_graph) and a second backward through the same graph (retain_graph) are not
supported for blocks whose tape was dropped; a block's side effects (BatchNorm's running
statistics, a key-value cache) happen again when it is recomputed, as with
torch.utils.checkpoint (apply() refuses use_cache=True). A plan that recomputes nothing (a
budget at or above store-all's peak) runs the blocks exactly as the model does.

## torch.compile

Give apply() the compiled model, `plan = ckpt.apply(torch.compile(model), budget, batch)`, and
train with that compiled model: apply() compiles each block's forward with the model's own
compiler (its backend and options), profiles the compiled blocks, and runs its steps, and so
measures what runs around the blocks, through the compiled model. The planned blocks are graph
breaks for dynamo: each runs under the plan (its saved tensors through the plan's hooks, its
recomputations compiled too), and dynamo compiles the code around them where it can (a frame
whose loop calls the blocks, such as transformers' GPT2Model.forward, runs eagerly from then on;
the frames it calls are compiled). A plan that recomputes nothing runs the blocks unpatched, in
whatever graphs dynamo then makes: its peak is measured on such a step (after one that compiles
it) and predicted as measured. remove() gives the blocks back their uncompiled forward.
Compiled models that replay CUDA graphs (mode="reduce-overhead" or "max-autotune",
triton.cudagraphs, the "cudagraphs" backend) are refused with a ValueError: a replay overwrites
the outputs of the last, which a plan keeps while it recomputes blocks.
A model compiled after apply() (torch.compile of the planned module) runs its planned blocks
as they are, eager unless compiled before apply() (for every block b: b.forward =
torch.compile(b.forward)); remove() then leaves them compiled.
"""

import contextlib
import os
import statistics
import time
from dataclasses import asdict, dataclass, field
from typing import Callable, List, Optional, Sequence

import torch
from torch import nn

__all__ = [
    "BlockCost",
    "CheckpointPlan",
    "MemoryProbe",
    "OutsideCost",
    "PlannedSequential",
    "apply",
    "find_blocks",
    "infeasible_budget",
    "install",
    "plan",
    "profile",
    "remove",
    "sequential",
    "simulate",
]

_HERE = os.path.dirname(os.path.abspath(__file__))
_planner_module = None

ALLOCATION_ROUNDING = 512  # PyTorch's CUDA caching allocator rounds every block up to this


def _rounded(nbytes: int) -> int:
    """`nbytes` as the caching allocator holds it: rounded up to a multiple of 512 bytes."""
    n = int(nbytes)
    return 0 if n <= 0 else -(-n // ALLOCATION_ROUNDING) * ALLOCATION_ROUNDING


def _planner():
    """gpukit's planner: gpukit_torch._C, else csrc/planner.cpp compiled alone (no CUDA needed)."""
    global _planner_module
    if _planner_module is not None:
        return _planner_module
    try:
        from . import _C  # noqa: PLC0415

        if hasattr(_C, "simulate_ops"):
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
            "installed (or predates simulate_ops), and " + source + " or " + marker + " is missing "
            "to build it (set GPUKIT_INCLUDE_DIR to gpukit's include folder, or pip install "
            "./bindings/torch)"
        )
    # gpukit's error headers include the CUDA runtime's API header: a CPU extension is not given
    # CUDA's include folder by load(), so it is added where PyTorch knows one.
    from torch.utils.cpp_extension import CUDA_HOME  # noqa: PLC0415

    includes = [os.path.abspath(include)]
    if CUDA_HOME and os.path.isdir(os.path.join(CUDA_HOME, "include")):
        includes.append(os.path.join(CUDA_HOME, "include"))
    _planner_module = load(
        name="_gpukit_planner",
        sources=[os.path.abspath(source)],
        extra_cflags=["-O2", "-std=c++17", "-DGPUKIT_TORCH_PLANNER_MODULE"],
        extra_include_paths=includes,
        verbose=False,
    )
    return _planner_module


# ---------------------------------------------------------------------------------------------
# How a block is called


class _Call:
    """One call of a block as the model makes it: the hidden state (the first positional
    argument, or hidden_states=) and everything else, passed again unchanged on recomputation."""

    __slots__ = ("args", "kwargs", "key")

    def __init__(self, args, kwargs=None, key=None):
        self.args, self.kwargs = tuple(args), dict(kwargs or {})
        if key is None:
            if self.args and isinstance(self.args[0], torch.Tensor):
                key = 0
            elif isinstance(self.kwargs.get("hidden_states"), torch.Tensor):
                key = "hidden_states"
            else:
                raise TypeError(
                    "gpukit_torch.checkpoint: a block's hidden state must be a tensor, its first "
                    "positional argument or hidden_states=; the block got positional arguments "
                    f"of types {[type(a).__name__ for a in self.args]} and keywords "
                    f"{sorted(self.kwargs)}"
                )
        self.key = key

    def hidden(self):
        return self.args[0] if self.key == 0 else self.kwargs[self.key]

    def with_hidden(self, x):
        """The call with `x` as its hidden state."""
        if self.key == 0:
            return _Call((x,) + self.args[1:], self.kwargs, 0)
        kwargs = dict(self.kwargs)
        kwargs[self.key] = x
        return _Call(self.args, kwargs, self.key)

    def __call__(self, fn):
        return fn(*self.args, **self.kwargs)


def _hidden_of(out):
    """The hidden state of a block's output: the output, or the first element of a tuple."""
    if isinstance(out, torch.Tensor):
        return out
    if isinstance(out, (tuple, list)) and out and isinstance(out[0], torch.Tensor):
        return out[0]
    raise TypeError(
        "gpukit_torch.checkpoint: a block must return a tensor or a tuple whose first element is "
        f"a tensor (the hidden state); it returned {type(out).__name__}"
    )


# ---------------------------------------------------------------------------------------------
# Costs


class MemoryProbe:
    """The allocator counters the cost model is measured with: by default PyTorch's CUDA caching
    allocator on `device`. Another allocator (or a test's fake) provides the same four methods:
    sync(), allocated() (bytes allocated now), reset_peak() and peak() (the most allocated since
    reset_peak()). sync() synchronizes the device."""

    def __init__(self, device=None):
        self.device = torch.device("cuda" if device is None else device)

    def sync(self):
        torch.cuda.synchronize(self.device)

    # memory_allocated() and max_memory_allocated() flatten and sort every statistic into a new
    # dict at each call; the nested dict they are made from holds the same numbers at a fraction
    # of the host time, which a watched step spends while the GPU waits for its next kernels.
    def _allocated_bytes(self) -> dict:
        return torch.cuda.memory_stats_as_nested_dict(self.device).get("allocated_bytes", {}).get("all", {})

    def allocated(self) -> int:
        return int(self._allocated_bytes().get("current", 0))

    def reset_peak(self):
        torch.cuda.reset_peak_memory_stats(self.device)

    def peak(self) -> int:
        return int(self._allocated_bytes().get("peak", 0))


@dataclass
class BlockCost:
    """What profile() measured for one block (times in milliseconds, sizes in bytes).

    forward_transient_bytes: the peak inside a recording forward (`Fe`) beyond what it leaves
    allocated (its output and tape); untaped_transient_bytes: the same for a forward that keeps
    no tape (`Fn`: what it saves is freed when it returns), beyond its output;
    backward_transient_bytes: the peak inside the backward beyond what was
    allocated when it started and the input's gradient it leaves (the parameters' gradients it
    creates are in it; negative where it frees part of its tape before it makes the input's
    gradient); grad_bytes: the parameters' gradients; saves_output: whether what its
    backward keeps includes its output (then x_i lives as long as its tape)."""

    forward_ms: float
    backward_ms: float
    output_bytes: int
    tape_bytes: int
    forward_transient_bytes: int = 0
    backward_transient_bytes: int = 0
    grad_bytes: int = 0
    saves_output: bool = False  # its tape holds its output (a ReLU or Tanh last saves it)
    untaped_transient_bytes: int = 0

    @property
    def transient_bytes(self) -> int:
        return max(self.forward_transient_bytes, self.untaped_transient_bytes, self.backward_transient_bytes)

    def stage(self, time_unit_ms: float = 1e-3, forward_scale: float = 1.0, backward_scale: float = 1.0):
        """(f, b, a, t) for the planner: times in integer units of time_unit_ms (at least 1). A
        tape that holds the block's output counts it (the simulator may drop x_i while the tape
        lives; where it keeps both, the cost model takes the second copy off again).

        The scales are OutsideCost's: a recording forward (`Fe`) takes forward_scale times the
        profiled forward, a backward backward_scale times the profiled one. The planner's chain
        has one forward time for `Fn` and `Fe`; every schedule runs exactly one `Fe` per block
        (the one whose tape its backward uses), so the recording forward's extra time is added
        to the block's backward, which every schedule also runs once."""
        extra = (forward_scale - 1.0) * self.forward_ms
        return (
            max(1, round(self.forward_ms / time_unit_ms)),
            max(1, round((self.backward_ms * backward_scale + extra) / time_unit_ms)),
            int(self.output_bytes),
            int(self.tape_bytes) + (int(self.output_bytes) if self.saves_output else 0),
        )


@dataclass
class OutsideCost:
    """What one training step holds and runs around the planned blocks (apply() measures it in
    its first step; sizes in bytes beyond what is allocated when the step starts, unless said).

    before_bytes: allocated when the first block starts (embeddings, masks, position embeddings),
    held through the blocks; prefix_peak_bytes: the peak before the first block; head_bytes: the
    peak from the last block's return until its output's gradient is ready (head, loss and their
    backward), beyond what was allocated at that return; tail_bytes: the peak after the first
    block's backward (what ran before the blocks, backwards); ms: the time outside the blocks;
    grads_persist: the step started with parameters' .grad None, so the backward allocates them
    and they stay (else it adds into them in place). forward_scale, backward_scale: what a
    step's blocks took over what profile() measured of them alone, for a recording forward
    (profile() times forwards under no_grad) and for a backward (inside the step's one backward,
    accumulating into .grad, rather than a block's own torch.autograd.grad); timed_steps: the
    steps they were measured from (0: not measured; the profile's times stand). apply() measures
    them on steps of its plan after the first (which holds one-time costs: memory the allocator
    maps, libraries' autotuning), given the schedule they ran. head_grad_bytes: the gradients of
    parameters outside the blocks (the head's, a tied embedding's) that the head's backward
    allocates (grads_persist), held through the blocks' backward. step_scale: what steps of the
    plan took unwatched (as a training loop runs them, through the plan's run even where it
    recomputes nothing) over the same plan's watched steps (the watch reads the allocator's
    counters on the host and records events at the blocks' edges), measured with the scales and
    applied to the whole step's time (1.0: not measured)."""

    before_bytes: int = 0
    prefix_peak_bytes: int = 0
    head_bytes: int = 0
    tail_bytes: int = 0
    ms: float = 0.0
    grads_persist: bool = False
    forward_scale: float = 1.0
    backward_scale: float = 1.0
    timed_steps: int = 0
    head_grad_bytes: int = 0
    step_scale: float = 1.0


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
    """The bytes the allocator holds for the tensors' distinct storages (each rounded)."""
    seen, total = set(), 0
    for t in tensors:
        if isinstance(t, torch.Tensor):
            s = t.untyped_storage()
            if s.data_ptr() not in seen:
                seen.add(s.data_ptr())
                total += _rounded(s.nbytes())
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


@contextlib.contextmanager
def _grads_as(params, persist: bool):
    """Parameters' .grad as a training step finds them: None (persist: the backward allocates
    them) or zeros allocated beforehand (the backward adds into them); restored afterwards."""
    kept = [p.grad for p in params]
    try:
        for p in params:
            p.grad = None if persist else torch.zeros_like(p)
        yield
    finally:
        for p, g in zip(params, kept):
            p.grad = g


def _recorded_forward(block, call, x, keep_saved=False):
    """The block's forward with autograd recording, on x detached: (input leaf, output, saved).
    saved lists the tensors autograd saved when keep_saved (a list of them keeps them alive after
    the backward has freed the graph, which memory measurements must not see), else the
    addresses of their storages."""
    xin = x.detach().requires_grad_(x.is_floating_point() or x.is_complex())
    saved = []

    def pack(t):
        saved.append(t if keep_saved else t.untyped_storage().data_ptr())
        return t

    with torch.enable_grad(), torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = call.with_hidden(xin)(block)
    return xin, out, saved


def _backward(out, xin, params):
    """The block's backward into xin.grad and the parameters' .grad (as a training step does)."""
    h = _hidden_of(out)
    inputs = ([xin] if xin.requires_grad else []) + params
    if h.requires_grad and inputs:
        torch.autograd.backward(h, torch.ones_like(h), inputs=inputs)


class _OutputGradient(torch.autograd.Function):
    """A scalar standing for a block's output h: its backward gives h a gradient of ones that
    only autograd holds."""

    @staticmethod
    def forward(ctx, h):
        ctx.like = (h.size(), h.stride(), h.dtype, h.device)  # its layout too (channels_last)
        return h.new_zeros(())

    @staticmethod
    def backward(ctx, _):
        size, stride, dtype, device = ctx.like
        return torch.empty_strided(size, stride, dtype=dtype, device=device).fill_(1)


def _measure_sizes(block, call, x, probe, grads_persist):
    """(output, tape, forward transient, backward peak or None, the output) of one block on x."""
    params = _params(block)
    if probe is not None:
        # One untimed forward and backward first: libraries allocate their workspaces (cuBLAS)
        # and tune (cuDNN) on first use, memory that belongs to no activation.
        with _grads_as(params, grads_persist):
            xin, out, _ = _recorded_forward(block, call, x)
            _backward(out, xin, params)
            del xin, out
        probe.sync()
        base = probe.allocated()
        probe.reset_peak()
        # What a block returns beside its hidden state (attention weights, caches) the model
        # drops as it calls the next block, and the chain keeps only x_i: those are transients.
        with torch.no_grad():
            y = _hidden_of(call.with_hidden(x)(block))
        probe.sync()
        a = probe.allocated() - base
        fn_transient = probe.peak() - base - a
        base = probe.allocated()
        probe.reset_peak()
        xin, out, saved = _recorded_forward(block, call, x)
        h = _hidden_of(out)
        del out  # the rest of a tuple stays only where the tape holds it
        probe.sync()
        held = probe.allocated() - base
        saves_output = h.untyped_storage().data_ptr() in saved
        fe_transient = probe.peak() - base - held
        # The parameters' gradients (zeros, when a step adds into them) exist before the backward
        # starts, as in a training step. The output's gradient is made inside the backward
        # (_OutputGradient), so that autograd frees it when its last user has run, as it frees
        # δ_i in a step: it is in the peak while it lives (a block that ends in an activation
        # replaces it early; one that ends in a residual sum passes it on to the end).
        # The output itself is held by the tape alone, as in a step whose schedule has dropped
        # x_i by B<i> (one that keeps it counts it apart).
        seed = _OutputGradient.apply(h) if h.requires_grad else None
        one = torch.ones((), dtype=h.dtype, device=h.device) if seed is not None else None
        del h
        with _grads_as(params, grads_persist):
            probe.sync()
            entry = probe.allocated()
            probe.reset_peak()
            inputs = ([xin] if xin.requires_grad else []) + params
            if seed is not None and inputs:
                torch.autograd.backward(seed, one, inputs=inputs)
            probe.sync()
            backward_peak = probe.peak() - entry
            del inputs
        del xin, seed, one, saved
        return (max(0, a), max(0, held - a), (max(0, fe_transient), max(0, fn_transient)),
                max(0, backward_peak), saves_output, y)
    # Elsewhere: the bytes of the output's storage, and of the tensors autograd saves beyond the
    # input's, the output's and the block's parameters and buffers.
    with torch.no_grad():
        y = call.with_hidden(x)(block)
    xin, out, saved = _recorded_forward(block, call, x, keep_saved=True)
    h = _hidden_of(out)
    known = {xin.untyped_storage().data_ptr(), h.untyped_storage().data_ptr()}
    if isinstance(block, nn.Module):  # parameters and buffers are not activations
        known |= {t.untyped_storage().data_ptr() for t in (*block.parameters(), *block.buffers())}
    tape = [s for s in saved if s.untyped_storage().data_ptr() not in known]
    saves_output = any(s.untyped_storage().data_ptr() == h.untyped_storage().data_ptr() for s in saved)
    return _storage_bytes([_hidden_of(y)]), _storage_bytes(tape), (0, 0), None, saves_output, y


def _time_block(timer, block, call, x, n):
    """(forward ms, backward ms) of one block, each the mean of n calls issued back to back in one
    timed interval: the forward under no_grad, the backward (retain_graph) through one recorded
    forward (not timed). Back to back, the host runs ahead of the device as it does in a training
    step, so that the launch gaps of a call timed alone (its kernels waiting for the host) are not
    counted as the block's time."""
    def forwards():
        for _ in range(n):
            call.with_hidden(x)(block)

    with torch.no_grad():
        ms_f = timer(forwards)[0] / n
    xin, out, _ = _recorded_forward(block, call, x)
    h = _hidden_of(out)
    inputs = ([xin] if xin.requires_grad else []) + _params(block)
    if not (h.requires_grad and inputs):
        return ms_f, 0.0
    g = torch.ones_like(h)

    def backwards():
        for _ in range(n):
            torch.autograd.grad(h, inputs, g, allow_unused=True, retain_graph=True)

    try:
        return ms_f, timer(backwards)[0] / n
    except RuntimeError as e:
        if "donated buffer" not in str(e):
            raise
    # A block compiled by torch.compile whose backward reuses what it saved (donated buffers)
    # runs once per recorded forward: n forwards recorded first (n tapes at once), then their
    # backwards timed back to back.
    xin = out = h = g = inputs = None  # the first graph goes
    graphs = []
    for _ in range(n):
        xin_k, out_k, _ = _recorded_forward(block, call, x)
        h_k = _hidden_of(out_k)
        graphs.append((h_k, ([xin_k] if xin_k.requires_grad else []) + _params(block), torch.ones_like(h_k)))
        del xin_k, out_k, h_k

    def backwards_once():
        while graphs:
            h_k, inputs_k, g_k = graphs.pop()
            torch.autograd.grad(h_k, inputs_k, g_k, allow_unused=True)

    return ms_f, timer(backwards_once)[0] / n


def _profile_calls(blocks, calls, x, repetitions, warmup, probe, grads_persist):
    if repetitions < 1 or warmup < 0:
        raise ValueError(f"gpukit_torch.checkpoint.profile: repetitions={repetitions}, warmup={warmup}")
    device = x.device
    timer = _Timer(device)
    costs, backward_peaks = [], []
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        x = x.detach()
        for block, call in zip(blocks, calls):
            # A compiled block compiles on its first calls, and its compiler's own buffers
            # (autotuning's) are no part of its sizes: it warms up before they are measured.
            compiled = getattr(block.forward, "_torchdynamo_orig_callable", None) is not None
            if warmup and compiled:
                _time_block(timer, block, call, x, warmup)
            a, t, (fe_transient, fn_transient), backward_peak, saves_output, y = _measure_sizes(
                block, call, x, probe, grads_persist)
            if warmup and not compiled:
                _time_block(timer, block, call, x, warmup)
            # Three groups of `repetitions` calls each; the median group.
            fwd, bwd = zip(*(_time_block(timer, block, call, x, repetitions) for _ in range(3)))
            grads = sum(_rounded(p.numel() * p.element_size()) for p in _params(block))
            costs.append(BlockCost(statistics.median(fwd), statistics.median(bwd), a, t, fe_transient, 0, grads,
                                   saves_output, fn_transient))
            backward_peaks.append(backward_peak)
            x = _hidden_of(y).detach()
    # The backward's transient is what its peak holds beyond what the simulator counts through
    # B<i>: the output's gradient δ_i and the input's gradient δ_{i-1}, the size of the block
    # before's output (block 1's input gradient it does not count).
    # It is negative where the backward lets go of part of its tape before it makes δ_{i-1}, by
    # at most δ_{i-1} (the peak is never below what B<i> starts with).
    for i, (c, peak) in enumerate(zip(costs, backward_peaks)):
        if peak is not None:
            before = costs[i - 1].output_bytes if i > 0 else 0
            c.backward_transient_bytes = max(-before, peak - c.output_bytes - before)
    return costs


def profile(model, example_input: torch.Tensor, repetitions: int = 5, warmup: int = 2,
            probe: Optional[MemoryProbe] = None, grads_persist: Optional[bool] = None) -> List[BlockCost]:
    """Measures each block of `model` (an nn.Sequential or a list of one-tensor blocks) on the
    device of `example_input`, each block on the previous block's output.

    Times: after `warmup` untimed calls, three groups of `repetitions` calls issued back to back,
    each group timed as one interval (CUDA events on CUDA, a steady clock elsewhere), the median
    group's mean; forward under no_grad, backward (retaining the graph) through one recorded
    forward. Sizes
    from `probe` (on CUDA by default MemoryProbe: the caching allocator's counters, the peak
    reset around each block's forward and backward): output = what a forward without grad leaves
    allocated; tape = what a recording forward leaves beyond that; transients = the peaks beyond
    what each leaves. Without a probe (off CUDA), from the storages of the output and of the
    tensors autograd saves, rounded as the caching allocator rounds. grads_persist: whether the
    training step starts with .grad None (default: as the blocks' parameters are now); the
    parameters' .grad are restored afterwards, and so is the RNG state. Synchronizes the device.
    """
    blocks = _blocks_of(model)
    if probe is None and example_input.device.type == "cuda":
        probe = MemoryProbe(example_input.device)
    if grads_persist is None:
        grads_persist = any(p.grad is None for b in blocks for p in _params(b))
    calls = [_Call((example_input,))] * len(blocks)
    return _profile_calls(blocks, calls, example_input, repetitions, warmup, probe, grads_persist)


# ---------------------------------------------------------------------------------------------
# Plans


@dataclass
class CheckpointPlan:
    """A schedule of gpukit's planner with its predictions, and what the closed loop measured.

    schedule: the operations ("Fn1 Fe2 B2 ..."); budget: the budget asked for (bytes of a
    training step's peak beyond what is allocated when it starts); predicted_peak,
    predicted_time_ms: the cost model's (the simulator's, plus what the module's docstring lists,
    plus correction_bytes); correction_bytes: what the closed loop added after a step measured
    more than predicted; outside: what runs around the blocks (apply() measures it); rounds: one
    dict per measured step of apply() (schedule, predicted and measured peak and time, the
    correction it led to); measured_peak, measured_time_ms: the last round's; blocks: the
    planned blocks' names; exact: the planner proved the schedule the fastest of its chain (its
    exact search; False for rotor's dynamic program, and where one of checkpoint_sequential's
    schedules was faster under the whole cost model than every plan of the planner).
    """

    schedule: str
    budget: int
    predicted_peak: int
    predicted_time_ms: float
    stages: list = field(default_factory=list)
    exact: bool = True
    costs: list = field(default_factory=list)
    outside: Optional[OutsideCost] = None
    correction_bytes: int = 0
    rounds: list = field(default_factory=list)
    measured_peak: Optional[int] = None
    measured_time_ms: Optional[float] = None
    blocks: list = field(default_factory=list)

    @property
    def ops(self):
        return _parse(self.schedule)

    @property
    def transient_bytes(self) -> int:
        return max((c.transient_bytes for c in self.costs), default=0)

    @property
    def recomputations(self) -> int:
        return sum(1 for kind, _ in self.ops if kind != "B") - len(self.costs or self.stages)

    def as_dict(self) -> dict:
        """Everything as plain values (for JSON)."""
        return asdict(self)

    def __repr__(self):
        mib = 1 << 20
        lines = [
            f"CheckpointPlan({len(self.costs or self.stages)} blocks, budget {self.budget / mib:.1f} MiB: "
            f"predicted peak {self.predicted_peak / mib:.1f} MiB, {self.predicted_time_ms:.2f} ms"
            + (f"; measured {self.measured_peak / mib:.1f} MiB" if self.measured_peak is not None else "")
            + (f", {self.measured_time_ms:.2f} ms" if self.measured_time_ms is not None else "")
            + f"; correction {self.correction_bytes / mib:.2f} MiB; {self.recomputations} recomputed",
            f"  schedule: {self.schedule}",
        ]
        for k, r in enumerate(self.rounds):
            lines.append(
                f"  step {k + 1}: predicted {r['predicted_peak'] / mib:.1f} MiB, measured "
                f"{r['measured_peak'] / mib:.1f} MiB ({r['model_peak'] / mib:.1f} MiB by the model "
                f"with what the step measured around the blocks), correction +{r['correction_bytes'] / mib:.2f} "
                f"MiB; time predicted {r['predicted_time_ms']:.2f} ms, measured {r['measured_time_ms']:.2f} ms"
            )
        return "\n".join(lines) + ")"


class infeasible_budget(ValueError):
    """No schedule fits the budget; minimum_budget is the least budget (bytes) that has one."""

    def __init__(self, message: str, minimum_budget: int):
        super().__init__(message)
        self.minimum_budget = minimum_budget


_TIME_UNIT_MS = 1e-3  # the planner's time unit: microseconds


def _stages(costs, outside=None):
    o = outside or OutsideCost()
    return [c.stage(_TIME_UNIT_MS, o.forward_scale, o.backward_scale) for c in costs]


# A step's chain measured more than this many times (or less than its inverse) what the profile
# predicts is not a difference of execution but a measurement gone wrong (a step that compiled,
# autotuned or waited): its scales are not taken.
_SCALE_LIMIT = 4.0


def _time_scales(costs, schedule, forward_ms, backward_ms):
    """(forward_scale, backward_scale) that make the profiled times add up to a step's measured
    forward and backward through the blocks under `schedule`, or None where they cannot be told
    (no recording forward or no backward in that part) or come out absurd. A non-recording
    forward (`Fn`) runs as profile() timed it."""
    ops = _parse(schedule)
    L = len(costs)  # the first L operations are the forward; the rest run in the backward
    f = [c.forward_ms for c in costs]
    fe = sum(f[i - 1] for kind, i in ops[:L] if kind == "Fe")
    fn = sum(f[i - 1] for kind, i in ops[:L] if kind == "Fn")
    if fe <= 0:
        return None
    forward_scale = (forward_ms - fn) / fe
    back = sum(costs[i - 1].backward_ms for kind, i in ops if kind == "B")
    if back <= 0:
        return None
    redone = sum((forward_scale if kind == "Fe" else 1.0) * f[i - 1]
                 for kind, i in ops[L:] if kind != "B")
    backward_scale = (backward_ms - redone) / back
    if not all(1 / _SCALE_LIMIT <= s <= _SCALE_LIMIT for s in (forward_scale, backward_scale)):
        return None
    return forward_scale, backward_scale


def _evaluate(costs: Sequence[BlockCost], schedule: str, outside: Optional[OutsideCost] = None,
              correction: int = 0):
    """(time in ms, peak in bytes) of a schedule under the cost model: the simulator's memory of
    each operation plus its block's transient, the gradients that the backward has left
    allocated (grads_persist), the last block's output gradient (the simulator's δ_L is 0), and
    what the step holds around the blocks; plus `correction`."""
    o = outside or OutsideCost()
    r = _planner().simulate_ops(_stages(costs, o), schedule)
    ops = _parse(schedule)
    L = len(costs)
    first_backward = next(k for k, (kind, _) in enumerate(ops) if kind == "B")
    twice_during, twice_after = _outputs_counted_twice(costs, ops)
    # The first L operations are the model's forward through the blocks; the head and the loss
    # run after them, forward and backward, and what comes before B<L> (recomputations) runs
    # once the gradient of x_L (δ_L, which the simulator does not count) is there.
    peak, grads = max(o.prefix_peak_bytes, o.tail_bytes), 0
    for k, (kind, i) in enumerate(ops):
        if k == L:  # the head's backward has left its parameters' gradients
            grads += o.head_grad_bytes
        c = costs[i - 1]
        if kind == "B":
            extra = c.backward_transient_bytes + (c.output_bytes if i == L else 0)
        else:
            extra = c.forward_transient_bytes if kind == "Fe" else c.untaped_transient_bytes
            if L <= k < first_backward:
                extra += costs[-1].output_bytes
        peak = max(peak, o.before_bytes + r["op_peak"][k] - twice_during[k] + extra + grads)
        if kind == "B" and o.grads_persist:
            grads += c.grad_bytes
        if k == L - 1:  # the head and the loss, forward and backward, run here
            # on x_L, which the simulator has dropped (a tape that holds it counts it already)
            x_last = 0 if costs[-1].saves_output else costs[-1].output_bytes
            peak = max(peak, o.before_bytes + r["after"][k] - twice_after[k] + x_last + o.head_bytes)
    return (r["time"] * _TIME_UNIT_MS + o.ms) * o.step_scale, peak + int(correction)


def _outputs_counted_twice(costs, ops):
    """Per operation (during it, and after it), the bytes of outputs x_i that the simulator
    counts twice: as x_i and inside tape_i, where the tape holds the output (saves_output; its
    stage's tape counts a_i) and both are alive. The chain's four numbers cannot say that a tape
    holds x_i; PyTorch's graph does."""
    L = len(costs)
    last = _last_uses(ops, L)
    x_alive = [False] * (L + 1)
    tape_alive = [False] * (L + 1)
    during, after = [0] * len(ops), [0] * len(ops)
    for k, (kind, i) in enumerate(ops):
        if kind != "B":
            x_alive[i] = True
            if kind == "Fe":
                tape_alive[i] = True
        during[k] = sum(costs[j - 1].output_bytes for j in range(1, L + 1)
                        if costs[j - 1].saves_output and tape_alive[j] and x_alive[j])
        if kind == "B":
            tape_alive[i] = False
        for what, j in last[k]:
            if what == "x":
                x_alive[j] = False
        after[k] = sum(costs[j - 1].output_bytes for j in range(1, L + 1)
                       if costs[j - 1].saves_output and tape_alive[j] and x_alive[j])
    return during, after


def _plan(costs, budget_bytes, outside=None, correction=0, planner="best") -> CheckpointPlan:
    """The fastest schedule whose peak under the whole cost model fits: gpukit's planner sees the
    four numbers of each block, so it is asked at the largest budget of its own whose plan still
    fits once everything else is added (a bisection between its least budget and ours)."""
    stages = _stages(costs, outside)
    budget = int(budget_bytes)
    p = _planner()
    r = p.plan(stages, 0, planner=planner)
    least = int(r["minimum_budget"]) if r["infeasible"] else 0
    tried = {}

    def attempt(b):
        if b not in tried:
            r = p.plan(stages, b, planner=planner)
            tried[b] = None if r["infeasible"] else (r, *_evaluate(costs, r["schedule"], outside, correction))
        return tried[b]

    def fits(b):
        a = attempt(b)
        return a is not None and a[2] <= budget

    # The planner's budgets from its least to what storing everything takes in its chain (and
    # beyond: it counts an output twice where a tape holds it and the simulator keeps it too).
    L = len(stages)
    store_all = " ".join([f"Fe{i}" for i in range(1, L + 1)] + [f"B{i}" for i in range(L, 0, -1)])
    twice = sum(c.output_bytes for c in costs if c.saves_output)
    top = max(least, int(p.simulate_ops(stages, store_all)["peak"])) + twice
    hi = min(max(least, budget + twice), top)
    if not fits(hi):
        # The whole model's peak need not fall with the planner's budget (gradients kept to the
        # end of the backward, a head that runs on what the forward kept): scan, then bisect
        # between the largest budget whose plan fits and the next one.
        points = sorted({least + (top - least) * k // 24 for k in range(25)})
        ok = [b for b in points if fits(b)]
        if ok:
            lo = ok[-1]
            hi = next((b for b in points if b > lo), top)
            for _ in range(40):  # bisection: lo's plan fits, hi's does not
                if hi - lo <= ALLOCATION_ROUNDING:
                    break
                mid = (lo + hi) // 2
                if fits(mid):
                    lo = mid
                else:
                    hi = mid
    candidates = [a for a in tried.values() if a is not None]
    # The planner optimizes its chain's peak, not the whole model's: at a budget between two of
    # its plans, a schedule of PyTorch's own kind (checkpoint_sequential's segments) may fit and
    # be faster than every plan the search met. Each of them is a candidate too, so that no
    # checkpoint_sequential setting that fits the budget is faster under the model.
    for schedule in _segment_schedules(L):
        candidates.append((dict(schedule=schedule, exact=False), *_evaluate(costs, schedule, outside, correction)))
    # Nor does the planner's chain know that the head runs between the forward and the backward:
    # the last block run without its tape in the forward and again, recording, once the head's
    # backward is over, keeps its tape out of the head's peak (torch.utils.checkpoint per block
    # does that). Not where its tape holds its output: the output recomputed after the head is
    # not what the cost model measured of such a block.
    later = [] if costs[-1].saves_output else [_last_block_later(a[0]["schedule"], L) for a in candidates]
    for schedule in filter(None, later):
        candidates.append((dict(schedule=schedule, exact=False), *_evaluate(costs, schedule, outside, correction)))
    fitting = [a for a in candidates if a[2] <= budget]
    if not fitting:
        need = min(a[2] for a in candidates)
        raise infeasible_budget(
            f"gpukit_torch.checkpoint: no schedule fits {budget} bytes; the least budget with one "
            f"is {need} bytes (the planner's chain at least {least} bytes, the rest transients, "
            f"gradients, what runs around the blocks and a correction of {int(correction)})",
            need,
        )
    r, t, peak = min(fitting, key=lambda a: (a[1], a[2]))
    return CheckpointPlan(
        schedule=r["schedule"],
        budget=budget,
        predicted_peak=int(peak),
        predicted_time_ms=t,
        stages=stages,
        exact=bool(r["exact"]),
        costs=list(costs),
        outside=outside,
        correction_bytes=int(correction),
    )


def _last_block_later(schedule, L):
    """`schedule` with its forward's `Fe<L>` run as `Fn<L> Fe<L>` (the recording forward of the
    last block moved after the head), or None where the forward does not record it."""
    ops = schedule.split()
    if ops[L - 1] != f"Fe{L}":
        return None
    return " ".join(ops[:L - 1] + [f"Fn{L}", f"Fe{L}"] + ops[L:])


def _segment_schedules(L):
    """torch.utils.checkpoint.checkpoint_sequential's schedules for L blocks, one a segment count
    s = 2..L (s = 1 stores everything, which the planner meets): segments of L // s blocks, the
    remainder in the last one, which runs recording; the others keep only their input and run
    again, recording, when the backward reaches them."""
    out = []
    for s in range(2, L + 1):
        size = L // s
        kept = (s - 1) * size  # blocks 1..kept are in checkpointed segments
        ops = [f"Fn{i}" for i in range(1, kept + 1)] + [f"Fe{i}" for i in range(kept + 1, L + 1)]
        ops += [f"B{i}" for i in range(L, kept, -1)]
        for k in range(s - 2, -1, -1):
            first, last = k * size + 1, (k + 1) * size
            ops += [f"Fe{i}" for i in range(first, last + 1)] + [f"B{i}" for i in range(last, first - 1, -1)]
        out.append(" ".join(ops))
    return out


def plan(costs: Sequence[BlockCost], budget_bytes: int, outside: Optional[OutsideCost] = None,
         correction_bytes: int = 0) -> CheckpointPlan:
    """gpukit's fastest plan for the blocks' costs whose predicted peak (the cost model of the
    module's docstring: `outside` and `correction_bytes` included) is within `budget_bytes`.
    Raises infeasible_budget naming the least budget that has a plan."""
    return _plan(costs, budget_bytes, outside, correction_bytes)


def simulate(costs: Sequence[BlockCost], schedule: str, outside: Optional[OutsideCost] = None,
             correction_bytes: int = 0):
    """(time in ms, peak in bytes) of any schedule text under the cost model that plan() uses:
    to predict torch.utils.checkpoint settings as well."""
    return _evaluate(costs, schedule, outside, correction_bytes)


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


def _inputs_kept(ops, last, L):
    """The blocks i whose first forward keeps its tape (Fe) and whose input x_{i-1} the schedule
    keeps from that forward until B<i> has run: autograd holding x_{i-1} itself then keeps it no
    longer than the schedule does, so such a block runs without saved-tensor hooks."""
    backward_at = {i: k for k, (kind, i) in enumerate(ops) if kind == "B"}
    dropped = {}  # j: the operations after which x_j goes
    for k, gone in enumerate(last):
        for what, j in gone:
            if what == "x":
                dropped.setdefault(j, []).append(k)
    kept = set()
    for i in range(1, L + 1):
        first = i - 1  # the forwards run in order, each once, before the first backward
        if ops[first][0] == "Fe" and not any(first <= k < backward_at[i] for k in dropped.get(i - 1, ())):
            kept.add(i)
    return kept


# ---------------------------------------------------------------------------------------------
# Execution


class _Slot:
    """What autograd keeps, in place of a tensor that a block run without its tape saved."""

    __slots__ = ("run", "block", "index")

    def __init__(self, run, block, index):
        self.run, self.block, self.index = run, block, index


def _unpack(slot):
    return slot.run.unpack(slot)


class _InputView:
    """What autograd keeps, in place of a saved view of a block's input x_j: x_j is read back
    from the activations that the schedule keeps."""

    __slots__ = ("run", "j", "size", "stride", "offset", "requires_grad")

    def __init__(self, run, j, size, stride, offset, requires_grad):
        self.run, self.j, self.size, self.stride, self.offset = run, j, size, stride, offset
        self.requires_grad = requires_grad


def _unpack_input(saved):
    if not isinstance(saved, _InputView):
        return saved
    x = saved.run.x[saved.j]
    if x is None:
        raise RuntimeError(
            f"gpukit_torch.checkpoint: block {saved.j + 1}'s backward needs x_{saved.j}, which "
            f"schedule {saved.run.chain.plan.schedule!r} has not kept"
        )
    return x.as_strided(saved.size, saved.stride, saved.offset)


def _once_on_gradient(tensor, fn):
    """Calls fn() when the gradient of `tensor` is ready, once: the hook removes itself (a leaf
    the caller passes again would otherwise carry it into the next step)."""
    handle = None

    def hook(grad):
        handle.remove()
        fn()

    handle = tensor.register_hook(hook)


class _Run:
    """One forward and backward of the blocks under a schedule: the activations it keeps, each
    block's call, RNG and autocast state, and the tapes recomputed for the backward. Autograd's
    graph holds it (placeholders and hooks refer to it), so it lives as long as that graph."""

    def __init__(self, chain):
        L = len(chain.blocks)
        self.chain = chain
        self.ops, self.last = chain._ops, chain._last
        self.pos = 0
        self.x = [None] * (L + 1)  # kept activations, detached
        self.calls = [None] * (L + 1)  # each recomputed block's call, its hidden state left out
        self.state = [None] * (L + 1)  # (RNG states, autocast, input requires grad)
        self.frames = [None] * (L + 1)  # recomputed tapes, in the order the forward saved them
        self.saved = [0] * (L + 1)  # how many tensors the forward's placeholders stand for
        self.previous_out = None
        self.watch = chain.watch

    # -- the forward: the model calls the blocks

    def forward(self, i, fn, call):
        ops, L = self.ops, len(self.chain.blocks)
        kind, j = ops[self.pos] if self.pos < len(ops) else ("end", 0)
        if j != i or kind == "B" or kind == "end":
            raise RuntimeError(
                f"gpukit_torch.checkpoint: block {i} ran where the plan expects "
                f"{kind}{j if j else ''} (schedule {self.chain.plan.schedule!r}); the planned "
                "blocks must run once each, in order, in every forward"
            )
        x_in = call.hidden()
        if i > 1 and x_in is not self.previous_out:
            raise RuntimeError(
                f"gpukit_torch.checkpoint: block {i}'s hidden state is not block {i - 1}'s output: "
                "the model changes it between the blocks, so recomputing block "
                f"{i} from block {i - 1}'s output would differ; plan over blocks that pass it on "
                "unchanged (apply(..., blocks=[...]))"
            )
        if i == 1:
            self.x[0] = x_in.detach()
            if self.watch is not None:
                self.watch.chain_entry()
            if x_in.requires_grad:
                _once_on_gradient(x_in, lambda: self.before_backward(0))
        if i in self.chain._recomputed:
            self.calls[i] = call.with_hidden(None)
        dev = x_in.device
        self.state[i] = (
            (torch.get_rng_state(), torch.cuda.get_rng_state(dev) if dev.type == "cuda" else None)
            if i in self.chain._recomputed
            else None,
            (torch.is_autocast_enabled(dev.type), torch.get_autocast_dtype(dev.type))
            if dev.type in ("cuda", "cpu")
            else (False, None),
            x_in.requires_grad,
        )
        if kind == "Fe" and i in self.chain._plain:
            # The schedule keeps x_{i-1} from here to B<i>: autograd may hold it itself.
            out = call(fn)
        elif kind == "Fe":
            # What the block saves of its input is read back from the kept x_{i-1} (which the
            # schedule keeps, or recomputes, for B<i>), so that the graph does not hold x_{i-1}
            # where the schedule drops it, as the simulator counts.
            # (The hook must not refer to x_in: autograd keeps the hooks with what they saved.)
            ptr, dtype = x_in.untyped_storage().data_ptr(), x_in.dtype

            def pack(t, i=i):
                if t.untyped_storage().data_ptr() == ptr and t.dtype == dtype:
                    return _InputView(self, i - 1, t.size(), t.stride(), t.storage_offset(), t.requires_grad)
                return t

            with torch.autograd.graph.saved_tensors_hooks(pack, _unpack_input):
                out = call(fn)
        else:
            with torch.autograd.graph.saved_tensors_hooks(lambda t, i=i: self._pack(i), _unpack):
                out = call(fn)
        h = _hidden_of(out)
        self.x[i] = h.detach()
        self._done(self.pos)
        self.pos += 1
        self.previous_out = h
        if h.requires_grad:
            _once_on_gradient(h, lambda i=i: self.before_backward(i))
        if i == L:
            self.previous_out = None
            if self.watch is not None:
                self.watch.chain_exit()
        return out

    def _pack(self, i):
        self.saved[i] += 1
        return _Slot(self, i, self.saved[i] - 1)

    def _done(self, k):
        for what, j in self.last[k]:
            if what == "x":
                self.x[j] = None

    # -- the backward: autograd reaches the blocks

    def before_backward(self, i):
        """The gradient of x_i is ready: B<i+1> has run, B<i> runs next (i = 0: the backward of
        the blocks is over). Runs the schedule's operations up to B<i>."""
        if self.watch is not None and i == len(self.chain.blocks):
            self.watch.backward_start()  # before any recomputation: the head's peak ends here
        ops = self.ops
        while self.pos < len(ops):
            kind, j = ops[self.pos]
            if kind == "B":
                if j == i:
                    break
                if j < i:
                    raise RuntimeError(
                        f"gpukit_torch.checkpoint: the backward reached block {i} after B{j} of "
                        f"schedule {self.chain.plan.schedule!r}"
                    )
                self.frames[j] = None  # B<j> has run: its tape goes
            else:
                self._recompute(kind, j)
                if self.chain._recomputed[j] == self.pos:
                    self.calls[j] = None
            self._done(self.pos)
            self.pos += 1
        if self.watch is not None and i == 0:
            self.watch.backward_end()  # after B<1>'s tape went: what follows is the step's

    def _recompute(self, kind, j):
        x_in, call = self.x[j - 1], self.calls[j]
        if x_in is None or call is None:
            raise RuntimeError(
                f"gpukit_torch.checkpoint: {kind}{j} needs x_{j - 1}, which schedule "
                f"{self.chain.plan.schedule!r} has not kept"
            )
        rng, (autocast, dtype), needs_grad = self.state[j]
        dev = x_in.device
        now = (torch.get_rng_state(), torch.cuda.get_rng_state(dev) if dev.type == "cuda" else None)
        if rng is not None:
            torch.set_rng_state(rng[0])
            if rng[1] is not None:
                torch.cuda.set_rng_state(rng[1], dev)
        block = self.chain.blocks[j - 1]
        try:
            with self.chain.replaying(), torch.autocast(dev.type, dtype=dtype, enabled=autocast):
                if kind == "Fn":
                    with torch.no_grad():
                        out = call.with_hidden(x_in)(block)
                else:
                    frame = []

                    def pack(t):
                        frame.append(t.detach())
                        return len(frame) - 1

                    xin = x_in.detach().requires_grad_(needs_grad)
                    with torch.enable_grad(), torch.autograd.graph.saved_tensors_hooks(pack, frame.__getitem__):
                        out = call.with_hidden(xin)(block)
                    if self.saved[j] and len(frame) != self.saved[j]:
                        raise RuntimeError(
                            f"gpukit_torch.checkpoint: recomputing block {j} saved {len(frame)} "
                            f"tensors, its first forward {self.saved[j]}: the block does not run "
                            "the same operations twice, so it cannot be recomputed"
                        )
                    self.frames[j] = frame
            h = _hidden_of(out)
            if self.x[j] is None:
                self.x[j] = h.detach()
            elif kind == "Fe":
                # x_j is still kept: the recomputed copy goes at once, and a tape that saved the
                # output reads the kept one instead.
                ptr, kept = h.untyped_storage().data_ptr(), self.x[j]
                self.frames[j] = [
                    kept.as_strided(t.size(), t.stride(), t.storage_offset())
                    if t.untyped_storage().data_ptr() == ptr and t.dtype == kept.dtype else t
                    for t in self.frames[j]
                ]
            del out, h
        finally:
            if rng is not None:
                torch.set_rng_state(now[0])
                if now[1] is not None:
                    torch.cuda.set_rng_state(now[1], dev)

    def unpack(self, slot):
        if self.frames[slot.block] is None:
            self.before_backward(slot.block)
        frame = self.frames[slot.block]
        if frame is None or slot.index >= len(frame) or frame[slot.index] is None:
            raise RuntimeError(
                f"gpukit_torch.checkpoint: block {slot.block}'s saved tensor {slot.index} is not "
                "available: its backward ran twice (retain_graph), out of the schedule's order, or "
                "it was unpacked before"
            )
        # Autograd unpacks a saved tensor once, when its node runs, and frees it after: the
        # frame lets go of it now, so that the tape shrinks through B<i> as the profile measured.
        t, frame[slot.index] = frame[slot.index], None
        return t


class _Chain:
    """Planned blocks: the schedule, and the run of the forward in progress."""

    def __init__(self, blocks):
        self.blocks = list(blocks)
        self.run = None
        self.watch = None
        self._attended = False  # apply()'s own steps: through the run even for store-all
        self._replaying = 0
        self.plan = None

    def set_plan(self, checkpoint_plan: CheckpointPlan):
        ops = _parse(checkpoint_plan.schedule)
        L = len(self.blocks)
        if not ops or any(i < 1 or i > L for _, i in ops):
            raise ValueError(f"gpukit_torch.checkpoint: schedule {checkpoint_plan.schedule!r} is not for {L} blocks")
        stages = checkpoint_plan.stages or [(1, 1, 1, 1)] * L
        if len(stages) != L:
            raise ValueError(f"gpukit_torch.checkpoint: a plan for {len(stages)} blocks given to {L} blocks")
        _planner().simulate_schedule(stages, checkpoint_plan.schedule)  # validates it
        if [i for _, i in ops[:L]] != list(range(1, L + 1)) or any(k == "B" for k, _ in ops[:L]):
            raise ValueError(
                f"gpukit_torch.checkpoint: schedule {checkpoint_plan.schedule!r} does not start with "
                "each block's forward, once, in order"
            )
        self.plan = checkpoint_plan
        self._ops = ops
        self._last = _last_uses(ops, L)
        # The recomputed blocks, each with its last recomputation: its call (the other arguments,
        # such as position ids) is let go after it, as the model lets go of it after the forward.
        self._recomputed = {i: k for k, (kind, i) in enumerate(ops) if k >= L and kind != "B"}
        self._plain = _inputs_kept(ops, self._last, L)
        # Nothing recomputed and every input kept as autograd keeps it: the blocks run as the
        # model runs them, with no bookkeeping (a step apply() watches still goes through _Run).
        self._store_all = not self._recomputed and len(self._plain) == L
        self.place_patches()

    def place_patches(self):
        """Each block's forward is the patch that runs the plan, or, where the blocks need not go
        through the run (_runs_plan), the block's own (no wrapper at all: the step is the
        model's)."""
        for b in self.blocks:
            if getattr(b, "_gpukit_checkpoint", None) is not self:
                continue
            if self._runs_plan():
                b.forward = b._gpukit_patch
            elif b._gpukit_own_forward is not None:
                b.forward = b._gpukit_own_forward
            else:
                b.__dict__.pop("forward", None)

    def _runs_plan(self):
        """Whether the blocks go through the run: a plan that recomputes something, or one of
        apply()'s own steps (watched, or timed unwatched) of any plan."""
        return not self._store_all or self._attended

    @contextlib.contextmanager
    def attended(self, watch=None):
        """apply()'s own step of the plan, through the run whatever the plan, watched by `watch`
        (a _StepWatch) or timed as it is (None)."""
        self.watch, self._attended = watch, True
        self.place_patches()
        try:
            yield
        finally:
            self.watch, self._attended = None, False
            self.place_patches()

    @contextlib.contextmanager
    def replaying(self):
        self._replaying += 1
        try:
            yield
        finally:
            self._replaying -= 1

    def forward_block(self, i, fn, call):
        """Block i (1-based) called by the model: fn(*args, **kwargs) under the plan."""
        if self._replaying or not torch.is_grad_enabled() or not self._runs_plan():
            return call(fn)
        if i == 1:
            self.run = _Run(self)
        if self.run is None:
            raise RuntimeError(f"gpukit_torch.checkpoint: block {i} ran before block 1 in this forward")
        run = self.run
        if i == len(self.blocks):
            self.run = None  # the run lives on in its graph
        return run.forward(i, fn, call)


class PlannedSequential(nn.Module):
    """One-tensor blocks run in order under a checkpoint plan (see the module's docstring).
    Under no_grad the blocks simply run in order."""

    def __init__(self, blocks, checkpoint_plan: CheckpointPlan, costs: Optional[List[BlockCost]] = None):
        super().__init__()
        self.blocks = nn.ModuleList(blocks)
        self.costs = costs
        self._chain = _Chain(self.blocks)
        self.set_plan(checkpoint_plan)

    def set_plan(self, checkpoint_plan: CheckpointPlan):
        """Runs under another plan (e.g. one planned for another budget) from the next forward."""
        self._chain.set_plan(checkpoint_plan)
        self.plan = checkpoint_plan

    def forward(self, x):
        for i, b in enumerate(self.blocks, start=1):
            x = self._chain.forward_block(i, b, _Call((x,)))
        return x


def sequential(model, budget_bytes: int, example_input: torch.Tensor, repetitions: int = 5, warmup: int = 2):
    """`model` (an nn.Sequential or a list of blocks) checkpointed under gpukit's fastest plan for
    `budget_bytes`: the activation memory a training step may use beyond what is allocated when
    its forward starts (parameters, their gradients, the input). Profiles the blocks on the device
    of `example_input` (profile()), plans (plan()) and returns a PlannedSequential sharing the
    blocks; its .plan holds the schedule and the predicted peak and time. Raises infeasible_budget
    (a ValueError) naming the least budget that has a plan.
    """
    blocks = _blocks_of(model)
    costs = profile(blocks, example_input, repetitions=repetitions, warmup=warmup)
    return PlannedSequential(blocks, plan(costs, budget_bytes), costs)


# ---------------------------------------------------------------------------------------------
# Models: finding the blocks, planning them in place, closing the loop


def find_blocks(model: nn.Module) -> List[str]:
    """The names of `model`'s repeated blocks, in module order: the children of every
    nn.ModuleList or nn.Sequential whose children (two or more) are all of one class, of the
    class whose blocks hold the most parameters (transformers' GPT-2 `transformer.h.0` ...,
    Llama `model.layers.0` ..., torchvision ResNet's Bottlenecks `layer1.0` ... `layer4.2`).
    The names are relative to the module that torch.compile wrapped, where `model` is one.
    Raises ValueError when the model has no such container."""
    model = _compiled(model)[0]
    groups = {}
    for name, m in model.named_modules():
        if isinstance(m, (nn.ModuleList, nn.Sequential)):
            children = list(m.named_children())
            if len(children) >= 2 and len({type(c) for _, c in children}) == 1:
                group = groups.setdefault(type(children[0][1]), {})
                for child_name, child in children:
                    group.setdefault(id(child), (f"{name}.{child_name}" if name else child_name, child))
    if not groups:
        raise ValueError(
            f"gpukit_torch.checkpoint: {type(model).__name__} has no nn.ModuleList or nn.Sequential "
            "of blocks of one class; name the blocks (apply(..., blocks=[...]))"
        )

    def weight(group):
        return (sum(p.numel() for _, b in group.values() for p in b.parameters()), len(group))

    best = max(groups.values(), key=weight)
    return [name for name, _ in best.values()]


def _step_inputs(model, example_inputs):
    if isinstance(example_inputs, dict):
        return model(**example_inputs)
    if isinstance(example_inputs, (tuple, list)):
        return model(*example_inputs)
    return model(example_inputs)


def _compiled(model):
    """(the module, the dynamo context that compiled it) for `model` = torch.compile(module);
    (model, None) for a module that is not so wrapped."""
    try:
        from torch._dynamo.eval_frame import OptimizedModule  # noqa: PLC0415
    except ImportError:  # a PyTorch without dynamo
        return model, None
    if isinstance(model, OptimizedModule):
        return model._orig_mod, model.dynamo_ctx
    return model, None


def _refuse_cuda_graphs(compiler):
    """ValueError where `compiler` (a dynamo context) replays CUDA graphs: torch.compile's
    mode="reduce-overhead" or "max-autotune", options={"triton.cudagraphs": True}, or
    backend="cudagraphs". A replay overwrites the outputs of the graph's last one, and a plan keeps
    what a block's compiled graph made (its output, its tape) while it replays the same block's
    graph to recompute others."""
    backend, seen = getattr(compiler, "callback", None), 0
    while backend is not None and seen < 8:
        config = getattr(backend, "config", None)
        if (isinstance(config, dict) and config.get("triton.cudagraphs")) or \
                getattr(backend, "_compiler_name", None) == "cudagraphs":
            raise ValueError(
                "gpukit_torch.checkpoint: the model is compiled to replay CUDA graphs (torch.compile "
                "with mode='reduce-overhead' or 'max-autotune', triton.cudagraphs, or the 'cudagraphs' "
                "backend), which planned blocks do not support: a replay overwrites the outputs that "
                "a plan keeps while it recomputes; compile with the default mode or "
                "mode='max-autotune-no-cudagraphs'"
            )
        backend, seen = getattr(backend, "_torchdynamo_orig_backend", None), seen + 1


def _compile_blocks(mods, compiler):
    """Each block's forward compiled by `compiler` (the whole model's dynamo context: its backend
    and options), unless it is compiled already; remove() gives back the forward it had."""
    for b in mods:
        if getattr(b.forward, "_torchdynamo_orig_callable", None) is None:
            b._gpukit_uncompiled = b.__dict__.get("forward")
            b.forward = compiler(b.forward)


def _default_loss(out):
    """The output's .loss where it has one (transformers with labels=), else the sum of its
    first tensor (logits)."""
    loss = getattr(out, "loss", None)
    if isinstance(loss, torch.Tensor):
        return loss
    if hasattr(out, "to_tuple"):
        out = out.to_tuple()
    t = out if isinstance(out, torch.Tensor) else next(
        (v for v in (out if isinstance(out, (tuple, list)) else ()) if isinstance(v, torch.Tensor)), None)
    if t is None:
        raise TypeError(
            f"gpukit_torch.checkpoint: cannot make a loss of a {type(out).__name__}; pass loss_fn="
        )
    return t.sum()


class _StepWatch:
    """Memory and time of one training step around the blocks: what OutsideCost holds, the
    step's peak and its time. The allocator's counters are read on the host as the step goes
    (they change when the host allocates, so nothing waits for the device); the peak counter is
    reset at the blocks' edges, and the step's peak is the largest of the parts. Times come from
    CUDA events recorded at the same edges (a steady clock off CUDA), read when the step is over."""

    def __init__(self, probe, device, others=()):
        self.probe = probe
        self.cuda = device.type == "cuda"
        # Parameters outside the blocks whose gradient the backward allocates: the head's are
        # held through the blocks' backward.
        self.others = [p for p in others if p.grad is None]
        self.head_grads = 0
        probe.sync()
        self.base = probe.allocated()
        probe.reset_peak()
        self.top = 0
        self.marks = {}
        self.before = self.prefix = self.head = self.tail = 0
        self.exit_allocated = None
        self._mark("start")

    def _mark(self, name):
        if self.cuda:
            e = torch.cuda.Event(enable_timing=True)
            e.record()
            self.marks[name] = e
        else:
            self.marks[name] = time.perf_counter()

    def _ms(self, a, b):
        if self.cuda:
            return self.marks[a].elapsed_time(self.marks[b])
        return (self.marks[b] - self.marks[a]) * 1e3

    def _part(self):
        p = self.probe.peak()
        self.top = max(self.top, p)
        return p

    def chain_entry(self):
        self.prefix = self._part() - self.base
        self.before = self.probe.allocated() - self.base
        self._mark("entry")

    def chain_exit(self):
        self._part()
        self.exit_allocated = self.probe.allocated()
        self.probe.reset_peak()
        self._mark("exit")

    def backward_start(self):
        p = self._part()
        if self.exit_allocated is not None:
            self.head = p - self.exit_allocated
        self.head_grads = _storage_bytes([q.grad for q in self.others if q.grad is not None])
        self.probe.reset_peak()
        self._mark("backward")

    def backward_end(self):
        self._part()
        self.probe.reset_peak()
        self._mark("backward_end")

    def finish(self):
        self._mark("end")
        self.probe.sync()
        p = self._part()
        if "backward_end" in self.marks:
            self.tail = p - self.base
        outside_ms = 0.0
        for a, b in (("start", "entry"), ("exit", "backward"), ("backward_end", "end")):
            if a in self.marks and b in self.marks:
                outside_ms += self._ms(a, b)
        chain = {}
        for part, (a, b) in (("forward_ms", ("entry", "exit")), ("backward_ms", ("backward", "backward_end"))):
            if a in self.marks and b in self.marks:
                chain[part] = self._ms(a, b)
        return dict(peak=self.top - self.base, ms=self._ms("start", "end"), outside_ms=outside_ms, **chain)


def _resolve_blocks(model, blocks):
    names = find_blocks(model) if blocks is None else list(blocks)
    if not names:
        raise ValueError("gpukit_torch.checkpoint: blocks=[] names no block")
    out = []
    for b in names:
        if isinstance(b, nn.Module):
            name = next((n for n, m in model.named_modules() if m is b), None)
            if name is None:
                raise ValueError(f"gpukit_torch.checkpoint: block {type(b).__name__} is not a module of the model")
            out.append((name, b))
        else:
            if b.startswith("_orig_mod.") and not hasattr(model, "_orig_mod"):
                b = b[len("_orig_mod."):]  # a name within torch.compile(model), of the model
            try:
                out.append((b, model.get_submodule(b)))
            except AttributeError as e:
                raise ValueError(f"gpukit_torch.checkpoint: the model has no block {b!r}") from e
    if len({id(m) for _, m in out}) != len(out):
        raise ValueError(f"gpukit_torch.checkpoint: a block is named twice in {[n for n, _ in out]}")
    return out


def _capture_calls(model, blocks, example_inputs):
    """Each block's call in one forward of the model without grad, in the order of the calls."""
    seen, handles = [], []
    for i, block in enumerate(blocks):
        def hook(module, args, kwargs, i=i):
            seen.append((i, _Call(args, kwargs)))
        handles.append(block.register_forward_pre_hook(hook, with_kwargs=True))
    try:
        with torch.no_grad():
            _step_inputs(model, example_inputs)
    finally:
        for h in handles:
            h.remove()
    order = [i for i, _ in seen]
    if order != list(range(len(blocks))):
        raise ValueError(
            "gpukit_torch.checkpoint: the model calls its blocks in the order "
            f"{order[:32]}, not once each in order 0..{len(blocks) - 1}; name blocks that it does"
        )
    for i, call in seen:
        if call.kwargs.get("use_cache") is True:
            raise ValueError(
                f"gpukit_torch.checkpoint: block {i} is called with use_cache=True: a cache filled "
                "in a training step would be filled again when the block is recomputed; pass "
                "use_cache=False (or set model.config.use_cache = False)"
            )
    return [c for _, c in seen]


def remove(model: nn.Module) -> int:
    """Undoes apply(): the blocks' own forward again. Returns how many blocks it restored."""
    n = 0
    for m in _compiled(model)[0].modules():
        if getattr(m, "_gpukit_checkpoint", None) is not None:
            m.__dict__.pop("forward", None)  # the patch (absent while a store-all plan runs)
            if m._gpukit_own_forward is not None:  # a forward of its own, set on the instance
                m.forward = m._gpukit_own_forward
            del m._gpukit_checkpoint, m._gpukit_own_forward, m._gpukit_patch
            n += 1
        if "_gpukit_uncompiled" in m.__dict__:  # compiled by apply() or install()
            m.__dict__.pop("forward", None)
            if m._gpukit_uncompiled is not None:
                m.forward = m._gpukit_uncompiled
            del m._gpukit_uncompiled
    return n


def install(model: nn.Module, checkpoint_plan: CheckpointPlan, *, blocks=None) -> CheckpointPlan:
    """Runs `model`'s blocks under a plan made earlier (apply()'s, or plan()'s for the same
    blocks), in place, without profiling or running a step: e.g. the plan again after remove(),
    or on another instance of the same model and batch shape. blocks: as apply() takes them
    (default: the plan's own block names, else find_blocks(model)). Raises ValueError where the
    plan is not for that many blocks or its schedule is not valid; the model is then left as it
    was. A torch.compile(module) has its blocks compiled as apply() compiles them. Returns the
    plan; remove(model) undoes it."""
    names = blocks if blocks is not None else (checkpoint_plan.blocks or None)
    model, compiler = _compiled(model)
    if compiler is not None:
        _refuse_cuda_graphs(compiler)
    mods = [m for _, m in _resolve_blocks(model, names)]
    _planned_chain(model, mods, checkpoint_plan, compiler)
    return checkpoint_plan


def _planned_chain(model, mods, checkpoint_plan, compiler=None):
    """The blocks `mods` of `model` run under `checkpoint_plan` (validated first: on a bad plan
    the model stays as it was); an earlier plan's patches are removed. compiler: the dynamo
    context of torch.compile(model), which then compiles each block (see _compile_blocks).
    Returns their _Chain."""
    chain = _Chain(mods)
    chain.set_plan(checkpoint_plan)
    remove(model)
    if compiler is not None:
        _compile_blocks(mods, compiler)
    for i, m in enumerate(mods, start=1):
        _patch(m, chain, i)
    chain.place_patches()
    return chain


def _patch(block, chain, i):
    own = block.forward
    block._gpukit_own_forward = block.__dict__.get("forward")

    @torch._dynamo.disable
    def forward(*args, **kwargs):
        if chain._replaying:
            return own(*args, **kwargs)
        return chain.forward_block(i, own, _Call(args, kwargs))

    block.forward = forward
    block._gpukit_patch = forward
    block._gpukit_checkpoint = chain


@contextlib.contextmanager
def _state_kept(model, device):
    """Parameters' .grad (copied to the host), buffers (BatchNorm's statistics) and the RNG
    state as they were, after the training steps apply() runs."""
    params = [p for p in model.parameters() if p.requires_grad]
    grads = [None if p.grad is None else p.grad.detach().to("cpu", copy=True) for p in params]
    buffers = [(b, b.detach().to("cpu", copy=True)) for b in model.buffers()]
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        try:
            yield lambda: _restore_grads(params, grads)
        finally:
            _restore_grads(params, grads)
            with torch.no_grad():
                for b, v in buffers:
                    b.copy_(v)


def _restore_grads(params, grads):
    with torch.no_grad():
        for p, g in zip(params, grads):
            if g is None:
                p.grad = None
            elif p.grad is None:
                p.grad = g.to(p.device)
            else:
                p.grad.copy_(g)


def _measured_step(model, example_inputs, loss_fn, chain, probe, device, restore_grads):
    """One training step of the planned model, watched: (its _StepWatch, what finish() measured).
    The parameters' .grad are restored after it."""
    inside = {id(p) for b in chain.blocks for p in _params(b)}
    others = [p for p in model.parameters() if p.requires_grad and id(p) not in inside]
    watch = _StepWatch(probe, device, others)
    try:
        with chain.attended(watch):
            loss_fn(_step_inputs(model, example_inputs)).backward()
        return watch, watch.finish()
    finally:
        restore_grads()


def _calibrated(model, example_inputs, loss_fn, chain, probe, device, restore_grads, costs, schedule,
                outside, steps):
    """`outside` with the blocks' time scales measured on `steps` more steps of `schedule` (the
    least forward and backward through the blocks, and the least time around them), and the
    step scale from as many unwatched steps (the least over the least watched step), or as it is
    where no step could tell them."""
    forward, backward, around, watched = [], [], [], []
    for _ in range(steps):
        measured = _measured_step(model, example_inputs, loss_fn, chain, probe, device, restore_grads)[1]
        around.append(measured["outside_ms"])
        watched.append(measured["ms"])
        if "forward_ms" in measured and "backward_ms" in measured:
            forward.append(measured["forward_ms"])
            backward.append(measured["backward_ms"])
    scales = _time_scales(costs, schedule, min(forward), min(backward)) if forward else None
    if scales is None:
        return outside
    unwatched = [_unwatched_step(model, example_inputs, loss_fn, chain, device, restore_grads)[0]
                 for _ in range(steps)]
    step_scale = min(unwatched) / min(watched) if min(watched) > 0 and min(unwatched) > 0 else 1.0
    return OutsideCost(**{**asdict(outside), "ms": min(around + [outside.ms]), "forward_scale": scales[0],
                          "backward_scale": scales[1], "timed_steps": len(forward), "step_scale": step_scale})


def _unwatched_step(model, example_inputs, loss_fn, chain, device, restore_grads, probe=None, attended=True):
    """One training step of the planned model as a training loop runs it (no watch): (its ms from
    an idle device, as a watched step is timed; its peak beyond what is allocated when it starts,
    where `probe` is given, else None). attended: through the plan's run even where the plan
    recomputes nothing (as every other plan runs), so that a step scale takes out the watch's
    cost alone; else the blocks as the plan places them. The parameters' .grad are restored
    after it."""
    timer = _Timer(device)
    try:
        with chain.attended() if attended else contextlib.nullcontext():
            if probe is not None:
                probe.sync()  # synchronizes the device, as the timer wants
                base = probe.allocated()
                probe.reset_peak()
            elif device.type == "cuda":
                torch.cuda.synchronize(device)
            ms = timer(lambda: loss_fn(_step_inputs(model, example_inputs)).backward())[0]
            if probe is None:
                return ms, None
            probe.sync()
            return ms, probe.peak() - base
    finally:
        restore_grads()


def apply(model: nn.Module, budget_bytes: int, example_inputs, *, blocks=None,
          loss_fn: Optional[Callable] = None, probe: Optional[MemoryProbe] = None,
          repetitions: int = 5, warmup: int = 2, max_rounds: int = 4,
          costs: Optional[List[BlockCost]] = None, outside: Optional[OutsideCost] = None,
          timing_steps: int = 2) -> CheckpointPlan:
    """Plans `model`'s repeated blocks under `budget_bytes` and runs them under the plan, in place.

    budget_bytes: the peak of one training step (forward, loss, backward) beyond what is
    allocated when it starts (parameters, their gradients, the batch). example_inputs: a batch
    as the model takes it (a dict of keyword arguments, a tuple of positional ones, or a tensor);
    the steps apply() runs call loss_fn(model(batch)).backward() (default: the output's .loss,
    else the sum of its first tensor). blocks: names or modules of the blocks, in the order the
    model calls them (default find_blocks(model)). probe: the allocator's counters (default
    MemoryProbe on CUDA; without one, off CUDA, sizes come from storages and no step is measured).
    model may be torch.compile(module) (see "torch.compile" above): its blocks are compiled by its
    compiler and the steps run it; the plan's block names are the module's.
    costs, outside: an earlier plan's .costs and .outside for the same blocks and batch (e.g. to
    plan the model again for another budget): the blocks are not profiled again, and the first
    step is predicted with what runs around them. timing_steps: where `outside` carries no time
    scales (OutsideCost.timed_steps 0), the steps run after the loop to measure them, and as many
    unwatched steps for the step scale (0: none; the profile's times stand); with an earlier
    plan's outside, its scales price this plan.

    Profiles the blocks (profile(), on the calls a forward of the model makes), plans, replaces
    each block's forward, and closes the loop: it runs a step, measures its peak, what runs
    around the blocks (OutsideCost) and its time, adds to correction_bytes what the step measured
    beyond what the model predicts for it (with what that step measured around the blocks),
    plans again, and runs the new plan, until a step measures no more than the model predicts
    and fits the budget (up to max_rounds steps); the returned plan's predicted peak and time are
    then the model's with that step's measurements, and as much of the correction as that step
    needed (correction_bytes is what the plan was made with). Parameters' .grad, buffers and the
    RNG state are restored after these steps. Returns the CheckpointPlan (its rounds hold each
    step's prediction, measurement and correction); remove(model) undoes it. Raises
    infeasible_budget (a ValueError) naming the least budget that has a plan, ValueError for
    blocks it cannot find or plan (named), RuntimeError when no step fits within max_rounds (the
    model is left as it was). Synchronizes the device.
    """
    if max_rounds < 1 or timing_steps < 0:
        raise ValueError(f"gpukit_torch.checkpoint.apply: max_rounds={max_rounds}, timing_steps={timing_steps}")
    runner = model  # what the steps call: torch.compile(model) runs compiled around the blocks
    model, compiler = _compiled(model)
    if compiler is not None:
        _refuse_cuda_graphs(compiler)
    remove(model)
    named = _resolve_blocks(model, blocks)
    mods = [m for _, m in named]
    calls = _capture_calls(model, mods, example_inputs)
    try:  # on any error the model is left as it was (its blocks uncompiled again)
        if compiler is not None:
            _compile_blocks(mods, compiler)  # profiled as they will run
        x0 = calls[0].hidden()
        device = x0.device
        if probe is None and device.type == "cuda":
            probe = MemoryProbe(device)
        loss_fn = loss_fn or _default_loss
        grads_persist = any(p.grad is None for m in mods for p in _params(m))
        if costs is None:
            costs = _profile_calls(mods, calls, x0, repetitions, warmup, probe, grads_persist)
        elif len(costs) != len(mods):
            raise ValueError(f"gpukit_torch.checkpoint.apply: {len(costs)} costs for {len(mods)} blocks")
        del calls, x0
        if outside is None:
            outside = OutsideCost(grads_persist=grads_persist)
        else:
            outside = OutsideCost(**{**asdict(outside), "grads_persist": grads_persist})
        current = _plan(costs, budget_bytes, outside)
        current.blocks = [n for n, _ in named]
        chain = _planned_chain(model, mods, current, compiler)
    except BaseException:
        remove(model)
        raise
    if probe is None:
        return current
    rounds, correction = [], 0
    try:
        with _state_kept(model, device) as restore_grads:
            if compiler is not None:  # compiles what the watched steps run, outside their peaks
                _unwatched_step(runner, example_inputs, loss_fn, chain, device, restore_grads)
            for _ in range(max_rounds):
                watch, measured = _measured_step(runner, example_inputs, loss_fn, chain, probe, device,
                                                 restore_grads)
                # What the step measured around the blocks: its sizes (a later step's stand for
                # the steps that follow it better than an earlier one's, which may hold what
                # libraries allocate once on first use), and the least time of the steps.
                timed = rounds or outside.timed_steps
                outside = OutsideCost(watch.before, watch.prefix, watch.head, watch.tail,
                                      min(measured["outside_ms"], outside.ms) if timed else measured["outside_ms"],
                                      grads_persist, outside.forward_scale, outside.backward_scale,
                                      outside.timed_steps, watch.head_grads, outside.step_scale)
                model_time, model_peak = _evaluate(costs, current.schedule, outside, correction)
                # A compiled model whose plan recomputes nothing runs its blocks unpatched, in
                # whatever graphs dynamo makes of them, not broken at each block as the watched
                # step ran them: the peak is such a step's own (the second: the first compiles).
                whole = compiler is not None and chain._store_all
                if whole:
                    for _ in range(2):
                        peak = _unwatched_step(runner, example_inputs, loss_fn, chain, device, restore_grads,
                                               probe, attended=False)[1]
                    measured = dict(measured, peak=peak)
                over = measured["peak"] - model_peak
                rounds.append(dict(
                    schedule=current.schedule, predicted_peak=current.predicted_peak,
                    predicted_time_ms=current.predicted_time_ms, measured_peak=measured["peak"],
                    measured_time_ms=measured["ms"], model_peak=model_peak,
                    correction_bytes=_rounded(max(0, over)),
                ))
                current.measured_peak, current.measured_time_ms = measured["peak"], measured["ms"]
                if over <= 0 and measured["peak"] <= int(budget_bytes) and model_peak <= int(budget_bytes):
                    # The model, with what this step measured around the blocks, accounts for the
                    # step: the plan stays, predicted by that model, with as much of the
                    # correction as this step needed (an earlier step's overshoot that the plan
                    # made since does not meet, e.g. one-time costs of its first step, is a
                    # margin the plan keeps, not a peak it will reach).
                    uncorrected = model_peak - correction
                    needed = min(correction, _rounded(max(0, measured["peak"] - uncorrected)))
                    current.predicted_peak, current.predicted_time_ms = uncorrected + needed, model_time
                    if whole:  # measured as it runs, which the model of broken graphs is not
                        current.predicted_peak = measured["peak"]
                    current.outside = outside
                    break
                correction += _rounded(max(0, over))
                following = _plan(costs, budget_bytes, outside, correction)
                following.blocks = current.blocks
                chain.set_plan(following)
                current = following
            else:
                raise RuntimeError(
                    f"gpukit_torch.checkpoint.apply: {max_rounds} steps measured more than predicted "
                    f"or more than the budget of {int(budget_bytes)} bytes (the last: measured "
                    f"{rounds[-1]['measured_peak']}, predicted {rounds[-1]['predicted_peak']}); "
                    "raise max_rounds or the budget"
                )
            if outside.timed_steps == 0 and timing_steps > 0:
                outside = _calibrated(runner, example_inputs, loss_fn, chain, probe, device, restore_grads,
                                      costs, current.schedule, outside, timing_steps)
                current.outside = outside
                current.predicted_time_ms = _evaluate(costs, current.schedule, outside, correction)[0]
    except BaseException:
        remove(model)
        raise
    current.rounds = rounds
    current.correction_bytes = correction
    return current
