// SPDX-License-Identifier: Apache-2.0
// Copy plus compute: does a training loop whose batches arrive through gpukit's prefetcher
// (pageable host batches staged by the transfer pipeline) finish within 1.05 x max(copy time,
// compute time)? Plain main printing a table; run on the GPU machine:
//
//   copy_compute_bench [--batches=32] [--batch_mib=64] [--reps=5] [--source=pageable|pinned]
//                      [--threads=0] [--chunk_kib=4096] [--min_piece_kib=0] [--depth=2]
//                      [--idle_ms=0] [--timeline]
//
// For each case (copy-bound: compute = 0.5 x copy, balanced: compute = copy, compute-bound:
// compute = 2 x copy) it measures, median of --reps runs:
//   copy     the batches through the prefetcher alone (no kernel)
//   compute  the kernels alone, back to back on the compute stream (CUDA events)
//   overlap  the loop: each batch's kernel waits on its copy (an event), the next batch loads
//   meanwhile
// and prints overlap / max(copy, compute). The kernel spins on clock64() for a calibrated number of
// cycles after reading its batch, so its duration is set, not guessed. The fill and drain of the
// pipeline (one batch's copy before the first kernel, one kernel after the last copy) cost
// 1/batches of the balanced case: 32 batches leave 1.9% of the 5% for everything else.
// --timeline adds, per case, where the time of one copy-only and one overlapped run went (CUDA
// events on an observer stream that waits on each batch's ready event, and on the compute stream
// around each kernel): the first batch's arrival, the interval between arrivals, the time the
// compute stream waited for a batch, and what came after the last arrival.
// --idle_ms=N sleeps N ms before every loop, copy-only and overlapped alike, so that both start
// from the same idle host (by default a copy-only loop follows the previous loop at once, an
// overlapped one follows the compute-only kernels, during which the staging threads sleep).
// Without a GPU it says so and exits 77 (skipped).
#include "../../examples/gpu_main.hpp"

#include <gpukit/host/pinned_pool.hpp>
#include <gpukit/memory/caching_allocator.hpp>
#include <gpukit/runtime/cuda_runtime.hpp>
#include <gpukit/transfer/prefetcher.hpp>
#include <gpukit/transfer/transfer_pipeline.hpp>

#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace {

using gpukit::cuda_runtime;
using clock_type = std::chrono::steady_clock;

/// Reads the batch (a grid-stride sum, so the kernel depends on the copy), then spins for `cycles`
/// SM clock cycles; one thread per block writes a result so that nothing is optimized away.
__global__ void spin_kernel(float const* data, std::size_t n, long long cycles, float* sink)
{
  float acc = 0.0f;
  for (std::size_t i = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; i < n;
       i += std::size_t{gridDim.x} * blockDim.x) {
    acc += data[i];
  }
  long long const start = clock64();
  while (clock64() - start < cycles) {}
  if (threadIdx.x == 0) { sink[blockIdx.x] = acc; }
}

struct config {
  std::size_t batches{32};
  std::size_t batch_mib{64};
  int reps{5};
  bool pinned_source{false};
  int threads{0};
  std::size_t chunk_kib{4096};
  std::size_t min_piece_kib{0};  ///< transfer_options::min_piece_bytes / 1024 (0: the default)
  std::size_t depth{2};
  bool timeline{false};
  int idle_ms{0};
};

[[noreturn]] void usage(std::string const& why)
{
  std::fprintf(stderr,
               "copy_compute_bench: %s\n"
               "usage: copy_compute_bench [--batches=N] [--batch_mib=N] [--reps=N] "
               "[--source=pageable|pinned] [--threads=N] [--chunk_kib=N] [--min_piece_kib=N] "
               "[--depth=N] [--idle_ms=N] [--timeline]\n",
               why.c_str());
  std::exit(2);
}

