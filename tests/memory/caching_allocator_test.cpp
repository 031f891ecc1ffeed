// The caching allocator on the simulated GPU: the conformance cases, plus what only a simulated
// GPU can show (stalled streams, injected faults, call counters).
#include "memory/allocator_conformance.hpp"

#include <gpukit/memory/caching_allocator.hpp>
#include <gpukit/memory/detail/allocator_invariants.hpp>
#include <gpukit/runtime/sim_runtime.hpp>

#include <doctest/doctest.h>

#include <set>
#include <thread>

using gpukit::sim_op;
using gpukit::sim_runtime;
using sim_allocator = gpukit::basic_caching_allocator<sim_runtime>;
using stream_t      = sim_runtime::stream_type;

namespace {

constexpr std::size_t MiB = std::size_t{1} << 20;
constexpr std::size_t GiB = std::size_t{1} << 30;

gpukit::sim_config one_device(std::size_t capacity = 16 * GiB)
{
  return gpukit::sim_config{}.with_devices(1, capacity);
}

struct streams2 {
  sim_runtime& rt;
  stream_t a{}, b{};
  explicit streams2(sim_runtime& r) : rt{r}
  {
    GPUKIT_CUDA_TRY(rt.stream_create(a));
    GPUKIT_CUDA_TRY(rt.stream_create(b));
  }
  ~streams2()
  {
    (void)rt.stream_destroy(a);
    (void)rt.stream_destroy(b);
  }
};

}  // namespace

