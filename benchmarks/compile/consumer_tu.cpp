// SPDX-License-Identifier: Apache-2.0
// The translation unit scripts/compile-time times: what a training program's data-loading source
// typically holds, the caching allocator, the pinned pool and the transfer pipeline over the CUDA
// runtime, each used through its common calls. Compiled header-only and in the compiled mode
// (GPUKIT_COMPILED_LIBRARY, gpukit::compiled), never run.
#include <gpukit/host/pinned_pool.hpp>
#include <gpukit/memory/caching_allocator.hpp>
#include <gpukit/runtime/cuda_runtime.hpp>
#include <gpukit/transfer/transfer_pipeline.hpp>

#include <cstddef>
#include <cstdio>
#include <vector>

int main()
{
  auto& runtime = gpukit::cuda_runtime::instance();
  gpukit::caching_allocator allocator{runtime, 0};
  gpukit::pinned_pool pool{runtime};
  gpukit::transfer_pipeline pipeline{runtime, pool};

  gpukit::cuda_runtime::stream_type stream{};
  std::size_t const bytes = std::size_t{1} << 20;
  std::vector<unsigned char> host(bytes, 1);
  void* device = allocator.allocate_async(bytes, stream);
  allocator.record_stream(device, pipeline.h2d_stream());
  pipeline.copy_to_device_async(device, host.data(), bytes, stream);
  pipeline.copy_to_host_async(host.data(), device, bytes, stream);
  {
    auto staging = pool.acquire(bytes);
    staging.record_stream(stream);
  }
  allocator.deallocate_async(device, bytes, stream);
  allocator.forget_stream(stream);
  auto const a = allocator.stats();
  auto const p = pool.stats();
  auto const t = pipeline.stats();
  std::printf("%lld %lld %llu\n", static_cast<long long>(a.reserved_bytes.current),
              static_cast<long long>(p.reserved_bytes.current),
              static_cast<unsigned long long>(t.transfers));
  allocator.release();
  pool.release_cached();
  return 0;
}
