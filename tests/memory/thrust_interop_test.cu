// SPDX-License-Identifier: Apache-2.0
// Thrust containers and algorithms, and CUB's temporary storage, on gpukit's caching allocator.
#include <gpukit/memory/caching_allocator.hpp>
#include <gpukit/memory/temp_storage.hpp>
#include <gpukit/memory/thrust_allocator.cuh>

#include <doctest/doctest.h>

#include <thrust/device_vector.h>
#include <thrust/execution_policy.h>
#include <thrust/reduce.h>
#include <thrust/sequence.h>
#include <cub/device/device_reduce.cuh>

TEST_SUITE("gpu")
{
  TEST_CASE("thrust::device_vector and thrust::reduce on gpukit's allocator")
  {
    auto& alloc = gpukit::default_caching_allocator(0);
    cudaStream_t s{};
    GPUKIT_CUDA_TRY(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    auto const before = alloc.stats().num_allocs;
    {
      gpukit::thrust_allocator<int> ta{alloc, s};
      thrust::device_vector<int, gpukit::thrust_allocator<int>> v(100000, 0, ta);
      thrust::sequence(thrust::cuda::par.on(s), v.begin(), v.end());
      long long const sum = thrust::reduce(
        thrust::cuda::par(gpukit::thrust_allocator<char>{alloc, s}).on(s), v.begin(), v.end(), 0LL);
      CHECK(sum == 100000LL * 99999LL / 2);
      thrust::device_vector<int, gpukit::thrust_allocator<int>> empty(0, 0, ta);  // no allocation
      CHECK(empty.size() == 0);
    }
    CHECK(alloc.stats().num_allocs > before);
    CHECK(alloc.stats().allocation_count.current == 0);
    GPUKIT_CUDA_TRY(cudaStreamSynchronize(s));
    alloc.forget_stream(s);
    GPUKIT_CUDA_TRY(cudaStreamDestroy(s));
  }

  TEST_CASE("CUB's DeviceReduce with temporary storage from gpukit")
  {
    auto& alloc = gpukit::default_caching_allocator(0);
    cudaStream_t s{};
    GPUKIT_CUDA_TRY(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    int const n = 1 << 20;
    int* in     = static_cast<int*>(alloc.allocate_async(n * sizeof(int), s));
    int* out    = static_cast<int*>(alloc.allocate_async(sizeof(int), s));
    thrust::sequence(thrust::cuda::par.on(s), in, in + n, 0);
    gpukit::with_temp_storage(alloc, s, [&](void* storage, std::size_t& bytes) {
      return cub::DeviceReduce::Max(storage, bytes, in, out, n, s);
    });
    int host = 0;
    GPUKIT_CUDA_TRY(cudaMemcpyAsync(&host, out, sizeof(int), cudaMemcpyDeviceToHost, s));
    GPUKIT_CUDA_TRY(cudaStreamSynchronize(s));
    CHECK(host == n - 1);
    alloc.deallocate_async(in, n * sizeof(int), s);
    alloc.deallocate_async(out, sizeof(int), s);
    alloc.forget_stream(s);
    GPUKIT_CUDA_TRY(cudaStreamDestroy(s));
  }
}
