# SPDX-License-Identifier: Apache-2.0
"""What PyTorch's CUDA allocator offers, under PyTorch's own allocator and under gpukit's.

Each row runs in a fresh process (an allocator must be chosen before CUDA is first used), once
with PyTorch's allocator ("native") and once with gpukit_torch installed ("gpukit"):

    pytest bindings/torch/tests/test_compat.py                 # needs a GPU and gpukit_torch
    python bindings/torch/tests/test_compat.py [--out DIR] [--jobs N] [--allocators gpukit] [ROW ...]

--allocators takes native, gpukit and gpukit:CONF (gpukit with GPUKIT_ALLOC_CONF=CONF in the
row's process and its children, e.g. gpukit:segments:growable), comma-separated.

A row passes when it does what PyTorch documents, with PyTorch's names and numbers. The script
prints one line per row and allocator, and writes compat.json (and compat.md) into --out.
"""

import json
import os
import subprocess
import sys
import tempfile
import time
import traceback

HERE = os.path.abspath(__file__)
MiB = 1 << 20


def _setup(allocator):
    if allocator == "gpukit":
        import gpukit_torch

        gpukit_torch.install()
    import torch

    torch.cuda.init()
    if allocator == "gpukit":
        assert gpukit_torch.is_installed()
    return torch


def _mlp(torch):
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 64)
    ).cuda()


# ---- rows ----------------------------------------------------------------------------------


def row_graph_capture_replay(torch, allocator):
    x = torch.randn(256, 256, device="cuda")
    w = torch.randn(256, 256, device="cuda")
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):  # warm up outside the graph, as PyTorch asks
        for _ in range(2):
            y = torch.relu(x @ w).sum(0)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        tmp = x @ w  # a temporary freed inside the graph
        y = torch.relu(tmp).sum(0)
        del tmp
    for i in range(3):
        x.copy_(torch.randn(256, 256, device="cuda"))
        g.replay()
        torch.cuda.synchronize()
        assert torch.allclose(y, torch.relu(x @ w).sum(0), rtol=1e-3, atol=1e-2), f"replay {i}"
    g.reset()
    return "3 replays match eager"


def row_graph_pool_sharing(torch, allocator):
    a = torch.randn(1 << 20, device="cuda")
    torch.cuda.synchronize()
    g1, g2 = torch.cuda.CUDAGraph(), torch.cuda.CUDAGraph()
    with torch.cuda.graph(g1):
        b = a * 2
    with torch.cuda.graph(g2, pool=g1.pool()):
        c = b + 1
    for v in (1.0, 5.0):
        a.fill_(v)
        g1.replay()
        g2.replay()
        torch.cuda.synchronize()
        assert torch.all(b == 2 * v) and torch.all(c == 2 * v + 1), f"value {v}"
    del b, c
    g2.reset()
    g1.reset()
    return "two graphs on one pool replay in order"


def _side_stream_capture(torch, mode):
    """Fork/join inside a capture: a side stream never used before allocates, frees and is
    recorded on a tensor of the graph's stream, then joins back (torch.cuda.graph's own stream)."""
    a = torch.randn(1 << 20, device="cuda")
    ((a * 2 + (a + 1)) * 3 + a).sum()  # load the kernels before the capture
    torch.cuda.synchronize()
    side = torch.cuda.Stream()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g, capture_error_mode=mode):
        main = torch.cuda.current_stream()
        t = a + 1  # on the graph's stream
        side.wait_stream(main)  # fork: side joins the capture
        with torch.cuda.stream(side):
            b = a * 2  # allocated on the side stream inside the capture
            tmp = b + t
            t.record_stream(side)
            c = tmp * 3
            del tmp  # freed on the side stream inside the capture
        main.wait_stream(side)  # join
        d = c + a
        del t  # used on the side stream too: its block waits for the capture's end
    for v in (1.0, 2.0):
        a.fill_(v)
        g.replay()
        torch.cuda.synchronize()
        assert torch.all(b == 2 * v), f"b, value {v}"
        assert torch.all(c == (3 * v + 1) * 3), f"c, value {v}"
        assert torch.all(d == (3 * v + 1) * 3 + v), f"d, value {v}"
    del b, c, d
    g.reset()
    return f"{mode} mode: the side stream allocated, freed and record_stream'ed; 2 replays match"


