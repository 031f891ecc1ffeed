// SPDX-License-Identifier: Apache-2.0
// profile_chain on the simulated GPU: stages whose work is a host function that sleeps a known
// time, so the runtime's timing events measure it; sizes from the caching allocator, including
// memory a stage allocates itself (kept until its backward: part of the tape; freed within an
// operation: a transient); every call made as the executor makes it, without side effects; and
// the plan made from the profile holding the executor's measured peak.
#include "support/sim_gpu.hpp"

#include <gpukit/checkpoint/executor.hpp>
#include <gpukit/checkpoint/planners.hpp>
#include <gpukit/checkpoint/profile_chain.hpp>
#include <gpukit/runtime/sim_runtime.hpp>

#include <doctest/doctest.h>

#include <chrono>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

using namespace gpukit;
using sim_allocator = basic_caching_allocator<sim_runtime>;
using stream_t      = sim_runtime::stream_type;

namespace {

// A stage's work on the simulated GPU: sleep, then fill the output (when there is one), run by
// the stream's worker in stream order.
struct sleep_task {
  int ms{0};
  void* out{nullptr};
  std::size_t bytes{0};
  int fill{0};

  static void run(void* self)
  {
    auto* t = static_cast<sleep_task*>(self);
    std::this_thread::sleep_for(std::chrono::milliseconds(t->ms));
    if (t->out != nullptr) std::memset(t->out, t->fill, t->bytes);
    delete t;
  }
  static void enqueue(sim_runtime& rt, stream_t s, sleep_task task)
  {
    auto* t = new sleep_task{task};
    GPUKIT_CUDA_TRY(rt.launch_host_func(s, &sleep_task::run, t));
  }
};

// Stage i: out[i] bytes, a declared tape of tape[i] bytes, a forward that sleeps fwd_ms[i] and a
// backward that sleeps bwd_ms[i]. Stage `keeper` also allocates `kept` bytes itself in a
// recording forward and frees them in its backward; stage `worker` allocates and frees a workspace
// of `work` bytes inside its forward, and stage 1 one of `bwd_work` bytes inside its backward.
struct sleepy_stages {
  sim_runtime& rt;
  sim_allocator& alloc;
  std::vector<std::size_t> out, tape;
  std::vector<int> fwd_ms, bwd_ms;
  std::size_t keeper{0}, kept{0}, worker{0}, work{0}, bwd_work{0};
  void* kept_ptr{nullptr};
  std::vector<std::string> calls;
  int side_effects{0};
  std::size_t bad_buffers{0};  // calls given a null buffer where one is due, or the reverse

  sleepy_stages(sim_runtime& r, sim_allocator& a) : rt{r}, alloc{a} {}

  std::size_t output_bytes(std::size_t i) { return out[i]; }
  std::size_t tape_bytes(std::size_t i) { return tape[i]; }

  void forward(std::size_t i, void const* x_in, void* x_out, void* t, checkpoint_context const& c,
               stream_t s)
  {
    calls.push_back((c.recording ? "Fe" : "Fn") + std::to_string(i));
    if (!c.is_recomputing() || !gpukit::is_recomputing()) ++side_effects;
    bad_buffers +=
      (x_in == nullptr) + (x_out == nullptr) + ((t != nullptr) != (c.recording && tape[i] > 0));
    if (c.recording && i == keeper) kept_ptr = alloc.allocate_async(kept, s);
    void* ws = i == worker ? alloc.allocate_async(work, s) : nullptr;
    sleep_task::enqueue(rt, s, {fwd_ms[i], x_out, out[i], static_cast<int>(i)});
    if (ws != nullptr) alloc.deallocate_async(ws, work, s);
  }

