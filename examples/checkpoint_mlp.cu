// SPDX-License-Identifier: Apache-2.0
// checkpoint_mlp: trains a deep MLP chain on the GPU through gpukit's checkpoint executor, under
// every planner, and prints peak memory (the caching allocator's statistics) and step time per
// plan. It checks its promises and exits 1 when any check fails:
//   - the weight and bias gradients, and the running statistics (updated only when the executor
//     says the forward is not a recomputation), equal store-all's bit for bit under every plan,
//     with and without offloading (the kernels are deterministic: one thread per output element,
//     sums in a fixed order);
//   - the allocator's peak requested bytes equal the plan's peak without offloading, stay at or
//     below it with offloading, and never pass the plan's budget.
// Without a GPU it says so and exits 77 (CTest: skipped).
//
//   build/h200/bin/examples/checkpoint_mlp                 # the table (about 10 s on the H200)
//   build/h200/bin/examples/checkpoint_mlp --quick         # small sizes: the checks only
//   options: --layers N (even) --batch B --width W (the wide layers are 4W) --reps R
//
// Stage i is a linear layer with tanh and dropout (p = 1/8, its mask drawn from the executor's
// per-stage seed): x_i = tanh(W_i x_{i-1} + b_i) * mask_i. Widths alternate W, 4W, W, 4W, ...
// (a transformer MLP's shape), so that activations differ in size and the optimal plan has
// something to choose. The tape of a recording forward is the pre-activation z_i. The loss is
// 0.5 |x_L|^2. Stage times for the planner are measured once with CUDA events (microseconds).
#include "checkpoint_mlp_stages.cuh"
#include "gpu_main.hpp"

#include <gpukit/checkpoint/executor.hpp>
#include <gpukit/checkpoint/planners.hpp>
#include <gpukit/host/pinned_pool.hpp>
#include <gpukit/memory/caching_allocator.hpp>
#include <gpukit/runtime/cuda_runtime.hpp>
#include <gpukit/transfer/transfer_pipeline.hpp>

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <string>
#include <vector>

namespace {

using namespace checkpoint_mlp;

struct result {
  std::string name;
  std::int64_t budget{-1};
  std::int64_t plan_peak{0};
  std::int64_t peak_requested{0};
  std::int64_t peak_reserved{0};
  std::size_t recomputations{0};
  std::size_t offloaded_bytes{0};
  double step_ms{0.0};
  bool grads_equal{false};
  bool within{false};
};

double median(std::vector<double> v)
{
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

struct args {
  int layers{24}, batch{1024}, width{1024}, reps{5};
  bool quick{false};
};

args parse(int argc, char** argv)
{
  args a;
  for (int k = 1; k < argc; ++k) {
    std::string const s = argv[k];
    auto value          = [&](char const* name) {
      if (k + 1 >= argc) {
        std::fprintf(stderr, "checkpoint_mlp: %s needs a value\n", name);
        std::exit(2);
      }
      char* end    = nullptr;
      long const v = std::strtol(argv[++k], &end, 10);
      if (*end != '\0' || v < 1 || v > 1 << 20) {
        std::fprintf(stderr, "checkpoint_mlp: %s %s is not an integer in 1..2^20\n", name, argv[k]);
        std::exit(2);
      }
      return static_cast<int>(v);
    };
    if (s == "--quick") {
      a.quick = true, a.layers = 8, a.batch = 64, a.width = 64, a.reps = 1;
    } else if (s == "--layers") {
      a.layers = value("--layers");
    } else if (s == "--batch") {
      a.batch = value("--batch");
    } else if (s == "--width") {
      a.width = value("--width");
    } else if (s == "--reps") {
      a.reps = value("--reps");
    } else {
      std::fprintf(stderr,
                   "checkpoint_mlp: unknown option \"%s\" (--quick, --layers N, --batch B, "
                   "--width W, --reps R)\n",
                   s.c_str());
      std::exit(2);
    }
  }
  if (a.layers < 2 || a.layers % 2 != 0) {
    std::fprintf(stderr, "checkpoint_mlp: --layers %d must be even and at least 2\n", a.layers);
    std::exit(2);
  }
  return a;
}

int run(args const& a)
{
  auto& rt = gpukit::cuda_runtime::instance();
  gpukit::caching_allocator_options options;
  options.thread_cache_max_block_bytes = 0;  // every block through the pool: exact statistics
  gpukit::caching_allocator alloc{rt, 0, options};
  gpukit::pinned_pool pool{rt};
  gpukit::transfer_pipeline pipe{rt, pool};
  cudaStream_t stream = nullptr;
  CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));