def row_side_stream_capture_global(torch, allocator):
    return _side_stream_capture(torch, "global")


def row_side_stream_capture_thread_local(torch, allocator):
    return _side_stream_capture(torch, "thread_local")


def row_side_stream_capture_relaxed(torch, allocator):
    return _side_stream_capture(torch, "relaxed")


def row_second_graph_new_stream(torch, allocator):
    a = torch.randn(1 << 20, device="cuda")
    ((a * 2 + 1) * 2 - a).sum()  # load the kernels before the captures
    torch.cuda.synchronize()
    g1 = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g1):
        b = a * 2
    g2 = torch.cuda.CUDAGraph()
    s = torch.cuda.Stream()  # the second graph's own stream, first met inside its capture
    with torch.cuda.graph(g2, stream=s):
        c = b + 1
        tmp = c * 2
        d = tmp - c
        del tmp
    for v in (1.0, 3.0):
        a.fill_(v)
        g1.replay()
        g2.replay()
        torch.cuda.synchronize()
        assert torch.all(b == 2 * v) and torch.all(c == 2 * v + 1), f"value {v}"
        assert torch.all(d == 2 * v + 1), f"value {v}"
    del b, c, d
    g2.reset()
    g1.reset()
    return "a second graph captured on a new stream replays after the first"


def row_make_graphed_callables(torch, allocator):
    model = _mlp(torch)
    ref = _mlp(torch)
    ref.load_state_dict(model.state_dict())
    x = torch.randn(32, 64, device="cuda", requires_grad=True)
    graphed = torch.cuda.make_graphed_callables(model, (x,))
    for _ in range(3):
        inp = torch.randn(32, 64, device="cuda", requires_grad=True)
        out = graphed(inp)
        out.sum().backward()
        inp2 = inp.detach().clone().requires_grad_(True)
        ref_out = ref(inp2)
        ref_out.sum().backward()
        assert torch.allclose(out, ref_out, atol=1e-5)
        assert torch.allclose(inp.grad, inp2.grad, atol=1e-5)
    return "forward and backward match eager"


def row_compile_reduce_overhead(torch, allocator):
    model = _mlp(torch)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    ref = _mlp(torch)
    ref.load_state_dict(model.state_dict())
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.01)
    compiled = torch.compile(model, mode="reduce-overhead")
    torch.manual_seed(1)
    for step in range(5):
        x = torch.randn(32, 64, device="cuda")
        torch.compiler.cudagraph_mark_step_begin()
        loss = compiled(x).square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        ref_loss = ref(x).square().mean()
        ref_loss.backward()
        ref_opt.step()
        ref_opt.zero_grad(set_to_none=True)
        assert abs(loss.item() - ref_loss.item()) < 1e-4, f"step {step}"
    from torch._inductor import cudagraph_trees

    manager = cudagraph_trees.get_manager(0, create_if_none_exists=False)
    graphs = sum(len(nodes) for nodes in manager.roots.values()) if manager else 0
    assert graphs > 0, "torch.compile recorded no CUDA graph (cudagraphs were skipped)"
    return f"5 training steps match eager; {graphs} CUDA graph tree root(s) recorded"


