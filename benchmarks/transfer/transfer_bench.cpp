// Pinned pool and transfer pipeline benchmarks, with the anchors in the same binary (DESIGN.md,
// "Benchmark rules"; issue 6):
//
//   ceiling/host_memcpy/<MiB>/<threads>        pageable -> pinned memcpy by N host threads: the
//                                              host's own bound on pageable transfers
//   h2d/pipeline_pageable/<MiB>/<threads>      gpukit::transfer_pipeline, 16 MiB chunks
//   h2d/cudaMemcpyAsync_pageable/<MiB>         the anchor users have today
//   h2d/cudaMemcpyAsync_pinned/<MiB>           the link's own rate
//   d2h/...                                    the same, device to host
//   bidir/<...>/<MiB>                          one H2D and one D2H at once (two threads/streams)
//   pool/gpukit/<bytes>                        pinned_pool allocate+deallocate, cached, no stream
//   pool/gpukit_stream/<bytes>                 ... returned with a stream (one event record)
//   pool/cudaHostAlloc/<bytes>                 cudaHostAlloc + cudaFreeHost
//
// Device work is timed with CUDA events around it on the consumer stream (UseManualTime); host
// memcpy and pool calls with a steady clock (UseRealTime). bytes_per_second is the figure to
// compare. Without a GPU the binary says so and exits 0.
#include <gpukit/host/pinned_pool.hpp>
#include <gpukit/runtime/cuda_runtime.hpp>
#include <gpukit/transfer/transfer_pipeline.hpp>

#include <benchmark/benchmark.h>

#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <thread>
#include <vector>

namespace {

using gpukit::cuda_runtime;
constexpr std::size_t mib       = std::size_t{1} << 20;
constexpr std::size_t max_bytes = std::size_t{1} << 30;

cuda_runtime& rt() { return cuda_runtime::instance(); }

bool have_gpu()
{
  int n         = 0;
  bool const ok = cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
  (void)cudaGetLastError();
  return ok;
}

/// Buffers shared by every benchmark, made (and touched) once: pageable and pinned host memory of
/// max_bytes in each direction, two device buffers, two streams, two timing events each.
struct fixture {
  std::unique_ptr<unsigned char[]> pageable_in{new unsigned char[max_bytes]};
  std::unique_ptr<unsigned char[]> pageable_out{new unsigned char[max_bytes]};
  void* pinned_in{nullptr};
  void* pinned_out{nullptr};
  void* dev_a{nullptr};
  void* dev_b{nullptr};
  cudaStream_t up{}, down{};
  cudaEvent_t up_start{}, up_stop{}, down_start{}, down_stop{};
  gpukit::pinned_pool pool{rt()};
  std::map<int, std::unique_ptr<gpukit::transfer_pipeline>> pipelines;

  fixture()
  {
    std::memset(pageable_in.get(), 1, max_bytes);
    std::memset(pageable_out.get(), 2, max_bytes);
    GPUKIT_CUDA_TRY(cudaHostAlloc(&pinned_in, max_bytes, cudaHostAllocPortable));
    GPUKIT_CUDA_TRY(cudaHostAlloc(&pinned_out, max_bytes, cudaHostAllocPortable));
    std::memset(pinned_in, 3, max_bytes);
    GPUKIT_CUDA_TRY(cudaMalloc(&dev_a, max_bytes));
    GPUKIT_CUDA_TRY(cudaMalloc(&dev_b, max_bytes));
    GPUKIT_CUDA_TRY(cudaStreamCreateWithFlags(&up, cudaStreamNonBlocking));
    GPUKIT_CUDA_TRY(cudaStreamCreateWithFlags(&down, cudaStreamNonBlocking));
    for (auto* e : {&up_start, &up_stop, &down_start, &down_stop}) {
      GPUKIT_CUDA_TRY(cudaEventCreate(e));
    }
  }

