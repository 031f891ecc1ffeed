// SPDX-License-Identifier: Apache-2.0
// demo.cpp: the first program to run. It picks the real GPU when there is one, and otherwise
// the simulated GPU that ships with gpukit, says which, and walks through what gpukit does today:
// a stream, a pinned host buffer, a device buffer, a host-to-device and a device-to-host copy
// timed with events, and a check that the bytes came back.
//
//   scripts/demo            # configure, build and run this program
//   build/dev/examples/demo [--sim]   # --sim: use the simulated GPU even when a GPU is present
//
// Everything below `main` is a template over the Runtime (gpukit/runtime/runtime.hpp): the same
// code drives the H200 and the simulated GPU. Later issues extend this file until it walks
// through a whole training step (DESIGN.md, "Data flowing through one training step").
#include <gpukit/error.hpp>
#include <gpukit/memory/caching_allocator.hpp>
#include <gpukit/memory/retry_on_oom.hpp>
#include <gpukit/runtime/cuda_runtime.hpp>
#include <gpukit/runtime/runtime.hpp>
#include <gpukit/runtime/sim_runtime.hpp>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

namespace {

constexpr std::size_t mib = std::size_t{1} << 20;
constexpr std::size_t gib = std::size_t{1} << 30;

std::string cuda_version(int v)
{
  return std::to_string(v / 1000) + "." + std::to_string(v % 1000 / 10);
}

/// Prints what the demo runs on: the device's name, memory and CUDA versions, or the simulated
/// GPU's capacity.
template <class Runtime>
void describe(Runtime& rt)
{
  int device = 0;
  GPUKIT_CUDA_TRY(rt.get_device(device));
  gpukit::device_properties props;
  GPUKIT_CUDA_TRY(rt.get_device_properties(props, device));
  std::size_t free = 0, total = 0;
  GPUKIT_CUDA_TRY(rt.mem_get_info(free, total));
  if constexpr (Runtime::is_simulated) {
    std::printf("running on: simulated GPU, %.1f GiB (%s, device %d; free %.1f GiB)\n",
                static_cast<double>(total) / gib, props.name.c_str(), device,
                static_cast<double>(free) / gib);
  } else {
    int driver = 0, runtime = 0;
    GPUKIT_CUDA_TRY(rt.driver_version(driver));
    GPUKIT_CUDA_TRY(rt.runtime_version(runtime));
    std::printf(
      "running on: GPU %d: %s (compute capability %d.%d, %d SMs), %.1f GiB (%.1f GiB free)\n",
      device, props.name.c_str(), props.major, props.minor, props.multiprocessor_count,
      static_cast<double>(total) / gib, static_cast<double>(free) / gib);
    std::printf("            CUDA driver %s, runtime %s\n", cuda_version(driver).c_str(),
                cuda_version(runtime).c_str());
  }
}

/// One round trip through the device: pinned host -> device -> pinned host, on one stream,
/// timed with events. Returns true when every byte came back.
template <class Runtime>
bool round_trip(Runtime& rt, std::size_t bytes)
{
  typename Runtime::stream_type stream{};
  GPUKIT_CUDA_TRY(rt.stream_create(stream));

  // Pinned host buffers: copies from them are truly asynchronous (and fast on a real GPU).
  void* host_src = nullptr;
  void* host_dst = nullptr;
  GPUKIT_CUDA_TRY(rt.host_alloc(&host_src, bytes, gpukit::host_alloc_flags::none));
  GPUKIT_CUDA_TRY(rt.host_alloc(&host_dst, bytes, gpukit::host_alloc_flags::none));
  auto* src = static_cast<std::uint32_t*>(host_src);
  for (std::size_t i = 0; i < bytes / sizeof(std::uint32_t); ++i) {
    src[i] = static_cast<std::uint32_t>(i * 2654435761u);  // a pattern that differs per word
  }
  std::memset(host_dst, 0, bytes);

  // A stream-ordered device allocation: usable by work queued on `stream` after it.
  void* device_buf = nullptr;
  GPUKIT_CUDA_TRY(rt.malloc_async(&device_buf, bytes, stream));

  typename Runtime::event_type start{}, after_h2d{}, after_d2h{};
  GPUKIT_CUDA_TRY(rt.event_create(start, /*timing=*/true));
  GPUKIT_CUDA_TRY(rt.event_create(after_h2d, /*timing=*/true));
  GPUKIT_CUDA_TRY(rt.event_create(after_d2h, /*timing=*/true));

  GPUKIT_CUDA_TRY(rt.event_record(start, stream));
  GPUKIT_CUDA_TRY(
    rt.memcpy_async(device_buf, host_src, bytes, gpukit::memcpy_kind::host_to_device, stream));
  GPUKIT_CUDA_TRY(rt.event_record(after_h2d, stream));
  GPUKIT_CUDA_TRY(
    rt.memcpy_async(host_dst, device_buf, bytes, gpukit::memcpy_kind::device_to_host, stream));
  GPUKIT_CUDA_TRY(rt.event_record(after_d2h, stream));
  GPUKIT_CUDA_TRY(rt.free_async(device_buf, stream));  // freed in stream order, after the copy

  // The only wait on the host: for the last event, not for the whole device.
  GPUKIT_CUDA_TRY(rt.event_synchronize(after_d2h));
  float h2d_ms = 0.0F, d2h_ms = 0.0F;
  GPUKIT_CUDA_TRY(rt.event_elapsed_time(h2d_ms, start, after_h2d));
  GPUKIT_CUDA_TRY(rt.event_elapsed_time(d2h_ms, after_h2d, after_d2h));
  bool const same = std::memcmp(host_src, host_dst, bytes) == 0;

  auto rate = [bytes](float ms) {
    return ms > 0.0F ? static_cast<double>(bytes) / (ms * 1e6) : 0.0;
  };
  std::printf("stream, pinned host buffers and a %zu MiB device buffer: ok\n", bytes / mib);
  std::printf("H2D copy: %.3f ms (%.1f GB/s), D2H copy: %.3f ms (%.1f GB/s), timed with events\n",
              h2d_ms, rate(h2d_ms), d2h_ms, rate(d2h_ms));
  if (Runtime::is_simulated) {
    std::printf("  (simulated GPU: host memcpy into lazily backed memory; not a GPU's speed)\n");
  }
  std::printf("round trip: %s\n", same ? "every byte came back" : "MISMATCH");

  GPUKIT_CUDA_TRY(rt.event_destroy(start));
  GPUKIT_CUDA_TRY(rt.event_destroy(after_h2d));
  GPUKIT_CUDA_TRY(rt.event_destroy(after_d2h));
  GPUKIT_CUDA_TRY(rt.host_free(host_src));
  GPUKIT_CUDA_TRY(rt.host_free(host_dst));
  GPUKIT_CUDA_TRY(rt.stream_destroy(stream));
  return same;
}

/// Training steps' memory through the caching allocator: activations piled up by a forward pass
/// and dropped by the backward pass, the batch made on a copy stream and used on the compute
/// stream (record_stream), then an out-of-memory that the loop adapts to (retry_on_oom).
template <class Runtime>
bool training_memory(Runtime& rt)
{
  gpukit::caching_allocator_options options;
  options.limit_bytes = 2 * gib;  // run as if on a 2 GiB device, so the last part fills it quickly
  gpukit::basic_caching_allocator<Runtime> alloc{rt, 0, options};
  typename Runtime::stream_type compute{}, copy{};
  GPUKIT_CUDA_TRY(rt.stream_create(compute));
  GPUKIT_CUDA_TRY(rt.stream_create(copy));
  auto step = [&](int micro_batch, std::size_t seq, std::size_t bytes_per_token) {
    // What the step holds, freed in reverse when it ends, by return or by exception (so that
    // retry_on_oom can run it again).
    struct held {
      gpukit::basic_caching_allocator<Runtime>& alloc;
      std::vector<std::tuple<void*, std::size_t, typename Runtime::stream_type>> blocks;
      void* take(std::size_t bytes, typename Runtime::stream_type s)
      {
        blocks.emplace_back(alloc.allocate_async(bytes, s), bytes, s);
        return std::get<0>(blocks.back());
      }
      ~held()
      {
        for (auto it = blocks.rbegin(); it != blocks.rend(); ++it) {
          alloc.deallocate_async(std::get<0>(*it), std::get<1>(*it), std::get<2>(*it));
        }
      }
    } h{alloc, {}};
    void* batch = h.take(static_cast<std::size_t>(micro_batch) * seq * 4, copy);
    alloc.record_stream(batch, compute);        // used on compute too: not reused before it is done
    for (int layer = 0; layer < 24; ++layer) {  // forward: activations pile up until backward
      (void)h.take(
        static_cast<std::size_t>(micro_batch) * seq * bytes_per_token * (layer % 4 == 0 ? 4 : 1),
        compute);
    }
  };
  for (int i = 0; i < 20; ++i) { step(8, 256, 96); }  // same shapes every step: reused from caches
  auto const st = alloc.stats();
  std::printf(
    "caching allocator, 20 steps: %llu allocations, %.0f%% served by per-thread caches, "
    "%llu segments taken; peak allocated %.1f MiB, peak reserved %.1f MiB\n",
    static_cast<unsigned long long>(st.num_allocs),
    100.0 * static_cast<double>(st.num_cache_hits) / static_cast<double>(st.num_allocs),
    static_cast<unsigned long long>(st.num_device_allocs),
    static_cast<double>(st.allocated_bytes.peak) / mib,
    static_cast<double>(st.reserved_bytes.peak) / mib);
  // A bigger model no longer fits in the 2 GiB limit: halve the micro-batch until it does.
  int micro_batch = 64;
  auto report     = gpukit::retry_on_oom(
        alloc, [&] { step(micro_batch, 1024, 1024); },
        [&](gpukit::out_of_memory const&, int) -> std::optional<std::string> {
      if (micro_batch == 1) { return std::nullopt; }
      micro_batch /= 2;
      return "micro-batch " + std::to_string(micro_batch);
    });
  std::printf("bigger model, limit 2 GiB: out of memory, then %zu retries (",
              report.changes.size());
  for (std::size_t i = 0; i < report.changes.size(); ++i) {
    std::printf("%s%s", i ? ", " : "", report.changes[i].c_str());
  }
  std::printf("): the step ran\n");
  if (!report.failures.empty()) {
    auto const& f = report.failures.front();
    std::printf("  first failure: %zu MiB asked, %zu MiB allocated, %zu MiB reserved; hint: %s\n",
                f.requested / mib, f.allocated / mib, f.reserved / mib, f.hint.c_str());
  }
  GPUKIT_CUDA_TRY(rt.stream_synchronize(compute));
  GPUKIT_CUDA_TRY(rt.stream_synchronize(copy));
  alloc.forget_stream(compute);
  alloc.forget_stream(copy);
  GPUKIT_CUDA_TRY(rt.stream_destroy(compute));
  GPUKIT_CUDA_TRY(rt.stream_destroy(copy));
  return alloc.stats().allocated_bytes.current == 0 && !report.changes.empty();
}

template <class Runtime>
int run(Runtime& rt)
{
  describe(rt);
  bool ok = round_trip(rt, 64 * mib);
  ok      = training_memory(rt) && ok;
  return ok ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv)
{
  bool const force_sim = argc > 1 && std::strcmp(argv[1], "--sim") == 0;
  try {
    auto& cuda               = gpukit::cuda_runtime::instance();
    int count                = 0;
    cudaError_t const status = force_sim ? cudaSuccess : cuda.device_count(count);
    if (!force_sim && status == cudaSuccess && count > 0) { return run(cuda); }
    if (force_sim) {
      std::printf("--sim: using the simulated GPU\n");
    } else {
      // Without libcuda, the CUDA runtime reports an "insufficient" driver: say what it means.
      char const* why = status == cudaSuccess ? "no CUDA devices"
                        : status == cudaErrorInsufficientDriver
                          ? "no CUDA driver, or one older than the runtime"
                          : gpukit::cuda_runtime::error_string(status);
      std::printf("no usable GPU (cudaGetDeviceCount: %s: %s): using the simulated GPU\n",
                  gpukit::cuda_runtime::error_name(status), why);
    }
    return run(gpukit::sim_runtime::instance());
  } catch (std::exception const& e) {
    std::fprintf(stderr, "demo: %s\n", e.what());
    return 1;
  }
}
