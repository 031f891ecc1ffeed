// SPDX-License-Identifier: Apache-2.0
// logging_resource_adaptor on the simulated GPU: the log it writes is an allocation trace that
// gpukit's reader (the one replay_trace uses) reads back with the same events, also when threads
// race on blocks the caching allocator hands out again at once.
#include "memory/adaptors/mock_resource.hpp"
#include "support/caching_allocator.hpp"
#include "support/sim_gpu.hpp"

#include <gpukit/memory/adaptors/logging_resource_adaptor.hpp>
#include <gpukit/memory/allocation_trace.hpp>
#include <gpukit/memory/caching_allocator.hpp>
#include <gpukit/runtime/sim_runtime.hpp>

#include <doctest/doctest.h>

#include <cstdint>
#include <new>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

using namespace gpukit::test;  // sim_allocator, sim_stream_fixture, mock_resource, mib
using gpukit::sim_runtime;

namespace {

gpukit::allocation_trace read_back(std::string const& log)
{
  std::istringstream in{log};
  return gpukit::read_allocation_trace(in, "adaptor log");
}

}  // namespace

TEST_SUITE("resource_adaptors")
{
  TEST_CASE_FIXTURE(sim_stream_fixture, "logging: the log reads back as the trace of what was done")
  {
    sim_allocator alloc{sim, 0};
    std::ostringstream log;
    {
      gpukit::logging_resource_adaptor logged{alloc, log};
      void* a = logged.allocate_async(1000, s);
      void* b = logged.allocate_async(mib, {});
      logged.deallocate_async(a, 1000, s);
      void* c = logged.allocate_async(3000, s);
      logged.deallocate_async(b, mib, {});
      logged.deallocate_async(c, 3000, s);
      logged.flush();
      std::string const text = log.str();
      CHECK(text.rfind("# gpukit logging_resource_adaptor", 0) == 0);
      CHECK(text.find("a " + std::to_string(reinterpret_cast<std::uintptr_t>(a)) + " 1000 " +
                      std::to_string(reinterpret_cast<std::uintptr_t>(s.s)) + "\n") !=
            std::string::npos);
    }
    gpukit::allocation_trace const t = read_back(log.str());
    REQUIRE(t.events.size() == 6);
    CHECK(t.streams == 2);
    CHECK(t.peak_live_bytes == mib + 3000);
    CHECK(t.events[0].alloc);
    CHECK(t.events[0].bytes == 1000);
    CHECK(t.events[1].bytes == mib);
    CHECK(t.events[0].stream != t.events[1].stream);
    CHECK_FALSE(t.events[2].alloc);
    CHECK(t.events[2].id == t.events[0].id);
    CHECK(t.events[3].bytes == 3000);
    CHECK(t.events[3].stream == t.events[0].stream);
  }

  TEST_CASE("logging: a failed allocation is not written")
  {
    mock_resource mock;
    std::ostringstream log;
    gpukit::logging_resource_adaptor logged{mock, log};
    mock.fail_allocs = 1;
    CHECK_THROWS_AS((void)logged.allocate_async(64, {}), std::bad_alloc);
    void* p = logged.allocate_async(64, {});
    logged.deallocate_async(p, 64, {});
    CHECK(read_back(log.str()).events.size() == 2);
  }
}

// Threads racing through the adaptor (also run under ThreadSanitizer: the tsan preset).
TEST_SUITE("sim_concurrency")
{
  TEST_CASE("logging: racing threads reusing blocks at once still write a valid trace")
  {
    // The caching allocator hands a freed block to the next request at once; a free written after
    // another thread's allocation of the same address would make the trace invalid.
    sim_runtime sim{one_device(gib)};
    sim_allocator alloc{sim, 0};
    std::ostringstream log;
    gpukit::logging_resource_adaptor logged{alloc, log};
    int const threads = 4, rounds = 1000;
    std::vector<std::thread> pool;
    for (int t = 0; t < threads; ++t) {
      pool.emplace_back([&] {
        for (int i = 0; i < rounds; ++i) {
          void* p = logged.allocate_async(4096, {});
          logged.deallocate_async(p, 4096, {});
        }
      });
    }
    for (auto& th : pool) { th.join(); }
    gpukit::allocation_trace const t = read_back(log.str());
    CHECK(t.events.size() == 2 * threads * rounds);
    CHECK(t.peak_live_bytes <= 4096 * threads);
  }
}
