// tests/support/allocator_options.hpp: caching allocator options the tests build allocators with.
//
//   sim_allocator alloc{sim, 0, gpukit::test::segments_from(gpukit::segment_source::growable)};
#pragma once

#include <gpukit/memory/caching_allocator.hpp>

#include <cstddef>

namespace gpukit::test {

/// Options whose segments come from `source`; for growable segments, pages of `page_bytes` (0:
/// the default page size).
inline caching_allocator_options segments_from(segment_source source, std::size_t page_bytes = 0)
{
  caching_allocator_options o;
  o.source = source;
  if (page_bytes != 0) { o.growable_page_bytes = page_bytes; }
  return o;
}

}  // namespace gpukit::test
