// SPDX-License-Identifier: Apache-2.0
// gpukit/memory/testing.hpp: checks for a test suite that runs gpukit's caching allocator: whether
// its internal invariants hold after whatever the test did.
//
// Quick start:
//
//   #include <gpukit/memory/caching_allocator.hpp>
//   #include <gpukit/memory/testing.hpp>
//   #include <gpukit/runtime/sim_runtime.hpp>
//
//   #include <cassert>
//   #include <string>
//
//   void churn_and_check()
//   {
//     gpukit::sim_runtime sim;
//     gpukit::basic_caching_allocator<gpukit::sim_runtime> alloc{sim};
//     void* p = alloc.allocate(1 << 20);
//     alloc.deallocate(p, 1 << 20);
//     std::string const broken = gpukit::memory::testing::check_invariants(alloc);
//     assert(broken.empty());  // else: what is wrong, one finding after another
//   }
//
// The checks walk every segment and block under the allocator's lock: they cost time linear in the
// pool, so call them from tests and debugging sessions, not on a hot path.
#pragma once

/// @file
/// gpukit::memory::testing::check_invariants: the caching allocator's invariants, for tests. The
/// quick start is at the top of this header.

#include <gpukit/memory/caching_allocator.hpp>
#include <gpukit/memory/detail/allocator_invariants.hpp>

#include <string>

/// Checks for tests of code that uses gpukit's allocator.
namespace gpukit::memory::testing {

/// Checks the invariants of `allocator`: the blocks tile each segment, neighbours that could merge
/// did, blocks of growable segments lie on mapped pages, every free block sits in the one index
/// its owner names, the counters (reserved bytes, segments, in all and per pool kind) agree with
/// the blocks, and each statistic of the whole allocator is the sum of its small and large pools'.
///
/// @param allocator the allocator to check; nothing in it changes
/// @return an empty string when every invariant holds, else a description of each broken one
/// @throws std::bad_alloc only (building the description)
///
/// Takes the allocator's pool lock for the walk; does not synchronize any stream.
template <class Runtime>
[[nodiscard]] std::string check_invariants(basic_caching_allocator<Runtime> const& allocator)
{
  return ::gpukit::detail::check_invariants(allocator);
}

}  // namespace gpukit::memory::testing