long long number(std::string const& flag, std::string const& v, long long lo)
{
  char* end         = nullptr;
  long long const n = std::strtoll(v.c_str(), &end, 10);
  if (v.empty() || *end != '\0' || n < lo) {
    usage(flag + ": expected an integer >= " + std::to_string(lo) + ", got \"" + v + "\"");
  }
  return n;
}

config parse(int argc, char** argv)
{
  config c;
  for (int i = 1; i < argc; ++i) {
    std::string const a = argv[i];
    auto const eq       = a.find('=');
    std::string const f = a.substr(0, eq);
    std::string const v = eq == std::string::npos ? std::string{} : a.substr(eq + 1);
    if (f == "--batches") {
      c.batches = static_cast<std::size_t>(number(f, v, 2));
    } else if (f == "--batch_mib") {
      c.batch_mib = static_cast<std::size_t>(number(f, v, 1));
    } else if (f == "--reps") {
      c.reps = static_cast<int>(number(f, v, 1));
    } else if (f == "--threads") {
      c.threads = static_cast<int>(number(f, v, 0));
    } else if (f == "--chunk_kib") {
      c.chunk_kib = static_cast<std::size_t>(number(f, v, 4));
    } else if (f == "--min_piece_kib") {
      c.min_piece_kib = static_cast<std::size_t>(number(f, v, 0));
    } else if (f == "--depth") {
      c.depth = static_cast<std::size_t>(number(f, v, 1));
    } else if (f == "--idle_ms") {
      c.idle_ms = static_cast<int>(number(f, v, 0));
    } else if (f == "--timeline" && eq == std::string::npos) {
      c.timeline = true;
    } else if (f == "--source" && (v == "pageable" || v == "pinned")) {
      c.pinned_source = v == "pinned";
    } else {
      usage("unknown argument \"" + a + "\"");
    }
  }
  if (c.batches * c.batch_mib > 16384) { usage("batches x batch_mib is over 16 GiB"); }
  return c;
}

/// Where one loop's time went (--timeline), in milliseconds.
struct trace {
  double handed{0};            ///< loop start to next() handing out the first batch (host clock)
  double first{0};             ///< loop start to the first batch's arrival on the device
  double interval{0};          ///< mean time between arrivals
  double starved{0};           ///< the compute stream waiting for a batch after its previous kernel
  double kernel{0};            ///< mean kernel time
  double tail{0};              ///< last arrival to the end of the device's work
  double device{0};            ///< loop start to the end of the device's work
  double host{0};              ///< the loop as the host timed it
  long long device_allocs{0};  ///< the caching allocator's device allocations in the loop
};

