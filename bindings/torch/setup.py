# SPDX-License-Identifier: Apache-2.0
"""Builds gpukit_torch._C, a c10 CUDAAllocator over gpukit, with PyTorch's extension tooling.

gpukit is header-only: the build needs its include/ folder. It is looked for in
$GPUKIT_INCLUDE_DIR, then in ../../include beside this file (this folder inside a gpukit
checkout, as `pip install ./bindings/torch` builds it in place). CUDA's headers come from
$CUDA_HOME (PyTorch's choice), with CCCL from its include/cccl where CUDA 13 keeps it.
"""

import os
import shutil
import subprocess
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


# libstdc++ must come from the shared library PyTorch itself uses. Some build environments link
# C++ extensions with -static-libstdc++ (seen on an Ubuntu 24.04 machine with PyTorch 2.11): the
# extension then carries a second copy of libstdc++ whose iostreams crash on their first number
# (PyTorch's error messages format one on every out-of-memory error). Naming the shared library
# (by its runtime name, present wherever libstdc++ is, with or without its development link)
# before the driver's own libraries resolves every symbol there, and nothing of a static copy is
# linked or exported.
DYNAMIC_LIBSTDCXX = ["-Wl,-Bdynamic", "-l:libstdc++.so.6", "-Wl,--exclude-libs,libstdc++.a"]

# A symbol only libstdc++ itself defines: the built extension must not define it.
LIBSTDCXX_MARKER = "_ZNSo9_M_insertImEERSoT_"


class checked_build_ext(BuildExtension):
    """BuildExtension, then a check that no copy of libstdc++ was linked into the extension."""

    def run(self):
        super().run()
        nm = shutil.which("nm")
        if nm is None:
            return
        for ext in self.extensions:
            path = self.get_ext_fullpath(ext.name)
            out = subprocess.run([nm, "-D", "--defined-only", path], capture_output=True, text=True)
            if LIBSTDCXX_MARKER in out.stdout:
                sys.exit(
                    "gpukit_torch: " + path + " contains its own copy of libstdc++ (the link used "
                    "-static-libstdc++?); it would crash formatting PyTorch's error messages. "
                    "Remove -static-libstdc++ from LDFLAGS and build again."
                )


setup(
    packages=["gpukit_torch"],
    ext_modules=[
        CUDAExtension(
            name="gpukit_torch._C",
            sources=["csrc/cuda_allocator.cpp", "csrc/module.cpp", "csrc/planner.cpp"],
            include_dirs=include_dirs(),
            extra_compile_args={"cxx": ["-O2", "-std=c++17", "-fvisibility=hidden"]},
            extra_link_args=DYNAMIC_LIBSTDCXX,
        )
    ],
    cmdclass={"build_ext": checked_build_ext},
)
