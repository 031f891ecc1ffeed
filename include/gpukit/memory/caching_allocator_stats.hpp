// SPDX-License-Identifier: Apache-2.0
// gpukit/memory/caching_allocator_stats.hpp: what basic_caching_allocator::stats() returns, in
// PyTorch's vocabulary (torch.cuda.memory_stats), for the whole allocator and per pool kind.
//
// Quick start:
//
//   #include <gpukit/memory/caching_allocator.hpp>
//
//   #include <cstdint>
//   #include <cstdio>
//
//   void report(gpukit::caching_allocator const& alloc)
//   {
//     gpukit::caching_allocator_stats const s = alloc.stats();
//     std::int64_t const live   = s.allocated_bytes.current;               // both pools
//     std::int64_t const small  = s.small_pool.allocated_bytes.current;    // requests <= 1 MiB
//     std::int64_t const handed = s.large_pool.allocated_bytes.allocated;  // ever handed out
//     std::printf("%lld live, %lld small, %lld handed out by the large pool\n",
//                 static_cast<long long>(live), static_cast<long long>(small),
//                 static_cast<long long>(handed));
//   }
//
// gpukit/memory/memory_summary.hpp prints all of them as PyTorch's memory_summary() does.
#pragma once

#include <gpukit/stats.hpp>

#include <array>
#include <cstdint>
#include <iterator>

namespace gpukit {

/// The steps of the out-of-memory recovery ladder, in order (the one list of them: the count,
/// the statistics and the report follow it).
inline constexpr char const* recovery_step_names[] = {
  "collect blocks whose cross-stream events have completed",
  "user out-of-memory callbacks",
  "release cached free segments of the requesting stream",
  "release cached free segments of every stream (waiting only on the events that guard them)",
  "cut it from a free block of the other pool (split; merges back when freed)",
  "wait for blocks other threads are returning (oom_wait_for_frees_ms)",
};
/// How many steps the out-of-memory recovery ladder has.
inline constexpr int recovery_step_count = static_cast<int>(std::size(recovery_step_names));

/// The statistics of one pool kind, as PyTorch's "small_pool" and "large_pool": requests up to
/// `caching_allocator_options::small_request_bytes` are served by the small pool (its own small
/// segments), larger ones by the large pool. Each statistic has PyTorch's four fields: current,
/// peak, and the totals added (`allocated`) and taken (`freed`) since the allocator was created.
/// Reserved bytes of growable segments: pages mapped for the pool, plus the spare pages held on
/// its list (pools whose pages have the same size share the small pool's list; a page moving
/// between them counts as freed by one and allocated by the other).
struct caching_pool_stats {
  stat_totals allocated_bytes;  ///< bytes of blocks held by users (block sizes)
  stat_totals requested_bytes;  ///< bytes users asked for
  stat_totals reserved_bytes;   ///< bytes held from the runtime (segments, growable pages)
  stat_totals active_bytes;     ///< allocated, plus freed blocks waiting on other streams
  /// Free blocks inside partly used segments; their state is scanned when read, so only current
  /// and peak are kept (allocated and freed stay 0).
  stat_totals inactive_split_bytes;
  stat_totals allocation_count;  ///< blocks held by users
  stat_totals segment_count;     ///< segments (growable: address ranges)
  stat_totals active_count;
  stat_totals inactive_split_count;  ///< current and peak only, as inactive_split_bytes
};

/// Statistics of a caching allocator (PyTorch's `torch.cuda.memory_stats` vocabulary).
///
/// Exactness (basic_caching_allocator::stats() says how): current values and the totals
/// (`allocated`, `freed`) are exact when read with no operation in flight. Peaks are exact while
/// one thread uses the allocator; once several have, the peaks of allocated, requested and
/// active bytes and of allocation and active counts are batched per thread: never above the true
/// peak, at most threads x 8 MiB (bytes) or threads x 128 blocks below it per pool kind (twice
/// that for both kinds together). Reserved and segment peaks stay exact (counted under the pool
/// lock).
struct caching_allocator_stats {
  stat_pair allocated_bytes;       ///< bytes of blocks held by users (block sizes)
  stat_pair requested_bytes;       ///< bytes users asked for
  stat_pair reserved_bytes;        ///< bytes of segments held from the runtime
  stat_pair active_bytes;          ///< allocated, plus freed blocks waiting on other streams' work
  stat_pair inactive_split_bytes;  ///< free blocks inside partly used segments
  stat_pair allocation_count;      ///< blocks held by users
  stat_pair segment_count;
  stat_pair active_count;
  stat_pair inactive_split_count;
  std::int64_t cached_bytes{0};  ///< free bytes held in per-thread caches (part of inactive)
  std::uint64_t num_allocs{0};   ///< allocate calls that succeeded
  std::uint64_t num_frees{0};
  std::uint64_t num_cache_hits{0};     ///< allocations served by a per-thread cache
  std::uint64_t num_device_allocs{0};  ///< segments taken from the runtime (growable: pages mapped)
  std::uint64_t num_device_frees{0};   ///< segments returned to the runtime (growable: unmapped)
  /// Growable segments: physical pages created (cuMemCreate) and released (cuMemRelease); pages
  /// unmapped from a free range and mapped again where the pool grows are counted as reused.
  std::uint64_t num_pages_created{0};
  std::uint64_t num_pages_released{0};
  std::uint64_t num_pages_reused{0};
  std::uint64_t num_alloc_retries{0};  ///< allocations that needed a recovery step
  std::uint64_t num_ooms{0};
  std::uint64_t num_cross_stream_events{0};  ///< events recorded to move blocks across streams
  std::uint64_t synchronizing_frees{0};      ///< segment frees that may synchronize the device
  /// Out-of-memory recovery waits on a stream whose cached segments it returned (never the device).
  std::uint64_t num_release_waits{0};
  /// Out-of-memory recovery, by step (see recovery_step_names): times each step ran, and the
  /// bytes it made available (moved into the usable pool, or returned to the device).
  std::array<std::uint64_t, recovery_step_count> num_recovery_steps{};
  std::array<std::uint64_t, recovery_step_count> recovery_bytes{};
  /// Streams found destroyed while the allocator still knew them (a free or record_stream on one,
  /// blocks cached for one): each cost one device synchronization, and their blocks became
  /// usable on every stream.
  std::uint64_t num_dead_streams{0};
  /// Debug mode's guard pages: frees whose pages could not be unmapped at once (the runtime
  /// failed); the block was freed and its pages stay mapped until release().
  std::uint64_t num_guard_unmap_failures{0};
  /// The same statistics per pool kind, with PyTorch's totals (see caching_pool_stats). Each
  /// current value above is the sum of the two pools'.
  caching_pool_stats small_pool;
  caching_pool_stats large_pool;
};

/// The statistics of pool kind `large ? large_pool : small_pool`.
[[nodiscard]] inline caching_pool_stats const& pool_stats(caching_allocator_stats const& s,
                                                          bool large) noexcept
{
  return large ? s.large_pool : s.small_pool;
}

}  // namespace gpukit
