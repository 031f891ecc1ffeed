// SPDX-License-Identifier: Apache-2.0
// planner_bench: planning time of the checkpoint planners (host only; instruction counts, or ratios
// between planners in one run, are what mean something off the GPU machine).
//
//   build/dev/benchmarks/planner_bench --benchmark_filter=optimal
//
// The target: 64 stages with 512 memory slots planned in <= 50 ms (optimal/64/512).
// On the 2-core CI host (Release, g++ 12): 28 ms before the dynamic program's rework, 4.6 ms after
// (no choice table, 32-bit costs, one allocation, moves cut where they cannot improve).
#include <gpukit/checkpoint/planners.hpp>

#include <benchmark/benchmark.h>

#include <random>
#include <vector>

namespace {

// A heterogeneous chain (times 1..100, sizes 1..1000) with a budget of a third of store-all.
gpukit::checkpoint_chain bench_chain(std::size_t L)
{
  std::mt19937_64 rng{L};
  std::uniform_int_distribution<int> t{1, 100}, s{1, 1000};
  std::vector<gpukit::checkpoint_stage> v;
  for (std::size_t i = 0; i < L; ++i) v.push_back({t(rng), t(rng), s(rng), s(rng)});
  return gpukit::checkpoint_chain{v};
}

void optimal(benchmark::State& state)
{
  auto const chain  = bench_chain(static_cast<std::size_t>(state.range(0)));
  auto const budget = gpukit::plan_store_all(chain).peak / 3;
  gpukit::checkpoint_planner_options o;
  o.slots = state.range(1);
  for (auto _ : state) {
    auto p = gpukit::plan_optimal(chain, budget, o);
    benchmark::DoNotOptimize(p.time);
  }
  state.counters["stages"] = static_cast<double>(chain.size());
}
BENCHMARK(optimal)
  ->Args({32, 512})
  ->Args({64, 512})
  ->Args({128, 512})
  ->Args({128, 128})
  ->Args({512, 64})
  ->Unit(benchmark::kMillisecond);

// 64 stages, 512 slots, the budget at range(0) percent of store-all's peak: how the planning time
// depends on the budget.
void optimal_budget(benchmark::State& state)
{
  auto const chain  = bench_chain(64);
  auto const budget = gpukit::plan_store_all(chain).peak * state.range(0) / 100;
  for (auto _ : state) {
    auto p = gpukit::plan_optimal(chain, budget);
    benchmark::DoNotOptimize(p.time);
  }
}
BENCHMARK(optimal_budget)->Arg(20)->Arg(33)->Arg(50)->Arg(100)->Unit(benchmark::kMillisecond);

// The same 64 stages with times scaled by 2^20 (a schedule may take 2^29 units or more): the
// dynamic program's 64-bit tables instead of its 32-bit ones.
void optimal_wide_times(benchmark::State& state)
{
  std::vector<gpukit::checkpoint_stage> v = bench_chain(64).stages();
  for (auto& s : v) s.forward_time <<= 20, s.backward_time <<= 20;
  gpukit::checkpoint_chain const chain{v};
  auto const budget = gpukit::plan_store_all(chain).peak / 3;
  for (auto _ : state) {
    auto p = gpukit::plan_optimal(chain, budget);
    benchmark::DoNotOptimize(p.time);
  }
}
BENCHMARK(optimal_wide_times)->Unit(benchmark::kMillisecond);

void sequential(benchmark::State& state)
{
  auto const chain = bench_chain(static_cast<std::size_t>(state.range(0)));
  for (auto _ : state) {
    auto p = gpukit::plan_sqrt(chain);
    benchmark::DoNotOptimize(p.time);
  }
}
BENCHMARK(sequential)->Arg(32)->Arg(128)->Arg(512)->Unit(benchmark::kMicrosecond);

void revolve(benchmark::State& state)
{
  for (auto _ : state) {
    auto s = gpukit::revolve_schedule(static_cast<std::size_t>(state.range(0)), 8);
    benchmark::DoNotOptimize(s.data());
  }
}
BENCHMARK(revolve)->Arg(32)->Arg(128)->Arg(512)->Unit(benchmark::kMicrosecond);

}  // namespace

BENCHMARK_MAIN();