def row_memory_stats(torch, allocator):
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    x = torch.empty(10 * MiB, dtype=torch.uint8, device="cuda")
    now = torch.cuda.memory_allocated()
    assert now - base >= 10 * MiB, (base, now)
    s = torch.cuda.memory_stats()
    for key in (
        "allocated_bytes.all.current", "allocated_bytes.all.peak", "reserved_bytes.all.current",
        "active_bytes.all.current", "requested_bytes.all.current", "allocation.all.current",
        "segment.all.current", "num_alloc_retries", "num_ooms", "num_device_alloc",
    ):
        assert key in s, key
    assert s["allocated_bytes.all.current"] == now
    assert s["requested_bytes.all.current"] >= 10 * MiB
    assert torch.cuda.memory_reserved() >= now
    del x
    assert torch.cuda.memory_allocated() == base
    assert torch.cuda.max_memory_allocated() >= base + 10 * MiB
    assert torch.cuda.max_memory_reserved() >= 10 * MiB
    torch.cuda.reset_peak_memory_stats()
    assert torch.cuda.max_memory_allocated() == base
    summary = torch.cuda.memory_summary()
    assert "Allocated memory" in summary
    return f"allocated +{(now - base) // MiB} MiB; keys, peaks, reset, summary"


# Sizes on both sides of 512 bytes and of the small pool's 1 MiB, most not multiples of 512;
# the large ones chosen so that native PyTorch splits every block it hands out (it keeps a whole
# block when the rest would be 1 MiB or less, which gpukit never does: see the README's limits).
_SMALL_SIZES = [1, 511, 512, 513, 1000, 4096, 65537, MiB - 100, MiB]
_LARGE_SIZES = [2 * MiB + 1, 3 * MiB + 100, 12 * MiB + 1]
_USER_STATS = ("allocation.", "allocated_bytes.", "requested_bytes.", "active.", "active_bytes.")


def _stats_workload(torch):
    """A mixed-size workload: memory_allocated() at each step, then memory_stats()'s user counts."""
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    torch.cuda.reset_accumulated_memory_stats()
    seen = []

    def empty(n):
        return torch.empty(n, dtype=torch.uint8, device="cuda")

    held = [empty(n) for n in _LARGE_SIZES] + [empty(n) for n in _SMALL_SIZES * 3]
    seen.append(torch.cuda.memory_allocated())
    del held[1]  # 3 MiB + 100 alone between two allocated blocks: reused exactly below
    held = held[:3] + held[3::2]
    seen.append(torch.cuda.memory_allocated())
    held += [empty(3 * MiB + 100)] + [empty(n) for n in reversed(_SMALL_SIZES)]
    seen.append(torch.cuda.memory_allocated())
    torch.cuda.reset_peak_memory_stats()
    held = held[::3]
    seen.append(torch.cuda.memory_allocated())
    s = torch.cuda.memory_stats()
    keys = sorted(k for k in s if k.startswith(_USER_STATS) or k.startswith("oversize_"))
    out = {"memory_allocated": seen, "max_split_size": s["max_split_size"]}
    out.update({k: s[k] for k in keys})
    del held
    return out


def row_stats_match_native(torch, allocator):
    mine = _stats_workload(torch)
    if allocator == "native":
        return "native " + json.dumps(mine, sort_keys=True)
    passed, detail, _ = run_row("stats_match_native", "native")
    assert passed, f"the native run failed: {detail}"
    native = json.loads(detail[len("native "):])
    differ = {k: (native[k], mine.get(k)) for k in native if mine.get(k) != native[k]}
    assert not differ, f"(native, gpukit) where they differ: {differ}"
    return f"memory_allocated() and {len(native) - 1} memory_stats() keys equal to native's"


def _python_with_env(code, env):
    """Runs `code` in a fresh Python with `env` added and without the column's GPUKIT_ALLOC_CONF
    (read after PyTorch's variable, it would override what the row sets there); returns
    (returncode, output)."""
    child = {k: v for k, v in os.environ.items() if k != "GPUKIT_ALLOC_CONF"}
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                       env={**child, **env})
    return r.returncode, (r.stdout + r.stderr).strip()


