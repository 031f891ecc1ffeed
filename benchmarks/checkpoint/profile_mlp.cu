// SPDX-License-Identifier: Apache-2.0
// profile_mlp: how well a profile_chain cost model predicts the GPU. The MLP chain of
// examples/checkpoint_mlp.cu is profiled (gpukit::profile_chain: CUDA events, the caching
// allocator's statistics), planned with plan_optimal at budgets from store-all's peak down to the
// least, and each plan run by the checkpoint executor: predicted peak against the allocator's
// measured peak requested bytes, predicted step time against the median measured step time.
// Targets: peak within 3%, time within 5%. One row per budget, then one JSON summary line.
//
//   build/h200/benchmarks/profile_mlp [--layers 24] [--batch 1024] [--width 1024] [--reps 10]
//
// Exits 77 without a GPU, 1 when a target is missed.
#include "../../examples/checkpoint_mlp_stages.cuh"
#include "../../examples/gpu_main.hpp"

#include <gpukit/checkpoint/planners.hpp>
#include <gpukit/checkpoint/profile_chain.hpp>
#include <gpukit/runtime/cuda_runtime.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>
#include <vector>

namespace {

struct args {
  int layers{24}, batch{1024}, width{1024}, reps{10};
};

args parse(int argc, char** argv)
{
  args a;
  for (int k = 1; k + 1 < argc; k += 2) {
    std::string const s = argv[k];
    int const v         = std::atoi(argv[k + 1]);
    if (v < 1) {
      std::fprintf(stderr, "profile_mlp: %s %s: expected a positive integer\n", argv[k],
                   argv[k + 1]);
      std::exit(2);
    }
    if (s == "--layers")
      a.layers = v + v % 2;
    else if (s == "--batch")
      a.batch = v;
    else if (s == "--width")
      a.width = v;
    else if (s == "--reps")
      a.reps = v;
    else {
      std::fprintf(stderr, "profile_mlp: unknown option %s (--layers --batch --width --reps)\n",
                   argv[k]);
      std::exit(2);
    }
  }
  return a;
}

int run(args const& a)
{
  using namespace checkpoint_mlp;
  gpu_run run{a.layers, a.batch, a.width};
  std::size_t const L = run.layers();

  gpukit::chain_profile_options po;
  po.warmup        = 2;
  po.repetitions   = 7;
  po.time_unit_ns  = 100;  // 0.1 µs
  auto const prof  = gpukit::profile_chain(run.alloc, run.stages, L, run.x0, run.stream, po);
  auto const chain = prof.chain();
  auto const all   = gpukit::plan_store_all(chain);
  std::int64_t const least = gpukit::optimal_min_budget(chain);
  cudaDeviceProp prop{};
  CHECK_CUDA(cudaGetDeviceProperties(&prop, 0));
  std::printf("device %s; MLP %zu layers, widths %d/%d, batch %d\n", prop.name, L, a.width,
              4 * a.width, a.batch);
  std::printf("%-10s %12s %12s %12s %8s %10s %10s %8s %7s\n", "budget", "budget MiB", "pred MiB",
              "peak MiB", "peak err", "pred ms", "step ms", "time err", "recomp");
  gpukit::checkpoint_executor exec{run.alloc};
  double const mib = 1024.0 * 1024.0;
  double peak_err = 0.0, time_err = 0.0;
  std::vector<std::pair<char const*, std::int64_t>> const budgets{{"store-all", all.peak},
                                                                  {"3/4", all.peak * 3 / 4},
                                                                  {"1/2", all.peak / 2},
                                                                  {"1/4", all.peak / 4},
                                                                  {"least", least}};
  for (auto const& [name, budget] : budgets) {
    if (budget < least) continue;
    auto const plan = gpukit::plan_optimal(chain, budget);
    auto const m    = measure_steps(exec, plan.schedule, run.stages, run.x0, run.stream, a.reps);
    double const pred_ms = static_cast<double>(plan.time) * 1e-4;
    double const pe =
      std::abs(static_cast<double>(plan.peak - m.peak_bytes)) / static_cast<double>(m.peak_bytes);
    double const te = std::abs(pred_ms - m.step_ms) / m.step_ms;
    peak_err        = std::max(peak_err, pe);
    time_err        = std::max(time_err, te);
    std::printf("%-10s %12.1f %12.1f %12.1f %7.2f%% %10.3f %10.3f %7.2f%% %7lld\n", name,
                budget / mib, plan.peak / mib, m.peak_bytes / mib, 100.0 * pe, pred_ms, m.step_ms,
                100.0 * te, static_cast<long long>(plan.recomputations));
  }
  bool const ok = peak_err <= 0.03 && time_err <= 0.05;
  std::printf(
    "{\"profile_mlp\": {\"ok\": %s, \"layers\": %zu, \"batch\": %d, \"width\": %d, "
    "\"peak_error_max\": %.4f, \"time_error_max\": %.4f}}\n",
    ok ? "true" : "false", L, a.batch, a.width, peak_err, time_err);
  return ok ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv)
{
  args const a = parse(argc, argv);
  return gpukit_examples::run_on_gpu("profile_mlp", [&] { return run(a); });
}
