# SPDX-License-Identifier: Apache-2.0
"""Conan's test of the gpukit package: a CMake project consumes it with find_package, builds a
program that uses the caching allocator on the simulated GPU (no GPU needed) and runs it."""

import os

from conan import ConanFile
from conan.tools.build import can_run
from conan.tools.cmake import CMake, cmake_layout


class GpukitTestPackage(ConanFile):
    settings = "os", "arch", "compiler", "build_type"
    generators = "CMakeToolchain", "CMakeDeps", "VirtualRunEnv"
    test_type = "explicit"

    def requirements(self):
        self.requires(self.tested_reference_str)

    def layout(self):
        cmake_layout(self)

    def build(self):
        cmake = CMake(self)
        cmake.configure(variables={"GPUKIT_EXPECTED_VERSION": str(self.dependencies["gpukit"].ref.version)})
        cmake.build()

    def test(self):
        if can_run(self):
            self.run(os.path.join(self.cpp.build.bindir, "test_package"), env="conanrun")
