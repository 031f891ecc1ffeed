// SPDX-License-Identifier: Apache-2.0
// GPUKIT_ALLOC_CONF (gpukit/memory/alloc_conf.hpp): every key of alloc_conf_keys parses, writes
// back and refuses what its range refuses, naming the key as typed; the allocator refuses the same
// values set from C++, naming the member; unknown keys, repeats and aliases are named; and
// docs/alloc_conf.md is the table's. The table-driven cases read alloc_conf_keys itself, so a new
// key is covered without a new case.
#include "support/caching_allocator.hpp"

#include <gpukit/memory/alloc_conf.hpp>
#include <gpukit/memory/caching_allocator.hpp>
#include <gpukit/memory/caching_allocator_options.hpp>

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>
#include <string>
#include <vector>

namespace {

using gpukit::alloc_conf_key;
using gpukit::alloc_conf_kind;
using gpukit::caching_allocator_options;
using gpukit::test::sim_allocator;

constexpr std::size_t MiB = std::size_t{1} << 20;

std::string error_of(std::string const& conf, caching_allocator_options const& base = {})
{
  try {
    (void)gpukit::parse_alloc_conf(conf, base);
  } catch (gpukit::logic_error const& e) {
    return e.what();
  }
  return "";
}

bool contains(std::string const& text, std::string const& part)
{
  return text.find(part) != std::string::npos;
}

/// The spellings of a key: its name and its alias.
std::vector<std::string> spellings(alloc_conf_key const& k)
{
  std::vector<std::string> s{k.key};
  if (k.alias != nullptr) { s.emplace_back(k.alias); }
  return s;
}

/// Whether `a` and `b` agree in every member a key sets.
bool same_settings(caching_allocator_options const& a, caching_allocator_options const& b)
{
  for (alloc_conf_key const& k : gpukit::alloc_conf_keys) {
    auto const& f = k.field;
    switch (f.kind) {
      case alloc_conf_kind::bytes:
        if (a.*(f.bytes) != b.*(f.bytes)) { return false; }
        break;
      case alloc_conf_kind::count:
        if (a.*(f.count) != b.*(f.count)) { return false; }
        break;
      case alloc_conf_kind::fraction:
        if (a.*(f.fraction) != b.*(f.fraction)) { return false; }
        break;
      case alloc_conf_kind::flag:
        if (a.*(f.flag) != b.*(f.flag)) { return false; }
        break;
      case alloc_conf_kind::source:
        if (a.*(f.source) != b.*(f.source)) { return false; }
        break;
    }
  }
  return true;
}

/// A bound of a whole-number key as text.
std::string whole(double v) { return std::to_string(static_cast<long long>(v)); }

/// Values of `k` outside its range, as a string would spell them.
std::vector<std::string> out_of_range(alloc_conf_key const& k)
{
  std::vector<std::string> v;
  bool const bounded = k.max != gpukit::alloc_conf_unbounded;
  switch (k.kind) {
    case alloc_conf_kind::bytes:
      if (k.min > 0) { v.push_back(whole(k.min - 1)); }
      if (bounded) { v.push_back(whole(k.max + static_cast<double>(k.multiple))); }
      if (k.multiple > 1) { v.push_back(whole(k.min + 1)); }
      break;
    case alloc_conf_kind::count:
      v.push_back(whole(k.min - 1));
      if (bounded) { v.push_back(whole(k.max + 1)); }
      break;
    case alloc_conf_kind::fraction:
      v.push_back(std::to_string(k.min - 0.5));
      if (bounded) { v.push_back(std::to_string(k.max + 0.5)); }
      break;
    case alloc_conf_kind::flag:
    case alloc_conf_kind::source: v.emplace_back("sideways"); break;
  }
  return v;
}

/// The source tree: the first of this file's folder (when __FILE__ is absolute) and the working
/// directory's ancestors that holds alloc_conf.hpp; empty when none does (an installed test).
std::string source_tree()
{
  auto const holds = [](std::string const& dir) {
    return std::ifstream{dir + "/include/gpukit/memory/alloc_conf.hpp"}.good();
  };
  std::string here = __FILE__;  // <source>/tests/memory/alloc_conf_test.cpp, maybe relative
  for (int i = 0; i < 3 && here.find('/') != std::string::npos; ++i) {
    here = here.substr(0, here.find_last_of('/'));
  }
  if (!here.empty() && here.front() == '/' && holds(here)) { return here; }
  std::string dir = std::filesystem::current_path().string();
  while (!dir.empty() && dir != "/") {
    if (holds(dir)) { return dir; }
    dir = std::filesystem::path{dir}.parent_path().string();
  }
  return {};
}

bool no_source_tree() { return source_tree().empty(); }

std::string read(std::string const& path)
{
  std::ifstream in{path};
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
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
    CHECK(gpukit::parse_alloc_conf("expandable_segments:false").source ==
          gpukit::segment_source::automatic);
    CHECK(gpukit::parse_alloc_conf("segments:synchronous").source ==
          gpukit::segment_source::synchronous);
    CHECK(gpukit::parse_alloc_conf("segments:stream_ordered").source ==
          gpukit::segment_source::stream_ordered);
    CHECK(gpukit::parse_alloc_conf("max_bytes:1024").limit_bytes == 1024);
    CHECK(gpukit::parse_alloc_conf("growable_page_bytes:4M").growable_page_bytes == 4 * MiB);
    CHECK(gpukit::parse_alloc_conf("fraction:0.25").limit_fraction == doctest::Approx(0.25));
    CHECK(gpukit::parse_alloc_conf("fraction:0").limit_fraction == 0.0);  // 0: no limit
    caching_allocator_options base;
    base.limit_bytes = 7;
    CHECK(gpukit::parse_alloc_conf("", base).limit_bytes == 7);  // the base stays
    // thread_cache:on gives caches back to a base without them, and keeps a base's own size.
    base.thread_cache_max_block_bytes = 0;
    CHECK(gpukit::parse_alloc_conf("thread_cache:on", base).thread_cache_max_block_bytes ==
          caching_allocator_options{}.thread_cache_max_block_bytes);
    base.thread_cache_max_block_bytes = 4096;
    CHECK(gpukit::parse_alloc_conf("thread_cache:on", base).thread_cache_max_block_bytes == 4096);
    CHECK(gpukit::find_alloc_conf_key(" Max_Bytes ") == gpukit::find_alloc_conf_key("limit"));
    CHECK(gpukit::find_alloc_conf_key("limits") == nullptr);
  }

