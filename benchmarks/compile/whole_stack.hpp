// SPDX-License-Identifier: Apache-2.0
// What the translation units scripts/compile-time times hold, over a runtime of their choice:
// what a training program's step source typically holds, the whole stack. The caching allocator,
// the pinned pool and the transfer pipeline, each used through its common calls; a checkpoint
// plan (plan_best) for a chain of stages, run by the checkpoint executor with offloading through
// the pipeline. Compiled header-only and in the compiled mode, never run.
#pragma once

#include <gpukit/checkpoint/executor.hpp>
#include <gpukit/checkpoint/planners.hpp>
#include <gpukit/host/pinned_pool.hpp>
#include <gpukit/memory/caching_allocator.hpp>
#include <gpukit/transfer/transfer_pipeline.hpp>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <utility>
#include <vector>

namespace whole_stack {

// L stages of `width` floats each, as a model's stages would be (their work left out).
template <class Runtime>
struct stages {
  using stream_type = typename Runtime::stream_type;
  std::size_t width;

  std::size_t output_bytes(std::size_t) const { return width * sizeof(float); }
  std::size_t tape_bytes(std::size_t) const { return 2 * width * sizeof(float); }
  void forward(std::size_t, void const*, void*, void*, gpukit::checkpoint_context const&,
               stream_type)
  {}
  void backward(std::size_t, void const*, void const*, void const*, void*,
                gpukit::checkpoint_context const&, stream_type)
  {}
};

template <class Runtime>
int step(Runtime& runtime)
{
  gpukit::basic_caching_allocator<Runtime> allocator{runtime, 0};
  gpukit::basic_pinned_pool<Runtime> pool{runtime};
  gpukit::basic_transfer_pipeline<Runtime> pipeline{runtime, pool};

  typename Runtime::stream_type stream{};
  std::size_t const bytes = std::size_t{1} << 20;
  std::vector<unsigned char> host(bytes, 1);
  void* input = allocator.allocate_async(bytes, stream);
  allocator.record_stream(input, pipeline.h2d_stream());
  pipeline.copy_to_device_async(input, host.data(), bytes, stream);
  {
    auto staging = pool.acquire(bytes);
    staging.record_stream(stream);
  }

  std::size_t const L = 16;
  stages<Runtime> model{bytes / sizeof(float)};
  std::vector<std::pair<std::int64_t, std::int64_t>> const times(L, {10, 20});
  gpukit::checkpoint_chain const chain = gpukit::checkpoint_chain_of(model, L, times);
  gpukit::checkpoint_plan const plan =
    gpukit::plan_best(chain, gpukit::plan_store_all(chain).peak / 2);
  gpukit::basic_checkpoint_executor<Runtime> executor{allocator};
  executor.enable_offload(pipeline);
  auto const run = executor.run_async(plan.schedule, model, L, input, stream);

  pipeline.copy_to_host_async(host.data(), input, bytes, stream);
  allocator.deallocate_async(input, bytes, stream);
  allocator.forget_stream(stream);
  auto const a = allocator.stats();
  auto const p = pool.stats();
  auto const t = pipeline.stats();
  std::printf("%lld %lld %llu %lld\n", static_cast<long long>(a.reserved_bytes.current),
              static_cast<long long>(p.reserved_bytes.current),
              static_cast<unsigned long long>(t.transfers),
              static_cast<long long>(run.predicted_peak));
  allocator.release();
  pool.release_cached();
  return 0;
}

}  // namespace whole_stack
