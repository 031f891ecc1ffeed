// SPDX-License-Identifier: Apache-2.0
// planner_bench: planning time of the checkpoint planners (host only; instruction counts, or ratios
// between planners in one run, are what mean something off the GPU machine).
//
//   build/dev/benchmarks/planner_bench --benchmark_filter=optimal
//   build/dev/benchmarks/planner_bench --gap-report [CHAINS [MIN_L [MAX_L [SEED]]]]
//
// --gap-report: plan_optimal (rotor's persistent program, with sizes exact and with its default
// 512 slots, which rounds sizes when the budget exceeds 512) and plan_best against plan_exhaustive
// on CHAINS random chains (default 2000) of MIN_L..MAX_L stages (default 2..9; at most 11),
// alternately uniform (one random stage repeated) and heterogeneous (times 1..100, sizes 1..100),
// each at four budgets from rotor's least budget to store-all's peak: chains, budgets, mismatches
// and the max and mean gap (time / optimum - 1) of each planner.
//
// The target: 64 stages with 512 memory slots planned in <= 50 ms (optimal/64/512).
// On the 2-core CI host (Release, g++ 12): 28 ms before the dynamic program's rework, 4.6 ms after
// (no choice table, 32-bit costs, one allocation, moves cut where they cannot improve).
#include <gpukit/checkpoint/planners.hpp>

#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
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

// range(0) stages, range(1) slots, a budget of a third of store-all's peak.
template <class Plan>
void plan_a_third(benchmark::State& state, Plan plan)
{
  auto const chain  = bench_chain(static_cast<std::size_t>(state.range(0)));
  auto const budget = gpukit::plan_store_all(chain).peak / 3;
  gpukit::checkpoint_planner_options o;
  o.slots = state.range(1);
  for (auto _ : state) {
    auto p = plan(chain, budget, o);
    benchmark::DoNotOptimize(p.time);
  }
  state.counters["stages"] = static_cast<double>(chain.size());
}

void optimal(benchmark::State& state)
{
  plan_a_third(state, [](auto const& c, std::int64_t b, auto const& o) {
    return gpukit::plan_optimal(c, b, o);
  });
}
BENCHMARK(optimal)
  ->Args({32, 512})
  ->Args({64, 512})
  ->Args({128, 512})
  ->Args({128, 128})
  ->Args({512, 64})
  ->Unit(benchmark::kMillisecond);

// plan_best on the same chains: rotor's program at each of its size resolutions up to the budget
// (so that time never rises with the budget); chains this long are beyond its search.
void best(benchmark::State& state)
{
  plan_a_third(
    state, [](auto const& c, std::int64_t b, auto const& o) { return gpukit::plan_best(c, b, o); });
}
BENCHMARK(best)->Args({32, 512})->Args({64, 512})->Args({128, 512})->Unit(benchmark::kMillisecond);

// plan_best on 11 stages: the search over every schedule, bounded by rotor's plan.
void best_search(benchmark::State& state)
{
  auto const chain  = bench_chain(static_cast<std::size_t>(state.range(0)));
  auto const budget = gpukit::plan_store_all(chain).peak * state.range(1) / 100;
  for (auto _ : state) {
    auto p = gpukit::plan_best(chain, budget);
    benchmark::DoNotOptimize(p.time);
  }
}
BENCHMARK(best_search)
  ->Args({8, 33})
  ->Args({11, 33})
  ->Args({11, 50})
  ->Unit(benchmark::kMillisecond);

// plan_with_offload on 64 stages at a bandwidth that copies an average activation in about
// an average forward time.
void offload(benchmark::State& state)
{
  auto chain = bench_chain(64);
  chain.set_copy_bandwidth(10);
  auto const budget = gpukit::plan_store_all(chain).peak / 3;
  for (auto _ : state) {
    auto p = gpukit::plan_with_offload(chain, budget);
    benchmark::DoNotOptimize(p.time);
  }
}
BENCHMARK(offload)->Unit(benchmark::kMillisecond);

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

struct gap_stats {
  long long mismatches{0};
  double max_gap{0}, gap_sum{0};
  void add(std::int64_t time, std::int64_t optimum)
  {
    double const gap = static_cast<double>(time) / static_cast<double>(optimum) - 1.0;
    mismatches += time != optimum;
    max_gap = std::max(max_gap, gap);
    gap_sum += gap;
  }
};

int gap_report(long long chains, std::size_t min_l, std::size_t max_l, unsigned long long seed)
{
  std::mt19937_64 rng{seed};
  std::uniform_int_distribution<int> t{1, 100}, s{1, 100};
  gap_stats dp, dp_rounded, best;
  long long budgets = 0;
  for (long long c = 0; c < chains; ++c) {
    std::size_t const L = min_l + static_cast<std::size_t>(c) % (max_l - min_l + 1);
    std::vector<gpukit::checkpoint_stage> v;
    for (std::size_t i = 0; i < L; ++i) v.push_back({t(rng), t(rng), s(rng), s(rng)});
    if (c % 2 == 0) std::fill(v.begin(), v.end(), v.front());  // uniform
    gpukit::checkpoint_chain const chain{v};
    std::int64_t const need = gpukit::optimal_min_budget(chain);
    std::int64_t const top  = gpukit::plan_store_all(chain).peak;
    for (std::int64_t k = 0; k < 4; ++k) {
      std::int64_t const budget = need + (top - need) * k / 4;
      std::int64_t const ex     = gpukit::plan_exhaustive(chain, budget).time;
      gpukit::checkpoint_planner_options exact_sizes;
      exact_sizes.slots = std::max<std::int64_t>(exact_sizes.slots, budget);
      dp.add(gpukit::plan_optimal(chain, budget, exact_sizes).time, ex);
      dp_rounded.add(gpukit::plan_optimal(chain, budget).time, ex);
      best.add(gpukit::plan_best(chain, budget).time, ex);
      ++budgets;
    }
  }
  std::printf("chains %lld (L %zu..%zu, half uniform), budgets %lld\n", chains, min_l, max_l,
              budgets);
  std::printf("%-28s %10s %10s %10s\n", "planner", "mismatches", "max gap", "mean gap");
  std::pair<char const*, gap_stats const*> const rows[] = {{"plan_optimal, exact sizes", &dp},
                                                           {"plan_optimal, 512 slots", &dp_rounded},
                                                           {"plan_best", &best}};
  for (auto const& [name, g] : rows) {
    std::printf("%-28s %10lld %9.2f%% %9.3f%%\n", name, g->mismatches, 100 * g->max_gap,
                100 * g->gap_sum / static_cast<double>(budgets));
  }
  return best.mismatches == 0 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv)
{
  if (argc >= 2 && std::strcmp(argv[1], "--gap-report") == 0) {
    long long const chains = argc > 2 ? std::atoll(argv[2]) : 2000;
    auto const min_l       = static_cast<std::size_t>(argc > 3 ? std::atoll(argv[3]) : 2);
    auto const max_l       = static_cast<std::size_t>(argc > 4 ? std::atoll(argv[4]) : 9);
    auto const seed        = static_cast<unsigned long long>(argc > 5 ? std::atoll(argv[5]) : 1);
    if (chains < 1 || min_l < 1 || max_l < min_l || max_l > gpukit::exhaustive_max_stages) {
      std::fprintf(stderr, "planner_bench --gap-report: CHAINS >= 1, 1 <= MIN_L <= MAX_L <= 11\n");
      return 2;
    }
    return gap_report(chains, min_l, max_l, seed);
  }
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
