// SPDX-License-Identifier: Apache-2.0
// gpukit/memory/detail/caching/segment.hpp: the descriptor of one segment of the caching allocator
// (memory taken from the runtime in one piece), which every block of it points to
// (caching_block::segment). Not public API.
//
// A fixed segment is one allocation (malloc_async or malloc). A growable segment is a range of
// reserved addresses mapped a page at a time (detail/caching/growable_source.hpp): a page is mapped
// when it holds a handle; free and allocated blocks lie on mapped pages only, unmapped blocks on
// pages that are unmapped (or mapped but not yet accessible, after a failed undo).
#pragma once

#include <gpukit/profile/memory_annotation.hpp>

#include <cstddef>
#include <cstdint>
#include <vector>

namespace gpukit::detail::caching {

/// One segment; see the top of this file.
template <class Runtime>
struct segment {
  using physical_handle = typename Runtime::physical_handle;

  void* ptr{nullptr};
  std::size_t size{0};
  int kind{0};
  bool stream_ordered{true};  // from malloc_async (else malloc)
  memory_heap nvtx_heap{};    // the segment as an NVTX heap (memory annotation)
  // Growable segments: `size` bytes of reserved addresses, mapped a page at a time.
  bool growable{false};
  std::size_t page{0};
  std::vector<physical_handle> handles;  // per page
  std::vector<std::uint8_t> mapped;      // per page
  std::vector<int> fds;                  // per page: its exported descriptor, or -1 (shareable)
  std::size_t mapped_pages{0};
};

}  // namespace gpukit::detail::caching
