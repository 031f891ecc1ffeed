// SPDX-License-Identifier: Apache-2.0
// detail::caching::oom_ladder alone, over a fake pool (an operations object that logs each call and
// finds a block where told) and the simulated GPU (for the stream waits and the device's memory):
// the steps' order, the stop at the first step that finds a block, the callbacks (run without the
// lock, asking for another try or not, throwing), the waits for stream-ordered frees, the wait
// step, and the out_of_memory report with its hints. No allocator.
#include "support/holders.hpp"
#include "support/sim_gpu.hpp"
#include "support/sizes.hpp"

#include <gpukit/detail/thread_annotations.hpp>
#include <gpukit/error.hpp>
#include <gpukit/memory/caching_allocator_stats.hpp>
#include <gpukit/memory/detail/caching/oom_ladder.hpp>
#include <gpukit/runtime/sim_runtime.hpp>

#include <doctest/doctest.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace {

using gpukit::sim_runtime;
using gpukit::test::mib;
using gpukit::test::stream_holder;
using stream  = sim_runtime::stream_type;
using strings = std::vector<std::string>;

struct fake_block {
  int id{7};
};
struct fake_context {
  std::size_t requested{0};
  std::size_t reserved{0};
};
using callback = std::function<bool(fake_context const&)>;
using ladder   = gpukit::detail::caching::oom_ladder<sim_runtime, fake_block, callback>;

struct fake_index {
  std::size_t total{0};
  std::size_t big{0};
  [[nodiscard]] std::size_t bytes() const noexcept { return total; }
  [[nodiscard]] std::size_t largest() const noexcept { return big; }
};
struct fake_pool {
  stream s{};
  fake_index small;
  fake_index large;
};

// The pool, as the ladder sees it: every operation is logged; `hit` (a log entry) finds a block the
// `hit_at`-th time it is called.
struct fake_ops {
  strings log;
  std::string hit;
  int hit_at{0};
  fake_block block;
  std::size_t polled{0};
  std::size_t migrated{0};
  std::size_t released{0};
  std::vector<stream> issues;     // streams release_segments issues frees on
  std::vector<stream> capturing;  // streams being captured
  std::vector<fake_pool> pools;
  fake_index global_small;
  fake_index global_large;
  std::size_t reserved_bytes{0};
  std::size_t limit_bytes{0};
  std::size_t allocated_bytes{0};

  fake_block* answer(std::string const& what)
  {
    log.push_back(what);
    bool const found = what == hit && std::count(log.begin(), log.end(), what) == hit_at;
    return found ? &block : nullptr;
  }
  fake_block* find_free(std::size_t, int kind, stream)
  {
    return answer("find_free " + std::to_string(kind));
  }
  fake_block* new_segment(std::size_t, int, stream) { return answer("new_segment"); }
  std::size_t poll_pending(bool wait)
  {
    log.push_back(wait ? "poll_pending wait" : "poll_pending");
    return polled;
  }
  std::size_t migrate(stream, bool wait)
  {
    log.push_back(wait ? "migrate wait" : "migrate");
    return migrated;
  }
  void drain_cache() { log.push_back("drain_cache"); }
  void flush_other_caches() { log.push_back("flush_other_caches"); }
  std::size_t release_segments(std::vector<stream>& freed_on, stream const* only)
  {
    log.push_back(only != nullptr ? "release_segments stream" : "release_segments all");
    freed_on.insert(freed_on.end(), issues.begin(), issues.end());
    return released;
  }
  bool is_capturing(stream s)
  {
    log.push_back("is_capturing");
    return std::find(capturing.begin(), capturing.end(), s) != capturing.end();
  }
  void retire_dead_stream(stream) { log.push_back("retire_dead_stream"); }
  [[nodiscard]] std::size_t reserved() const { return reserved_bytes; }
  [[nodiscard]] std::size_t limit() const { return limit_bytes; }
  [[nodiscard]] std::size_t allocated() const { return allocated_bytes; }
  [[nodiscard]] fake_context callback_context(std::size_t size) const
  {
    return {size, reserved_bytes};
  }
  template <class F>
  void for_each_free_pool(F&& f) const
  {
    for (auto const& p : pools) { f(&p.s, p.small, p.large); }
    f(static_cast<stream const*>(nullptr), global_small, global_large);
  }
  void count_step(int step, std::size_t reclaimed)
  {
    log.push_back("count_step " + std::to_string(step) + " " + std::to_string(reclaimed));
  }
  void count_release_wait() { log.push_back("count_release_wait"); }
  void count_oom(std::size_t size) { log.push_back("count_oom " + std::to_string(size)); }
};

