// SPDX-License-Identifier: Apache-2.0
// Guard pages of the caching allocator's debug mode (debug.guard_pages, growable segments) on the
// simulated GPU: each block ends where its last mapped page ends, the page after it is reserved
// but unmapped (the simulated GPU rejects any access there, as a real GPU faults), its pages are
// unmapped at its free, new blocks take fresh addresses, the invariants and statistics hold,
// options are checked, and every virtual-memory call of a guarded workload is made to fail once
// (no leak, a clear error, the allocator still serves).
#include "support/caching_allocator.hpp"

#include <gpukit/memory/caching_allocator.hpp>
#include <gpukit/memory/detail/allocator_invariants.hpp>
#include <gpukit/runtime/sim_runtime.hpp>

#include <doctest/doctest.h>

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

using namespace gpukit::test;  // sim_allocator, sim_stream, mib, gib
using gpukit::sim_op;
using gpukit::sim_runtime;

namespace {

constexpr std::size_t granule = std::size_t{64} << 10;  // the simulated GPU's mapping unit here

sim_runtime make_sim(std::size_t capacity = 64 * mib)
{
  return sim_runtime{gpukit::sim_config{}.with_devices(1, capacity).with_vm_granularity(granule)};
}

gpukit::caching_allocator_options guard_options()
{
  gpukit::caching_allocator_options o;
  o.nvtx_annotate          = false;
  o.source                 = gpukit::segment_source::growable;
  o.growable_reserve_bytes = 16 * mib;
  o.debug.guard_pages      = true;
  return o;
}

sim_stream new_stream(sim_runtime& sim)
{
  sim_stream s{};
  GPUKIT_CUDA_TRY(sim.stream_create(s));
  return s;
}

// A simulated GPU, a stream, and a guarded allocator of it (declared last: it goes first).
struct guarded {
  sim_runtime sim;
  sim_stream s{};
  sim_allocator alloc;
  explicit guarded(gpukit::caching_allocator_options o = guard_options(),
                   std::size_t capacity                = 64 * mib)
      : sim{make_sim(capacity)}, s{new_stream(sim)}, alloc{sim, 0, o}
  {}
  ~guarded()
  {
    alloc.forget_stream(s);
    (void)sim.stream_destroy(s);
  }
  guarded(guarded const&)            = delete;
  guarded& operator=(guarded const&) = delete;

  /// Whether the simulated GPU accepts a one-byte write at `p` (it refuses unmapped addresses).
  bool writable(void const* p)
  {
    return sim.memset_async(const_cast<void*>(p), 0x5a, 1, s) == cudaSuccess;
  }
};

std::size_t rounded(std::size_t bytes) { return (bytes + 255) / 256 * 256; }

}  // namespace

