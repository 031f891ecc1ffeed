// SPDX-License-Identifier: Apache-2.0
// gpukit/profile on a real GPU: the range timer's GPU times, the ranges and memory annotations an
// NVTX tool sees while CUDA runs, and the doctor's verdict on the machine.
#include "nvtx_test_support.hpp"

#include "support/holders.hpp"
#include "support/range_stats.hpp"
#include "support/sizes.hpp"

#include <gpukit/doctor/doctor.hpp>
#include <gpukit/profile/memory_annotation.hpp>
#include <gpukit/profile/range_timer.hpp>
#include <gpukit/runtime/cuda_runtime.hpp>

#include <doctest/doctest.h>

#include <cstdio>
#include <string>

namespace {

bool const tool_attached = gpukit_test::attach_nvtx_tool();

#define OK(call) REQUIRE_EQ((call), cudaSuccess)

#ifndef GPUKIT_CUDA_ARCHITECTURES
#define GPUKIT_CUDA_ARCHITECTURES "90"
#endif

}  // namespace

TEST_SUITE("gpu")
{
  TEST_CASE("gpu_timer measures device work per range on a real stream")
  {
    auto& rt = gpukit::cuda_runtime::instance();
    gpukit::test::stream_holder<gpukit::cuda_runtime> s{rt};
    std::size_t const bytes = 512 * gpukit::test::mib;
    gpukit::test::device_buffer<gpukit::cuda_runtime> memory{rt, bytes};
    void* d = memory.p;
    {
      gpukit::gpu_timer timer{rt};
      for (int i = 0; i < 5; ++i) {
        auto step = timer.time("step", s);
        {
          auto big = timer.time("memset_512MiB", s);
          OK(rt.memset_async(d, i, bytes, s));
        }
        auto small = timer.time("memset_1MiB", s);
        OK(rt.memset_async(d, i, std::size_t{1} << 20, s));
      }
      timer.flush();
      auto const big   = gpukit::test::stats_of(timer, "memset_512MiB");
      auto const small = gpukit::test::stats_of(timer, "memset_1MiB");
      auto const step  = gpukit::test::stats_of(timer, "step");
      CHECK(big.count == 5);
      CHECK(big.min_ms > 0.0);
      CHECK(big.mean_ms > small.mean_ms);
      CHECK(step.total_ms >= big.total_ms);
      CHECK(big.share > 0.5);
      std::printf("%s", timer.report().c_str());
    }
  }

  TEST_CASE("an NVTX tool sees the timer's ranges and a real segment's annotations")
  {
    REQUIRE(tool_attached);
    auto& rt = gpukit::cuda_runtime::instance();
    gpukit::test::stream_holder<gpukit::cuda_runtime> s{rt};
    gpukit::test::device_buffer<gpukit::cuda_runtime> memory{rt, 2 * gpukit::test::mib};
    void* segment = memory.p;
    gpukit_test::clear_nvtx_records();
    {
      gpukit::gpu_timer timer{rt};
      {
        auto r = timer.time("h2d", s);
        GPUKIT_RANGE("inner");
      }
      auto heap = gpukit::register_memory_heap(segment, std::size_t{2} << 20, "gpukit segment");
      gpukit::register_memory_region(heap, segment, 4096);
      gpukit::unregister_memory_region(segment);
      gpukit::unregister_memory_heap(heap);
    }
    auto const pushes = gpukit_test::nvtx_records_of(gpukit_nvtx_push);
    REQUIRE(pushes.size() == 2);
    CHECK(std::string{pushes[0].message} == "h2d");
    CHECK(std::string{pushes[1].message} == "inner");
    CHECK(pushes[1].depth == 2);
    auto const regions = gpukit_test::nvtx_records_of(gpukit_nvtx_region_register);
    REQUIRE(regions.size() == 1);
    CHECK(regions[0].address == reinterpret_cast<std::uintptr_t>(segment));
  }

  TEST_CASE("the doctor finds this machine healthy")
  {
    gpukit::doctor_options o;
    o.built_architectures = GPUKIT_CUDA_ARCHITECTURES;
    auto const r          = gpukit::run_doctor(gpukit::cuda_runtime::instance(), o);
    std::printf("%s", r.to_text().c_str());
    CHECK_FALSE(r.simulated);
    CHECK(r.exit_code() == gpukit::doctor_exit::ok);
    CHECK(r.find("copy")->status != gpukit::check_status::fail);
    CHECK(r.find("nvtx")->detail.find("tool attached") != std::string::npos);
  }
}
