// SPDX-License-Identifier: Apache-2.0
// gpukit/stats.hpp: the statistic every gpukit pool reports, current and peak.
//
// Quick start:
//
//   #include <gpukit/memory/caching_allocator.hpp>
//   #include <gpukit/stats.hpp>
//
//   #include <cstdio>
//
//   void print(gpukit::caching_allocator const& alloc)
//   {
//     gpukit::stat_pair const a = alloc.stats().allocated_bytes;
//     std::printf("allocated %lld (peak %lld)\n", static_cast<long long>(a.current),
//                 static_cast<long long>(a.peak));
//   }
#pragma once

#include <cstdint>

namespace gpukit {

/// One statistic, current and peak, as PyTorch reports them.
struct stat_pair {
  std::int64_t current{0};
  std::int64_t peak{0};
};

}  // namespace gpukit