  TEST_CASE("alloc conf: unknown keys, bad values, repeats and bad entries are named")
  {
    std::string const unknown = error_of("segmetns:growable");
    CHECK(contains(unknown, "unknown key 'segmetns'"));
    for (alloc_conf_key const& k : gpukit::alloc_conf_keys) {  // the known keys, from the table
      for (std::string const& s : spellings(k)) { CHECK(contains(unknown, s)); }
    }
    CHECK(contains(error_of("segments:fast"), "'fast' for 'segments'"));
    CHECK(contains(error_of("page_size:20XB"), "'20XB' for 'page_size'"));
    CHECK(contains(error_of("limit:-1"), "'-1' for 'limit'"));
    CHECK(contains(error_of("fraction:1.5"), "'1.5' for 'fraction'"));
    CHECK(contains(error_of("thread_cache:maybe"), "'maybe' for 'thread_cache'"));
    CHECK(contains(error_of("limit:1G,limit:2G"), "'limit' is given twice"));
    CHECK(contains(error_of("LIMIT:1G,limit:2G"), "'limit' is given twice"));
    CHECK(contains(error_of("growable"), "'growable' is not key:value"));
    CHECK(contains(error_of("page_size:99999999999999999999"), "page_size"));
    CHECK(contains(error_of("page_size:0"), "'0' for 'page_size': expected a size from 1 to"));
    for (char const* conf : {"segmetns:growable", "page_size:20XB", "limit:1G,limit:2G", "x"}) {
      std::string const e = error_of(conf);
      CAPTURE(e);
      CHECK(e.rfind("gpukit: alloc conf: ", 0) == 0);  // one prefix, none inside
      CHECK(e.find("gpukit: ", 1) == std::string::npos);
    }
  }