TEST_SUITE("caching_allocator")
{
  // The conformance suite over every segment source (tests/memory/allocator_conformance.hpp).
  GPUKIT_ALLOCATOR_CONFORMANCE_CASES(sim_runtime{one_device()}, "sim_runtime", 4, 400, 8 * MiB)

  TEST_CASE("the hot path makes no runtime call and no synchronization")
  {
    sim_runtime sim{one_device()};
    sim_allocator alloc{sim, 0};
    streams2 s{sim};
    void* p = alloc.allocate_async(65536, s.a);
    alloc.deallocate_async(p, 65536, s.a);
    sim.reset_counters();
    for (int i = 0; i < 10000; ++i) {
      void* q = alloc.allocate_async(65536, s.a);
      alloc.deallocate_async(q, 65536, s.a);
    }
    CHECK(sim.total_calls() == 0);
    CHECK(sim.synchronizations() == 0);
    alloc.forget_stream(s.a);
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
      streams2 s{sim};
      GPUKIT_CUDA_TRY(sim.stall(s.a));
      void* p = alloc.allocate_async(MiB, s.a);
      GPUKIT_CUDA_TRY(sim.memset_async(p, 1, MiB, s.a));  // pending: a is stalled
      alloc.deallocate_async(p, MiB, s.a);
      // Another stream, while a still has work queued before the free: never p.
      std::vector<void*> on_b;
      for (int i = 0; i < 8; ++i) {
        on_b.push_back(alloc.allocate_async(MiB, s.b));
        CHECK(on_b.back() != p);
      }
      for (void* q : on_b) { alloc.deallocate_async(q, MiB, s.b); }
      CHECK(alloc.stats().num_cross_stream_events >= 1);
      // The same stream may reuse it at once: its own later work is ordered after the memset.
      void* again = alloc.allocate_async(MiB, s.a);
      if (!release_before_grow) { CHECK(again == p); }
      alloc.deallocate_async(again, MiB, s.a);
      CHECK(gpukit::detail::check_invariants(alloc) == "");
      // Once a's work has run, b may have it.
      GPUKIT_CUDA_TRY(sim.release(s.a));
      GPUKIT_CUDA_TRY(sim.stream_synchronize(s.a));
      // The allocator records its crossing event lazily, when b runs short; b gets p once that
      // event has completed (device_synchronize lets it complete between attempts,
      // deterministically).
      if (release_before_grow) {  // p went back to the device in a's order: nothing more to see
        alloc.forget_stream(s.a);
        alloc.forget_stream(s.b);
        continue;
      }
      p = again;  // what a holds now
      std::set<void*> seen;
      std::vector<void*> later;
      for (int i = 0; i < 64 && seen.count(p) == 0; ++i) {
        later.push_back(alloc.allocate_async(MiB, s.b));
        seen.insert(later.back());
        GPUKIT_CUDA_TRY(sim.device_synchronize());
      }
      CHECK(seen.count(p) == 1);
      CHECK(later.size() <= 12);  // b's 8 cached blocks, then a's memory before new segments
      for (void* q : later) { alloc.deallocate_async(q, MiB, s.b); }
      CHECK(gpukit::detail::check_invariants(alloc) == "");
      alloc.forget_stream(s.a);
      alloc.forget_stream(s.b);
    }
  }

  TEST_CASE("record_stream keeps a block until the other stream's work is done")
  {
    sim_runtime sim{one_device()};
    sim_allocator alloc{sim, 0};
    streams2 s{sim};
    void* p = alloc.allocate_async(4 * MiB, s.a);
    alloc.record_stream(p, s.b);
    GPUKIT_CUDA_TRY(sim.stall(s.b));
    GPUKIT_CUDA_TRY(sim.memset_async(p, 7, 4 * MiB, s.b));  // b uses p, still queued
    alloc.deallocate_async(p, 4 * MiB, s.a);
    CHECK(alloc.stats().active_bytes.current == static_cast<std::int64_t>(4 * MiB));  // pending
    void* q = alloc.allocate_async(4 * MiB, s.a);
    CHECK(q != p);  // not even on a: b's work has not run
    alloc.deallocate_async(q, 4 * MiB, s.a);
    GPUKIT_CUDA_TRY(sim.release(s.b));
    GPUKIT_CUDA_TRY(sim.stream_synchronize(s.b));
    std::set<void*> seen;
    std::vector<void*> later;
    for (int i = 0; i < 4; ++i) {
      later.push_back(alloc.allocate_async(4 * MiB, s.a));
      seen.insert(later.back());
    }
    CHECK(seen.count(p) == 1);
    for (void* x : later) { alloc.deallocate_async(x, 4 * MiB, s.a); }
    CHECK_THROWS_AS(alloc.record_stream(p, s.b), gpukit::logic_error);  // p is free now
    CHECK(gpukit::detail::check_invariants(alloc) == "");
    alloc.forget_stream(s.a);
    alloc.forget_stream(s.b);
  }

  TEST_CASE("out of device memory: recovery releases cached segments and then reports")
  {
    sim_runtime sim{one_device(256 * MiB)};
    sim_allocator alloc{sim, 0};
    streams2 s{sim};
    // Fill the device with 20 MiB segments, then free them all into the cache.
    std::vector<void*> live;
    for (int i = 0; i < 12; ++i) { live.push_back(alloc.allocate_async(20 * MiB, s.a)); }
    for (void* p : live) { alloc.deallocate_async(p, 20 * MiB, s.a); }
    live.clear();
    // A request that fits no cached segment: the allocator must give segments back and retry.
    void* big = alloc.allocate_async(200 * MiB, s.a);
    CHECK(big != nullptr);
    CHECK(alloc.stats().num_alloc_retries <= 1);  // none when the frees landed before the try
    CHECK(alloc.stats().num_device_frees >= 1);
    CHECK(gpukit::detail::check_invariants(alloc) == "");
    try {
      (void)alloc.allocate_async(100 * MiB, s.a);
      FAIL("the device is full");
    } catch (gpukit::out_of_memory const& e) {
      CHECK(e.report().requested == 100 * MiB);
      CHECK(e.report().device_total == 256 * MiB);
      CHECK(e.report().allocated == 200 * MiB);
      CHECK(e.report().steps.size() >= 2);
    }
    alloc.deallocate_async(big, 200 * MiB, s.a);
    CHECK(gpukit::detail::check_invariants(alloc) == "");
    alloc.forget_stream(s.a);
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
        sim_runtime sim{one_device(1 * GiB)};
        {
          sim_allocator alloc{sim, 0};
          streams2 s{sim};
          for (int k = 0; k < sc.refusals; ++k) {
            sim.inject_fault(sim_op::malloc_async, nth + static_cast<std::uint64_t>(k), sc.error);
          }
          std::vector<void*> live;
          int failures = 0;
          for (int i = 0; i < 8; ++i) {
            try {
              live.push_back(alloc.allocate_async(30 * MiB, s.a));
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
          for (void* p : live) { alloc.deallocate_async(p, 30 * MiB, s.a); }
          alloc.forget_stream(s.a);
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
    streams2 s{sim};
    void* p = alloc.allocate_async(5 * MiB, s.a);
    alloc.deallocate_async(p, 5 * MiB, s.a);
    CHECK(sim.calls(sim_op::malloc) == 1);
    CHECK(sim.calls(sim_op::malloc_async) == 0);
    alloc.forget_stream(s.a);
    CHECK(alloc.release() == 20 * MiB);
    CHECK(alloc.stats().synchronizing_frees == 1);
    CHECK(sim.used_bytes(0) == 0);
  }

  TEST_CASE("statistics: allocated and reserved and peaks and inactive split")
  {
    sim_runtime sim{one_device()};
    sim_allocator alloc{sim, 0};
    streams2 s{sim};
    void* a = alloc.allocate_async(1000, s.a);     // 1024 bytes from a 2 MiB small segment
    void* b = alloc.allocate_async(3 * MiB, s.a);  // 20 MiB medium segment
    auto st = alloc.stats();
    CHECK(st.allocated_bytes.current == 1024 + static_cast<std::int64_t>(3 * MiB));
    CHECK(st.requested_bytes.current == 1000 + static_cast<std::int64_t>(3 * MiB));
    CHECK(st.reserved_bytes.current == static_cast<std::int64_t>(22 * MiB));
    CHECK(st.segment_count.current == 2);
    CHECK(st.allocation_count.current == 2);
    CHECK(st.inactive_split_bytes.current ==
          static_cast<std::int64_t>(22 * MiB) - st.allocated_bytes.current);
    alloc.deallocate_async(b, 3 * MiB, s.a);
    alloc.deallocate_async(a, 1000, s.a);
    st = alloc.stats();
    CHECK(st.allocated_bytes.current == 0);
    CHECK(st.allocated_bytes.peak == 1024 + static_cast<std::int64_t>(3 * MiB));
    alloc.reset_peak();
    CHECK(alloc.stats().allocated_bytes.peak == 0);
    alloc.forget_stream(s.a);
  }

  TEST_CASE("blocks cached by a thread return to the pool when it exits")
  {
    sim_runtime sim{one_device()};
    sim_allocator alloc{sim, 0};
    streams2 s{sim};
    std::thread{[&] {
      void* p = alloc.allocate_async(MiB, s.a);
      alloc.deallocate_async(p, MiB, s.a);
      CHECK(alloc.stats().cached_bytes == static_cast<std::int64_t>(MiB));
    }}.join();
    CHECK(alloc.stats().cached_bytes == 0);
    alloc.forget_stream(s.a);
    CHECK(alloc.release() == 2 * MiB);
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
      stream_t loader{}, consumer{}, other{};
      GPUKIT_CUDA_TRY(sim.stream_create(loader));
      GPUKIT_CUDA_TRY(sim.stream_create(consumer));
      GPUKIT_CUDA_TRY(sim.stream_create(other));
      for (int round = 0; round < 3; ++round) {
        void* p = alloc.allocate_async(64 * MiB, loader);
        GPUKIT_CUDA_TRY(sim.stall(consumer));
        GPUKIT_CUDA_TRY(sim.memset_async(p, 1, 64 * MiB, consumer));
        alloc.record_stream(p, consumer);
        alloc.deallocate_async(p, 64 * MiB, loader);  // pending on consumer's work
        alloc.forget_stream(loader);
        GPUKIT_CUDA_TRY(sim.stream_destroy(loader));
        GPUKIT_CUDA_TRY(sim.release(consumer));
        GPUKIT_CUDA_TRY(sim.stream_synchronize(consumer));
        // Another stream's allocation collects the completed free and looks at other pools.
        void* q = alloc.allocate_async(64 * MiB, other);
        CHECK(q == p);  // the freed block, usable by any stream now
        alloc.deallocate_async(q, 64 * MiB, other);
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

  TEST_CASE("peaks stay true when blocks are freed by other threads")
  {
    // PyTorch frees on its autograd threads: the allocating thread's own count then only grows.
    // The peak must be the most ever allocated at once (1 MiB here), not that count's peak.
    sim_runtime sim{one_device()};
    sim_allocator alloc{sim, 0};
    streams2 s{sim};
    for (int i = 0; i < 50; ++i) {
      void* p = alloc.allocate_async(MiB, s.a);
      std::thread{[&] { alloc.deallocate_async(p, MiB, s.a); }}.join();
    }
    auto const st = alloc.stats();
    CHECK(st.allocated_bytes.current == 0);
    CHECK(st.allocated_bytes.peak == static_cast<std::int64_t>(MiB));
    CHECK(st.allocation_count.peak == 1);
    alloc.forget_stream(s.a);
  }

  TEST_CASE("a block freed by another thread than the one that allocated it")
  {
    sim_runtime sim{one_device()};
    sim_allocator alloc{sim, 0};
    streams2 s{sim};
    void* p = alloc.allocate_async(MiB, s.a);
    std::thread{[&] { alloc.deallocate_async(p, MiB, s.a); }}.join();
    CHECK_THROWS_AS(alloc.deallocate_async(p, MiB, s.a),
                    gpukit::logic_error);  // double free seen here too
    void* q = alloc.allocate_async(MiB, s.a);
    CHECK(alloc.stats().allocation_count.current == 1);
    alloc.deallocate_async(q, MiB, s.a);
    CHECK(gpukit::detail::check_invariants(alloc) == "");
    alloc.forget_stream(s.a);
  }
}

TEST_SUITE("sim_concurrency")
{
  TEST_CASE("caching allocator stress: threads x streams x random sizes with patterns checked")
  {
    sim_runtime sim{one_device(64 * GiB)};
    gpukit::test::check_stress(sim, 4, 400, 8 * MiB);
  }
}

TEST_SUITE("caching_allocator")
{
  TEST_CASE("graph capture: a private pool and no call that capture forbids")
  {
    sim_runtime sim{one_device()};
    sim_allocator alloc{sim, 0};
    streams2 s{sim};
    // Before the capture: a block freed on a and cached, and a block on b waiting on an event.
    void* before = alloc.allocate_async(MiB, s.a);
    alloc.deallocate_async(before, MiB, s.a);

    GPUKIT_CUDA_TRY(sim.begin_capture(s.a));
    auto const id                     = alloc.begin_capture(s.a);
    std::uint64_t const misuse_before = sim.misuse_count();
    // Inside the capture: never the block cached before it, and segments outside the graph.
    void* g1 = alloc.allocate_async(MiB, s.a);
    CHECK(g1 != before);
    void* g2 = alloc.allocate_async(30 * MiB, s.a);
    alloc.deallocate_async(g1, MiB, s.a);  // freed inside the graph: reusable inside it only
    void* g3 = alloc.allocate_async(MiB, s.a);
    CHECK(g3 == g1);
    // Other streams keep working, and never get the capture's blocks.
    void* other = alloc.allocate_async(MiB, s.b);
    CHECK(other != g1);
    alloc.deallocate_async(other, MiB, s.b);
    CHECK(sim.misuse_count() == misuse_before);   // no forbidden call was made
    CHECK(sim.calls(sim_op::malloc_async) >= 1);  // (before the capture, for `before`)
    alloc.end_capture(s.a);
    GPUKIT_CUDA_TRY(sim.end_capture(s.a));

    // After the capture, until the pool is released, its blocks stay out of reuse.
    alloc.deallocate_async(g3, MiB, s.a);
    std::vector<void*> after;
    for (int i = 0; i < 8; ++i) {
      after.push_back(alloc.allocate_async(MiB, s.a));
      CHECK(after.back() != g1);
    }
    for (void* p : after) { alloc.deallocate_async(p, MiB, s.a); }
    CHECK_THROWS_AS(alloc.release_capture_pool(id + 100), gpukit::logic_error);
    alloc.release_capture_pool(id);
    alloc.deallocate_async(g2, 30 * MiB, s.a);  // an ordinary block now
    CHECK(gpukit::detail::check_invariants(alloc) == "");
    // Its memory is everyone's again: released whole.
    alloc.forget_stream(s.a);
    alloc.forget_stream(s.b);
    CHECK(alloc.release() > 0);
    CHECK(alloc.stats().reserved_bytes.current == 0);
  }

  TEST_CASE("graph capture not announced to the allocator gets a clear error")
  {
    sim_runtime sim{one_device()};
    sim_allocator alloc{sim, 0};
    streams2 s{sim};
    GPUKIT_CUDA_TRY(sim.begin_capture(s.a));
    try {
      (void)alloc.allocate_async(MiB, s.a);
      FAIL("allocating a new segment on a capturing stream must throw");
    } catch (gpukit::logic_error const& e) {
      CHECK(std::string{e.what()}.find("begin_capture") != std::string::npos);
    }
    GPUKIT_CUDA_TRY(sim.end_capture(s.a));
    CHECK(gpukit::detail::check_invariants(alloc) == "");
    alloc.forget_stream(s.a);
  }
}

TEST_SUITE("caching_allocator")
{
  TEST_CASE("peaks reached on cache hits are seen")
  {
    sim_runtime sim{one_device()};
    sim_allocator alloc{sim, 0};
    streams2 s{sim};
    // Warm the cache with two 64 KiB blocks, then hold both again: only cache hits reach the peak.
    void* a = alloc.allocate_async(65536, s.a);
    void* b = alloc.allocate_async(65536, s.a);
    alloc.deallocate_async(a, 65536, s.a);
    alloc.deallocate_async(b, 65536, s.a);
    alloc.reset_peak();
    CHECK(alloc.stats().allocated_bytes.peak == 0);
    auto const hits = alloc.stats().num_cache_hits;
    a               = alloc.allocate_async(65536, s.a);
    b               = alloc.allocate_async(65536, s.a);
    CHECK(alloc.stats().num_cache_hits == hits + 2);
    alloc.deallocate_async(a, 65536, s.a);
    alloc.deallocate_async(b, 65536, s.a);
    auto const st = alloc.stats();
    CHECK(st.allocated_bytes.current == 0);
    CHECK(st.allocated_bytes.peak == 2 * 65536);
    CHECK(st.requested_bytes.peak == 2 * 65536);
    CHECK(st.allocation_count.peak == 2);
    alloc.forget_stream(s.a);
  }
}
