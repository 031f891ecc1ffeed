// SPDX-License-Identifier: Apache-2.0
// The caching allocator on the simulated GPU: the conformance cases, plus what only a simulated
// GPU can show (stalled streams, injected faults, call counters).
#include "memory/allocator_conformance.hpp"

#include "support/caching_allocator.hpp"
#include "support/holders.hpp"
#include "support/sim_gpu.hpp"
#include "support/sizes.hpp"

#include <gpukit/memory/caching_allocator.hpp>
#include <gpukit/memory/detail/allocator_invariants.hpp>
#include <gpukit/runtime/sim_runtime.hpp>

#include <doctest/doctest.h>

#include <set>
#include <thread>

using namespace gpukit::test;
using gpukit::sim_op;
using gpukit::sim_runtime;
using sim_allocator = gpukit::basic_caching_allocator<sim_runtime>;

TEST_SUITE("caching_allocator")
{
  // The conformance suite over every segment source (tests/memory/allocator_conformance.hpp).
  GPUKIT_ALLOCATOR_CONFORMANCE_CASES(sim_runtime{one_device()}, "sim_runtime", 4, 400, 8 * mib)

  TEST_CASE_FIXTURE(sim_allocator_fixture<>,
                    "the hot path makes no runtime call and no synchronization")
  {
    void* p = alloc.allocate_async(65536, sa);
    alloc.deallocate_async(p, 65536, sa);
    sim.reset_counters();
    for (int i = 0; i < 10000; ++i) {
      void* q = alloc.allocate_async(65536, sa);
      alloc.deallocate_async(q, 65536, sa);
    }
    CHECK(sim.total_calls() == 0);
    CHECK(sim.synchronizations() == 0);
    alloc.forget_stream(sa);
  }

  TEST_CASE("memory freed with pending work is never handed to another stream early")
  {
    // With release_before_grow, b's growth returns a's free segment to the device in a's order;
    // without it, the segment crosses to b through an event. Either way b never gets p early.
    for (bool const release_before_grow : {false, true}) {
      CAPTURE(release_before_grow);
      sim_runtime sim{one_device()};
      gpukit::caching_allocator_options o;
      o.release_before_grow = release_before_grow;
      sim_allocator alloc{sim, 0, o};
      stream_holder<sim_runtime> sa{sim}, sb{sim};
      GPUKIT_CUDA_TRY(sim.stall(sa));
      void* p = alloc.allocate_async(mib, sa);
      GPUKIT_CUDA_TRY(sim.memset_async(p, 1, mib, sa));  // pending: a is stalled
      alloc.deallocate_async(p, mib, sa);
      // Another stream, while a still has work queued before the free: never p.
      std::vector<void*> on_b;
      for (int i = 0; i < 8; ++i) {
        on_b.push_back(alloc.allocate_async(mib, sb));
        CHECK(on_b.back() != p);
      }
      for (void* q : on_b) { alloc.deallocate_async(q, mib, sb); }
      CHECK(alloc.stats().num_cross_stream_events >= 1);
      // The same stream may reuse it at once: its own later work is ordered after the memset.
      void* again = alloc.allocate_async(mib, sa);
      if (!release_before_grow) { CHECK(again == p); }
      alloc.deallocate_async(again, mib, sa);
      CHECK(gpukit::detail::check_invariants(alloc) == "");
      // Once a's work has run, b may have it.
      GPUKIT_CUDA_TRY(sim.release(sa));
      GPUKIT_CUDA_TRY(sim.stream_synchronize(sa));
      // The allocator records its crossing event lazily, when b runs short; b gets p once that
      // event has completed (device_synchronize lets it complete between attempts,
      // deterministically).
      if (release_before_grow) {  // p went back to the device in a's order: nothing more to see
        alloc.forget_stream(sa);
        alloc.forget_stream(sb);
        continue;
      }
      p = again;  // what a holds now
      std::set<void*> seen;
      std::vector<void*> later;
      for (int i = 0; i < 64 && seen.count(p) == 0; ++i) {
        later.push_back(alloc.allocate_async(mib, sb));
        seen.insert(later.back());
        GPUKIT_CUDA_TRY(sim.device_synchronize());
      }
      CHECK(seen.count(p) == 1);
      CHECK(later.size() <= 12);  // b's 8 cached blocks, then a's memory before new segments
      for (void* q : later) { alloc.deallocate_async(q, mib, sb); }
      CHECK(gpukit::detail::check_invariants(alloc) == "");
      alloc.forget_stream(sa);
      alloc.forget_stream(sb);
    }
  }

  TEST_CASE_FIXTURE(sim_allocator_fixture<>,
                    "record_stream keeps a block until the other stream's work is done")
  {
    void* p = alloc.allocate_async(4 * mib, sa);
    alloc.record_stream(p, sb);
    GPUKIT_CUDA_TRY(sim.stall(sb));
    GPUKIT_CUDA_TRY(sim.memset_async(p, 7, 4 * mib, sb));  // b uses p, still queued
    alloc.deallocate_async(p, 4 * mib, sa);
    CHECK(alloc.stats().active_bytes.current == static_cast<std::int64_t>(4 * mib));  // pending
    auto const pending = alloc.stats().large_pool;  // a pending free stays active in its pool
    CHECK(pending.allocated_bytes.current == 0);
    CHECK(pending.active_bytes.current == static_cast<std::int64_t>(4 * mib));
    CHECK(pending.active_bytes.freed == 0);
    CHECK(pending.active_count.current == 1);
    void* q = alloc.allocate_async(4 * mib, sa);
    CHECK(q != p);  // not even on a: b's work has not run
    alloc.deallocate_async(q, 4 * mib, sa);
    GPUKIT_CUDA_TRY(sim.release(sb));
    GPUKIT_CUDA_TRY(sim.stream_synchronize(sb));
    std::set<void*> seen;
    std::vector<void*> later;
    for (int i = 0; i < 4; ++i) {
      later.push_back(alloc.allocate_async(4 * mib, sa));
      seen.insert(later.back());
    }
    CHECK(seen.count(p) == 1);
    for (void* x : later) { alloc.deallocate_async(x, 4 * mib, sa); }
    CHECK_THROWS_AS(alloc.record_stream(p, sb), gpukit::logic_error);  // p is free now
    CHECK(alloc.stats().large_pool.active_bytes.current == 0);
    CHECK(alloc.stats().large_pool.active_bytes.freed == static_cast<std::int64_t>(24 * mib));
    CHECK(gpukit::detail::check_invariants(alloc) == "");
    alloc.forget_stream(sa);
    alloc.forget_stream(sb);
  }

  TEST_CASE_FIXTURE(sim_allocator_fixture<256 * mib>,
                    "out of device memory: recovery releases cached segments and then reports")
  {
    // Fill the device with 20 MiB segments, then free them all into the cache.
    std::vector<void*> live;
    for (int i = 0; i < 12; ++i) { live.push_back(alloc.allocate_async(20 * mib, sa)); }
    for (void* p : live) { alloc.deallocate_async(p, 20 * mib, sa); }
    live.clear();
    // A request that fits no cached segment: the allocator must give segments back and retry.
    void* big = alloc.allocate_async(200 * mib, sa);
    CHECK(big != nullptr);
    CHECK(alloc.stats().num_alloc_retries <= 1);  // none when the frees landed before the try
    CHECK(alloc.stats().num_device_frees >= 1);
    CHECK(gpukit::detail::check_invariants(alloc) == "");
    try {
      (void)alloc.allocate_async(100 * mib, sa);
      FAIL("the device is full");
    } catch (gpukit::out_of_memory const& e) {
      CHECK(e.report().requested == 100 * mib);
      CHECK(e.report().device_total == 256 * mib);
      CHECK(e.report().allocated == 200 * mib);
      CHECK(e.report().steps.size() >= 2);
    }
    alloc.deallocate_async(big, 200 * mib, sa);
    CHECK(gpukit::detail::check_invariants(alloc) == "");
    alloc.forget_stream(sa);
    alloc.release();
    GPUKIT_CUDA_TRY(sim.device_synchronize());  // stream-ordered frees take effect in order
    CHECK(sim.used_bytes(0) == 0);
  }

  TEST_CASE("every failing runtime call on the allocation path leaves the allocator consistent")
  {
    // A transient out-of-memory (one refusal) is absorbed by the recovery ladder's retry; a
    // persistent one (every try of one allocation refused) surfaces as out_of_memory; any other
    // error surfaces as cuda_error at once. After each, the allocator is consistent, the next
    // allocation works, and nothing leaks.
    struct scenario {
      cudaError_t error;
      int refusals;  // consecutive malloc_async calls refused
      int expected_failures;
    };
    for (scenario const sc :
         {scenario{cudaErrorMemoryAllocation, 1, 0}, scenario{cudaErrorMemoryAllocation, 64, 1},
          scenario{cudaErrorInvalidValue, 1, 1}}) {
      for (std::uint64_t nth = 1; nth <= 6; ++nth) {
        CAPTURE(nth);
        CAPTURE(sc.refusals);
        sim_runtime sim{one_device(1 * gib)};
        {
          sim_allocator alloc{sim, 0};
          stream_holder<sim_runtime> sa{sim}, sb{sim};
          for (int k = 0; k < sc.refusals; ++k) {
            sim.inject_fault(sim_op::malloc_async, nth + static_cast<std::uint64_t>(k), sc.error);
          }
          std::vector<void*> live;
          int failures = 0;
          for (int i = 0; i < 8; ++i) {
            try {
              live.push_back(alloc.allocate_async(30 * mib, sa));
            } catch (gpukit::out_of_memory const&) {
              CHECK(sc.error == cudaErrorMemoryAllocation);
              ++failures;
              sim.clear_faults();  // the device recovers
            } catch (gpukit::cuda_error const& e) {
              CHECK(e.code() == sc.error);
              ++failures;
            }
            CHECK(gpukit::detail::check_invariants(alloc) == "");
          }
          CHECK(failures == sc.expected_failures);
          CHECK(live.size() == static_cast<std::size_t>(8 - sc.expected_failures));
          if (sc.error == cudaErrorMemoryAllocation) {
            CHECK(alloc.stats().num_alloc_retries == 1);
          }
          for (void* p : live) { alloc.deallocate_async(p, 30 * mib, sa); }
          alloc.forget_stream(sa);
          alloc.release();
          CHECK(alloc.stats().reserved_bytes.current == 0);
        }
        GPUKIT_CUDA_TRY(sim.device_synchronize());
        CHECK(sim.used_bytes(0) == 0);  // nothing leaked
      }
    }
  }

  TEST_CASE("segments from cudaMalloc: release counts the frees that may synchronize")
  {
    sim_runtime sim{one_device()};
    gpukit::caching_allocator_options o;
    o.source = gpukit::segment_source::synchronous;
    sim_allocator alloc{sim, 0, o};
    stream_holder<sim_runtime> sa{sim}, sb{sim};
    void* p = alloc.allocate_async(5 * mib, sa);
    alloc.deallocate_async(p, 5 * mib, sa);
    CHECK(sim.calls(sim_op::malloc) == 1);
    CHECK(sim.calls(sim_op::malloc_async) == 0);
    alloc.forget_stream(sa);
    CHECK(alloc.release() == 20 * mib);
    CHECK(alloc.stats().synchronizing_frees == 1);
    CHECK(sim.used_bytes(0) == 0);
  }

  TEST_CASE_FIXTURE(sim_allocator_fixture<>,
                    "statistics: allocated and reserved and peaks and inactive split")
  {
    void* a = alloc.allocate_async(1000, sa);     // 1024 bytes from a 2 MiB small segment
    void* b = alloc.allocate_async(3 * mib, sa);  // 20 MiB medium segment
    auto st = alloc.stats();
    CHECK(st.allocated_bytes.current == 1024 + static_cast<std::int64_t>(3 * mib));
    CHECK(st.requested_bytes.current == 1000 + static_cast<std::int64_t>(3 * mib));
    CHECK(st.reserved_bytes.current == static_cast<std::int64_t>(22 * mib));
    CHECK(st.segment_count.current == 2);
    CHECK(st.allocation_count.current == 2);
    CHECK(st.inactive_split_bytes.current ==
          static_cast<std::int64_t>(22 * mib) - st.allocated_bytes.current);
    alloc.deallocate_async(b, 3 * mib, sa);
    alloc.deallocate_async(a, 1000, sa);
    st = alloc.stats();
    CHECK(st.allocated_bytes.current == 0);
    CHECK(st.allocated_bytes.peak == 1024 + static_cast<std::int64_t>(3 * mib));
    alloc.reset_peak();
    CHECK(alloc.stats().allocated_bytes.peak == 0);
    alloc.forget_stream(sa);
  }

  TEST_CASE_FIXTURE(sim_allocator_fixture<>,
                    "a request the pool cannot serve takes back one cached block that holds it, "
                    "and the rest stays cached")
  {
    // One small segment, full: two blocks cached by this thread, the rest allocated.
    void* a     = alloc.allocate_async(64 * kib, sa);
    void* b     = alloc.allocate_async(8 * kib, sa);
    void* fill1 = alloc.allocate_async(mib, sa);
    void* fill2 = alloc.allocate_async(mib - 72 * kib, sa);
    alloc.deallocate_async(a, 64 * kib, sa);
    alloc.deallocate_async(b, 8 * kib, sa);
    auto const before = alloc.stats();
    REQUIRE(before.cached_bytes == static_cast<std::int64_t>(72 * kib));
    REQUIRE(before.segment_count.current == 1);
    void* c = alloc.allocate_async(16 * kib, sa);  // the 64 KiB block, split; no new segment
    auto const after = alloc.stats();
    CHECK(after.cached_bytes == static_cast<std::int64_t>(8 * kib));
    CHECK(after.segment_count.current == 1);
    CHECK(after.num_device_allocs == before.num_device_allocs);
    CHECK(c == a);
    void* d = alloc.allocate_async(8 * kib, sa);  // a hit: the cached 8 KiB block
    CHECK(d == b);
    CHECK(alloc.stats().num_cache_hits == before.num_cache_hits + 1);
    for (auto [p, n] :
         {std::pair{c, 16 * kib}, {d, 8 * kib}, {fill1, mib}, {fill2, mib - 72 * kib}}) {
      alloc.deallocate_async(p, n, sa);
    }
    alloc.forget_stream(sa);
  }

  TEST_CASE_FIXTURE(sim_allocator_fixture<>,
                    "blocks cached by a thread return to the pool when it exits")
  {
    std::thread{[&] {
      void* p = alloc.allocate_async(mib, sa);
      alloc.deallocate_async(p, mib, sa);
      CHECK(alloc.stats().cached_bytes == static_cast<std::int64_t>(mib));
    }}.join();
    CHECK(alloc.stats().cached_bytes == 0);
    alloc.forget_stream(sa);
    CHECK(alloc.release() == 2 * mib);
  }

  TEST_CASE("a stream forgotten and destroyed is never used again")
  {
    // What the prefetcher does each run (seen crashing on the H200 in libcuda): a batch
    // allocated on the prefetcher's stream, used by the consumer (record_stream), freed on the
    // prefetcher's stream while the consumer's work is pending; then the prefetcher forgets and
    // destroys its stream. When the pending free completes, its block must not go to a pool of
    // the dead stream (a later cross-stream event or segment free there would fail or crash).
    sim_runtime sim{one_device()};
    {
      sim_allocator alloc{sim, 0};
      sim_stream loader{}, consumer{}, other{};
      GPUKIT_CUDA_TRY(sim.stream_create(loader));
      GPUKIT_CUDA_TRY(sim.stream_create(consumer));
      GPUKIT_CUDA_TRY(sim.stream_create(other));
      for (int round = 0; round < 3; ++round) {
        void* p = alloc.allocate_async(64 * mib, loader);
        GPUKIT_CUDA_TRY(sim.stall(consumer));
        GPUKIT_CUDA_TRY(sim.memset_async(p, 1, 64 * mib, consumer));
        alloc.record_stream(p, consumer);
        alloc.deallocate_async(p, 64 * mib, loader);  // pending on consumer's work
        alloc.forget_stream(loader);
        GPUKIT_CUDA_TRY(sim.stream_destroy(loader));
        GPUKIT_CUDA_TRY(sim.release(consumer));
        GPUKIT_CUDA_TRY(sim.stream_synchronize(consumer));
        // Another stream's allocation collects the completed free and looks at other pools.
        void* q = alloc.allocate_async(64 * mib, other);
        CHECK(q == p);  // the freed block, usable by any stream now
        alloc.deallocate_async(q, 64 * mib, other);
        CHECK(gpukit::detail::check_invariants(alloc) == "");
        GPUKIT_CUDA_TRY(sim.stream_create(loader));  // a new stream (a new handle here)
      }
      alloc.forget_stream(other);
      alloc.forget_stream(consumer);
      alloc.forget_stream(loader);
      alloc.release();
      GPUKIT_CUDA_TRY(sim.stream_destroy(loader));
      GPUKIT_CUDA_TRY(sim.stream_destroy(consumer));
      GPUKIT_CUDA_TRY(sim.stream_destroy(other));
    }
    CHECK(sim.misuse_count() == 0);  // no call on a destroyed stream, ever
    CHECK(sim.last_misuse() == "");
  }

  TEST_CASE_FIXTURE(sim_allocator_fixture<>,
                    "a thread alone caches no block over thread_cache_max_block_bytes")
  {
    // Contention raises a thread's admission (up to thread_cache_contended_max_block_bytes); one
    // thread never meets any, so its 2 MiB blocks always go back to the pool, where they coalesce.
    REQUIRE(alloc.options().thread_cache_contended_max_block_bytes >= 4 * mib);
    for (int i = 0; i < 2000; ++i) {
      void* p = alloc.allocate_async(2 * mib, sa);
      alloc.deallocate_async(p, 2 * mib, sa);
    }
    void* small = alloc.allocate_async(mib, sa);  // at the admission: cached
    alloc.deallocate_async(small, mib, sa);
    small = alloc.allocate_async(mib, sa);
    alloc.deallocate_async(small, mib, sa);
    CHECK(alloc.stats().num_cache_hits == 1);
    alloc.forget_stream(sa);
  }

  TEST_CASE("a thread's cached large block never serves a small request")
  {
    // With thread caches over small_request_bytes (set here; contention does it by itself), a
    // cached block of the large pool sits in the size class a request just under 1 MiB looks in
    // when its own class is empty. It must stay there: the pools' blocks and counts stay apart.
    sim_runtime sim{one_device()};
    gpukit::caching_allocator_options o;
    o.thread_cache_max_block_bytes = 2 * mib;
    sim_allocator alloc{sim, 0, o};
    sim_stream s{};
    GPUKIT_CUDA_TRY(sim.stream_create(s));
    void* large = alloc.allocate_async(mib + 32 * 1024, s);
    alloc.deallocate_async(large, mib + 32 * 1024, s);  // cached by this thread
    void* small = alloc.allocate_async(mib - 256, s);
    CHECK(small != large);
    auto const st = alloc.stats();
    CHECK(st.small_pool.allocation_count.current == 1);
    CHECK(st.large_pool.allocation_count.current == 0);
    CHECK(st.num_cache_hits == 0);
    alloc.deallocate_async(small, mib - 256, s);
    CHECK(gpukit::detail::check_invariants(alloc) == "");
    alloc.forget_stream(s);
    alloc.release();
    GPUKIT_CUDA_TRY(sim.stream_destroy(s));
  }

  TEST_CASE_FIXTURE(sim_allocator_fixture<>,
                    "peaks stay true when blocks are freed by other threads")
  {
    // PyTorch frees on its autograd threads: the allocating thread's own count then only grows.
    // The peak must be the most ever allocated at once (1 MiB here), not that count's peak.
    for (int i = 0; i < 50; ++i) {
      void* p = alloc.allocate_async(mib, sa);
      std::thread{[&] { alloc.deallocate_async(p, mib, sa); }}.join();
    }
    auto const st = alloc.stats();
    CHECK(st.allocated_bytes.current == 0);
    CHECK(st.allocated_bytes.peak == static_cast<std::int64_t>(mib));
    CHECK(st.allocation_count.peak == 1);
    alloc.forget_stream(sa);
  }

  TEST_CASE_FIXTURE(sim_allocator_fixture<>,
                    "a block freed by another thread than the one that allocated it")
  {
    void* p = alloc.allocate_async(mib, sa);
    std::thread{[&] { alloc.deallocate_async(p, mib, sa); }}.join();
    CHECK_THROWS_AS(alloc.deallocate_async(p, mib, sa),
                    gpukit::logic_error);  // double free seen here too
    void* q = alloc.allocate_async(mib, sa);
    CHECK(alloc.stats().allocation_count.current == 1);
    alloc.deallocate_async(q, mib, sa);
    CHECK(gpukit::detail::check_invariants(alloc) == "");
    alloc.forget_stream(sa);
  }
}