  mlp net{a.layers, a.batch, a.width};
  std::size_t const L = static_cast<std::size_t>(a.layers);
  mlp_stages stages{net, std::vector<int>(L + 1, 0)};
  float* x0 = nullptr;
  {
    std::vector<float> host(static_cast<std::size_t>(a.batch) * a.width);
    for (std::size_t j = 0; j < host.size(); ++j)
      host[j] = std::sin(0.001f * static_cast<float>(j));
    CHECK_CUDA(cudaMalloc(&x0, host.size() * sizeof(float)));
    CHECK_CUDA(cudaMemcpy(x0, host.data(), host.size() * sizeof(float), cudaMemcpyHostToDevice));
  }

  cudaDeviceProp prop{};
  CHECK_CUDA(cudaGetDeviceProperties(&prop, 0));
  std::printf("device: %s; MLP of %zu layers (widths %d/%d), batch %d, %.1f M parameters\n",
              prop.name, L, a.width, 4 * a.width, a.batch,
              static_cast<double>(net.parameters) / 1e6);

  // Stage times for the planner: each stage's forward and backward timed once, in microseconds.
  std::vector<std::pair<std::int64_t, std::int64_t>> times(L, {1, 2});
  {
    cudaEvent_t e0, e1;
    CHECK_CUDA(cudaEventCreate(&e0));
    CHECK_CUDA(cudaEventCreate(&e1));
    std::size_t const most = net.out_bytes(1);
    float *x = nullptr, *y = nullptr, *t = nullptr, *g = nullptr, *gi = nullptr;
    for (float** p : {&x, &y, &t, &g, &gi}) CHECK_CUDA(cudaMalloc(p, most));
    CHECK_CUDA(cudaMemset(x, 0, most));
    CHECK_CUDA(cudaMemset(g, 0, most));
    gpukit::checkpoint_context c;
    c.recomputing = true;  // no side effects while timing
    for (std::size_t i = 1; i <= L; ++i) {
      float ms_f = 0, ms_b = 0;
      for (int rep = 0; rep < 2; ++rep) {  // the second is the one kept (warm)
        CHECK_CUDA(cudaEventRecord(e0, stream));
        stages.forward(i, x, y, t, c, stream);
        CHECK_CUDA(cudaEventRecord(e1, stream));
        CHECK_CUDA(cudaEventSynchronize(e1));
        CHECK_CUDA(cudaEventElapsedTime(&ms_f, e0, e1));
        CHECK_CUDA(cudaEventRecord(e0, stream));
        stages.backward(i, x, t, i == L ? nullptr : g, i == 1 ? nullptr : gi, c, stream);
        CHECK_CUDA(cudaEventRecord(e1, stream));
        CHECK_CUDA(cudaEventSynchronize(e1));
        CHECK_CUDA(cudaEventElapsedTime(&ms_b, e0, e1));
      }
      times[i - 1] = {std::max<std::int64_t>(1, std::llround(ms_f * 1000.0)),
                      std::max<std::int64_t>(1, std::llround(ms_b * 1000.0))};
    }
    for (float* p : {x, y, t, g, gi}) CHECK_CUDA(cudaFree(p));
    CHECK_CUDA(cudaEventDestroy(e0));
    CHECK_CUDA(cudaEventDestroy(e1));
  }
  auto const chain = gpukit::checkpoint_chain_of(stages, L, times);

  gpukit::checkpoint_executor exec{alloc};
  cudaEvent_t start, stop;
  CHECK_CUDA(cudaEventCreate(&start));
  CHECK_CUDA(cudaEventCreate(&stop));

