// SPDX-License-Identifier: Apache-2.0
// The checkpoint executor on the simulated GPU: stages computed on the host in stream order (host
// functions on the stream), gradients bit for bit equal under every plan, each stage's side effects
// once per step, the order of the calls that of the schedule, and the allocator's peak requested
// bytes equal to the plan's peak. With offloading: the same gradients, the peak within the plan's,
// copies ordered by events alone (a stalled copy stream holds the step back, never the host). RNG
// hooks: a stateful generator replays exactly on recomputation, and only with the hooks.
#include "support/sim_gpu.hpp"

#include <gpukit/checkpoint/executor.hpp>
#include <gpukit/checkpoint/planners.hpp>
#include <gpukit/host/pinned_pool.hpp>
#include <gpukit/memory/detail/allocator_invariants.hpp>
#include <gpukit/runtime/sim_runtime.hpp>
#include <gpukit/transfer/transfer_pipeline.hpp>

#include <doctest/doctest.h>

#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstring>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

using namespace gpukit;
using sim_allocator = basic_caching_allocator<sim_runtime>;
using sim_executor  = basic_checkpoint_executor<sim_runtime>;
using stream_t      = sim_runtime::stream_type;

namespace {

template <class F>
void enqueue(sim_runtime& rt, stream_t s, F f)
{
  auto* task = new std::function<void()>(std::move(f));
  GPUKIT_CUDA_TRY(rt.launch_host_func(
    s,
    [](void* u) {
      auto* t = static_cast<std::function<void()>*>(u);
      (*t)();
      delete t;
    },
    task));
}

float noise(std::uint64_t seed, std::size_t j)
{
  std::uint64_t z = seed + j * 0x9E3779B97F4A7C15ull;
  z               = (z ^ (z >> 31)) * 0xBF58476D1CE4E5B9ull;
  return 1.0f + static_cast<float>((z >> 40) & 7) / 8.0f;  // a dropout-like mask in [1, 2)
}

// Stage i maps n_{i-1} floats to n_i: y_j = tanh(w_i x_{j mod n_{i-1}} + 0.1 j) * noise(seed, j).
// The tape keeps tanh(...) (n_i floats) and, for odd stages, as much again of scratch. Loss = sum
// y_L.
// With global_rng, the noise comes from a stateful generator (an offset that each forward
// advances, as a Philox offset does) instead of c.rng_seed, and the backward reads the seed its
// recording forward used (as a real stage would keep its dropout mask in the tape).
struct host_stages {
  sim_runtime& rt;
  std::vector<std::size_t> n;  // n[0] = input width
  std::vector<float> w, dw;
  std::vector<int> side_effects;  // forwards that were not recomputations, per stage
  std::vector<std::string> calls;
  std::vector<std::size_t> live_check;
  bool global_rng{false};
  std::uint64_t rng_offset{0};
  std::vector<std::uint64_t> tape_seed;

  std::size_t size() const { return n.size() - 1; }
  std::size_t output_bytes(std::size_t i) { return n[i] * sizeof(float); }
  std::size_t tape_bytes(std::size_t i) { return n[i] * sizeof(float) * (i % 2 == 1 ? 2 : 1); }

  void forward(std::size_t i, void const* x_in, void* x_out, void* tape,
               checkpoint_context const& c, stream_t s)
  {
    calls.push_back((tape ? "Fe" : "Fn") + std::to_string(i));
    CHECK(c.recording == (tape != nullptr));
    CHECK(gpukit::is_recomputing() == c.is_recomputing());
    if (!c.is_recomputing()) ++side_effects[i];
    std::size_t const in = n[i - 1], out = n[i];
    float const wi     = w[i];
    std::uint64_t seed = c.rng_seed;
    if (global_rng) {
      seed = rng_offset;
      rng_offset += out;  // the draws this forward makes
    }
    if (tape != nullptr) tape_seed[i] = seed;
    enqueue(rt, s, [=] {
      auto const* x = static_cast<float const*>(x_in);
      auto* y       = static_cast<float*>(x_out);
      auto* t       = static_cast<float*>(tape);
      for (std::size_t j = 0; j < out; ++j) {
        float const h = std::tanh(wi * x[j % in] + 0.1f * static_cast<float>(j));
        y[j]          = h * noise(seed, j);
        if (t) t[j] = h;
      }
    });
  }

