// SPDX-License-Identifier: Apache-2.0
// profile_chain on the GPU, on the stages of examples/checkpoint_mlp.cu: the measured sizes are the
// stages' buffers, and plans made from the profile predict the executor's run: the allocator's
// peak to the byte, the step time within 25% (small sizes: launch overheads the model does not
// see; benchmarks/checkpoint/profile_mlp.cu measures the full-size error).
#include "../../examples/checkpoint_mlp_stages.cuh"

#include <gpukit/checkpoint/planners.hpp>
#include <gpukit/checkpoint/profile_chain.hpp>
#include <gpukit/runtime/cuda_runtime.hpp>

#include <doctest/doctest.h>

#include <cmath>
#include <vector>

TEST_SUITE("gpu")
{
  TEST_CASE("profile_chain: the MLP's plans predict the executor's peak and time")
  {
    using namespace checkpoint_mlp;
    constexpr int layers = 8;
    gpu_run run{layers, 512, 512};
    auto& [alloc, stream, net, stages, x0] = run;
    auto const prof = gpukit::profile_chain(alloc, stages, layers, x0, stream);
    for (std::size_t i = 1; i <= layers; ++i) {
      INFO("stage " << i);
      auto const& m = prof.stages[i - 1];
      CHECK(m.output_bytes == static_cast<std::int64_t>(net.out_bytes(i)));
      CHECK(m.tape_bytes == static_cast<std::int64_t>(net.out_bytes(i)));
      CHECK(m.forward_transient == 0);
      CHECK(m.backward_transient == 0);
      CHECK(m.forward_ms > 0.0);
      CHECK(m.backward_ms > m.forward_ms * 0.5);  // two GEMMs against one
      CHECK(stages.first_forwards[i] == 0);       // profiling has no side effects
    }
    auto const chain = prof.chain();
    auto const all   = gpukit::plan_store_all(chain);
    gpukit::checkpoint_executor exec{alloc};
    for (std::int64_t budget : {all.peak, all.peak / 2, gpukit::optimal_min_budget(chain)}) {
      INFO("budget " << budget);
      auto const plan = gpukit::plan_optimal(chain, budget);
      auto const m    = measure_steps(exec, plan.schedule, stages, x0, stream, 5);
      CHECK(m.peak_bytes == plan.peak);
      double const predicted_ms = static_cast<double>(plan.time) * 1e-3;  // microseconds
      CHECK(std::abs(m.step_ms - predicted_ms) <= 0.25 * m.step_ms);
    }
  }
}