// Whether another thread finds `m` held.
bool held_elsewhere(gpukit::detail::annotated_mutex& m)
{
  bool got = false;
  std::thread t{[&] {
    got = m.native().try_lock();
    if (got) { m.native().unlock(); }
  }};
  t.join();
  return !got;
}

std::vector<bool> attempted(ladder const& l)
{
  std::vector<bool> a;
  for (auto const& s : l.steps()) { a.push_back(s.attempted); }
  return a;
}

// One recovery of `size` bytes of pool kind 0 on `s`, holding the pool lock.
fake_block* recover(ladder& l, fake_ops& ops, stream s, std::vector<stream>& freed_on,
                    bool capture = false, int wait_ms = 0, std::size_t size = mib)
{
  gpukit::detail::annotated_mutex m;
  gpukit::detail::pool_lock lock{m};
  ladder::request r{size, 0, s, freed_on, capture, wait_ms};
  return l.recover(r, ops, m);
}

// The out_of_memory that throw_oom throws.
gpukit::out_of_memory oom_of(ladder& l, fake_ops& ops, std::size_t bytes, std::size_t size)
{
  try {
    l.throw_oom(bytes, size, ops);
  } catch (gpukit::out_of_memory const& e) {
    return e;
  }
  FAIL("throw_oom did not throw");
  return gpukit::out_of_memory{gpukit::oom_report{}};
}

}  // namespace

