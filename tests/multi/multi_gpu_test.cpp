// SPDX-License-Identifier: Apache-2.0
// Several GPUs on CUDA (the two-GPU machine; benchmarks/multi/run_h200x2.sh runs it): what
// multi_device_test checks on the simulated GPU, on real devices. With fewer than two GPUs each
// case skips itself (CTest reports it skipped); with none, gpu_main skips the whole binary.
#include "support/caching_allocator.hpp"
#include "support/holders.hpp"
#include "support/pattern.hpp"
#include "support/sizes.hpp"
#include "support/skip.hpp"
#include "support/transfer_fixture.hpp"

#include <gpukit/host/pinned_pool.hpp>
#include <gpukit/memory/caching_allocator.hpp>
#include <gpukit/memory/detail/allocator_invariants.hpp>
#include <gpukit/runtime/cuda_runtime.hpp>
#include <gpukit/runtime/detail/driver_api.hpp>
#include <gpukit/transfer/transfer_pipeline.hpp>

#include <doctest/doctest.h>

#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime_api.h>

#include <memory>
#include <vector>

using namespace gpukit::test;

namespace {

/// The GPUs this process sees (0 when CUDA cannot count them).
int gpu_count()
{
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return n;
}

int device_of(void const* p)
{
  cudaPointerAttributes a{};
  REQUIRE(cudaPointerGetAttributes(&a, p) == cudaSuccess);
  return a.device;
}

/// cuMemGetAccess's answer for `device` at `p` (through the runtime's driver entry point).
unsigned long long access_of(void const* p, int device)
{
  static PFN_cuMemGetAccess_v10020 get_access = [] {
    PFN_cuMemGetAccess_v10020 fn = nullptr;
    gpukit::detail::driver_entry_points d;
    REQUIRE(gpukit::detail::resolve_driver_symbol(d, "cuMemGetAccess", fn));
    return fn;
  }();
  CUmemLocation where{};
  where.type               = CU_MEM_LOCATION_TYPE_DEVICE;
  where.id                 = device;
  unsigned long long flags = 0;
  REQUIRE(get_access(&flags, &where, reinterpret_cast<CUdeviceptr>(p)) == CUDA_SUCCESS);
  return flags;
}

}  // namespace

