// SPDX-License-Identifier: Apache-2.0
// gpukit's own NVTX ranges around its slow paths, as an NVTX tool sees them: the test tool
// (nvtx_injection.cpp) records every range while the simulated GPU drives each path (segments
// allocated, grown, released and trimmed; each step of the out-of-memory ladder; pinned pool
// growth; pipeline chunks; recomputation), and the cached allocate/free pair emits nothing.
// Built twice: slow_path_ranges_test, and slow_path_ranges_off_test with
// GPUKIT_DISABLE_INTERNAL_NVTX, where the same paths emit no range of gpukit's while the user's
// own ranges still reach the tool.
#include "nvtx_test_support.hpp"

#include "support/caching_allocator.hpp"
#include "support/holders.hpp"
#include "support/sim_gpu.hpp"
#include "support/sizes.hpp"
#include "support/transfer_fixture.hpp"

#include <gpukit/checkpoint/executor.hpp>
#include <gpukit/checkpoint/schedule.hpp>
#include <gpukit/host/pinned_pool.hpp>
#include <gpukit/memory/caching_allocator.hpp>
#include <gpukit/profile/nvtx.hpp>
#include <gpukit/runtime/sim_runtime.hpp>
#include <gpukit/transfer/transfer_pipeline.hpp>

#include <doctest/doctest.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

using namespace gpukit::test;
using gpukit::sim_runtime;
using sim_pool     = gpukit::basic_pinned_pool<sim_runtime>;
using sim_pipeline = gpukit::basic_transfer_pipeline<sim_runtime>;
using sim_executor = gpukit::basic_checkpoint_executor<sim_runtime>;

namespace {

bool const tool_attached = gpukit_test::attach_nvtx_tool();

#ifdef GPUKIT_DISABLE_INTERNAL_NVTX
constexpr bool ranges_on = false;
// The same cases, compiled out: no range of gpukit's reaches the tool.
#define SLOW_PATH_CASE(name) TEST_CASE("slow path ranges compiled out: none around " name)
#define SLOW_PATH_TOOL_CASE  TEST_CASE("slow path ranges compiled out: the user's ranges remain")
#else
constexpr bool ranges_on = true;
#define SLOW_PATH_CASE(name) TEST_CASE("slow path ranges: one around " name)
#define SLOW_PATH_TOOL_CASE  TEST_CASE("slow path ranges: the test tool sees the user's ranges")
#endif

/// The ranges (pushes) gpukit's domain received since the last clear.
std::vector<gpukit_nvtx_record> gpukit_ranges()
{
  std::vector<gpukit_nvtx_record> out;
  for (auto const& r : gpukit_test::nvtx_records_of(gpukit_nvtx_push)) {
    if (std::string{r.domain} == "gpukit") { out.push_back(r); }
  }
  return out;
}

/// How many of `ranges` start with `prefix` and are in category `C`; fails a check for one that
/// starts with `prefix` in another category.
template <class C>
std::size_t count_ranges(std::vector<gpukit_nvtx_record> const& ranges, std::string const& prefix)
{
  std::size_t n = 0;
  for (auto const& r : ranges) {
    if (std::string{r.message}.rfind(prefix, 0) != 0) { continue; }
    CAPTURE(r.message);
    CHECK(r.category == C::id);
    CHECK(r.color_type == NVTX_COLOR_ARGB);
    ++n;
  }
  return n;
}

/// Checks that some range starts with `prefix` in category `C` (none when compiled out).
template <class C>
void check_range(std::vector<gpukit_nvtx_record> const& ranges, std::string const& prefix)
{
  CAPTURE(prefix);
  std::size_t const n = count_ranges<C>(ranges, prefix);
  if (ranges_on) {
    CHECK(n >= 1);
  } else {
    CHECK(n == 0);
  }
}

/// Every push of the gpukit domain was popped: ranges never outlive their slow path.
void check_balanced()
{
  std::size_t pushes = 0, pops = 0;
  for (auto const& r : gpukit_test::nvtx_records()) {
    if (std::string{r.domain} != "gpukit") { continue; }
    pushes += r.kind == gpukit_nvtx_push ? 1 : 0;
    pops += r.kind == gpukit_nvtx_pop ? 1 : 0;
  }
  CHECK(pushes == pops);
}

using allocator_category = gpukit::categories::allocator;

/// A chain of stages that enqueue nothing: the executor's own work is what is observed.
struct idle_stages {
  std::size_t output_bytes(std::size_t) const { return 4 * kib; }
  std::size_t tape_bytes(std::size_t) const { return 8 * kib; }
  void forward(std::size_t, void const*, void*, void*, gpukit::checkpoint_context const&,
               sim_runtime::stream_type)
  {}
  void backward(std::size_t, void const*, void const*, void const*, void*,
                gpukit::checkpoint_context const&, sim_runtime::stream_type)
  {}
};

}  // namespace

