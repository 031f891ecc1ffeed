// SPDX-License-Identifier: Apache-2.0
// prefetch_training_loop.cpp: a training loop whose input batches arrive through gpukit's
// prefetcher. Batches live in ordinary (pageable) host memory, as a data loader leaves them; the
// prefetcher stages each one through pinned chunks with several host threads and copies it to a
// device buffer from the caching allocator while the previous batch computes. The compute stream
// waits on each batch's event: nothing in the loop synchronizes the device.
//
//   build/dev/examples/prefetch_training_loop [--sim]   # --sim: the simulated GPU
//
// There are no kernels here (gpukit's examples compile with any host compiler): "forward" is a
// device-to-device copy of the batch into an activation buffer, and the "loss" read back each
// step is the activation's first bytes, checked against the batch on the host.
#include <gpukit/error.hpp>
#include <gpukit/host/pinned_pool.hpp>
#include <gpukit/memory/caching_allocator.hpp>
#include <gpukit/runtime/cuda_runtime.hpp>
#include <gpukit/runtime/sim_runtime.hpp>
#include <gpukit/transfer/prefetcher.hpp>
#include <gpukit/transfer/transfer_pipeline.hpp>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <vector>

namespace {

constexpr std::size_t mib = std::size_t{1} << 20;

template <class Runtime>
int train(Runtime& rt, std::size_t steps, std::size_t batch_bytes)
{
  // The data set: pageable host memory, a different pattern per batch.
  std::vector<std::vector<std::uint32_t>> dataset(steps);
  for (std::size_t i = 0; i < steps; ++i) {
    dataset[i].resize(batch_bytes / sizeof(std::uint32_t) - i);  // sizes vary a little
    for (std::size_t k = 0; k < dataset[i].size(); ++k) {
      dataset[i][k] = static_cast<std::uint32_t>((i + 1) * 2654435761u ^ k);
    }
  }

  gpukit::basic_pinned_pool<Runtime> pool{rt};
  gpukit::transfer_options options;
  options.chunk_bytes = 4 * mib;  // small batches: small chunks
  gpukit::basic_transfer_pipeline<Runtime> pipeline{rt, pool, options};
  pipeline.prewarm();  // pin the staging rings before the loop
  gpukit::basic_caching_allocator<Runtime> alloc{rt, 0};

  typename Runtime::stream_type compute{};
  GPUKIT_CUDA_TRY(rt.stream_create(compute));
  void* activations = alloc.allocate_async(batch_bytes, compute);
  std::vector<std::uint32_t> loss(1024);
  std::size_t bad_steps = 0;
  auto const start      = std::chrono::steady_clock::now();
  {
    gpukit::basic_prefetcher<Runtime> loader{
      pipeline, alloc, [&](std::size_t i) {
        if (i == steps) { return gpukit::host_batch{}; }
        auto const& b = dataset[i];
        return gpukit::host_batch{b.data(), b.size() * sizeof(std::uint32_t)};
      }};
    // The loop: batch i+1 is staged and copied while batch i computes.
    while (auto batch = loader.next(compute)) {  // compute waits on the batch's event
      GPUKIT_CUDA_TRY(rt.memcpy_async(activations, batch->data, batch->bytes,
                                      gpukit::memcpy_kind::device_to_device, compute));  // forward
      pipeline.copy_to_host_async(loss.data(), activations, loss.size() * sizeof(std::uint32_t),
                                  compute);  // the step's loss, back on the host
      if (std::memcmp(loss.data(), dataset[batch->index].data(),
                      loss.size() * sizeof(std::uint32_t)) != 0) {
        ++bad_steps;
      }
      loader.release(*batch, compute);  // reused once compute's work on it is done
    }
  }
  GPUKIT_CUDA_TRY(rt.stream_synchronize(compute));
  double const seconds =
    std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  alloc.deallocate_async(activations, batch_bytes, compute);
  alloc.forget_stream(compute);
  GPUKIT_CUDA_TRY(rt.stream_destroy(compute));

  auto const ts = pipeline.stats();
  auto const ps = pool.stats();
  std::printf("%zu steps of %zu MiB batches from pageable memory in %.3f s (%.1f GB/s of input)\n",
              steps, batch_bytes / mib, seconds, static_cast<double>(ts.h2d_bytes) / seconds / 1e9);
  std::printf("pipeline: %llu chunks staged by %d threads, %llu waits for a chunk's copy\n",
              static_cast<unsigned long long>(ts.chunks), pipeline.options().staging_threads,
              static_cast<unsigned long long>(ts.chunk_waits));
  std::printf("pinned pool: %.0f MiB pinned in %llu growth(s), %llu cache hits\n",
              static_cast<double>(ps.reserved_bytes.peak) / mib,
              static_cast<unsigned long long>(ps.num_growths),
              static_cast<unsigned long long>(ps.num_cache_hits));
  if (Runtime::is_simulated) {
    std::printf("  (simulated GPU: host memcpy into lazily backed memory; not a GPU's speed)\n");
  }
  std::printf("every step saw its own batch: %s\n", bad_steps == 0 ? "yes" : "NO");
  return bad_steps == 0 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv)
{
  bool const force_sim = argc > 1 && std::strcmp(argv[1], "--sim") == 0;
  try {
    int count = 0;
    if (!force_sim && gpukit::cuda_runtime::instance().device_count(count) == cudaSuccess &&
        count > 0) {
      std::printf("running on the GPU\n");
      return train(gpukit::cuda_runtime::instance(), 64, 64 * mib);
    }
    std::printf("running on the simulated GPU%s\n", force_sim ? " (--sim)" : " (no usable GPU)");
    return train(gpukit::sim_runtime::instance(), 16, 8 * mib);
  } catch (std::exception const& e) {
    std::fprintf(stderr, "prefetch_training_loop: %s\n", e.what());
    return 1;
  }
}
