// SPDX-License-Identifier: Apache-2.0
// The pinned pool on the simulated GPU: the conformance cases, plus what only a simulated GPU can
// show (stalled streams, injected faults, call counters).
#include "support/holders.hpp"
#include "support/pattern.hpp"
#include "support/sim_gpu.hpp"
#include "support/sizes.hpp"
#include "support/transfer_fixture.hpp"

#include <gpukit/host/pinned_pool.hpp>
#include <gpukit/runtime/sim_runtime.hpp>

#include <doctest/doctest.h>

#include <sys/mman.h>

#include <atomic>
#include <fstream>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

using namespace gpukit::test;
using gpukit::sim_op;
using gpukit::sim_runtime;
using sim_pool = gpukit::basic_pinned_pool<sim_runtime>;

namespace {

/// True when every page of [p, p + bytes) is mapped in this process (mincore fails with ENOMEM
/// on an unmapped page).
bool is_mapped(void const* p, std::size_t bytes)
{
  auto const a = reinterpret_cast<std::uintptr_t>(p) & ~std::uintptr_t{4095};
  std::vector<unsigned char> vec((bytes + 4095) / 4096 + 1);
  return ::mincore(reinterpret_cast<void*>(a), bytes, vec.data()) == 0;
}

/// The "VmFlags:" line of /proc/self/smaps for the mapping holding p (" rd wr mr ... hg"), or ""
/// when the kernel does not report it.
std::string vm_flags_of(void const* p)
{
  std::ifstream smaps{"/proc/self/smaps"};
  auto const a = reinterpret_cast<std::uintptr_t>(p);
  std::string line;
  bool inside = false;
  while (std::getline(smaps, line)) {
    unsigned long lo = 0, hi = 0;
    char dash = 0;
    std::istringstream head{line};
    if (line.find(':') == std::string::npos || line.find('-') < line.find(':')) {
      if (head >> std::hex >> lo >> dash >> hi && dash == '-') {
        inside = a >= lo && a < hi;
        continue;
      }
    }
    if (inside && line.rfind("VmFlags:", 0) == 0) { return line.substr(8) + " "; }
  }
  return {};
}

}  // namespace

