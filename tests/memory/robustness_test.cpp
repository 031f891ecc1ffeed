// SPDX-License-Identifier: Apache-2.0
// The caching allocator and the pinned pool where streams die, captures run, memory comes back
// late, the runtime fails in the destructor, and sizes or options are absurd (simulated GPU).
#include "support/caching_allocator.hpp"

#include <gpukit/host/pinned_pool.hpp>
#include <gpukit/memory/caching_allocator.hpp>
#include <gpukit/memory/detail/allocator_invariants.hpp>
#include <gpukit/memory/detail/tlsf_index.hpp>
#include <gpukit/memory/retry_on_oom.hpp>
#include <gpukit/runtime/sim_runtime.hpp>

#include <doctest/doctest.h>

#include <chrono>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <thread>
#include <vector>

using namespace gpukit::test;  // sim_allocator, sim_stream, one_device, mib, gib
using gpukit::sim_op;
using gpukit::sim_runtime;

namespace {

sim_stream new_stream(sim_runtime& sim)
{
  sim_stream s{};
  GPUKIT_CUDA_TRY(sim.stream_create(s));
  return s;
}

/// The logic_error message `f` throws ("" when it does not throw one).
template <class F>
std::string logic_error_of(F&& f)
{
  try {
    f();
  } catch (gpukit::logic_error const& e) {
    return e.what();
  }
  return "";
}

gpukit::caching_allocator_options with_source(gpukit::segment_source source)
{
  gpukit::caching_allocator_options o;
  o.source = source;
  return o;
}

void settle(sim_runtime& sim) { GPUKIT_CUDA_TRY(sim.device_synchronize()); }

constexpr int capture_modes[] = {cudaStreamCaptureModeGlobal, cudaStreamCaptureModeThreadLocal,
                                 cudaStreamCaptureModeRelaxed};

/// `waiter` waits for the work queued on `on` so far (PyTorch's waiter.wait_stream(on)): inside a
/// capture, a fork (waiter joins the capture) or a join (the origin waits for a side stream).
void wait_stream(sim_runtime& sim, sim_stream waiter, sim_stream on)
{
  gpukit::sim_runtime::event_type e{};
  GPUKIT_CUDA_TRY(sim.event_create(e));
  GPUKIT_CUDA_TRY(sim.event_record(e, on));
  GPUKIT_CUDA_TRY(sim.stream_wait_event(waiter, e));
  GPUKIT_CUDA_TRY(sim.event_destroy(e));
}

}  // namespace