  TEST_CASE("alloc conf: two keys that set one option are refused, naming both")
  {
    for (char const* conf :
         {"limit:4GiB,max_bytes:2GiB", "max_bytes:2GiB,limit:4GiB",
          "fraction:0.5,limit_fraction:0.25", "page_size:2MiB,growable_page_bytes:20MiB",
          "thread_cache:off,thread_cache_max_block_bytes:1MiB",
          "segments:synchronous,expandable_segments:true",
          "expandable_segments:false,segments:growable"}) {
      CAPTURE(conf);
      std::string const e = error_of(conf);
      std::string const c{conf};
      std::string const first  = c.substr(0, c.find(':'));
      std::string const rest   = c.substr(c.find(',') + 1);
      std::string const second = rest.substr(0, rest.find(':'));
      CHECK(contains(e, "'" + first + "' and '" + second + "' both set"));
      CHECK(contains(e, "give one of them"));
    }
    // Every alias, from the table: with its key, in either order.
    for (alloc_conf_key const& k : gpukit::alloc_conf_keys) {
      if (k.alias == nullptr) { continue; }
      std::string const conf =
        std::string{k.key} + ":" + k.example + "," + k.alias + ":" + k.example;
      CHECK(contains(error_of(conf), "'" + std::string{k.key} + "' and '" + k.alias + "'"));
    }
    // Keys that set different options still combine.
    auto const o = gpukit::parse_alloc_conf("limit:4GiB,fraction:0.5,thread_cache_bytes:1MiB");
    CHECK(o.limit_bytes == 4096 * MiB);
    CHECK(o.limit_fraction == doctest::Approx(0.5));
  }

  TEST_CASE("alloc conf: every key, under each spelling, parses its example and writes it back")
  {
    caching_allocator_options const defaults;
    for (alloc_conf_key const& k : gpukit::alloc_conf_keys) {
      for (std::string const& key : spellings(k)) {
        std::string const conf = key + ":" + k.example;
        CAPTURE(conf);
        caching_allocator_options o;
        REQUIRE_NOTHROW(o = gpukit::parse_alloc_conf(conf));
        if (k.shortcut == nullptr) {  // the example is not the default: the key did something
          CHECK_FALSE(same_settings(o, defaults));
        }
        std::string const written = gpukit::to_alloc_conf(o);
        CAPTURE(written);
        CHECK(same_settings(gpukit::parse_alloc_conf(written), o));
        CHECK(gpukit::to_alloc_conf(gpukit::parse_alloc_conf(written)) == written);
        if (k.shortcut == nullptr) {
          CHECK(contains(written, std::string{k.key} + ":" + k.example));
        }
      }
    }
  }

  TEST_CASE("alloc conf: to_alloc_conf writes every option once, and reads back to the same")
  {
    caching_allocator_options const defaults;
    std::string const plain = gpukit::to_alloc_conf(defaults);
    CHECK(same_settings(gpukit::parse_alloc_conf(plain), defaults));
    // Every example at once (shortcuts left out: their options' own keys are there).
    std::string all;
    for (alloc_conf_key const& k : gpukit::alloc_conf_keys) {
      if (k.shortcut != nullptr) { continue; }
      all += (all.empty() ? "" : ",") + std::string{k.key} + ":" + k.example;
    }
    auto const o = gpukit::parse_alloc_conf(all);
    CHECK(gpukit::to_alloc_conf(o) == all);  // the examples are written as the table writes
    CHECK(same_settings(gpukit::parse_alloc_conf(gpukit::to_alloc_conf(o)), o));
    // Any base: what is written does not depend on the defaults it is read over.
    caching_allocator_options other;
    other.limit_bytes   = 123;
    other.nvtx_annotate = !defaults.nvtx_annotate;
    CHECK(same_settings(gpukit::parse_alloc_conf(gpukit::to_alloc_conf(o), other), o));
    // Fractions and sizes that need every digit.
    caching_allocator_options odd;
    odd.limit_fraction     = 0.1 + 0.2;
    odd.limit_bytes        = 3 * MiB + 1;
    odd.thread_cache_bytes = 1536 * 1024;
    std::string const w    = gpukit::to_alloc_conf(odd);
    CAPTURE(w);
    CHECK(contains(w, "limit:3145729,"));
    CHECK(contains(w, "thread_cache_bytes:1536KiB"));
    CHECK(gpukit::parse_alloc_conf(w).limit_fraction == odd.limit_fraction);
    // Options out of range are refused, naming the member.
    odd.thread_cache_blocks_per_class = 1000;
    CHECK_THROWS_WITH_AS((void)gpukit::to_alloc_conf(odd),
                         doctest::Contains("thread_cache_blocks_per_class = 1000"),
                         gpukit::logic_error);
  }

