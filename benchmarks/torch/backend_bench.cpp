// SPDX-License-Identifier: Apache-2.0
// The PyTorch backend's allocate+deallocate path (bindings/torch/include/gpukit_torch/backend.hpp)
// on the simulated GPU: the calls PyTorch's raw_alloc_with_stream and raw_delete make, with
// nothing of PyTorch or CUDA in the way.
//
//   pairs/threads:N     64 KiB pairs, N threads, each on its own stream (aggregate rate)
//   mixed/threads:N     512 B..4 MiB, 16 blocks live per thread, freed oldest first
//
// One backend serves every registration. It counts with plain stores until a second thread
// allocates, and atomics for good after: threads:1 measures that single-thread mode only in a run
// of its own (--benchmark_filter='threads:1$'); after a run with more threads it measures the
// one-thread cost of the shared mode.
//
// Host-side calls are timed with a steady clock (real time). This is not an anchor comparison:
// PyTorch's own allocator runs in bindings/torch/benchmarks/threads_bench.py.
#include <gpukit/runtime/sim_runtime.hpp>
#include <gpukit_torch/backend.hpp>

#include <benchmark/benchmark.h>

#include <array>
#include <cstddef>
#include <vector>

namespace {

constexpr int max_threads = 16;

using sim_backend = gpukit_torch::backend<gpukit::sim_runtime>;

gpukit::sim_runtime& sim()
{
  static gpukit::sim_runtime s{gpukit::sim_config{}.with_devices(1, std::size_t{16} << 30)};
  return s;
}

sim_backend& backend()
{
  static sim_backend b{sim(), gpukit::parse_alloc_conf("segments:synchronous")};
  return b;
}

std::vector<gpukit::sim_runtime::stream_type>& streams()
{
  static std::vector<gpukit::sim_runtime::stream_type> s = [] {
    std::vector<gpukit::sim_runtime::stream_type> v(max_threads);
    for (auto& x : v) { GPUKIT_CUDA_TRY(sim().stream_create(x)); }
    return v;
  }();
  return s;
}

void pairs(benchmark::State& state)
{
  sim_backend& b = backend();
  auto const s   = streams()[static_cast<std::size_t>(state.thread_index())];
  for (auto _ : state) {
    void* p = b.allocate(0, std::size_t{64} << 10, s);
    benchmark::DoNotOptimize(p);
    b.deallocate(p);
  }
  state.SetItemsProcessed(state.iterations());
}

void mixed(benchmark::State& state)
{
  constexpr std::array<std::size_t, 8> sizes{512,     1000,          4096,    65536,
                                             1 << 20, (1 << 20) + 1, 3 << 20, 4 << 20};
  sim_backend& b = backend();
  auto const s   = streams()[static_cast<std::size_t>(state.thread_index())];
  std::array<void*, 16> live{};
  std::size_t i = 0;
  for (auto _ : state) {
    void*& slot = live[i % live.size()];
    if (slot != nullptr) { b.deallocate(slot); }
    slot = b.allocate(0, sizes[i % sizes.size()], s);
    ++i;
  }
  for (void* p : live) { b.deallocate(p); }
  state.SetItemsProcessed(state.iterations());
}

BENCHMARK(pairs)->ThreadRange(1, max_threads)->UseRealTime();
BENCHMARK(mixed)->ThreadRange(1, max_threads)->UseRealTime();

}  // namespace

BENCHMARK_MAIN();