def row_pytorch_alloc_conf(torch, allocator):
    install = "import gpukit_torch; gpukit_torch.install(); " if allocator == "gpukit" else ""
    # Carried over: PyTorch's segments, its rounding, and its pinned-memory key.
    carried = {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:False,roundup_power2_divisions:4,"
                                          "pinned_use_cuda_host_register:True"}
    rc, out = _python_with_env(
        install + "import torch; x = torch.empty(5 * 2**20 + 1, dtype=torch.uint8, device='cuda');"
        " h = torch.empty(4096, pin_memory=True);"
        " print('ALLOCATED', torch.cuda.memory_allocated(),"
        " any(s['is_expandable'] for s in torch.cuda.memory_snapshot()))", carried)
    assert rc == 0, out
    line = [l for l in out.splitlines() if l.startswith("ALLOCATED ")][-1].split()
    # 5 MiB + 1 byte in four steps between 4 and 8 MiB: 6 MiB, as PyTorch rounds it.
    assert int(line[1]) == 6 * MiB, line
    assert line[2] == "False", "expandable_segments:False should give cudaMalloc segments"
    if allocator == "native":
        return "PYTORCH_CUDA_ALLOC_CONF applied"
    # Refused: a key gpukit does not need raises ValueError naming it, before anything runs.
    rc, out = _python_with_env(
        "import gpukit_torch\ntry:\n    gpukit_torch.install()\n"
        "except ValueError as e:\n    print('REFUSED', e)",
        {"PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:128"})
    assert rc == 0 and "REFUSED" in out, out
    refused = [l for l in out.splitlines() if l.startswith("REFUSED ")][-1]
    assert "max_split_size_mb" in refused and "PYTORCH_CUDA_ALLOC_CONF" in refused, refused
    return "PYTORCH_CUDA_ALLOC_CONF carried over (6 MiB, cudaMalloc segments); max_split_size_mb refused"


def row_empty_cache(torch, allocator):
    x = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    del x
    held = torch.cuda.memory_reserved()
    assert held >= 1 << 30, held
    torch.cuda.empty_cache()
    after = torch.cuda.memory_reserved()
    assert after <= held - (1 << 30), (held, after)
    return f"reserved {held // MiB} -> {after // MiB} MiB"


def row_memory_fraction(torch, allocator):
    total = torch.cuda.get_device_properties(0).total_memory
    torch.cuda.set_per_process_memory_fraction(0.1)
    ok = torch.empty(int(total * 0.05), dtype=torch.uint8, device="cuda")
    try:
        torch.empty(int(total * 0.2), dtype=torch.uint8, device="cuda")
    except torch.OutOfMemoryError:
        pass
    else:
        raise AssertionError("an allocation beyond the fraction succeeded")
    del ok
    torch.cuda.set_per_process_memory_fraction(1.0)
    big = torch.empty(int(total * 0.2), dtype=torch.uint8, device="cuda")
    del big
    return "5% fits, 20% raises OutOfMemoryError under 0.1, fits under 1.0"


def row_oom_error_and_observer(torch, allocator):
    seen = []
    torch._C._cuda_attach_out_of_memory_observer(lambda *args: seen.append(args))
    total = torch.cuda.get_device_properties(0).total_memory
    try:
        torch.empty(2 * total, dtype=torch.uint8, device="cuda")
    except torch.OutOfMemoryError as e:
        msg = str(e)
    else:
        raise AssertionError("allocating twice the device succeeded")
    assert issubclass(torch.OutOfMemoryError, RuntimeError)
    if allocator == "gpukit":
        assert "gpukit" in msg, msg
    x = torch.ones(10, device="cuda")  # still usable
    assert x.sum().item() == 10
    return f"OutOfMemoryError; observer calls {len(seen)}; '{msg.splitlines()[0][:60]}'"


def row_oom_observer_fires(torch, allocator):
    seen = []
    torch._C._cuda_attach_out_of_memory_observer(lambda *args: seen.append(args))
    total = torch.cuda.get_device_properties(0).total_memory
    torch.cuda.set_per_process_memory_fraction(0.05)
    try:
        torch.empty(int(total * 0.1), dtype=torch.uint8, device="cuda")
    except torch.OutOfMemoryError:
        pass
    assert seen, "no out-of-memory observer call"
    device, allocated, device_total, device_free = seen[0]
    assert device == 0 and 0 < device_total <= total, seen[0]
    return f"observer got (device={device}, total={device_total // MiB} MiB)"


