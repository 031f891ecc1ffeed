// SPDX-License-Identifier: Apache-2.0
// The program the compiled-mode consumer projects build and run: it links gpukit::compiled, whose
// instantiations over cuda_runtime this translation unit must not compile itself (consumer.cmake
// checks its object), and uses them: a round trip through the caching allocator, the pinned pool
// and the transfer pipeline on a GPU, or, without one, the runtime's error from the library's code.
// The simulated GPU is left to the header-only consumers: sim_runtime's instantiations stay
// header-only, and would cost this test a whole allocator's compile.
#include <gpukit/host/pinned_pool.hpp>
#include <gpukit/memory/caching_allocator.hpp>
#include <gpukit/runtime/cuda_runtime.hpp>
#include <gpukit/transfer/transfer_pipeline.hpp>

#include <cstddef>
#include <cstdio>
#include <exception>
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
bool round_trip(gpukit::cuda_runtime& runtime)
{
  std::size_t const bytes = std::size_t{1} << 20;
  gpukit::caching_allocator allocator{runtime, 0};
  gpukit::pinned_pool pool{runtime};
  gpukit::transfer_pipeline pipeline{runtime, pool};
  gpukit::cuda_runtime::stream_type stream{};
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

}  // namespace

int main()
{
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
