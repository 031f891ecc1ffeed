// SPDX-License-Identifier: Apache-2.0
// gpukit/memory/temp_storage.hpp: temporary storage for CUB's two-phase algorithms.
//
// Quick start:
//
//   #include <gpukit/memory/temp_storage.hpp>
//
//   // A CUB-style algorithm (cub::DeviceReduce::Sum, say, called from a .cu file): with null
//   // storage it only sets `bytes`.
//   cudaError_t sum(void* storage, std::size_t& bytes, float const* in, float* out, int n,
//                   cudaStream_t stream);
//
//   void sum_async(gpukit::caching_allocator& alloc, float const* in, float* out, int n,
//                  cudaStream_t stream)
//   {
//     // CUB asks first for the size (null storage), then runs. One call does both, with the
//     // storage taken from a caching allocator in `stream` order and returned right after:
//     gpukit::with_temp_storage(alloc, stream, [&](void* storage, std::size_t& bytes) {
//       return sum(storage, bytes, in, out, n, stream);
//     });
//   }
//
// Does not synchronize: the storage is freed in `stream` order, so the algorithm's kernels (queued
// on `stream`) finish with it before any later work on `stream` can reuse it.
#pragma once

#include <gpukit/error.hpp>
#include <gpukit/error_macros.hpp>
#include <gpukit/memory/caching_allocator.hpp>

#include <cstddef>

namespace gpukit {

/// Runs `algorithm(void* storage, std::size_t& bytes) -> cudaError_t` twice, as CUB's device-wide
/// algorithms expect: with null storage to learn `bytes`, then with storage of that size from
/// `alloc`, allocated and freed on `stream` (the stream the algorithm itself must run on).
/// @throws gpukit::cuda_error when either call fails (the storage is freed first)
/// @throws what basic_caching_allocator::allocate_async throws
template <class Runtime, class Algorithm>
void with_temp_storage(basic_caching_allocator<Runtime>& alloc,
                       typename Runtime::stream_type stream, Algorithm&& algorithm)
{
  std::size_t bytes = 0;
  GPUKIT_CUDA_TRY(algorithm(static_cast<void*>(nullptr), bytes));
  std::size_t const asked =
    bytes == 0 ? 1 : bytes;  // CUB may ask for none; a real pointer is safer
  void* storage                        = alloc.allocate_async(asked, stream);
  typename Runtime::error_type const e = algorithm(storage, bytes);
  alloc.deallocate_async(storage, asked, stream);
  GPUKIT_CUDA_TRY(e, "the algorithm given temporary storage");
}

}  // namespace gpukit
