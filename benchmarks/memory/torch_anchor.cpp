// SPDX-License-Identifier: Apache-2.0
// PyTorch's CUDA caching allocator on allocator_bench's workloads, for the same run on the GPU
// machine (PyTorch is installed there, not here, so CMake does not build this file). Build there:
//
//   T=$(python3 -c "import torch,os;print(os.path.dirname(torch.__file__))")
//   g++ -O2 -std=c++17 benchmarks/memory/torch_anchor.cpp -I$T/include -I/usr/local/cuda/include \
//     -L$T/lib -lc10 -lc10_cuda -Wl,-rpath,$T/lib -L/usr/local/cuda/lib64 -lcudart -o torch_anchor
//
// Prints one line per measurement, median of 5 repetitions, in allocator_bench's names:
//   pair/torch/<bytes> <ns per pair>; threads/torch/threads:N <pairs per second>; churn/torch <ns>.
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <random>
#include <thread>
#include <vector>

namespace {
using clk   = std::chrono::steady_clock;
namespace A = c10::cuda::CUDACachingAllocator;

double ns_since(clk::time_point t0)
{
  return std::chrono::duration<double, std::nano>(clk::now() - t0).count();
}

template <class F>
double median_of_5(F f)
{
  std::vector<double> v;
  for (int r = 0; r < 5; ++r) { v.push_back(f()); }
  std::sort(v.begin(), v.end());
  return v[2];
}
}  // namespace

int main()
{
  A::init(c10::cuda::device_count());
  for (std::size_t b = 256; b <= (std::size_t{256} << 20); b *= 16) {
    A::raw_delete(A::raw_alloc(b));
    double const ns = median_of_5([&] {
      constexpr int n = 200000;
      auto const t0   = clk::now();
      for (int i = 0; i < n; ++i) { A::raw_delete(A::raw_alloc(b)); }
      return ns_since(t0) / n;
    });
    std::printf("pair/torch/%zu %.1f ns\n", b, ns);
  }
  for (int T : {1, 4, 16}) {
    double const rate = median_of_5([&] {
      constexpr int n = 100000;
      std::vector<std::thread> th;
      auto const t0 = clk::now();
      for (int t = 0; t < T; ++t) {
        th.emplace_back([&] {
          c10::cuda::set_device(0);
          for (int i = 0; i < n; ++i) { A::raw_delete(A::raw_alloc(65536)); }
        });
      }
      for (auto& x : th) { x.join(); }
      return T * n / (ns_since(t0) / 1e9);
    });
    std::printf("threads/torch/threads:%d %.0f pairs/s\n", T, rate);
  }
  {
    std::mt19937_64 rng(42);
    std::uniform_real_distribution<double> lu(std::log(256.0), std::log(8.0 * (1 << 20)));
    std::vector<void*> live(2000);
    for (auto& q : live) { q = A::raw_alloc(static_cast<std::size_t>(std::exp(lu(rng)))); }
    double const ns = median_of_5([&] {
      constexpr int ops = 200000;
      auto const t0     = clk::now();
      for (int i = 0; i < ops; ++i) {
        std::size_t const k = rng() % live.size();
        A::raw_delete(live[k]);
        live[k] = A::raw_alloc(static_cast<std::size_t>(std::exp(lu(rng))));
      }
      return ns_since(t0) / ops;
    });
    std::printf("churn/torch %.1f ns\n", ns);
    for (auto& q : live) { A::raw_delete(q); }
  }
  return 0;
}
