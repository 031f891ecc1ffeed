# SPDX-License-Identifier: Apache-2.0
"""gpukit_torch.pluggable's ctypes layer over libgpukit_torch_sim.so (the simulated GPU): statistics
through JSON and through the C struct (their layouts must agree), limits, history, snapshots,
errors, and the CuPy allocator function driven through a stand-in for the part of CuPy's API it
uses (CuPy itself is on the GPU machine: bindings/torch/check_torch.py runs it there). No torch
needed. Usage: gpukit_torch_ctypes_test.py LIBRARY (CTest passes libgpukit_torch_sim.so and sets
GPUKIT_SIM_DEVICES=2, GPUKIT_SIM_CAPACITY=1G)."""

import gc
import os
import sys
import tempfile
import types
import unittest

try:
    import ctypes
except ImportError as e:  # a Python built without libffi: CTest reports the test skipped
    print(f"SKIPPED: this python3 ({sys.executable}) has no ctypes module ({e}); "
          "gpukit_torch.pluggable needs it")
    sys.exit(77)

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "bindings", "torch"))
sys.dont_write_bytecode = True  # no __pycache__ in the source tree
from gpukit_torch import pluggable as gpukit_torch  # noqa: E402

LIB = None
MiB = 1 << 20


def fake_cupy(device=0, stream=0):
    """The names gpukit_torch's CuPy allocator uses, recording what it builds."""
    class Memory:
        def __init__(self, size):
            self.size, self.ptr = size, 0

    class UnownedMemory:
        def __init__(self, ptr, size, owner, device_id):
            self.ptr, self.size, self.owner, self.device_id = ptr, size, owner, device_id

    class MemoryPointer:
        def __init__(self, mem, offset):
            self.mem, self.ptr = mem, mem.ptr + offset

    class OutOfMemoryError(MemoryError):
        def __init__(self, size, total, limit=0):
            super().__init__(f"Out of memory allocating {size:,} bytes")

    cuda = types.SimpleNamespace(
        runtime=types.SimpleNamespace(getDevice=lambda: device),
        get_current_stream=lambda: types.SimpleNamespace(ptr=stream),
        memory=types.SimpleNamespace(Memory=Memory, UnownedMemory=UnownedMemory,
                                     MemoryPointer=MemoryPointer,
                                     OutOfMemoryError=OutOfMemoryError))
    return types.SimpleNamespace(cuda=cuda)


