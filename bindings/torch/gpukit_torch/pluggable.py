# SPDX-License-Identifier: Apache-2.0
"""gpukit's caching allocator as PyTorch's (and CuPy's) device allocator.

    from gpukit_torch import pluggable as gpukit_torch
    gpukit_torch.install()          # before PyTorch touches CUDA; segments="growable" etc.
    model = build_model().cuda()    # every CUDA tensor now comes from gpukit
    ...
    print(gpukit_torch.stats()["reserved_bytes_peak"])
    gpukit_torch.snapshot("mem.pickle")   # python -m torch.cuda._memory_viz trace_plot mem.pickle
    gpukit_torch.empty_cache()            # torch.cuda.empty_cache() does nothing for a
                                          # pluggable allocator; this returns gpukit's free segments

    import cupy
    gpukit_torch.install_cupy()     # cupy.cuda.set_allocator: CuPy arrays from gpukit as well

The library is libgpukit_torch.so (bindings/torch, built with gpukit's bindings): found through
`lib_path`, else $GPUKIT_TORCH_LIB, else next to this file, else in a build folder of the
repository (build/*/bin/bindings, build/*/bindings/torch). Its C functions are in gpukit_torch.h.

What PyTorch does and does not do with a pluggable allocator (torch.cuda.memory.
CUDAPluggableAllocator, PyTorch 2.x): it calls malloc and free, keeping its own pointer map under a
lock; torch.cuda.memory_stats(), max_memory_reserved() and memory snapshots raise (use stats()
and snapshot() here); empty_cache() does nothing; record_stream() does nothing (keep tensors used
on a second stream alive until that stream is done with them). Out of memory surfaces as the
exception gpukit throws: PyTorch reports a RuntimeError whose message starts with
"gpukit: out of memory on device D: tried to allocate ..." (torch.OutOfMemoryError is raised only
for PyTorch's own c10 error type). is_out_of_memory(exc) recognises it.
"""

import ctypes
import glob
import json
import os
import sys

__all__ = [
    "load", "install", "install_cupy", "stats", "empty_cache", "reset_peak", "set_limit",
    "record_history", "snapshot", "last_error", "is_out_of_memory", "library_path",
]

_LIB_NAME = "libgpukit_torch.so"
_lib = None
_lib_path = None
_installed_torch = False
_installed_cupy = False


class _Stats(ctypes.Structure):
    # gpukit_torch_stats in gpukit_torch.h, field for field.
    _fields_ = [(name, ctypes.c_int64) for name in (
        "allocated_bytes", "allocated_bytes_peak", "reserved_bytes", "reserved_bytes_peak",
        "active_bytes", "active_bytes_peak", "requested_bytes", "requested_bytes_peak",
        "inactive_split_bytes", "inactive_split_bytes_peak", "allocation_count",
        "allocation_count_peak", "segment_count", "segment_count_peak", "num_allocs", "num_frees",
        "num_device_allocs", "num_device_frees", "num_alloc_retries", "num_ooms",
        "synchronizing_frees", "limit_bytes", "bad_frees", "segment_source", "initialized",
        "num_cache_hits", "num_pages_created", "num_pages_released", "num_pages_reused")]


def _candidates():
    here = os.path.dirname(os.path.abspath(__file__))
    yield os.path.join(here, _LIB_NAME)
    repo = os.path.dirname(os.path.dirname(os.path.dirname(here)))  # bindings/torch/gpukit_torch
    # The h200 preset's folder first, then any other build folder, newest first.
    found = glob.glob(os.path.join(repo, "build", "*", "bin", "bindings", _LIB_NAME))
    found += glob.glob(os.path.join(repo, "build", "*", "bindings", "torch", _LIB_NAME))
    found.sort(key=lambda p: ("/bin/bindings/" not in p, -os.path.getmtime(p)))
    yield from found


def library_path(lib_path=None):
    """The library load() would use."""
    if lib_path:
        return os.path.realpath(lib_path)
    env = os.environ.get("GPUKIT_TORCH_LIB")
    if env:
        return os.path.realpath(env)
    for path in _candidates():
        if os.path.isfile(path):
            return os.path.realpath(path)
    raise FileNotFoundError(
        f"gpukit: {_LIB_NAME} not found: pass lib_path=, set GPUKIT_TORCH_LIB, or build it "
        "(cmake --preset h200 && cmake --build --preset h200 puts it in build/h200/bin/bindings)")


