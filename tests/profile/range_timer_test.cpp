// gpukit::range_timer on the simulated GPU: GPU time per range from the runtime's timing events,
// aggregated by name, harvested without blocking, and the NVTX range it emits alongside.
#include "nvtx_test_support.hpp"

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
using sim_timer = gpukit::range_timer<sim_runtime>;
using stream_t  = sim_runtime::stream_type;

#define OK(call) REQUIRE_EQ((call), cudaSuccess)

gpukit::sim_config one_device()
{
  return gpukit::sim_config{}.with_devices(1, std::size_t{1} << 30);
}

// Queues `ms` milliseconds of "GPU work" (a host function that sleeps) on `s`.
void work(sim_runtime& rt, stream_t s, int ms)
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
  TEST_CASE("range_timer measures the GPU work inside each range and aggregates by name")
  {
    sim_runtime rt{one_device()};
    stream_t s{};
    OK(rt.stream_create(s));
    {
      sim_timer timer{rt};
      for (int step = 0; step < 3; ++step) {
        auto t = timer.time("step", s);
        {
          auto f = timer.time("forward", s);
          work(rt, s, 20);
        }
        auto b = timer.time("backward", s);
        work(rt, s, 5);
      }
      timer.flush();
      CHECK(timer.pending() == 0);
      auto const step     = timer.stats("step");
      auto const forward  = timer.stats("forward");
      auto const backward = timer.stats("backward");
      REQUIRE(step);
      REQUIRE(forward);
      REQUIRE(backward);
      CHECK(step->count == 3);
      CHECK(forward->count == 3);
      CHECK(forward->min_ms >= 19.0);
      CHECK(backward->min_ms >= 4.0);
      CHECK(step->min_ms >= forward->min_ms + backward->min_ms - 0.5);
      CHECK(forward->total_ms == doctest::Approx(forward->mean_ms * 3));
      CHECK(forward->max_ms >= forward->p90_ms);
      CHECK(forward->p90_ms >= forward->p50_ms);
      CHECK(forward->p50_ms >= forward->min_ms);
      CHECK(step->depth == 0);
      CHECK(forward->depth == 1);
      CHECK(step->share == doctest::Approx(1.0));
      CHECK(forward->share > 0.5);
      CHECK(forward->share < 1.0);
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
    OK(rt.stream_destroy(s));
  }

  TEST_CASE("range_timer never blocks: a stalled stream's ranges stay pending until flush")
  {
    sim_runtime rt{one_device()};
    stream_t s{};
    OK(rt.stream_create(s));
    sim_timer timer{rt};
    OK(rt.stall(s));
    {
      auto r = timer.time("stalled", s);
    }
    rt.reset_counters();
    CHECK(timer.poll() == 0);
    CHECK(timer.pending() == 1);
    CHECK_FALSE(timer.stats("stalled"));
    CHECK(rt.synchronizations() == 0);
    OK(rt.release(s));
    timer.flush();
    CHECK(timer.pending() == 0);
    REQUIRE(timer.stats("stalled"));
    CHECK(timer.stats("stalled")->count == 1);
    OK(rt.stream_destroy(s));
  }

  TEST_CASE("range_timer reuses its events")
  {
    sim_runtime rt{one_device()};
    stream_t s{};
    OK(rt.stream_create(s));
    sim_timer timer{rt};
    for (int i = 0; i < 100; ++i) {
      auto r = timer.time("loop", s);
      OK(rt.stream_synchronize(s));
    }
    timer.flush();
    CHECK(timer.stats("loop")->count == 100);
    CHECK(rt.calls(gpukit::sim_op::event_create) <= 4);
    OK(rt.stream_destroy(s));
  }

  TEST_CASE("range_timer drops ranges beyond max_pending instead of waiting")
  {
    sim_runtime rt{one_device()};
    stream_t s{};
    OK(rt.stream_create(s));
    gpukit::range_timer_options o;
    o.max_pending = 4;
    sim_timer timer{rt, o};
    OK(rt.stall(s));
    for (int i = 0; i < 10; ++i) { auto r = timer.time("x", s); }
    CHECK(timer.pending() == 4);
    CHECK(timer.dropped() == 6);
    OK(rt.release(s));
    timer.flush();
    CHECK(timer.stats("x")->count == 4);
    timer.reset();
    CHECK(timer.stats().empty());
    OK(rt.stream_destroy(s));
  }

  TEST_CASE("range_timer reports a failed event and leaves no range open")
  {
    sim_runtime rt{one_device()};
    stream_t s{};
    OK(rt.stream_create(s));
    sim_timer timer{rt};
    rt.inject_fault(gpukit::sim_op::event_record, 1, cudaErrorLaunchFailure);
    CHECK_THROWS_AS((void)timer.time("fails", s), gpukit::cuda_error);
    CHECK(timer.dropped() == 1);
    {
      auto r = timer.time("works", s);
    }
    timer.flush();
    CHECK(timer.stats("works")->count == 1);
    CHECK(timer.stats("works")->depth == 0);
    OK(rt.stream_destroy(s));
  }

  TEST_CASE("range_timer names the step range for shares")
  {
    sim_runtime rt{one_device()};
    stream_t s{};
    OK(rt.stream_create(s));
    gpukit::range_timer_options o;
    o.step_range = "a";
    sim_timer timer{rt, o};
    {
      auto a = timer.time("a", s);
      work(rt, s, 10);
    }
    {
      auto b = timer.time("b", s);
      work(rt, s, 10);
    }
    timer.flush();
    CHECK(timer.stats("a")->share == doctest::Approx(1.0));
    // b did as much simulated work as a: its share of the step is about 1, but the simulated
    // GPU's wall-clock timing under sanitizers varies widely (0.43 was seen under ASan).
    CHECK(timer.stats("b")->share > 0.1);
    CHECK(timer.stats("b")->share < 10.0);
    OK(rt.stream_destroy(s));
  }

  TEST_CASE("range_timer pushes an NVTX range of the same name")
  {
    REQUIRE(tool_attached);
    sim_runtime rt{one_device()};
    stream_t s{};
    OK(rt.stream_create(s));
    sim_timer timer{rt};
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
    OK(rt.stream_destroy(s));
  }

  TEST_CASE("names are interned by content: a reused buffer with a new name is a new range")
  {
    sim_runtime rt{one_device()};
    stream_t s{};
    OK(rt.stream_create(s));
    sim_timer timer{rt};
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
    CHECK(timer.stats("alpha")->count == 2);
    CHECK(timer.stats("beta")->count == 1);
    OK(rt.stream_destroy(s));
  }
}

TEST_SUITE("sim_concurrency")
{
  TEST_CASE("range_timer from many threads on their own streams")
  {
    sim_runtime rt{one_device()};
    sim_timer timer{rt};
    std::vector<std::thread> threads;
    for (int t = 0; t < 6; ++t) {
      threads.emplace_back([&] {
        stream_t s{};
        OK(rt.stream_create(s));
        for (int i = 0; i < 50; ++i) {
          auto outer = timer.time("outer", s);
          auto inner = timer.time("inner", s);
          if (i % 10 == 0) (void)timer.poll();
        }
        OK(rt.stream_synchronize(s));
        OK(rt.stream_destroy(s));
      });
    }
    for (auto& t : threads) t.join();
    timer.flush();
    CHECK(timer.stats("outer")->count == 300);
    CHECK(timer.stats("inner")->count == 300);
    CHECK(timer.stats("inner")->depth == 1);
    CHECK(timer.dropped() == 0);
  }
}
