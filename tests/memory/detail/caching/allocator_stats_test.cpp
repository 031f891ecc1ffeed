// SPDX-License-Identifier: Apache-2.0
// detail::caching::allocator_stats alone: the pool-level counters and their peaks, the flows
// summed over thread caches, the active and inactive statistics from a scan of blocks, the switch
// to shared counts when a second thread comes, and reset_peak. The thread caches are the
// allocator's own type (detail::caching_thread_cache, hence the allocator's header), driven here
// by hand.
#include <gpukit/memory/caching_allocator.hpp>  // detail::caching_thread_cache
#include <gpukit/memory/detail/caching/allocator_stats.hpp>
#include <gpukit/memory/detail/shared_counts.hpp>
#include <gpukit/runtime/sim_runtime.hpp>

#include <doctest/doctest.h>

#include <array>
#include <cstdint>
#include <memory>
#include <vector>

namespace {

using gpukit::caching_allocator_stats;
using gpukit::sim_runtime;
using block     = gpukit::detail::caching_block<sim_runtime>;
using stats     = gpukit::detail::caching::allocator_stats<block>;
using cache     = gpukit::detail::caching_thread_cache<sim_runtime>;
using free_list = gpukit::detail::tlsf_index<block>;

constexpr std::int64_t mib = std::int64_t{1} << 20;

// The counters an allocator keeps beside the layer (lock-free, read on the fast path), and its
// thread caches.
struct counters {
  gpukit::detail::shared_counts shared;
  gpukit::detail::pending_counts pending;
  std::vector<std::unique_ptr<cache>> caches;
  cache& add_cache()
  {
    caches.push_back(std::make_unique<cache>());
    return *caches.back();
  }
};

// What the allocator hands to scan: pending frees, stream pools, global indices.
struct pending_free {
  block* b{nullptr};
};
struct stream_pool {
  free_list index[2];
};

stats::scanned_blocks nothing_scanned() { return {}; }

}  // namespace

