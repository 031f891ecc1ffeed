// SPDX-License-Identifier: Apache-2.0
// gpukit/memory/memory_summary.hpp: a caching allocator's statistics as a text table, in the shape
// of PyTorch's torch.cuda.memory_summary().
//
// Quick start:
//
//   #include <gpukit/memory/memory_summary.hpp>
//
//   #include <cstdio>
//
//   void on_out_of_memory(gpukit::caching_allocator const& alloc)
//   {
//     std::fputs(gpukit::memory_summary(alloc).c_str(), stderr);
//   }
//
// The table has PyTorch's rows (Allocated memory, Active memory, Requested memory, GPU reserved
// memory, Non-releasable memory, Allocations, Active allocs, GPU reserved segments, Non-releasable
// allocs, Oversize allocations, Oversize GPU segments), each with its "from large pool" and "from
// small pool" sub-rows unless abbreviated, and PyTorch's columns (Cur Usage, Peak Usage, Tot
// Alloc, Tot Freed) and units (B, KiB, MiB, ... chosen on the row's first value; counts in units,
// K and M). Then gpukit's own lines: where segments come from, synchronizing frees, the per-thread
// caches, and the out-of-memory recovery ladder step by step.
//
// Differences from PyTorch, by design: "Tot Alloc" and "Tot Freed" of the non-releasable rows are
// "-" (gpukit scans free blocks when statistics are read rather than counting each change), and
// the oversize rows are always 0 (gpukit has no max_split_size: any block may be split).
#pragma once

#include <gpukit/memory/caching_allocator.hpp>
#include <gpukit/memory/caching_allocator_options.hpp>  // to_string(segment_source)

#include <string>

namespace gpukit {

/// The summary of `stats`, statistics of the allocator of `device` (see the top of this header):
/// without the segment source, which the statistics do not hold. `abbreviated` leaves out the
/// per-pool sub-rows, as PyTorch's `abbreviated=True`. Does not throw but std::bad_alloc.
[[nodiscard]] std::string memory_summary(caching_allocator_stats const& stats, int device = 0,
                                         bool abbreviated = false);

/// The summary of `allocator` now (one call of stats(): takes the pool lock once, does not
/// synchronize), with the segment source it uses.
template <class Runtime>
[[nodiscard]] std::string memory_summary(basic_caching_allocator<Runtime> const& allocator,
                                         bool abbreviated = false);

}  // namespace gpukit

#include <gpukit/memory/detail/memory_summary_impl.hpp>