TEST_SUITE("sim_concurrency")
{
  TEST_CASE("caching allocator stress: threads x streams x random sizes with patterns checked")
  {
    sim_runtime sim{one_device(64 * gib)};
    check_stress(sim, 4, 400, 8 * mib);
  }
}

TEST_SUITE("caching_allocator")
{
  TEST_CASE_FIXTURE(sim_allocator_fixture<>,
                    "graph capture: a private pool and no call that capture forbids")
  {
    // Before the capture: a block freed on a and cached, and a block on b waiting on an event.
    void* before = alloc.allocate_async(mib, sa);
    alloc.deallocate_async(before, mib, sa);

    GPUKIT_CUDA_TRY(sim.begin_capture(sa));
    auto const id                     = alloc.begin_capture(sa);
    std::uint64_t const misuse_before = sim.misuse_count();
    // Inside the capture: never the block cached before it, and segments outside the graph.
    void* g1 = alloc.allocate_async(mib, sa);
    CHECK(g1 != before);
    void* g2 = alloc.allocate_async(30 * mib, sa);
    alloc.deallocate_async(g1, mib, sa);  // freed inside the graph: reusable inside it only
    void* g3 = alloc.allocate_async(mib, sa);
    CHECK(g3 == g1);
    // Other streams keep working, and never get the capture's blocks.
    void* other = alloc.allocate_async(mib, sb);
    CHECK(other != g1);
    alloc.deallocate_async(other, mib, sb);
    CHECK(sim.misuse_count() == misuse_before);   // no forbidden call was made
    CHECK(sim.calls(sim_op::malloc_async) >= 1);  // (before the capture, for `before`)
    alloc.end_capture(sa);
    GPUKIT_CUDA_TRY(sim.end_capture(sa));

    // After the capture, until the pool is released, its blocks stay out of reuse.
    alloc.deallocate_async(g3, mib, sa);
    std::vector<void*> after;
    for (int i = 0; i < 8; ++i) {
      after.push_back(alloc.allocate_async(mib, sa));
      CHECK(after.back() != g1);
    }
    for (void* p : after) { alloc.deallocate_async(p, mib, sa); }
    CHECK_THROWS_AS(alloc.release_capture_pool(id + 100), gpukit::logic_error);
    alloc.release_capture_pool(id);
    alloc.deallocate_async(g2, 30 * mib, sa);  // an ordinary block now
    CHECK(gpukit::detail::check_invariants(alloc) == "");
    // Its memory is everyone's again: released whole.
    alloc.forget_stream(sa);
    alloc.forget_stream(sb);
    CHECK(alloc.release() > 0);
    CHECK(alloc.stats().reserved_bytes.current == 0);
  }

  TEST_CASE_FIXTURE(sim_allocator_fixture<>,
                    "graph capture not announced to the allocator gets a clear error")
  {
    GPUKIT_CUDA_TRY(sim.begin_capture(sa));
    try {
      (void)alloc.allocate_async(mib, sa);
      FAIL("allocating a new segment on a capturing stream must throw");
    } catch (gpukit::logic_error const& e) {
      CHECK(std::string{e.what()}.find("begin_capture") != std::string::npos);
    }
    GPUKIT_CUDA_TRY(sim.end_capture(sa));
    CHECK(gpukit::detail::check_invariants(alloc) == "");
    alloc.forget_stream(sa);
  }
}

TEST_SUITE("caching_allocator")
{
  TEST_CASE_FIXTURE(sim_allocator_fixture<>, "peaks reached on cache hits are seen")
  {
    // Warm the cache with two 64 KiB blocks, then hold both again: only cache hits reach the peak.
    void* a = alloc.allocate_async(65536, sa);
    void* b = alloc.allocate_async(65536, sa);
    alloc.deallocate_async(a, 65536, sa);
    alloc.deallocate_async(b, 65536, sa);
    alloc.reset_peak();
    CHECK(alloc.stats().allocated_bytes.peak == 0);
    auto const hits = alloc.stats().num_cache_hits;
    a               = alloc.allocate_async(65536, sa);
    b               = alloc.allocate_async(65536, sa);
    CHECK(alloc.stats().num_cache_hits == hits + 2);
    alloc.deallocate_async(a, 65536, sa);
    alloc.deallocate_async(b, 65536, sa);
    auto const st = alloc.stats();
    CHECK(st.allocated_bytes.current == 0);
    CHECK(st.allocated_bytes.peak == 2 * 65536);
    CHECK(st.requested_bytes.peak == 2 * 65536);
    CHECK(st.allocation_count.peak == 2);
    alloc.forget_stream(sa);
  }
}