  TEST_CASE("alloc conf: each value out of a key's range names the key as typed, value and range")
  {
    for (alloc_conf_key const& k : gpukit::alloc_conf_keys) {
      std::string const range = gpukit::alloc_conf_range(k);
      if (k.kind == alloc_conf_kind::bytes || k.kind == alloc_conf_kind::count) {
        auto const bound = [&](double v) {
          return k.kind == alloc_conf_kind::bytes
                   ? gpukit::format_alloc_conf_size(static_cast<std::size_t>(v))
                   : whole(v);
        };
        if (k.max != gpukit::alloc_conf_unbounded) {
          CHECK(contains(range, bound(k.min) + " to " + bound(k.max)));
        } else if (k.min > 0) {
          CHECK(contains(range, bound(k.min)));
        }
      }
      for (std::string const& key : spellings(k)) {
        for (std::string const& value : out_of_range(k)) {
          std::string const conf = " " + key + " : " + value + " ";
          std::string const e    = error_of(conf);
          CAPTURE(conf);
          CAPTURE(e);
          CHECK(contains(e, "bad value '" + value + "' for '" + key + "'"));
          CHECK(contains(e, "expected " + range));
        }
      }
    }
    // The allocator's ranges are the same: what it refuses, parsing refuses (the drift that was).
    CHECK(contains(error_of("thread_cache_blocks_per_class:1000"),
                   "'1000' for 'thread_cache_blocks_per_class': expected a whole number from 0 "
                   "to 255"));
    CHECK(contains(error_of("oom_wait_for_frees_ms:4000000"),
                   "'4000000' for 'oom_wait_for_frees_ms': expected a whole number from 0 to "
                   "3600000"));
    CHECK(
      gpukit::parse_alloc_conf("thread_cache_blocks_per_class:255").thread_cache_blocks_per_class ==
      255);
  }

  TEST_CASE("alloc conf: the allocator refuses the same values set from C++, naming the member")
  {
    gpukit::sim_runtime sim{gpukit::test::one_device(gpukit::test::gib)};
    auto refusal = [&](caching_allocator_options const& o) -> std::string {
      try {
        sim_allocator alloc{sim, 0, o};
      } catch (gpukit::logic_error const& e) {
        return e.what();
      }
      return "";
    };
    int checked = 0;
    for (alloc_conf_key const& k : gpukit::alloc_conf_keys) {
      if (k.shortcut != nullptr) { continue; }
      auto const& f = k.field;
      std::vector<std::pair<caching_allocator_options, std::string>> bad;  // options, value
      auto add = [&](auto set, std::string const& value) {
        caching_allocator_options o;
        set(o);
        bad.emplace_back(o, value);
      };
      for (std::string const& text : out_of_range(k)) {
        switch (k.kind) {
          case alloc_conf_kind::bytes: {
            auto const v = static_cast<std::size_t>(std::stoull(text));
            // Sizes below the next key's minimum would trip an order first: only the range here.
            add([&](caching_allocator_options& o) { o.*(f.bytes) = v; }, std::to_string(v));
            break;
          }
          case alloc_conf_kind::count: {
            int const v = std::stoi(text);
            add([&](caching_allocator_options& o) { o.*(f.count) = v; }, text);
            break;
          }
          case alloc_conf_kind::fraction: {
            double const v = std::stod(text);
            add([&](caching_allocator_options& o) { o.*(f.fraction) = v; }, "");
            break;
          }
          case alloc_conf_kind::source:
            add(
              [&](caching_allocator_options& o) {
                o.*(f.source) = static_cast<gpukit::segment_source>(static_cast<int>(k.max) + 1);
              },
              std::to_string(static_cast<int>(k.max) + 1));
            break;
          case alloc_conf_kind::flag: break;  // a bool is never out of range
        }
      }
      for (auto const& [o, value] : bad) {
        std::string const e = refusal(o);
        CAPTURE(k.key);
        CAPTURE(e);
        CHECK(contains(e, "caching_allocator_options: " + std::string{f.name} + " = " + value));
        CHECK(contains(e, "expected " + gpukit::alloc_conf_range(k)));
        CHECK_FALSE(contains(e, "'" + std::string{k.key} + "'"));  // no key: none was typed
        ++checked;
      }
    }
    CHECK(checked > 10);
    CHECK(refusal(caching_allocator_options{}).empty());
  }