def row_mem_pool(torch, allocator):
    pool = torch.cuda.MemPool()
    with torch.cuda.use_mem_pool(pool):
        x = torch.randn(1 << 20, device="cuda")
    y = torch.randn(1 << 20, device="cuda")  # outside the pool
    segs = pool.snapshot()
    ptr = x.data_ptr()
    inside = any(s["address"] <= ptr < s["address"] + s["total_size"] for s in segs)
    assert inside, "the pool's snapshot does not hold the tensor allocated in it"
    yptr = y.data_ptr()
    assert not any(s["address"] <= yptr < s["address"] + s["total_size"] for s in segs)
    assert pool.use_count() >= 1
    del x
    with torch.cuda.use_mem_pool(pool):  # used again
        z = torch.randn(1 << 20, device="cuda")
    assert z.data_ptr() == ptr, "a block freed into the pool did not serve the pool again"
    del z, pool
    torch.cuda.empty_cache()
    return "allocations routed, pool snapshot, reuse, release"


def row_record_history(torch, allocator):
    torch.cuda.memory._record_memory_history(max_entries=10000, stacks="python")

    def make_marker_tensor():
        return torch.empty(3 * MiB + 512, dtype=torch.uint8, device="cuda")

    t = make_marker_tensor()
    del t
    keep = torch.empty(5 * MiB, dtype=torch.uint8, device="cuda")
    snap = torch.cuda.memory._snapshot()
    allocs = [e for e in snap["device_traces"][0] if e["action"] == "alloc"]
    marker = [e for e in allocs if e["size"] == 3 * MiB + 512]
    assert marker, "no alloc event of the marker tensor"
    names = [f["name"] for f in marker[0]["frames"]]
    assert "make_marker_tensor" in names, names[:10]
    assert any(e["action"] in ("free_completed", "free_requested") for e in snap["device_traces"][0])
    blocks = [b for s in snap["segments"] for b in s["blocks"] if b["state"] == "active_allocated"]
    assert any(b.get("frames") for b in blocks), "live blocks carry no stacks"
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "snap.pickle")
        torch.cuda.memory._dump_snapshot(path)
        from torch.cuda import _memory_viz

        with open(path, "rb") as f:
            import pickle

            data = pickle.load(f)
        html = _memory_viz.trace_plot(data)
        assert len(html) > 1000
        _memory_viz.segment_plot(data)
    torch.cuda.memory._record_memory_history(enabled=None)
    del keep
    return f"{len(allocs)} allocs traced with Python stacks; _dump_snapshot, _memory_viz"


def row_record_stream(torch, allocator):
    side = torch.cuda.Stream()
    n = 64 * MiB // 4
    with torch.cuda.stream(side):  # load every kernel first: loading one may wait for the GPU
        torch.cuda._sleep(1000)
        (torch.ones(n, device="cuda") * 2).sum()
    torch.zeros(n, device="cuda")
    torch.cuda.synchronize()
    x = torch.empty(n, device="cuda")
    x.fill_(1.0)
    torch.cuda.synchronize()
    with torch.cuda.stream(side):
        torch.cuda._sleep(2_000_000_000)  # about a second: the side stream is busy
        y = x * 2
    x.record_stream(side)
    ptr = x.data_ptr()
    del x
    z = torch.zeros(n, device="cuda")  # must not take x's block while side uses it
    busy = not side.query()
    side.synchronize()
    assert busy, "the side stream finished too early for the check to mean anything"
    assert z.data_ptr() != ptr, "x's block was reused while the side stream still used it"
    assert torch.all(y == 2.0)
    # Once the side stream is done, the block is reusable again.
    del z
    w = torch.zeros(n, device="cuda")
    return f"held while the recorded stream ran; reused after: {w.data_ptr() == ptr}"