TEST_SUITE("allocator_stats")
{
  TEST_CASE(
    "segments and reserved bytes per pool kind, their peaks rise where segments are counted")
  {
    counters c;
    stats s{c.shared, c.pending};
    s.count_reserved(0, 2 * mib);
    s.count_segment(0, 1);
    s.count_reserved(1, 20 * mib);
    s.count_segment(1, 1);
    CHECK(s.segments() == 2);
    s.count_reserved(1, -20 * mib);
    s.count_segment(1, -1);
    CHECK(s.segments() == 1);

    // Bytes counted without a segment (a growable page mapped) raise no peak until told.
    s.count_reserved(0, 4 * mib);
    CHECK(s.pool_stats(0).reserved_bytes.peak == 2 * mib);
    s.raise_reserved_peak();
    CHECK(s.pool_stats(0).reserved_bytes.peak == 6 * mib);

    caching_allocator_stats const& r = s.update_peaks(c.caches);
    CHECK(r.reserved_bytes.current == 6 * mib);
    CHECK(r.reserved_bytes.peak == 22 * mib);
    CHECK(r.segment_count.current == 1);
    CHECK(r.segment_count.peak == 2);
    CHECK(r.large_pool.reserved_bytes.current == 0);
    CHECK(r.large_pool.reserved_bytes.peak == 20 * mib);
    CHECK(r.large_pool.reserved_bytes.allocated == 20 * mib);
    CHECK(r.large_pool.reserved_bytes.freed == 20 * mib);
    CHECK(r.small_pool.segment_count.allocated == 1);
    CHECK(r.large_pool.segment_count.freed == 1);
  }

  TEST_CASE("event counters and the recovery steps only grow, and read() reports them")
  {
    counters c;
    stats s{c.shared, c.pending};
    s.count(&caching_allocator_stats::num_device_allocs);
    s.count(&caching_allocator_stats::num_device_allocs, 3);
    s.count(&caching_allocator_stats::num_ooms);
    s.count_recovery_step(2, 4096);
    s.count_recovery_step(2, 1024);
    caching_allocator_stats const r = s.read(c.caches, nothing_scanned());
    CHECK(r.num_device_allocs == 4);
    CHECK(r.num_ooms == 1);
    CHECK(r.num_device_frees == 0);
    CHECK(r.num_recovery_steps[2] == 2);
    CHECK(r.recovery_bytes[2] == 5120);
    CHECK(r.num_recovery_steps[0] == 0);
  }

  TEST_CASE("flows are summed over the thread caches, the peaks are the one thread's")
  {
    counters c;
    stats s{c.shared, c.pending};
    cache& a = c.add_cache();
    cache& b = c.add_cache();
    a.count_alloc(0, 512, 500, c.pending);
    a.count_alloc(1, 2 * mib, 2 * mib - 8, c.pending);
    b.count_free(0, 512, 500);  // a's small block, freed by another thread
    a.cached_bytes.add(4096);
    a.num_cache_hits.add(3);
    caching_allocator_stats const r = s.read(c.caches, nothing_scanned());
    CHECK(r.allocated_bytes.current == 2 * mib);
    CHECK(r.allocated_bytes.peak == 2 * mib + 512);
    CHECK(r.requested_bytes.current == 2 * mib - 8);
    CHECK(r.small_pool.allocated_bytes.allocated == 512);
    CHECK(r.small_pool.allocated_bytes.freed == 512);
    CHECK(r.small_pool.allocated_bytes.current == 0);
    CHECK(r.small_pool.allocated_bytes.peak == 512);
    CHECK(r.allocation_count.current == 1);
    CHECK(r.allocation_count.peak == 2);
    CHECK(r.num_allocs == 2);
    CHECK(r.num_frees == 1);
    CHECK(r.cached_bytes == 4096);
    CHECK(r.num_cache_hits == 3);
    // No free pending: active is allocated.
    CHECK(r.active_bytes.current == 2 * mib);
    CHECK(r.active_bytes.peak == 2 * mib + 512);
  }

  TEST_CASE("scan finds pending frees and the free blocks of split segments")
  {
    // A segment split in two (small pool): one half free in a stream's pool, the other a pending
    // free; and a whole free segment (large pool) in the global index, which is not split.
    block head, tail, whole;
    head.kind = tail.kind = 0;
    head.size = tail.size = 1024;
    head.next             = &tail;
    tail.prev             = &head;
    whole.kind            = 1;
    whole.size            = 4 * static_cast<std::size_t>(mib);
    std::vector<std::unique_ptr<stream_pool>> pools;
    pools.push_back(std::make_unique<stream_pool>());
    pools[0]->index[0].insert(&head);
    std::array<free_list, 2> globals;
    globals[1].insert(&whole);
    std::vector<pending_free> pending{{&tail}};

    stats::scanned_blocks const found = stats::scan(pending, pools, globals);
    CHECK(found.pending_bytes[0] == 1024);
    CHECK(found.pending_count[0] == 1);
    CHECK(found.split_bytes[0] == 1024);
    CHECK(found.split_count[0] == 1);
    CHECK(found.split_bytes[1] == 0);
    CHECK(found.pending_count[1] == 0);

    // Active: handed out less the frees that completed; the pending one is still active.
    counters c;
    stats s{c.shared, c.pending};
    cache& t = c.add_cache();
    t.count_alloc(0, 1024, 1000, c.pending);
    t.count_alloc(0, 1024, 1000, c.pending);
    t.count_free(0, 1024, 1000);
    t.count_free(0, 1024, 1000);
    caching_allocator_stats const r = s.read(c.caches, found);
    CHECK(r.small_pool.allocated_bytes.current == 0);
    CHECK(r.small_pool.active_bytes.current == 1024);
    CHECK(r.small_pool.active_count.current == 1);
    CHECK(r.active_bytes.current == 1024);
    CHECK(r.inactive_split_bytes.current == 1024);
    CHECK(r.inactive_split_count.current == 1);

    pools[0]->index[0].remove(&head);
    globals[1].remove(&whole);
  }

  TEST_CASE("a second thread switches the shared counts on, a thread joins them with its own")
  {
    counters c;
    stats s{c.shared, c.pending};
    cache& a = c.add_cache();
    a.count_alloc(0, 512, 512, c.pending);
    a.count_alloc(0, 512, 512, c.pending);
    a.count_free(0, 512, 512);
    cache& b = c.add_cache();
    s.share_counts(c.caches, nothing_scanned());
    CHECK(c.shared.on.load());
    CHECK(c.shared.unjoined_bytes[0].load() == 512);
    CHECK(c.shared.peak_bytes[0].load() == 1024);  // the peak so far
    CHECK(c.shared.peak_count[2].load() == 2);
    CHECK(c.shared.bytes[0].load() == 0);

    // a's next operation joins: its counts move from the unjoined sums into the shared ones,
    // whole (its delta starts at 0).
    stats::join_shared_counts(c.shared, a, c.pending);
    CHECK(a.joined);
    CHECK(c.shared.unjoined_bytes[0].load() == 0);
    CHECK(c.shared.bytes[0].load() == 512);
    CHECK(a.folded[0].bytes == 512);
    stats::join_shared_counts(c.shared, b, c.pending);
    CHECK(c.shared.bytes[0].load() == 512);

    // From now on the shared peaks are the allocator's, batched: b's allocations stay in its own
    // delta until it passes the batch, and the peaks are then raised to the shared values.
    using gpukit::detail::shared_counts;
    std::int64_t const block = 1 * mib;
    std::int64_t n           = 0;
    for (; n * block <= shared_counts::batch_bytes; ++n) {
      CHECK(c.shared.bytes[0].load() == 512);  // nothing folded yet
      b.count_alloc(0, block, block, c.pending);
      c.shared.count_op(0, b.pools[0].net(), b.folded[0], c.pending);
    }
    // The last allocation folded all but the reserve.
    CHECK(c.shared.bytes[0].load() == 512 + n * block - shared_counts::reserve.bytes);
    CHECK(b.pools[0].bytes() - b.folded[0].bytes == shared_counts::reserve.bytes);
    caching_allocator_stats const& r = s.update_peaks(c.caches);
    CHECK(r.allocated_bytes.current == 512 + n * block);  // exact: summed over the caches
    // Below the true peak (the current value) by the delta left, at most the batch per thread.
    CHECK(c.shared.peak_bytes[2].load() == 512 + n * block - shared_counts::reserve.bytes);
    CHECK(r.allocated_bytes.peak == 512 + n * block);  // a peak is at least its current value

    // A thread that exits folds its whole delta.
    stats::fold_exiting(c.shared, b, c.pending);
    CHECK(c.shared.bytes[0].load() == 512 + n * block);
    CHECK(c.shared.bytes[2].load() == 512 + n * block);
    CHECK(c.shared.peak_bytes[0].load() == 512 + n * block);
  }

  TEST_CASE("reset_peak sets every peak to its current value, the threads' and shared ones too")
  {
    counters c;
    stats s{c.shared, c.pending};
    s.count_reserved(1, 8 * mib);
    s.count_segment(1, 1);
    s.count_reserved(1, -8 * mib);
    s.count_segment(1, -1);
    cache& a = c.add_cache();
    a.count_alloc(1, 8 * mib, 8 * mib, c.pending);
    a.count_alloc(1, 2 * mib, 2 * mib, c.pending);
    a.count_free(1, 8 * mib, 8 * mib);

    SUBCASE("one thread")
    {
      s.reset_peak(c.caches, nothing_scanned());
      CHECK(a.pools[1].peak_bytes.get() == 2 * mib);
      CHECK(a.peak_bytes.get() == 2 * mib);
      caching_allocator_stats const r = s.read(c.caches, nothing_scanned());
      CHECK(r.allocated_bytes.peak == 2 * mib);
      CHECK(r.active_bytes.peak == 2 * mib);
      CHECK(r.reserved_bytes.peak == 0);
      CHECK(r.large_pool.segment_count.peak == 0);
      CHECK(r.large_pool.reserved_bytes.allocated == 8 * mib);  // totals stay
    }
    SUBCASE("shared counts on")
    {
      c.add_cache();
      s.share_counts(c.caches, nothing_scanned());
      CHECK(c.shared.peak_bytes[1].load() == 10 * mib);
      s.reset_peak(c.caches, nothing_scanned());
      CHECK(c.shared.peak_bytes[1].load() == 2 * mib);
      CHECK(c.shared.peak_bytes[2].load() == 2 * mib);
      CHECK(s.read(c.caches, nothing_scanned()).allocated_bytes.peak == 2 * mib);
    }
  }
}