  TEST_CASE("alloc conf: segment sizes keep their order, named as typed or by their member")
  {
    CHECK(contains(error_of("small_segment_bytes:512KiB"),
                   "alloc conf: 'small_segment_bytes' (512KiB) is smaller than "
                   "small_request_bytes (1MiB)"));
    CHECK(contains(error_of("medium_request_bytes:4MiB,small_request_bytes:8MiB,"
                            "small_segment_bytes:8MiB"),
                   "'medium_request_bytes' (4MiB) is smaller than 'small_request_bytes' (8MiB)"));
    CHECK_NOTHROW((void)gpukit::parse_alloc_conf("small_request_bytes:2MiB"));  // = small segment
    caching_allocator_options o;
    o.medium_segment_bytes = 4 * MiB;
    gpukit::sim_runtime sim{gpukit::test::one_device(gpukit::test::gib)};
    CHECK_THROWS_WITH_AS(sim_allocator(sim, 0, o),
                         doctest::Contains("caching_allocator_options: medium_segment_bytes "
                                           "(4194304) is smaller than medium_request_bytes "
                                           "(10485760)"),
                         gpukit::logic_error);
    // A base out of order that the string leaves is named by its member.
    CHECK(contains(error_of("limit:1G", o), "caching_allocator_options: medium_segment_bytes"));
  }

  TEST_CASE("alloc conf: sizes")
  {
    CHECK(gpukit::parse_alloc_conf_size("512") == 512);
    CHECK(gpukit::parse_alloc_conf_size("2 KiB") == 2048);
    CHECK(gpukit::parse_alloc_conf_size("3mb") == 3 * MiB);
    CHECK(gpukit::parse_alloc_conf_size("1G") == std::size_t{1} << 30);
    CHECK(gpukit::parse_alloc_conf_size("2TiB") == std::size_t{2} << 40);
    CHECK_THROWS_AS((void)gpukit::parse_alloc_conf_size("MiB"), gpukit::logic_error);
    CHECK_THROWS_AS((void)gpukit::parse_alloc_conf_size("1.5G"), gpukit::logic_error);
    CHECK_THROWS_AS((void)gpukit::parse_alloc_conf_size("99999999999T"), gpukit::logic_error);
    for (std::size_t v :
         {std::size_t{0}, std::size_t{1}, std::size_t{1000}, 1536 * std::size_t{1024}, 20 * MiB,
          std::size_t{40} << 30, std::size_t{3} << 40, 3 * MiB + 1}) {
      CHECK(gpukit::parse_alloc_conf_size(gpukit::format_alloc_conf_size(v)) == v);
    }
    CHECK(gpukit::format_alloc_conf_size(20 * MiB) == "20MiB");
    CHECK(gpukit::format_alloc_conf_size(1000) == "1000");
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
      CHECK(contains(e.what(), "GPUKIT_TEST_ALLOC_CONF"));
    }
    ::unsetenv("GPUKIT_TEST_ALLOC_CONF");
    CHECK(gpukit::alloc_conf_from_env("GPUKIT_TEST_ALLOC_CONF").source ==
          gpukit::segment_source::automatic);
  }

  TEST_CASE("alloc conf: each key's name is written once in include/, in its table entry" *
            doctest::skip(no_source_tree()))
  {
    // Files whose quoted words are not keys: JSON's field names.
    std::string const not_conf[] = {"memory_history.hpp"};
    std::vector<std::string> texts;
    for (auto const& f :
         std::filesystem::recursive_directory_iterator{source_tree() + "/include/gpukit"}) {
      if (!f.is_regular_file() || std::find(std::begin(not_conf), std::end(not_conf),
                                            f.path().filename().string()) != std::end(not_conf)) {
        continue;
      }
      texts.push_back(read(f.path().string()));
    }
    for (alloc_conf_key const& k : gpukit::alloc_conf_keys) {
      for (std::string const& s : spellings(k)) {
        std::string const quoted = "\"" + s + "\"";
        std::size_t n            = 0;
        for (std::string const& t : texts) {
          for (auto at = t.find(quoted); at != std::string::npos; at = t.find(quoted, at + 1)) {
            ++n;
          }
        }
        CAPTURE(quoted);
        CHECK(n == 1);
      }
    }
  }

  TEST_CASE("alloc conf: docs/alloc_conf.md is the table's" * doctest::skip(no_source_tree()))
  {
    std::string const path     = source_tree() + "/docs/alloc_conf.md";
    std::string const rendered = gpukit::alloc_conf_markdown();
    if (char const* update = std::getenv("GPUKIT_UPDATE_ALLOC_CONF_DOC");
        update != nullptr && std::string{update} == "1") {
      std::ofstream{path} << rendered;
    }
    REQUIRE_MESSAGE(std::ifstream{path}.good(), "missing " << path);
    CHECK_MESSAGE(read(path) == rendered,
                  path << " is stale: rerun with GPUKIT_UPDATE_ALLOC_CONF_DOC=1 and commit it");
    for (alloc_conf_key const& k : gpukit::alloc_conf_keys) {
      CHECK(contains(rendered, "| `" + std::string{k.key} + "`"));
    }
  }
}
