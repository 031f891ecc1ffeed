// SPDX-License-Identifier: Apache-2.0
// Instructions per allocate+free pair (64 KiB, one stream, one thread) on the simulated GPU:
// the allocator's host hot path, counted by callgrind, for two trees side by side.
#include <cstdio>
#include <cstdlib>
#include <gpukit/memory/caching_allocator.hpp>
#include <gpukit/runtime/sim_runtime.hpp>
int main(int argc, char** argv)
{
  long const n = argc > 1 ? std::atol(argv[1]) : 100000;
  gpukit::sim_runtime sim{};
  gpukit::sim_runtime::stream_type s{};
  if (sim.stream_create(s) != 0) return 2;
  gpukit::basic_caching_allocator<gpukit::sim_runtime> alloc{sim, 0};
  for (long i = 0; i < n; ++i) {
    void* p = alloc.allocate_async(65536, s);
    alloc.deallocate_async(p, 65536, s);
  }
  alloc.forget_stream(s);
  (void)sim.stream_destroy(s);
  std::printf("%ld pairs\n", n);
  return 0;
}