TEST_SUITE("pinned_pool")
{
  TEST_CASE_FIXTURE(
    sim_transfer_fixture,
    "pinned_pool: a returned buffer is never handed out while its stream's work is pending")
  {
    device_buffer<sim_runtime> dev{sim, mib};
    void* a = pool.allocate(mib);
    fill_pattern(a, mib, 3);
    GPUKIT_CUDA_TRY(sim.stall(s.s));
    GPUKIT_CUDA_TRY(sim.memcpy_async(dev.p, a, mib, gpukit::memcpy_kind::host_to_device, s.s));
    sim.reset_counters();
    pool.deallocate_async(a, s.s);
    CHECK(sim.calls(sim_op::event_record) == 1);  // one pooled event per return and stream
    std::vector<void*> others;
    for (int i = 0; i < 5; ++i) {
      others.push_back(pool.allocate(mib));
      CHECK(others.back() != a);
    }
    CHECK(pool.stats().pending_bytes == static_cast<std::int64_t>(mib));
    CHECK(sim.synchronizations() == 0);  // polled with event_query, never waited on
    CHECK(sim.calls(sim_op::device_synchronize) == 0);
    for (void* p : others) { pool.deallocate(p); }
    // Buffers returned without a stream are reused at once, LIFO; a stays pending.
    void* again = pool.allocate(mib);
    CHECK(again != a);
    pool.deallocate(again);
    GPUKIT_CUDA_TRY(sim.release(s.s));
    GPUKIT_CUDA_TRY(sim.stream_synchronize(s.s));
    std::set<void*> seen;
    std::vector<void*> later;
    for (int i = 0; i < 6; ++i) {
      later.push_back(pool.allocate(mib));
      seen.insert(later.back());
    }
    CHECK(seen.count(a) == 1);
    CHECK(first_mismatch(a, mib, 3) == mib);  // nobody wrote it while it was pending
    for (void* p : later) { pool.deallocate(p); }
    CHECK(pool.stats().pending_bytes == 0);
    CHECK(pool.stats().num_growths == 6);
  }

  TEST_CASE_FIXTURE(sim_transfer_fixture,
                    "pinned_pool: record_stream refuses a destroyed stream when it is named")
  {
    sim_runtime::stream_type dead{};
    GPUKIT_CUDA_TRY(sim.stream_create(dead));
    GPUKIT_CUDA_TRY(sim.stream_destroy(dead));
    void* p = pool.allocate(64 * kib);
    CHECK_THROWS_AS(pool.record_stream(p, dead), gpukit::cuda_error);
    CHECK_THROWS_AS(pool.deallocate_async(p, dead), gpukit::cuda_error);
    CHECK(pool.stats().allocation_count.current == 1);  // still handed out, nothing recorded
    sim.reset_counters();
    pool.deallocate(p);  // no stream was kept: ready at once, no event
    CHECK(sim.calls(sim_op::event_record) == 0);
    void* again = pool.allocate(64 * kib);
    CHECK(again == p);
    pool.deallocate(again);
  }

  TEST_CASE_FIXTURE(
    sim_transfer_fixture,
    "pinned_pool: record_stream makes a return wait on every stream that used the buffer")
  {
    stream_holder<sim_runtime> a{sim}, b{sim};
    GPUKIT_CUDA_TRY(sim.stall(b.s));
    auto buf   = pool.acquire(64 * kib);
    void* addr = buf.data();
    buf.record_stream(b.s);
    pool.record_stream(addr, b.s);  // twice: still one event for b
    sim.reset_counters();
    void* raw = buf.release();
    pool.deallocate_async(raw, a.s);
    CHECK(sim.calls(sim_op::event_record) == 2);
    GPUKIT_CUDA_TRY(sim.stream_synchronize(a.s));
    void* x = pool.allocate(64 * kib);
    CHECK(x != addr);  // a is done, b is not
    pool.deallocate(x);
    GPUKIT_CUDA_TRY(sim.release(b.s));
    GPUKIT_CUDA_TRY(sim.stream_synchronize(b.s));
    void* y = pool.allocate(64 * kib);
    void* z = pool.allocate(64 * kib);
    CHECK((y == addr || z == addr));
    pool.deallocate(y);
    pool.deallocate(z);
  }

  TEST_CASE(
    "pinned_pool: registered user memory is a source of buffers and is unregistered at the end")
  {
    sim_runtime sim{one_device(gib)};
    std::vector<unsigned char> mine(4 * mib + 123);
    {
      sim_pool pool{sim};
      pool.add_host_memory(mine.data(), mine.size());
      CHECK(pool.stats().num_host_registers == 1);
      CHECK(pool.owns(mine.data() + 10, 100));
      void* p = pool.allocate(mib);
      void* q = pool.allocate(2 * mib);
      CHECK(pool.owns(p, mib));
      CHECK(pool.owns(q, 2 * mib));
      CHECK(pool.stats().num_growths == 0);
      CHECK(reinterpret_cast<std::uintptr_t>(p) % 4096 == 0);
      void* r = pool.allocate(2 * mib);  // does not fit what is left: pinned on its own
      CHECK_FALSE(pool.owns(r, 1) == false);
      CHECK(pool.stats().num_growths == 1);
      CHECK(pool.stats().num_host_registers == 2);
      pool.deallocate(p);
      pool.deallocate(q);
      pool.deallocate(r);
      // Registering the same memory twice is the runtime's error, and changes nothing.
      CHECK_THROWS_AS(pool.add_host_memory(mine.data(), 4096), gpukit::cuda_error);
      CHECK(pool.stats().reserved_bytes.current ==
            static_cast<std::int64_t>(mine.size() + 2 * mib));
      CHECK(sim.calls(sim_op::host_unregister) == 0);
    }
    CHECK(sim.calls(sim_op::host_unregister) == 2);  // the user's memory and the pool's own range
    CHECK(sim.calls(sim_op::host_free) == 0);
  }

  TEST_CASE_FIXTURE(sim_transfer_fixture,
                    "pinned_pool: prewarm makes buffers ready with one growth")
  {
    pool.prewarm(3 * mib, 4);
    CHECK(pool.stats().num_growths == 1);
    CHECK(sim.calls(sim_op::host_register) == 1);
    CHECK(pool.stats().cached_bytes.current ==
          static_cast<std::int64_t>(4 * pool.class_size(3 * mib)));
    std::vector<void*> v;
    for (int i = 0; i < 4; ++i) { v.push_back(pool.allocate(3 * mib - 5)); }
    CHECK(pool.stats().num_cache_hits == 4);
    CHECK(pool.stats().num_growths == 1);
    for (void* p : v) { pool.deallocate(p); }
    CHECK_THROWS_AS(pool.prewarm(0, 3), gpukit::logic_error);
  }

  TEST_CASE("pinned_pool: a failing host_alloc leaves the pool unchanged")
  {
    sim_runtime sim{one_device(gib)};
    gpukit::pinned_pool_options o;
    o.growth = gpukit::pinned_growth::host_alloc;
    sim_pool pool{sim, o};
    sim.inject_fault(sim_op::host_alloc, 1, cudaErrorMemoryAllocation);
    CHECK_THROWS_AS((void)pool.allocate(mib), gpukit::cuda_error);
    auto const s = pool.stats();
    CHECK(s.reserved_bytes.current == 0);
    CHECK(s.allocation_count.current == 0);
    CHECK(s.num_allocs == 0);
    void* p = pool.allocate(mib);
    CHECK(pool.stats().reserved_bytes.current == static_cast<std::int64_t>(mib));
    pool.deallocate(p);
  }

  TEST_CASE("pinned_pool: growth maps 2 MiB aligned huge-page memory and registers it")
  {
    sim_runtime sim{one_device(gib)};
    std::size_t const bytes = 48 * mib + 5 * kib;  // not a multiple of a huge page
    void* base              = nullptr;
    {
      gpukit::pinned_pool_options o;
      o.pin_threads = 4;  // 48 MiB: three threads fault it in
      sim_pool pool{sim, o};
      CHECK(pool.options().pin_threads == 4);
      pool.reserve(bytes);
      CHECK(sim.calls(sim_op::host_alloc) == 0);
      CHECK(sim.calls(sim_op::host_register) == 1);
      auto const s = pool.stats();
      CHECK(s.num_growths == 1);
      CHECK(s.num_host_registers == 1);
      CHECK(s.reserved_bytes.current == static_cast<std::int64_t>(bytes));
      void* a = pool.allocate(bytes - 64 * kib);
      base    = a;  // carved from the front of the range
      CHECK(reinterpret_cast<std::uintptr_t>(a) % (2 * mib) == 0);
      CHECK(is_mapped(a, bytes));
      // Fresh anonymous memory: every byte reads zero, then holds what is written.
      auto const* z       = static_cast<unsigned char const*>(a);
      std::size_t nonzero = 0;
      for (std::size_t i = 0; i < bytes; i += 4096) { nonzero += z[i] != 0; }
      CHECK(nonzero == 0);
      fill_pattern(a, bytes - 64 * kib, 21);
      CHECK(first_mismatch(a, bytes - 64 * kib, 21) == bytes - 64 * kib);
      // The kernel was asked for transparent huge pages (VmFlags "hg"), where it reports flags.
      std::string const flags = vm_flags_of(a);
      if (!flags.empty()) { CHECK(flags.find(" hg") != std::string::npos); }
      pool.deallocate(a);
      CHECK(pool.release_cached() == bytes);
      CHECK(sim.calls(sim_op::host_unregister) == 1);
      CHECK(sim.calls(sim_op::host_free) == 0);  // never cudaFreeHost
      CHECK(pool.stats().num_host_unregisters == 1);
      CHECK_FALSE(is_mapped(base, 4096));  // unmapped too
      pool.reserve(4 * mib);               // freed by the destructor the same way
      base = pool.allocate(mib);
      pool.deallocate(base);
    }
    CHECK(sim.calls(sim_op::host_unregister) == 2);
    CHECK(sim.calls(sim_op::host_free) == 0);
    CHECK_FALSE(is_mapped(base, 4096));
  }

  TEST_CASE("pinned_pool: huge pages off maps page-aligned memory without the advice")
  {
    sim_runtime sim{one_device(gib)};
    gpukit::pinned_pool_options o;
    o.huge_pages = false;
    sim_pool pool{sim, o};
    void* a = pool.allocate(3 * mib);
    fill_pattern(a, 3 * mib, 4);
    CHECK(first_mismatch(a, 3 * mib, 4) == 3 * mib);
    std::string const flags = vm_flags_of(a);
    if (!flags.empty()) { CHECK(flags.find(" hg") == std::string::npos); }
    pool.deallocate(a);
  }

  TEST_CASE_FIXTURE(
    sim_transfer_fixture,
    "pinned_pool: a failing host_register of a grown range unmaps it and changes nothing")
  {
    sim.inject_fault(sim_op::host_register, 1, cudaErrorHostMemoryAlreadyRegistered);
    try {
      (void)pool.allocate(5 * mib);
      FAIL("allocate should have thrown");
    } catch (gpukit::cuda_error const& e) {
      CHECK(e.code() == cudaErrorHostMemoryAlreadyRegistered);
      CHECK(std::string{e.what()}.find("host_register") != std::string::npos);
      CHECK(std::string{e.what()}.find("allocate") != std::string::npos);
    }
    auto const s = pool.stats();
    CHECK(s.reserved_bytes.current == 0);
    CHECK(s.num_growths == 0);
    CHECK(s.segment_count.current == 0);
    sim.inject_fault(sim_op::host_register, 1, cudaErrorMemoryAllocation);
    CHECK_THROWS_AS(pool.reserve(8 * mib), gpukit::cuda_error);
    CHECK(pool.stats().reserved_bytes.current == 0);
    pool.prewarm(mib, 2);  // the fault is used up
    CHECK(pool.stats().reserved_bytes.current ==
          static_cast<std::int64_t>(2 * pool.class_size(mib)));
    void* p = pool.allocate(mib);  // from the prewarmed buffers
    CHECK(pool.stats().num_cache_hits == 1);
    pool.deallocate(p);
  }

  TEST_CASE("pinned_pool: the limit counts growth of either kind and bad options are refused")
  {
    sim_runtime sim{one_device(gib)};
    gpukit::pinned_pool_options o;
    o.limit_bytes = 8 * mib;
    sim_pool pool{sim, o};
    pool.reserve(6 * mib);
    CHECK_THROWS_AS(pool.reserve(4 * mib), gpukit::bad_alloc);
    CHECK(sim.calls(sim_op::host_register) == 1);
    gpukit::pinned_pool_options bad;
    bad.pin_threads = -2;
    CHECK_THROWS_WITH_AS(sim_pool(sim, bad), doctest::Contains("pin_threads is -2"),
                         gpukit::logic_error);
  }

  TEST_CASE_FIXTURE(sim_transfer_fixture,
                    "pinned_pool: threads grow the pool at once and every range is distinct")
  {
    std::vector<void*> got(8);
    std::vector<std::thread> ts;
    for (std::size_t t = 0; t < got.size(); ++t) {
      ts.emplace_back([&, t] {
        got[t] = pool.allocate((t + 1) * 3 * mib);
        fill_pattern(got[t], (t + 1) * 3 * mib, static_cast<std::uint32_t>(t));
      });
    }
    for (auto& t : ts) { t.join(); }
    for (std::size_t t = 0; t < got.size(); ++t) {
      CHECK(first_mismatch(got[t], (t + 1) * 3 * mib, static_cast<std::uint32_t>(t)) ==
            (t + 1) * 3 * mib);
      pool.deallocate(got[t]);
    }
    CHECK(pool.stats().num_growths == 8);
    CHECK(sim.calls(sim_op::host_register) == 8);
  }

  TEST_CASE_FIXTURE(sim_transfer_fixture,
                    "pinned_pool: a failing event record leaves the buffer handed out")
  {
    void* p = pool.allocate(mib);
    sim.inject_fault(sim_op::event_record, 1, cudaErrorLaunchFailure);
    CHECK_THROWS_AS(pool.deallocate_async(p, s.s), gpukit::cuda_error);
    CHECK(pool.stats().allocation_count.current == 1);
    pool.deallocate_async(p, s.s);  // may be returned again
    CHECK(pool.stats().allocation_count.current == 0);
  }
}