  gpukit::transfer_pipeline& pipeline(int threads)
  {
    auto& p = pipelines[threads];
    if (!p) {
      gpukit::transfer_options o;
      o.staging_threads = threads;
      p                 = std::make_unique<gpukit::transfer_pipeline>(rt(), pool, o);
      p->prewarm();
    }
    return *p;
  }
};

fixture& fx()
{
  static fixture* f = new fixture{};  // never destroyed: CUDA may be torn down first at exit
  return *f;
}

/// Times `body` (which enqueues work on `s`, maybe blocking the host) with events on `s`.
template <class Body>
void timed(benchmark::State& state, cudaStream_t s, cudaEvent_t start, cudaEvent_t stop,
           std::size_t bytes, Body body)
{
  body();  // warm-up
  GPUKIT_CUDA_TRY(cudaStreamSynchronize(s));
  for (auto _ : state) {
    GPUKIT_CUDA_TRY(cudaEventRecord(start, s));
    body();
    GPUKIT_CUDA_TRY(cudaEventRecord(stop, s));
    GPUKIT_CUDA_TRY(cudaEventSynchronize(stop));
    float ms = 0;
    GPUKIT_CUDA_TRY(cudaEventElapsedTime(&ms, start, stop));
    state.SetIterationTime(static_cast<double>(ms) / 1e3);
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * bytes));
}

std::size_t bytes_of(benchmark::State const& state)
{
  return static_cast<std::size_t>(state.range(0)) * mib;
}

// ---- the host's own ceiling
// ----------------------------------------------------------------------

void host_memcpy(benchmark::State& state)
{
  std::size_t const bytes = bytes_of(state);
  int const threads       = static_cast<int>(state.range(1));
  auto& f                 = fx();
  auto run                = [&] {
    std::vector<std::thread> ts;
    std::size_t const part =
      (bytes / static_cast<std::size_t>(threads) + 4095) & ~std::size_t{4095};
    for (int t = 0; t < threads; ++t) {
      std::size_t const off = static_cast<std::size_t>(t) * part;
      if (off >= bytes) { break; }
      std::size_t const n = std::min(part, bytes - off);
      ts.emplace_back([&, off, n] {
        std::memcpy(static_cast<char*>(f.pinned_in) + off, f.pageable_in.get() + off, n);
      });
    }
    for (auto& t : ts) { t.join(); }
  };
  run();
  for (auto _ : state) { run(); }
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * bytes));
}

// ---- host to device
// ------------------------------------------------------------------------------

void h2d_pipeline_pageable(benchmark::State& state)
{
  auto& f                 = fx();
  auto& pipe              = f.pipeline(static_cast<int>(state.range(1)));
  std::size_t const bytes = bytes_of(state);
  timed(state, f.up, f.up_start, f.up_stop, bytes, [&] {
    pipe.copy_to_device_async(f.dev_a, f.pageable_in.get(), bytes, gpukit::host_memory::pageable,
                              f.up);
  });
}

void h2d_memcpy_pageable(benchmark::State& state)
{
  auto& f                 = fx();
  std::size_t const bytes = bytes_of(state);
  timed(state, f.up, f.up_start, f.up_stop, bytes, [&] {
    GPUKIT_CUDA_TRY(
      cudaMemcpyAsync(f.dev_a, f.pageable_in.get(), bytes, cudaMemcpyHostToDevice, f.up));
  });
}

void h2d_memcpy_pinned(benchmark::State& state)
{
  auto& f                 = fx();
  std::size_t const bytes = bytes_of(state);
  timed(state, f.up, f.up_start, f.up_stop, bytes, [&] {
    GPUKIT_CUDA_TRY(cudaMemcpyAsync(f.dev_a, f.pinned_in, bytes, cudaMemcpyHostToDevice, f.up));
  });
}

// ---- device to host
// ------------------------------------------------------------------------------

void d2h_pipeline_pageable(benchmark::State& state)
{
  auto& f                 = fx();
  auto& pipe              = f.pipeline(static_cast<int>(state.range(1)));
  std::size_t const bytes = bytes_of(state);
  timed(state, f.down, f.down_start, f.down_stop, bytes, [&] {
    pipe.copy_to_host_async(f.pageable_out.get(), f.dev_b, bytes, gpukit::host_memory::pageable,
                            f.down);
  });
}