TEST_SUITE("profile")
{
  SLOW_PATH_TOOL_CASE
  {
    REQUIRE(tool_attached);
    gpukit_test::clear_nvtx_records();
    {
      GPUKIT_RANGE("user range");
    }
    auto const ranges = gpukit_ranges();
    REQUIRE(ranges.size() == 1);
    CHECK(std::string{ranges[0].message} == "user range");
  }

  SLOW_PATH_CASE("a synchronous segment's allocation, and release, not the cached pair")
  {
    REQUIRE(tool_attached);
    sim_runtime sim{one_device(256 * mib)};
    sim_allocator alloc{sim, 0, segments_from(gpukit::segment_source::synchronous)};
    stream_holder<sim_runtime> s{sim};
    gpukit_test::clear_nvtx_records();
    void* p = alloc.allocate_async(10 * mib, s);
    alloc.deallocate_async(p, 10 * mib, s);
    auto ranges = gpukit_ranges();
    check_range<allocator_category>(ranges, "allocate segment ");
    CHECK(count_ranges<allocator_category>(ranges, "allocate segment ") == (ranges_on ? 1 : 0));

    // The fast path: served from the cache and returned to it, no range at all.
    gpukit_test::clear_nvtx_records();
    for (int i = 0; i < 8; ++i) {
      void* q = alloc.allocate_async(10 * mib, s);
      alloc.deallocate_async(q, 10 * mib, s);
    }
    CHECK(gpukit_ranges().empty());

    gpukit_test::clear_nvtx_records();
    CHECK(alloc.release() > 0);
    ranges = gpukit_ranges();
    check_range<allocator_category>(ranges, "release free segments to the driver");
    check_balanced();
    alloc.forget_stream(s);
  }

  SLOW_PATH_CASE("a growable segment's reserve, each growth and the trim")
  {
    REQUIRE(tool_attached);
    sim_runtime sim{one_device(256 * mib)};
    sim_allocator alloc{sim, 0, segments_from(gpukit::segment_source::growable, 2 * mib)};
    stream_holder<sim_runtime> s{sim};
    gpukit_test::clear_nvtx_records();
    void* p     = alloc.allocate_async(6 * mib, s);
    auto ranges = gpukit_ranges();
    check_range<allocator_category>(ranges, "reserve growable segment ");
    check_range<allocator_category>(ranges, "grow segment 6.0 MiB (3 pages) stream 0x");

    gpukit_test::clear_nvtx_records();
    void* q = alloc.allocate_async(4 * mib, s);  // the segment grows by two pages
    ranges  = gpukit_ranges();
    check_range<allocator_category>(ranges, "grow segment 4.0 MiB (2 pages)");
    CHECK(count_ranges<allocator_category>(ranges, "reserve growable segment ") == 0);

    alloc.deallocate_async(q, 4 * mib, s);
    alloc.deallocate_async(p, 6 * mib, s);
    gpukit_test::clear_nvtx_records();
    CHECK(alloc.trim(0) > 0);
    ranges = gpukit_ranges();
    check_range<allocator_category>(ranges, "release free segments to the driver");
    check_range<allocator_category>(ranges, "trim growable segments: unmap free pages");
    check_balanced();
    alloc.forget_stream(s);
  }

  SLOW_PATH_CASE("each step of the out-of-memory ladder, naming it")
  {
    REQUIRE(tool_attached);
    sim_runtime sim{one_device(64 * mib)};
    gpukit::caching_allocator_options o = segments_from(gpukit::segment_source::synchronous);
    o.release_before_grow               = false;
    o.oom_wait_for_frees_ms             = 1;
    sim_allocator alloc{sim, 0, o};
    stream_holder<sim_runtime> sa{sim}, sb{sim};
    void* held        = alloc.allocate_async(40 * mib, sa);
    bool free_on_call = false;
    alloc.add_oom_callback([&](gpukit::oom_context const&) {
      if (!free_on_call) { return false; }
      alloc.deallocate_async(held, 40 * mib, sa);
      held = nullptr;
      return true;
    });
    auto step_range = [](int i) {
      return (std::string{"OOM ladder: "} + gpukit::recovery_step_names[i]).substr(0, 127);
    };

    // Not recoverable while `held` is held: every step runs, each in its own range.
    gpukit_test::clear_nvtx_records();
    CHECK_THROWS_AS((void)alloc.allocate_async(40 * mib, sb), gpukit::out_of_memory);
    auto ranges = gpukit_ranges();
    for (int i = 0; i < gpukit::recovery_step_count; ++i) {
      check_range<allocator_category>(ranges, step_range(i));
    }

    // Recovered: the callback frees `held` on stream a, which b's request can use once the
    // cached segments of every stream are released (the fourth step); the later steps do not run.
    free_on_call = true;
    gpukit_test::clear_nvtx_records();
    void* q = alloc.allocate_async(40 * mib, sb);
    ranges  = gpukit_ranges();
    for (int i = 0; i < gpukit::recovery_step_count; ++i) {
      CAPTURE(i);
      CHECK(count_ranges<allocator_category>(ranges, step_range(i)) ==
            (ranges_on && i <= 3 ? 1u : 0u));
    }
    CHECK(held == nullptr);
    alloc.deallocate_async(q, 40 * mib, sb);
    check_balanced();
    alloc.forget_stream(sa);
    alloc.forget_stream(sb);
  }

  SLOW_PATH_CASE("pinned pool growth, not a buffer served from the pool")
  {
    REQUIRE(tool_attached);
    sim_runtime sim{one_device()};
    sim_pool pool{sim};
    gpukit_test::clear_nvtx_records();
    void* p = pool.allocate(mib);
    check_range<gpukit::categories::pinned_pool>(gpukit_ranges(), "pinned pool: grow ");
    pool.deallocate(p);

    gpukit_test::clear_nvtx_records();  // served from the pool: no growth
    p = pool.allocate(mib);
    CHECK(gpukit_ranges().empty());
    pool.deallocate(p);
    check_balanced();
  }

  SLOW_PATH_CASE("each chunk the pipeline stages, and each direct copy")
  {
    REQUIRE(tool_attached);
    sim_runtime sim{one_device()};
    transfer_fixture<sim_runtime> f{sim};
    sim_pipeline pipe{sim, f.pool, chunked(64 * kib, 1, 2)};
    std::size_t const bytes = 256 * kib;
    device_buffer<sim_runtime> dev{sim, bytes};
    std::vector<unsigned char> host(bytes, 7);
    gpukit_test::clear_nvtx_records();
    pipe.copy_to_device_async(dev.p, host.data(), bytes, f.s);
    pipe.copy_to_host_async(host.data(), dev.p, bytes, f.s);
    auto ranges             = gpukit_ranges();
    using transfer_category = gpukit::categories::transfer;
    CHECK(count_ranges<transfer_category>(ranges, "H2D chunk 0.06 MiB at offset ") ==
          (ranges_on ? 4 : 0));
    CHECK(count_ranges<transfer_category>(ranges, "D2H chunk 0.06 MiB at offset ") ==
          (ranges_on ? 4 : 0));
    check_range<transfer_category>(ranges, "H2D chunk 0.06 MiB at offset 196608");

    void* pinned = f.pool.allocate(bytes);
    gpukit_test::clear_nvtx_records();
    pipe.copy_to_device_async(dev.p, pinned, bytes, f.s);  // pinned: one direct copy
    check_range<transfer_category>(gpukit_ranges(), "H2D direct 0.25 MiB stream 0x");
    GPUKIT_CUDA_TRY(sim.stream_synchronize(f.s));
    f.pool.deallocate(pinned);
    check_balanced();
  }

  SLOW_PATH_CASE("each forward and recomputation of the checkpoint executor")
  {
    REQUIRE(tool_attached);
    sim_runtime sim{one_device()};
    sim_allocator alloc{sim, 0};
    stream_holder<sim_runtime> s{sim};
    idle_stages stages;
    std::vector<unsigned char> x0(4 * kib);
    {
      sim_executor exec{alloc};
      gpukit_test::clear_nvtx_records();
      auto const stats = exec.run_async(gpukit::parse_checkpoint_schedule("Fn1 Fe2 B2 Fe1 B1"),
                                        stages, 2, x0.data(), s);
      CHECK(stats.recomputations == 1);
      auto const ranges         = gpukit_ranges();
      using checkpoint_category = gpukit::categories::checkpoint;
      CHECK(count_ranges<checkpoint_category>(ranges, "recompute block 1") == (ranges_on ? 1 : 0));
      CHECK(count_ranges<checkpoint_category>(ranges, "recompute block 2") == 0);
      check_range<checkpoint_category>(ranges, "forward block 2");
      GPUKIT_CUDA_TRY(sim.stream_synchronize(s));
    }
    check_balanced();
    alloc.forget_stream(s);
  }
}
