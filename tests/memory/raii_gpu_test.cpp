// SPDX-License-Identifier: Apache-2.0
// The RAII conformance suite on the real GPU, plus the public aliases over the CUDA runtime with
// their defaults (the current resource of the current device). Needs a GPU: without one the binary
// exits 77 (skipped).
#include "memory/raii_conformance.hpp"
#include "memory/raii_order.hpp"

#include <gpukit/runtime/cuda_runtime.hpp>

#include <doctest/doctest.h>

#include <cuda_runtime_api.h>

#include <cstddef>
#include <string>
#include <utility>
#include <vector>

TEST_SUITE("gpu")
{
  GPUKIT_RAII_CONFORMANCE_CASES(gpukit::cuda_runtime::instance(), "cuda_runtime")

  TEST_CASE("cuda_runtime: destruction order: every pair in both orders, and all in either order")
  {
    // As raii_order_test on the simulator; here the runtime's own checks are what can fail: no
    // call reports an error (a dead stream or event handle), and the device is left usable.
    auto& rt = gpukit::cuda_runtime::instance();
    REQUIRE(rt.set_device(0) == cudaSuccess);
    namespace ro = gpukit::test::raii_order;
    ro::every_order([&](std::vector<int> const& order) {
      std::string const what = ro::describe(order);
      CAPTURE(what);
      ro::build_and_destroy(rt, order, [] { REQUIRE(cudaGetLastError() == cudaSuccess); });
      CHECK(cudaGetLastError() == cudaSuccess);
    });
    void* p = nullptr;
    CHECK(cudaMalloc(&p, 1 << 20) == cudaSuccess);
    CHECK(cudaFree(p) == cudaSuccess);
  }

  TEST_CASE("cuda_runtime: the quick starts over the current resource")
  {
    REQUIRE(cudaSetDevice(0) == cudaSuccess);
    auto& mr = gpukit::get_current_device_resource();
    CHECK(&mr == &gpukit::default_caching_allocator(0));
    auto const allocated = [&] { return mr.stats().allocated_bytes.current; };
    auto const before    = allocated();
    {
      gpukit::cuda_stream s;
      gpukit::device_buffer b{1 << 20, s};
      CHECK(&b.allocator() == &mr);
      b.resize(2 << 20, s);
      gpukit::device_buffer moved = std::move(b);
      std::size_t const bytes     = moved.capacity();
      void* raw                   = moved.release();
      moved.allocator().deallocate_async(raw, bytes, s);

      gpukit::device_uvector<float> v{1000, s};
      std::vector<float> host(1000, 1.0f);
      v.copy_from_host_async(host.data(), host.size(), s);
      float const two = 2.0f;
      v.set_element_async(0, two, s);
      CHECK(v.element(0, s) == 2.0f);
      CHECK(v.element(999, s) == 1.0f);
      v.resize(2000, s);
      gpukit::device_buffer as_bytes = v.release();
      CHECK(as_bytes.size() == 2000 * sizeof(float));

      gpukit::device_scalar<int> count{0, s};
      CHECK(count.value(s) == 0);

      gpukit::stream_pool pool{4};
      gpukit::cuda_stream_view next = pool.get_stream();
      gpukit::device_buffer on_pool{4096, next};
      s.synchronize();
    }
    CHECK(allocated() == before);
  }
}
