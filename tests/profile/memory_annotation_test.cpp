// SPDX-License-Identifier: Apache-2.0
// What the memory annotation hooks tell an NVTX tool (the test tool records the NVTX memory API
// and counters calls): a pool's segment is a sub-allocator heap, its blocks are regions.
#include "nvtx_test_support.hpp"

#include <gpukit/profile/memory_annotation.hpp>

#include <doctest/doctest.h>

#include <cstdlib>
#include <string>

#include <cstdint>
#include <string>
#include <thread>
#include <vector>

namespace {

bool const tool_attached = gpukit_test::attach_nvtx_tool();

using gpukit_test::addr;

struct fake_stats {
  struct pair {
    std::int64_t current{0};
    std::int64_t peak{0};
  };
  pair allocated_bytes{10, 20}, reserved_bytes{30, 40}, active_bytes{11, 12}, requested_bytes{9, 9};
};

}  // namespace

TEST_SUITE("profile")
{
  TEST_CASE("nvtx_tool_configured follows NVTX_INJECTION64_PATH")
  {
    char const* was         = std::getenv("NVTX_INJECTION64_PATH");
    std::string const saved = was != nullptr ? was : "";
    ::unsetenv("NVTX_INJECTION64_PATH");
    CHECK_FALSE(gpukit::nvtx_tool_configured());
    ::setenv("NVTX_INJECTION64_PATH", "/nonexistent/libtool.so", 1);
    CHECK(gpukit::nvtx_tool_configured());
    if (was != nullptr) {
      ::setenv("NVTX_INJECTION64_PATH", saved.c_str(), 1);
    } else {
      ::unsetenv("NVTX_INJECTION64_PATH");
    }
  }

  TEST_CASE("a segment is a sub-allocator heap and its blocks are regions")
  {
    REQUIRE(tool_attached);
    gpukit_test::clear_nvtx_records();
    std::vector<char> segment(1 << 16);
    char* const base = segment.data();

    gpukit::memory_heap heap = gpukit::register_memory_heap(base, segment.size(), "gpukit pool");
    gpukit::register_memory_region(heap, base, 256);
    gpukit::register_memory_region(heap, base + 256, 512);
    gpukit::name_memory_region(base + 256, "activations");
    gpukit::resize_memory_region(base + 256, 1024);
    gpukit::unregister_memory_region(base);
    gpukit::reset_memory_heap(heap);
    gpukit::unregister_memory_heap(heap);

    auto const recs = gpukit_test::nvtx_records();
    std::vector<int> kinds;
    for (auto const& r : recs) {
      if (r.kind >= gpukit_nvtx_heap_register && r.kind <= gpukit_nvtx_region_name) {
        kinds.push_back(r.kind);
      }
    }
    CHECK(kinds == std::vector<int>{gpukit_nvtx_heap_register, gpukit_nvtx_region_register,
                                    gpukit_nvtx_region_register, gpukit_nvtx_region_name,
                                    gpukit_nvtx_region_resize, gpukit_nvtx_region_unregister,
                                    gpukit_nvtx_heap_reset, gpukit_nvtx_heap_unregister});
    auto const heaps = gpukit_test::nvtx_records_of(gpukit_nvtx_heap_register);
    REQUIRE(heaps.size() == 1);
    CHECK(std::string{heaps[0].domain} == "gpukit");
    CHECK(heaps[0].usage == NVTX_MEM_HEAP_USAGE_TYPE_SUB_ALLOCATOR);
    CHECK(heaps[0].type == NVTX_MEM_TYPE_VIRTUAL_ADDRESS);
    CHECK(heaps[0].address == addr(base));
    CHECK(heaps[0].size == segment.size());
    CHECK(std::string{heaps[0].message} == "gpukit pool");
    CHECK(heaps[0].heap == reinterpret_cast<std::uintptr_t>(heap));

    auto const regions = gpukit_test::nvtx_records_of(gpukit_nvtx_region_register);
    REQUIRE(regions.size() == 2);
    CHECK(regions[0].heap == heaps[0].heap);
    CHECK(regions[0].address == addr(base));
    CHECK(regions[0].size == 256);
    CHECK(regions[1].address == addr(base + 256));
    CHECK(regions[1].size == 512);
    CHECK(regions[1].type == NVTX_MEM_TYPE_VIRTUAL_ADDRESS);

    auto const names = gpukit_test::nvtx_records_of(gpukit_nvtx_region_name);
    REQUIRE(names.size() == 1);
    CHECK(std::string{names[0].message} == "activations");
    auto const resized = gpukit_test::nvtx_records_of(gpukit_nvtx_region_resize);
    REQUIRE(resized.size() == 1);
    CHECK(resized[0].size == 1024);
    auto const freed = gpukit_test::nvtx_records_of(gpukit_nvtx_region_unregister);
    REQUIRE(freed.size() == 1);
    CHECK(freed[0].address == addr(base));
    CHECK(gpukit_test::nvtx_records_of(gpukit_nvtx_heap_unregister)[0].heap == heaps[0].heap);
  }

  TEST_CASE("allocator statistics are published as int64 NVTX counters")
  {
    REQUIRE(tool_attached);
    gpukit_test::clear_nvtx_records();
    gpukit::allocator_counters counters{"device 0"};
    counters.sample(fake_stats{});
    gpukit::nvtx_counter single{"gpukit oom retries", "out-of-memory recoveries"};
    single.sample(-3);

    auto const registered = gpukit_test::nvtx_records_of(gpukit_nvtx_counter_register);
    REQUIRE(registered.size() == 5);
    CHECK(std::string{registered[0].message} == "device 0 allocated bytes");
    CHECK(std::string{registered[1].message} == "device 0 reserved bytes");
    CHECK(std::string{registered[2].message} == "device 0 active bytes");
    CHECK(std::string{registered[3].message} == "device 0 requested bytes");
    CHECK(registered[0].type == NVTX_PAYLOAD_ENTRY_TYPE_INT64);
    CHECK(std::string{registered[0].domain} == "gpukit");
    CHECK(single.id() == registered[4].id);

    auto const samples = gpukit_test::nvtx_records_of(gpukit_nvtx_counter_sample);
    REQUIRE(samples.size() == 5);
    CHECK(samples[0].id == registered[0].id);
    CHECK(samples[0].payload_i == 10);
    CHECK(samples[1].payload_i == 30);
    CHECK(samples[2].payload_i == 11);
    CHECK(samples[3].payload_i == 9);
    CHECK(samples[4].payload_i == -3);
  }
}

TEST_SUITE("sim_concurrency")
{
  TEST_CASE("regions registered from many threads all reach the tool")
  {
    REQUIRE(tool_attached);
    gpukit_test::clear_nvtx_records();
    std::vector<char> segment(1 << 16);
    gpukit::memory_heap heap = gpukit::register_memory_heap(segment.data(), segment.size());
    std::vector<std::thread> threads;
    for (int t = 0; t < 8; ++t) {
      threads.emplace_back([&, t] {
        for (int i = 0; i < 64; ++i) {
          char* p = segment.data() + (t * 64 + i) * 32;
          gpukit::register_memory_region(heap, p, 32);
          gpukit::unregister_memory_region(p);
        }
      });
    }
    for (auto& t : threads) t.join();
    gpukit::unregister_memory_heap(heap);
    CHECK(gpukit_test::nvtx_records_of(gpukit_nvtx_region_register).size() == 512);
    CHECK(gpukit_test::nvtx_records_of(gpukit_nvtx_region_unregister).size() == 512);
  }
}
