// SPDX-License-Identifier: Apache-2.0
// Pinned pool and transfer pipeline benchmarks, with the anchors in the same binary (DESIGN.md,
// "Benchmark rules"):
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
//   grow/<how>/<MiB>                           pinning rate of pool growth (bytes_per_second):
//                                              cudaHostAlloc (the anchor), pool_host_alloc, and
//                                              pool_map_register (huge pages, N threads touching,
//                                              cudaHostRegister) with its knobs varied
//   sweep/h2d_pipeline/<MiB>/<threads>/<chunk_kib>/<min_piece_kib>/<nt>   (with --sweep) the
//                                              staging knobs over a grid, one pipeline at a time
//
// Staging knobs (every pipeline benchmark; defaults: gpukit::transfer_options):
//   --chunk_kib=N --min_piece_kib=N (0: fixed chunks) --ring=N --copy=memcpy|nt
//   --threads=8,12,16 (the threads axis) --pool_growth=map|host_alloc --huge_pages=0|1
//   --sweep [--sweep_threads=LIST --sweep_chunk_kib=LIST --sweep_min_piece_kib=LIST
//            --sweep_copy=memcpy,nt --sweep_mib=N]
// They are read before Google Benchmark's own flags; a bad value is refused with its name.
//
// Device work is timed with CUDA events around it on the consumer stream (UseManualTime); host
// memcpy and pool calls with a steady clock (UseRealTime; pool growth: manual time around the
// growth call). bytes_per_second is the figure to compare. Without a GPU the binary says so and
// exits 0.
#include <gpukit/host/pinned_pool.hpp>
#include <gpukit/runtime/cuda_runtime.hpp>
#include <gpukit/transfer/transfer_pipeline.hpp>

#include <benchmark/benchmark.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

