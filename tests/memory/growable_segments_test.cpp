// SPDX-License-Identifier: Apache-2.0
// Growable segments (segment_source::growable) on the simulated GPU: the conformance cases, the
// fragmentation they remove, transactional mapping under injected faults, and unmapping that waits
// only on the work that used the pages.
#include "memory/allocator_conformance.hpp"

#include "support/caching_allocator.hpp"
#include "support/holders.hpp"
#include "support/sim_gpu.hpp"
#include "support/sizes.hpp"

#include <gpukit/memory/caching_allocator.hpp>
#include <gpukit/memory/detail/allocator_invariants.hpp>
#include <gpukit/memory/ipc.hpp>
#include <gpukit/runtime/sim_runtime.hpp>

#include <doctest/doctest.h>

#include <fcntl.h>

#include <chrono>
#include <future>
#include <random>
#include <vector>

using namespace gpukit::test;
using gpukit::sim_op;
using gpukit::sim_runtime;
using sim_allocator = gpukit::basic_caching_allocator<sim_runtime>;

namespace {

// Growable segments with 2 MiB pages in both pools (the counts below assume it); the conformance
// and stress cases also run with the default page size.
gpukit::caching_allocator_options growable(std::size_t page = 2 * mib)
{
  return segments_from(gpukit::segment_source::growable, page);
}

// Live bytes now and at peak, for the ratio reserved / live.
struct live_meter {
  std::size_t now{0}, peak{0};
  void add(std::size_t b)
  {
    now += b;
    peak = std::max(peak, now);
  }
  void sub(std::size_t b) { now -= b; }
};

// A training-like workload whose shapes change every step (as with varying sequence lengths):
// per step, activations of sizes scaled by a random length, freed in reverse, plus long-lived
// parameters. Returns peak reserved / peak live.
double varying_shapes_ratio(sim_runtime& sim, gpukit::caching_allocator_options const& o,
                            int steps = 40)
{
  sim_allocator alloc{sim, 0, o};
  stream_holder<sim_runtime> s{sim};
  std::mt19937_64 rng{42};
  live_meter live;
  std::vector<std::pair<void*, std::size_t>> params;
  for (int i = 0; i < 24; ++i) {
    std::size_t const b = (std::size_t{3} + static_cast<std::size_t>(i % 5)) * mib + 4096;
    params.emplace_back(alloc.allocate_async(b, s), b);
    live.add(b);
  }
  std::uniform_int_distribution<int> len(64, 1024);
  for (int step = 0; step < steps; ++step) {
    std::size_t const L = static_cast<std::size_t>(len(rng));
    std::vector<std::pair<void*, std::size_t>> acts;
    for (int layer = 0; layer < 12; ++layer) {
      for (std::size_t b : {L * 48 * 1024, L * 12 * 1024 + 512, L * L * 16, L * 3 * 1024}) {
        acts.emplace_back(alloc.allocate_async(b, s), b);
        live.add(b);
      }
      // A temporary that dies at once.
      std::size_t const t = L * 96 * 1024;
      void* tmp           = alloc.allocate_async(t, s);
      live.add(t);
      alloc.deallocate_async(tmp, t, s);
      live.sub(t);
    }
    for (auto it = acts.rbegin(); it != acts.rend(); ++it) {
      alloc.deallocate_async(it->first, it->second, s);
      live.sub(it->second);
    }
  }
  CHECK(gpukit::detail::check_invariants(alloc) == "");
  auto const st = alloc.stats();
  for (auto& [p, b] : params) { alloc.deallocate_async(p, b, s); }
  alloc.forget_stream(s);
  alloc.release();
  CHECK(alloc.stats().reserved_bytes.current == 0);
  return static_cast<double>(st.reserved_bytes.peak) / static_cast<double>(live.peak);
}

}  // namespace