  void backward(std::size_t i, void const* x_in, void const* tape, void const* grad_out,
                void* grad_in, checkpoint_context const& c, stream_t s)
  {
    calls.push_back("B" + std::to_string(i));
    CHECK((grad_out == nullptr) == (i == size()));
    CHECK((grad_in == nullptr) == (i == 1));
    CHECK(!gpukit::is_recomputing());
    std::size_t const in = n[i - 1], out = n[i];
    float const wi  = w[i];
    float* dwi      = &dw[i];
    auto const seed = global_rng ? tape_seed[i] : c.rng_seed;
    enqueue(rt, s, [=] {
      auto const* x  = static_cast<float const*>(x_in);
      auto const* t  = static_cast<float const*>(tape);
      auto const* go = static_cast<float const*>(grad_out);
      auto* gi       = static_cast<float*>(grad_in);
      if (gi) std::memset(gi, 0, in * sizeof(float));
      for (std::size_t j = 0; j < out; ++j) {
        float const g = (go ? go[j] : 1.0f) * noise(seed, j) * (1.0f - t[j] * t[j]);
        *dwi += g * x[j % in];
        if (gi) gi[j % in] += g * wi;
      }
    });
  }
};

struct fixture {
  sim_runtime sim{test::one_device(test::gib)};
  caching_allocator_options options()
  {
    caching_allocator_options o;
    o.thread_cache_max_block_bytes = 0;  // every allocation takes the pool path: exact peaks
    return o;
  }
  sim_allocator alloc{sim, 0, options()};
  stream_t stream{};
  fixture() { GPUKIT_CUDA_TRY(sim.stream_create(stream)); }
  ~fixture()
  {
    (void)sim.stream_synchronize(stream);
    alloc.forget_stream(stream);
    (void)sim.stream_destroy(stream);
  }
};

host_stages make_stages(sim_runtime& rt)
{
  host_stages st{
    rt, {48, 64, 256, 128, 512, 64, 320, 96, 192, 64, 16}, {}, {}, {}, {}, {}, false, 0, {}};
  for (std::size_t i = 0; i <= st.size(); ++i) st.w.push_back(0.5f + 0.05f * static_cast<float>(i));
  st.dw.assign(st.size() + 1, 0.0f);
  st.side_effects.assign(st.size() + 1, 0);
  st.tape_seed.assign(st.size() + 1, 0);
  return st;
}

// host_stages with the RNG hooks: the executor forks the generator around each recomputation.
struct hooked_stages : host_stages {
  std::vector<std::size_t> captured, restored;
  std::uint64_t rng_capture(std::size_t i, stream_t)
  {
    captured.push_back(i);
    return rng_offset;
  }
  void rng_restore(std::size_t i, std::uint64_t const& offset, stream_t)
  {
    restored.push_back(i);
    rng_offset = offset;
  }
};

struct step_result {
  std::vector<float> dw;
  std::int64_t peak_requested{0};
  checkpoint_run_stats stats;
  std::vector<std::string> calls;
  std::vector<int> side_effects;
};

std::vector<float> make_input(std::size_t n)
{
  std::vector<float> x0(n);
  for (std::size_t j = 0; j < x0.size(); ++j) x0[j] = 0.01f * static_cast<float>(j) - 0.2f;
  return x0;
}

template <class Stages = host_stages>
step_result run_step(fixture& f, checkpoint_schedule const& schedule, sim_executor* with = nullptr,
                     bool global_rng                                   = false,
                     std::function<void(Stages const&)> const& inspect = nullptr)
{
  Stages st = [&] {
    if constexpr (std::is_same_v<Stages, host_stages>) {
      return make_stages(f.sim);
    } else {
      return Stages{make_stages(f.sim), {}, {}};
    }
  }();
  st.global_rng = global_rng;
  auto const x0 = make_input(st.n[0]);
  f.alloc.reset_peak();
  sim_executor own{f.alloc};
  sim_executor& exec = with != nullptr ? *with : own;
  step_result r;
  r.stats = exec.run_async(schedule, st, st.size(), x0.data(), f.stream, 7);
  GPUKIT_CUDA_TRY(f.sim.stream_synchronize(f.stream));
  if (exec.offloading()) {
    GPUKIT_CUDA_TRY(f.sim.stream_synchronize(exec.offload_stream()));
    GPUKIT_CUDA_TRY(f.sim.stream_synchronize(exec.prefetch_stream()));
  }
  auto const s     = f.alloc.stats();
  r.peak_requested = s.requested_bytes.peak;
  CHECK(s.requested_bytes.current == 0);
  CHECK(gpukit::detail::check_invariants(f.alloc).empty());
  r.dw           = st.dw;
  r.calls        = st.calls;
  r.side_effects = st.side_effects;
  if (inspect) inspect(st);
  return r;
}

// Every plan the tests run: store-all, the baselines, Revolve, optimal from the least budget up.
std::vector<checkpoint_plan> all_plans(checkpoint_chain const& chain)
{
  auto const all = plan_store_all(chain);
  std::vector<checkpoint_plan> plans{all, plan_sequential(chain, 2), plan_sequential(chain, 5),
                                     plan_sqrt(chain), plan_revolve(chain, 3)};
  std::int64_t const least = optimal_min_budget(chain);
  for (int q = 0; q <= 4; ++q)
    plans.push_back(plan_optimal(chain, least + (all.peak - least) * q / 4));
  return plans;
}

// A pinned pool and a transfer pipeline on the fixture's simulated GPU.
struct offload_kit {
  basic_pinned_pool<sim_runtime> pool;
  basic_transfer_pipeline<sim_runtime> pipe;
  explicit offload_kit(sim_runtime& sim) : pool{sim}, pipe{sim, pool, options()} {}
  static transfer_options options()
  {
    transfer_options o;
    o.staging_threads = 1;  // the executor's copies are pinned: no staging
    o.chunk_bytes     = 4096;
    return o;
  }
};

checkpoint_chain chain_for(fixture& f)
{
  auto st = make_stages(f.sim);
  std::vector<std::pair<std::int64_t, std::int64_t>> times;
  for (std::size_t i = 1; i <= st.size(); ++i) {
    times.push_back({static_cast<std::int64_t>(st.n[i]), 2 * static_cast<std::int64_t>(st.n[i])});
  }
  return checkpoint_chain_of(st, st.size(), times);
}

}  // namespace

