# SPDX-License-Identifier: Apache-2.0
"""Builds gpukit_torch._C, a c10 CUDAAllocator over gpukit, with PyTorch's extension tooling.

gpukit is header-only: the build needs its include/ folder. It is looked for in
$GPUKIT_INCLUDE_DIR, then in gpukit-include/ beside this file (where the source distribution
carries a copy), then in ../../include (this folder inside a gpukit checkout, as
`pip install ./bindings/torch` builds it in place). CUDA's headers come from $CUDA_HOME
(PyTorch's choice), with CCCL from its include/cccl where CUDA 13 keeps it.

The source distribution (`python -m build --sdist bindings/torch`: gpukit_torch-<version>.tar.gz)
holds everything a build needs, gpukit's headers and license included, so it installs without a
checkout: `pip install --no-build-isolation gpukit_torch-<version>.tar.gz`. Making it needs no
PyTorch; building the extension does. $GPUKIT_TORCH_CXXFLAGS adds compiler flags after the
defaults (e.g. `-O0` for a quick check that it builds).
"""

import os
import shutil
import subprocess
import sys

from setuptools import setup
from setuptools.command.sdist import sdist

try:
    from torch.utils.cpp_extension import CUDA_HOME, BuildExtension, CUDAExtension
except ImportError:  # enough to make the source distribution and read the metadata
    CUDA_HOME = BuildExtension = CUDAExtension = None

HERE = os.path.dirname(os.path.abspath(__file__))
MARKER = os.path.join("gpukit", "memory", "caching_allocator.hpp")
# Where the source distribution carries gpukit's headers (and gpukit's license, beside this file).
SDIST_INCLUDE = "gpukit-include"
# Setup commands that compile the extension (sdist and the metadata commands do not).
BUILDS_EXTENSION = {"build", "build_ext", "bdist_wheel", "bdist_egg", "install", "develop",
                    "editable_wheel"}


def gpukit_include_dir():
    candidates = []
    if os.environ.get("GPUKIT_INCLUDE_DIR"):
        candidates.append(os.environ["GPUKIT_INCLUDE_DIR"])
    candidates.append(os.path.join(HERE, SDIST_INCLUDE))
    candidates.append(os.path.join(HERE, "..", "..", "include"))
    for c in candidates:
        if os.path.isfile(os.path.join(c, MARKER)):
            return os.path.abspath(c)
    sys.exit(
        "gpukit: the library's headers (include/" + MARKER + ") were not found in "
        + " or ".join(os.path.abspath(c) for c in candidates)
        + ". Build from a gpukit checkout (pip install --no-build-isolation ./bindings/torch) or "
        "from gpukit_torch's source distribution, or set GPUKIT_INCLUDE_DIR to gpukit's include "
        "folder."
    )


class sdist_with_gpukit(sdist):
    """sdist, with gpukit's headers copied into gpukit-include/ and its LICENSE beside setup.py."""

    def make_release_tree(self, base_dir, files):
        super().make_release_tree(base_dir, files)
        source = gpukit_include_dir()
        shutil.copytree(
            os.path.join(source, "gpukit"),
            os.path.join(base_dir, SDIST_INCLUDE, "gpukit"),
            ignore=lambda d, names: [
                n for n in names
                if not os.path.isdir(os.path.join(d, n))
                and not n.endswith((".hpp", ".cuh", ".inl", ".h"))
            ],
        )
        license_file = os.path.join(source, "..", "LICENSE")
        if os.path.isfile(license_file) and not os.path.exists(os.path.join(base_dir, "LICENSE")):
            shutil.copy2(license_file, os.path.join(base_dir, "LICENSE"))


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


if BuildExtension is None:
    if BUILDS_EXTENSION.intersection(sys.argv[1:]):
        sys.exit(
            "gpukit: PyTorch is not importable here, and the extension is compiled against "
            "the installed PyTorch. Install PyTorch first, then build without isolation: "
            "pip install --no-build-isolation <gpukit_torch source>"
        )
    from setuptools.command.build_ext import build_ext as BuildExtension  # nothing to build


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
                    "gpukit: " + path + " contains its own copy of libstdc++ (the link used "
                    "-static-libstdc++?); it would crash formatting PyTorch's error messages. "
                    "Remove -static-libstdc++ from LDFLAGS and build again."
                )


def ext_modules():
    if CUDAExtension is None:
        return []  # packaging only (sdist, metadata): see the check above
    return [
        CUDAExtension(
            name="gpukit_torch._C",
            sources=["csrc/cuda_allocator.cpp", "csrc/module.cpp", "csrc/planner.cpp"],
            include_dirs=include_dirs(),
            extra_compile_args={
                "cxx": ["-O2", "-std=c++17", "-fvisibility=hidden"]
                + os.environ.get("GPUKIT_TORCH_CXXFLAGS", "").split()
            },
            extra_link_args=DYNAMIC_LIBSTDCXX,
        )
    ]


setup(
    packages=["gpukit_torch"],
    ext_modules=ext_modules(),
    cmdclass={"build_ext": checked_build_ext, "sdist": sdist_with_gpukit},
)
