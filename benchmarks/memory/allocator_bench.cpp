// SPDX-License-Identifier: Apache-2.0
// Caching allocator microbenchmarks, with the anchors in the same binary (DESIGN.md, "Benchmark
// rules"): cudaMalloc, cudaMallocAsync (release threshold at maximum) and CUB's
// CachingDeviceAllocator; PyTorch's allocator runs in the same command through torch_anchor.cpp.
//
//   pair/<allocator>/<bytes>          alloc+free pair latency, one thread, one stream
//   threads/<allocator>/threads:N     64 KiB pairs, N threads, each on its own stream (aggregate
//   rate) churn/<allocator>                 2000 live blocks, log-uniform 256 B..8 MiB, random
//   frees
//
// Host-side allocator calls are timed with a steady clock over many iterations (real time).
// gpukit_sim runs gpukit on the simulated GPU (no CUDA needed); it is not an anchor comparison.
#include <gpukit/memory/caching_allocator.hpp>
#include <gpukit/runtime/cuda_runtime.hpp>
#include <gpukit/runtime/sim_runtime.hpp>

#include <benchmark/benchmark.h>
#include <cub/util_allocator.cuh>

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

namespace {

constexpr int max_threads = 16;

bool have_gpu()
{
  static bool const yes = [] {
    int n         = 0;
    bool const ok = cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
    (void)cudaGetLastError();
    return ok;
  }();
  return yes;
}

std::vector<cudaStream_t>& cuda_streams()
{
  static std::vector<cudaStream_t> s = [] {
    std::vector<cudaStream_t> v(max_threads);
    for (auto& x : v) { GPUKIT_CUDA_TRY(cudaStreamCreateWithFlags(&x, cudaStreamNonBlocking)); }
    return v;
  }();
  return s;
}

// The default allocator of the simulated GPU serves sim_runtime::instance() (80 GiB by default).
gpukit::sim_runtime& sim() { return gpukit::sim_runtime::instance(); }

std::vector<gpukit::sim_runtime::stream_type>& sim_streams()
{
  static std::vector<gpukit::sim_runtime::stream_type> s = [] {
    std::vector<gpukit::sim_runtime::stream_type> v(max_threads);
    for (auto& x : v) { GPUKIT_CUDA_TRY(sim().stream_create(x)); }
    return v;
  }();
  return s;
}

// ---- the allocators, behind one shape: alloc(bytes, thread) / free(p, bytes, thread) / sync ----

struct gpukit_cuda {
  static constexpr bool needs_gpu = true;
  gpukit::caching_allocator& a    = gpukit::default_caching_allocator(0);
  void* alloc(std::size_t b, int t) { return a.allocate_async(b, cuda_streams()[t]); }
  void free(void* p, std::size_t b, int t) { a.deallocate_async(p, b, cuda_streams()[t]); }
  void sync(int t) { GPUKIT_CUDA_TRY(cudaStreamSynchronize(cuda_streams()[t])); }
};

// gpukit with recording on (memory_history.hpp): the cost of an event in the ring.
struct gpukit_cuda_recording {
  static constexpr bool needs_gpu = true;
  static gpukit::caching_allocator& get()
  {
    static auto* a = [] {
      auto* x = new gpukit::caching_allocator{gpukit::cuda_runtime::instance(), 0};
      x->start_recording(std::size_t{1} << 20);
      return x;
    }();
    return *a;
  }
  void* alloc(std::size_t b, int t) { return get().allocate_async(b, cuda_streams()[t]); }
  void free(void* p, std::size_t b, int t) { get().deallocate_async(p, b, cuda_streams()[t]); }
  void sync(int t) { GPUKIT_CUDA_TRY(cudaStreamSynchronize(cuda_streams()[t])); }
};

struct gpukit_sim {
  static constexpr bool needs_gpu = false;
  gpukit::basic_caching_allocator<gpukit::sim_runtime>& a =
    gpukit::default_caching_allocator<gpukit::sim_runtime>(0);
  gpukit_sim() { (void)sim_streams(); }
  void* alloc(std::size_t b, int t) { return a.allocate_async(b, sim_streams()[t]); }
  void free(void* p, std::size_t b, int t) { a.deallocate_async(p, b, sim_streams()[t]); }
  void sync(int) {}
};

struct cuda_malloc {
  static constexpr bool needs_gpu = true;
  void* alloc(std::size_t b, int)
  {
    void* p = nullptr;
    GPUKIT_CUDA_TRY(cudaMalloc(&p, b));
    return p;
  }
  void free(void* p, std::size_t, int) { GPUKIT_CUDA_TRY(cudaFree(p)); }
  void sync(int) {}
};

struct cuda_malloc_async {
  static constexpr bool needs_gpu = true;
  cuda_malloc_async()
  {
    cudaMemPool_t pool;
    GPUKIT_CUDA_TRY(cudaDeviceGetDefaultMemPool(&pool, 0));
    std::uint64_t thr = ~std::uint64_t{0};
    GPUKIT_CUDA_TRY(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &thr));
  }
  void* alloc(std::size_t b, int t)
  {
    void* p = nullptr;
    GPUKIT_CUDA_TRY(cudaMallocAsync(&p, b, cuda_streams()[t]));
    return p;
  }
  void free(void* p, std::size_t, int t) { GPUKIT_CUDA_TRY(cudaFreeAsync(p, cuda_streams()[t])); }
  void sync(int t) { GPUKIT_CUDA_TRY(cudaStreamSynchronize(cuda_streams()[t])); }
};