TEST_SUITE("oom_ladder")
{
  TEST_CASE("with nothing to find, each step runs once in the order of recovery_step_names")
  {
    sim_runtime sim{gpukit::test::one_device(64 * mib)};
    stream_holder<sim_runtime> s{sim};
    ladder l{sim, 0};
    fake_ops ops;
    std::vector<stream> freed_on;
    CHECK(recover(l, ops, s, freed_on) == nullptr);
    strings const fresh{"find_free 0", "new_segment"};  // a fresh try first
    strings const events{"poll_pending", "migrate",     "count_step 0 0",
                         "drain_cache",  "find_free 0", "new_segment"};
    // (2) no callbacks: skipped
    strings const release_stream{"release_segments stream", "count_step 2 0", "find_free 0",
                                 "new_segment"};
    strings const release_all{"flush_other_caches",   "migrate wait",   "poll_pending wait",
                              "release_segments all", "count_step 3 0", "find_free 0",
                              "new_segment"};
    strings const other_pool{"find_free 1", "count_step 4 0"};
    // (6) no wait: skipped
    strings expected;
    for (strings const* part : {&fresh, &events, &release_stream, &release_all, &other_pool}) {
      expected.insert(expected.end(), part->begin(), part->end());
    }
    CHECK(ops.log == expected);
    REQUIRE(l.steps().size() == static_cast<std::size_t>(gpukit::recovery_step_count));
    for (std::size_t i = 0; i < l.steps().size(); ++i) {
      CHECK(l.steps()[i].name == gpukit::recovery_step_names[i]);
      CHECK(l.steps()[i].bytes_reclaimed == 0);
    }
    CHECK(attempted(l) == std::vector<bool>{true, false, true, true, true, false});
    CHECK(sim.calls(gpukit::sim_op::stream_synchronize) == 0);  // nothing was on its way
  }

  TEST_CASE("the ladder stops at the first step that finds a block")
  {
    sim_runtime sim{gpukit::test::one_device(64 * mib)};
    stream_holder<sim_runtime> s{sim};
    ladder l{sim, 0};
    std::vector<stream> freed_on;
    SUBCASE("the fresh try before any step")
    {
      fake_ops ops;
      ops.hit    = "new_segment";
      ops.hit_at = 1;
      CHECK(recover(l, ops, s, freed_on) == &ops.block);
      CHECK(ops.log == strings{"find_free 0", "new_segment"});
      CHECK(attempted(l) == std::vector<bool>(6, false));
    }
    SUBCASE("the requesting stream's segments, with what they reclaimed")
    {
      fake_ops ops;
      ops.released = 3 * mib;
      ops.hit      = "find_free 0";
      ops.hit_at   = 3;
      CHECK(recover(l, ops, s, freed_on) == &ops.block);
      CHECK(ops.log.back() == "find_free 0");
      CHECK(std::count(ops.log.begin(), ops.log.end(), "release_segments all") == 0);
      CHECK(attempted(l) == std::vector<bool>{true, false, true, false, false, false});
      CHECK(l.steps()[2].bytes_reclaimed == 3 * mib);
    }
    SUBCASE("blocks of other streams made usable: counted, no segment released")
    {
      fake_ops ops;
      ops.migrated = 2 * mib;  // each migrate: 2 MiB
      ops.polled   = mib;
      ops.hit      = "find_free 0";
      ops.hit_at   = 4;
      CHECK(recover(l, ops, s, freed_on) == &ops.block);
      strings const tail(ops.log.end() - 5, ops.log.end());
      CHECK(tail == strings{"flush_other_caches", "migrate wait", "poll_pending wait",
                            "find_free 0", "count_step 3 3145728"});
      CHECK(l.steps()[0].bytes_reclaimed == 3 * mib);
      CHECK(l.steps()[3].bytes_reclaimed == 3 * mib);
      CHECK(attempted(l) == std::vector<bool>{true, false, true, true, false, false});
    }
    SUBCASE("a block of the other pool kind: the request counts as reclaimed; no wait follows")
    {
      fake_ops ops;
      ops.hit    = "find_free 1";
      ops.hit_at = 1;
      CHECK(recover(l, ops, s, freed_on, false, 10000) == &ops.block);
      CHECK(ops.log.back() == "count_step 4 1048576");
      CHECK(l.steps()[4].bytes_reclaimed == mib);
      CHECK(attempted(l) == std::vector<bool>{true, false, true, true, true, false});
    }
  }

  TEST_CASE("callbacks run in order without the pool lock; those that return true get a try")
  {
    sim_runtime sim{gpukit::test::one_device(64 * mib)};
    stream_holder<sim_runtime> s{sim};
    ladder l{sim, 0};
    gpukit::detail::annotated_mutex m;
    fake_ops ops;
    ops.reserved_bytes = 40 * mib;
    std::vector<bool> unlocked;
    l.add_callback([&](fake_context const& ctx) {
      ops.log.push_back("callback 1");
      unlocked.push_back(!held_elsewhere(m));
      CHECK(ctx.requested == 5 * mib);
      CHECK(ctx.reserved == 40 * mib);
      ops.global_large.total += mib;  // freed a block: found in the pool
      return false;                   // but asks for no try
    });
    l.add_callback([&](fake_context const&) {
      ops.log.push_back("callback 2");
      unlocked.push_back(!held_elsewhere(m));
      ops.reserved_bytes -= 8 * mib;  // gave a segment back to the device
      return true;
    });
    CHECK(l.callback_count() == 2);
    ops.hit    = "find_free 0";
    ops.hit_at = 3;  // the fresh try, events', then the try callback 2 asked for
    std::vector<stream> freed_on;
    fake_block* b = nullptr;
    {
      gpukit::detail::pool_lock lock{m};
      ladder::request r{5 * mib, 0, s, freed_on, false, 0};
      b = l.recover(r, ops, m);
      CHECK(held_elsewhere(m));  // held again
    }
    CHECK(b == &ops.block);
    CHECK(unlocked == std::vector<bool>{true, true});
    strings const tail(ops.log.end() - 7, ops.log.end());
    CHECK(tail == strings{"callback 1", "drain_cache", "count_step 1 1048576", "callback 2",
                          "drain_cache", "count_step 1 8388608", "find_free 0"});
    CHECK(l.steps()[1].attempted);
    CHECK(l.steps()[1].bytes_reclaimed == 9 * mib);
    CHECK(attempted(l) == std::vector<bool>{true, true, false, false, false, false});
  }

  TEST_CASE("callbacks that all return false get no try; the ladder goes on")
  {
    sim_runtime sim{gpukit::test::one_device(64 * mib)};
    stream_holder<sim_runtime> s{sim};
    ladder l{sim, 0};
    fake_ops ops;
    int calls = 0;
    for (int i = 0; i < 2; ++i) {
      l.add_callback([&](fake_context const&) {
        ++calls;
        return false;
      });
    }
    std::vector<stream> freed_on;
    CHECK(recover(l, ops, s, freed_on) == nullptr);
    CHECK(calls == 2);
    auto const first = std::find(ops.log.begin(), ops.log.end(), "count_step 1 0");
    REQUIRE(first != ops.log.end());
    CHECK(strings(first, first + 4) ==
          strings{"count_step 1 0", "drain_cache", "count_step 1 0", "release_segments stream"});
    CHECK(attempted(l) == std::vector<bool>{true, true, true, true, true, false});
  }

  TEST_CASE("a callback that throws: the exception goes through with the lock held again")
  {
    sim_runtime sim{gpukit::test::one_device(64 * mib)};
    stream_holder<sim_runtime> s{sim};
    ladder l{sim, 0};
    gpukit::detail::annotated_mutex m;
    fake_ops ops;
    bool second_ran = false;
    l.add_callback([](fake_context const&) -> bool { throw std::runtime_error{"spill failed"}; });
    l.add_callback([&](fake_context const&) {
      second_ran = true;
      return true;
    });
    std::vector<stream> freed_on;
    {
      gpukit::detail::pool_lock lock{m};
      ladder::request r{mib, 0, s, freed_on, false, 0};
      CHECK_THROWS_WITH_AS(l.recover(r, ops, m), "spill failed", std::runtime_error);
      CHECK(held_elsewhere(m));
    }
    CHECK_FALSE(held_elsewhere(m));
    CHECK_FALSE(second_ran);
    CHECK_FALSE(l.steps()[1].attempted);     // not counted: it never returned
    CHECK(ops.log.back() == "new_segment");  // events' try, the last thing before it
  }

  TEST_CASE("frees still on their way are waited for, stream by stream, before giving up")
  {
    sim_runtime sim{gpukit::test::one_device(64 * mib)};
    stream_holder<sim_runtime> s{sim}, a{sim}, b{sim}, c{sim};
    ladder l{sim, 0};
    fake_ops ops;
    ops.capturing = {c};
    l.unsettled().push_back(a);  // issued by release()
    std::vector<stream> freed_on{b, c};
    sim.reset_counters();
    CHECK(recover(l, ops, s, freed_on) == nullptr);
    // a, c, b waited for from the back: c is being captured and stays for a later recovery.
    CHECK(strings(ops.log.begin(), ops.log.begin() + 7) ==
          strings{"is_capturing", "count_release_wait", "is_capturing", "is_capturing",
                  "count_release_wait", "find_free 0", "new_segment"});
    CHECK(sim.calls(gpukit::sim_op::stream_synchronize) == 2);
    CHECK(freed_on.empty());
    CHECK(l.unsettled() == std::vector<stream>{c});
    // Something is still on its way (c): one more wait and a last try after every step.
    CHECK(strings(ops.log.end() - 5, ops.log.end()) ==
          strings{"find_free 1", "count_step 4 0", "is_capturing", "find_free 0", "new_segment"});
  }

  TEST_CASE("frees the release steps issue are waited for before their try")
  {
    sim_runtime sim{gpukit::test::one_device(64 * mib)};
    stream_holder<sim_runtime> s{sim}, a{sim};
    ladder l{sim, 0};
    fake_ops ops;
    ops.issues   = {a};
    ops.released = 2 * mib;
    std::vector<stream> freed_on;
    sim.reset_counters();
    CHECK(recover(l, ops, s, freed_on) == nullptr);
    auto const step3 = std::find(ops.log.begin(), ops.log.end(), "release_segments stream");
    REQUIRE(step3 != ops.log.end());
    CHECK(strings(step3, step3 + 5) == strings{"release_segments stream", "count_step 2 2097152",
                                               "is_capturing", "count_release_wait",
                                               "find_free 0"});
    CHECK(sim.calls(gpukit::sim_op::stream_synchronize) == 2);  // steps 3 and 4
    CHECK(l.unsettled().empty());
  }

  TEST_CASE("a stream found destroyed while waiting is retired, and the wait counted")
  {
    sim_runtime sim{gpukit::test::one_device(64 * mib)};
    stream_holder<sim_runtime> s{sim}, a{sim};
    ladder l{sim, 0};
    fake_ops ops;
    std::vector<stream> freed_on{a};
    sim.inject_fault(gpukit::sim_op::stream_synchronize, 1, cudaErrorInvalidResourceHandle);
    CHECK(recover(l, ops, s, freed_on) == nullptr);
    CHECK(strings(ops.log.begin(), ops.log.begin() + 3) ==
          strings{"is_capturing", "retire_dead_stream", "count_release_wait"});
    SUBCASE("another error is thrown")
    {
      sim.inject_fault(gpukit::sim_op::stream_synchronize, 1, cudaErrorUnknown);
      std::vector<stream> again{a};
      CHECK_THROWS_AS(recover(l, ops, s, again), gpukit::cuda_error);
    }
  }

  TEST_CASE("during a capture: no event step, no stream wait, no last try")
  {
    sim_runtime sim{gpukit::test::one_device(64 * mib)};
    stream_holder<sim_runtime> s{sim}, a{sim};
    ladder l{sim, 0};
    fake_ops ops;
    l.unsettled().push_back(a);
    std::vector<stream> freed_on{a};
    sim.reset_counters();
    CHECK(recover(l, ops, s, freed_on, true) == nullptr);
    CHECK(ops.log == strings{"find_free 0", "new_segment", "release_segments stream",
                             "count_step 2 0", "find_free 0", "new_segment", "flush_other_caches",
                             "release_segments all", "count_step 3 0", "find_free 0", "new_segment",
                             "find_free 1", "count_step 4 0"});
    CHECK(sim.calls(gpukit::sim_op::stream_synchronize) == 0);
    CHECK(freed_on.size() == 1);
    CHECK(l.unsettled().size() == 1);
    CHECK(attempted(l) == std::vector<bool>{false, false, true, true, true, false});
  }

  TEST_CASE("the wait step waits without the lock until blocks come back, and counts them")
  {
    sim_runtime sim{gpukit::test::one_device(64 * mib)};
    stream_holder<sim_runtime> s{sim};
    ladder l{sim, 0};
    gpukit::detail::annotated_mutex m;
    fake_ops ops;
    std::thread freer{[&] {  // another thread returns a block to the pool
      for (;;) {
        gpukit::detail::pool_lock lock{m};
        if (l.waiters() == 1) {
          ops.global_small.total += 2 * mib;
          l.wake_waiters();
          return;
        }
        gpukit::detail::pool_lock::unlocked_scope unlocked{m};
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
    }};
    std::vector<stream> freed_on;
    auto const start = std::chrono::steady_clock::now();
    {
      gpukit::detail::pool_lock lock{m};
      ladder::request r{mib, 0, s, freed_on, false, 60000};
      CHECK(l.recover(r, ops, m) == nullptr);
    }
    freer.join();
    CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(30));  // woken
    CHECK(l.waiters() == 0);
    CHECK(l.steps()[5].attempted);
    CHECK(l.steps()[5].bytes_reclaimed == 2 * mib);
    CHECK(strings(ops.log.end() - 5, ops.log.end()) == strings{"count_step 5 2097152", "migrate",
                                                               "release_segments all",
                                                               "find_free 0", "new_segment"});
  }

  TEST_CASE("the report: the device, the pool, the last recovery, and a hint")
  {
    sim_runtime sim{gpukit::test::one_device(64 * mib)};
    stream_holder<sim_runtime> s{sim}, a{sim}, b{sim};
    ladder l{sim, 0};
    fake_ops ops;
    std::vector<stream> freed_on;
    CHECK(recover(l, ops, s, freed_on) == nullptr);
    ops.log.clear();
    ops.pools             = {fake_pool{a, {3 * mib, 2 * mib}, {}}, fake_pool{b, {}, {}}};
    ops.global_small      = {mib, mib};
    ops.global_large      = {8 * mib, 6 * mib};
    ops.reserved_bytes    = 40 * mib;
    ops.allocated_bytes   = 28 * mib;
    auto const fragmented = oom_of(l, ops, 10 * mib - 100, 10 * mib);
    auto const& r         = fragmented.report();
    CHECK(ops.log == strings{"count_oom 10485760"});
    CHECK(r.requested == 10 * mib - 100);
    CHECK(r.device == 0);
    CHECK(r.device_total == 64 * mib);
    CHECK(r.device_free == 64 * mib);
    CHECK(r.allocated == 28 * mib);
    CHECK(r.reserved == 40 * mib);
    CHECK(r.limit == 0);
    CHECK(r.total_free_in_pool == 12 * mib);
    CHECK(r.largest_free_block == 6 * mib);
    REQUIRE(r.cached_per_stream.size() == 1);  // b caches nothing
    std::uintptr_t id = 0;
    stream const sa   = a;
    std::memcpy(&id, &sa, std::min(sizeof id, sizeof sa));
    CHECK(r.cached_per_stream[0].stream == id);
    CHECK(r.cached_per_stream[0].bytes == 3 * mib);
    REQUIRE(r.steps.size() == l.steps().size());
    for (std::size_t i = 0; i < r.steps.size(); ++i) {
      CHECK(r.steps[i].name == l.steps()[i].name);
      CHECK(r.steps[i].attempted == l.steps()[i].attempted);
    }
    CHECK(r.hint ==
          "enough memory is free in the pool but no free block is large enough (fragmentation); "
          "growable segments (virtual memory) or fewer distinct block sizes would make it fit");
    CHECK(std::string{fragmented.what()} == r.to_string());

    CHECK(oom_of(l, ops, 4 * mib, 4 * mib).report().hint ==
          "a free block of 6291456 bytes is held for a CUDA graph capture's pool or another "
          "stream's pending work; release_capture_pool() or synchronizing that stream returns it");
    CHECK(oom_of(l, ops, 20 * mib, 20 * mib).report().hint ==
          "reduce the batch size or the memory held by live tensors; 29360128 bytes are "
          "allocated by users");
    ops.limit_bytes    = 45 * mib;
    auto const limited = oom_of(l, ops, 10 * mib, 10 * mib);
    CHECK(limited.report().limit == 45 * mib);
    CHECK(limited.report().hint ==
          "the allocator's limit (47185920 bytes) stops this allocation; raise it with "
          "set_limit() or free tensors you no longer need");
    CHECK(ops.log.size() == 4);  // one count_oom per report
  }
}
