// SPDX-License-Identifier: Apache-2.0
// replay_trace: replays a PyTorch allocation trace (../shared/traces format) through an allocator
// and reports how much memory it held and how fast it was.
//
//   replay_trace --trace FILE [--runtime sim|cuda] [--allocator
//   gpukit|gpukit_vmm|cuda_malloc|cuda_malloc_async|cub]
//                [--repeat N] [--page-bytes N]
//
// gpukit_vmm is gpukit's caching allocator with growable segments (segment_source::growable):
// device_allocs and device_frees then count pages mapped and unmapped.
//
// Trace lines: `a <id> <bytes> <stream>` allocates, `f <id>` frees, `#` starts a comment.
// The last line of standard output is one JSON object (nothing after it):
//   trace, runtime, allocator, events, peak_live_bytes (most requested bytes live at once),
//   peak_reserved_bytes (most bytes held from the runtime at once), ratio (reserved / live),
//   device_allocs and device_frees (segment calls to the runtime), ns_per_event.
// With --runtime sim, gpukit runs on a simulated GPU large enough for the trace (lazily backed,
// so a trace of tens of GB runs on a small machine). cub needs --runtime cuda.
// A malformed trace gets an error naming the line; the exit code is 2 for bad usage or input.
#include <gpukit/memory/allocation_trace.hpp>
#include <gpukit/memory/caching_allocator.hpp>
#include <gpukit/runtime/cuda_runtime.hpp>
#include <gpukit/runtime/sim_runtime.hpp>

#include <cub/util_allocator.cuh>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <vector>

