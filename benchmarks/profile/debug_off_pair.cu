// SPDX-License-Identifier: Apache-2.0
// debug_off_pair: alloc+free pairs of 64 KiB on one stream, one thread, debug mode off: ns per pair
// (median of 7 rounds of 10^6). Built twice, against two include trees, to compare them:
//   nvcc -std=c++17 -O2 -arch=sm_90 -I<include> benchmarks/profile/debug_off_pair.cu -o pair
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <gpukit/memory/caching_allocator.hpp>
#include <gpukit/runtime/cuda_runtime.hpp>
#include <vector>
int main()
{
  gpukit::caching_allocator_options o;
  o.nvtx_annotate = false;
  gpukit::caching_allocator a{gpukit::cuda_runtime::instance(), 0, o};
  cudaStream_t s{};
  cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
  std::vector<double> r;
  for (int round = 0; round < 8; ++round) {
    auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < 1000000; ++i) {
      void* p = a.allocate_async(65536, s);
      a.deallocate_async(p, 65536, s);
    }
    auto t1 = std::chrono::steady_clock::now();
    if (round > 0) r.push_back(std::chrono::duration<double, std::nano>(t1 - t0).count() / 1e6);
  }
  std::sort(r.begin(), r.end());
  std::printf("%.2f\n", r[r.size() / 2]);
  a.forget_stream(s);
  return 0;
}
