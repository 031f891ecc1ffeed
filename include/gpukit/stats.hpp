// SPDX-License-Identifier: Apache-2.0
// gpukit/stats.hpp: the statistics every gpukit pool reports: current and peak, and (per pool of
// the caching allocator) PyTorch's totals.
//
//   auto s = alloc.stats();
//   std::printf("allocated %lld (peak %lld)\n", s.allocated_bytes.current, s.allocated_bytes.peak);
#pragma once

#include <cstdint>

namespace gpukit {

/// One statistic, current and peak, as PyTorch reports them.
struct stat_pair {
  std::int64_t current{0};
  std::int64_t peak{0};
};

/// One statistic with PyTorch's four fields (torch.cuda.memory_stats' `current`, `peak`,
/// `allocated`, `freed`): current and peak, and the totals added and taken since the pool was
/// created, so that current == allocated - freed for a statistic whose totals are tracked.
struct stat_totals {
  std::int64_t current{0};
  std::int64_t peak{0};
  std::int64_t allocated{0};
  std::int64_t freed{0};
};

}  // namespace gpukit