TEST_SUITE("growable_segments")
{
  TEST_CASE("growable conformance: round trip of many sizes")
  {
    sim_runtime sim{one_device()};
    check_alloc_roundtrip(sim, growable());
  }
  TEST_CASE("growable conformance: same-stream reuse")
  {
    sim_runtime sim{one_device()};
    check_same_stream_reuse(sim, growable());
  }
  TEST_CASE("growable conformance: bad input gets a clear error and changes nothing")
  {
    sim_runtime sim{one_device()};
    check_bad_input(sim, growable());
  }
  TEST_CASE("growable conformance: limit and out-of-memory report")
  {
    sim_runtime sim{one_device()};
    check_limit_and_oom_report(sim, growable());
  }
  TEST_CASE("growable stress: threads x streams x random sizes with patterns checked")
  {
    sim_runtime sim{one_device(64 * gib)};
    check_stress(sim, 4, 300, 48 * mib, growable());
    check_stress(sim, 4, 300, 48 * mib, segments_from(gpukit::segment_source::growable));
    check_alloc_roundtrip(sim, segments_from(gpukit::segment_source::growable));
    check_limit_and_oom_report(sim, segments_from(gpukit::segment_source::growable));
    CHECK(sim.misuse_count() == 0);
  }

  TEST_CASE("growable options are checked when the allocator is built")
  {
    sim_runtime sim{one_device()};
    auto o                = growable();
    o.growable_page_bytes = 0;
    CHECK_THROWS_WITH_AS(sim_allocator(sim, 0, o), doctest::Contains("growable_page_bytes"),
                         gpukit::logic_error);
  }

  TEST_CASE("growth maps pages at the end of the free space: one block across what were segments")
  {
    sim_runtime sim{one_device()};
    sim_allocator alloc{sim, 0, growable()};
    stream_holder<sim_runtime> s{sim};
    // 30 MiB, then 50 MiB: the second lies right after the first, in the same address range.
    void* a = alloc.allocate_async(30 * mib, s);
    void* b = alloc.allocate_async(50 * mib, s);
    CHECK(static_cast<char*>(b) == static_cast<char*>(a) + 30 * mib);
    auto st = alloc.stats();
    CHECK(st.reserved_bytes.current == static_cast<std::int64_t>(80 * mib));
    CHECK(st.segment_count.current == 1);
    CHECK(st.num_device_allocs == 40);  // 2 MiB pages mapped
    // Free both: one free block of 80 MiB that a 70 MiB request takes without growing.
    alloc.deallocate_async(a, 30 * mib, s);
    alloc.deallocate_async(b, 50 * mib, s);
    void* c = alloc.allocate_async(70 * mib, s);
    CHECK(c == a);
    CHECK(alloc.stats().reserved_bytes.current == static_cast<std::int64_t>(80 * mib));
    // A request larger than what is free: only the missing pages are mapped.
    alloc.deallocate_async(c, 70 * mib, s);
    void* d = alloc.allocate_async(100 * mib, s);
    CHECK(d == a);
    CHECK(alloc.stats().reserved_bytes.current == static_cast<std::int64_t>(100 * mib));
    CHECK(gpukit::detail::check_invariants(alloc) == "");
    alloc.deallocate_async(d, 100 * mib, s);
    alloc.forget_stream(s);
    CHECK(alloc.release() == 100 * mib);
    CHECK(alloc.stats().reserved_bytes.current == 0);
    CHECK(alloc.stats().segment_count.current == 0);
    CHECK(gpukit::detail::check_invariants(alloc) == "");
    CHECK(sim.used_bytes(0) == 0);
    CHECK(sim.misuse_count() == 0);
  }

  TEST_CASE("free pages of a hole move to where the pool grows instead of new memory")
  {
    sim_runtime sim{one_device()};
    sim_allocator alloc{sim, 0, growable()};
    stream_holder<sim_runtime> s{sim};
    void* a = alloc.allocate_async(40 * mib, s);
    void* b = alloc.allocate_async(8 * mib, s);
    alloc.deallocate_async(a, 40 * mib, s);  // a 40 MiB hole before b
    GPUKIT_CUDA_TRY(sim.stream_synchronize(s));
    // 60 MiB does not fit the hole: the hole's pages are unmapped and mapped after b.
    void* c = alloc.allocate_async(60 * mib, s);
    CHECK(static_cast<char*>(c) >= static_cast<char*>(b) + 8 * mib);
    auto const st = alloc.stats();
    CHECK(st.num_pages_reused == 20);
    CHECK(st.reserved_bytes.peak == static_cast<std::int64_t>(68 * mib));
    CHECK(gpukit::detail::check_invariants(alloc) == "");
    // The memory is usable where it was mapped again.
    fill(sim, c, 60 * mib, 0x3c, s);
    CHECK(holds(sim, c, 60 * mib, 0x3c, s));
    alloc.deallocate_async(b, 8 * mib, s);
    alloc.deallocate_async(c, 60 * mib, s);
    alloc.forget_stream(s);
    alloc.release();
    CHECK(sim.used_bytes(0) == 0);
    CHECK(sim.misuse_count() == 0);
  }

  TEST_CASE("pages whose work is pending are not unmapped for reuse")
  {
    sim_runtime sim{one_device()};
    sim_allocator alloc{sim, 0, growable()};
    stream_holder<sim_runtime> s{sim};
    void* a = alloc.allocate_async(40 * mib, s);
    void* b = alloc.allocate_async(8 * mib, s);
    GPUKIT_CUDA_TRY(sim.stall(s));
    fill(sim, a, 40 * mib, 0x11, s);  // queued: a is in use until s runs
    alloc.deallocate_async(a, 40 * mib, s);
    void* c = alloc.allocate_async(60 * mib, s);  // must not unmap a's pages under the memset
    CHECK(alloc.stats().num_pages_reused == 0);
    CHECK(alloc.stats().reserved_bytes.current == static_cast<std::int64_t>(108 * mib));
    GPUKIT_CUDA_TRY(sim.release(s));
    GPUKIT_CUDA_TRY(sim.stream_synchronize(s));
    CHECK(sim.misuse_count() == 0);
    alloc.deallocate_async(b, 8 * mib, s);
    alloc.deallocate_async(c, 60 * mib, s);
    alloc.forget_stream(s);
    alloc.release();
    CHECK(sim.used_bytes(0) == 0);
  }

  TEST_CASE("release waits for the stream that used the pages and for no other")
  {
    sim_runtime sim{one_device()};
    sim_allocator alloc{sim, 0, growable()};
    stream_holder<sim_runtime> a{sim}, b{sim};
    void* pa = alloc.allocate_async(20 * mib, a);
    void* pb = alloc.allocate_async(20 * mib, b);
    // b is stalled with work queued, but none of its blocks is free: release must not wait on it.
    GPUKIT_CUDA_TRY(sim.stall(b));
    fill(sim, pb, 20 * mib, 0x22, b);
    alloc.deallocate_async(pa, 20 * mib, a);
    auto const t0 = std::chrono::steady_clock::now();
    CHECK(alloc.release() == 20 * mib);
    CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(5));
    // Now a's pages are in use by stalled work on a: release blocks until a runs.
    void* pa2 = alloc.allocate_async(20 * mib, a);
    GPUKIT_CUDA_TRY(sim.stall(a));
    fill(sim, pa2, 20 * mib, 0x33, a);
    alloc.deallocate_async(pa2, 20 * mib, a);
    auto pending = std::async(std::launch::async, [&] { return alloc.release(); });
    CHECK(pending.wait_for(std::chrono::milliseconds(200)) == std::future_status::timeout);
    GPUKIT_CUDA_TRY(sim.release(a));
    CHECK(pending.get() == 20 * mib);
    CHECK(sim.misuse_count() == 0);  // no copy ran into unmapped memory
    GPUKIT_CUDA_TRY(sim.release(b));
    alloc.deallocate_async(pb, 20 * mib, b);
    alloc.forget_stream(a);
    alloc.forget_stream(b);
    alloc.release();
    CHECK(gpukit::detail::check_invariants(alloc) == "");
    CHECK(sim.used_bytes(0) == 0);
  }

  TEST_CASE(
    "every failing map and unmap and create and set-access call leaves the allocator as it was")
  {
    // A workload that grows, reuses pages of holes, and releases; each virtual-memory call in turn
    // fails (out of memory for create, invalid value otherwise). After each failure the allocator
    // is consistent, the next allocation works, and at the end nothing is leaked.
    for (sim_op const op : {sim_op::vm_create, sim_op::vm_map, sim_op::vm_set_access,
                            sim_op::vm_unmap, sim_op::vm_reserve}) {
      for (cudaError_t const error : {cudaErrorMemoryAllocation, cudaErrorInvalidValue}) {
        for (std::uint64_t nth = 1; nth <= 12; ++nth) {
          CAPTURE(gpukit::to_string(op));
          CAPTURE(error);
          CAPTURE(nth);
          sim_runtime sim{one_device(4 * gib)};
          int failures = 0;
          {
            sim_allocator alloc{sim, 0, growable()};
            stream_holder<sim_runtime> s{sim};
            sim.inject_fault(op, nth, error);
            std::vector<std::pair<void*, std::size_t>> live;
            auto attempt = [&](std::size_t bytes) {
              try {
                void* p = alloc.allocate_async(bytes, s);
                fill(sim, p, bytes, 0x5a, s);
                live.emplace_back(p, bytes);
              } catch (gpukit::out_of_memory const&) {
                ++failures;
              } catch (gpukit::cuda_error const& e) {
                CHECK(e.code() == error);
                ++failures;
              }
              CHECK(gpukit::detail::check_invariants(alloc) == "");
            };
            for (std::size_t mb : {6, 30, 3, 50}) { attempt(mb * mib + 4096); }
            // Free the middle ones: holes whose pages the next growth reuses.
            GPUKIT_CUDA_TRY(sim.stream_synchronize(s));
            for (std::size_t i = 1; i < live.size(); i += 2) {
              alloc.deallocate_async(live[i].first, live[i].second, s);
              live[i].first = nullptr;
            }
            for (std::size_t mb : {90, 1, 20}) { attempt(mb * mib); }
            try {
              alloc.release();
            } catch (gpukit::cuda_error const& e) {
              CHECK(e.code() == error);
              ++failures;
            }
            CHECK(gpukit::detail::check_invariants(alloc) == "");
            // Whatever failed, the allocator works now.
            sim.clear_faults();
            void* p = alloc.allocate_async(64 * mib, s);
            fill(sim, p, 64 * mib, 0x77, s);
            CHECK(holds(sim, p, 64 * mib, 0x77, s));
            alloc.deallocate_async(p, 64 * mib, s);
            for (auto& [q, b] : live) {
              if (q != nullptr) {
                CHECK(holds(sim, q, b, 0x5a, s));
                alloc.deallocate_async(q, b, s);
              }
            }
            alloc.forget_stream(s);
            alloc.release();
            CHECK(alloc.stats().reserved_bytes.current == 0);
            CHECK(gpukit::detail::check_invariants(alloc) == "");
          }
          CHECK(failures <= 1);
          CHECK(sim.used_bytes(0) == 0);  // every handle released
          CHECK(sim.misuse_count() == 0);
        }
      }
    }
  }

  TEST_CASE("a device running out of memory: the ladder unmaps free pages and the retry fits")
  {
    sim_runtime sim{one_device(256 * mib)};
    sim_allocator alloc{sim, 0, growable()};
    stream_holder<sim_runtime> a{sim}, b{sim};
    // Stream a maps 200 MiB and frees it; stream b then needs 150 MiB. a's pages are not b's
    // (different streams) while a is busy, so growth needs new memory, the device refuses, and
    // the ladder waits for a's work only, then gives b a's free memory.
    void* p = alloc.allocate_async(200 * mib, a);
    alloc.deallocate_async(p, 200 * mib, a);
    GPUKIT_CUDA_TRY(sim.stall(a));  // a still busy: no page of a's may be taken without a wait
    auto pending =
      std::async(std::launch::async, [&] { return alloc.allocate_async(150 * mib, b); });
    CHECK(pending.wait_for(std::chrono::milliseconds(200)) == std::future_status::timeout);
    GPUKIT_CUDA_TRY(sim.release(a));
    void* q       = pending.get();
    auto const st = alloc.stats();
    CHECK(st.num_alloc_retries == 1);
    CHECK(st.reserved_bytes.current <= static_cast<std::int64_t>(256 * mib));
    CHECK(gpukit::detail::check_invariants(alloc) == "");
    alloc.deallocate_async(q, 150 * mib, b);
    alloc.forget_stream(a);
    alloc.forget_stream(b);
    alloc.release();
    CHECK(sim.used_bytes(0) == 0);
    CHECK(sim.misuse_count() == 0);
  }

  TEST_CASE("varying shapes: growable segments hold at most 1 percent more than peak live")
  {
    sim_runtime sim{one_device(64 * gib)};
    double const grow = varying_shapes_ratio(sim, growable());
    double const fixed =
      varying_shapes_ratio(sim, segments_from(gpukit::segment_source::stream_ordered));
    MESSAGE("peak reserved / peak live: growable " << grow << ", fixed segments " << fixed);
    CHECK(grow <= 1.01);
    CHECK(grow < fixed);
    CHECK(sim.misuse_count() == 0);
  }

  TEST_CASE("an allocator of device 1 maps its pages on device 1 whatever device is current")
  {
    sim_runtime sim{devices(2, gib)};
    GPUKIT_CUDA_TRY(sim.set_device(0));
    sim_allocator alloc{sim, 1, growable()};
    stream_holder<sim_runtime> s{sim, 1};  // a stream of device 1; device 0 stays current
    void* p = alloc.allocate_async(300 * mib, s);
    CHECK(sim.used_bytes(1) >= 300 * mib);
    CHECK(sim.used_bytes(0) == 0);
    int current = -1;
    GPUKIT_CUDA_TRY(sim.get_device(current));
    CHECK(current == 0);
    alloc.deallocate_async(p, 300 * mib, s);
    alloc.forget_stream(s);
    alloc.release();
    CHECK(sim.used_bytes(1) == 0);
    CHECK(sim.misuse_count() == 0);
  }
}