def _ipc_child(queue, done, allocator):
    if allocator == "gpukit":
        import gpukit_torch

        gpukit_torch.install()
    import torch

    t = queue.get()
    t += 1
    torch.cuda.synchronize()
    del t
    done.put("ok")


def row_ipc_multiprocessing(torch, allocator):
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    q, done = ctx.Queue(), ctx.Queue()
    t = torch.full((1 << 20,), 41.0, device="cuda")
    p = ctx.Process(target=_ipc_child, args=(q, done, allocator))
    p.start()
    q.put(t)
    assert done.get(timeout=120) == "ok"
    p.join(60)
    assert p.exitcode == 0, p.exitcode
    torch.cuda.synchronize()
    assert torch.all(t == 42.0), "the child's write did not reach the parent's tensor"
    return "a child process wrote into the parent's CUDA tensor"


def _in_expandable_segment(torch, t):
    """Whether t's memory lies in an expandable (growable) segment, by the allocator's snapshot."""
    p = t.data_ptr()
    for seg in torch.cuda.memory_snapshot():
        if seg["address"] <= p < seg["address"] + seg["total_size"]:
            return seg.get("is_expandable", False)
    raise AssertionError(f"no segment holds {p:#x}")


def _growable_child(to_child, to_parent, allocator):
    # A process with the parent's allocator: takes the parent's tensor, writes into it, and sends
    # one of its own, which it keeps until the parent says it is done with it.
    if allocator == "gpukit":
        import gpukit_torch

        gpukit_torch.install()
    import torch

    t = to_child.get(timeout=60)
    t += 1
    torch.cuda.synchronize()
    del t
    mine = torch.full((3 << 20,), 7.0, device="cuda")
    assert _in_expandable_segment(torch, mine), "the child's tensor is not in growable memory"
    to_parent.put(mine)
    assert to_child.get(timeout=60) == "done"


def row_ipc_growable_both_ways(torch, allocator):
    import torch.multiprocessing as mp

    t = torch.full((5 << 20,), 41.0, device="cuda")
    assert _in_expandable_segment(torch, t), "the parent's tensor is not in growable memory"
    ctx = mp.get_context("spawn")
    to_child, to_parent = ctx.Queue(), ctx.Queue()
    p = ctx.Process(target=_growable_child, args=(to_child, to_parent, allocator))
    p.start()
    try:
        to_child.put(t)
        theirs = to_parent.get(timeout=120)
        torch.cuda.synchronize()
        assert torch.all(t == 42.0), "the child's write did not reach the parent's tensor"
        assert theirs.device.type == "cuda" and torch.all(theirs == 7.0), "the child's tensor"
        del theirs
        to_child.put("done")
        p.join(60)
        assert p.exitcode == 0, p.exitcode
    finally:
        if p.is_alive():
            p.kill()
    return "growable memory went to a child and back (expandable-segment handles both ways)"


def _native_child(queue, done):
    # PyTorch's own allocator (gpukit not installed) opens what the parent shares.
    import torch

    t = queue.get(timeout=60)
    ok = bool(torch.all(t == 41.0))
    t += 1
    torch.cuda.synchronize()
    del t
    done.put("ok" if ok else "the child read other values")


def row_ipc_growable_to_native_child(torch, allocator):
    import torch.multiprocessing as mp

    t = torch.full((5 << 20,), 41.0, device="cuda")
    assert _in_expandable_segment(torch, t), "the parent's tensor is not in growable memory"
    ctx = mp.get_context("spawn")
    q, done = ctx.Queue(), ctx.Queue()
    p = ctx.Process(target=_native_child, args=(q, done))
    p.start()
    try:
        q.put(t)
        assert (answer := done.get(timeout=120)) == "ok", answer
        p.join(60)
        assert p.exitcode == 0, p.exitcode
    finally:
        if p.is_alive():
            p.kill()
    torch.cuda.synchronize()
    assert torch.all(t == 42.0), "the native child's write did not reach the parent's tensor"
    return "a child with PyTorch's own allocator opened and wrote the parent's growable tensor"


