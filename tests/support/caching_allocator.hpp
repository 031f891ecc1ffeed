// SPDX-License-Identifier: Apache-2.0
// tests/support/caching_allocator.hpp: what caching allocator tests build on.
//
//   sim_allocator alloc{sim, 0, gpukit::test::segments_from(gpukit::segment_source::growable)};
//
//   TEST_CASE_FIXTURE(gpukit::test::sim_allocator_fixture<64 * mib>, "...")
//   {
//     void* p = alloc.allocate_async(40 * mib, sa);  // `sim`, `alloc`, streams `sa` and `sb`
//     ...
//   }
#pragma once

#include "support/holders.hpp"
#include "support/sim_gpu.hpp"
#include "support/sizes.hpp"

#include <gpukit/memory/caching_allocator.hpp>
#include <gpukit/runtime/sim_runtime.hpp>

#include <cstddef>

namespace gpukit::test {

/// The caching allocator over the simulated GPU.
using sim_allocator = basic_caching_allocator<sim_runtime>;

/// Options whose segments come from `source`; for growable segments, pages of `page_bytes` (0:
/// the default page size).
inline caching_allocator_options segments_from(segment_source source, std::size_t page_bytes = 0)
{
  caching_allocator_options o;
  o.source = source;
  if (page_bytes != 0) { o.growable_page_bytes = page_bytes; }
  return o;
}

/// A doctest fixture: a simulated GPU of one device of `Capacity` bytes (`sim`), a caching
/// allocator of it with the default options (`alloc`) and two streams (`sa`, `sb`). The streams are
/// destroyed before the allocator: a test forgets them first (alloc.forget_stream).
template <std::size_t Capacity = 16 * gib>
struct sim_allocator_fixture {
  sim_runtime sim{one_device(Capacity)};
  basic_caching_allocator<sim_runtime> alloc{sim, 0};
  stream_holder<sim_runtime> sa{sim}, sb{sim};
};

}  // namespace gpukit::test
