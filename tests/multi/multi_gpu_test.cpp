// Several GPUs on CUDA (the two-GPU machine; benchmarks/multi/run_h200x2.sh runs it): what
// multi_device_test checks on the simulated GPU, on real devices. With one GPU each case says so
// and checks nothing more.
#include "transfer/transfer_conformance.hpp"

#include <gpukit/host/pinned_pool.hpp>
#include <gpukit/memory/caching_allocator.hpp>
#include <gpukit/memory/detail/allocator_invariants.hpp>
#include <gpukit/runtime/cuda_runtime.hpp>
#include <gpukit/transfer/transfer_pipeline.hpp>

#include <doctest/doctest.h>

#include <cuda_runtime_api.h>

#include <memory>
#include <vector>

using gpukit::test::fill_pattern;
using gpukit::test::first_mismatch;
using gpukit::test::mib;

namespace {

bool two_gpus()
{
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n < 2) {
    MESSAGE("fewer than 2 GPUs: nothing to check here");
    return false;
  }
  return true;
}

int device_of(void const* p)
{
  cudaPointerAttributes a{};
  REQUIRE(cudaPointerGetAttributes(&a, p) == cudaSuccess);
  return a.device;
}

cudaStream_t stream_on(int device)
{
  gpukit::device_guard<gpukit::cuda_runtime> guard{gpukit::cuda_runtime::instance(), device};
  cudaStream_t s{};
  REQUIRE(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) == cudaSuccess);
  return s;
}

}  // namespace

TEST_SUITE("gpu")
{
  TEST_CASE("multi on CUDA: allocations land on the allocator's device with another current")
  {
    if (!two_gpus()) { return; }
    auto& rt = gpukit::cuda_runtime::instance();
    for (auto const src : {gpukit::segment_source::stream_ordered,
                           gpukit::segment_source::synchronous, gpukit::segment_source::growable}) {
      CAPTURE(static_cast<int>(src));
      REQUIRE(cudaSetDevice(0) == cudaSuccess);
      gpukit::caching_allocator_options o;
      o.source = src;
      gpukit::caching_allocator alloc{rt, 1, o};
      cudaStream_t s1 = stream_on(1);
      void* a         = alloc.allocate(3 * mib);  // the null stream: device 1's
      void* b         = alloc.allocate_async(40 * mib, s1);
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
      CHECK(cudaStreamDestroy(s1) == cudaSuccess);
    }
  }

  TEST_CASE("multi on CUDA: one pinned pool and a pipeline per device, peer copies")
  {
    if (!two_gpus()) { return; }
    auto& rt = gpukit::cuda_runtime::instance();
    gpukit::pinned_pool pool{rt};
    std::vector<std::unique_ptr<gpukit::transfer_pipeline>> pipes;
    cudaStream_t s[2]{};
    void* dev[2]{};
    constexpr std::size_t bytes = 64 * mib + 4096;
    for (int d = 0; d < 2; ++d) {
      gpukit::transfer_options o;
      o.device = d;
      pipes.push_back(std::make_unique<gpukit::transfer_pipeline>(rt, pool, o));
      s[d] = stream_on(d);
      gpukit::device_guard<gpukit::cuda_runtime> guard{rt, d};
      REQUIRE(cudaMalloc(&dev[d], bytes) == cudaSuccess);
    }
    REQUIRE(cudaSetDevice(1) == cudaSuccess);  // not device 0, whose pipeline starts
    std::vector<char> host(bytes), back(bytes);
    fill_pattern(host.data(), bytes, 61);
    pipes[0]->copy_to_device_async(dev[0], host.data(), bytes, s[0]);  // pageable: staged
    pipes[0]->copy_peer_async(dev[1], 1, dev[0], 0, bytes, s[0]);
    REQUIRE(cudaStreamSynchronize(s[0]) == cudaSuccess);
    pipes[1]->copy_to_host_async(back.data(), dev[1], bytes, s[1]);
    CHECK(first_mismatch(back.data(), bytes, 61) == bytes);
    // One pinned buffer to both devices; returned with a stream of each.
    auto buf = pool.acquire(bytes);
    fill_pattern(buf.data(), bytes, 62);
    for (int d = 0; d < 2; ++d) {
      pipes[d]->copy_to_device_async(dev[d], buf.data(), bytes, s[d]);  // pinned: direct
      buf.record_stream(s[d]);
    }
    buf.reset();
    for (int d = 0; d < 2; ++d) {
      pipes[d]->copy_to_host_async(back.data(), dev[d], bytes, s[d]);
      CHECK(first_mismatch(back.data(), bytes, 62) == bytes);
    }
    for (int d = 0; d < 2; ++d) {
      REQUIRE(cudaStreamSynchronize(s[d]) == cudaSuccess);
      CHECK(cudaFree(dev[d]) == cudaSuccess);
    }
    pipes.clear();
    for (auto st : s) { CHECK(cudaStreamDestroy(st) == cudaSuccess); }
  }
}
