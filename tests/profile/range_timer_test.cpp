// SPDX-License-Identifier: Apache-2.0
// gpukit::range_timer on the simulated GPU: GPU time per range from the runtime's timing events,
// aggregated by name, harvested without blocking, and the NVTX range it emits alongside.
#include "nvtx_test_support.hpp"

#include "support/range_stats.hpp"
#include "support/sim_gpu.hpp"

#include <gpukit/profile/range_timer.hpp>
#include <gpukit/runtime/sim_runtime.hpp>

#include <doctest/doctest.h>

#include <chrono>
#include <string>
#include <thread>
#include <vector>

namespace {

bool const tool_attached = gpukit_test::attach_nvtx_tool();

using gpukit::sim_runtime;
using gpukit::test::sim_stream;
using gpukit::test::sim_stream_fixture;
using sim_timer = gpukit::range_timer<sim_runtime>;

#define OK(call) REQUIRE_EQ((call), cudaSuccess)

// Queues `ms` milliseconds of "GPU work" (a host function that sleeps) on `s`.
void work(sim_runtime& rt, sim_stream s, int ms)
{
  static int const durations[] = {0, 5, 10, 20};
  int const* d                 = &durations[0];
  for (int const& v : durations) {
    if (v == ms) d = &v;
  }
  OK(rt.launch_host_func(
    s,
    [](void* p) {
      std::this_thread::sleep_for(std::chrono::milliseconds{*static_cast<int const*>(p)});
    },
    const_cast<int*>(d)));
}

}  // namespace

