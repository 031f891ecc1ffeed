// SPDX-License-Identifier: Apache-2.0
// detail::caching::segment_source alone over the simulated GPU, with a pool of its own around it in
// place of the allocator's: segments from malloc_async, malloc or a user's resource (with the
// "just big enough" retry), the limit, and the release of whole free segments (largest first, down
// to a target, stream-ordered frees on the stream that used them, a destroyed stream retired).
#include "support/holders.hpp"
#include "support/sim_gpu.hpp"
#include "support/sizes.hpp"

#include <gpukit/error.hpp>
#include <gpukit/memory/caching_allocator_options.hpp>
#include <gpukit/memory/caching_allocator_stats.hpp>
#include <gpukit/memory/detail/caching/block_index.hpp>
#include <gpukit/memory/detail/caching/segment_source.hpp>
#include <gpukit/memory/detail/caching_block.hpp>
#include <gpukit/memory/memory_history.hpp>
#include <gpukit/runtime/sim_runtime.hpp>

#include <doctest/doctest.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <new>
#include <vector>

namespace {

using gpukit::sim_op;
using gpukit::sim_runtime;
using gpukit::test::mib;
using gpukit::test::stream_holder;
using block      = gpukit::detail::caching_block<sim_runtime>;
using source     = gpukit::detail::caching::segment_source<sim_runtime, block>;
using sim_stream = sim_runtime::stream_type;
using action     = gpukit::memory_event::action;

/// A stream's free blocks, as the allocator's stream pools hold them.
struct stream_pool {
  sim_stream stream{};
  gpukit::detail::tlsf_index<block> index[2];
  std::uint64_t free_seq{0};
};

/// The pool around the layer, in place of the allocator's (its segment_pool): a block index,
/// stream pools, counters, and what the layer tells it, kept for the checks. No captures.
struct fake_pool {
  gpukit::detail::caching::block_index<block> index;
  gpukit::caching_allocator_stats counters{};
  std::vector<std::unique_ptr<stream_pool>> pools;
  std::size_t limit_bytes{0};
  std::int64_t reserved_of[2]{0, 0};  // count_reserved
  int segment_count{0};               // count_segment
  std::vector<action> events;
  std::vector<sim_stream> event_streams;
  std::vector<sim_stream> retired;
  int growable_releases{0};

  // ---- the interface segment_source asks for ----
  gpukit::detail::caching::block_index<block>& blocks() { return index; }
  std::size_t limit() const { return limit_bytes; }
  static bool capturing() { return false; }
  static bool capture_active_on(sim_stream) { return false; }
  std::vector<std::unique_ptr<stream_pool>>& streams() { return pools; }
  stream_pool& pool_of(sim_stream s)
  {
    for (auto& sp : pools) {
      if (sp->stream == s) { return *sp; }
    }
    pools.push_back(std::make_unique<stream_pool>());
    pools.back()->stream = s;
    return *pools.back();
  }
  void count(std::uint64_t gpukit::caching_allocator_stats::*counter, std::uint64_t n = 1)
  {
    counters.*counter += n;
  }
  void count_reserved(int kind, std::int64_t delta) { reserved_of[kind] += delta; }
  void count_segment(int, int delta) { segment_count += delta; }
  void record(action what, std::uintptr_t, std::size_t, sim_stream s)
  {
    events.push_back(what);
    event_streams.push_back(s);
  }
  void unindex(block* b) { index_of(b).remove(b); }
  void retire_dead_stream(sim_stream s) { retired.push_back(s); }
  std::size_t release_growable(std::size_t, sim_stream const*)
  {
    ++growable_releases;
    return 0;
  }

