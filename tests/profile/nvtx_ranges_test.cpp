// SPDX-License-Identifier: Apache-2.0
// What gpukit's ranges emit, as an NVTX tool sees it: the test tool (nvtx_injection.cpp) is
// attached through NVTX_INJECTION64_PATH before the first NVTX call and records every call.
#include "nvtx_test_support.hpp"

#include <gpukit/profile/nvtx.hpp>

#include <doctest/doctest.h>

#include <cstring>
#include <map>
#include <stdexcept>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

namespace {

bool const tool_attached = gpukit_test::attach_nvtx_tool();

struct my_domain {
  static constexpr char const* name{"my_domain"};
};

std::vector<gpukit_nvtx_record> ranges_only()
{
  std::vector<gpukit_nvtx_record> out;
  for (auto const& r : gpukit_test::nvtx_records()) {
    if (r.kind == gpukit_nvtx_push || r.kind == gpukit_nvtx_pop || r.kind == gpukit_nvtx_mark ||
        r.kind == gpukit_nvtx_start || r.kind == gpukit_nvtx_end) {
      out.push_back(r);
    }
  }
  return out;
}

void phase_function() { GPUKIT_FUNC_RANGE(); }

void throws_inside_ranges()
{
  GPUKIT_RANGE("outer");
  GPUKIT_RANGE("inner");
  throw std::runtime_error{"boom"};
}

}  // namespace

static_assert(
  std::is_same_v<gpukit::scoped_range, nvtx3::v1::scoped_range_in<gpukit::nvtx_domain>>);
static_assert(gpukit::nvtx_compiled_in);
static_assert(gpukit::name_color("forward") == gpukit::name_color("forward"));
static_assert((gpukit::name_color("forward") >> 24) == 0xFF);