  // One configuration: a warm-up step, then `reps` timed steps; the gradients and running
  // statistics of a single step (from zero) are compared with store-all's.
  std::vector<float> reference;
  auto measure = [&](std::string const& name, gpukit::checkpoint_plan const& p, bool offload) {
    if (offload) {
      gpukit::checkpoint_offload_options o;
      o.min_bytes = a.quick ? 0 : std::size_t{1} << 16;
      exec.enable_offload(pipe, o);
    } else {
      exec.disable_offload();
    }
    result r;
    r.name           = name + (offload ? " + offload" : "");
    r.budget         = p.budget;
    r.plan_peak      = p.peak;
    r.recomputations = static_cast<std::size_t>(p.recomputations);
    std::fill(stages.first_forwards.begin(), stages.first_forwards.end(), 0);
    // Checked step.
    net.zero_grads(stream);
    net.reset_running(stream);
    CHECK_CUDA(cudaStreamSynchronize(stream));
    alloc.reset_peak();
    auto const st = exec.run_async(p.schedule, stages, L, x0, stream, 1);
    CHECK_CUDA(cudaStreamSynchronize(stream));
    auto const s      = alloc.stats();
    r.peak_requested  = s.requested_bytes.peak;
    r.peak_reserved   = s.reserved_bytes.peak;
    r.offloaded_bytes = st.offloaded_bytes;
    auto const snap   = net.snapshot();
    if (reference.empty()) reference = snap;
    r.grads_equal = snap.size() == reference.size() &&
                    std::memcmp(snap.data(), reference.data(), snap.size() * sizeof(float)) == 0;
    for (std::size_t i = 1; i <= L; ++i) r.grads_equal &= stages.first_forwards[i] == 1;
    r.within = (offload ? r.peak_requested <= p.peak : r.peak_requested == p.peak) &&
               (p.budget < 0 || r.peak_requested <= p.budget);
    // Timed steps (same step index: the same masks; gradients accumulate, which costs the same).
    std::vector<double> ms;
    for (int rep = 0; rep <= a.reps; ++rep) {
      CHECK_CUDA(cudaEventRecord(start, stream));
      (void)exec.run_async(p.schedule, stages, L, x0, stream, 1);
      CHECK_CUDA(cudaEventRecord(stop, stream));
      CHECK_CUDA(cudaEventSynchronize(stop));
      float t = 0;
      CHECK_CUDA(cudaEventElapsedTime(&t, start, stop));
      if (rep > 0) ms.push_back(t);  // rep 0 warms up
    }
    r.step_ms = median(ms);
    return r;
  };

  std::vector<result> rows;
  auto const all = gpukit::plan_store_all(chain);
  rows.push_back(measure("store-all", all, false));
  rows.push_back(measure("store-all", all, true));
  auto const sq = gpukit::plan_sqrt(chain);
  rows.push_back(measure("sqrt(L)", sq, false));
  for (std::size_t k : {std::size_t{2}, std::size_t{4}}) {
    if (k < L)
      rows.push_back(
        measure("sequential:" + std::to_string(k), gpukit::plan_sequential(chain, k), false));
  }
  std::int64_t const least = gpukit::optimal_min_budget(chain);
  std::vector<std::int64_t> budgets{all.peak * 3 / 4, all.peak / 2, sq.peak, all.peak / 4, least};
  for (std::int64_t budget : budgets) {
    if (budget < least) continue;
    auto const p = gpukit::plan_optimal(chain, budget);
    rows.push_back(measure("optimal", p, false));
    if (budget == all.peak / 2 || budget == least) rows.push_back(measure("optimal", p, true));
  }

  std::printf("\n%-24s %10s %10s %10s %10s %7s %9s %9s %s\n", "plan", "budget MiB", "plan MiB",
              "peak MiB", "resv MiB", "recomp", "offl MiB", "step ms", "checks");
  bool ok          = true;
  double const mib = 1024.0 * 1024.0;
  for (auto const& r : rows) {
    ok &= r.grads_equal && r.within;
    std::printf("%-24s %10s %10.1f %10.1f %10.1f %7zu %9.1f %9.3f %s%s\n", r.name.c_str(),
                r.budget < 0
                  ? "-"
                  : std::to_string(static_cast<long long>(std::llround(r.budget / mib))).c_str(),
                r.plan_peak / mib, r.peak_requested / mib, r.peak_reserved / mib, r.recomputations,
                r.offloaded_bytes / mib, r.step_ms, r.grads_equal ? "grads=" : "GRADS DIFFER",
                r.within ? " peak<=plan" : " PEAK OVER");
  }
  double const base = rows[0].step_ms, off = rows[1].step_ms;
  std::printf(
    "\nstore-all with offload: %.3f ms against %.3f ms (%+.1f%%), peak %.1f MiB against %.1f MiB\n",
    off, base, 100.0 * (off - base) / base, rows[1].peak_requested / mib,
    rows[0].peak_requested / mib);
  std::printf(
    "{\"ok\": %s, \"layers\": %zu, \"batch\": %d, \"width\": %d, \"store_all_ms\": %.4f, "
    "\"offload_ms\": %.4f, \"offload_overhead\": %.4f}\n",
    ok ? "true" : "false", L, a.batch, a.width, base, off, (off - base) / base);

  CHECK_CUDA(cudaEventDestroy(start));
  CHECK_CUDA(cudaEventDestroy(stop));
  CHECK_CUDA(cudaStreamSynchronize(stream));
  alloc.forget_stream(stream);
  CHECK_CUDA(cudaStreamDestroy(stream));
  CHECK_CUDA(cudaFree(x0));
  if (!ok) std::fprintf(stderr, "checkpoint_mlp: FAILED: a plan's gradients or peak are wrong\n");
  return ok ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv)
{
  args const a = parse(argc, argv);
  return gpukit_examples::run_on_gpu("checkpoint_mlp", [&] { return run(a); });
}
