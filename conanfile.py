# SPDX-License-Identifier: Apache-2.0
"""Conan 2 recipe for gpukit, a header-only package.

    conan create .                      # builds the package and runs test_package/
    conan install --requires=gpukit/<version>

The package is gpukit's own CMake install (headers, gpukitConfig.cmake and its version file), so a
consumer writes what the README shows, `find_package(gpukit <major.minor> CONFIG REQUIRED)` and
`target_link_libraries(app PRIVATE gpukit::gpukit)`, and gets the same target as from any other
install: the CUDA runtime (GPUKIT_CUDA_RUNTIME_LINK), NVTX3 and CCCL come from the CUDA toolkit on
the consumer's machine, which Conan does not package. The package id ignores the settings: one
package serves every compiler and configuration. The command-line tools are not in it.
"""

import os
import re

from conan import ConanFile
from conan.tools.build import check_min_cppstd
from conan.tools.cmake import CMake, CMakeToolchain, cmake_layout
from conan.tools.files import load

required_conan_version = ">=2.0"


class GpukitConan(ConanFile):
    name = "gpukit"
    description = (
        "Header-only C++ toolkit that makes CUDA training code use GPU memory and time well: "
        "caching device allocator, pinned pools, transfer pipelines, checkpoint planners"
    )
    license = "Apache-2.0"
    topics = ("cuda", "gpu", "allocator", "memory-pool", "header-only")
    package_type = "header-library"
    settings = "os", "arch", "compiler", "build_type"
    # What gpukit's CMakeLists.txt reads to configure its install (it checks that version.hpp and
    # the PyTorch package's pyproject.toml say the same version).
    exports_sources = (
        "CMakeLists.txt",
        "cmake/*",
        "include/*",
        "LICENSE",
        "CHANGELOG.md",
        "bindings/torch/pyproject.toml",
    )
    no_copy_source = True

    def set_version(self):
        text = load(self, os.path.join(self.recipe_folder, "include", "gpukit", "version.hpp"))
        parts = [
            re.search(rf"#define GPUKIT_VERSION_{p} (\d+)", text).group(1)
            for p in ("MAJOR", "MINOR", "PATCH")
        ]
        self.version = ".".join(parts)

    def layout(self):
        cmake_layout(self)

    def validate(self):
        if self.settings.get_safe("compiler.cppstd"):
            check_min_cppstd(self, 17)

    def package_id(self):
        self.info.clear()

    def generate(self):
        tc = CMakeToolchain(self)
        # Only the library and its package files: no tests, examples, benchmarks, tools, bindings.
        for part in ("TESTS", "EXAMPLES", "BENCHMARKS", "TOOLS", "BINDINGS"):
            tc.cache_variables[f"GPUKIT_BUILD_{part}"] = False
        tc.generate()

    def build(self):
        CMake(self).configure()

    def package(self):
        CMake(self).install()

    def package_info(self):
        self.cpp_info.bindirs = []
        self.cpp_info.libdirs = []
        # Consumers get gpukit's own gpukitConfig.cmake (through CMAKE_PREFIX_PATH, from
        # builddirs), not one that CMakeDeps would write without the CUDA targets.
        self.cpp_info.set_property("cmake_find_mode", "none")
        self.cpp_info.builddirs = [os.path.join("share", "cmake", "gpukit")]