def _declare(lib):
    c = ctypes
    sig = {
        "gpukit_torch_malloc_nothrow": (c.c_int, [c.c_size_t, c.c_int, c.c_void_p,
                                                  c.POINTER(c.c_void_p)]),
        "gpukit_torch_free": (None, [c.c_void_p, c.c_size_t, c.c_int, c.c_void_p]),
        "gpukit_torch_configure": (c.c_int, [c.c_char_p]),
        "gpukit_torch_get_stats": (c.c_int, [c.c_int, c.POINTER(_Stats), c.c_size_t]),
        "gpukit_torch_stats_json": (c.c_longlong, [c.c_int, c.c_char_p, c.c_size_t]),
        "gpukit_torch_empty_cache": (c.c_longlong, [c.c_int]),
        "gpukit_torch_reset_peak": (c.c_int, [c.c_int]),
        "gpukit_torch_set_limit": (c.c_int, [c.c_int, c.c_size_t]),
        "gpukit_torch_record_history": (c.c_int, [c.c_int, c.c_int, c.c_size_t]),
        "gpukit_torch_snapshot": (c.c_int, [c.c_int, c.c_char_p, c.c_char_p]),
        "gpukit_torch_last_error": (c.c_size_t, [c.c_char_p, c.c_size_t]),
    }
    for name, (res, args) in sig.items():
        f = getattr(lib, name)
        f.restype = res
        f.argtypes = args
    # gpukit_torch_malloc throws C++ exceptions: it is for PyTorch's C++ frames, never for ctypes.


def load(lib_path=None, segments=None):
    """Loads the library (once) and returns it as a ctypes.CDLL. `segments` ("growable",
    "stream_ordered", "synchronous", "automatic") chooses the segment source of the allocators it
    creates from now on; None keeps $GPUKIT_TORCH_SEGMENTS or the default (growable where gpukit
    has it)."""
    global _lib, _lib_path
    if _lib is None:
        path = library_path(lib_path)
        lib = ctypes.CDLL(path)
        _declare(lib)
        _lib, _lib_path = lib, path
    elif lib_path is not None and library_path(lib_path) != _lib_path:
        raise RuntimeError(f"gpukit: {_lib_path} is loaded already; cannot load "
                           f"{library_path(lib_path)} too")
    if segments is not None:
        if _lib.gpukit_torch_configure(segments.encode()) != 0:
            raise ValueError(last_error())
    return _lib


def last_error():
    """The last error the library recorded (process-wide), or ''."""
    lib = load()
    n = lib.gpukit_torch_last_error(None, 0)
    buf = ctypes.create_string_buffer(n + 1)
    lib.gpukit_torch_last_error(buf, n + 1)
    return buf.value.decode(errors="replace")


def is_out_of_memory(exc):
    """True for the exception PyTorch raises when gpukit is out of memory (a RuntimeError whose
    message is gpukit's report; PyTorch keeps torch.OutOfMemoryError for its own allocator)."""
    return "gpukit: out of memory on device" in str(exc) or \
        type(exc).__name__ == "OutOfMemoryError"


def _device(device):
    if device is not None:
        return int(device)
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        return torch.cuda.current_device()
    cupy = sys.modules.get("cupy")
    if cupy is not None:
        return cupy.cuda.runtime.getDevice()
    return -1  # the library's view of the calling thread's current device


def _check(rc, what):
    if rc == -1:
        raise RuntimeError(f"gpukit_torch.{what}: {last_error()}")
    return rc


def stats(device=None):
    """The device's allocator statistics as a dict (PyTorch's vocabulary: allocated_bytes,
    reserved_bytes, their *_peak, num_allocs, num_ooms, ..., segments, bad_frees)."""
    lib = load()
    d = _device(device)
    n = _check(lib.gpukit_torch_stats_json(d, None, 0), "stats")
    buf = ctypes.create_string_buffer(n + 1)
    _check(lib.gpukit_torch_stats_json(d, buf, n + 1), "stats")
    return json.loads(buf.value.decode())


def stats_struct(device=None):
    """The same statistics through the C struct (gpukit_torch_stats), as a dict of ints."""
    lib = load()
    s = _Stats()
    _check(lib.gpukit_torch_get_stats(_device(device), ctypes.byref(s), ctypes.sizeof(s)),
           "stats_struct")
    return {name: getattr(s, name) for name, _ in _Stats._fields_}