TEST_SUITE("caching_allocator_debug")
{
  TEST_CASE("guard pages: a block ends at its page end and the page after it is unmapped")
  {
    guarded g;
    for (std::size_t bytes : {std::size_t{256}, std::size_t{1000}, std::size_t{4096}, granule - 256,
                              granule, granule + 1, 3 * granule + 700, std::size_t{2} * mib}) {
      CAPTURE(bytes);
      auto* p      = static_cast<char*>(g.alloc.allocate_async(bytes, g.s));
      auto const e = g.alloc.extent(p);
      REQUIRE(e.growable);
      CHECK(e.page_bytes == granule);
      CHECK(e.bytes == rounded(bytes));
      // The block ends exactly at a page end: the request ends within the 256-byte alignment slack.
      CHECK((e.offset + e.bytes) % e.page_bytes == 0);
      CHECK(e.bytes - bytes < gpukit::basic_caching_allocator<sim_runtime>::alignment);
      CHECK(g.sim.memset_async(p, 0x11, bytes, g.s) == cudaSuccess);
      CHECK(g.writable(p + e.bytes - 1));
      CHECK_FALSE(g.writable(p + e.bytes));  // one byte past the block: the guard page
      // Inside the reservation (elsewhere the simulated GPU says "not device memory").
      CHECK(g.sim.last_misuse().find("virtual memory not mapped") != std::string::npos);
      CHECK_FALSE(g.writable(p + e.bytes + granule - 1));  // the whole guard page
      CHECK(gpukit::detail::check_invariants(g.alloc) == "");
      g.alloc.deallocate_async(p, bytes, g.s);
    }
    CHECK(gpukit::detail::check_invariants(g.alloc) == "");
  }

  TEST_CASE("guard pages: a free unmaps the block's pages, and a double free is named")
  {
    guarded g;
    auto* p = static_cast<char*>(g.alloc.allocate_async(3 * granule, g.s));
    auto* q = static_cast<char*>(g.alloc.allocate_async(1000, g.s));
    CHECK(g.writable(p));
    auto const frees = g.alloc.stats().num_device_frees;
    g.alloc.deallocate_async(p, 3 * granule, g.s);
    CHECK(g.alloc.stats().num_device_frees == frees + 3);  // its three pages
    CHECK_FALSE(g.writable(p));                            // a use after free is refused
    CHECK_FALSE(g.writable(p + 3 * granule - 1));
    CHECK(g.writable(q));                            // the neighbour stays
    CHECK(g.alloc.debug_quarantined_blocks() == 0);  // no quarantine: the memory is gone
    CHECK_THROWS_WITH_AS(g.alloc.deallocate_async(p, 3 * granule, g.s),
                         doctest::Contains("double free"), gpukit::logic_error);
    CHECK(gpukit::detail::check_invariants(g.alloc) == "");
    // The next block takes fresh addresses, and the spare physical page.
    auto* r = static_cast<char*>(g.alloc.allocate_async(3 * granule, g.s));
    CHECK(r != p);
    CHECK_FALSE(g.writable(p));
    g.alloc.deallocate_async(r, 3 * granule, g.s);
    g.alloc.deallocate_async(q, 1000, g.s);
    CHECK(gpukit::detail::check_invariants(g.alloc) == "");
  }

  TEST_CASE("guard pages: statistics count the blocks and their pages")
  {
    guarded g;
    std::vector<std::pair<void*, std::size_t>> live;
    std::size_t allocated = 0, requested = 0, pages = 0;
    for (std::size_t bytes : {std::size_t{100}, std::size_t{5000}, granule, 2 * granule + 1}) {
      live.emplace_back(g.alloc.allocate_async(bytes, g.s), bytes);
      allocated += rounded(bytes);
      requested += bytes;
      pages += (rounded(bytes) + granule - 1) / granule;
    }
    auto st = g.alloc.stats();
    CHECK(st.allocated_bytes.current == static_cast<std::int64_t>(allocated));
    CHECK(st.requested_bytes.current == static_cast<std::int64_t>(requested));
    CHECK(st.allocation_count.current == 4);
    CHECK(st.reserved_bytes.current == static_cast<std::int64_t>(pages * granule));
    CHECK(st.num_device_allocs == pages);
    CHECK(g.sim.used_bytes(0) == pages * granule);
    for (auto [p, bytes] : live) { g.alloc.deallocate_async(p, bytes, g.s); }
    st = g.alloc.stats();
    CHECK(st.allocated_bytes.current == 0);
    CHECK(st.allocation_count.current == 0);
    CHECK(st.num_device_frees == pages);
    g.alloc.release();
    CHECK(g.alloc.stats().reserved_bytes.current == 0);
    CHECK(g.sim.used_bytes(0) == 0);
    CHECK(gpukit::detail::check_invariants(g.alloc) == "");
  }

  TEST_CASE("guard pages: threads allocating and freeing across each other keep blocks apart")
  {
    guarded g{guard_options(), 128 * mib};
    constexpr int threads = 4, rounds = 150;
    std::vector<std::vector<std::pair<char*, std::size_t>>> handed(threads);
    std::atomic<int> overlaps{0};
    auto worker = [&](int t) {
      std::uint64_t rng = 0x9e3779b97f4a7c15ull * static_cast<std::uint64_t>(t + 1);
      for (int r = 0; r < rounds; ++r) {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        std::size_t const bytes = 1 + rng % (2 * granule);
        auto* p                 = static_cast<char*>(g.alloc.allocate_async(bytes, g.s));
        // Host memory on the simulated GPU: the first and last byte carry the owner.
        p[0] = p[bytes - 1] = static_cast<char>(t + 1);
        std::this_thread::yield();
        if (p[0] != static_cast<char>(t + 1) || p[bytes - 1] != static_cast<char>(t + 1)) {
          overlaps.fetch_add(1);
        }
        handed[static_cast<std::size_t>(t)].emplace_back(p, bytes);
        if (r % 2 == 1) {  // its oldest block (the rest are freed by other threads below)
          auto& mine = handed[static_cast<std::size_t>(t)];
          g.alloc.deallocate_async(mine.front().first, mine.front().second, g.s);
          mine.erase(mine.begin());
        }
      }
    };
    std::vector<std::thread> pool;
    for (int t = 0; t < threads; ++t) { pool.emplace_back(worker, t); }
    for (auto& th : pool) { th.join(); }
    CHECK(overlaps.load() == 0);
    CHECK(gpukit::detail::check_invariants(g.alloc) == "");
    std::size_t live = 0;
    for (auto& list : handed) {
      for (auto [p, bytes] : list) {
        std::thread{[&] { g.alloc.deallocate_async(p, bytes, g.s); }}.join();  // another thread
        ++live;
      }
    }
    CHECK(live == static_cast<std::size_t>(threads * (rounds - rounds / 2)));
    CHECK(g.alloc.stats().allocated_bytes.current == 0);
    CHECK(gpukit::detail::check_invariants(g.alloc) == "");
  }

  TEST_CASE("guard pages: while a graph is captured nothing waits, and blocks take the usual way")
  {
    guarded g;
    void* p = g.alloc.allocate_async(1000, g.s);  // guarded
    GPUKIT_CUDA_TRY(g.sim.begin_capture(g.s));
    auto const id    = g.alloc.begin_capture(g.s);
    auto const waits = g.sim.synchronizations();
    void* q          = g.alloc.allocate_async(1000, g.s);  // from the capture's private pool
    CHECK_FALSE(g.alloc.extent(q).growable);
    CHECK_NOTHROW(g.alloc.deallocate_async(p, 1000, g.s));  // no stream wait during a capture
    CHECK(g.sim.synchronizations() == waits);
    g.alloc.end_capture(g.s);
    GPUKIT_CUDA_TRY(g.sim.end_capture(g.s));
    g.alloc.deallocate_async(q, 1000, g.s);
    g.alloc.release_capture_pool(id);
    CHECK(gpukit::detail::check_invariants(g.alloc) == "");
    void* r = g.alloc.allocate_async(1000, g.s);  // guarded again
    CHECK(g.writable(static_cast<char*>(r) + 1023));
    CHECK_FALSE(g.writable(static_cast<char*>(r) + 1024));
    g.alloc.deallocate_async(r, 1000, g.s);
    CHECK(gpukit::detail::check_invariants(g.alloc) == "");
  }

  TEST_CASE("guard pages need growable segments; over sanitizer_segments they win")
  {
    for (auto source : {gpukit::segment_source::automatic, gpukit::segment_source::stream_ordered,
                        gpukit::segment_source::synchronous}) {
      sim_runtime sim = make_sim();
      auto o          = guard_options();
      o.source        = source;
      CHECK_THROWS_WITH_AS((sim_allocator{sim, 0, o}), doctest::Contains("debug.guard_pages"),
                           gpukit::logic_error);
      CHECK_THROWS_WITH_AS((sim_allocator{sim, 0, o}), doctest::Contains("segment_source::"),
                           gpukit::logic_error);
    }
    sim_runtime sim            = make_sim();
    auto o                     = guard_options();
    o.nvtx_annotate            = true;  // a sanitizer attached
    o.debug.sanitizer_segments = true;
    o.growable_page_bytes      = 8 * mib;
    {
      sim_allocator alloc{sim, 0, o};
      CHECK(alloc.options().debug.enabled);
      CHECK_FALSE(alloc.options().nvtx_annotate);
      void* p = alloc.allocate_async(1000, sim_stream{});
      CHECK(alloc.extent(p).page_bytes == granule);  // guard pages map the smallest page
      alloc.deallocate_async(p, 1000, sim_stream{});
    }
    CHECK(sim.calls(sim_op::malloc) == 0);
    CHECK(sim.calls(sim_op::vm_reserve) == 1);
  }

  TEST_CASE("GPUKIT_DEBUG=guard turns guard pages on where segments are growable")
  {
    CHECK(gpukit::detail::env_names_guard_pages("guard"));
    CHECK(gpukit::detail::env_names_guard_pages("Guard_Pages"));
    CHECK(gpukit::detail::env_names_guard_pages("guard-pages"));
    CHECK_FALSE(gpukit::detail::env_names_guard_pages("1"));
    CHECK_FALSE(gpukit::detail::env_names_guard_pages(nullptr));
    ::setenv("GPUKIT_DEBUG", "guard", 1);
    gpukit::caching_allocator_options o;  // debug mode on; guard pages where they can be
    o.nvtx_annotate = false;
    CHECK(o.debug.enabled);
    CHECK_FALSE(o.debug.guard_pages);
    sim_runtime sim = make_sim();
    {
      o.source = gpukit::segment_source::synchronous;
      sim_allocator plain{sim, 0, o};
      CHECK(plain.options().debug.enabled);
      CHECK_FALSE(plain.options().debug.guard_pages);
      o.source = gpukit::segment_source::growable;
      sim_allocator grow{sim, 0, o};
      CHECK(grow.options().debug.guard_pages);
    }
    ::unsetenv("GPUKIT_DEBUG");
  }

  TEST_CASE("guard pages: each virtual-memory call of a guarded workload made to fail")
  {
    // Counts the calls of a fixed workload, then runs it once per call of each op with that call
    // failing: a clear runtime error (or out of memory), the invariants hold, the allocator serves
    // afterwards, and nothing leaks.
    auto workload = [](guarded& g, std::vector<std::pair<void*, std::size_t>>& live, int& errors) {
      for (std::size_t bytes : {std::size_t{1000}, 2 * granule + 1, std::size_t{300}, granule}) {
        try {
          live.emplace_back(g.alloc.allocate_async(bytes, g.s), bytes);
        } catch (gpukit::cuda_error const& e) {
          CHECK(std::string{e.what()}.find("vm_") != std::string::npos);
          ++errors;
        } catch (gpukit::bad_alloc const&) {
          ++errors;
        }
      }
      while (live.size() > 1) {
        try {
          g.alloc.deallocate_async(live.front().first, live.front().second, g.s);
        } catch (gpukit::cuda_error const& e) {
          CHECK(std::string{e.what()}.find("vm_unmap") != std::string::npos);
          ++errors;
        }
        live.erase(live.begin());
      }
    };
    int tried = 0, failed = 0;
    for (sim_op op : {sim_op::vm_reserve, sim_op::vm_create, sim_op::vm_map, sim_op::vm_set_access,
                      sim_op::vm_unmap, sim_op::vm_release}) {
      std::uint64_t calls = 0;
      {
        guarded g;
        std::vector<std::pair<void*, std::size_t>> live;
        int errors = 0;
        g.sim.reset_counters();
        workload(g, live, errors);
        REQUIRE(errors == 0);
        calls = g.sim.calls(op);
        for (auto [p, bytes] : live) { g.alloc.deallocate_async(p, bytes, g.s); }
      }
      for (std::uint64_t nth = 1; nth <= calls; ++nth) {
        CAPTURE(static_cast<int>(op));
        CAPTURE(nth);
        {
          guarded g;
          std::vector<std::pair<void*, std::size_t>> live;
          int errors = 0;
          g.sim.inject_fault(
            op, nth, op == sim_op::vm_create ? cudaErrorMemoryAllocation : cudaErrorUnknown);
          workload(g, live, errors);
          g.sim.clear_faults();
          ++tried;
          failed += errors != 0 ? 1 : 0;
          CHECK(gpukit::detail::check_invariants(g.alloc) == "");
          void* p = g.alloc.allocate_async(1000, g.s);  // still serves
          live.emplace_back(p, 1000);
          for (auto [q, bytes] : live) { g.alloc.deallocate_async(q, bytes, g.s); }
          CHECK(gpukit::detail::check_invariants(g.alloc) == "");
          g.alloc.release();
          CHECK(g.alloc.stats().reserved_bytes.current == 0);
          CHECK(g.sim.used_bytes(0) == 0);
        }
      }
    }
    MESSAGE("guard-page fault points tried: " << tried << ", with an error: " << failed);
    CHECK(tried > 10);
  }
}