namespace {

struct usage_error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

using trace = gpukit::allocation_trace;

trace load(std::string const& path)
{
  std::ifstream in{path, std::ios::binary};
  if (!in) { throw usage_error{"cannot open trace '" + path + "'"}; }
  try {
    return gpukit::read_allocation_trace(in, path);
  } catch (gpukit::trace_error const& e) {
    throw usage_error{e.what()};
  }
}

/// A command-line number: unsigned decimal digits only, within [low, high].
std::uint64_t parse_number(std::string const& option, std::string const& text, std::uint64_t low,
                           std::uint64_t high)
{
  std::uint64_t v = 0;
  if (!gpukit::detail::parse_trace_number(text, v) || v < low || v > high) {
    throw usage_error{option + " takes a whole number from " + std::to_string(low) + " to " +
                      std::to_string(high) + ", not '" + text + "'"};
  }
  return v;
}

struct result {
  std::size_t peak_reserved{0};
  std::uint64_t device_allocs{0};
  std::uint64_t device_frees{0};
  double ns_per_event{0};
};

using clk = std::chrono::steady_clock;

// Replays `t` `repeat` times with alloc(bytes, stream_index) / dealloc(ptr, bytes, stream_index);
// sample() is called after every allocation when given (an untimed pass measures memory).
template <class Alloc, class Dealloc>
double replay(trace const& t, int repeat, Alloc&& alloc, Dealloc&& dealloc)
{
  std::vector<void*> ptrs;
  std::vector<std::size_t> sizes;
  std::vector<int> streams;
  ptrs.assign(t.ids, nullptr);
  sizes.assign(t.ids, 0);
  streams.assign(t.ids, 0);
  auto const t0 = clk::now();
  for (int r = 0; r < repeat; ++r) {
    for (auto const& e : t.events) {
      if (e.alloc) {
        ptrs[e.id]    = e.bytes == 0 ? nullptr : alloc(e.bytes, e.stream);
        sizes[e.id]   = e.bytes;
        streams[e.id] = e.stream;
      } else if (ptrs[e.id] != nullptr) {
        dealloc(ptrs[e.id], sizes[e.id], streams[e.id]);
        ptrs[e.id] = nullptr;
      }
    }
    // Whatever the trace leaves live is freed between repetitions (not timed as events).
    for (std::size_t i = 0; i < t.ids; ++i) {
      if (ptrs[i] != nullptr) {
        dealloc(ptrs[i], sizes[i], streams[i]);
        ptrs[i] = nullptr;
      }
    }
  }
  return std::chrono::duration<double, std::nano>(clk::now() - t0).count() /
         (static_cast<double>(t.events.size()) * repeat);
}

template <class Runtime>
result run_gpukit(Runtime& rt, trace const& t, int repeat,
                  gpukit::caching_allocator_options const& options)
{
  std::vector<typename Runtime::stream_type> streams(std::max<std::size_t>(t.streams, 1));
  for (auto& s : streams) { GPUKIT_CUDA_TRY(rt.stream_create(s)); }
  result res;
  {
    gpukit::basic_caching_allocator<Runtime> alloc{rt, 0, options};
    res.ns_per_event = replay(
      t, repeat,
      [&](std::size_t b, int s) {
        return alloc.allocate_async(b, streams[static_cast<std::size_t>(s)]);
      },
      [&](void* p, std::size_t b, int s) {
        alloc.deallocate_async(p, b, streams[static_cast<std::size_t>(s)]);
      });
    auto const st     = alloc.stats();
    res.peak_reserved = static_cast<std::size_t>(st.reserved_bytes.peak);
    res.device_allocs = st.num_device_allocs;
    res.device_frees  = st.num_device_frees;
    for (auto& s : streams) {
      GPUKIT_CUDA_TRY(rt.stream_synchronize(s));
      alloc.forget_stream(s);
    }
  }
  for (auto& s : streams) { GPUKIT_CUDA_TRY(rt.stream_destroy(s)); }
  return res;
}

// cudaMalloc / cudaMallocAsync / CUB through the CUDA runtime directly, as users call them.
result run_cuda_anchor(std::string const& which, trace const& t, int repeat)
{
  std::vector<cudaStream_t> streams(std::max<std::size_t>(t.streams, 1));
  for (auto& s : streams) { GPUKIT_CUDA_TRY(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking)); }
  result res;
  std::size_t free0 = 0, total = 0;
  GPUKIT_CUDA_TRY(cudaMemGetInfo(&free0, &total));
  if (which == "cuda_malloc") {
    auto a = [&](std::size_t b, int) {
      void* p = nullptr;
      GPUKIT_CUDA_TRY(cudaMalloc(&p, b));
      ++res.device_allocs;
      return p;
    };
    auto d = [&](void* p, std::size_t, int) {
      GPUKIT_CUDA_TRY(cudaFree(p));
      ++res.device_frees;
    };
    res.ns_per_event = replay(t, repeat, a, d);
    // Memory: an untimed pass that reads the device's used memory after every allocation.
    std::size_t peak = 0;
    replay(
      t, 1,
      [&](std::size_t b, int s) {
        void* p       = a(b, s);
        std::size_t f = 0, tt = 0;
        GPUKIT_CUDA_TRY(cudaMemGetInfo(&f, &tt));
        peak = std::max(peak, free0 - std::min(free0, f));
        return p;
      },
      d);
    res.peak_reserved = peak;
    res.device_allocs /= static_cast<std::uint64_t>(repeat + 1);
    res.device_frees /= static_cast<std::uint64_t>(repeat + 1);
  } else if (which == "cuda_malloc_async") {
    cudaMemPool_t pool;
    GPUKIT_CUDA_TRY(cudaDeviceGetDefaultMemPool(&pool, 0));
    std::uint64_t thr = ~std::uint64_t{0};
    GPUKIT_CUDA_TRY(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &thr));
    std::uint64_t zero = 0;
    GPUKIT_CUDA_TRY(cudaMemPoolTrimTo(pool, 0));
    GPUKIT_CUDA_TRY(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReservedMemHigh, &zero));
    res.ns_per_event = replay(
      t, repeat,
      [&](std::size_t b, int s) {
        void* p = nullptr;
        GPUKIT_CUDA_TRY(cudaMallocAsync(&p, b, streams[static_cast<std::size_t>(s)]));
        return p;
      },
      [&](void* p, std::size_t, int s) {
        GPUKIT_CUDA_TRY(cudaFreeAsync(p, streams[static_cast<std::size_t>(s)]));
      });
    std::uint64_t high = 0;
    GPUKIT_CUDA_TRY(cudaMemPoolGetAttribute(pool, cudaMemPoolAttrReservedMemHigh, &high));
    res.peak_reserved = static_cast<std::size_t>(high);
  } else {  // cub
    cub::CachingDeviceAllocator cub_alloc(8, 3, 10, std::size_t{64} << 30);
    std::size_t peak = 0;
    auto a           = [&](std::size_t b, int s) {
      void* p = nullptr;
      GPUKIT_CUDA_TRY(cub_alloc.DeviceAllocate(&p, b, streams[static_cast<std::size_t>(s)]));
      return p;
    };
    auto d           = [&](void* p, std::size_t, int) { GPUKIT_CUDA_TRY(cub_alloc.DeviceFree(p)); };
    res.ns_per_event = replay(t, repeat, a, d);
    GPUKIT_CUDA_TRY(cub_alloc.FreeAllCached());
    replay(
      t, 1,
      [&](std::size_t b, int s) {
        void* p       = a(b, s);
        auto const& c = cub_alloc.cached_bytes[0];
        peak          = std::max(peak, c.free + c.live);
        return p;
      },
      d);
    res.peak_reserved = peak;
    GPUKIT_CUDA_TRY(cub_alloc.FreeAllCached());
  }
  for (auto& s : streams) {
    GPUKIT_CUDA_TRY(cudaStreamSynchronize(s));
    GPUKIT_CUDA_TRY(cudaStreamDestroy(s));
  }
  return res;
}