struct cub_caching {
  static constexpr bool needs_gpu = true;
  static cub::CachingDeviceAllocator& get()
  {
    // Bins 8^3..8^10 (1 GiB), 64 GiB cache: the anchor configuration of
    // ../shared/device/baseline.cu.
    static auto* a = new cub::CachingDeviceAllocator(8, 3, 10, std::size_t{64} << 30);
    return *a;
  }
  void* alloc(std::size_t b, int t)
  {
    void* p = nullptr;
    GPUKIT_CUDA_TRY(get().DeviceAllocate(&p, b, cuda_streams()[t]));
    return p;
  }
  void free(void* p, std::size_t, int) { GPUKIT_CUDA_TRY(get().DeviceFree(p)); }
  void sync(int t) { GPUKIT_CUDA_TRY(cudaStreamSynchronize(cuda_streams()[t])); }
};

template <class A>
bool skip_without_gpu(benchmark::State& state)
{
  if (A::needs_gpu && !have_gpu()) {
    state.SkipWithError("no GPU");
    return true;
  }
  return false;
}

template <class A>
void pair(benchmark::State& state)
{
  if (skip_without_gpu<A>(state)) { return; }
  A a;
  auto const bytes = static_cast<std::size_t>(state.range(0));
  a.free(a.alloc(bytes, 0), bytes, 0);  // warm-up: the cache holds one block
  for (auto _ : state) {
    void* p = a.alloc(bytes, 0);
    benchmark::DoNotOptimize(p);
    a.free(p, bytes, 0);
  }
  a.sync(0);
  state.SetItemsProcessed(state.iterations());
}

template <class A>
void threads(benchmark::State& state)
{
  if (skip_without_gpu<A>(state)) { return; }
  A a;
  int const t              = state.thread_index();
  constexpr std::size_t kb = 64 * 1024;
  a.free(a.alloc(kb, t), kb, t);
  for (auto _ : state) {
    void* p = a.alloc(kb, t);
    benchmark::DoNotOptimize(p);
    a.free(p, kb, t);
  }
  a.sync(t);
  state.SetItemsProcessed(state.iterations());
}

template <class A>
void churn(benchmark::State& state)
{
  if (skip_without_gpu<A>(state)) { return; }
  A a;
  // The workload of ../shared/device/baseline.cu: 2000 live blocks, log-uniform 256 B..8 MiB.
  std::mt19937_64 rng(42);
  std::uniform_real_distribution<double> lu(std::log(256.0), std::log(8.0 * (1 << 20)));
  constexpr std::size_t live_n = 2000;
  constexpr std::size_t ops_n  = std::size_t{1} << 20;
  std::vector<std::size_t> sizes(ops_n), victims(ops_n);
  for (std::size_t i = 0; i < ops_n; ++i) {
    sizes[i]   = static_cast<std::size_t>(std::exp(lu(rng)));
    victims[i] = rng() % live_n;
  }
  std::vector<void*> live(live_n);
  std::vector<std::size_t> live_bytes(live_n);
  for (std::size_t i = 0; i < live_n; ++i) {
    live_bytes[i] = sizes[(i * 7919) % ops_n];
    live[i]       = a.alloc(live_bytes[i], 0);
  }
  std::size_t i = 0;
  for (auto _ : state) {
    std::size_t const k = victims[i];
    a.free(live[k], live_bytes[k], 0);
    live_bytes[k] = sizes[i];
    live[k]       = a.alloc(sizes[i], 0);
    i             = (i + 1) & (ops_n - 1);
  }
  a.sync(0);
  state.SetItemsProcessed(state.iterations());
  for (std::size_t k = 0; k < live_n; ++k) { a.free(live[k], live_bytes[k], 0); }
  a.sync(0);
}

template <class A>
void register_all(char const* name)
{
  auto* p = benchmark::RegisterBenchmark((std::string{"pair/"} + name).c_str(), pair<A>);
  p->RangeMultiplier(16)->Range(256, std::int64_t{256} << 20)->UseRealTime();
  auto* t = benchmark::RegisterBenchmark((std::string{"threads/"} + name).c_str(), threads<A>);
  t->Threads(1)->Threads(4)->Threads(16)->UseRealTime();
  benchmark::RegisterBenchmark((std::string{"churn/"} + name).c_str(), churn<A>)->UseRealTime();
}

}  // namespace

int main(int argc, char** argv)
{
  register_all<gpukit_cuda>("gpukit");
  register_all<cuda_malloc>("cudaMalloc");
  register_all<cuda_malloc_async>("cudaMallocAsync");
  register_all<cub_caching>("cub");
  register_all<gpukit_sim>("gpukit_sim");
  benchmark::RegisterBenchmark("pair/gpukit_recording", pair<gpukit_cuda_recording>)
    ->Arg(65536)
    ->UseRealTime();
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) { return 1; }
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