TEST_SUITE("profile")
{
  TEST_CASE_FIXTURE(sim_stream_fixture,
                    "range_timer measures the GPU work inside each range and aggregates by name")
  {
    {
      sim_timer timer{sim};
      for (int step = 0; step < 3; ++step) {
        auto t = timer.time("step", s);
        {
          auto f = timer.time("forward", s);
          work(sim, s, 20);
        }
        auto b = timer.time("backward", s);
        work(sim, s, 5);
      }
      timer.flush();
      CHECK(timer.pending() == 0);
      auto const step     = gpukit::test::stats_of(timer, "step");
      auto const forward  = gpukit::test::stats_of(timer, "forward");
      auto const backward = gpukit::test::stats_of(timer, "backward");
      CHECK(step.count == 3);
      CHECK(forward.count == 3);
      CHECK(forward.min_ms >= 19.0);
      CHECK(backward.min_ms >= 4.0);
      CHECK(step.min_ms >= forward.min_ms + backward.min_ms - 0.5);
      CHECK(forward.total_ms == doctest::Approx(forward.mean_ms * 3));
      CHECK(forward.max_ms >= forward.p90_ms);
      CHECK(forward.p90_ms >= forward.p50_ms);
      CHECK(forward.p50_ms >= forward.min_ms);
      CHECK(step.depth == 0);
      CHECK(forward.depth == 1);
      CHECK(step.share == doctest::Approx(1.0));
      CHECK(forward.share > 0.5);
      CHECK(forward.share < 1.0);
      auto const all = timer.stats();
      REQUIRE(all.size() == 3);
      CHECK(all[0].name == "step");  // largest total first

      std::string const text = timer.report();
      CHECK(text.find("step") != std::string::npos);
      CHECK(text.find("  forward") != std::string::npos);
      CHECK(text.find("share") != std::string::npos);
      std::string const json = timer.report_json();
      CHECK(json.rfind("{\"ranges\":[{\"name\":\"step\",\"count\":3,", 0) == 0);
      CHECK(json.find("\"pending\":0,\"dropped\":0}") != std::string::npos);
    }
  }

  TEST_CASE_FIXTURE(sim_stream_fixture,
                    "range_timer never blocks: a stalled stream's ranges stay pending until flush")
  {
    sim_timer timer{sim};
    OK(sim.stall(s));
    {
      auto r = timer.time("stalled", s);
    }
    sim.reset_counters();
    CHECK(timer.poll() == 0);
    CHECK(timer.pending() == 1);
    CHECK_FALSE(timer.stats("stalled"));
    CHECK(sim.synchronizations() == 0);
    OK(sim.release(s));
    timer.flush();
    CHECK(timer.pending() == 0);
    CHECK(gpukit::test::stats_of(timer, "stalled").count == 1);
  }

  TEST_CASE_FIXTURE(sim_stream_fixture, "range_timer reuses its events")
  {
    sim_timer timer{sim};
    for (int i = 0; i < 100; ++i) {
      auto r = timer.time("loop", s);
      OK(sim.stream_synchronize(s));
    }
    timer.flush();
    CHECK(gpukit::test::stats_of(timer, "loop").count == 100);
    CHECK(sim.calls(gpukit::sim_op::event_create) <= 4);
  }

  TEST_CASE_FIXTURE(sim_stream_fixture,
                    "range_timer drops ranges beyond max_pending instead of waiting")
  {
    gpukit::range_timer_options o;
    o.max_pending = 4;
    sim_timer timer{sim, o};
    OK(sim.stall(s));
    for (int i = 0; i < 10; ++i) { auto r = timer.time("x", s); }
    CHECK(timer.pending() == 4);
    CHECK(timer.dropped() == 6);
    OK(sim.release(s));
    timer.flush();
    CHECK(gpukit::test::stats_of(timer, "x").count == 4);
    timer.reset();
    CHECK(timer.stats().empty());
  }

  TEST_CASE_FIXTURE(sim_stream_fixture,
                    "range_timer reports a failed event and leaves no range open")
  {
    sim_timer timer{sim};
    sim.inject_fault(gpukit::sim_op::event_record, 1, cudaErrorLaunchFailure);
    CHECK_THROWS_AS((void)timer.time("fails", s), gpukit::cuda_error);
    CHECK(timer.dropped() == 1);
    {
      auto r = timer.time("works", s);
    }
    timer.flush();
    CHECK(gpukit::test::stats_of(timer, "works").count == 1);
    CHECK(gpukit::test::stats_of(timer, "works").depth == 0);
  }

  TEST_CASE_FIXTURE(sim_stream_fixture, "range_timer names the step range for shares")
  {
    gpukit::range_timer_options o;
    o.step_range = "a";
    sim_timer timer{sim, o};
    {
      auto a = timer.time("a", s);
      work(sim, s, 10);
    }
    {
      auto b = timer.time("b", s);
      work(sim, s, 10);
    }
    timer.flush();
    CHECK(gpukit::test::stats_of(timer, "a").share == doctest::Approx(1.0));
    // b did as much simulated work as a: its share of the step is about 1, but the simulated
    // GPU's wall-clock timing under sanitizers varies widely (0.43 was seen under ASan).
    CHECK(gpukit::test::stats_of(timer, "b").share > 0.1);
    CHECK(gpukit::test::stats_of(timer, "b").share < 10.0);
  }

  TEST_CASE_FIXTURE(sim_stream_fixture, "range_timer pushes an NVTX range of the same name")
  {
    REQUIRE(tool_attached);
    sim_timer timer{sim};
    gpukit_test::clear_nvtx_records();
    {
      auto r = timer.time("optimizer", s);
    }
    auto const pushes = gpukit_test::nvtx_records_of(gpukit_nvtx_push);
    REQUIRE(pushes.size() == 1);
    CHECK(std::string{pushes[0].message} == "optimizer");
    CHECK(std::string{pushes[0].domain} == "gpukit");
    CHECK(pushes[0].color == gpukit::name_color("optimizer"));
    CHECK(gpukit_test::nvtx_records_of(gpukit_nvtx_pop).size() == 1);
    timer.flush();
  }

  TEST_CASE_FIXTURE(sim_stream_fixture,
                    "names are interned by content: a reused buffer with a new name is a new range")
  {
    sim_timer timer{sim};
    char buf[16] = "alpha";
    {
      auto r = timer.time(buf, s);
    }
    std::snprintf(buf, sizeof buf, "beta");
    {
      auto r = timer.time(buf, s);
    }
    std::string const again = "alpha";
    {
      auto r = timer.time(again.c_str(), s);
    }
    timer.flush();
    CHECK(gpukit::test::stats_of(timer, "alpha").count == 2);
    CHECK(gpukit::test::stats_of(timer, "beta").count == 1);
  }
}

TEST_SUITE("sim_concurrency")
{
  TEST_CASE("range_timer from many threads on their own streams")
  {
    sim_runtime rt{gpukit::test::one_device(gpukit::test::gib)};
    sim_timer timer{rt};
    std::vector<std::thread> threads;
    for (int t = 0; t < 6; ++t) {
      threads.emplace_back([&] {
        gpukit::test::stream_holder<sim_runtime> s{rt};
        for (int i = 0; i < 50; ++i) {
          auto outer = timer.time("outer", s);
          auto inner = timer.time("inner", s);
          if (i % 10 == 0) (void)timer.poll();
        }
        OK(rt.stream_synchronize(s));
      });
    }
    for (auto& t : threads) t.join();
    timer.flush();
    CHECK(gpukit::test::stats_of(timer, "outer").count == 300);
    CHECK(gpukit::test::stats_of(timer, "inner").count == 300);
    CHECK(gpukit::test::stats_of(timer, "inner").depth == 1);
    CHECK(timer.dropped() == 0);
  }
}