  // ---- what the tests do with it ----
  gpukit::detail::tlsf_index<block>& index_of(block const* b)
  {
    return b->global ? index.global(b->kind) : pool_of(b->stream).index[b->kind];
  }
  /// Carves `size` bytes off the start of free block b (the rest stays free and indexed).
  void carve(block* b, std::size_t size)
  {
    index.carve(
      b, size, [this](block const* x) -> auto& { return index_of(x); });
    b->state.store(gpukit::detail::block_state::allocated, std::memory_order_relaxed);
  }
};

/// A stream-ordered resource in gpukit's spelling (host memory: nothing is dereferenced) that
/// refuses (std::bad_alloc) any segment above `most` bytes.
struct capped_resource {
  std::size_t most{0};
  std::vector<std::size_t> asked;
  std::vector<std::size_t> given_back;
  void* allocate_async(std::size_t bytes, sim_stream)
  {
    asked.push_back(bytes);
    if (bytes > most) { throw std::bad_alloc{}; }
    return ::operator new (bytes, std::align_val_t{256});
  }
  void deallocate_async(void* p, std::size_t bytes, sim_stream)
  {
    given_back.push_back(bytes);
    ::operator delete (p, std::align_val_t{256});
  }
};

struct fixture : gpukit::test::sim_gpu {
  gpukit::caching_allocator_options options{};
  source src{sim, 0, options};
  fake_pool pool;
  stream_holder<sim_runtime> s{sim};
  std::vector<sim_stream> issued;
};

}  // namespace