void d2h_memcpy_pageable(benchmark::State& state)
{
  auto& f                 = fx();
  std::size_t const bytes = bytes_of(state);
  timed(state, f.down, f.down_start, f.down_stop, bytes, [&] {
    GPUKIT_CUDA_TRY(
      cudaMemcpyAsync(f.pageable_out.get(), f.dev_b, bytes, cudaMemcpyDeviceToHost, f.down));
  });
}

void d2h_memcpy_pinned(benchmark::State& state)
{
  auto& f                 = fx();
  std::size_t const bytes = bytes_of(state);
  timed(state, f.down, f.down_start, f.down_stop, bytes, [&] {
    GPUKIT_CUDA_TRY(cudaMemcpyAsync(f.pinned_out, f.dev_b, bytes, cudaMemcpyDeviceToHost, f.down));
  });
}

// ---- both directions at once: H2D on `up` from a helper thread, D2H on `down`
// ---------------------

template <class Up, class Down>
void bidir(benchmark::State& state, Up up, Down down)
{
  auto& f                 = fx();
  std::size_t const bytes = bytes_of(state);
  auto once               = [&] {
    GPUKIT_CUDA_TRY(cudaEventRecord(f.up_start, f.up));
    std::thread t{[&] { up(bytes); }};
    down(bytes);
    t.join();
    GPUKIT_CUDA_TRY(cudaEventRecord(f.up_stop, f.up));
    GPUKIT_CUDA_TRY(cudaStreamWaitEvent(f.down, f.up_stop, 0));
    GPUKIT_CUDA_TRY(cudaEventRecord(f.down_stop, f.down));
    GPUKIT_CUDA_TRY(cudaEventSynchronize(f.down_stop));
    float ms = 0;
    GPUKIT_CUDA_TRY(cudaEventElapsedTime(&ms, f.up_start, f.down_stop));
    return ms;
  };
  once();
  for (auto _ : state) { state.SetIterationTime(static_cast<double>(once()) / 1e3); }
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * 2 * bytes));
}

void bidir_pipeline_pageable(benchmark::State& state)
{
  auto& f    = fx();
  auto& pipe = f.pipeline(static_cast<int>(state.range(1)));
  bidir(
    state,
    [&](std::size_t n) {
      pipe.copy_to_device_async(f.dev_a, f.pageable_in.get(), n, gpukit::host_memory::pageable,
                                f.up);
    },
    [&](std::size_t n) {
      pipe.copy_to_host_async(f.pageable_out.get(), f.dev_b, n, gpukit::host_memory::pageable,
                              f.down);
    });
}

void bidir_memcpy_pageable(benchmark::State& state)
{
  auto& f = fx();
  bidir(
    state,
    [&](std::size_t n) {
      GPUKIT_CUDA_TRY(
        cudaMemcpyAsync(f.dev_a, f.pageable_in.get(), n, cudaMemcpyHostToDevice, f.up));
    },
    [&](std::size_t n) {
      GPUKIT_CUDA_TRY(
        cudaMemcpyAsync(f.pageable_out.get(), f.dev_b, n, cudaMemcpyDeviceToHost, f.down));
    });
}

void bidir_memcpy_pinned(benchmark::State& state)
{
  auto& f = fx();
  bidir(
    state,
    [&](std::size_t n) {
      GPUKIT_CUDA_TRY(cudaMemcpyAsync(f.dev_a, f.pinned_in, n, cudaMemcpyHostToDevice, f.up));
    },
    [&](std::size_t n) {
      GPUKIT_CUDA_TRY(cudaMemcpyAsync(f.pinned_out, f.dev_b, n, cudaMemcpyDeviceToHost, f.down));
    });
}

// ---- pinned pool
// ---------------------------------------------------------------------------------

void pool_gpukit(benchmark::State& state)
{
  auto& pool       = fx().pool;
  auto const bytes = static_cast<std::size_t>(state.range(0));
  pool.deallocate(pool.allocate(bytes));  // cached from now on
  for (auto _ : state) {
    void* p = pool.allocate(bytes);
    benchmark::DoNotOptimize(p);
    pool.deallocate(p);
  }
  state.SetItemsProcessed(state.iterations());
}