TEST_SUITE("checkpoint")
{
  TEST_CASE("executor: every plan gives the store-all gradients bit for bit at the planned peak")
  {
    fixture f;
    auto const chain = chain_for(f);
    auto const all   = plan_store_all(chain);
    auto const ref   = run_step(f, all.schedule);
    CHECK(ref.peak_requested == all.peak);
    CHECK(ref.stats.predicted_peak == all.peak);
    CHECK(ref.stats.recomputations == 0);

    std::vector<checkpoint_plan> plans{plan_sequential(chain, 2), plan_sequential(chain, 5),
                                       plan_sqrt(chain), plan_revolve(chain, 3)};
    std::int64_t const least = optimal_min_budget(chain);
    for (int q = 0; q <= 4; ++q)
      plans.push_back(plan_optimal(chain, least + (all.peak - least) * q / 4));
    plans.push_back(plan_optimal(chain, least));
    for (auto const& p : plans) {
      INFO(p.planner << " budget " << p.budget << ": " << to_string(p.schedule));
      auto const r = run_step(f, p.schedule);
      CHECK(r.peak_requested == p.peak);
      CHECK(r.stats.predicted_peak == p.peak);
      CHECK(r.stats.recomputations == static_cast<std::size_t>(p.recomputations));
      CHECK(std::memcmp(r.dw.data(), ref.dw.data(), r.dw.size() * sizeof(float)) == 0);
      // The calls follow the schedule, and side effects happen once per stage.
      std::vector<std::string> expected;
      for (auto const& op : p.schedule) expected.push_back(to_string(op));
      CHECK(r.calls == expected);
      for (std::size_t i = 1; i < r.side_effects.size(); ++i) CHECK(r.side_effects[i] == 1);
      if (p.budget >= 0) CHECK(r.peak_requested <= p.budget);
    }
    CHECK(plans.back().peak < all.peak / 2);  // the checkpointed step really is smaller
  }

  TEST_CASE("executor: an invalid schedule throws before anything is enqueued")
  {
    fixture f;
    auto st = make_stages(f.sim);
    std::vector<float> x0(st.n[0], 1.0f);
    basic_checkpoint_executor<sim_runtime> exec{f.alloc};
    auto bad = parse_checkpoint_schedule("Fe1 Fe3");
    CHECK_THROWS_WITH_AS(exec.run_async(bad, st, st.size(), x0.data(), f.stream),
                         doctest::Contains("operation 1 (Fe3): needs x_2"), logic_error);
    // Planned copies (plan_with_offload's O<j>/P<j>) are refused by name: the executor's own
    // offload (enable_offload) places its copies itself.
    auto copies = parse_checkpoint_schedule("Fe1 O1 Fe2");
    CHECK_THROWS_WITH_AS(exec.run_async(copies, st, st.size(), x0.data(), f.stream),
                         doctest::Contains("operation 1 (O1) is a planned offload/prefetch copy"),
                         logic_error);
    CHECK(st.calls.empty());
    CHECK(f.alloc.stats().num_allocs == 0);
  }

  TEST_CASE("executor: a stage that throws leaves no buffer allocated")
  {
    fixture f;
    struct throwing : host_stages {
      void backward(std::size_t i, void const*, void const*, void const*, void*,
                    checkpoint_context const&, stream_t)
      {
        if (i == 4) throw std::runtime_error{"stage 4 failed"};
      }
    };
    throwing st{make_stages(f.sim)};
    std::vector<float> x0(st.n[0], 1.0f);
    basic_checkpoint_executor<sim_runtime> exec{f.alloc};
    auto const chain = chain_for(f);
    CHECK_THROWS_WITH(exec.run_async(plan_sqrt(chain).schedule, st, st.size(), x0.data(), f.stream),
                      "stage 4 failed");
    GPUKIT_CUDA_TRY(f.sim.stream_synchronize(f.stream));
    CHECK(f.alloc.stats().requested_bytes.current == 0);
  }

  TEST_CASE(
    "executor: offloading keeps the store-all gradients bit for bit within the planned peak")
  {
    fixture f;
    auto const chain = chain_for(f);
    auto const ref   = run_step(f, plan_store_all(chain).schedule);
    offload_kit kit{f.sim};
    sim_executor exec{f.alloc};
    exec.enable_offload(kit.pipe);
    REQUIRE(exec.offloading());
    std::size_t offloads = 0, bytes = 0;
    for (auto const& p : all_plans(chain)) {
      INFO(p.planner << " budget " << p.budget << ": " << to_string(p.schedule));
      auto const before = kit.pipe.stats();
      auto const syncs  = f.sim.synchronizations();
      auto const r      = run_step(f, p.schedule, &exec);
      CHECK(std::memcmp(r.dw.data(), ref.dw.data(), r.dw.size() * sizeof(float)) == 0);
      CHECK(r.peak_requested <= p.peak);
      if (p.budget >= 0) CHECK(r.peak_requested <= p.budget);
      // run_step synchronizes the three streams (3 calls) and the allocator never blocks: the
      // executor itself waits for nothing.
      CHECK(f.sim.synchronizations() - syncs == 3);
      // Every copy went through the pipeline: out and back, the same bytes.
      auto const after = kit.pipe.stats();
      CHECK(after.d2h_bytes - before.d2h_bytes == r.stats.offloaded_bytes);
      CHECK(after.h2d_bytes - before.h2d_bytes == r.stats.offloaded_bytes);
      for (std::size_t i = 1; i < r.side_effects.size(); ++i) CHECK(r.side_effects[i] == 1);
      offloads += r.stats.offloads;
      bytes += r.stats.offloaded_bytes;
    }
    CHECK(offloads > 0);
    MESSAGE(offloads << " activations offloaded, " << bytes << " bytes");
    // Store-all keeps every activation until its backward: offloading must lower its peak.
    auto const all = plan_store_all(chain);
    auto const r   = run_step(f, all.schedule, &exec);
    CHECK(r.stats.offloads >= chain.size() - 2);
    CHECK(r.peak_requested < all.peak);
    MESSAGE("store-all peak " << all.peak << " bytes, with offloading " << r.peak_requested);
    // Every pinned buffer is back in the pool.
    CHECK(kit.pool.stats().allocated_bytes.current == 0);
    // Activations below min_bytes stay on the device; a longer prefetch distance still works.
    checkpoint_offload_options o;
    o.min_bytes         = 1024;
    o.prefetch_distance = 3;
    exec.enable_offload(kit.pipe, o);
    auto const big = run_step(f, all.schedule, &exec);
    CHECK(std::memcmp(big.dw.data(), ref.dw.data(), big.dw.size() * sizeof(float)) == 0);
    CHECK(big.stats.offloads > 0);
    CHECK(big.stats.offloads < r.stats.offloads);
    CHECK(big.peak_requested <= all.peak);
    exec.disable_offload();
    auto const off = run_step(f, all.schedule, &exec);
    CHECK(off.stats.offloads == 0);
    CHECK(off.peak_requested == all.peak);
    checkpoint_offload_options bad;
    bad.prefetch_distance = 0;
    CHECK_THROWS_WITH_AS(exec.enable_offload(kit.pipe, bad),
                         doctest::Contains("prefetch_distance = 0"), logic_error);
  }

  TEST_CASE("executor: a stalled offload stream holds back the step and never the host")
  {
    fixture f;
    auto const chain = chain_for(f);
    auto const all   = plan_store_all(chain);
    auto const ref   = run_step(f, all.schedule);
    offload_kit kit{f.sim};
    sim_executor exec{f.alloc};
    exec.enable_offload(kit.pipe);
    auto st       = make_stages(f.sim);
    auto const x0 = make_input(st.n[0]);
    GPUKIT_CUDA_TRY(f.sim.stall(exec.offload_stream()));
    // run_async on another thread: if it blocked on the stalled stream, the watchdog below
    // releases the stream (so that the test ends) and fails.
    std::mutex m;
    std::condition_variable cv;
    bool done = false;
    checkpoint_run_stats stats;
    std::thread worker{[&] {
      stats = exec.run_async(all.schedule, st, st.size(), x0.data(), f.stream, 7);
      std::lock_guard<std::mutex> lock{m};
      done = true;
      cv.notify_all();
    }};
    bool returned = false;
    {
      std::unique_lock<std::mutex> lock{m};
      returned = cv.wait_for(lock, std::chrono::seconds{20}, [&] { return done; });
    }
    // The first use of an offloaded activation waits for its copy back, which waits for the
    // stalled copy out: the compute stream cannot have finished.
    bool const compute_pending = f.sim.stream_query(f.stream) == cudaErrorNotReady;
    GPUKIT_CUDA_TRY(f.sim.release(exec.offload_stream()));
    worker.join();
    CHECK(returned);
    CHECK(stats.offloads > 0);
    CHECK(compute_pending);
    GPUKIT_CUDA_TRY(f.sim.stream_synchronize(f.stream));
    CHECK(std::memcmp(st.dw.data(), ref.dw.data(), st.dw.size() * sizeof(float)) == 0);
  }

  TEST_CASE("executor: RNG hooks replay a stateful generator on recomputation")
  {
    fixture f;
    auto const chain = chain_for(f);
    auto const ref   = run_step(f, plan_store_all(chain).schedule, nullptr, true);
    // Without hooks, a recomputation draws new numbers: gradients differ from store-all's.
    auto const seq = plan_sequential(chain, 5);
    REQUIRE(seq.recomputations > 0);
    auto const unhooked = run_step(f, seq.schedule, nullptr, true);
    CHECK(std::memcmp(unhooked.dw.data(), ref.dw.data(), ref.dw.size() * sizeof(float)) != 0);
    offload_kit kit{f.sim};
    sim_executor offloading{f.alloc};
    offloading.enable_offload(kit.pipe);
    for (auto const& p : all_plans(chain)) {
      for (sim_executor* exec : {static_cast<sim_executor*>(nullptr), &offloading}) {
        INFO(p.planner << " budget " << p.budget << (exec ? " offloading" : "") << ": "
                       << to_string(p.schedule));
        std::size_t restores = 0;
        std::uint64_t offset = 0, total = 0;
        auto const r =
          run_step<hooked_stages>(f, p.schedule, exec, true, [&](hooked_stages const& st) {
            restores = st.restored.size();
            offset   = st.rng_offset;
            for (std::size_t i = 1; i <= chain.size(); ++i) total += st.n[i];
          });
        CHECK(std::memcmp(r.dw.data(), ref.dw.data(), ref.dw.size() * sizeof(float)) == 0);
        // One capture per stage, one more per recomputation (the generator's state before it).
        CHECK(r.stats.rng_captures == chain.size() + static_cast<std::size_t>(p.recomputations));
        CHECK(restores == 2 * static_cast<std::size_t>(p.recomputations));
        // The generator ends where store-all leaves it: recomputations did not advance it.
        CHECK(offset == total);
      }
    }
    CHECK_FALSE(gpukit::is_recomputing());  // only inside a recomputing forward call
  }
}
