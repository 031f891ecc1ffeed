// SPDX-License-Identifier: Apache-2.0
// tracking_resource_adaptor on the simulated GPU: what it lists and reports (pointer, size,
// stream, order), the report at its destruction, and the frees it refuses without changing
// anything.
#include "memory/adaptors/mock_resource.hpp"
#include "support/caching_allocator.hpp"
#include "support/sim_gpu.hpp"

#include <gpukit/detail/hex.hpp>
#include <gpukit/memory/adaptors/tracking_resource_adaptor.hpp>
#include <gpukit/memory/caching_allocator.hpp>
#include <gpukit/runtime/sim_runtime.hpp>

#include <doctest/doctest.h>

#include <cstdint>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

using namespace gpukit::test;  // sim_allocator, sim_stream_fixture, mock_resource, mib
using gpukit::sim_runtime;

namespace {

bool contains(std::string const& text, std::string const& part)
{
  return text.find(part) != std::string::npos;
}

}  // namespace

TEST_SUITE("resource_adaptors")
{
  TEST_CASE_FIXTURE(sim_stream_fixture,
                    "tracking: outstanding allocations with pointer, size, stream and order")
  {
    sim_allocator alloc{sim, 0};
    gpukit::tracking_resource_adaptor tracked{alloc};
    void* a = tracked.allocate_async(1000, s);
    void* b = tracked.allocate_async(mib, {});
    void* c = tracked.allocate_async(3000, s);
    tracked.deallocate_async(b, mib, {});
    auto const out = tracked.outstanding();
    REQUIRE(out.size() == 2);
    CHECK(out[0].ptr == a);
    CHECK(out[0].bytes == 1000);
    CHECK(out[0].stream == reinterpret_cast<std::uintptr_t>(s.s));
    CHECK(out[0].sequence == 1);
    CHECK(out[1].ptr == c);
    CHECK(out[1].sequence == 3);
    CHECK(tracked.outstanding_bytes() == 4000);
    std::string const report = tracked.leak_report();
    CAPTURE(report);
    CHECK(report.rfind("gpukit: tracking_resource_adaptor: 2 allocations (4000 bytes)", 0) == 0);
    CHECK(contains(report, gpukit::detail::hex(a) + ": 1000 bytes on stream " +
                             gpukit::detail::hex(reinterpret_cast<std::uintptr_t>(s.s)) +
                             ", allocation 1\n"));
    CHECK(contains(report, gpukit::detail::hex(c) + ": 3000 bytes"));
    CHECK_FALSE(contains(report, gpukit::detail::hex(b)));
    tracked.deallocate_async(a, 1000, s);
    tracked.deallocate_async(c, 3000, s);
    CHECK(tracked.outstanding().empty());
  }

  TEST_CASE("tracking: the destructor reports leaks to the stream given, and only leaks")
  {
    sim_runtime sim{one_device(gib)};
    sim_allocator alloc{sim, 0};
    std::ostringstream clean_report, leak_report;
    void* leaked = nullptr;
    {
      gpukit::tracking_resource_adaptor clean{alloc, &clean_report};
      clean.deallocate_async(clean.allocate_async(512, {}), 512, {});
    }
    CHECK(clean_report.str().empty());
    {
      gpukit::tracking_resource_adaptor leaky{alloc, &leak_report};
      leaked = leaky.allocate_async(2048, {});
    }
    CHECK(leak_report.str() ==
          "gpukit: tracking_resource_adaptor: 1 allocation (2048 bytes) still allocated:\n  " +
            gpukit::detail::hex(leaked) + ": 2048 bytes on stream 0x0, allocation 1\n");
    CHECK(alloc.stats().allocation_count.current == 1);  // the memory stays the upstream's
    alloc.deallocate_async(leaked, 2048, {});
  }

  TEST_CASE(
    "tracking: a foreign pointer, a double free or a wrong size is refused, nothing changed")
  {
    sim_runtime sim{one_device(gib)};
    sim_allocator alloc{sim, 0};
    gpukit::tracking_resource_adaptor tracked{alloc};
    void* mine    = tracked.allocate_async(1024, {});
    void* foreign = alloc.allocate_async(1024, {});
    CHECK_THROWS_WITH_AS(tracked.deallocate_async(foreign, 1024, {}),
                         doctest::Contains(gpukit::detail::hex(foreign).c_str()),
                         gpukit::logic_error);
    CHECK(alloc.stats().allocation_count.current == 2);  // the upstream never saw it
    CHECK_THROWS_WITH_AS(tracked.deallocate_async(mine, 1000, {}),
                         doctest::Contains("1000 bytes; it was allocated with 1024"),
                         gpukit::logic_error);
    CHECK(tracked.outstanding().size() == 1);
    tracked.deallocate_async(mine, 1024, {});
    CHECK_THROWS_AS(tracked.deallocate_async(mine, 1024, {}), gpukit::logic_error);
    CHECK(tracked.outstanding().empty());
    alloc.deallocate_async(foreign, 1024, {});
  }

  TEST_CASE("tracking: an upstream that refuses a free keeps the allocation tracked")
  {
    mock_resource mock;
    gpukit::tracking_resource_adaptor tracked{mock};
    void* p         = tracked.allocate_async(64, {});
    mock.fail_frees = 1;
    CHECK_THROWS_AS(tracked.deallocate_async(p, 64, {}), gpukit::logic_error);
    REQUIRE(tracked.outstanding().size() == 1);
    CHECK(tracked.outstanding()[0].ptr == p);
    CHECK(tracked.outstanding_bytes() == 64);
    tracked.deallocate_async(p, 64, {});
    CHECK(tracked.outstanding().empty());
    CHECK(mock.deallocations == 1);
  }
}

// Threads racing through the adaptor (also run under ThreadSanitizer: the tsan preset).
TEST_SUITE("sim_concurrency")
{
  TEST_CASE("tracking: threads allocating and freeing leave nothing tracked")
  {
    sim_runtime sim{one_device(gib)};
    sim_allocator alloc{sim, 0};
    gpukit::tracking_resource_adaptor tracked{alloc};
    std::vector<std::thread> pool;
    for (int t = 0; t < 4; ++t) {
      pool.emplace_back([&] {
        std::vector<void*> held;
        for (int i = 0; i < 1000; ++i) {
          held.push_back(tracked.allocate_async(256, {}));
          if (held.size() == 16) {
            for (void* p : held) { tracked.deallocate_async(p, 256, {}); }
            held.clear();
          }
        }
        for (void* p : held) { tracked.deallocate_async(p, 256, {}); }
      });
    }
    for (auto& th : pool) { th.join(); }
    CHECK(tracked.outstanding().empty());
    CHECK(tracked.outstanding_bytes() == 0);
  }
}
