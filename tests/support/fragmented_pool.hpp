// SPDX-License-Identifier: Apache-2.0
// tests/support/fragmented_pool.hpp: a caching allocator filled to its limit, then holed.
//
//   std::vector<void*> live = gpukit::test::fill_then_free_every_other(alloc, 5 * mib, stream);
#pragma once

#include <gpukit/error.hpp>

#include <cstddef>
#include <vector>

namespace gpukit::test {

/// Allocates blocks of `bytes` on `stream` until the allocator reports out of memory (its device
/// or its limit is full), then frees every other one: about half the memory is free, in blocks
/// that their live neighbours keep from being released. Returns every block allocated, nullptr
/// for the freed ones; the caller frees the rest.
template <class Allocator, class Stream>
std::vector<void*> fill_then_free_every_other(Allocator& alloc, std::size_t bytes,
                                              Stream const& stream)
{
  std::vector<void*> blocks;
  for (;;) {
    try {
      blocks.push_back(alloc.allocate_async(bytes, stream));
    } catch (out_of_memory const&) {
      break;
    }
  }
  for (std::size_t i = 0; i < blocks.size(); i += 2) {
    alloc.deallocate_async(blocks[i], bytes, stream);
    blocks[i] = nullptr;
  }
  return blocks;
}

}  // namespace gpukit::test
