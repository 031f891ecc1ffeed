// SPDX-License-Identifier: Apache-2.0
// Compiled out with GPUKIT_DISABLE_NVTX: with the test tool configured, nothing reaches NVTX, so
// NVTX never even loads the tool. (nvtx_disable_macro_test.cpp: the same with NVTX_DISABLE.)
#define GPUKIT_DISABLE_NVTX
#include "nvtx_test_support.hpp"

#include <gpukit/profile/memory_annotation.hpp>
#include <gpukit/profile/nvtx.hpp>

#include <doctest/doctest.h>

#include <cstdint>
#include <stdexcept>

namespace {

bool const tool_configured = gpukit_test::attach_nvtx_tool();

struct other_domain {
  static constexpr char const* name{"other"};
};

struct fake_stats {
  struct pair {
    std::int64_t current{1};
  };
  pair allocated_bytes, reserved_bytes, active_bytes, requested_bytes;
};

void annotated_function()
{
  GPUKIT_FUNC_RANGE();
  GPUKIT_RANGE("a", gpukit::payload{1});
  GPUKIT_RANGE_IN(other_domain, "b");
}

}  // namespace

static_assert(!gpukit::nvtx_compiled_in);

void gpukit_test_disable_macro_exercise();  // nvtx_disable_macro_test.cpp

TEST_SUITE("profile")
{
  TEST_CASE("GPUKIT_DISABLE_NVTX emits nothing and never loads the tool")
  {
    REQUIRE(tool_configured);
    annotated_function();
    {
      gpukit::scoped_range r{"x", gpukit::rgb{1, 2, 3}};
      gpukit::named_range n{"y", gpukit::payload{2.0}};
      gpukit::unique_range u{"z"};
      gpukit::mark("m");
      gpukit::mark_in<other_domain>("m2");
      (void)gpukit::category_of<gpukit::categories::memory>();
    }
    try {
      GPUKIT_RANGE("throwing");
      throw std::runtime_error{"x"};
    } catch (std::runtime_error const&) {}
    int block = 0;
    auto heap = gpukit::register_memory_heap(&block, sizeof block, "pool");
    gpukit::register_memory_region(heap, &block, sizeof block);
    gpukit::resize_memory_region(&block, 2);
    gpukit::name_memory_region(&block, "b");
    gpukit::unregister_memory_region(&block);
    gpukit::reset_memory_heap(heap);
    gpukit::unregister_memory_heap(heap);
    gpukit::nvtx_counter c{"c"};
    c.sample(3);
    CHECK(c.id() == 0);
    gpukit::allocator_counters{"dev0"}.sample(fake_stats{});
    gpukit_test_disable_macro_exercise();

    CHECK(gpukit_test::nvtx_tool_handle() == nullptr);
    CHECK(gpukit_test::nvtx_records().empty());
  }
}