class CtypesLayer(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        gpukit_torch.load(LIB)

    def test_load_is_once_and_names_the_library(self):
        self.assertEqual(gpukit_torch.library_path(LIB), os.path.realpath(LIB))
        self.assertIs(gpukit_torch.load(), gpukit_torch.load(LIB))
        with self.assertRaisesRegex(RuntimeError, "is loaded already"):
            gpukit_torch.load("/nonexistent/libgpukit_torch.so")

    def test_segment_source_by_name(self):
        with self.assertRaisesRegex(ValueError, '"bogus" is not a segment source'):
            gpukit_torch.load(segments="bogus")
        gpukit_torch.load(segments="stream_ordered")
        gpukit_torch.load(segments="")  # back to the default

    def test_cupy_allocator_allocates_and_frees_through_gpukit(self):
        cupy = fake_cupy(device=1)
        malloc = gpukit_torch._cupy_malloc_function(cupy, gpukit_torch.load())
        before = gpukit_torch.stats(1)
        p = malloc(3 * MiB + 5)
        self.assertNotEqual(p.ptr, 0)
        self.assertEqual(p.ptr % 256, 0)
        self.assertEqual(p.mem.size, 3 * MiB + 5)
        self.assertEqual(p.mem.device_id, 1)
        ctypes.memset(p.ptr, 0x5A, 3 * MiB + 5)  # simulated device memory is host memory
        s = gpukit_torch.stats(1)
        self.assertEqual(s["requested_bytes"], before["requested_bytes"] + 3 * MiB + 5)
        self.assertEqual(s["num_allocs"], before["num_allocs"] + 1)
        self.assertEqual(malloc(0).ptr, 0)  # no allocation for empty arrays
        del p
        gc.collect()
        s = gpukit_torch.stats(1)
        self.assertEqual(s["requested_bytes"], before["requested_bytes"])
        self.assertEqual(s["num_frees"], before["num_frees"] + 1)
        self.assertEqual(s["bad_frees"], before["bad_frees"])

        # Out of memory is CuPy's OutOfMemoryError, with gpukit's report as the message.
        with self.assertRaises(cupy.cuda.memory.OutOfMemoryError) as ctx:
            malloc(2 << 30)
        self.assertIn(str(2 << 30), str(ctx.exception))
        self.assertIn("device 1", str(ctx.exception))
        # A device that does not exist is not out of memory.
        with self.assertRaisesRegex(RuntimeError, "device 5"):
            gpukit_torch._cupy_malloc_function(fake_cupy(device=5), gpukit_torch.load())(1024)

    def test_statistics_json_and_struct_agree(self):
        lib = gpukit_torch.load()
        out = ctypes.c_void_p()
        self.assertEqual(lib.gpukit_torch_malloc_nothrow(5 * MiB, 0, None, ctypes.byref(out)), 0)
        j = gpukit_torch.stats(0)
        s = gpukit_torch.stats_struct(0)
        self.assertEqual(j["device"], 0)
        self.assertIn(j["segments"], ("growable", "automatic", "stream_ordered", "synchronous"))
        for name, value in s.items():
            if name != "segment_source":
                self.assertEqual(j[name], value, name)
        self.assertGreaterEqual(s["allocated_bytes"], 5 * MiB)
        self.assertEqual(s["initialized"], 1)
        lib.gpukit_torch_free(out, 5 * MiB, 0, None)
        self.assertEqual(gpukit_torch.stats(0)["allocated_bytes"], s["allocated_bytes"] - 5 * MiB)
        self.assertGreaterEqual(gpukit_torch.empty_cache(), 5 * MiB)
        gpukit_torch.reset_peak(0)
        self.assertEqual(gpukit_torch.stats(0)["reserved_bytes_peak"],
                         gpukit_torch.stats(0)["reserved_bytes"])

    def test_limit_history_snapshot(self):
        lib = gpukit_torch.load()
        gpukit_torch.set_limit(32 * MiB, device=0)
        self.assertEqual(gpukit_torch.stats(0)["limit_bytes"], 32 * MiB)
        out = ctypes.c_void_p()
        self.assertEqual(lib.gpukit_torch_malloc_nothrow(64 * MiB, 0, None, ctypes.byref(out)), 1)
        self.assertIn("out of memory on device 0", gpukit_torch.last_error())
        self.assertTrue(gpukit_torch.is_out_of_memory(RuntimeError(gpukit_torch.last_error())))
        gpukit_torch.set_limit(0, device=0)

        gpukit_torch.record_history(True, 4096, device=0)
        self.assertEqual(lib.gpukit_torch_malloc_nothrow(4096, 0, None, ctypes.byref(out)), 0)
        with tempfile.TemporaryDirectory() as d:
            pickle_path = gpukit_torch.snapshot(os.path.join(d, "m.pickle"), device=0)
            with open(pickle_path, "rb") as f:
                import pickle
                snap = pickle.load(f)  # PyTorch's snapshot layout, read by Python's own pickle
            self.assertIn("segments", snap)
            self.assertTrue(any(b["state"] == "active_allocated" and b["address"] == out.value
                                for seg in snap["segments"] for b in seg["blocks"]))
            actions = [e["action"] for e in snap["device_traces"][0]]
            self.assertIn("alloc", actions)
            gpukit_torch.snapshot(os.path.join(d, "m.json"), device=0)
            with open(os.path.join(d, "m.json")) as f:
                self.assertIn('"action": "alloc"', f.read())
            with self.assertRaisesRegex(RuntimeError, '"xml"'):
                gpukit_torch.snapshot(os.path.join(d, "m"), device=0, format="xml")
        gpukit_torch.record_history(False, device=0)
        lib.gpukit_torch_free(out, 4096, 0, None)

    def test_bad_free_is_reported_not_raised(self):
        lib = gpukit_torch.load()
        lib.gpukit_torch_free(None, 0, 0, None)  # null: nothing to do
        before = gpukit_torch.stats(0)["bad_frees"]
        x = ctypes.c_int(0)
        lib.gpukit_torch_free(ctypes.addressof(x), 4, 0, None)
        self.assertEqual(gpukit_torch.stats(0)["bad_frees"], before + 1)
        self.assertIn(hex(ctypes.addressof(x)), gpukit_torch.last_error())
        with self.assertRaisesRegex(RuntimeError, "device 64"):
            gpukit_torch.stats(64)


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    LIB = sys.argv.pop(1)
    os.environ.setdefault("GPUKIT_SIM_DEVICES", "2")
    os.environ.setdefault("GPUKIT_SIM_CAPACITY", "1G")
    unittest.main(verbosity=2)
