#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""libgpukit_torch under real PyTorch and CuPy, on a GPU: each check in a fresh process (an
allocator is installed once per process), printing PASS or FAIL with what PyTorch reported.

    python3 bindings/torch/check_torch.py [--lib PATH] [--out DIR] [CHECK ...]

Checks:
    tensors      tensors, a backward pass and a side stream through gpukit; gpukit's statistics
    oom          out of memory (under a limit): the exception PyTorch raises, its type and message
                 (size and device named), and that allocating works again afterwards
    bad_free     a pointer gpukit never gave, freed through the C ABI: reported, not raised, the
                 allocator unchanged; and what PyTorch itself says for an unknown pointer
    after_init   install() after PyTorch has initialized CUDA: refused with a clear message
    empty_cache  torch.cuda.empty_cache() (a no-op for pluggable allocators) and gpukit's own
    snapshot     recorded history written as PyTorch's pickle (for torch.cuda._memory_viz), JSON
                 and HTML into --out
    cupy         CuPy arrays through gpukit (install_cupy), on the current stream; CuPy's
                 OutOfMemoryError with gpukit's report
Ends with 'N passed, N failed'; exits 1 if any failed.
"""

import argparse
import ctypes
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.dont_write_bytecode = True  # no __pycache__ in the source tree
from gpukit_torch import pluggable as gpukit_torch  # noqa: E402

CHECKS = ("tensors", "oom", "bad_free", "after_init", "empty_cache", "snapshot", "cupy")
MiB = 1 << 20


class Failed(Exception):
    pass


def expect(cond, what):
    if not cond:
        raise Failed(what)


def first_line(e):
    return str(e).strip().splitlines()[0] if str(e).strip() else repr(e)


def check_tensors(args):
    import torch
    gpukit_torch.install(args.lib)
    x = torch.randn(1024, 1024, device="cuda", requires_grad=True)
    y = (x @ x).relu().sum()
    y.backward()
    expect(x.grad is not None and x.grad.shape == x.shape, "no gradient")
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        z = torch.ones(4096, 4096, device="cuda") * 2
        total = z.sum().item()
    expect(total == 2 * 4096 * 4096, f"side-stream sum {total}")
    st = gpukit_torch.stats()
    expect(st["num_allocs"] > 0 and st["allocated_bytes"] > 0, f"stats {st}")
    expect(st["reserved_bytes_peak"] >= st["allocated_bytes_peak"] > 0, f"peaks {st}")
    return (f"segments={st['segments']} allocs={st['num_allocs']} "
            f"reserved_peak={st['reserved_bytes_peak']} allocated_peak={st['allocated_bytes_peak']}")


def check_oom(args):
    import torch
    gpukit_torch.install(args.lib)
    keep = torch.empty(64 * MiB, dtype=torch.uint8, device="cuda")
    gpukit_torch.set_limit(1 << 30)
    size = 2 << 30
    try:
        torch.empty(size, dtype=torch.uint8, device="cuda")
        raise Failed("a 2 GiB tensor was allocated under a 1 GiB limit")
    except Failed:
        raise
    except Exception as e:
        kind = f"{type(e).__module__}.{type(e).__name__}"
        msg = first_line(e)
        expect(str(size) in str(e), f"size not in the message: {kind}: {msg}")
        expect("device 0" in str(e), f"device not in the message: {kind}: {msg}")
        expect(gpukit_torch.is_out_of_memory(e), f"is_out_of_memory false for {kind}")
        reported = f"torch.empty raised {kind}: {msg}"
    # The raw-allocation binding (pybind11) may translate a std::bad_alloc differently.
    try:
        torch.cuda.caching_allocator_alloc(size)
        raw = "caching_allocator_alloc returned"
    except Exception as e:
        raw = f"caching_allocator_alloc raised {type(e).__module__}.{type(e).__name__}"
    expect(gpukit_torch.stats()["num_ooms"] >= 1, "num_ooms not counted")
    gpukit_torch.set_limit(0)
    again = torch.empty(size, dtype=torch.uint8, device="cuda")
    again.fill_(1)
    expect(int(again[-1].item()) == 1 and keep.numel() == 64 * MiB, "allocation after OOM")
    return f"{reported}; {raw}; after the limit was lifted 2 GiB allocated"


def check_bad_free(args):
    import torch
    lib = gpukit_torch.install(args.lib)
    t = torch.arange(1 << 20, device="cuda", dtype=torch.float32)
    before = gpukit_torch.stats()
    bogus = 0x1234500
    lib.gpukit_torch_free(bogus, 4096, torch.cuda.current_device(), None)
    err = gpukit_torch.last_error()
    expect(hex(bogus) in err, f"last_error does not name the pointer: {err!r}")
    after = gpukit_torch.stats()
    expect(after["bad_frees"] == before["bad_frees"] + 1, "bad_frees not counted")
    expect(after["allocated_bytes"] == before["allocated_bytes"], "allocator changed")
    expect(float(t.sum().item()) == float(sum(range(1 << 20))), "tensor changed")
    try:  # PyTorch's own map catches an unknown pointer before it reaches gpukit
        torch.cuda.caching_allocator_delete(bogus)
        torch_says = "PyTorch passed it on"
    except Exception as e:
        torch_says = f"PyTorch raised {type(e).__name__}: {first_line(e)}"
    return f"gpukit: {err}; {torch_says}"


def check_after_init(args):
    import torch
    torch.zeros(1, device="cuda")
    try:
        gpukit_torch.install(args.lib)
    except RuntimeError as e:
        expect("already initialized CUDA" in str(e), f"unclear message: {e}")
        return f"refused: {first_line(e)}"
    raise Failed("install() after CUDA initialization was accepted")


def check_empty_cache(args):
    import torch
    gpukit_torch.install(args.lib)
    t = torch.empty(256 * MiB, dtype=torch.uint8, device="cuda")
    del t
    torch.cuda.synchronize()
    reserved = gpukit_torch.stats()["reserved_bytes"]
    torch.cuda.empty_cache()  # PyTorch: nothing for a pluggable allocator without a reset function
    still = gpukit_torch.stats()["reserved_bytes"]
    released = gpukit_torch.empty_cache()
    now = gpukit_torch.stats()["reserved_bytes"]
    expect(released >= 256 * MiB and now == reserved - released,
           f"released {released}, reserved {reserved} -> {now}")
    return (f"torch.cuda.empty_cache left {still} of {reserved} reserved bytes; "
            f"gpukit_torch.empty_cache released {released}")


def check_snapshot(args):
    import torch
    gpukit_torch.install(args.lib)
    gpukit_torch.record_history(True)
    model = torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.ReLU(),
                                torch.nn.Linear(4096, 1024)).cuda()
    opt = torch.optim.Adam(model.parameters())
    for n in (64, 128, 96):
        model(torch.randn(n, 1024, device="cuda")).square().mean().backward()
        opt.step()
        opt.zero_grad()
    torch.cuda.synchronize()
    os.makedirs(args.out, exist_ok=True)
    paths = [gpukit_torch.snapshot(os.path.join(args.out, "gpukit_torch_snapshot" + ext))
             for ext in (".pickle", ".json", ".html")]
    import pickle
    with open(paths[0], "rb") as f:
        snap = pickle.load(f)
    n_events = len(snap["device_traces"][0])
    expect(snap["segments"] and n_events > 0, "empty snapshot")
    return f"{len(snap['segments'])} segments, {n_events} events: " + ", ".join(paths)


def check_cupy(args):
    import cupy
    gpukit_torch.install_cupy(args.lib)
    a = cupy.arange(10_000_000, dtype=cupy.float32)
    b = a * 2
    expect(float(b[-1]) == 2 * 9_999_999, "wrong result")
    s = cupy.cuda.Stream(non_blocking=True)
    with s:
        c = cupy.ones((2048, 2048), dtype=cupy.float32) @ cupy.ones((2048, 2048),
                                                                     dtype=cupy.float32)
        s.synchronize()
    expect(float(c[0, 0]) == 2048.0, "side-stream matmul")
    st = gpukit_torch.stats()
    expect(st["num_allocs"] >= 3, f"stats {st}")
    allocs = st["num_allocs"]
    del a, b, c
    expect(gpukit_torch.stats()["num_frees"] >= 3, "frees not seen")
    gpukit_torch.set_limit(256 * MiB)
    try:
        cupy.empty(512 * MiB, dtype=cupy.uint8)
        raise Failed("512 MiB allocated under a 256 MiB limit")
    except cupy.cuda.memory.OutOfMemoryError as e:
        expect("out of memory on device" in str(e), f"message: {e}")
        oom = f"{type(e).__name__} (a cupy.cuda.memory.OutOfMemoryError): {first_line(e)}"
    gpukit_torch.set_limit(0)
    return f"{allocs} allocations through gpukit; {oom}"


def run_check(name, args):
    try:
        detail = globals()["check_" + name](args)
        print(f"PASS {name}: {detail}", flush=True)
        return 0
    except ImportError as e:
        print(f"FAIL {name}: cannot import: {e}", flush=True)
    except Exception as e:
        print(f"FAIL {name}: {type(e).__name__}: {e}", flush=True)
    return 1


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("checks", nargs="*", default=list(CHECKS))
    ap.add_argument("--lib", help="libgpukit_torch.so (default: as gpukit_torch.pluggable finds it)")
    ap.add_argument("--out", default="out", help="where the snapshot check writes")
    ap.add_argument("--one", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    args.lib = gpukit_torch.library_path(args.lib)
    if args.one:
        return run_check(args.checks[0], args)
    for c in args.checks:
        if c not in CHECKS:
            ap.error(f"unknown check {c!r} (known: {', '.join(CHECKS)})")
    passed = failed = 0
    for c in args.checks:
        cmd = [sys.executable, os.path.abspath(__file__), "--one", "--lib", args.lib,
               "--out", args.out, c]
        stderr = ""
        try:
            p = subprocess.run(cmd, capture_output=True, text=True, timeout=180)
            out, stderr = p.stdout.strip(), p.stderr.strip()
            ok = p.returncode == 0 and out.startswith("PASS")
            if not out.startswith(("PASS", "FAIL")):
                out = f"FAIL {c}: exit {p.returncode}: " + " | ".join(stderr.splitlines()[-4:])
        except subprocess.TimeoutExpired:
            ok, out = False, f"FAIL {c}: timed out"
        print(out, flush=True)
        if stderr and c == "bad_free":  # what gpukit wrote to stderr for the bad free
            print("  stderr: " + " | ".join(stderr.splitlines()[-2:]), flush=True)
        passed, failed = passed + ok, failed + (not ok)
    print(f"check_torch: {passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
