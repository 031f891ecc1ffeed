// SPDX-License-Identifier: Apache-2.0
// The resource adaptors' conformance suite (adaptor_conformance.hpp) on a real GPU (cuda_runtime),
// the same cases the simulated GPU runs in CI.
#include "memory/adaptors/adaptor_conformance.hpp"

#include <gpukit/runtime/cuda_runtime.hpp>

#include <doctest/doctest.h>

TEST_SUITE("gpu")
{
  GPUKIT_ADAPTOR_CONFORMANCE_CASES(gpukit::cuda_runtime::instance(), "cuda_runtime", 8, 1000)
}