TEST_SUITE("robustness")
{
  TEST_CASE("a free on a destroyed stream the allocator never saw leaves it serving")
  {
    sim_runtime sim{one_device(4 * gib)};
    sim_stream const a = new_stream(sim), dead = new_stream(sim), b = new_stream(sim);
    {
      sim_allocator alloc{sim, 0};
      void* p = alloc.allocate_async(4 * mib, a);
      GPUKIT_CUDA_TRY(sim.stream_destroy(dead));
      CHECK_NOTHROW(alloc.deallocate_async(p, 4 * mib, dead));
      CHECK(alloc.stats().num_dead_streams == 1);
      void* q = nullptr;
      CHECK_NOTHROW(q = alloc.allocate_async(4 * mib, b));  // the cross-stream path
      CHECK(q == p);                                        // the block came back, for everyone
      alloc.deallocate_async(q, 4 * mib, b);
      CHECK_NOTHROW(alloc.forget_stream(dead));
      CHECK_NOTHROW(alloc.release());
      CHECK(gpukit::detail::check_invariants(alloc) == "");
    }
    settle(sim);
    CHECK(sim.used_bytes(0) == 0);
    (void)sim.stream_destroy(a);
    (void)sim.stream_destroy(b);
  }

  TEST_CASE(
    "blocks cached for a stream destroyed without forget_stream do not poison the allocator")
  {
    sim_runtime sim{one_device(4 * gib)};
    sim_stream const dead = new_stream(sim), b = new_stream(sim);
    sim_allocator alloc{sim, 0};
    void* p = alloc.allocate_async(4 * mib, dead);
    alloc.deallocate_async(p, 4 * mib, dead);
    GPUKIT_CUDA_TRY(sim.stream_destroy(dead));
    for (int i = 0; i < 3; ++i) {  // every cross-stream allocation, not only the first
      void* q = nullptr;
      CHECK_NOTHROW(q = alloc.allocate_async(4 * mib, b));
      alloc.deallocate_async(q, 4 * mib, b);
      CHECK_NOTHROW(alloc.forget_stream(b));
    }
    CHECK_NOTHROW(alloc.forget_stream(dead));
    CHECK_NOTHROW(alloc.release());
    CHECK(alloc.stats().reserved_bytes.current == 0);
    CHECK(gpukit::detail::check_invariants(alloc) == "");
    (void)sim.stream_destroy(b);
  }

  TEST_CASE("release() returns the segments of a stream destroyed without forget_stream")
  {
    sim_runtime sim{one_device(4 * gib)};
    sim_stream const dead = new_stream(sim);
    sim_allocator alloc{sim, 0};
    alloc.deallocate_async(alloc.allocate_async(64 * mib, dead), 64 * mib, dead);
    GPUKIT_CUDA_TRY(sim.stream_destroy(dead));
    CHECK(alloc.release() >= 64 * mib);  // asked whether it is being captured: it is gone
    CHECK(alloc.stats().reserved_bytes.current == 0);
    GPUKIT_CUDA_TRY(sim.device_synchronize());
    CHECK(sim.used_bytes(0) == 0);
    CHECK(gpukit::detail::check_invariants(alloc) == "");
  }

  TEST_CASE("release and forget_stream survive a stream destroyed while its pool held segments")
  {
    for (auto source : {gpukit::segment_source::stream_ordered, gpukit::segment_source::synchronous,
                        gpukit::segment_source::growable}) {
      CAPTURE(static_cast<int>(source));
      sim_runtime sim{one_device(4 * gib)};
      sim_stream const dead = new_stream(sim), other = new_stream(sim);
      {
        sim_allocator alloc{sim, 0, with_source(source)};
        void* p = alloc.allocate_async(16 * mib, dead);
        void* q = alloc.allocate_async(mib, dead);
        alloc.deallocate_async(p, 16 * mib, dead);
        alloc.deallocate_async(q, mib, dead);
        GPUKIT_CUDA_TRY(sim.stream_destroy(dead));
        CHECK_NOTHROW(alloc.release());
        CHECK_NOTHROW(alloc.forget_stream(dead));
        void* r = nullptr;
        CHECK_NOTHROW(r = alloc.allocate_async(64 * mib, other));
        alloc.deallocate_async(r, 64 * mib, other);
        CHECK_NOTHROW(alloc.forget_stream(other));
        CHECK_NOTHROW(alloc.release());
        CHECK(alloc.stats().reserved_bytes.current == 0);
        CHECK(gpukit::detail::check_invariants(alloc) == "");
      }
      settle(sim);
      CHECK(sim.used_bytes(0) == 0);
      (void)sim.stream_destroy(other);
    }
  }

  TEST_CASE("a free on another device's stream is refused and changes nothing")
  {
    sim_runtime sim{gpukit::sim_config{}.with_devices(2, 4 * gib)};
    GPUKIT_CUDA_TRY(sim.set_device(1));
    sim_stream const other = new_stream(sim);
    GPUKIT_CUDA_TRY(sim.set_device(0));
    sim_allocator alloc{sim, 0};
    void* p                 = alloc.allocate_async(4096, sim_stream{});
    std::string const error = logic_error_of([&] { alloc.deallocate_async(p, 4096, other); });
    CHECK(error.find("device 1") != std::string::npos);
    CHECK(alloc.stats().allocated_bytes.current == 4096);
    CHECK_NOTHROW(alloc.deallocate_async(p, 4096, sim_stream{}));
    CHECK(alloc.stats().allocated_bytes.current == 0);
    (void)sim.stream_destroy(other);
  }

  TEST_CASE("a block whose record_stream stream was destroyed can be freed")
  {
    sim_runtime sim{one_device(4 * gib)};
    sim_stream const a = new_stream(sim), used = new_stream(sim);
    {
      sim_allocator alloc{sim, 0};
      void* p = alloc.allocate_async(4 * mib, a);
      alloc.record_stream(p, used);
      GPUKIT_CUDA_TRY(sim.stream_destroy(used));
      CHECK_NOTHROW(alloc.deallocate_async(p, 4 * mib, a));
      CHECK(alloc.stats().allocated_bytes.current == 0);
      CHECK(alloc.stats().num_dead_streams == 1);
      void* q = alloc.allocate_async(4 * mib, a);
      CHECK(q == p);
      alloc.deallocate_async(q, 4 * mib, a);
      CHECK(gpukit::detail::check_invariants(alloc) == "");
    }
    settle(sim);
    CHECK(sim.used_bytes(0) == 0);
    (void)sim.stream_destroy(a);
  }

  TEST_CASE("pinned_pool: a buffer whose record_stream stream was destroyed comes back")
  {
    sim_runtime sim{one_device(4 * gib)};
    sim_stream const used = new_stream(sim);
    gpukit::basic_pinned_pool<sim_runtime> pool{sim};
    {
      auto buf = pool.acquire(mib);
      buf.record_stream(used);
      GPUKIT_CUDA_TRY(sim.stream_destroy(used));
    }  // ~pinned_buffer
    CHECK(pool.stats().allocated_bytes.current == 0);
    CHECK(pool.stats().num_dead_streams == 1);
    void* p = pool.allocate(mib);
    CHECK(p != nullptr);
    pool.deallocate(p);
  }

  TEST_CASE("release during a graph capture issues no free on the capturing stream")
  {
    sim_runtime sim{one_device(4 * gib)};
    sim_stream const s = new_stream(sim);
    sim_allocator alloc{sim, 0, with_source(gpukit::segment_source::stream_ordered)};
    void* p = alloc.allocate_async(16 * mib, s);
    alloc.deallocate_async(p, 16 * mib, s);
    GPUKIT_CUDA_TRY(sim.begin_capture(s));
    auto const id        = alloc.begin_capture(s);
    auto const frees     = sim.calls(sim_op::free_async);
    std::size_t released = 0;
    CHECK_NOTHROW(released = alloc.release());
    CHECK(released == 0);
    CHECK(sim.calls(sim_op::free_async) == frees);
    alloc.end_capture(s);
    GPUKIT_CUDA_TRY(sim.end_capture(s));
    alloc.release_capture_pool(id);
    CHECK(alloc.release() == 16 * mib);
    GPUKIT_CUDA_TRY(sim.stream_synchronize(s));
    CHECK(sim.used_bytes(0) == 0);
    alloc.forget_stream(s);
    (void)sim.stream_destroy(s);
  }

  TEST_CASE(
    "graph capture: a side stream forked from the capture allocates, frees and "
    "record_streams in every capture mode, and nothing leaks")
  {
    for (int mode : capture_modes) {
      for (auto source : {gpukit::segment_source::stream_ordered,
                          gpukit::segment_source::synchronous, gpukit::segment_source::growable}) {
        INFO("capture mode " << mode << ", segment source " << static_cast<int>(source));
        sim_runtime sim{one_device(4 * gib)};
        sim_stream const s1 = new_stream(sim);  // the graph's stream, used before the capture
        sim_stream const s2 = new_stream(sim);  // first met inside the capture
        sim_allocator alloc{sim, 0, with_source(source)};
        void* warm = alloc.allocate_async(mib, s1);
        alloc.deallocate_async(warm, mib, s1);
        auto const device_asks = sim.calls(sim_op::stream_get_device);

        GPUKIT_CUDA_TRY(sim.begin_capture(s1, mode));
        auto const id     = alloc.begin_capture(s1);
        auto const misuse = sim.misuse_count();
        wait_stream(sim, s2, s1);  // fork: s2 joins the capture
        void* a = alloc.allocate_async(2 * mib, s2);
        GPUKIT_CUDA_TRY(sim.memset_async(a, 7, 2 * mib, s2));  // captured work on s2
        void* b = alloc.allocate_async(mib, s1);
        CHECK(b != warm);  // from the capture's pool, not the cache of before
        alloc.record_stream(b, s2);
        alloc.deallocate_async(a, 2 * mib, s2);  // freed in the graph: reusable in it only
        void* c = alloc.allocate_async(2 * mib, s1);
        CHECK(c == a);                       // one pool for every stream of the capture
        alloc.deallocate_async(b, mib, s1);  // used on s2 too: waits for the capture's end
        CHECK(alloc.stats().active_bytes.current ==
              alloc.stats().allocated_bytes.current + static_cast<std::int64_t>(mib));
        wait_stream(sim, s1, s2);  // join
        CHECK(sim.misuse_count() == misuse);
        CHECK(sim.calls(sim_op::stream_get_device) == device_asks);  // never asked of s2 inside
        alloc.end_capture(s1);
        REQUIRE(sim.end_capture(s1) == cudaSuccess);  // no call invalidated the capture

        // After the capture: s2 is checked at its next use, the deferred free comes back.
        alloc.deallocate_async(c, 2 * mib, s1);
        void* d = alloc.allocate_async(mib, s2);
        CHECK(sim.calls(sim_op::stream_get_device) > device_asks);
        CHECK(d != b);  // the capture's pool keeps its blocks until it is released
        alloc.deallocate_async(d, mib, s2);
        (void)alloc.trim(std::numeric_limits<std::size_t>::max());  // polls pending frees
        CHECK(alloc.stats().active_bytes.current == 0);
        alloc.release_capture_pool(id);
        CHECK(gpukit::detail::check_invariants(alloc) == "");
        alloc.forget_stream(s1);
        alloc.forget_stream(s2);
        CHECK(alloc.release() > 0);
        CHECK(alloc.stats().allocated_bytes.current == 0);
        CHECK(alloc.stats().reserved_bytes.current == 0);
        settle(sim);
        CHECK(sim.used_bytes(0) == 0);
        GPUKIT_CUDA_TRY(sim.stream_destroy(s1));
        GPUKIT_CUDA_TRY(sim.stream_destroy(s2));
      }
    }
  }

  TEST_CASE("graph capture: a second graph on a stream never seen before works in every mode")
  {
    for (int mode : capture_modes) {
      INFO("capture mode " << mode);
      sim_runtime sim{one_device(4 * gib)};
      sim_allocator alloc{sim, 0, with_source(gpukit::segment_source::stream_ordered)};
      sim_stream const first = new_stream(sim);
      GPUKIT_CUDA_TRY(sim.begin_capture(first, mode));
      auto const id1 = alloc.begin_capture(first);
      void* p        = alloc.allocate_async(mib, first);  // first sight, inside the capture
      alloc.deallocate_async(p, mib, first);
      alloc.end_capture(first);
      CHECK(sim.end_capture(first) == cudaSuccess);

      sim_stream const second = new_stream(sim);  // the second graph's stream
      GPUKIT_CUDA_TRY(sim.begin_capture(second, mode));
      auto const id2        = alloc.begin_capture(second);
      void* q               = alloc.allocate_async(3 * mib, second);
      sim_stream const side = new_stream(sim);
      wait_stream(sim, side, second);
      void* r = alloc.allocate_async(mib, side);
      alloc.record_stream(q, side);
      alloc.deallocate_async(q, 3 * mib, second);
      alloc.deallocate_async(r, mib, side);
      wait_stream(sim, second, side);
      alloc.end_capture(second);
      CHECK(sim.end_capture(second) == cudaSuccess);
      CHECK(alloc.stats().active_bytes.current == static_cast<std::int64_t>(3 * mib));
      (void)alloc.trim(std::numeric_limits<std::size_t>::max());
      CHECK(alloc.stats().active_bytes.current == 0);
      alloc.release_capture_pool(id1);
      alloc.release_capture_pool(id2);
      CHECK(gpukit::detail::check_invariants(alloc) == "");
      for (sim_stream s : {first, second, side}) { alloc.forget_stream(s); }
      alloc.release();
      CHECK(alloc.stats().reserved_bytes.current == 0);
      for (sim_stream s : {first, second, side}) { GPUKIT_CUDA_TRY(sim.stream_destroy(s)); }
    }
  }

  TEST_CASE(
    "graph capture: the steps that wait or query skip a stream captured without the "
    "allocator's knowledge")
  {
    sim_runtime sim{one_device(4 * gib)};
    sim_stream const s = new_stream(sim), other = new_stream(sim);
    sim_allocator alloc{sim, 0, with_source(gpukit::segment_source::growable)};
    void* p = alloc.allocate_async(8 * mib, s);
    void* q = alloc.allocate_async(mib, other);
    alloc.record_stream(q, s);
    alloc.deallocate_async(p, 8 * mib, s);
    int relaxed = cudaStreamCaptureModeRelaxed;  // this thread's own unsafe calls are not at stake
    GPUKIT_CUDA_TRY(sim.exchange_capture_mode(relaxed));
    GPUKIT_CUDA_TRY(sim.begin_capture(s, cudaStreamCaptureModeRelaxed));
    auto const misuse = sim.misuse_count();
    alloc.deallocate_async(q, mib, other);              // its use on s waits for the capture's end
    void* big = alloc.allocate_async(64 * mib, other);  // migration and harvest pass s by
    alloc.deallocate_async(big, 64 * mib, other);
    (void)alloc.release();  // s's pages stay: waiting for s would invalidate its capture
    CHECK(logic_error_of([&] { alloc.forget_stream(s); }).find("being captured") !=
          std::string::npos);
    CHECK(sim.misuse_count() == misuse);
    CHECK(sim.end_capture(s) == cudaSuccess);
    GPUKIT_CUDA_TRY(sim.exchange_capture_mode(relaxed));
    (void)alloc.trim(std::numeric_limits<std::size_t>::max());
    CHECK(alloc.stats().active_bytes.current == 0);
    CHECK(gpukit::detail::check_invariants(alloc) == "");
    alloc.forget_stream(s);
    alloc.forget_stream(other);
    CHECK(alloc.release() > 0);
    CHECK(alloc.stats().reserved_bytes.current == 0);
    GPUKIT_CUDA_TRY(sim.stream_destroy(s));
    GPUKIT_CUDA_TRY(sim.stream_destroy(other));
  }

  TEST_CASE("out of memory is never reported while frees release() issued are on their way")
  {
    sim_runtime sim{one_device(gib)};
    sim_stream const busy = new_stream(sim), other = new_stream(sim);
    sim_allocator alloc{sim, 0, with_source(gpukit::segment_source::stream_ordered)};
    void* p = alloc.allocate_async(700 * mib, busy);
    alloc.deallocate_async(p, 700 * mib, busy);
    // The stream is busy for a while: the free release() queues behind that work.
    GPUKIT_CUDA_TRY(sim.launch_host_func(
      busy, [](void*) { std::this_thread::sleep_for(std::chrono::milliseconds(200)); }, nullptr));
    CHECK(alloc.release() == 700 * mib);
    void* q = nullptr;
    CHECK_NOTHROW(q = alloc.allocate_async(700 * mib, other));
    if (q != nullptr) { alloc.deallocate_async(q, 700 * mib, other); }
    alloc.forget_stream(busy);
    alloc.forget_stream(other);
    (void)sim.stream_destroy(busy);
    (void)sim.stream_destroy(other);
  }

  TEST_CASE("retry_on_oom halving the micro-batch succeeds on a small GPU whose stream is busy")
  {
    // retry_on_oom as its header shows it: activations per step, the micro-batch halved on each
    // out-of-memory. The stream is busy computing, so the frees release() issues land late.
    sim_runtime sim{one_device(gib)};
    sim_stream const s = new_stream(sim);
    sim_allocator alloc{sim, 0, with_source(gpukit::segment_source::stream_ordered)};
    int micro_batch = 32;
    auto step       = [&] {
      std::vector<void*> acts;
      try {
        for (int i = 0; i < micro_batch; ++i) {
          acts.push_back(alloc.allocate_async(64 * mib, s));
          GPUKIT_CUDA_TRY(sim.launch_host_func(
                  s, [](void*) { std::this_thread::sleep_for(std::chrono::milliseconds(5)); }, nullptr));
        }
      } catch (...) {
        for (void* p : acts) { alloc.deallocate_async(p, 64 * mib, s); }
        throw;
      }
      for (void* p : acts) { alloc.deallocate_async(p, 64 * mib, s); }
    };
    gpukit::retry_report report;
    CHECK_NOTHROW(
      report = gpukit::retry_on_oom(
        alloc, step, [&](gpukit::out_of_memory const&, int) -> std::optional<std::string> {
          if (micro_batch == 1) { return std::nullopt; }
          micro_batch /= 2;
          return "micro-batch " + std::to_string(micro_batch);
        }));
    CHECK(micro_batch >= 8);  // 8 x 64 MiB fit in 1 GiB: no halving below that
    GPUKIT_CUDA_TRY(sim.stream_synchronize(s));
    alloc.forget_stream(s);
    (void)sim.stream_destroy(s);
  }

  TEST_CASE("the destructor survives a failing get_device or failing frees and returns everything")
  {
    for (sim_op op : {sim_op::get_device, sim_op::free_async, sim_op::device_synchronize,
                      sim_op::event_destroy}) {
      CAPTURE(gpukit::to_string(op));
      sim_runtime sim{one_device(4 * gib)};
      sim_stream const a = new_stream(sim), b = new_stream(sim);
      {
        sim_allocator alloc{sim, 0};
        void* p = alloc.allocate_async(8 * mib, a);
        void* q = alloc.allocate_async(8 * mib, b);
        alloc.deallocate_async(p, 8 * mib, a);
        (void)alloc.allocate_async(8 * mib, b);  // migrates p across: an event to destroy
        alloc.deallocate_async(q, 8 * mib, b);
        sim.inject_fault(op, 1, cudaErrorUnknown);
      }  // must not throw (that would terminate)
      sim.clear_faults();
      settle(sim);
      CHECK(sim.used_bytes(0) == 0);
      (void)sim.stream_destroy(a);
      (void)sim.stream_destroy(b);
    }
  }

  TEST_CASE("the destructor counts what keeps failing")
  {
    sim_runtime sim{one_device(4 * gib)};
    auto const before = gpukit::caching_allocator_teardown_failures();
    {
      sim_allocator alloc{sim, 0, with_source(gpukit::segment_source::synchronous)};
      (void)alloc.allocate_async(mib, sim_stream{});
      sim.inject_fault(sim_op::free, 1, cudaErrorUnknown);
      sim.inject_fault(sim_op::free, 2, cudaErrorUnknown);
    }
    CHECK(gpukit::caching_allocator_teardown_failures() == before + 1);
  }

  TEST_CASE("sizes near SIZE_MAX are refused and never wrapped")
  {
    sim_runtime sim{one_device(std::numeric_limits<std::size_t>::max() / 2)};
    sim_allocator alloc{sim, 0};
    std::size_t const huge = std::numeric_limits<std::size_t>::max() - 10;
    CHECK_THROWS_AS((void)alloc.allocate_async(huge, sim_stream{}), gpukit::bad_alloc);
    CHECK(gpukit::detail::round_up(huge, 256) >= std::size_t{1} << 63);
    std::size_t out = 0;
    CHECK_FALSE(gpukit::detail::checked_round_up(huge, 256, out));
    // The TLSF classes stay inside their arrays for any size.
    CHECK(gpukit::detail::tlsf_floor_class(std::size_t{1} << 50) <
          gpukit::detail::tlsf_class_count);
    CHECK(gpukit::detail::tlsf_floor_class(huge) < gpukit::detail::tlsf_class_count);
    gpukit::detail::tlsf_index<gpukit::detail::caching_block<sim_runtime>> idx;
    gpukit::detail::caching_block<sim_runtime> blk;
    blk.size = mib;
    idx.insert(&blk);
    CHECK(idx.find(std::size_t{1} << 49) == nullptr);
    CHECK(idx.find(std::size_t{1} << 55) == nullptr);
    CHECK(idx.find(huge) == nullptr);
    CHECK(idx.find(mib) == &blk);
  }

  TEST_CASE("absurd options are refused with the field and the value named")
  {
    sim_runtime sim{one_device(4 * gib)};
    auto refused = [&](char const* field, auto&& set) {
      gpukit::caching_allocator_options o;
      set(o);
      std::string const e = logic_error_of([&] { sim_allocator alloc{sim, 0, o}; });
      CAPTURE(field);
      CAPTURE(e);
      CHECK(e.find(field) != std::string::npos);
    };
    std::size_t const max = std::numeric_limits<std::size_t>::max();
    refused("growable_page_bytes", [&](auto& o) {
      o.source              = gpukit::segment_source::growable;
      o.growable_page_bytes = max;
    });
    refused("growable_page_bytes", [&](auto& o) { o.growable_page_bytes = 0; });
    refused("growable_reserve_bytes", [&](auto& o) { o.growable_reserve_bytes = max; });
    refused("small_request_bytes", [&](auto& o) { o.small_request_bytes = 100; });
    refused("small_segment_bytes", [&](auto& o) { o.small_segment_bytes = max; });
    refused("medium_segment_bytes", [&](auto& o) { o.medium_segment_bytes = 0; });
    refused("medium_request_bytes", [&](auto& o) { o.medium_request_bytes = 1000; });
    refused("segment_rounding_bytes", [&](auto& o) { o.segment_rounding_bytes = 0; });
    refused("segment_rounding_bytes", [&](auto& o) { o.segment_rounding_bytes = max; });
    refused("thread_cache_blocks_per_class",
            [&](auto& o) { o.thread_cache_blocks_per_class = 1000; });
    refused("thread_cache_blocks_per_class",
            [&](auto& o) { o.thread_cache_blocks_per_class = -1; });
    refused("oom_wait_for_frees_ms", [&](auto& o) { o.oom_wait_for_frees_ms = -5; });
    refused("limit_fraction", [&](auto& o) { o.limit_fraction = 2.0; });
    refused("source", [&](auto& o) { o.source = static_cast<gpukit::segment_source>(42); });
    CHECK_NOTHROW(sim_allocator{sim, 0, gpukit::caching_allocator_options{}});
  }
}
