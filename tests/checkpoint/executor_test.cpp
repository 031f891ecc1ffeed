// The checkpoint executor on the simulated GPU: stages computed on the host in stream order (host
// functions on the stream), gradients bit for bit equal under every plan, each stage's side effects
// once per step, the order of the calls that of the schedule, and the allocator's peak requested
// bytes equal to the plan's peak.
#include <gpukit/checkpoint/executor.hpp>
#include <gpukit/checkpoint/planners.hpp>
#include <gpukit/runtime/sim_runtime.hpp>

#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

using namespace gpukit;
using sim_allocator = basic_caching_allocator<sim_runtime>;
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
struct host_stages {
  sim_runtime& rt;
  std::vector<std::size_t> n;  // n[0] = input width
  std::vector<float> w, dw;
  std::vector<int> side_effects;  // forwards that were not recomputations, per stage
  std::vector<std::string> calls;
  std::vector<std::size_t> live_check;

  std::size_t size() const { return n.size() - 1; }
  std::size_t output_bytes(std::size_t i) { return n[i] * sizeof(float); }
  std::size_t tape_bytes(std::size_t i) { return n[i] * sizeof(float) * (i % 2 == 1 ? 2 : 1); }

  void forward(std::size_t i, void const* x_in, void* x_out, void* tape,
               checkpoint_context const& c, stream_t s)
  {
    calls.push_back((tape ? "Fe" : "Fn") + std::to_string(i));
    CHECK(c.recording == (tape != nullptr));
    if (!c.recomputing) ++side_effects[i];
    std::size_t const in = n[i - 1], out = n[i];
    float const wi  = w[i];
    auto const seed = c.rng_seed;
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
    std::size_t const in = n[i - 1], out = n[i];
    float const wi  = w[i];
    float* dwi      = &dw[i];
    auto const seed = c.rng_seed;
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
  sim_runtime sim{sim_config{}.with_devices(1, std::size_t{1} << 30)};
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
  host_stages st{rt, {48, 64, 256, 128, 512, 64, 320, 96, 192, 64, 16}, {}, {}, {}, {}, {}};
  for (std::size_t i = 0; i <= st.size(); ++i) st.w.push_back(0.5f + 0.05f * static_cast<float>(i));
  st.dw.assign(st.size() + 1, 0.0f);
  st.side_effects.assign(st.size() + 1, 0);
  return st;
}

struct step_result {
  std::vector<float> dw;
  std::int64_t peak_requested{0};
  checkpoint_run_stats stats;
  std::vector<std::string> calls;
  std::vector<int> side_effects;
};

step_result run_step(fixture& f, checkpoint_schedule const& schedule)
{
  auto st = make_stages(f.sim);
  std::vector<float> x0(st.n[0]);
  for (std::size_t j = 0; j < x0.size(); ++j) x0[j] = 0.01f * static_cast<float>(j) - 0.2f;
  f.alloc.reset_peak();
  basic_checkpoint_executor<sim_runtime> exec{f.alloc};
  step_result r;
  r.stats = exec.run_async(schedule, st, st.size(), x0.data(), f.stream, 7);
  GPUKIT_CUDA_TRY(f.sim.stream_synchronize(f.stream));
  auto const s     = f.alloc.stats();
  r.peak_requested = s.requested_bytes.peak;
  CHECK(s.requested_bytes.current == 0);
  CHECK(f.alloc.check_invariants().empty());
  r.dw           = st.dw;
  r.calls        = st.calls;
  r.side_effects = st.side_effects;
  return r;
}

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
  TEST_CASE("executor: every plan gives the store-all gradients, bit for bit, at the planned peak")
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
}