TEST_SUITE("segment_source")
{
  TEST_CASE_FIXTURE(fixture,
                    "stream-ordered segments come from malloc_async and go back on their "
                    "stream")
  {
    CHECK(src.source() == gpukit::segment_source::stream_ordered);
    bool oom = false;
    block* b = src.take(mib / 2, 0, s.s, oom, pool);
    REQUIRE(b != nullptr);
    CHECK_FALSE(oom);
    CHECK(sim.calls(sim_op::malloc_async) == 1);
    CHECK(sim.calls(sim_op::malloc) == 0);
    CHECK(b->size == options.small_segment_bytes);
    CHECK(src.reserved() == options.small_segment_bytes);
    CHECK(pool.reserved_of[0] == static_cast<std::int64_t>(options.small_segment_bytes));
    CHECK(pool.segment_count == 1);
    CHECK(pool.counters.num_device_allocs == 1);
    CHECK(pool.pool_of(s.s).index[0].find(mib / 2) == b);  // indexed in its stream's pool
    CHECK(b->free_seq == 1);

    CHECK(src.release(0, issued, -1, nullptr, pool) == options.small_segment_bytes);
    CHECK(sim.calls(sim_op::free_async) == 1);
    CHECK(sim.calls(sim_op::free) == 0);
    CHECK(issued == std::vector<sim_stream>{s.s});
    CHECK(src.reserved() == 0);
    CHECK(pool.segment_count == 0);
    CHECK(pool.counters.num_device_frees == 1);
    CHECK(pool.counters.synchronizing_frees == 0);
    CHECK(pool.growable_releases == 1);
    CHECK(pool.events == std::vector<action>{action::segment_alloc, action::segment_free});
  }

  TEST_CASE_FIXTURE(fixture, "synchronous segments come from malloc; each free is counted")
  {
    src.use_runtime(false);
    CHECK(src.source() == gpukit::segment_source::synchronous);
    bool oom = false;
    block* b = src.take(8 * mib, 1, s.s, oom, pool);
    REQUIRE(b != nullptr);
    CHECK(sim.calls(sim_op::malloc) == 1);
    CHECK(sim.calls(sim_op::malloc_async) == 0);
    CHECK(b->size == options.medium_segment_bytes);
    CHECK(src.release(0, issued, 1, nullptr, pool) == options.medium_segment_bytes);
    CHECK(sim.calls(sim_op::free) == 1);
    CHECK(issued.empty());  // nothing to wait for
    CHECK(pool.counters.synchronizing_frees == 1);
    CHECK(pool.growable_releases == 0);  // only_kind >= 0: the growable segments stay
  }

  TEST_CASE_FIXTURE(fixture,
                    "an upstream resource that refuses the usual segment gets one just big "
                    "enough")
  {
    capped_resource upstream{3 * mib / 2, {}, {}};
    src.use_upstream(upstream);
    CHECK(src.source() == gpukit::segment_source::upstream);
    bool oom = false;
    block* b = src.take(mib, 0, s.s, oom, pool);
    REQUIRE(b != nullptr);
    CHECK(upstream.asked == std::vector<std::size_t>{options.small_segment_bytes, mib});
    CHECK(b->size == mib);
    CHECK(src.reserved() == mib);
    CHECK(sim.calls(sim_op::malloc_async) + sim.calls(sim_op::malloc) == 0);

    // Refused even at its own size: out of memory, nothing kept.
    CHECK(src.take(2 * mib, 1, s.s, oom, pool) == nullptr);
    CHECK(oom);
    CHECK(src.reserved() == mib);
    CHECK(pool.segment_count == 1);

    CHECK(src.release(0, issued, -1, nullptr, pool) == mib);
    CHECK(upstream.given_back == std::vector<std::size_t>{mib});
    CHECK(issued == std::vector<sim_stream>{s.s});  // taken in stream order, given back so
  }

  TEST_CASE_FIXTURE(fixture, "the limit: a segment just big enough, then out of memory")
  {
    pool.limit_bytes = 3 * mib;
    bool oom         = false;
    REQUIRE(src.take(mib, 0, s.s, oom, pool) != nullptr);  // a 2 MiB segment
    block* b = src.take(mib, 0, s.s, oom, pool);           // 2 MiB more would pass 3
    REQUIRE(b != nullptr);
    CHECK(b->size == mib);
    CHECK(src.reserved() == 3 * mib);
    CHECK_FALSE(oom);
    CHECK(src.take(256, 0, s.s, oom, pool) == nullptr);
    CHECK(oom);
    CHECK(sim.calls(sim_op::malloc_async) == 2);  // the refusal made no runtime call
    CHECK(src.release(0, issued, -1, nullptr, pool) == 3 * mib);
  }

  TEST_CASE_FIXTURE(fixture,
                    "release gives back whole free segments, largest first, down to the "
                    "target")
  {
    bool oom                = false;
    block* small            = src.take(mib, 0, s.s, oom, pool);        // 2 MiB
    block* medium           = src.take(8 * mib, 1, s.s, oom, pool);    // 20 MiB
    block* large            = src.take(64 * mib, 1, s.s, oom, pool);   // 64 MiB
    block* in_use           = src.take(100 * mib, 1, s.s, oom, pool);  // 100 MiB, partly allocated
    std::size_t const total = src.reserved();
    REQUIRE(total == 2 * mib + options.medium_segment_bytes + 164 * mib);
    pool.carve(in_use, mib);
    (void)small;
    (void)medium;
    (void)large;

    // Down to the total less 70 MiB: the largest whole free one (64 MiB) is not enough, so the
    // 20 MiB one goes too; the 2 MiB one stays, and so does the one in use.
    std::size_t const target = total - 70 * mib;
    CHECK(src.release(target, issued, -1, nullptr, pool) ==
          64 * mib + options.medium_segment_bytes);
    CHECK(src.reserved() == 2 * mib + 100 * mib);
    CHECK(pool.segment_count == 2);

    CHECK(src.release(0, issued, -1, nullptr, pool) == 2 * mib);  // the one in use stays
    CHECK(src.reserved() == 100 * mib);
    CHECK(sim.calls(sim_op::free_async) == 3);
    // The one in use goes as the allocator's destructor takes it (teardown), so nothing leaks.
    struct teardown_calls {
      std::uint64_t failed{0};
      void operator()(std::function<cudaError_t()> const& f) noexcept
      {
        if (f() != cudaSuccess) { ++failed; }
      }
    } calls;
    src.teardown(static_cast<source::segment_type*>(in_use->segment), calls);
    CHECK(calls.failed == 0);
  }

  TEST_CASE_FIXTURE(fixture, "a segment of a destroyed stream goes back on the null stream")
  {
    bool oom = false;
    sim_stream gone{};
    REQUIRE(sim.stream_create(gone) == cudaSuccess);
    REQUIRE(src.take(mib, 0, gone, oom, pool) != nullptr);
    REQUIRE(sim.stream_destroy(gone) == cudaSuccess);
    CHECK(src.release(0, issued, -1, nullptr, pool) == options.small_segment_bytes);
    CHECK(pool.retired == std::vector<sim_stream>{gone});
    CHECK(issued == std::vector<sim_stream>{sim_stream{}});
    CHECK(pool.event_streams.back() == sim_stream{});
    CHECK(sim.calls(sim_op::free_async) == 2);  // refused on the dead stream, then the null one
  }

  TEST_CASE_FIXTURE(fixture, "sizes by request class")
  {
    CHECK(src.size_for(256) == options.small_segment_bytes);
    CHECK(src.size_for(options.small_request_bytes) == options.small_segment_bytes);
    CHECK(src.size_for(options.small_request_bytes + 256) == options.medium_segment_bytes);
    CHECK(
      src.size_for(options.medium_request_bytes + 256) ==
      gpukit::detail::round_up(options.medium_request_bytes + 256, options.segment_rounding_bytes));
  }
}