  void backward(std::size_t i, void const*, void const* t, void const* grad_out, void* grad_in,
                checkpoint_context const& c, stream_t s)
  {
    calls.push_back("B" + std::to_string(i));
    if (!c.is_recomputing()) ++side_effects;
    std::size_t const L = out.size() - 1;
    bad_buffers += ((grad_out == nullptr) != (i == L)) + ((grad_in == nullptr) != (i == 1)) +
                   ((t == nullptr) != (tape[i] == 0));
    void* ws = i == 1 && bwd_work > 0 ? alloc.allocate_async(bwd_work, s) : nullptr;
    sleep_task::enqueue(rt, s, {bwd_ms[i], nullptr, 0, 0});
    if (ws != nullptr) alloc.deallocate_async(ws, bwd_work, s);
    if (i == keeper && kept_ptr != nullptr) {
      alloc.deallocate_async(kept_ptr, kept, s);
      kept_ptr = nullptr;
    }
  }
};

struct fixture {
  sim_runtime sim{test::one_device(test::gib)};
  static caching_allocator_options options()
  {
    caching_allocator_options o;
    o.thread_cache_max_block_bytes = 0;  // every allocation takes the pool path: exact statistics
    return o;
  }
  sim_allocator alloc{sim, 0, options()};
  stream_t stream{};
  void* x0{nullptr};
  fixture()
  {
    GPUKIT_CUDA_TRY(sim.stream_create(stream));
    GPUKIT_CUDA_TRY(sim.malloc(&x0, 4096));
  }
  ~fixture()
  {
    (void)sim.stream_synchronize(stream);
    alloc.forget_stream(stream);
    (void)sim.stream_destroy(stream);
    (void)sim.free(x0);
  }
  sleepy_stages stages()
  {
    sleepy_stages st{sim, alloc};
    st.out    = {0, 1000, 4000, 2000, 3000};
    st.tape   = {0, 1000, 4000, 0, 6000};
    st.fwd_ms = {0, 2, 8, 4, 3};
    st.bwd_ms = {0, 4, 12, 6, 5};
    return st;
  }
};

chain_profile_options quick()
{
  chain_profile_options o;
  o.warmup      = 1;
  o.repetitions = 3;
  return o;
}

}  // namespace

TEST_CASE_FIXTURE(fixture, "profile_chain: sizes come from the allocator's statistics")
{
  auto st           = stages();
  st.keeper         = 2;
  st.kept           = 1500;  // held from a recording forward to the backward: part of t_2
  st.worker         = 3;
  st.work           = 30000;  // allocated and freed inside F<3>: a transient
  st.bwd_work       = 2500;   // inside B<1>
  auto const before = alloc.stats().requested_bytes.current;
  auto const prof   = profile_chain(alloc, st, 4, x0, stream, quick());
  REQUIRE(prof.stages.size() == 4);
  std::int64_t const out[]  = {1000, 4000, 2000, 3000};
  std::int64_t const tape[] = {1000, 4000 + 1500, 0, 6000};
  for (std::size_t i = 0; i < 4; ++i) {
    INFO("stage " << i + 1);
    CHECK(prof.stages[i].output_bytes == out[i]);
    CHECK(prof.stages[i].tape_bytes == tape[i]);
    CHECK(prof.stages[i].forward_transient == (i == 2 ? 30000 : 0));
    CHECK(prof.stages[i].backward_transient == (i == 0 ? 2500 : 0));
  }
  CHECK(prof.transient_bytes() == 30000);
  auto const chain = prof.chain();
  CHECK(chain[2].tape_size == 5500);
  CHECK(chain[4].output_size == 3000);
  // Everything the profiler allocated is freed; nothing was a first (side-effect) forward.
  CHECK(alloc.stats().requested_bytes.current == before);
  CHECK(st.side_effects == 0);
  CHECK(st.bad_buffers == 0);
}