TEST_SUITE("gpu")
{
  TEST_CASE("multi on CUDA: allocations land on the allocator's device with another current")
  {
    GPUKIT_TEST_SKIP_UNLESS(gpu_count() >= 2, "fewer than 2 GPUs");
    auto& rt = gpukit::cuda_runtime::instance();
    for (auto const src : {gpukit::segment_source::stream_ordered,
                           gpukit::segment_source::synchronous, gpukit::segment_source::growable}) {
      CAPTURE(static_cast<int>(src));
      REQUIRE(cudaSetDevice(0) == cudaSuccess);
      gpukit::caching_allocator alloc{rt, 1, segments_from(src)};
      stream_holder<gpukit::cuda_runtime> s1{rt, 1};
      void* a = alloc.allocate(3 * mib);  // the null stream: device 1's
      void* b = alloc.allocate_async(40 * mib, s1);
      CHECK(device_of(a) == 1);
      CHECK(device_of(b) == 1);
      int cur = -1;
      REQUIRE(cudaGetDevice(&cur) == cudaSuccess);
      CHECK(cur == 0);
      REQUIRE(cudaMemsetAsync(b, 0x5a, 40 * mib, s1) == cudaSuccess);
      std::vector<unsigned char> back(40 * mib);
      REQUIRE(cudaMemcpyAsync(back.data(), b, back.size(), cudaMemcpyDeviceToHost, s1) ==
              cudaSuccess);
      REQUIRE(cudaStreamSynchronize(s1) == cudaSuccess);
      CHECK(back.back() == 0x5a);
      alloc.record_stream(a, s1);  // an event of device 1 recorded on s1
      alloc.deallocate(a, 3 * mib);
      alloc.deallocate_async(b, 40 * mib, s1);
      alloc.forget_stream(s1);
      alloc.release();
      CHECK(gpukit::detail::check_invariants(alloc).empty());
    }
  }

  TEST_CASE("multi on CUDA: a peer granted access reaches growable pages, later ones too")
  {
    GPUKIT_TEST_SKIP_UNLESS(gpu_count() >= 2, "fewer than 2 GPUs");
    int can = 0;
    REQUIRE(cudaDeviceCanAccessPeer(&can, 0, 1) == cudaSuccess);
    GPUKIT_TEST_SKIP_UNLESS(can != 0, "device 0 cannot access device 1's memory");
    auto& rt = gpukit::cuda_runtime::instance();
    gpukit::caching_allocator alloc{rt, 1, segments_from(gpukit::segment_source::growable)};
    void* a = alloc.allocate(24 * mib);
    CHECK(access_of(a, 1) == CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
    CHECK(access_of(a, 0) == CU_MEM_ACCESS_FLAGS_PROT_NONE);
    alloc.grant_access(0);  // what PyTorch's enablePeerAccess(0, 1) asks
    CHECK(access_of(a, 0) == CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
    void* b = alloc.allocate(100 * mib);  // pages mapped after the grant
    CHECK(access_of(b, 0) == CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
    CHECK(access_of(static_cast<char*>(b) + 100 * mib - 1, 0) ==
          CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
    CHECK(alloc.peers() == std::vector<int>{0});

    // Device 0 writes device 1's growable memory itself (a memset on a stream of device 0).
    REQUIRE(cudaSetDevice(0) == cudaSuccess);
    if (cudaError_t const e = cudaDeviceEnablePeerAccess(1, 0);
        e == cudaErrorPeerAccessAlreadyEnabled) {
      (void)cudaGetLastError();
    } else {
      REQUIRE(e == cudaSuccess);
    }
    stream_holder<gpukit::cuda_runtime> s0{rt, 0};
    REQUIRE(cudaMemsetAsync(b, 0x3c, 100 * mib, s0) == cudaSuccess);
    REQUIRE(cudaStreamSynchronize(s0) == cudaSuccess);
    std::vector<unsigned char> back(100 * mib);
    REQUIRE(cudaMemcpy(back.data(), b, back.size(), cudaMemcpyDeviceToHost) == cudaSuccess);
    CHECK(back.front() == 0x3c);
    CHECK(back.back() == 0x3c);
    alloc.deallocate(b, 100 * mib);
    alloc.deallocate(a, 24 * mib);
    alloc.release();
    CHECK(gpukit::detail::check_invariants(alloc).empty());
  }

  TEST_CASE("multi on CUDA: one pinned pool and a pipeline per device, peer copies")
  {
    GPUKIT_TEST_SKIP_UNLESS(gpu_count() >= 2, "fewer than 2 GPUs");
    auto& rt = gpukit::cuda_runtime::instance();
    gpukit::pinned_pool pool{rt};
    constexpr std::size_t bytes = 64 * mib + 4096;
    per_device_transfers<gpukit::cuda_runtime> t{rt, pool, 2, bytes};
    REQUIRE(cudaSetDevice(1) == cudaSuccess);  // not device 0, whose pipeline starts
    std::vector<char> host(bytes), back(bytes);
    fill_pattern(host.data(), bytes, 61);
    t.pipe(0).copy_to_device_async(t.buffer(0), host.data(), bytes,
                                   t.stream(0));  // pageable: staged
    t.pipe(0).copy_peer_async(t.buffer(1), 1, t.buffer(0), 0, bytes, t.stream(0));
    REQUIRE(cudaStreamSynchronize(t.stream(0)) == cudaSuccess);
    t.pipe(1).copy_to_host_async(back.data(), t.buffer(1), bytes, t.stream(1));
    CHECK(first_mismatch(back.data(), bytes, 61) == bytes);
    // One pinned buffer to both devices; returned with a stream of each.
    auto buf = pool.acquire(bytes);
    fill_pattern(buf.data(), bytes, 62);
    for (int d = 0; d < 2; ++d) {
      t.pipe(d).copy_to_device_async(t.buffer(d), buf.data(), bytes,
                                     t.stream(d));  // pinned: direct
      buf.record_stream(t.stream(d));
    }
    buf.reset();
    for (int d = 0; d < 2; ++d) {
      t.pipe(d).copy_to_host_async(back.data(), t.buffer(d), bytes, t.stream(d));
      CHECK(first_mismatch(back.data(), bytes, 62) == bytes);
    }
    for (int d = 0; d < 2; ++d) { REQUIRE(cudaStreamSynchronize(t.stream(d)) == cudaSuccess); }
  }
}