namespace {

using gpukit::cuda_runtime;
constexpr std::size_t mib       = std::size_t{1} << 20;
constexpr std::size_t max_bytes = std::size_t{1} << 30;

cuda_runtime& rt() { return cuda_runtime::instance(); }

/// The staging knobs from the command line (see the top of this file).
struct knobs {
  gpukit::transfer_options pipeline{};
  gpukit::pinned_pool_options pool{};
  std::vector<std::int64_t> threads{8, 12, 16};
  bool sweep{false};
  std::int64_t sweep_mib{1024};
  std::vector<std::int64_t> sweep_threads{8, 10, 12, 14, 16};
  std::vector<std::int64_t> sweep_chunk_kib{4096, 8192, 16384};
  std::vector<std::int64_t> sweep_min_piece_kib{0, 1024};
  std::vector<std::int64_t> sweep_nt{0, 1};
};

knobs& cfg()
{
  static knobs k;
  return k;
}

[[noreturn]] void bad_flag(std::string const& flag, std::string const& why)
{
  std::fprintf(stderr, "transfer_bench: %s: %s\n", flag.c_str(), why.c_str());
  std::exit(2);
}

std::int64_t parse_int(std::string const& flag, std::string const& v, std::int64_t lo)
{
  char* end   = nullptr;
  long long n = std::strtoll(v.c_str(), &end, 10);
  if (v.empty() || *end != '\0' || n < lo) {
    bad_flag(flag, "expected an integer >= " + std::to_string(lo) + ", got \"" + v + "\"");
  }
  return n;
}

std::vector<std::int64_t> parse_list(std::string const& flag, std::string const& v, std::int64_t lo)
{
  std::vector<std::int64_t> out;
  std::size_t pos = 0;
  while (pos <= v.size()) {
    std::size_t end = v.find(',', pos);
    if (end == std::string::npos) end = v.size();
    out.push_back(parse_int(flag, v.substr(pos, end - pos), lo));
    pos = end + 1;
  }
  return out;
}

bool parse_copy(std::string const& flag, std::string const& v)
{
  if (v == "memcpy") return false;
  if (v == "nt" || v == "nontemporal") return true;
  bad_flag(flag, "expected memcpy or nt, got \"" + v + "\"");
}

/// Takes our flags out of argv (Google Benchmark refuses flags it does not know).
void parse_knobs(int& argc, char** argv)
{
  knobs& k = cfg();
  int out  = 1;
  for (int i = 1; i < argc; ++i) {
    std::string const a = argv[i];
    auto const eq       = a.find('=');
    std::string const f = a.substr(0, eq);
    std::string const v = eq == std::string::npos ? std::string{} : a.substr(eq + 1);
    if (f == "--chunk_kib") {
      k.pipeline.chunk_bytes = static_cast<std::size_t>(parse_int(f, v, 4)) << 10;
    } else if (f == "--min_piece_kib") {
      k.pipeline.min_piece_bytes = static_cast<std::size_t>(parse_int(f, v, 0)) << 10;
    } else if (f == "--ring") {
      k.pipeline.ring_chunks = static_cast<std::size_t>(parse_int(f, v, 0));
    } else if (f == "--copy") {
      k.pipeline.copy =
        parse_copy(f, v) ? gpukit::staging_copy::nontemporal : gpukit::staging_copy::memcpy;
    } else if (f == "--threads") {
      k.threads = parse_list(f, v, 1);
    } else if (f == "--pool_growth") {
      if (v != "map" && v != "host_alloc")
        bad_flag(f, "expected map or host_alloc, got \"" + v + "\"");
      k.pool.growth =
        v == "map" ? gpukit::pinned_growth::map_and_register : gpukit::pinned_growth::host_alloc;
    } else if (f == "--huge_pages") {
      k.pool.huge_pages = parse_int(f, v, 0) != 0;
    } else if (f == "--pin_threads") {
      k.pool.pin_threads = static_cast<int>(parse_int(f, v, 0));
    } else if (f == "--sweep") {
      k.sweep = true;
    } else if (f == "--sweep_mib") {
      k.sweep_mib = parse_int(f, v, 1);
      if (k.sweep_mib > 1024) bad_flag(f, "at most 1024 (the buffers are 1 GiB)");
    } else if (f == "--sweep_threads") {
      k.sweep_threads = parse_list(f, v, 1);
    } else if (f == "--sweep_chunk_kib") {
      k.sweep_chunk_kib = parse_list(f, v, 4);
    } else if (f == "--sweep_min_piece_kib") {
      k.sweep_min_piece_kib = parse_list(f, v, 0);
    } else if (f == "--sweep_copy") {
      k.sweep_nt.clear();
      std::size_t pos = 0;
      while (pos <= v.size()) {
        std::size_t end = v.find(',', pos);
        if (end == std::string::npos) end = v.size();
        k.sweep_nt.push_back(parse_copy(f, v.substr(pos, end - pos)) ? 1 : 0);
        pos = end + 1;
      }
    } else {
      argv[out++] = argv[i];
    }
  }
  argc = out;
}

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
  gpukit::pinned_pool pool{rt(), cfg().pool};
  std::map<int, std::unique_ptr<gpukit::transfer_pipeline>> pipelines;
  // The sweep's one pipeline (its own pool, so that each configuration's rings are freed).
  std::tuple<int, std::size_t, std::size_t, int> sweep_key{};
  std::unique_ptr<gpukit::transfer_pipeline> sweep_pipe;
  std::unique_ptr<gpukit::pinned_pool> sweep_pool;

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
      gpukit::transfer_options o = cfg().pipeline;
      o.staging_threads          = threads;
      p                          = std::make_unique<gpukit::transfer_pipeline>(rt(), pool, o);
      p->prewarm();
    }
    return *p;
  }

  gpukit::transfer_pipeline& sweep_pipeline(int threads, std::size_t chunk, std::size_t min_piece,
                                            bool nt)
  {
    auto const key = std::make_tuple(threads, chunk, min_piece, nt ? 1 : 0);
    if (!sweep_pipe || key != sweep_key) {
      sweep_pipe.reset();
      sweep_pool                 = std::make_unique<gpukit::pinned_pool>(rt(), cfg().pool);
      gpukit::transfer_options o = cfg().pipeline;
      o.staging_threads          = threads;
      o.chunk_bytes              = chunk;
      o.min_piece_bytes          = min_piece;
      o.copy     = nt ? gpukit::staging_copy::nontemporal : gpukit::staging_copy::memcpy;
      sweep_pipe = std::make_unique<gpukit::transfer_pipeline>(rt(), *sweep_pool, o);
      sweep_pipe->prewarm();
      sweep_key = key;
    }
    return *sweep_pipe;
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

void h2d_pipeline_sweep(benchmark::State& state)
{
  auto& f                 = fx();
  std::size_t const bytes = bytes_of(state);
  auto& pipe              = f.sweep_pipeline(
                 static_cast<int>(state.range(1)), static_cast<std::size_t>(state.range(2)) << 10,
                 static_cast<std::size_t>(state.range(3)) << 10, state.range(4) != 0);
  timed(state, f.up, f.up_start, f.up_stop, bytes, [&] {
    pipe.copy_to_device_async(f.dev_a, f.pageable_in.get(), bytes, gpukit::host_memory::pageable,
                              f.up);
  });
}

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

// ---- pool growth: how fast new pinned memory arrives
// -------------------------------------------------

enum grow_how : std::int64_t {
  grow_cuda_host_alloc,  ///< cudaHostAlloc alone (the anchor)
  grow_pool_host_alloc,  ///< pinned_pool::reserve, pinned_growth::host_alloc
  grow_pool_map,         ///< pinned_pool::reserve, pinned_growth::map_and_register
};

/// range(0): MiB; range(1): grow_how; range(2): pin threads (0: default); range(3): huge pages.
void pool_grow(benchmark::State& state)
{
  std::size_t const bytes = bytes_of(state);
  auto const how          = static_cast<grow_how>(state.range(1));
  for (auto _ : state) {
    double sec = 0;
    if (how == grow_cuda_host_alloc) {
      void* p       = nullptr;
      auto const t0 = std::chrono::steady_clock::now();
      GPUKIT_CUDA_TRY(cudaHostAlloc(&p, bytes, cudaHostAllocPortable));
      sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      GPUKIT_CUDA_TRY(cudaFreeHost(p));
    } else {
      gpukit::pinned_pool_options o = cfg().pool;
      o.growth                      = how == grow_pool_map ? gpukit::pinned_growth::map_and_register
                                                           : gpukit::pinned_growth::host_alloc;
      o.pin_threads                 = static_cast<int>(state.range(2));
      o.huge_pages                  = state.range(3) != 0;
      gpukit::pinned_pool pool{rt(), o};
      auto const t0 = std::chrono::steady_clock::now();
      pool.reserve(bytes);
      sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    }  // freed untimed (cudaHostUnregister + munmap, or cudaFreeHost)
    state.SetIterationTime(sec);
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * bytes));
}

