// SPDX-License-Identifier: Apache-2.0
// replay_trace: replays a PyTorch allocation trace (../shared/traces format) through an allocator
// and reports how much memory it held and how fast it was.
//
//   replay_trace --trace FILE [--runtime sim|cuda]
//                [--allocator gpukit|gpukit_vmm|cuda_malloc|cuda_malloc_async|cub]
//                [--repeat N] [--page-bytes N] [--medium-segment N] [--thread-cache-bytes N]
//                [--thread-cache-max-block N] [--no-release-before-grow]
//                [--busy-streams [--catch-up-every N]]
//
// gpukit_vmm is gpukit's caching allocator with growable segments (segment_source::growable):
// device_allocs and device_frees then count pages mapped and unmapped. The simulated GPU runs a
// stream's work as soon as it is queued, so its streams are idle whenever the allocator asks;
// --busy-streams (sim only) keeps every stream busy through the replay instead, as a GPU that
// trails the host is in training: what the allocator does only for idle streams (growable
// segments moving free pages to where the pool grows) then does not happen. --catch-up-every N
// lets the streams run what they had queued every N events (the GPU catching up; the times then
// include it).
//
// Trace lines: `a <id> <bytes> <stream>` allocates, `f <id>` frees, `#` starts a comment.
// The last line of standard output is one JSON object (nothing after it):
//   trace, runtime, allocator, events, peak_live_bytes (most requested bytes live at once),
//   peak_reserved_bytes (most bytes held from the runtime at once), ratio (reserved / live),
//   device_allocs and device_frees (segment calls to the runtime), ns_per_event, busy_streams,
//   catch_up_every.
// With --runtime sim, gpukit runs on a simulated GPU large enough for the trace (lazily backed,
// so a trace of tens of GB runs on a small machine). cub needs --runtime cuda.
// A malformed trace gets an error naming the line. Exit code: 0 ok; 2 for a bad command line (an
// unknown option, a value out of range: the message names the option, the value and what is
// allowed) or a malformed trace; 1 when the replay fails (a CUDA error, out of memory).
// replay_trace_cli.hpp parses the command line and replays through gpukit; this file adds the
// CUDA anchors (they need the CUDA runtime and CUB).
#include "replay_trace_cli.hpp"

#include <gpukit/runtime/cuda_runtime.hpp>

#include <cub/util_allocator.cuh>

#include <algorithm>
#include <cstdint>
#include <iostream>
#include <string>
#include <vector>

namespace {

using replay_trace_cli::replay;
using replay_trace_cli::result;
using replay_trace_cli::trace;

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

}  // namespace

int main(int argc, char** argv)
{
  return replay_trace_cli::run(argc, argv, std::cout, std::cerr, gpukit::cuda_runtime::instance(),
                               run_cuda_anchor);
}