TEST_SUITE("sim_concurrency")
{
  TEST_CASE_FIXTURE(sim_transfer_fixture,
                    "pinned_pool: threads allocate and fill and return with and without streams")
  {
    pool.reserve(8 * mib);
    constexpr int threads = 6;
    std::atomic<int> bad{0};
    std::vector<std::thread> ts;
    for (int t = 0; t < threads; ++t) {
      ts.emplace_back([&, t] {
        stream_holder<sim_runtime> s{sim};
        std::mt19937 rng{static_cast<unsigned>(t)};
        std::vector<std::pair<void*, std::size_t>> held;
        for (int i = 0; i < 400; ++i) {
          std::size_t const n = 1 + rng() % (300 * kib);
          void* p             = pool.allocate(n);
          auto const seed     = static_cast<std::uint32_t>(t * 100000 + i);
          fill_pattern(p, std::min<std::size_t>(n, 4096), seed);
          held.emplace_back(p, n);
          if (held.size() > 4) {
            auto [q, m] = held.front();
            held.erase(held.begin());
            if (rng() % 2 == 0) {
              pool.deallocate(q);
            } else {
              pool.deallocate_async(q, s.s);
            }
          }
          if (first_mismatch(p, std::min<std::size_t>(n, 4096), seed) !=
              std::min<std::size_t>(n, 4096)) {
            ++bad;
          }
        }
        for (auto [q, m] : held) { pool.deallocate_async(q, s.s); }
        GPUKIT_CUDA_TRY(sim.stream_synchronize(s.s));
      });
    }
    for (auto& t : ts) { t.join(); }
    CHECK(bad.load() == 0);
    auto const st = pool.stats();
    CHECK(st.allocation_count.current == 0);
    CHECK(st.num_allocs == threads * 400);
    CHECK(st.num_frees == threads * 400);
    CHECK(pool.release_cached() == static_cast<std::size_t>(st.reserved_bytes.current));
  }
}