void pool_gpukit_stream(benchmark::State& state)
{
  auto& f          = fx();
  auto const bytes = static_cast<std::size_t>(state.range(0));
  // Two buffers in turn: the one returned last iteration has usually completed by the next.
  void* a = f.pool.allocate(bytes);
  void* b = f.pool.allocate(bytes);
  f.pool.deallocate(a);
  f.pool.deallocate(b);
  for (auto _ : state) {
    void* p = f.pool.allocate(bytes);
    benchmark::DoNotOptimize(p);
    f.pool.deallocate_async(p, f.up);
  }
  state.SetItemsProcessed(state.iterations());
  GPUKIT_CUDA_TRY(cudaStreamSynchronize(f.up));
}

void pool_cuda_host_alloc(benchmark::State& state)
{
  auto const bytes = static_cast<std::size_t>(state.range(0));
  for (auto _ : state) {
    void* p = nullptr;
    GPUKIT_CUDA_TRY(cudaHostAlloc(&p, bytes, cudaHostAllocPortable));
    benchmark::DoNotOptimize(p);
    GPUKIT_CUDA_TRY(cudaFreeHost(p));
  }
  state.SetItemsProcessed(state.iterations());
}

void register_all()
{
  auto sizes_threads = [](benchmark::internal::Benchmark* b) {
    for (std::int64_t m : {512, 1024}) {
      for (std::int64_t t : {8, 12, 16}) { b->Args({m, t}); }
    }
    b->ArgNames({"MiB", "threads"})->UseManualTime()->Unit(benchmark::kMillisecond);
  };
  auto sizes = [](benchmark::internal::Benchmark* b) {
    b->Arg(512)->Arg(1024)->ArgName("MiB")->UseManualTime()->Unit(benchmark::kMillisecond);
  };
  benchmark::RegisterBenchmark("ceiling/host_memcpy", host_memcpy)
    ->ArgsProduct({{1024}, {1, 4, 8, 12, 16}})
    ->ArgNames({"MiB", "threads"})
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);
  benchmark::RegisterBenchmark("h2d/pipeline_pageable", h2d_pipeline_pageable)
    ->Apply(sizes_threads);
  benchmark::RegisterBenchmark("h2d/cudaMemcpyAsync_pageable", h2d_memcpy_pageable)->Apply(sizes);
  benchmark::RegisterBenchmark("h2d/cudaMemcpyAsync_pinned", h2d_memcpy_pinned)->Apply(sizes);
  benchmark::RegisterBenchmark("d2h/pipeline_pageable", d2h_pipeline_pageable)
    ->Apply(sizes_threads);
  benchmark::RegisterBenchmark("d2h/cudaMemcpyAsync_pageable", d2h_memcpy_pageable)->Apply(sizes);
  benchmark::RegisterBenchmark("d2h/cudaMemcpyAsync_pinned", d2h_memcpy_pinned)->Apply(sizes);
  benchmark::RegisterBenchmark("bidir/pipeline_pageable", bidir_pipeline_pageable)
    ->Args({512, 12})
    ->Args({512, 16})
    ->ArgNames({"MiB", "threads"})
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);
  benchmark::RegisterBenchmark("bidir/cudaMemcpyAsync_pageable", bidir_memcpy_pageable)
    ->Arg(512)
    ->ArgName("MiB")
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);
  benchmark::RegisterBenchmark("bidir/cudaMemcpyAsync_pinned", bidir_memcpy_pinned)
    ->Arg(512)
    ->ArgName("MiB")
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);
  for (auto* b : {benchmark::RegisterBenchmark("pool/gpukit", pool_gpukit),
                  benchmark::RegisterBenchmark("pool/gpukit_stream", pool_gpukit_stream),
                  benchmark::RegisterBenchmark("pool/cudaHostAlloc", pool_cuda_host_alloc)}) {
    b->Arg(64 << 10)->Arg(64 << 20)->UseRealTime();
  }
}

}  // namespace

int main(int argc, char** argv)
{
  bool listing = false;
  for (int i = 1; i < argc; ++i) { listing = listing || std::strstr(argv[i], "list_tests"); }
  register_all();
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) { return 1; }
  if (!listing && !have_gpu()) {
    std::printf("transfer_bench: no usable GPU: nothing to measure (the claims are GPU ratios)\n");
    return 0;
  }
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
