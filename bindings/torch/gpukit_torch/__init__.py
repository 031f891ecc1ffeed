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

Settings: the backend's defaults (growable segments), then PYTORCH_CUDA_ALLOC_CONF (or
PYTORCH_HIP_ALLOC_CONF, PYTORCH_ALLOC_CONF: the first set, as PyTorch reads them), then
GPUKIT_ALLOC_CONF, then install("segments:synchronous,roundup_power2_divisions:4"); later ones
win. Each of PyTorch's keys takes effect with PyTorch's meaning or raises ValueError naming it and
why gpukit does not need it. Setting GPUKIT_TORCH_INSTALL=1 installs on import. The pluggable allocator (libgpukit_torch.so through CUDAPluggableAllocator, for PyTorch
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

    conf: settings (gpukit's keys or PyTorch's: ``"segments:synchronous,limit:40GiB"``), applied
    over the backend's defaults, PYTORCH_CUDA_ALLOC_CONF (or its aliases) and GPUKIT_ALLOC_CONF.
    Returns every setting in effect, gpukit's keys then PyTorch's rounding and pinned-memory
    entries, as a string that install() and check_conf() read back to the same settings. Raises ValueError naming an unknown or refused key or a bad
    value, and RuntimeError when PyTorch's own allocator has already served CUDA memory. Calling
    it again returns the same settings. PyTorch's pinned-memory keys (pinned_use_cuda_host_register,
    ...) go to PyTorch's pinned-memory allocator, which gpukit leaves in place.
    """
    import torch  # noqa: PLC0415 (loads libtorch before the extension)

    from . import _sharing  # noqa: PLC0415

    native = _native()
    effective = native.install(conf)
    host = native.host_settings()
    if host:
        # PyTorch reads its own variable; keys given through gpukit reach its pinned memory here.
        torch.cuda.memory._set_allocator_settings(host)
    _sharing.install()  # torch.multiprocessing: a tensor that cannot be shared never hangs a queue
    return effective


def is_installed() -> bool:
    """Whether gpukit is PyTorch's CUDA allocator now."""
    return _native().is_installed()


def default_conf() -> str:
    """The settings the backend starts from, before GPUKIT_ALLOC_CONF and install()'s."""
    return _native().default_conf()


def check_conf(conf: str) -> str:
    """Checks settings over the backend's defaults without installing (ValueError naming a refused
    or bad key); returns the segment source they select."""
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
