// SPDX-License-Identifier: Apache-2.0
// gpukit/stats.hpp: the statistic every gpukit pool reports, current and peak.
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

}  // namespace gpukit
