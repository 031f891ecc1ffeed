// SPDX-License-Identifier: Apache-2.0
// Out-of-memory recovery on the simulated GPU: the ladder, callbacks, the report, retry_on_oom,
// and a failure injected at every runtime call the allocation path makes.
#include "support/caching_allocator.hpp"
#include "support/fragmented_pool.hpp"
#include "support/holders.hpp"
#include "support/sim_gpu.hpp"
#include "support/sizes.hpp"

#include <gpukit/memory/caching_allocator.hpp>
#include <gpukit/memory/detail/allocator_invariants.hpp>
#include <gpukit/memory/retry_on_oom.hpp>
#include <gpukit/runtime/sim_runtime.hpp>

#include <doctest/doctest.h>

#include <chrono>
#include <string>
#include <thread>
#include <vector>

using namespace gpukit::test;
using gpukit::sim_op;
using gpukit::sim_runtime;
using sim_allocator = gpukit::basic_caching_allocator<sim_runtime>;

TEST_SUITE("oom_recovery")
{
  TEST_CASE(
    "a block that frees only when its stream's work completes is waited for instead of throwing")
  {
    for (bool const release_before_grow : {true, false}) {
      CAPTURE(release_before_grow);
      sim_runtime sim{one_device(64 * mib)};
      gpukit::caching_allocator_options o;
      o.release_before_grow = release_before_grow;
      sim_allocator alloc{sim, 0, o};
      stream_holder<sim_runtime> sa{sim}, sb{sim};
      GPUKIT_CUDA_TRY(sim.stall(sa));
      void* p = alloc.allocate_async(40 * mib, sa);
      GPUKIT_CUDA_TRY(sim.memset_async(p, 1, 40 * mib, sa));  // queued behind the stall
      alloc.deallocate_async(p, 40 * mib, sa);
      // Stream a's work finishes 50 ms from now; b needs the memory p holds.
      std::thread releaser{[&] {
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
        (void)sim.release(sa);
      }};
      sim.reset_counters();
      void* q = nullptr;
      CHECK_NOTHROW(q = alloc.allocate_async(40 * mib, sb));
      releaser.join();
      CHECK(q != nullptr);
      CHECK(sim.calls(sim_op::device_synchronize) == 0);  // waited on a's work only
      auto const st = alloc.stats();
      CHECK(st.num_alloc_retries == 1);
      CHECK(st.num_ooms == 0);
      alloc.deallocate_async(q, 40 * mib, sb);
      CHECK(gpukit::detail::check_invariants(alloc) == "");
      alloc.forget_stream(sa);
      alloc.forget_stream(sb);
    }
  }

  TEST_CASE_FIXTURE(sim_allocator_fixture<64 * mib>,
                    "callbacks run in order without the lock and can ask for another try")
  {
    void* held = alloc.allocate_async(40 * mib, sa);
    std::vector<std::string> order;
    alloc.add_oom_callback([&](gpukit::oom_context const& ctx) {
      order.push_back("first");
      CHECK(ctx.requested == 40 * mib);
      CHECK(ctx.device == 0);
      return false;  // could not help
    });
    alloc.add_oom_callback([&](gpukit::oom_context const&) {
      order.push_back("second");
      alloc.deallocate_async(held, 40 * mib, sa);  // re-enters the allocator: no lock is held
      held = nullptr;
      return true;
    });
    CHECK_THROWS_AS(alloc.add_oom_callback(gpukit::oom_callback{}), gpukit::logic_error);
    void* p = alloc.allocate_async(40 * mib, sa);
    CHECK(p != nullptr);
    CHECK(order == std::vector<std::string>{"first", "second"});
    auto const st = alloc.stats();
    CHECK(st.num_recovery_steps[1] == 2);
    CHECK(st.recovery_bytes[1] >= 40 * mib);
    CHECK(st.num_ooms == 0);
    alloc.deallocate_async(p, 40 * mib, sa);
    CHECK(gpukit::detail::check_invariants(alloc) == "");
    alloc.forget_stream(sa);
  }

  TEST_CASE("on a full device a small request is cut from a free large block, which merges back")
  {
    for (auto source : {gpukit::segment_source::stream_ordered, gpukit::segment_source::synchronous,
                        gpukit::segment_source::growable}) {
      CAPTURE(static_cast<int>(source));
      sim_runtime sim{one_device(256 * mib)};
      sim_allocator alloc{sim, 0, segments_from(source)};
      stream_holder<sim_runtime> s{sim};
      // Large blocks until memory runs out, then every other one freed: about half of it is
      // free, in large blocks that live neighbours keep from being released.
      std::vector<void*> const large = gpukit::test::fill_then_free_every_other(alloc, 5 * mib, s);
      REQUIRE(large.size() > 8);
      // Small requests: small segments cannot grow, so every one comes from a large block.
      std::vector<std::pair<void*, std::size_t>> small;
      std::size_t const sizes[] = {4096, 512, 1024 * 1024, 200 * 1024};
      for (std::size_t i = 0; i < 64; ++i) {
        std::size_t const bytes = sizes[i % std::size(sizes)];
        void* p                 = nullptr;
        REQUIRE_NOTHROW(p = alloc.allocate_async(bytes, s));
        GPUKIT_CUDA_TRY(sim.memset_async(p, static_cast<int>(i), bytes, s));
        small.emplace_back(p, bytes);
      }
      auto const st = alloc.stats();
      CHECK(st.num_ooms == 1);  // the one that filled the device
      CHECK(st.num_recovery_steps[4] > 0);
      CHECK(st.recovery_bytes[4] > 0);
      CHECK(gpukit::detail::check_invariants(alloc) == "");
      for (auto [p, bytes] : small) { alloc.deallocate_async(p, bytes, s); }
      // Given back: the large holes are whole again.
      void* again = nullptr;
      REQUIRE_NOTHROW(again = alloc.allocate_async(5 * mib, s));
      alloc.deallocate_async(again, 5 * mib, s);
      for (void* p : large) {
        if (p != nullptr) { alloc.deallocate_async(p, 5 * mib, s); }
      }
      (void)alloc.release();
      CHECK(alloc.stats().reserved_bytes.current == 0);
      CHECK(gpukit::detail::check_invariants(alloc) == "");
      alloc.forget_stream(s);
    }
  }

  TEST_CASE("the report of a full device names small requests in KiB and blames no fragmentation")
  {
    sim_runtime sim{one_device(64 * mib)};
    sim_allocator alloc{sim, 0};
    stream_holder<sim_runtime> s{sim};
    std::vector<void*> held;
    for (;;) {  // every byte of the device, in small blocks
      try {
        held.push_back(alloc.allocate_async(1024 * 1024, s));
      } catch (gpukit::out_of_memory const&) {
        break;
      }
    }
    try {
      (void)alloc.allocate_async(4096, s);
      FAIL("the device is full");
    } catch (gpukit::out_of_memory const& e) {
      std::string const what = e.what();
      CHECK(what.find("tried to allocate 4.0 KiB (4096 bytes)") != std::string::npos);
      CHECK(e.report().largest_free_block < 4096);
      CHECK(what.find("fragmentation)") == std::string::npos);
    }
    for (void* p : held) { alloc.deallocate_async(p, 1024 * 1024, s); }
    alloc.forget_stream(s);
  }

  TEST_CASE_FIXTURE(sim_allocator_fixture<64 * mib>,
                    "the out-of-memory report: exact fields and a readable message")
  {
    // Four 5 MiB blocks share one 20 MiB segment; freeing the 1st and 3rd leaves two 5 MiB holes.
    std::vector<void*> b;
    for (int i = 0; i < 4; ++i) { b.push_back(alloc.allocate_async(5 * mib, sa)); }
    alloc.deallocate_async(b[0], 5 * mib, sa);
    alloc.deallocate_async(b[2], 5 * mib, sa);
    try {
      (void)alloc.allocate_async(50 * mib, sa);
      FAIL("50 MiB cannot fit beside a 20 MiB segment on a 64 MiB device");
    } catch (gpukit::out_of_memory const& e) {
      auto const& r = e.report();
      CHECK(r.requested == 50 * mib);
      CHECK(r.device == 0);
      CHECK(r.device_total == 64 * mib);
      CHECK(r.device_free == 44 * mib);
      CHECK(r.allocated == 10 * mib);
      CHECK(r.reserved == 20 * mib);
      CHECK(r.total_free_in_pool == 10 * mib);
      CHECK(r.largest_free_block == 5 * mib);
      CHECK(r.fragmentation() == doctest::Approx(0.5));
      CHECK(r.limit == 0);
      REQUIRE(r.cached_per_stream.size() == 1);
      CHECK(r.cached_per_stream[0].bytes == 10 * mib);
      REQUIRE(r.steps.size() == 6);
      CHECK(r.steps[0].attempted);
      CHECK_FALSE(r.steps[1].attempted);  // no callbacks registered
      CHECK(r.steps[2].attempted);
      CHECK(r.steps[2].bytes_reclaimed == 0);  // the segment is in use: nothing to release
      CHECK(r.steps[4].attempted);             // no small block could hold 50 MiB
      CHECK(r.steps[4].bytes_reclaimed == 0);
      CHECK_FALSE(r.steps[5].attempted);  // waiting is off by default
      CHECK(r.hint.find("batch") != std::string::npos);
      std::string const what = e.what();
      CHECK(what.find("tried to allocate 50.0 MiB") != std::string::npos);
      CHECK(what.find("fragmentation 50%") != std::string::npos);
    }
    CHECK(alloc.stats().num_ooms == 1);
    alloc.deallocate_async(b[1], 5 * mib, sa);
    alloc.deallocate_async(b[3], 5 * mib, sa);
    CHECK(gpukit::detail::check_invariants(alloc) == "");
    alloc.forget_stream(sa);
  }

  TEST_CASE_FIXTURE(sim_allocator_fixture<64 * mib>,
                    "retry_on_oom halves the micro-batch until the step fits")
  {
    void* weights   = alloc.allocate_async(20 * mib, sa);  // what the model holds
    int micro_batch = 32;
    int steps_run   = 0;
    auto step       = [&] {
      ++steps_run;
      void* activations = alloc.allocate_async(static_cast<std::size_t>(micro_batch) * 2 * mib, sa);
      alloc.deallocate_async(activations, static_cast<std::size_t>(micro_batch) * 2 * mib, sa);
    };
    auto halve = [&](gpukit::out_of_memory const&, int) -> std::optional<std::string> {
      if (micro_batch == 1) { return std::nullopt; }
      micro_batch /= 2;
      return "micro-batch " + std::to_string(micro_batch);
    };
    auto const report = gpukit::retry_on_oom(alloc, step, halve);
    CHECK(micro_batch == 16);
    CHECK(report.attempts == 2);
    CHECK(steps_run == 2);
    CHECK(report.changes == std::vector<std::string>{"micro-batch 16"});
    REQUIRE(report.failures.size() == 1);
    CHECK(report.failures[0].requested == 64 * mib);
    // A policy that gives up lets the error through.
    micro_batch = 32;
    CHECK_THROWS_AS(gpukit::retry_on_oom(
                      alloc, step, [](auto const&, int) { return std::optional<std::string>{}; }),
                    gpukit::out_of_memory);
    alloc.deallocate_async(weights, 20 * mib, sa);
    alloc.forget_stream(sa);
  }

  TEST_CASE(
    "a failure at every runtime call of the allocation path leaves the allocator consistent")
  {
    // The workload crosses streams, records a stream, runs out of memory and recovers: it makes
    // every kind of call the allocation path makes. Each call is made to fail in turn.
    auto workload = [](sim_runtime& sim, sim_allocator& alloc, sim_stream sa, sim_stream sb,
                       std::vector<std::pair<void*, std::size_t>>& live) {
      auto keep = [&](std::size_t bytes, sim_stream st) {
        live.emplace_back(alloc.allocate_async(bytes, st), bytes);
      };
      keep(3 * mib, sa);
      keep(30 * mib, sa);
      alloc.record_stream(live.back().first, sb);
      alloc.deallocate_async(live.back().first, live.back().second, sa);
      live.pop_back();
      keep(30 * mib, sb);  // crosses streams, or needs the pending block
      alloc.deallocate_async(live.front().first, live.front().second, sa);  // a whole free segment
      live.erase(live.begin());
      keep(25 * mib, sb);  // does not fit beside what is held: segments go back, recovery
      keep(20 * mib, sb);  // the 64 MiB device is full: the whole ladder, then out of memory
      (void)sim;
    };
    int fired = 0;
    for (sim_op op : {sim_op::malloc_async, sim_op::free_async, sim_op::event_create,
                      sim_op::event_record, sim_op::event_query, sim_op::event_synchronize,
                      sim_op::stream_synchronize, sim_op::mem_get_info, sim_op::stream_is_capturing,
                      sim_op::get_device, sim_op::set_device}) {
      for (std::uint64_t nth = 1; nth <= 4; ++nth) {
        std::string const op_name = gpukit::to_string(op);
        CAPTURE(op_name);
        CAPTURE(nth);
        sim_runtime sim{one_device(64 * mib)};
        {
          sim_allocator alloc{sim, 0};
          stream_holder<sim_runtime> sa{sim}, sb{sim};
          std::vector<std::pair<void*, std::size_t>> live;
          sim.inject_fault(op, nth, cudaErrorUnknown);
          try {
            workload(sim, alloc, sa, sb, live);
          } catch (gpukit::cuda_error const&) {
          } catch (gpukit::bad_alloc const&) {}
          if (nth == 1) { fired += sim.pending_faults() == 0 ? 1 : 0; }
          CHECK(gpukit::detail::check_invariants(alloc) == "");
          sim.clear_faults();
          // The next allocation works.
          void* after = nullptr;
          try {
            after = alloc.allocate_async(mib, sa);
          } catch (gpukit::out_of_memory const&) {  // the device may be full of live blocks
            for (auto& [p, n] : live) { alloc.deallocate_async(p, n, sb); }
            live.clear();
            after = alloc.allocate_async(mib, sa);
          }
          CHECK(after != nullptr);
          alloc.deallocate_async(after, mib, sa);
          for (auto& [p, n] : live) { alloc.deallocate_async(p, n, sb); }
          GPUKIT_CUDA_TRY(sim.device_synchronize());
          alloc.forget_stream(sa);
          alloc.forget_stream(sb);
          alloc.release();
          CHECK(gpukit::detail::check_invariants(alloc) == "");
          CHECK(alloc.stats().reserved_bytes.current == 0);
          CHECK(alloc.stats().allocation_count.current == 0);
        }
        GPUKIT_CUDA_TRY(sim.device_synchronize());
        CHECK(sim.used_bytes(0) == 0);  // nothing leaked
      }
    }
    // Every kind of call but the waits, which run only when a stream-ordered free has not landed
    // yet (timing): stream_synchronize is reached in most runs, event_synchronize in few.
    CHECK(fired >= 8);
  }
}
