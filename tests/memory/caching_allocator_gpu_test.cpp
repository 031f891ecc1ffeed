// SPDX-License-Identifier: Apache-2.0
// The caching allocator on a real GPU (cuda_runtime): the conformance suite over every segment
// source, as on the simulated GPU, and what only a real GPU shows (graphs, real allocation
// failures, memory given back to the device).
#include "memory/allocator_conformance.hpp"

#include "support/fragmented_pool.hpp"
#include "support/holders.hpp"
#include "support/sizes.hpp"

#include <gpukit/memory/caching_allocator.hpp>
#include <gpukit/memory/detail/allocator_invariants.hpp>
#include <gpukit/runtime/cuda_runtime.hpp>

#include <doctest/doctest.h>

#include <string>
#include <vector>

using gpukit::test::gib;
using gpukit::test::mib;
using cuda_stream = gpukit::test::stream_holder<gpukit::cuda_runtime>;

TEST_SUITE("gpu")
{
  // The conformance suite over every segment source (tests/memory/allocator_conformance.hpp).
  GPUKIT_ALLOCATOR_CONFORMANCE_CASES(gpukit::cuda_runtime::instance(), "cuda_runtime", 8, 2000,
                                     std::size_t{64} << 20)
  TEST_CASE("growable segments on CUDA: pages of a hole are mapped again where the pool grows")
  {
    gpukit::caching_allocator_options o;
    o.source              = gpukit::segment_source::growable;
    o.growable_page_bytes = 2 * mib;  // the counts below assume 2 MiB pages
    auto& rt              = gpukit::cuda_runtime::instance();
    gpukit::basic_caching_allocator<gpukit::cuda_runtime> alloc{rt, 0, o};
    cuda_stream s{gpukit::cuda_runtime::instance()};
    void* a = alloc.allocate_async(40 * mib, s);
    void* b = alloc.allocate_async(8 * mib, s);
    gpukit::test::fill(rt, a, 40 * mib, 0x11, s);
    gpukit::test::fill(rt, b, 8 * mib, 0x22, s);
    alloc.deallocate_async(a, 40 * mib, s);
    GPUKIT_CUDA_TRY(cudaStreamSynchronize(s));
    void* c = alloc.allocate_async(60 * mib, s);  // a's pages move after b
    gpukit::test::fill(rt, c, 60 * mib, 0x33, s);
    CHECK(gpukit::test::holds(rt, c, 60 * mib, 0x33, s));
    CHECK(gpukit::test::holds(rt, b, 8 * mib, 0x22, s));
    auto const st = alloc.stats();
    CHECK(st.num_pages_reused == 20);
    CHECK(st.reserved_bytes.peak == static_cast<std::int64_t>(68 * mib));
    CHECK(gpukit::detail::check_invariants(alloc) == "");
    std::size_t free0 = 0, total = 0, free1 = 0;
    GPUKIT_CUDA_TRY(cudaMemGetInfo(&free0, &total));
    alloc.deallocate_async(b, 8 * mib, s);
    alloc.deallocate_async(c, 60 * mib, s);
    CHECK(alloc.release() == 68 * mib);
    GPUKIT_CUDA_TRY(cudaMemGetInfo(&free1, &total));
    CHECK(free1 >= free0 + 60 * mib);  // the device really has the memory back
    alloc.forget_stream(s);
  }
  TEST_CASE("guard pages on CUDA: blocks end at their page end, and their pages go at the free")
  {
    // The faults themselves end the context: examples/sanitizer_planted --guard-pages plants them,
    // one process each (CTest entries example.sanitizer_planted_guard_pages_*).
    gpukit::caching_allocator_options o;
    o.source            = gpukit::segment_source::growable;
    o.debug.guard_pages = true;
    auto& rt            = gpukit::cuda_runtime::instance();
    gpukit::basic_caching_allocator<gpukit::cuda_runtime> alloc{rt, 0, o};
    cuda_stream s{rt};
    std::vector<std::pair<void*, std::size_t>> live;
    for (std::size_t bytes : {std::size_t{1000}, std::size_t{1024}, 3 * mib + 1, std::size_t{64}}) {
      void* p      = alloc.allocate_async(bytes, s);
      auto const e = alloc.extent(p);
      CHECK((e.offset + e.bytes) % e.page_bytes == 0);
      CHECK(e.bytes - bytes < alloc.alignment);
      gpukit::test::fill(rt, p, bytes, 0x5a, s);
      CHECK(gpukit::test::holds(rt, p, bytes, 0x5a, s));
      live.emplace_back(p, bytes);
    }
    CHECK(gpukit::detail::check_invariants(alloc) == "");
    auto const mapped = alloc.stats().num_device_allocs;
    for (auto [p, bytes] : live) { alloc.deallocate_async(p, bytes, s); }
    CHECK(alloc.stats().num_device_frees == mapped);  // every page of every block unmapped
    CHECK(alloc.stats().allocated_bytes.current == 0);
    CHECK(gpukit::detail::check_invariants(alloc) == "");
    alloc.release();
    CHECK(alloc.stats().reserved_bytes.current == 0);
    alloc.forget_stream(s);
  }
  TEST_CASE(
    "caching_allocator on CUDA: a graph captured in global mode allocates from a private pool")
  {
    gpukit::basic_caching_allocator<gpukit::cuda_runtime> alloc{gpukit::cuda_runtime::instance(),
                                                                0};
    cuda_stream s{gpukit::cuda_runtime::instance()};
    void* warm = alloc.allocate_async(mib, s);
    alloc.deallocate_async(warm, mib, s);
    GPUKIT_CUDA_TRY(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    auto const id = alloc.begin_capture(s);
    void* p       = alloc.allocate_async(4 * mib, s);  // a new segment, made during capture
    CHECK(p != warm);
    GPUKIT_CUDA_TRY(cudaMemsetAsync(p, 7, 4 * mib, s));
    void* q = alloc.allocate_async(mib, s);
    GPUKIT_CUDA_TRY(cudaMemsetAsync(q, 9, mib, s));
    alloc.deallocate_async(q, mib, s);
    cudaGraph_t graph{};
    // An illegal call during capture would have invalidated it: EndCapture would fail.
    GPUKIT_CUDA_TRY(cudaStreamEndCapture(s, &graph));
    alloc.end_capture(s);
    cudaGraphExec_t exec{};
    GPUKIT_CUDA_TRY(cudaGraphInstantiate(&exec, graph, 0));
    GPUKIT_CUDA_TRY(cudaGraphLaunch(exec, s));
    GPUKIT_CUDA_TRY(cudaGraphLaunch(exec, s));
    std::vector<unsigned char> host(4 * mib);
    GPUKIT_CUDA_TRY(cudaMemcpyAsync(host.data(), p, host.size(), cudaMemcpyDeviceToHost, s));
    GPUKIT_CUDA_TRY(cudaStreamSynchronize(s));
    CHECK(host.front() == 7);
    CHECK(host.back() == 7);
    // Until the pool is released, eager work never gets the graph's blocks.
    void* eager = alloc.allocate_async(mib, s);
    CHECK(eager != q);
    alloc.deallocate_async(eager, mib, s);
    GPUKIT_CUDA_TRY(cudaGraphExecDestroy(exec));
    GPUKIT_CUDA_TRY(cudaGraphDestroy(graph));
    alloc.deallocate_async(p, 4 * mib, s);
    alloc.release_capture_pool(id);
    CHECK(gpukit::detail::check_invariants(alloc) == "");
    GPUKIT_CUDA_TRY(cudaStreamSynchronize(s));
    alloc.forget_stream(s);
  }
  TEST_CASE(
    "caching_allocator on CUDA: fork/join capture with a side stream allocating, freeing "
    "and record_streaming, in every capture mode")
  {
    auto& rt = gpukit::cuda_runtime::instance();
    for (int mode : {cudaStreamCaptureModeGlobal, cudaStreamCaptureModeThreadLocal,
                     cudaStreamCaptureModeRelaxed}) {
      for (auto source : {gpukit::segment_source::stream_ordered,
                          gpukit::segment_source::synchronous, gpukit::segment_source::growable}) {
        CAPTURE(mode);
        CAPTURE(static_cast<int>(source));
        gpukit::caching_allocator_options o;
        o.source = source;
        gpukit::basic_caching_allocator<gpukit::cuda_runtime> alloc{rt, 0, o};
        cuda_stream s1{rt};
        cuda_stream s2{rt};  // first met by the allocator inside the capture
        cudaEvent_t fork{}, join{};
        GPUKIT_CUDA_TRY(cudaEventCreateWithFlags(&fork, cudaEventDisableTiming));
        GPUKIT_CUDA_TRY(cudaEventCreateWithFlags(&join, cudaEventDisableTiming));
        void* warm = alloc.allocate_async(mib, s1);
        alloc.deallocate_async(warm, mib, s1);
        GPUKIT_CUDA_TRY(rt.begin_capture(s1, mode));
        auto const id = alloc.begin_capture(s1);
        void* out     = alloc.allocate_async(4 * mib, s1);
        GPUKIT_CUDA_TRY(cudaMemsetAsync(out, 3, 4 * mib, s1));
        GPUKIT_CUDA_TRY(cudaEventRecord(fork, s1));  // s2's copy below comes after the memset
        GPUKIT_CUDA_TRY(cudaStreamWaitEvent(s2, fork, 0));
        void* side = alloc.allocate_async(2 * mib, s2);  // a side-stream temporary
        GPUKIT_CUDA_TRY(cudaMemsetAsync(side, 5, 2 * mib, s2));
        GPUKIT_CUDA_TRY(cudaMemcpyAsync(out, side, 2 * mib, cudaMemcpyDeviceToDevice, s2));
        alloc.record_stream(out, s2);
        alloc.deallocate_async(side, 2 * mib, s2);
        GPUKIT_CUDA_TRY(cudaEventRecord(join, s2));
        GPUKIT_CUDA_TRY(cudaStreamWaitEvent(s1, join, 0));
        cudaGraph_t graph{};
        // Any call that invalidates the capture (cudaStreamGetDevice on s2, a query, ...) makes
        // this fail with cudaErrorStreamCaptureInvalidated.
        REQUIRE(rt.end_capture(s1, graph) == cudaSuccess);
        alloc.end_capture(s1);
        cudaGraphExec_t exec{};
        GPUKIT_CUDA_TRY(cudaGraphInstantiate(&exec, graph, 0));
        GPUKIT_CUDA_TRY(cudaGraphLaunch(exec, s1));
        GPUKIT_CUDA_TRY(cudaGraphLaunch(exec, s1));
        std::vector<unsigned char> host(4 * mib);
        GPUKIT_CUDA_TRY(cudaMemcpyAsync(host.data(), out, host.size(), cudaMemcpyDeviceToHost, s1));
        GPUKIT_CUDA_TRY(cudaStreamSynchronize(s1));
        CHECK(host.front() == 5);  // written on s2 inside the graph
        CHECK(host[2 * mib - 1] == 5);
        CHECK(host[2 * mib] == 3);  // written on s1
        CHECK(host.back() == 3);
        GPUKIT_CUDA_TRY(cudaGraphExecDestroy(exec));
        GPUKIT_CUDA_TRY(cudaGraphDestroy(graph));
        alloc.deallocate_async(out, 4 * mib, s1);  // used on s2 too: waits for s2's work
        GPUKIT_CUDA_TRY(cudaStreamSynchronize(s2));
        alloc.release_capture_pool(id);
        (void)alloc.trim(0);
        CHECK(alloc.stats().active_bytes.current == 0);
        CHECK(gpukit::detail::check_invariants(alloc) == "");
        GPUKIT_CUDA_TRY(cudaEventDestroy(fork));
        GPUKIT_CUDA_TRY(cudaEventDestroy(join));
        alloc.forget_stream(s1);
        alloc.forget_stream(s2);
      }
    }
  }
  TEST_CASE("caching_allocator on CUDA: a small request on a full device is cut from a large block")
  {
    for (auto source : {gpukit::segment_source::stream_ordered, gpukit::segment_source::synchronous,
                        gpukit::segment_source::growable}) {
      CAPTURE(static_cast<int>(source));
      gpukit::caching_allocator_options o;
      o.source = source;
      gpukit::basic_caching_allocator<gpukit::cuda_runtime> alloc{gpukit::cuda_runtime::instance(),
                                                                  0, o};
      alloc.set_limit(512 * mib);  // a full device at 512 MiB
      cuda_stream s{gpukit::cuda_runtime::instance()};
      // Large blocks until memory runs out, then every other one freed: about half of it is
      // free, in large blocks that live neighbours keep from being released.
      std::vector<void*> const large = gpukit::test::fill_then_free_every_other(alloc, 5 * mib, s);
      REQUIRE(large.size() > 8);
      auto& rt = gpukit::cuda_runtime::instance();
      std::vector<void*> small;
      for (int i = 0; i < 32; ++i) {
        void* p = nullptr;
        REQUIRE_NOTHROW(p = alloc.allocate_async(256 * 1024, s));
        gpukit::test::fill(rt, p, 256 * 1024, static_cast<unsigned char>(i), s);
        small.push_back(p);
      }
      for (int i = 0; i < 32; ++i) {
        CHECK(gpukit::test::holds(rt, small[static_cast<std::size_t>(i)], 256 * 1024,
                                  static_cast<unsigned char>(i), s));
      }
      CHECK(alloc.stats().num_recovery_steps[4] > 0);
      CHECK(gpukit::detail::check_invariants(alloc) == "");
      for (void* p : small) { alloc.deallocate_async(p, 256 * 1024, s); }
      for (void* p : large) {
        if (p != nullptr) { alloc.deallocate_async(p, 5 * mib, s); }
      }
      (void)alloc.release();
      CHECK(alloc.stats().reserved_bytes.current == 0);
      alloc.forget_stream(s);
    }
  }

  TEST_CASE("caching_allocator on CUDA: release() during a capture begun on the stream directly")
  {
    for (auto source :
         {gpukit::segment_source::stream_ordered, gpukit::segment_source::synchronous}) {
      CAPTURE(static_cast<int>(source));
      gpukit::caching_allocator_options o;
      o.source = source;
      gpukit::basic_caching_allocator<gpukit::cuda_runtime> alloc{gpukit::cuda_runtime::instance(),
                                                                  0, o};
      cuda_stream s{gpukit::cuda_runtime::instance()};
      alloc.deallocate_async(alloc.allocate_async(64 * mib, s), 64 * mib, s);
      GPUKIT_CUDA_TRY(cudaStreamSynchronize(s));
      GPUKIT_CUDA_TRY(cudaStreamBeginCapture(s, cudaStreamCaptureModeRelaxed));
      (void)alloc.release();  // the segment of the capturing stream stays
      cudaGraph_t graph{};
      CHECK(cudaStreamEndCapture(s, &graph) == cudaSuccess);  // the capture is still valid
      if (graph != nullptr) { GPUKIT_CUDA_TRY(cudaGraphDestroy(graph)); }
      CHECK(alloc.stats().reserved_bytes.current == static_cast<std::int64_t>(64 * mib));
      std::size_t free0 = 0, free1 = 0, total = 0;
      GPUKIT_CUDA_TRY(cudaDeviceSynchronize());
      GPUKIT_CUDA_TRY(cudaMemGetInfo(&free0, &total));
      CHECK(alloc.release() == 64 * mib);
      GPUKIT_CUDA_TRY(cudaDeviceSynchronize());
      if (source == gpukit::segment_source::stream_ordered) {
        cudaMemPool_t pool{};
        GPUKIT_CUDA_TRY(cudaDeviceGetDefaultMemPool(&pool, 0));
        GPUKIT_CUDA_TRY(cudaMemPoolTrimTo(pool, 0));
      }
      GPUKIT_CUDA_TRY(cudaMemGetInfo(&free1, &total));
      CHECK(free1 >= free0 + 64 * mib);  // the device really has it back
      alloc.forget_stream(s);
    }
  }

  TEST_CASE("caching_allocator on CUDA: recovery from real allocation failures on a full device")
  {
    // The device's default memory pool may hold memory that earlier tests freed (cudaMemGetInfo
    // counts it as used, cudaMallocAsync reuses it): give it back first.
    cudaMemPool_t pool{};
    GPUKIT_CUDA_TRY(cudaDeviceGetDefaultMemPool(&pool, 0));
    GPUKIT_CUDA_TRY(cudaDeviceSynchronize());
    GPUKIT_CUDA_TRY(cudaMemPoolTrimTo(pool, 0));
    // Another user takes all but about 3 GiB of the device with plain cudaMalloc.
    std::vector<void*> hog;
    std::size_t free = 0, total = 0;
    GPUKIT_CUDA_TRY(cudaMemGetInfo(&free, &total));
    for (std::size_t chunk : {8 * gib, 256 * mib}) {
      while (free > 3 * gib + chunk) {
        void* p = nullptr;
        GPUKIT_CUDA_TRY(cudaMalloc(&p, chunk));
        hog.push_back(p);
        GPUKIT_CUDA_TRY(cudaMemGetInfo(&free, &total));
      }
    }
    MESSAGE("device free before the allocator starts: " << free / mib << " MiB of " << total / mib
                                                        << " MiB");
    {
      gpukit::caching_allocator_options o;
      o.release_before_grow = false;  // so that the first try really fails
      gpukit::basic_caching_allocator<gpukit::cuda_runtime> alloc{gpukit::cuda_runtime::instance(),
                                                                  0, o};
      cuda_stream s{gpukit::cuda_runtime::instance()};
      void* a = alloc.allocate_async(gib, s);
      void* b = alloc.allocate_async(gib, s);
      alloc.deallocate_async(a, gib, s);
      alloc.deallocate_async(b, gib, s);  // 2 GiB cached in two segments, less than 1 GiB free
      void* big = alloc.allocate_async(2 * gib + 512 * mib, s);  // fits only once they go back
      CHECK(big != nullptr);
      auto st = alloc.stats();
      CHECK(st.num_alloc_retries == 1);
      CHECK(st.recovery_bytes[2] + st.recovery_bytes[3] >= 2 * gib);
      MESSAGE("recovered: " << st.num_device_frees << " segments returned, " << st.num_release_waits
                            << " stream waits, reserved now " << st.reserved_bytes.current / mib
                            << " MiB");
      try {
        (void)alloc.allocate_async(8 * gib, s);
        FAIL("8 GiB cannot fit");
      } catch (gpukit::out_of_memory const& e) {
        CHECK(e.report().requested == 8 * gib);
        CHECK(e.report().reserved == 2 * gib + 512 * mib);
        MESSAGE(std::string{e.what()});
      }
      alloc.deallocate_async(big, 2 * gib + 512 * mib, s);
      GPUKIT_CUDA_TRY(cudaStreamSynchronize(s));
      alloc.forget_stream(s);
      alloc.release();
      GPUKIT_CUDA_TRY(cudaStreamSynchronize(s));
    }
    for (void* p : hog) { GPUKIT_CUDA_TRY(cudaFree(p)); }
  }
}
