// SPDX-License-Identifier: Apache-2.0
// Recording, snapshots and their exports (JSON, replay trace, PyTorch pickle, HTML).
#include <gpukit/memory/caching_allocator.hpp>
#include <gpukit/memory/memory_history.hpp>
#include <gpukit/runtime/sim_runtime.hpp>

#include <doctest/doctest.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>

using gpukit::memory_event;
using gpukit::sim_runtime;
using sim_allocator = gpukit::basic_caching_allocator<sim_runtime>;

namespace {
constexpr std::size_t MiB = std::size_t{1} << 20;

struct fixture {
  sim_runtime sim{gpukit::sim_config{}.with_devices(1, std::size_t{8} << 30)};
  sim_allocator alloc{sim, 0};
  sim_runtime::stream_type a{}, b{};
  fixture()
  {
    GPUKIT_CUDA_TRY(sim.stream_create(a));
    GPUKIT_CUDA_TRY(sim.stream_create(b));
  }
  ~fixture()
  {
    alloc.forget_stream(a);
    alloc.forget_stream(b);
    (void)sim.stream_destroy(a);
    (void)sim.stream_destroy(b);
  }
  // alloc A (1000 B, a), B (3 MiB, b); free A; alloc C (1000 B, a: reuses A); free B, C.
  void run()
  {
    void* pa = alloc.allocate_async(1000, a);
    void* pb = alloc.allocate_async(3 * MiB, b);
    alloc.deallocate_async(pa, 1000, a);
    void* pc = alloc.allocate_async(1000, a);
    CHECK(pc == pa);
    alloc.deallocate_async(pb, 3 * MiB, b);
    alloc.deallocate_async(pc, 1000, a);
  }
};
}  // namespace

TEST_SUITE("memory_history")
{
  TEST_CASE("nothing is recorded unless recording is on")
  {
    fixture f;
    f.run();
    CHECK(f.alloc.snapshot().events.empty());
    CHECK_THROWS_AS(f.alloc.start_recording(0), gpukit::logic_error);
  }

  TEST_CASE("events in order and the segment map")
  {
    fixture f;
    f.alloc.start_recording();
    f.run();
    f.alloc.stop_recording();
    auto const s = f.alloc.snapshot();
    using A      = memory_event::action;
    std::vector<A> actions;
    for (auto const& e : s.events) { actions.push_back(e.what); }
    CHECK(actions == std::vector<A>{A::segment_alloc, A::alloc, A::segment_alloc, A::alloc, A::free,
                                    A::alloc, A::free, A::free});
    CHECK(s.events[1].bytes == 1024);
    CHECK(s.events[3].bytes == 3 * MiB);
    CHECK(s.events[4].address == s.events[5].address);  // C reused A
    CHECK(s.dropped_events == 0);
    REQUIRE(s.segments.size() == 2);
    for (auto const& g : s.segments) {
      std::size_t total = 0;
      for (auto const& b : g.blocks) {
        total += b.size;
        CHECK_FALSE(b.allocated);
      }
      CHECK(total == g.size);
    }
    CHECK(s.segments[0].size + s.segments[1].size == 22 * MiB);  // a small and a medium segment
    // A small ring keeps the newest events and counts the rest.
    f.alloc.start_recording(2);
    f.run();
    auto const small = f.alloc.snapshot();
    // The segments exist already: six block events, of which the ring keeps the last two.
    REQUIRE(small.events.size() == 2);
    CHECK(small.dropped_events == 4);
    CHECK(small.events[0].what == memory_event::action::free);
    CHECK(small.events[1].what == memory_event::action::free);
  }

  TEST_CASE("exports: replay trace, JSON, HTML and a PyTorch pickle")
  {
    fixture f;
    f.alloc.start_recording();
    f.run();
    auto const s = f.alloc.snapshot();
    CHECK(gpukit::to_trace(s) ==
          "# gpukit allocation trace: a <id> <bytes> <stream> | f <id>\n"
          "a 0 1024 0\na 1 3145728 1\nf 0\na 2 1024 0\nf 1\nf 2\n");
    std::string const json = gpukit::to_json(s);
    CHECK(json.find("\"action\": \"segment_alloc\"") != std::string::npos);
    CHECK(json.find("\"pool\": \"small\"") != std::string::npos);
    std::string const html = gpukit::to_html(s);
    CHECK(html.find("<canvas") != std::string::npos);
    CHECK(html.rfind("<!doctype html>\n", 0) == 0);
    // The snapshot sits whole where the page's script reads it, and the page closes after it.
    CHECK(html.find("const snapshot = " + json + ";\nconst ev = snapshot.events;") !=
          std::string::npos);
    std::string const end = "</script></body></html>\n";
    CHECK(html.size() > end.size());
    CHECK(html.compare(html.size() - end.size(), end.size(), end) == 0);
    CHECK(html.find("http") == std::string::npos);  // self-contained: nothing fetched
    std::string const pickle = gpukit::to_pytorch_pickle(s);
    CHECK(pickle.substr(0, 2) == std::string{"\x80\x02"});
    CHECK(pickle.back() == '.');
    // Python's own unpickler reads it (when Python is here), with PyTorch's keys.
    if (std::system("python3 -c 'import pickle' > /dev/null 2>&1") == 0) {
      std::string const path = "gpukit_memory_history_test.pickle";
      std::ofstream{path, std::ios::binary} << pickle;
      std::string const cmd =
        "python3 -c \"import pickle,sys; d=pickle.load(open('" + path +
        "','rb')); t=d['device_traces'][0]; s=d['segments']; "
        "assert len(t)==8 and t[1]['action']=='alloc' and t[1]['size']==1024, t; "
        "assert len(s)==2 and sum(b['size'] for b in s[0]['blocks'])==s[0]['total_size'], s; "
        "assert s[0]['segment_pool_id']==(0,0) and s[0]['blocks'][0]['state']=='inactive'\"";
      CHECK(std::system(cmd.c_str()) == 0);
      std::remove(path.c_str());
    }
  }

  TEST_CASE("large integers survive the pickle")
  {
    gpukit::memory_snapshot s;
    s.events.push_back(
      {memory_event::action::alloc, 1, std::uintptr_t{0x7f0123456789}, std::size_t{1} << 40, 0});
    std::string const pickle = gpukit::to_pytorch_pickle(s);
    if (std::system("python3 -c 'import pickle' > /dev/null 2>&1") == 0) {
      std::ofstream{"gpukit_big.pickle", std::ios::binary} << pickle;
      CHECK(std::system("python3 -c \"import pickle; "
                        "t=pickle.load(open('gpukit_big.pickle','rb'))['device_traces'][0][0]; "
                        "assert t['addr']==0x7f0123456789 and t['size']==1<<40, t\"") == 0);
      std::remove("gpukit_big.pickle");
    }
  }
}