TEST_SUITE("profile")
{
  TEST_CASE("the test tool is attached")
  {
    REQUIRE(tool_attached);
    gpukit::mark("attach");
    REQUIRE(gpukit_test::nvtx_tool_handle() != nullptr);
  }

  TEST_CASE("GPUKIT_RANGE pushes a registered name in the gpukit domain with its color")
  {
    gpukit_test::clear_nvtx_records();
    {
      GPUKIT_RANGE("forward");
    }
    auto const recs = ranges_only();
    REQUIRE(recs.size() == 2);
    CHECK(recs[0].kind == gpukit_nvtx_push);
    CHECK(std::string{recs[0].domain} == "gpukit");
    CHECK(std::string{recs[0].message} == "forward");
    CHECK(recs[0].message_type == NVTX_MESSAGE_TYPE_REGISTERED);
    CHECK(recs[0].color_type == NVTX_COLOR_ARGB);
    CHECK(recs[0].color == gpukit::name_color("forward"));
    CHECK(recs[0].depth == 1);
    CHECK(recs[1].kind == gpukit_nvtx_pop);
    CHECK(std::string{recs[1].domain} == "gpukit");
    CHECK(recs[1].depth == 0);
  }

  TEST_CASE("ranges nest and GPUKIT_FUNC_RANGE names the function")
  {
    gpukit_test::clear_nvtx_records();
    {
      GPUKIT_RANGE("step");
      phase_function();
      {
        gpukit::scoped_range r{"plain"};
      }
    }
    auto const recs = ranges_only();
    REQUIRE(recs.size() == 6);
    std::vector<std::string> names;
    std::vector<int> depths;
    for (auto const& r : recs) {
      names.emplace_back(r.kind == gpukit_nvtx_push ? r.message : "pop");
      depths.push_back(r.depth);
    }
    CHECK(names ==
          std::vector<std::string>{"step", "phase_function", "pop", "plain", "pop", "pop"});
    CHECK(depths == std::vector<int>{1, 2, 1, 2, 1, 0});
    CHECK(recs[1].color == gpukit::name_color("phase_function"));
    CHECK(recs[3].message_type == NVTX_MESSAGE_TYPE_ASCII);  // nvtx3's scoped_range: no color
    CHECK(recs[3].color_type == NVTX_COLOR_UNKNOWN);
  }

  TEST_CASE("an exception unwinding through ranges pops every one of them")
  {
    gpukit_test::clear_nvtx_records();
    CHECK_THROWS_AS(throws_inside_ranges(), std::runtime_error);
    auto const recs = ranges_only();
    REQUIRE(recs.size() == 4);
    CHECK(recs[0].kind == gpukit_nvtx_push);
    CHECK(std::string{recs[1].message} == "inner");
    CHECK(recs[2].kind == gpukit_nvtx_pop);
    CHECK(recs[3].kind == gpukit_nvtx_pop);
    CHECK(recs[3].depth == 0);
  }

  TEST_CASE("ranges in a user domain carry that domain")
  {
    gpukit_test::clear_nvtx_records();
    {
      GPUKIT_RANGE_IN(my_domain, "decode");
    }
    {
      gpukit::named_range_in<my_domain> r{"encode"};
    }
    auto const recs = ranges_only();
    REQUIRE(recs.size() == 4);
    CHECK(std::string{recs[0].domain} == "my_domain");
    CHECK(std::string{recs[0].message} == "decode");
    CHECK(std::string{recs[1].domain} == "my_domain");
    CHECK(std::string{recs[2].domain} == "my_domain");
    CHECK(std::string{recs[2].message} == "encode");
    CHECK(recs[2].color == gpukit::name_color("encode"));
  }

  TEST_CASE("payloads and categories reach the tool")
  {
    std::int64_t const bytes = 1 << 20;
    {
      GPUKIT_RANGE("copy", gpukit::payload{bytes},
                   gpukit::category_of<gpukit::categories::transfer>());
      gpukit::named_range r{"scaled", gpukit::payload{0.5}};
    }
    auto const recs                  = gpukit_test::nvtx_records();
    gpukit_nvtx_record const* copy   = nullptr;
    gpukit_nvtx_record const* scaled = nullptr;
    bool category_named              = false;
    for (auto const& r : recs) {
      if (r.kind == gpukit_nvtx_push && std::string{r.message} == "copy") copy = &r;
      if (r.kind == gpukit_nvtx_push && std::string{r.message} == "scaled") scaled = &r;
      if (r.kind == gpukit_nvtx_name_category && r.category == 2 &&
          std::string{r.message} == "transfer" && std::string{r.domain} == "gpukit") {
        category_named = true;
      }
    }
    REQUIRE(copy != nullptr);
    CHECK(copy->payload_type == NVTX_PAYLOAD_TYPE_INT64);
    CHECK(copy->payload_i == bytes);
    CHECK(copy->category == 2);
    CHECK(copy->color == gpukit::name_color("copy"));
    CHECK(category_named);
    REQUIRE(scaled != nullptr);
    CHECK(scaled->payload_type == NVTX_PAYLOAD_TYPE_DOUBLE);
    CHECK(scaled->payload_d == 0.5);
  }

  TEST_CASE("a color given to named_range overrides the derived one")
  {
    gpukit_test::clear_nvtx_records();
    {
      gpukit::named_range r{"layer", gpukit::rgb{1, 2, 3}};
    }
    auto const recs = ranges_only();
    REQUIRE(recs.size() == 2);
    CHECK(recs[0].color == 0xFF010203u);
  }

  TEST_CASE("marks carry a name color and payload")
  {
    gpukit_test::clear_nvtx_records();
    gpukit::mark("saved", gpukit::payload{std::uint64_t{7}});
    gpukit::mark_in<my_domain>("loaded");
    auto const recs = ranges_only();
    REQUIRE(recs.size() == 2);
    CHECK(recs[0].kind == gpukit_nvtx_mark);
    CHECK(std::string{recs[0].message} == "saved");
    CHECK(recs[0].color == gpukit::name_color("saved"));
    CHECK(recs[0].payload_type == NVTX_PAYLOAD_TYPE_UNSIGNED_INT64);
    CHECK(recs[0].payload_i == 7);
    CHECK(std::string{recs[1].domain} == "my_domain");
  }

  TEST_CASE("a unique range starts on one thread and ends on another")
  {
    gpukit_test::clear_nvtx_records();
    {
      gpukit::unique_range r{"prefetch"};
      std::thread t{[r = std::move(r)]() mutable { gpukit::unique_range done = std::move(r); }};
      t.join();
    }
    auto const recs = ranges_only();
    REQUIRE(recs.size() == 2);
    CHECK(recs[0].kind == gpukit_nvtx_start);
    CHECK(recs[1].kind == gpukit_nvtx_end);
    CHECK(recs[0].id == recs[1].id);
    CHECK(recs[0].thread != recs[1].thread);
  }

  TEST_CASE("name colors are stable and spread")
  {
    std::map<std::uint32_t, int> seen;
    for (char const* n : {"forward", "backward", "optimizer", "h2d", "d2h", "allreduce", "loss",
                          "data", "checkpoint", "recompute"}) {
      seen[gpukit::name_color(n)]++;
    }
    CHECK(seen.size() >= 9);
    constexpr auto c = gpukit::name_color("forward");
    CHECK(c == gpukit::name_color(std::string{"forward"}));
  }
}

TEST_SUITE("sim_concurrency")
{
  TEST_CASE("ranges from many threads nest per thread")
  {
    gpukit_test::clear_nvtx_records();
    std::vector<std::thread> threads;
    for (int t = 0; t < 8; ++t) {
      threads.emplace_back([] {
        for (int i = 0; i < 200; ++i) {
          GPUKIT_RANGE("worker");
          gpukit::named_range inner{"item", gpukit::payload{i}};
        }
      });
    }
    for (auto& t : threads) t.join();
    std::map<std::uint64_t, int> depth;
    std::map<std::uint64_t, int> pushes;
    bool ok = true;
    for (auto const& r : ranges_only()) {
      if (r.kind == gpukit_nvtx_push) {
        ok = ok && r.depth == ++depth[r.thread];
        ++pushes[r.thread];
      } else if (r.kind == gpukit_nvtx_pop) {
        ok = ok && r.depth == --depth[r.thread];
      }
    }
    CHECK(ok);
    CHECK(pushes.size() == 8);
    for (auto const& [thread, n] : pushes) CHECK(n == 400);
    for (auto const& [thread, d] : depth) CHECK(d == 0);
  }
}