TEST_SUITE("growable_segments")
{
  TEST_CASE("exported handles and imported blocks move: each descriptor and mapping has one owner")
  {
    sim_runtime sim{gpukit::sim_config{}.with_devices(1, 1 * gib)};
    gpukit::caching_allocator_options o = growable();
    o.growable_shareable                = true;
    sim_allocator alloc{sim, 0, o};
    void* a                     = alloc.allocate(3 * mib);
    void* b                     = alloc.allocate(mib);
    gpukit::ipc_block_handle ha = gpukit::export_block(alloc, a);
    gpukit::ipc_block_handle hb = gpukit::export_block(alloc, b);
    REQUIRE(!ha.fds.empty());
    REQUIRE(!hb.fds.empty());
    std::vector<int> const a_fds = ha.fds;
    std::vector<int> const b_fds = hb.fds;

    gpukit::ipc_block_handle h{std::move(ha)};
    CHECK(ha.fds.empty());  // NOLINT(bugprone-use-after-move): moved-from handles own nothing
    CHECK(h.fds == a_fds);
    CHECK(h.bytes == 3 * mib);
    h = std::move(hb);  // a's descriptors are closed, b's taken
    for (int fd : a_fds) { CHECK(::fcntl(fd, F_GETFD) == -1); }
    for (int fd : b_fds) { CHECK(::fcntl(fd, F_GETFD) != -1); }
    CHECK(hb.fds.empty());  // NOLINT(bugprone-use-after-move)
    CHECK(h.fds == b_fds);
    CHECK(h.bytes == mib);

    {
      gpukit::imported_block<sim_runtime> first{sim, h, 0};
      void* const data = first.data();
      REQUIRE(data != nullptr);
      gpukit::imported_block<sim_runtime> second{std::move(first)};
      CHECK(first.data() == nullptr);  // NOLINT(bugprone-use-after-move)
      CHECK(second.data() == data);
      CHECK(second.size() == mib);
      gpukit::imported_block<sim_runtime> third{sim, h, 0};
      third = std::move(second);        // third's own mapping is closed, second's taken
      CHECK(second.data() == nullptr);  // NOLINT(bugprone-use-after-move)
      CHECK(third.data() == data);
      third.close();
      CHECK(third.data() == nullptr);
    }
    h.close_fds();
    alloc.deallocate(a, 3 * mib);
    alloc.deallocate(b, mib);
    CHECK(gpukit::detail::check_invariants(alloc) == "");
    alloc.release();
    CHECK(sim.used_bytes(0) == 0);
    CHECK(sim.misuse_count() == 0);
  }
}
