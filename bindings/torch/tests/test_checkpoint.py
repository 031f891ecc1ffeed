# SPDX-License-Identifier: Apache-2.0
"""gpukit_torch.checkpoint: blocks under gpukit's plan give the gradients of no checkpointing,
replay dropout exactly, run the planner's schedule as written, and plan within the budget.

    pytest bindings/torch/tests/test_checkpoint.py      # CPU; the CUDA cases skip without a GPU

Without gpukit_torch._C (no CUDA extension installed) the planner is compiled from
bindings/torch/csrc/planner.cpp on first use (a few seconds of g++).
"""

import os
import sys

import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402

try:  # the installed package (with gpukit_torch._C) when there is one, else this checkout's
    import gpukit_torch.checkpoint as ckpt
except ImportError:
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    import gpukit_torch.checkpoint as ckpt  # noqa: E402

L = 8


def make_blocks(dropout=0.0, width=32, seed=0):
    torch.manual_seed(seed)
    blocks = []
    for i in range(L):
        w = width * (4 if i % 2 == 0 else 1)
        w_in = width * (1 if i % 2 == 0 else 4)
        layers = [nn.Linear(w_in, w), nn.Tanh()]
        if dropout:
            layers.append(nn.Dropout(dropout))
        blocks.append(nn.Sequential(*layers))
    return nn.Sequential(*blocks).double()


def make_input(batch=16, width=32, grad=True):
    torch.manual_seed(1)
    return torch.randn(batch, width, dtype=torch.double, requires_grad=grad)


def grads_of(model, x, seed=7):
    """Loss value, input gradient, parameter gradients, and the RNG state after the step."""
    for p in model.parameters():
        p.grad = None
    if x.grad is not None:
        x.grad = None
    torch.manual_seed(seed)
    out = model(x)
    loss = (out * out).sum()
    loss.backward()
    return (
        loss.detach().clone(),
        None if x.grad is None else x.grad.clone(),
        [p.grad.clone() for p in model.parameters()],
        torch.get_rng_state(),
    )


def assert_same(a, b):
    assert torch.equal(a[0], b[0])
    assert (a[1] is None) == (b[1] is None)
    if a[1] is not None:
        assert torch.equal(a[1], b[1])
    assert len(a[2]) == len(b[2])
    for g, h in zip(a[2], b[2]):
        assert torch.equal(g, h)
    assert torch.equal(a[3], b[3])  # the generator continues as without recomputation


def forwards(ops):
    return sum(1 for kind, _ in ops if kind != "B")


@pytest.fixture(scope="module")
def costs():
    return ckpt.profile(make_blocks(), make_input(grad=False), repetitions=2, warmup=1)


def test_profile_sizes_are_the_outputs_and_saved_tensors(costs):
    assert len(costs) == L
    batch, width = 16, 32
    for i, c in enumerate(costs):
        w = width * (4 if i % 2 == 0 else 1)
        assert c.output_bytes == batch * w * 8  # the block's output (double)
        # Linear saves its input (x_{i-1}) and weight, Tanh its output (x_i): nothing beyond.
        assert c.tape_bytes == 0
        assert c.forward_ms > 0 and c.backward_ms > 0
    # With dropout after Tanh: Tanh's output and the dropout mask (a byte an element where dropout
    # is fused, as on CUDA; a double on the CPU) are kept.
    x = make_input(grad=False)
    for i, c in enumerate(ckpt.profile(make_blocks(dropout=0.5), x, repetitions=1, warmup=0)):
        w = width * (4 if i % 2 == 0 else 1)
        assert c.output_bytes == batch * w * 8
        assert c.tape_bytes in (batch * w * (8 + 1), batch * w * (8 + 8))


def least_budget(costs):
    with pytest.raises(ckpt.infeasible_budget) as e:
        ckpt.plan(costs, 0)
    return e.value.minimum_budget


