// SPDX-License-Identifier: Apache-2.0
// GPUKIT_ALLOC_CONF: every key reaches its option; unknown keys and bad values are named.
#include <gpukit/memory/alloc_conf.hpp>

#include <doctest/doctest.h>

#include <cstdlib>
#include <string>

namespace {

constexpr std::size_t MiB = std::size_t{1} << 20;

std::string error_of(char const* conf)
{
  try {
    (void)gpukit::parse_alloc_conf(conf);
  } catch (gpukit::logic_error const& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_SUITE("alloc_conf")
{
  TEST_CASE("alloc conf: keys set their options, spaces and empty entries are ignored")
  {
    auto const o = gpukit::parse_alloc_conf(
      " segments: growable , page_size:20MiB,, limit:40GiB,thread_cache:off,"
      "release_before_grow:false, oom_wait_for_frees_ms:50, growable_shareable:TRUE,"
      "small_request_bytes:512K, thread_cache_blocks_per_class:3");
    CHECK(o.source == gpukit::segment_source::growable);
    CHECK(o.growable_page_bytes == 20 * MiB);
    CHECK(o.limit_bytes == std::size_t{40} << 30);
    CHECK(o.thread_cache_max_block_bytes == 0);
    CHECK_FALSE(o.release_before_grow);
    CHECK(o.oom_wait_for_frees_ms == 50);
    CHECK(o.growable_shareable);
    CHECK(o.small_request_bytes == 512 * 1024);
    CHECK(o.thread_cache_blocks_per_class == 3);
  }

  TEST_CASE("alloc conf: PyTorch's names, aliases, fractions and the other sources")
  {
    CHECK(gpukit::parse_alloc_conf("expandable_segments:True").source ==
          gpukit::segment_source::growable);
    CHECK(gpukit::parse_alloc_conf("segments:synchronous").source ==
          gpukit::segment_source::synchronous);
    CHECK(gpukit::parse_alloc_conf("segments:stream_ordered").source ==
          gpukit::segment_source::stream_ordered);
    CHECK(gpukit::parse_alloc_conf("max_bytes:1024").limit_bytes == 1024);
    CHECK(gpukit::parse_alloc_conf("growable_page_bytes:4M").growable_page_bytes == 4 * MiB);
    CHECK(gpukit::parse_alloc_conf("fraction:0.25").limit_fraction == doctest::Approx(0.25));
    gpukit::caching_allocator_options base;
    base.limit_bytes = 7;
    CHECK(gpukit::parse_alloc_conf("", base).limit_bytes == 7);  // the base stays
  }

  TEST_CASE("alloc conf: unknown keys, bad values, repeats and bad entries are named")
  {
    CHECK(error_of("segmetns:growable").find("unknown key 'segmetns'") != std::string::npos);
    CHECK(error_of("segments:fast").find("'fast' for 'segments'") != std::string::npos);
    CHECK(error_of("page_size:20XB").find("'20XB' for 'page_size'") != std::string::npos);
    CHECK(error_of("limit:-1").find("'-1' for 'limit'") != std::string::npos);
    CHECK(error_of("fraction:1.5").find("'1.5' for 'fraction'") != std::string::npos);
    CHECK(error_of("thread_cache:maybe").find("'maybe' for 'thread_cache'") != std::string::npos);
    CHECK(error_of("limit:1G,limit:2G").find("'limit' is given twice") != std::string::npos);
    CHECK(error_of("growable").find("'growable' is not key:value") != std::string::npos);
    CHECK(error_of("page_size:99999999999999999999").find("page_size") != std::string::npos);
    CHECK(error_of("page_size:0").find("must not be 0") != std::string::npos);
  }

  TEST_CASE("alloc conf: two keys that set one option are refused, naming both")
  {
    for (char const* conf : {"limit:4GiB,max_bytes:2GiB", "fraction:0.5,limit_fraction:0.25",
                             "page_size:2MiB,growable_page_bytes:20MiB",
                             "thread_cache:off,thread_cache_max_block_bytes:1MiB",
                             "segments:synchronous,expandable_segments:true",
                             "expandable_segments:false,segments:growable"}) {
      CAPTURE(conf);
      std::string const e = error_of(conf);
      std::string const first{conf, std::string{conf}.find(':')};
      std::string const rest{std::string{conf}.substr(std::string{conf}.find(',') + 1)};
      std::string const second{rest.substr(0, rest.find(':'))};
      CHECK(e.find("'" + first + "' and '" + second + "' both set") != std::string::npos);
      CHECK(e.find("give one of them") != std::string::npos);
    }
    // Keys that set different options still combine.
    auto const o = gpukit::parse_alloc_conf("limit:4GiB,fraction:0.5,thread_cache_bytes:1MiB");
    CHECK(o.limit_bytes == 4096 * MiB);
    CHECK(o.limit_fraction == doctest::Approx(0.5));
  }

  TEST_CASE("alloc conf: a count outside the allocator's range is refused by the key's name")
  {
    CHECK(
      error_of("thread_cache_blocks_per_class:1000")
        .find(
          "'1000' for 'thread_cache_blocks_per_class': expected a whole number from 0 to 255") !=
      std::string::npos);
    CHECK(
      gpukit::parse_alloc_conf("thread_cache_blocks_per_class:255").thread_cache_blocks_per_class ==
      255);
  }

  TEST_CASE("alloc conf: sizes")
  {
    CHECK(gpukit::parse_alloc_conf_size("512") == 512);
    CHECK(gpukit::parse_alloc_conf_size("2 KiB") == 2048);
    CHECK(gpukit::parse_alloc_conf_size("3mb") == 3 * MiB);
    CHECK(gpukit::parse_alloc_conf_size("1G") == std::size_t{1} << 30);
    CHECK_THROWS_AS((void)gpukit::parse_alloc_conf_size("MiB"), gpukit::logic_error);
    CHECK_THROWS_AS((void)gpukit::parse_alloc_conf_size("1.5G"), gpukit::logic_error);
    CHECK_THROWS_AS((void)gpukit::parse_alloc_conf_size("99999999999T"), gpukit::logic_error);
  }

  TEST_CASE("alloc conf: from the environment, with the variable named in errors")
  {
    ::setenv("GPUKIT_TEST_ALLOC_CONF", "segments:synchronous", 1);
    CHECK(gpukit::alloc_conf_from_env("GPUKIT_TEST_ALLOC_CONF").source ==
          gpukit::segment_source::synchronous);
    ::setenv("GPUKIT_TEST_ALLOC_CONF", "nope:1", 1);
    try {
      (void)gpukit::alloc_conf_from_env("GPUKIT_TEST_ALLOC_CONF");
      FAIL("an unknown key must throw");
    } catch (gpukit::logic_error const& e) {
      CHECK(std::string{e.what()}.find("GPUKIT_TEST_ALLOC_CONF") != std::string::npos);
    }
    ::unsetenv("GPUKIT_TEST_ALLOC_CONF");
    CHECK(gpukit::alloc_conf_from_env("GPUKIT_TEST_ALLOC_CONF").source ==
          gpukit::segment_source::automatic);
  }
}