std::string base_name(std::string const& path)
{
  auto const slash = path.find_last_of('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

}  // namespace

int main(int argc, char** argv)
{
  std::string trace_path, runtime = "sim", allocator = "gpukit";
  int repeat = 3;
  gpukit::caching_allocator_options options;
  try {
    for (int i = 1; i < argc; ++i) {
      std::string const a = argv[i];
      auto value          = [&]() -> std::string {
        if (i + 1 >= argc) { throw usage_error{a + " needs a value"}; }
        return argv[++i];
      };
      if (a == "--trace") {
        trace_path = value();
      } else if (a == "--runtime") {
        runtime = value();
      } else if (a == "--allocator") {
        allocator = value();
      } else if (a == "--thread-cache-bytes") {
        options.thread_cache_bytes = parse_number(a, value(), 0, std::size_t{1} << 48);
      } else if (a == "--thread-cache-max-block") {
        options.thread_cache_max_block_bytes = parse_number(a, value(), 0, std::size_t{1} << 48);
      } else if (a == "--medium-segment") {
        options.medium_segment_bytes = parse_number(a, value(), 0, std::size_t{1} << 48);
      } else if (a == "--page-bytes") {
        options.growable_page_bytes = parse_number(a, value(), 0, std::size_t{1} << 48);
      } else if (a == "--no-release-before-grow") {
        options.release_before_grow = false;
      } else if (a == "--repeat") {
        repeat = static_cast<int>(parse_number(a, value(), 1, 1000000));
      } else if (a == "--help" || a == "-h") {
        std::printf(
          "usage: replay_trace --trace FILE [--runtime sim|cuda] "
          "[--allocator gpukit|gpukit_vmm|cuda_malloc|cuda_malloc_async|cub] [--repeat N] "
          "[--page-bytes N]\n");
        return 0;
      } else {
        throw usage_error{"unknown argument '" + a + "'"};
      }
    }
    if (trace_path.empty()) { throw usage_error{"--trace FILE is required"}; }
    if (runtime != "sim" && runtime != "cuda") {
      throw usage_error{"--runtime must be sim or cuda, not '" + runtime + "'"};
    }
    if (allocator != "gpukit" && allocator != "gpukit_vmm" && allocator != "cuda_malloc" &&
        allocator != "cuda_malloc_async" && allocator != "cub") {
      throw usage_error{
        "--allocator must be gpukit, gpukit_vmm, cuda_malloc, cuda_malloc_async or cub, not '" +
        allocator + "'"};
    }
    bool const is_gpukit = allocator == "gpukit" || allocator == "gpukit_vmm";
    if (allocator == "gpukit_vmm") { options.source = gpukit::segment_source::growable; }
    if (!is_gpukit && runtime != "cuda") {
      throw usage_error{"--allocator " + allocator + " needs --runtime cuda"};
    }
    if (repeat < 1) { throw usage_error{"--repeat must be at least 1"}; }

    trace const t = load(trace_path);
    std::printf(
      "trace %s: %zu events, %zu stream(s), peak live %.2f GiB, %zu zero-byte allocations "
      "skipped\n",
      trace_path.c_str(), t.events.size(), t.streams, t.peak_live_bytes / 1073741824.0,
      t.zero_byte_allocs);
    result r;
    if (runtime == "sim") {
      std::size_t const capacity =
        std::max<std::size_t>(std::size_t{80} << 30, 4 * t.peak_live_bytes);
      gpukit::sim_runtime sim{gpukit::sim_config{}.with_devices(1, capacity)};
      r = run_gpukit(sim, t, repeat, options);
    } else if (is_gpukit) {
      r = run_gpukit(gpukit::cuda_runtime::instance(), t, repeat, options);
    } else {
      r = run_cuda_anchor(allocator, t, repeat);
    }
    std::printf(
      "{\"trace\": \"%s\", \"runtime\": \"%s\", \"allocator\": \"%s\", \"events\": %zu, "
      "\"peak_live_bytes\": %zu, \"peak_reserved_bytes\": %zu, \"ratio\": %.4f, \"device_allocs\": "
      "%llu, "
      "\"device_frees\": %llu, \"ns_per_event\": %.1f, \"repeat\": %d}\n",
      base_name(trace_path).c_str(), runtime.c_str(), allocator.c_str(), t.events.size(),
      t.peak_live_bytes, r.peak_reserved,
      t.peak_live_bytes == 0 ? 0.0 : static_cast<double>(r.peak_reserved) / t.peak_live_bytes,
      static_cast<unsigned long long>(r.device_allocs),
      static_cast<unsigned long long>(r.device_frees), r.ns_per_event, repeat);
    return 0;
  } catch (usage_error const& e) {
    std::fprintf(stderr, "replay_trace: %s\n", e.what());
    return 2;
  } catch (std::exception const& e) {
    std::fprintf(stderr, "replay_trace: %s\n", e.what());
    return 1;
  }
}