def test_plan_respects_the_budget_and_names_the_least(costs):
    store_all = " ".join([f"Fe{i}" for i in range(1, L + 1)] + [f"B{i}" for i in range(L, 0, -1)])
    all_peak = ckpt.simulate(costs, store_all)[1]
    least = least_budget(costs)
    assert 0 < least < all_peak
    for budget in (all_peak, (all_peak + least) // 2, least):
        p = ckpt.plan(costs, budget)
        assert p.predicted_peak <= budget
        t, peak = ckpt.simulate(costs, p.schedule)
        assert peak == p.predicted_peak
        assert forwards(p.ops) >= L
    assert forwards(ckpt.plan(costs, all_peak).ops) == L  # store-all fits: nothing recomputed
    assert forwards(ckpt.plan(costs, least).ops) > L
    with pytest.raises(ckpt.infeasible_budget) as e:
        ckpt.plan(costs, least - 1)
    assert e.value.minimum_budget == least


@pytest.mark.parametrize("fraction", [1.0, 0.5, 0.3, 0.0])
def test_gradients_equal_no_checkpointing(costs, fraction):
    model = make_blocks()
    x = make_input()
    reference = grads_of(model, x)
    all_peak = ckpt.plan(costs, 1 << 40).predicted_peak
    try:
        p = ckpt.plan(costs, int(all_peak * fraction))
    except ckpt.infeasible_budget as e:
        p = ckpt.plan(costs, e.minimum_budget)
    planned = ckpt.PlannedSequential(list(model), p, costs)
    assert_same(grads_of(planned, x), reference)


def test_dropout_replays_exactly_under_recomputation():
    model = make_blocks(dropout=0.25)
    x = make_input()
    c = ckpt.profile(model, x, repetitions=1, warmup=0)
    p = ckpt.plan(c, least_budget(c))
    assert forwards(p.ops) > L  # something is recomputed
    planned = ckpt.PlannedSequential(list(model), p, c)
    reference = grads_of(model, x, seed=11)
    assert_same(grads_of(planned, x, seed=11), reference)
    # And the masks differ from seed to seed (the test can see a wrong replay).
    assert not torch.equal(grads_of(model, x, seed=12)[1], reference[1])


def test_the_schedule_runs_as_written():
    model = make_blocks()
    x = make_input()
    calls = [0] * (L + 1)
    for i, b in enumerate(model, start=1):
        b.register_forward_hook(lambda m, inp, out, i=i: calls.__setitem__(i, calls[i] + 1))
    # A hand-written schedule outside the planner's class: x_2 dropped and recomputed twice.
    fwd = " ".join(f"Fn{i}" for i in range(1, L)) + f" Fe{L} B{L}"
    back = []
    for j in range(L - 1, 0, -1):
        back += [f"Fn{i}" for i in range(1, j)] + [f"Fe{j}", f"B{j}"]
    schedule = fwd + " " + " ".join(back)
    p = ckpt.CheckpointPlan(schedule=schedule, budget=-1, predicted_peak=0, predicted_time_ms=0.0)
    planned = ckpt.PlannedSequential(list(model), p)
    reference = grads_of(model, x)
    calls[:] = [0] * (L + 1)
    assert_same(grads_of(planned, x), reference)
    ops = ckpt._parse(schedule)
    for i in range(1, L + 1):
        assert calls[i] == sum(1 for kind, s in ops if kind != "B" and s == i)


def test_input_without_grad_and_no_grad_mode(costs):
    model = make_blocks()
    x = make_input(grad=False)
    planned = ckpt.PlannedSequential(list(model), ckpt.plan(costs, ckpt.plan(costs, 1 << 40).predicted_peak // 2), costs)
    assert_same(grads_of(planned, x), grads_of(model, x))
    with torch.no_grad():
        assert torch.equal(planned(x), model(x))


def test_sequential_profiles_and_plans():
    model = make_blocks()
    x = make_input()
    planned = ckpt.sequential(model, 1 << 30, x, repetitions=1, warmup=0)
    assert planned.plan.predicted_peak <= 1 << 30
    assert forwards(planned.plan.ops) == L
    assert_same(grads_of(planned, x), grads_of(model, x))
    with pytest.raises(TypeError):
        ckpt.sequential(nn.Linear(2, 2), 1 << 30, x)


def test_the_planner_is_gpukits():
    planner = ckpt._planner()
    assert planner.__name__.endswith(("_C", "_gpukit_planner"))
    if torch.cuda.is_available():
        assert planner.__name__.endswith("_C")  # the extension's binding where CUDA is


def test_a_bad_schedule_is_refused():
    model = make_blocks()
    p = ckpt.CheckpointPlan(schedule="Fe1 B1", budget=-1, predicted_peak=0, predicted_time_ms=0.0)
    with pytest.raises(ValueError):
        ckpt.PlannedSequential(list(model), p)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_peak_within_the_budget():
    model = make_blocks(width=256).float().cuda()
    x = torch.randn(512, 256, device="cuda", requires_grad=True)
    c = ckpt.profile(model, x)
    budget = ckpt.plan(c, 1 << 40).predicted_peak // 2
    planned = ckpt.PlannedSequential(list(model), ckpt.plan(c, budget), c)
    for _ in range(2):
        planned(x).sum().backward()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    planned(x).sum().backward()
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - base
    assert peak <= budget * 1.05, (peak, budget, planned.plan)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_profile_measures_the_tape():
    # Linear -> GELU -> Linear saves the first Linear's output (for GELU) and GELU's output (for
    # the second Linear): a tape of at least two (batch x 4 width) float tensors. Keeping the saved
    # tensors of an earlier recorded forward alive would make the measured tape about zero.
    width, batch = 256, 512
    block = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width)).cuda()
    x = torch.randn(batch, width, device="cuda")
    (cost,) = ckpt.profile([block], x, repetitions=1, warmup=0)
    assert cost.output_bytes >= batch * width * 4
    assert cost.tape_bytes >= 2 * batch * 4 * width * 4, cost
