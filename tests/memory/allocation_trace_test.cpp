// SPDX-License-Identifier: Apache-2.0
// read_allocation_trace: every value checked, ids and streams renumbered densely, nothing read
// without bound.
#include <gpukit/memory/allocation_trace.hpp>

#include <doctest/doctest.h>

#include <sstream>
#include <string>

namespace {

gpukit::allocation_trace read(std::string const& text, gpukit::trace_limits limits = {})
{
  std::istringstream in{text};
  return gpukit::read_allocation_trace(in, "t", limits);
}

std::string error_of(std::string const& text, gpukit::trace_limits limits = {})
{
  try {
    (void)read(text, limits);
  } catch (gpukit::trace_error const& e) {
    return e.what();
  }
  return "no error";
}

}  // namespace

TEST_SUITE("memory")
{
  TEST_CASE("allocation_trace: events, peak and dense renumbering")
  {
    auto const t = read("# comment\n\na 7 100 5\na 9 50 5\nf 7\na 7 10 0\nf 9\nf 7\n");
    REQUIRE(t.events.size() == 6);
    CHECK(t.ids == 2);
    CHECK(t.streams == 2);
    CHECK(t.peak_live_bytes == 150);
    CHECK(t.events[0].alloc);
    CHECK(t.events[0].id == 0);
    CHECK(t.events[0].stream == 0);
    CHECK(t.events[1].id == 1);
    CHECK(t.events[3].id == 0);      // id 7 again
    CHECK(t.events[3].stream == 1);  // stream 0 seen second
    CHECK_FALSE(t.events[2].alloc);
  }

  TEST_CASE("allocation_trace: stream ids up to 2^64 - 1 are renumbered, never narrowed")
  {
    auto const t = read("a 1 8 2147483647\na 2 8 18446744073709551615\na 3 8 4294967296\n");
    CHECK(t.streams == 3);
    CHECK(t.events[0].stream == 0);
    CHECK(t.events[1].stream == 1);
    CHECK(t.events[2].stream == 2);
  }

  TEST_CASE("allocation_trace: ids 2^32 apart stay distinct")
  {
    auto const t = read("a 4294967296 8 0\na 0 8 0\nf 4294967296\nf 0\n");
    CHECK(t.ids == 2);
    CHECK(t.events[0].id != t.events[1].id);
  }

  TEST_CASE("allocation_trace: numbers are whole unsigned decimals")
  {
    CHECK(error_of("a 1 2x 0\n").find("t:1: expected 'a <id> <bytes> <stream>'") == 0);
    CHECK(error_of("a -1 8 0\n").find("expected") != std::string::npos);
    CHECK(error_of("a +1 8 0\n").find("expected") != std::string::npos);
    CHECK(error_of("a 1 8\n").find("expected") != std::string::npos);
    CHECK(error_of("a 1 99999999999999999999 0\n").find("expected") != std::string::npos);
    CHECK(error_of("f x\n").find("expected 'f <id>'") != std::string::npos);
    CHECK(error_of("a 1 8 0 9\n").find("unexpected '9'") != std::string::npos);
    CHECK(error_of("x 1\n").find("unknown event 'x'") != std::string::npos);
  }

  TEST_CASE("allocation_trace: sizes and live bytes are bounded, without wrapping")
  {
    CHECK(error_of("a 1 281474976710657 0\n").find("exceeds the limit") != std::string::npos);
    gpukit::trace_limits small;
    small.max_live_bytes = 100;
    CHECK(error_of("a 1 60 0\na 2 60 0\n", small).find("t:2: live bytes exceed") == 0);
    // Near SIZE_MAX: the sum must not wrap to a small number.
    gpukit::trace_limits huge;
    huge.max_block_bytes = ~std::size_t{0};
    huge.max_live_bytes  = ~std::size_t{0};
    CHECK(error_of("a 1 18446744073709551615 0\na 2 1 0\n", huge).find("live bytes exceed") !=
          std::string::npos);
  }

  TEST_CASE("allocation_trace: ownership errors name the id")
  {
    CHECK(error_of("a 1 8 0\na 1 8 0\n").find("id 1 is allocated twice") != std::string::npos);
    CHECK(error_of("f 3\n").find("free of id 3, which is not live") != std::string::npos);
    CHECK(error_of("a 1 8 0\nf 1\nf 1\n").find("t:3: free of id 1") == 0);
    CHECK(error_of("# only comments\n") == "t: no events");
  }

  TEST_CASE("allocation_trace: an endless line is refused at its limit (binary input, /dev/zero)")
  {
    gpukit::trace_limits limits;
    limits.max_line_chars = 64;
    std::string const zeros(1 << 20, '\0');
    CHECK(error_of(zeros, limits).find("t:1: line longer than 64 characters") == 0);
  }

  TEST_CASE("allocation_trace: stream and event counts are bounded")
  {
    gpukit::trace_limits limits;
    limits.max_streams = 2;
    CHECK(error_of("a 1 8 0\na 2 8 1\na 3 8 0\na 4 8 2\n", limits).find("t:4: more than 2") == 0);
    limits.max_events = 1;
    CHECK(error_of("a 1 8 0\nf 1\n", limits).find("more than 1 events") != std::string::npos);
  }
}
