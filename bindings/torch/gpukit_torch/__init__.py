# SPDX-License-Identifier: Apache-2.0
"""gpukit's caching allocator as PyTorch's CUDA allocator, with nothing PyTorch offers lost.

    import gpukit_torch
    gpukit_torch.install()            # before CUDA memory is first allocated
    model = build_model().cuda()      # every CUDA tensor now comes from gpukit

torch.cuda.graph, make_graphed_callables and torch.compile(mode="reduce-overhead"),
torch.cuda.MemPool and use_mem_pool, torch.cuda.memory_stats() / memory_allocated() /
memory_summary(), empty_cache(), set_per_process_memory_fraction(),
torch.cuda.memory._record_memory_history() / _snapshot() / _dump_snapshot(),
torch.OutOfMemoryError (with gpukit's report), OOM observers, Tensor.record_stream and
torch.multiprocessing's CUDA tensor sharing keep working: the extension (gpukit_torch._C) is a
c10::cuda::CUDACachingAllocator::CUDAAllocator compiled against the installed PyTorch.

Settings: install("segments:growable,page_size:20MiB"), or GPUKIT_ALLOC_CONF in the environment
(PyTorch-style key:value pairs; install()'s settings win). Setting GPUKIT_TORCH_INSTALL=1 installs
on import. The pluggable allocator (libgpukit_torch.so through CUDAPluggableAllocator, for PyTorch
builds this extension cannot be compiled against, and for CuPy) is gpukit_torch.pluggable,
imported only when asked for.
"""

import importlib
import os

__all__ = ["install", "is_installed", "default_conf", "check_conf", "sharing_refusal",
           "gpukit_stats", "pluggable"]


def _native():
    from . import _C  # noqa: PLC0415 (imports torch's libraries: only when used)

    return _C


def install(conf: str = "") -> str:
    """Make gpukit PyTorch's CUDA allocator. Call before CUDA memory is first allocated.

    conf: settings in GPUKIT_ALLOC_CONF's form (``"segments:growable,limit:40GiB"``), applied
    over the backend's defaults and the environment's GPUKIT_ALLOC_CONF. Returns the settings in
    effect. Raises ValueError naming an unknown key or bad value, and RuntimeError when PyTorch's
    own allocator has already served CUDA memory. Calling it again returns the same settings.
    """
    import torch  # noqa: F401,PLC0415 (loads libtorch before the extension)

    from . import _sharing  # noqa: PLC0415

    settings = _native().install(conf)
    _sharing.install()  # torch.multiprocessing: a tensor that cannot be shared never hangs a queue
    return settings


def is_installed() -> bool:
    """Whether gpukit is PyTorch's CUDA allocator now."""
    return _native().is_installed()


def default_conf() -> str:
    """The settings the backend starts from, before GPUKIT_ALLOC_CONF and install()'s."""
    return _native().default_conf()


def check_conf(conf: str) -> str:
    """Checks settings without installing; returns the segment source they select."""
    return _native().parse_conf(conf)


def sharing_refusal() -> str:
    """Why CUDA tensors of growable memory cannot be shared with other processes here ('' when
    they can): receivers take the pages' descriptors with pidfd_getfd, which old kernels lack
    and containers or Yama's ptrace_scope may forbid. Probed once per process (a forked child
    tries it on this one); GPUKIT_ALLOC_CONF=segments:synchronous avoids it."""
    return _native().sharing_refusal()


def gpukit_stats(device: int = 0) -> dict:
    """gpukit's own statistics of a device (torch.cuda.memory_stats() has PyTorch's)."""
    return _native().gpukit_stats(device)


def __getattr__(name):
    if name == "pluggable":
        return importlib.import_module(".pluggable", __name__)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


if os.environ.get("GPUKIT_TORCH_INSTALL", "") not in ("", "0"):
    install()
