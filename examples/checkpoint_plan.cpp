// SPDX-License-Identifier: Apache-2.0
// checkpoint_plan.cpp: plan activation checkpointing for a transformer-like chain (no GPU needed).
// Prints the optimal plan at a few budgets, with its replayed time and peak, beside store-all,
// Chen's sqrt(L) segments and PyTorch's checkpoint_sequential.
//
//   build/dev/examples/checkpoint_plan
#include <gpukit/checkpoint/planners.hpp>

#include <cstdio>
#include <exception>
#include <vector>

int main()
try {
  // Units: microseconds and MiB. Embedding, 8 blocks of attention + MLP, then the LM head.
  std::vector<gpukit::checkpoint_stage> stages{{50, 100, 64, 0}};
  for (int b = 0; b < 8; ++b) {
    stages.push_back({300, 600, 64, 320});  // attention: q, k, v and the softmax scores
    stages.push_back({400, 800, 64, 256});  // MLP: the 4x hidden activation
  }
  stages.push_back({200, 400, 512, 512});  // logits
  gpukit::checkpoint_chain const chain{stages};

  auto row = [](gpukit::checkpoint_plan const& p) {
    std::printf("%-16s time %6lld us   peak %5lld MiB   recomputed forwards %lld\n",
                p.planner.c_str(), static_cast<long long>(p.time), static_cast<long long>(p.peak),
                static_cast<long long>(p.recomputations));
  };
  auto const all = gpukit::plan_store_all(chain);
  row(all);
  row(gpukit::plan_sqrt(chain));
  for (std::size_t k : {2, 4, 8}) row(gpukit::plan_sequential(chain, k));
  std::int64_t const least = gpukit::optimal_min_budget(chain);
  std::printf("least budget of any persistent schedule: %lld MiB\n", static_cast<long long>(least));
  for (std::int64_t budget : {all.peak / 2, all.peak / 3, gpukit::plan_sqrt(chain).peak, least}) {
    auto const p = gpukit::plan_optimal(chain, budget);
    std::printf("budget %5lld: ", static_cast<long long>(budget));
    row(p);
  }
  auto const p = gpukit::plan_optimal(chain, all.peak / 3);
  std::printf("\nplan at %lld MiB:\n%s\n", static_cast<long long>(all.peak / 3),
              gpukit::to_string(p.schedule).c_str());
  try {
    (void)gpukit::plan_optimal(chain, least - 1);
  } catch (gpukit::checkpoint_infeasible const& e) {
    std::printf("\nbelow the least budget: %s\n", e.what());
  }
  return 0;
} catch (std::exception const& e) {
  std::fprintf(stderr, "checkpoint_plan: %s\n", e.what());
  return 1;
}
