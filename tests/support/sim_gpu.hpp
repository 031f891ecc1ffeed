// SPDX-License-Identifier: Apache-2.0
// tests/support/sim_gpu.hpp: the simulated GPUs gpukit's tests run on.
//
//   gpukit::sim_runtime sim{gpukit::test::one_device()};            // one device of 16 GiB
//   gpukit::sim_runtime small{gpukit::test::one_device(64 * mib)};  // a device to fill up
//   gpukit::sim_runtime pair{gpukit::test::devices(2)};             // two devices of 4 GiB
//   TEST_CASE_FIXTURE(gpukit::test::sim_stream_fixture, "...") { ... sim ... s ... }
//
// Capacity is a number the simulated device counts against, not memory taken up front: a large
// device costs nothing until it is allocated from.
#pragma once

#include "support/holders.hpp"
#include "support/sizes.hpp"

#include <gpukit/runtime/sim_runtime.hpp>

#include <cstddef>

namespace gpukit::test {

using sim_stream = sim_runtime::stream_type;

/// One simulated device of `capacity` bytes.
inline sim_config one_device(std::size_t capacity = 16 * gib)
{
  return sim_config{}.with_devices(1, capacity);
}

/// `count` simulated devices of `capacity` bytes each.
inline sim_config devices(int count, std::size_t capacity = 4 * gib)
{
  return sim_config{}.with_devices(count, capacity);
}

/// A simulated GPU of one 1 GiB device, as a base or member constructed before what uses it
/// (the base-from-member idiom: list it first among a fixture's bases).
struct sim_gpu {
  sim_runtime sim{one_device(gib)};
};

/// A simulated GPU of one 1 GiB device (`sim`) and a stream of it (`s`): a doctest fixture.
struct sim_stream_fixture : sim_gpu {
  stream_holder<sim_runtime> s{sim};
};

}  // namespace gpukit::test
