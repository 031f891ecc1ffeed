"""Builds gpukit_torch._C, a c10 CUDAAllocator over gpukit, with PyTorch's extension tooling.

gpukit is header-only: the build needs its include/ folder. It is looked for in
$GPUKIT_INCLUDE_DIR, then in ../../include beside this file (this folder inside a gpukit
checkout, as `pip install ./bindings/torch` builds it in place). CUDA's headers come from
$CUDA_HOME (PyTorch's choice), with CCCL from its include/cccl where CUDA 13 keeps it.
"""

import os
import sys

from setuptools import setup
from torch.utils.cpp_extension import CUDA_HOME, BuildExtension, CUDAExtension

HERE = os.path.dirname(os.path.abspath(__file__))
MARKER = os.path.join("gpukit", "memory", "caching_allocator.hpp")


def gpukit_include_dir():
    candidates = []
    if os.environ.get("GPUKIT_INCLUDE_DIR"):
        candidates.append(os.environ["GPUKIT_INCLUDE_DIR"])
    candidates.append(os.path.join(HERE, "..", "..", "include"))
    for c in candidates:
        if os.path.isfile(os.path.join(c, MARKER)):
            return os.path.abspath(c)
    sys.exit(
        "gpukit_torch: gpukit's headers (include/" + MARKER + ") were not found in "
        + " or ".join(os.path.abspath(c) for c in candidates)
        + ". Build from a gpukit checkout (pip install --no-build-isolation ./bindings/torch), "
        "or set GPUKIT_INCLUDE_DIR to gpukit's include folder."
    )


def include_dirs():
    dirs = [gpukit_include_dir(), os.path.join(HERE, "include")]
    if CUDA_HOME and os.path.isdir(os.path.join(CUDA_HOME, "include", "cccl")):
        dirs.append(os.path.join(CUDA_HOME, "include", "cccl"))
    return dirs


setup(
    packages=["gpukit_torch"],
    ext_modules=[
        CUDAExtension(
            name="gpukit_torch._C",
            sources=["csrc/cuda_allocator.cpp", "csrc/module.cpp"],
            include_dirs=include_dirs(),
            extra_compile_args={"cxx": ["-O2", "-std=c++17", "-fvisibility=hidden"]},
        )
    ],
    cmdclass={"build_ext": BuildExtension},
)