def _refused_child(queue, done):
    try:
        queue.get(timeout=60)
        done.put("the tensor arrived although sharing was refused")
    except Exception as e:  # noqa: BLE001 (the error the sender's feeder thread handed over)
        done.put(f"{type(e).__name__}: {e}")


def row_ipc_growable_refusal_reported(torch, allocator):
    # GPUKIT_TORCH_REFUSE_PIDFD_GETFD=EPERM (set for this row) makes pidfd_getfd fail as in a
    # container that forbids it.
    if allocator == "native":
        return "not applicable: the refusal is simulated through gpukit's pidfd_getfd wrapper"
    import warnings

    import torch.multiprocessing as mp

    warned = []
    warnings.simplefilter("always")
    warnings.showwarning = lambda message, *args, **kwargs: warned.append(str(message))
    t = torch.full((1 << 20,), 41.0, device="cuda")
    assert _in_expandable_segment(torch, t), "the tensor is not in growable memory"
    ctx = mp.get_context("spawn")
    # Pickled in the calling thread: raised there, naming the cause and the setting.
    try:
        ctx.SimpleQueue().put(t)
        raise AssertionError("sharing was not refused")
    except RuntimeError as e:
        assert "EPERM" in str(e) and "segments:synchronous" in str(e), str(e)
    # mp.Queue pickles in its feeder thread: the receiver gets the error, the sender a warning.
    q, done = ctx.Queue(), ctx.Queue()
    p = ctx.Process(target=_refused_child, args=(q, done))
    p.start()
    try:
        q.put(t)
        answer = done.get(timeout=120)
        p.join(60)
        assert p.exitcode == 0, p.exitcode
    finally:
        if p.is_alive():
            p.kill()
    assert answer.startswith("SharingError") and "EPERM" in answer, answer
    assert "segments:synchronous" in answer, answer
    assert any("EPERM" in w for w in warned), f"the sender was not warned: {warned}"
    return "refused in the sharing thread; through mp.Queue the receiver raised and the sender was warned"


# Environment of a row's process, per allocator (growable memory under both allocators).
ROW_ENV = {
    row: {
        "native": {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"},
        "gpukit": {"GPUKIT_ALLOC_CONF": "segments:growable"},
    }
    for row in ("ipc_growable_both_ways", "ipc_growable_to_native_child")
}
ROW_ENV["ipc_growable_refusal_reported"] = {
    "native": {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"},
    "gpukit": {"GPUKIT_ALLOC_CONF": "segments:growable", "GPUKIT_TORCH_REFUSE_PIDFD_GETFD": "EPERM"},
}

ROWS = [name[4:] for name in sorted(globals()) if name.startswith("row_")]
ALLOCATORS = ["native", "gpukit"]


def _run_row_here(row, allocator):
    torch = _setup(allocator)
    return globals()["row_" + row](torch, allocator)


def run_row(row, allocator, timeout=300):
    """Runs one row in a fresh process. Returns (passed, detail, seconds). gpukit:CONF runs
    as gpukit with GPUKIT_ALLOC_CONF=CONF in the environment (children of the row inherit it)."""
    start = time.time()
    env = dict(os.environ)
    if allocator.startswith("gpukit:"):
        env["GPUKIT_ALLOC_CONF"] = allocator.split(":", 1)[1]
        allocator = "gpukit"
    env.update(ROW_ENV.get(row, {}).get(allocator, {}))  # a row's own settings win
    try:
        r = subprocess.run(
            [sys.executable, HERE, "--child", row, allocator],
            capture_output=True, text=True, timeout=timeout, env=env,
        )
    except subprocess.TimeoutExpired:
        return False, f"timed out after {timeout} s", time.time() - start
    out = (r.stdout + r.stderr).strip()
    lines = [l for l in out.splitlines() if l.startswith("RESULT ")]
    if r.returncode == 0 and lines:
        return True, lines[-1][len("RESULT "):], time.time() - start
    tail = "\n".join(out.splitlines()[-12:])
    return False, f"rc={r.returncode}: {tail}", time.time() - start


# ---- pytest ------------------------------------------------------------------------------

try:
    import pytest
except ImportError:  # plain-script use
    pytest = None

if pytest is not None:

    @pytest.mark.parametrize("allocator", ALLOCATORS)
    @pytest.mark.parametrize("row", ROWS)
    def test_row(row, allocator):
        passed, detail, _ = run_row(row, allocator)
        assert passed, detail


# ---- script ------------------------------------------------------------------------------


def _write_results(out_dir, rows, results, allocators=ALLOCATORS):
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "compat.json"), "w") as f:
        json.dump(results, f, indent=1)
    gpukits = [a for a in allocators if a.startswith("gpukit")]
    with open(os.path.join(out_dir, "compat.md"), "w") as f:
        f.write(f"| row | {' | '.join(allocators)} | {gpukits[0] if gpukits else ''} detail |\n"
                f"|{'---|' * (len(allocators) + 2)}\n")
        for row in rows:
            r = {x["allocator"]: x for x in results if x["row"] == row}
            cells = [("pass" if r[a]["passed"] else "FAIL") if a in r else "-" for a in allocators]
            detail = (r[gpukits[0]]["detail"].splitlines() or [""])[-1][:160] \
                if gpukits and gpukits[0] in r else ""
            f.write(f"| {row} | {' | '.join(cells)} | {detail.replace('|', '/')} |\n")


