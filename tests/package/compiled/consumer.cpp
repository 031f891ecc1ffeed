// SPDX-License-Identifier: Apache-2.0
// The program the compiled-mode consumer projects build and run: it links gpukit::compiled, whose
// instantiations over both runtimes, and sim_runtime's own bodies, this translation unit must not
// compile itself (consumer.cmake checks its object), and uses them: a round trip through the
// caching allocator, the pinned pool and the transfer pipeline on the simulated GPU, then one
// checkpointed step through the executor there, whose requested-bytes peak must be the plan's;
// the same round trip on a GPU, or, without one, the runtime's error from the library's code.
#include <gpukit/checkpoint/executor.hpp>
#include <gpukit/checkpoint/planners.hpp>
#include <gpukit/host/pinned_pool.hpp>
#include <gpukit/memory/caching_allocator.hpp>
#include <gpukit/runtime/cuda_runtime.hpp>
#include <gpukit/runtime/sim_runtime.hpp>
#include <gpukit/transfer/transfer_pipeline.hpp>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <utility>
#include <vector>

#ifndef GPUKIT_COMPILED_LIBRARY
#error "gpukit::compiled must define GPUKIT_COMPILED_LIBRARY for its consumers"
#endif

namespace {

int fail(char const* what)
{
  std::fprintf(stderr, "compiled consumer: FAILED: %s\n", what);
  return 1;
}

// Host -> device -> host through the pipeline's staging buffers; true when the bytes came back.
template <class Runtime>
bool round_trip(Runtime& runtime)
{
  std::size_t const bytes = std::size_t{1} << 20;
  gpukit::basic_caching_allocator<Runtime> allocator{runtime, 0};
  gpukit::basic_pinned_pool<Runtime> pool{runtime};
  gpukit::basic_transfer_pipeline<Runtime> pipeline{runtime, pool};
  typename Runtime::stream_type stream{};
  GPUKIT_CUDA_TRY(runtime.stream_create(stream));
  std::vector<unsigned char> in(bytes), out(bytes, 0);
  for (std::size_t i = 0; i < bytes; ++i) { in[i] = static_cast<unsigned char>(i * 13 + 5); }
  void* device = allocator.allocate_async(bytes, stream);
  pipeline.copy_to_device_async(device, in.data(), bytes, stream);
  pipeline.copy_to_host_async(out.data(), device, bytes, stream);
  GPUKIT_CUDA_TRY(runtime.stream_synchronize(stream));
  allocator.deallocate_async(device, bytes, stream);
  allocator.forget_stream(stream);
  GPUKIT_CUDA_TRY(runtime.stream_destroy(stream));
  return in == out && allocator.stats().num_allocs == 1;
}

// Stages whose sizes alone matter: the executor allocates and frees their buffers.
struct sized_stages {
  using stream_type = gpukit::sim_runtime::stream_type;
  std::size_t output_bytes(std::size_t i) const { return 4096 * (i % 3 + 1); }
  std::size_t tape_bytes(std::size_t i) const { return 8192 * (i % 2 + 1); }
  void forward(std::size_t, void const*, void*, void*, gpukit::checkpoint_context const&,
               stream_type)
  {}
  void backward(std::size_t, void const*, void const*, void const*, void*,
                gpukit::checkpoint_context const&, stream_type)
  {}
};

// One step of 12 stages under plan_best at half the store-all peak; true when the allocator's
// requested-bytes peak is the plan's and every buffer came back.
bool checkpointed_step(gpukit::sim_runtime& sim)
{
  std::size_t const L = 12;
  sized_stages stages;
  std::vector<std::pair<std::int64_t, std::int64_t>> const times(L, {10, 20});
  auto const chain = gpukit::checkpoint_chain_of(stages, L, times);
  auto const plan  = gpukit::plan_best(chain, gpukit::plan_store_all(chain).peak / 2);
  gpukit::caching_allocator_options options;
  options.thread_cache_max_block_bytes = 0;  // every allocation takes the pool path: exact peaks
  gpukit::basic_caching_allocator<gpukit::sim_runtime> allocator{sim, 0, options};
  gpukit::sim_runtime::stream_type stream{};
  GPUKIT_CUDA_TRY(sim.stream_create(stream));
  void* x0 = nullptr;
  GPUKIT_CUDA_TRY(sim.malloc(&x0, stages.output_bytes(0)));
  gpukit::basic_checkpoint_executor<gpukit::sim_runtime> executor{allocator};
  auto const run = executor.run_async(plan.schedule, stages, L, x0, stream);
  GPUKIT_CUDA_TRY(sim.stream_synchronize(stream));
  auto const stats = allocator.stats();
  allocator.forget_stream(stream);
  GPUKIT_CUDA_TRY(sim.stream_destroy(stream));
  GPUKIT_CUDA_TRY(sim.free(x0));
  return plan.peak < gpukit::plan_store_all(chain).peak && run.predicted_peak == plan.peak &&
         stats.requested_bytes.peak == plan.peak && stats.requested_bytes.current == 0;
}

}  // namespace

int main()
{
  try {
    gpukit::sim_runtime sim{gpukit::sim_config{}.with_devices(1, std::size_t{1} << 30)};
    if (!round_trip(sim)) { return fail("the round trip on the simulated GPU changed the bytes"); }
    if (!checkpointed_step(sim)) {
      return fail("the checkpointed step's requested-bytes peak is not the plan's");
    }
    std::printf("compiled consumer: simulated GPU: round trip and checkpointed step: ok\n");
  } catch (std::exception const& e) {
    return fail(e.what());
  }

  auto& runtime       = gpukit::cuda_runtime::instance();
  int gpus            = 0;
  bool const have_gpu = runtime.device_count(gpus) == gpukit::cuda_runtime::success && gpus > 0;
  try {
    if (!round_trip(runtime)) { return fail("the round trip on the GPU changed the bytes"); }
    std::printf("compiled consumer: 1 MiB round trip on GPU 0: ok\n");
  } catch (std::exception const& e) {
    if (have_gpu) { return fail(e.what()); }
    std::printf("compiled consumer: no GPU, cuda_runtime reports: %s\n", e.what());
  }

  std::printf("compiled consumer: OK\n");
  return 0;
}
