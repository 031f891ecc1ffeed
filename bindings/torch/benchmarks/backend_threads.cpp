// SPDX-License-Identifier: Apache-2.0
// backend_threads: threads allocating through gpukit_torch's backend (the layer under PyTorch's
// C++ allocator API, without PyTorch) next to the same threads on the caching allocator alone,
// each thread on a stream of its own: where the backend's records and statistics, or the
// allocator's pool lock, stop threads_bench.py's workload from scaling.
//
//   g++ -O2 -std=c++17 -DTB_CUDA -Iinclude -Ibindings/torch/include -I$CUDA/include
//       -I$CUDA/include/cccl bindings/torch/benchmarks/backend_threads.cpp -lpthread
//       -L$CUDA/lib64 -lcudart -ldl -o backend_threads          (without -DTB_CUDA: simulated GPU)
//   backend_threads cuda|sim [SECONDS] [CONF] [THREADS ...]
//
// The workload of threads_bench.py: a ring of 8 live blocks per thread, each operation frees the
// oldest and allocates the next of 64 log-uniform sizes (512 B to 2 MiB); 2000 warm-up operations
// per thread, then SECONDS (0.5) timed. CONF is a backend configuration string over
// gpukit_torch's defaults. One JSON line per (threads, mode), after a line of the allocator's
// statistics (cache hits, device calls, cross-stream events).
#include <gpukit/runtime/sim_runtime.hpp>
#include <gpukit_torch/backend.hpp>
#ifdef TB_CUDA
#include <gpukit/runtime/cuda_runtime.hpp>
#endif
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <thread>
#include <vector>
using namespace std::chrono;
std::vector<std::size_t> sizes_list()
{
  std::mt19937_64 rng(0);
  std::uniform_real_distribution<double> lu(std::log(512.0), std::log(2.0 * (1 << 20)));
  std::vector<std::size_t> v;
  for (int i = 0; i < 64; ++i) v.push_back(static_cast<std::size_t>(std::exp(lu(rng))));
  return v;
}
template <class RT>
double run(RT& rt, std::string const& mode, int threads, double seconds, std::string const& conf)
{
  auto const sizes              = sizes_list();
  gpukit_torch::backend_conf bc = gpukit_torch::parse_backend_conf(
    conf, gpukit_torch::parse_backend_conf(gpukit_torch::backend_default_conf));
  gpukit_torch::backend<RT> be{rt, bc};
  std::vector<typename RT::stream_type> streams(threads);
  for (auto& s : streams) GPUKIT_CUDA_TRY(rt.stream_create(s));
  std::atomic<int> ready{0};
  std::atomic<bool> go{false}, stop{false};
  std::vector<long> counts(threads);
  auto& core = be.allocator(0);
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t)
    pool.emplace_back([&, t] {
      auto s = streams[t];
      std::vector<std::pair<void*, std::size_t>> ring(8, {nullptr, 0});
      std::size_t next = t * 7919u, slot = 0;
      auto op = [&] {
        auto& r = ring[slot];
        if (r.first) {
          if (mode == "core")
            core.deallocate_async(r.first, r.second, s);
          else
            be.deallocate(r.first);
        }
        std::size_t const n = sizes[next++ % sizes.size()];
        r    = {mode == "core" ? core.allocate_async(n, s) : be.allocate(0, n, s), n};
        slot = (slot + 1) % ring.size();
      };
      for (int i = 0; i < 2000; ++i) op();
      ready++;
      while (!go.load()) std::this_thread::yield();
      long n = 0;
      while (!stop.load(std::memory_order_relaxed)) {
        op();
        ++n;
      }
      counts[t] = n;
      for (auto& r : ring)
        if (r.first) {
          if (mode == "core")
            core.deallocate_async(r.first, r.second, s);
          else
            be.deallocate(r.first);
        }
    });
  while (ready.load() < threads) std::this_thread::sleep_for(microseconds(100));
  auto t0 = steady_clock::now();
  go      = true;
  std::this_thread::sleep_for(duration<double>(seconds));
  stop = true;
  for (auto& th : pool) th.join();
  double const dt = duration<double>(steady_clock::now() - t0).count();
  long total = 0, lo = counts[0], hi = counts[0];
  for (long c : counts) {
    total += c;
    lo = std::min(lo, c);
    hi = std::max(hi, c);
  }
  auto const st = core.stats();
  std::printf(
    "  allocs %llu cache_hits %llu (%.1f%%) device_allocs %llu device_frees %llu retries %llu "
    "release_waits %llu xstream %llu\n",
    (unsigned long long)st.num_allocs, (unsigned long long)st.num_cache_hits,
    100.0 * st.num_cache_hits / std::max<double>(1, st.num_allocs),
    (unsigned long long)st.num_device_allocs, (unsigned long long)st.num_device_frees,
    (unsigned long long)st.num_alloc_retries, (unsigned long long)st.num_release_waits,
    (unsigned long long)st.num_cross_stream_events);
  for (auto& s : streams) (void)rt.stream_destroy(s);
  std::printf(
    "{\"mode\":\"%s\",\"threads\":%d,\"conf\":\"%s\",\"mops\":%.3f,\"slowest_over_fastest\":%.2f}"
    "\n",
    mode.c_str(), threads, conf.c_str(), total / dt / 1e6, double(lo) / double(hi));
  std::fflush(stdout);
  return total / dt;
}
int main(int argc, char** argv)
{
  std::string rtname = argc > 1 ? argv[1] : "sim";
  double seconds     = argc > 2 ? std::atof(argv[2]) : 0.5;
  std::string conf   = argc > 3 ? argv[3] : "";
  std::vector<int> ts{1, 2, 4, 8, 16};
  if (argc > 4) {
    ts.clear();
    for (int i = 4; i < argc; ++i) ts.push_back(std::atoi(argv[i]));
  }
  for (int t : ts)
    for (std::string mode : {"core", "backend"}) {
      if (rtname == "sim") {
        gpukit::sim_runtime rt;
        run(rt, mode, t, seconds, conf);
      }
#ifdef TB_CUDA
      else {
        run(gpukit::cuda_runtime::instance(), mode, t, seconds, conf);
      }
#endif
    }
}