void register_all()
{
  auto sizes_threads = [](benchmark::internal::Benchmark* b) {
    for (std::int64_t m : {512, 1024}) {
      for (std::int64_t t : cfg().threads) { b->Args({m, t}); }
    }
    b->ArgNames({"MiB", "threads"})->UseManualTime()->Unit(benchmark::kMillisecond);
  };
  auto sizes = [](benchmark::internal::Benchmark* b) {
    b->Arg(512)->Arg(1024)->ArgName("MiB")->UseManualTime()->Unit(benchmark::kMillisecond);
  };
  benchmark::RegisterBenchmark("ceiling/host_memcpy", host_memcpy)
    ->ArgsProduct({{1024}, {1, 4, 8, 10, 12, 14, 16}})
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
  auto grow = [](char const* name, std::vector<std::vector<std::int64_t>> const& args) {
    benchmark::RegisterBenchmark(name, pool_grow)
      ->ArgsProduct(args)
      ->ArgNames({"MiB", "how", "pin_threads", "huge"})
      ->UseManualTime()
      ->Unit(benchmark::kMillisecond);
  };
  grow("grow/cudaHostAlloc", {{256, 1024}, {grow_cuda_host_alloc}, {0}, {0}});
  grow("grow/pool_host_alloc", {{256, 1024}, {grow_pool_host_alloc}, {0}, {0}});
  grow("grow/pool_map_register", {{256, 1024}, {grow_pool_map}, {1, 4, 8, 12, 16}, {1}});
  grow("grow/pool_map_register", {{256, 1024}, {grow_pool_map}, {8}, {0}});
  if (cfg().sweep) {
    auto* b = benchmark::RegisterBenchmark("sweep/h2d_pipeline", h2d_pipeline_sweep);
    for (std::int64_t t : cfg().sweep_threads) {
      for (std::int64_t c : cfg().sweep_chunk_kib) {
        for (std::int64_t m : cfg().sweep_min_piece_kib) {
          if (m >= c) continue;  // the same as fixed chunks (min_piece 0)
          for (std::int64_t nt : cfg().sweep_nt) { b->Args({cfg().sweep_mib, t, c, m, nt}); }
        }
      }
    }
    b->ArgNames({"MiB", "threads", "chunk_kib", "min_piece_kib", "nt"})
      ->UseManualTime()
      ->Unit(benchmark::kMillisecond);
  }
}

}  // namespace

int main(int argc, char** argv)
{
  bool listing = false;
  for (int i = 1; i < argc; ++i) { listing = listing || std::strstr(argv[i], "list_tests"); }
  parse_knobs(argc, argv);
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
