// SPDX-License-Identifier: Apache-2.0
// The Runtime conformance suite on the simulated GPU (host-only: runs in CI without a GPU).
#include "runtime/conformance.hpp"

#include <gpukit/runtime/sim_runtime.hpp>

#include <doctest/doctest.h>

#include <cstddef>

namespace {

/// A fresh simulated GPU per case: one device of 8 GiB, CUDA's 2 MiB mapping granularity.
gpukit::sim_runtime make_sim()
{
  return gpukit::sim_runtime{gpukit::sim_config{}.with_devices(1, std::size_t{8} << 30)};
}

/// Two devices, for the cases that only run their multi-device parts with two.
gpukit::sim_runtime make_sim_pair()
{
  return gpukit::sim_runtime{gpukit::sim_config{}.with_devices(2, std::size_t{4} << 30)};
}

}  // namespace

TEST_SUITE("runtime")
{
  GPUKIT_RUNTIME_CONFORMANCE_CASES(make_sim(), "sim_runtime")

  TEST_CASE("sim_runtime x2: devices")
  {
    auto&& rt = make_sim_pair();
    gpukit::test::check_devices(rt);
  }

  TEST_CASE("sim_runtime x2: copies")
  {
    auto&& rt = make_sim_pair();
    gpukit::test::check_copies(rt);
  }
}
