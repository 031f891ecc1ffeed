// SPDX-License-Identifier: Apache-2.0
// nvtx_bench's ranges compiled out (GPUKIT_DISABLE_NVTX): what a range costs when switched off at
// build time. Registered into nvtx_bench (see nvtx_bench.cpp).
#define GPUKIT_DISABLE_NVTX
#include <gpukit/profile/nvtx.hpp>

#include <benchmark/benchmark.h>

namespace {

void off_scoped_range(benchmark::State& state)
{
  for (auto _ : state) {
    gpukit::scoped_range r{"step"};
    benchmark::ClobberMemory();
  }
}

void off_range_macro(benchmark::State& state)
{
  for (auto _ : state) {
    GPUKIT_RANGE("step");
    benchmark::ClobberMemory();
  }
}

}  // namespace

BENCHMARK(off_scoped_range)->Name("range/compiled_out/gpukit_scoped_range");
BENCHMARK(off_range_macro)->Name("range/compiled_out/GPUKIT_RANGE");