def empty_cache(device=None):
    """Returns gpukit's fully free segments to the device (device None: every device). Returns
    the bytes released."""
    return _check(load().gpukit_torch_empty_cache(-1 if device is None else int(device)),
                  "empty_cache")


def reset_peak(device=None):
    _check(load().gpukit_torch_reset_peak(_device(device)), "reset_peak")


def set_limit(nbytes, device=None):
    """Caps the bytes gpukit may hold from the device (0: no cap)."""
    _check(load().gpukit_torch_set_limit(_device(device), int(nbytes)), "set_limit")


def record_history(enabled=True, events_per_thread=65536, device=None):
    """Starts or stops recording allocator events for snapshot()."""
    _check(load().gpukit_torch_record_history(_device(device), 1 if enabled else 0,
                                              int(events_per_thread)), "record_history")


def snapshot(path, device=None, format=None):
    """Writes the device's segments, blocks and recorded events to `path`: PyTorch's pickle
    (.pickle; python -m torch.cuda._memory_viz opens it), gpukit's .json, .trace or .html."""
    _check(load().gpukit_torch_snapshot(_device(device), os.fsencode(path),
                                        format.encode() if format else None), "snapshot")
    return path


def install(lib_path=None, segments=None):
    """Makes gpukit PyTorch's CUDA allocator. Call it before PyTorch initializes CUDA (before the
    first CUDA tensor, torch.cuda.* call or .cuda()): PyTorch cannot swap an allocator it has
    used. Raises RuntimeError if it has."""
    global _installed_torch
    import torch
    if _installed_torch:
        return
    if torch.cuda.is_initialized():
        raise RuntimeError(
            "gpukit_torch.install: PyTorch has already initialized CUDA, so its own allocator is "
            "in use and cannot be replaced; call gpukit_torch.install() at the start of the "
            "program, before any CUDA tensor is made or any torch.cuda function is called")
    lib = load(lib_path, segments)
    alloc = torch.cuda.memory.CUDAPluggableAllocator(_lib_path, "gpukit_torch_malloc",
                                                     "gpukit_torch_free")
    torch.cuda.memory.change_current_allocator(alloc)
    _installed_torch = True
    return lib


class _CupyBlock:
    """Owns one allocation for CuPy: frees it, on the stream it was allocated on, when CuPy drops
    the last reference to its memory."""
    __slots__ = ("ptr", "size", "device", "stream", "free")

    def __init__(self, ptr, size, device, stream, free):
        self.ptr, self.size, self.device, self.stream, self.free = ptr, size, device, stream, free

    def __del__(self):
        try:
            self.free(self.ptr, self.size, self.device, self.stream)
        except Exception:  # interpreter shutdown: ctypes may be gone already
            pass


def _cupy_malloc_function(cupy, lib):
    malloc = lib.gpukit_torch_malloc_nothrow
    free = lib.gpukit_torch_free

    class OutOfMemoryError(cupy.cuda.memory.OutOfMemoryError):
        """CuPy's out-of-memory error, with gpukit's report as its message."""

        def __init__(self, size, message):
            super().__init__(size, 0)
            self.args = (message,)

    def gpukit_malloc(size):
        device = cupy.cuda.runtime.getDevice()
        if size == 0:
            return cupy.cuda.memory.MemoryPointer(cupy.cuda.memory.Memory(0), 0)
        stream = cupy.cuda.get_current_stream().ptr
        out = ctypes.c_void_p()
        rc = malloc(size, device, stream, ctypes.byref(out))
        if rc == 1:
            raise OutOfMemoryError(size, last_error())
        if rc != 0:
            raise RuntimeError(f"gpukit_torch (CuPy): {last_error()}")
        ptr = out.value
        owner = _CupyBlock(ptr, size, device, stream, free)
        mem = cupy.cuda.memory.UnownedMemory(ptr, size, owner, device)
        return cupy.cuda.memory.MemoryPointer(mem, 0)

    return gpukit_malloc


def install_cupy(lib_path=None, segments=None):
    """Makes gpukit CuPy's device allocator (cupy.cuda.set_allocator), on CuPy's current device and
    stream at each allocation. Shares the allocators (and statistics) with PyTorch when both use
    gpukit in one process."""
    global _installed_cupy
    import cupy
    lib = load(lib_path, segments)
    cupy.cuda.set_allocator(_cupy_malloc_function(cupy, lib))
    _installed_cupy = True
    return lib