TEST_CASE_FIXTURE(fixture, "profile_chain: times are medians of the runtime's timing events")
{
  auto st          = stages();
  auto const prof  = profile_chain(alloc, st, 4, x0, stream, quick());
  auto const chain = prof.chain();  // microseconds
  for (std::size_t i = 1; i <= 4; ++i) {
    INFO("stage " << i);
    auto const& m = prof.stages[i - 1];
    CHECK(m.forward_samples.size() == 6);  // 3 without and 3 with recording
    CHECK(m.backward_samples.size() == 3);
    // A sleep lasts at least its time; a loaded machine may stretch it, never shorten it.
    CHECK(m.forward_ms >= 0.99 * st.fwd_ms[i]);
    CHECK(m.forward_ms < st.fwd_ms[i] + 100.0);
    CHECK(m.backward_ms >= 0.99 * st.bwd_ms[i]);
    CHECK(m.backward_ms < st.bwd_ms[i] + 100.0);
    CHECK(chain[i].forward_time == std::llround(m.forward_ms * 1000.0));
    CHECK(chain[i].backward_time == std::llround(m.backward_ms * 1000.0));
  }
  // The calls of one stage: sizes (Fn, Fe, B), then warm-up and repetitions (Fn, Fe, B each).
  std::vector<std::string> first(st.calls.begin(), st.calls.begin() + 15);
  std::vector<std::string> const expected{"Fn1", "Fe1", "B1",  "Fn1", "Fe1", "B1",  "Fn1", "Fe1",
                                          "B1",  "Fn1", "Fe1", "B1",  "Fn1", "Fe1", "B1"};
  CHECK(first == expected);
  CHECK(st.calls.size() == 4 * 15);
}

TEST_CASE_FIXTURE(fixture, "profile_chain: the time unit scales the chain's times")
{
  auto st          = stages();
  auto o           = quick();
  o.time_unit_ns   = 1000000;  // milliseconds
  auto const prof  = profile_chain(alloc, st, 4, x0, stream, o);
  auto const chain = prof.chain();
  for (std::size_t i = 1; i <= 4; ++i) {
    CHECK(chain[i].forward_time ==
          std::max<std::int64_t>(1, std::llround(prof.stages[i - 1].forward_ms)));
  }
}

TEST_CASE_FIXTURE(fixture, "profile_chain: a plan of the profile holds the executor's peak")
{
  // Stages that allocate nothing themselves: the plan's peak is the allocator's, to the byte.
  auto st          = stages();
  auto const prof  = profile_chain(alloc, st, 4, x0, stream, quick());
  auto const chain = prof.chain();
  auto const all   = plan_store_all(chain);
  basic_checkpoint_executor<sim_runtime> exec{alloc};
  for (std::int64_t budget : {all.peak, all.peak * 2 / 3, optimal_min_budget(chain)}) {
    INFO("budget " << budget);
    auto const plan = plan_optimal(chain, budget);
    GPUKIT_CUDA_TRY(sim.stream_synchronize(stream));
    alloc.reset_peak();
    auto const base = alloc.stats().requested_bytes.current;
    (void)exec.run_async(plan.schedule, st, 4, x0, stream);
    GPUKIT_CUDA_TRY(sim.stream_synchronize(stream));
    CHECK(alloc.stats().requested_bytes.peak - base == plan.peak);
  }
  // With a kept allocation and a workspace: the peak stays within the plan's plus the transient.
  st.keeper        = 2;
  st.kept          = 1500;
  st.worker        = 3;
  st.work          = 30000;
  auto const prof2 = profile_chain(alloc, st, 4, x0, stream, quick());
  auto const plan  = plan_optimal(prof2.chain(), plan_store_all(prof2.chain()).peak);
  GPUKIT_CUDA_TRY(sim.stream_synchronize(stream));
  alloc.reset_peak();
  auto const base = alloc.stats().requested_bytes.current;
  (void)exec.run_async(plan.schedule, st, 4, x0, stream);
  GPUKIT_CUDA_TRY(sim.stream_synchronize(stream));
  auto const peak = alloc.stats().requested_bytes.peak - base;
  CHECK(peak > plan.peak);  // the workspace is real
  CHECK(peak <= plan.peak + prof2.transient_bytes());
}

TEST_CASE_FIXTURE(fixture, "profile_chain: bad settings are refused before anything runs")
{
  auto st       = stages();
  auto o        = quick();
  o.repetitions = 0;
  CHECK_THROWS_AS((void)profile_chain(alloc, st, 4, x0, stream, o), logic_error);
  o              = quick();
  o.time_unit_ns = 0;
  CHECK_THROWS_AS((void)profile_chain(alloc, st, 4, x0, stream, o), logic_error);
  CHECK_THROWS_AS((void)profile_chain(alloc, st, 0, x0, stream, quick()), logic_error);
  CHECK(st.calls.empty());
}