def main(argv):
    if argv[:1] == ["--child"]:
        row, allocator = argv[1], argv[2]
        try:
            detail = _run_row_here(row, allocator)
        except BaseException:  # noqa: BLE001 (report any failure, with its traceback)
            traceback.print_exc()
            sys.exit(1)
        print("RESULT", detail, flush=True)
        sys.exit(0)
    if argv[:1] in (["-h"], ["--help"]):
        print(__doc__)
        return 0
    unknown = [r for r in argv if not r.startswith("-") and r not in ROWS and
               argv[argv.index(r) - 1] not in ("--out", "--jobs", "--allocators")]
    if unknown:
        sys.exit(f"test_compat: unknown row(s) {', '.join(map(repr, unknown))}; rows: {', '.join(ROWS)}")
    out_dir, jobs, allocators = None, 1, ALLOCATORS
    while argv[:1] in (["--out"], ["--jobs"], ["--allocators"]):
        if argv[0] == "--out":
            out_dir = argv[1]
        elif argv[0] == "--jobs":
            jobs = int(argv[1])
        else:
            allocators = [a for a in argv[1].split(",") if a]
            for a in allocators:
                if a not in ALLOCATORS and not (a.startswith("gpukit:") and a[7:]):
                    sys.exit(f"test_compat: unknown allocator {a!r} (native, gpukit, gpukit:CONF)")
        argv = argv[2:]
    rows = argv or ROWS
    cases = [(row, a) for row in rows for a in allocators]
    # The slowest rows (torch.compile, a second process) first, so that they overlap the rest.
    cases.sort(key=lambda c: c[0] != "compile_reduce_overhead" and not c[0].startswith("ipc_"))
    results = []

    def one(case):
        row, allocator = case
        timeout = 300 if row == "compile_reduce_overhead" else 150
        passed, detail, secs = run_row(row, allocator, timeout)
        r = {"row": row, "allocator": allocator, "passed": passed, "detail": detail,
             "seconds": round(secs, 1)}
        print(f"{'PASS' if passed else 'FAIL'} {row:28s} {allocator:7s} {secs:6.1f}s  "
              f"{detail.splitlines()[-1] if detail else ''}", flush=True)
        if not passed:
            print("    " + detail.replace("\n", "\n    "), flush=True)
        return r

    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=jobs) as pool:
        for r in pool.map(one, cases):
            results.append(r)
            if out_dir:
                _write_results(out_dir, rows, results, allocators)
    return 0 if all(x["passed"] for x in results) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