double median(std::vector<double> v)
{
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

struct bench {
  config cfg;
  cuda_runtime& rt = cuda_runtime::instance();
  std::size_t batch_bytes;
  std::unique_ptr<unsigned char[]> pageable;
  void* pinned{nullptr};
  unsigned char const* host{nullptr};
  gpukit::pinned_pool pool{rt};
  std::unique_ptr<gpukit::transfer_pipeline> pipe;
  gpukit::caching_allocator alloc{rt, 0};
  cudaStream_t compute{};
  float* sink{nullptr};
  float* resident{nullptr};  ///< a batch already on the device, for the compute-only runs
  int blocks{0};
  // --timeline: an observer stream that waits on each batch's ready event, and timing events.
  cudaStream_t observer{};
  cudaEvent_t started{};
  std::vector<cudaEvent_t> arrived, kernel_begin, kernel_end;

  explicit bench(config c) : cfg{c}, batch_bytes{c.batch_mib << 20}
  {
    std::size_t const total = batch_bytes * cfg.batches;
    if (cfg.pinned_source) {
      GPUKIT_CUDA_TRY(cudaHostAlloc(&pinned, total, cudaHostAllocPortable));
      host = static_cast<unsigned char const*>(pinned);
      std::memset(pinned, 1, total);
    } else {
      pageable.reset(new unsigned char[total]);
      std::memset(pageable.get(), 1, total);  // touched: no page faults in the measurement
      host = pageable.get();
    }
    gpukit::transfer_options o;
    o.staging_threads = cfg.threads;
    o.chunk_bytes     = cfg.chunk_kib << 10;
    o.min_piece_bytes = cfg.min_piece_kib << 10;
    pipe              = std::make_unique<gpukit::transfer_pipeline>(rt, pool, o);
    pipe->prewarm();
    GPUKIT_CUDA_TRY(cudaStreamCreateWithFlags(&compute, cudaStreamNonBlocking));
    cudaDeviceProp p{};
    GPUKIT_CUDA_TRY(cudaGetDeviceProperties(&p, 0));
    blocks = p.multiProcessorCount;
    GPUKIT_CUDA_TRY(cudaMalloc(&sink, sizeof(float) * blocks));
    GPUKIT_CUDA_TRY(cudaMalloc(&resident, batch_bytes));
    GPUKIT_CUDA_TRY(cudaMemset(resident, 0, batch_bytes));
    if (cfg.timeline) {
      GPUKIT_CUDA_TRY(cudaStreamCreateWithFlags(&observer, cudaStreamNonBlocking));
      GPUKIT_CUDA_TRY(cudaEventCreate(&started));
      for (auto* v : {&arrived, &kernel_begin, &kernel_end}) {
        v->resize(cfg.batches);
        for (auto& e : *v) { GPUKIT_CUDA_TRY(cudaEventCreate(&e)); }
      }
    }
  }
  ~bench()
  {
    GPUKIT_CUDA_TRY(cudaStreamSynchronize(compute));
    if (cfg.timeline) {
      (void)cudaStreamSynchronize(observer);
      for (auto* v : {&arrived, &kernel_begin, &kernel_end}) {
        for (auto e : *v) { (void)cudaEventDestroy(e); }
      }
      (void)cudaEventDestroy(started);
      (void)cudaStreamDestroy(observer);
    }
    alloc.forget_stream(compute);
    (void)cudaFree(sink);
    (void)cudaFree(resident);
    if (pinned != nullptr) { (void)cudaFreeHost(pinned); }
  }
  bench(bench const&)            = delete;
  bench& operator=(bench const&) = delete;

  void launch(float const* data, long long cycles, cudaStream_t s)
  {
    spin_kernel<<<blocks, 256, 0, s>>>(data, batch_bytes / sizeof(float), cycles, sink);
    GPUKIT_CUDA_TRY(cudaGetLastError());
  }

  /// Milliseconds of `batches` kernels of `cycles` back to back (CUDA events).
  double compute_only(long long cycles)
  {
    cudaEvent_t a{}, b{};
    GPUKIT_CUDA_TRY(cudaEventCreate(&a));
    GPUKIT_CUDA_TRY(cudaEventCreate(&b));
    launch(resident, cycles, compute);  // warm-up
    GPUKIT_CUDA_TRY(cudaEventRecord(a, compute));
    for (std::size_t i = 0; i < cfg.batches; ++i) { launch(resident, cycles, compute); }
    GPUKIT_CUDA_TRY(cudaEventRecord(b, compute));
    GPUKIT_CUDA_TRY(cudaEventSynchronize(b));
    float ms = 0;
    GPUKIT_CUDA_TRY(cudaEventElapsedTime(&ms, a, b));
    (void)cudaEventDestroy(a);
    (void)cudaEventDestroy(b);
    return ms;
  }

  /// Milliseconds of the whole loop through a fresh prefetcher: from its start until the compute
  /// stream has run everything. cycles < 0: no kernel (the copies alone). With `traced` (needs
  /// --timeline), `*traced` gets where the time went.
  double loop(long long cycles, trace* traced = nullptr)
  {
    GPUKIT_CUDA_TRY(cudaStreamSynchronize(compute));
    if (cfg.idle_ms > 0) { std::this_thread::sleep_for(std::chrono::milliseconds{cfg.idle_ms}); }
    gpukit::prefetcher_options po;
    po.depth                 = cfg.depth;
    auto const allocs_before = alloc.stats().num_device_allocs;
    auto const t0            = clock_type::now();
    double handed_ms         = 0;
    if (traced != nullptr) { GPUKIT_CUDA_TRY(cudaEventRecord(started, observer)); }
    {
      gpukit::prefetcher loader{*pipe, alloc,
                                [&](std::size_t i) {
                                  if (i == cfg.batches) return gpukit::host_batch{};
                                  return gpukit::host_batch{host + i * batch_bytes, batch_bytes};
                                },
                                po};
      while (auto batch = loader.next(compute)) {
        std::size_t const i = batch->index;
        if (i == 0) {
          handed_ms = std::chrono::duration<double, std::milli>(clock_type::now() - t0).count();
        }
        if (traced != nullptr) {
          GPUKIT_CUDA_TRY(cudaStreamWaitEvent(observer, batch->ready, 0));
          GPUKIT_CUDA_TRY(cudaEventRecord(arrived[i], observer));
          GPUKIT_CUDA_TRY(cudaEventRecord(kernel_begin[i], compute));
        }
        if (cycles >= 0) { launch(static_cast<float const*>(batch->data), cycles, compute); }
        if (traced != nullptr) { GPUKIT_CUDA_TRY(cudaEventRecord(kernel_end[i], compute)); }
        loader.release(*batch, compute);
      }
      GPUKIT_CUDA_TRY(cudaStreamSynchronize(compute));
    }
    double const host_ms =
      std::chrono::duration<double, std::milli>(clock_type::now() - t0).count();
    if (traced != nullptr) {
      *traced        = summarize(host_ms);
      traced->handed = handed_ms;
      traced->device_allocs =
        static_cast<long long>(alloc.stats().num_device_allocs - allocs_before);
    }
    return host_ms;
  }

  /// The trace of the loop that just ran (its events have completed).
  trace summarize(double host_ms) const
  {
    GPUKIT_CUDA_TRY(cudaStreamSynchronize(observer));
    auto const ms = [](cudaEvent_t a, cudaEvent_t b) {
      float f = 0;
      GPUKIT_CUDA_TRY(cudaEventElapsedTime(&f, a, b));
      return static_cast<double>(f);
    };
    std::size_t const n = cfg.batches;
    trace t;
    t.first    = ms(started, arrived[0]);
    t.interval = ms(arrived[0], arrived[n - 1]) / static_cast<double>(n - 1);
    for (std::size_t i = 0; i < n; ++i) {
      t.kernel += ms(kernel_begin[i], kernel_end[i]) / static_cast<double>(n);
      if (i > 0) { t.starved += std::max(0.0, ms(kernel_end[i - 1], kernel_begin[i])); }
    }
    double const end = std::max(ms(started, kernel_end[n - 1]), ms(started, arrived[n - 1]));
    t.tail           = end - ms(started, arrived[n - 1]);
    t.device         = end;
    t.host           = host_ms;
    return t;
  }
};

int run(config const& cfg)
{
  bench b{cfg};
  cudaDeviceProp p{};
  GPUKIT_CUDA_TRY(cudaGetDeviceProperties(&p, 0));
  auto const& po = b.pipe->options();
  std::printf(
    "device %s; %zu batches of %zu MiB, %s source; staging: %d threads, %zu KiB chunks, "
    "%zu KiB min pieces; prefetch depth %zu; %d ms idle before each loop; median of %d\n",
    p.name, cfg.batches, cfg.batch_mib, cfg.pinned_source ? "pinned" : "pageable",
    po.staging_threads, po.chunk_bytes >> 10, po.min_piece_bytes >> 10, cfg.depth, cfg.idle_ms,
    cfg.reps);

  // Calibration: kernel time is t0 + cycles / rate (two points, medians of 5).
  (void)b.loop(-1);  // warm-up: pool, allocator, pipeline threads
  std::vector<double> t1, t2;
  long long const c1 = 1'000'000, c2 = 4'000'000;
  for (int i = 0; i < 5; ++i) {
    t1.push_back(b.compute_only(c1) / static_cast<double>(cfg.batches));
    t2.push_back(b.compute_only(c2) / static_cast<double>(cfg.batches));
  }
  double const ms1 = median(t1), ms2 = median(t2);
  double const cycles_per_ms = static_cast<double>(c2 - c1) / (ms2 - ms1);
  double const base_ms       = std::max(0.0, ms1 - static_cast<double>(c1) / cycles_per_ms);

  std::vector<double> copies;
  for (int r = 0; r < cfg.reps; ++r) { copies.push_back(b.loop(-1)); }
  double const copy_ms = median(copies);
  double const gbps    = static_cast<double>(b.batch_bytes * cfg.batches) / (copy_ms * 1e-3) / 1e9;
  std::printf(
    "calibration: %.0f cycles per ms, %.3f ms per kernel beyond its cycles; copies alone "
    "%.2f ms (%.1f GB/s)\n\n",
    cycles_per_ms, base_ms, copy_ms, gbps);

  std::printf("%-14s %10s %10s %12s %10s %8s %8s\n", "case", "copy_ms", "compute_ms", "overlap_ms",
              "max_ms", "ratio", "target");
  struct named {
    char const* name;
    double factor;
  };
  bool all_ok = true;
  std::vector<std::pair<std::string, trace>> traces;
  for (named const c :
       {named{"copy-bound", 0.5}, named{"balanced", 1.0}, named{"compute-bound", 2.0}}) {
    double const per_kernel = copy_ms / static_cast<double>(cfg.batches) * c.factor;
    auto const cycles = static_cast<long long>(std::max(0.0, per_kernel - base_ms) * cycles_per_ms);
    std::vector<double> cc, cp, ov;
    trace copy_trace, overlap_trace;
    bool const last_traced = cfg.timeline;
    for (int r = 0; r < cfg.reps; ++r) {
      bool const t = last_traced && r + 1 == cfg.reps;
      cp.push_back(b.loop(-1, t ? &copy_trace : nullptr));
      cc.push_back(b.compute_only(cycles));
      ov.push_back(b.loop(cycles, t ? &overlap_trace : nullptr));
    }
    if (cfg.timeline) {
      traces.emplace_back(std::string{c.name} + " copy", copy_trace);
      traces.emplace_back(std::string{c.name} + " overlap", overlap_trace);
    }
    double const copy = median(cp), comp = median(cc), over = median(ov);
    double const mx    = std::max(copy, comp);
    double const ratio = over / mx;
    all_ok             = all_ok && ratio <= 1.05;
    std::printf("%-14s %10.2f %10.2f %12.2f %10.2f %8.3f %8s\n", c.name, copy, comp, over, mx,
                ratio, ratio <= 1.05 ? "<=1.05" : "MISSED");
  }
  if (cfg.timeline) {
    std::printf("\ntimeline of each case's last repetition (ms; interval and kernel are means):\n");
    std::printf("%-22s %7s %7s %9s %8s %8s %7s %8s %8s %7s\n", "run", "handed", "first", "interval",
                "kernel", "starved", "tail", "device", "host", "mallocs");
    for (auto const& [name, t] : traces) {
      std::printf("%-22s %7.3f %7.3f %9.4f %8.4f %8.3f %7.3f %8.2f %8.2f %7lld\n", name.c_str(),
                  t.handed, t.first, t.interval, t.kernel, t.starved, t.tail, t.device, t.host,
                  t.device_allocs);
    }
  }
  std::printf("\n%s\n", all_ok ? "all cases within 1.05 x max(copy, compute)"
                               : "some case above 1.05 x max(copy, compute)");
  return 0;
}

}  // namespace

int main(int argc, char** argv)
{
  config const cfg = parse(argc, argv);
  return gpukit_examples::run_on_gpu("copy_compute_bench", [&] { return run(cfg); });
}
