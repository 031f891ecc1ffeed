// SPDX-License-Identifier: Apache-2.0
// detail::caching::quarantine alone over the simulated GPU: a free checked (the pool's side is a
// callable here), poisoned in its stream's order and held; a double free caught while the block
// waits; the oldest frees given back beyond the bounds, in order, through the ordinary path (a
// callable), which a failure leaves at the front of the quarantine; flushes per stream and of all;
// no poison during graph captures; and how debug mode settles the segment source.
#include "support/holders.hpp"
#include "support/sim_gpu.hpp"

#include <gpukit/error.hpp>
#include <gpukit/memory/detail/caching/quarantine.hpp>
#include <gpukit/memory/detail/caching_block.hpp>
#include <gpukit/runtime/sim_runtime.hpp>

#include <doctest/doctest.h>

#include <array>
#include <atomic>
#include <cstddef>
#include <optional>
#include <stdexcept>
#include <vector>

using gpukit::sim_op;
using gpukit::sim_runtime;
using block      = gpukit::detail::caching_block<sim_runtime>;
using quarantine = gpukit::detail::caching::quarantine<sim_runtime, block>;
using entry      = quarantine::entry;
using gpukit::test::device_buffer;
using gpukit::test::sim_stream;
using gpukit::test::stream_holder;

namespace {

// Debug mode with a quarantine of `blocks` blocks and `bytes` bytes; poison byte `poison`.
gpukit::caching_allocator_options options(std::size_t blocks,
                                          std::size_t bytes = std::size_t{1} << 30, int poison = -1)
{
  gpukit::caching_allocator_options o;
  o.nvtx_annotate           = false;
  o.debug.enabled           = true;
  o.debug.poison_byte       = poison;
  o.debug.quarantine_blocks = blocks;
  o.debug.quarantine_bytes  = bytes;
  return o;
}

// A quarantine over its own simulated GPU, captures counter and pool lock.
struct fixture {
  sim_runtime sim{gpukit::test::one_device()};
  std::atomic<int> captures{0};
  gpukit::detail::annotated_mutex pool;
  std::array<unsigned char, 8192> host{};  // fake block addresses (never written without poison)

  void* at(std::size_t i) { return host.data() + 256 * i; }
  std::unique_ptr<quarantine> make(gpukit::caching_allocator_options const& o)
  {
    return std::make_unique<quarantine>(sim, 0, o, captures, pool);
  }
};

// The pool's side of a free, accepting every free of a block of `size` bytes.
auto admit_all(std::size_t size = 1024)
{
  return [size]() -> std::optional<std::size_t> { return size; };
}

// Records the entries given back, and what the quarantine said of each while it was given back.
struct give_back_log {
  std::vector<entry> entries;
  std::vector<bool> releasing;  // releasing() named the entry
  void operator()(entry const& e)
  {
    entries.push_back(e);
    releasing.push_back(quarantine::releasing() == e.ptr);
  }
};

std::vector<void*> pointers(std::vector<entry> const& entries)
{
  std::vector<void*> out;
  for (entry const& e : entries) { out.push_back(e.ptr); }
  return out;
}

}  // namespace

TEST_SUITE("quarantine")
{
  TEST_CASE(
    "a free is checked and poisoned in its stream's order and held: again it is a double free")
  {
    fixture f;
    stream_holder<sim_runtime> s{f.sim};
    device_buffer<sim_runtime> buf{f.sim, 4096};
    GPUKIT_CUDA_TRY(f.sim.memset_async(buf.p, 0x11, 4096, s));
    auto q     = f.make(options(4, std::size_t{1} << 30, 0xfd));
    int admits = 0;
    auto admit = [&]() -> std::optional<std::size_t> {
      ++admits;
      return std::size_t{1024};
    };
    give_back_log log;
    CHECK(q->free(buf.p, 1000, true, s, admit, log));
    CHECK(admits == 1);
    CHECK(q->blocks() == 1);
    std::vector<unsigned char> bytes(2048);
    GPUKIT_CUDA_TRY(f.sim.memcpy_async(bytes.data(), buf.p, bytes.size(),
                                       gpukit::memcpy_kind::device_to_host, s));
    GPUKIT_CUDA_TRY(f.sim.stream_synchronize(s));
    for (std::size_t i = 0; i < 1024; ++i) { REQUIRE(bytes[i] == 0xfd); }  // the block's size
    for (std::size_t i = 1024; i < 2048; ++i) { REQUIRE(bytes[i] == 0x11); }
    CHECK_THROWS_WITH_AS(q->free(buf.p, 1000, true, s, admit, log),
                         doctest::Contains("still in the debug quarantine, device 0"),
                         gpukit::logic_error);
    CHECK(admits == 1);  // refused before the pool is asked
    CHECK(q->blocks() == 1);
    CHECK(log.entries.empty());
    q->flush(s, log);  // before the stream goes
    REQUIRE(log.entries.size() == 1);
    CHECK(log.entries[0].ptr == buf.p);
    CHECK(log.entries[0].bytes == 1000);
    CHECK(log.entries[0].check_size);
    CHECK(log.entries[0].stream == s.s);
    CHECK(log.entries[0].size == 1024);
    CHECK(log.releasing[0]);
    CHECK(quarantine::releasing() == nullptr);
    CHECK(q->blocks() == 0);
  }

  TEST_CASE("beyond its bounds the oldest frees go back in order through the ordinary path")
  {
    fixture f;
    SUBCASE("bounded in blocks")
    {
      auto q = f.make(options(2));
      give_back_log log;
      for (std::size_t i = 0; i < 4; ++i) {
        CHECK(q->free(f.at(i), 1000, true, sim_stream{}, admit_all(), log));
      }
      CHECK(pointers(log.entries) == std::vector<void*>{f.at(0), f.at(1)});
      CHECK(log.releasing == std::vector<bool>{true, true});
      CHECK(q->blocks() == 2);
    }
    SUBCASE("bounded in bytes")
    {
      auto q = f.make(options(100, 3000));
      give_back_log log;
      for (std::size_t i = 0; i < 3; ++i) {
        CHECK(q->free(f.at(i), 1000, true, sim_stream{}, admit_all(1024), log));
      }
      CHECK(pointers(log.entries) == std::vector<void*>{f.at(0)});  // 3072 > 3000: one out
      CHECK(q->blocks() == 2);
    }
    SUBCASE("no quarantine at all")
    {
      auto q = f.make(options(0, 0));
      give_back_log log;
      CHECK(q->free(f.at(0), 1000, false, sim_stream{}, admit_all(), log));
      CHECK(pointers(log.entries) == std::vector<void*>{f.at(0)});
      CHECK_FALSE(log.entries[0].check_size);
      CHECK(q->blocks() == 0);
    }
  }

  TEST_CASE("the free of the entry being given back takes the ordinary path")
  {
    fixture f;
    auto q     = f.make(options(1));
    int admits = 0;
    auto admit = [&]() -> std::optional<std::size_t> {
      ++admits;
      return std::size_t{1024};
    };
    std::vector<bool> taken;
    auto give_back = [&](entry const& e) {  // the allocator's deallocate, which asks again
      taken.push_back(q->free(e.ptr, e.bytes, e.check_size, e.stream, admit,
                              [](entry const&) { FAIL("nothing to give back"); }));
    };
    CHECK(q->free(f.at(0), 1000, true, sim_stream{}, admit, give_back));
    CHECK(q->free(f.at(1), 1000, true, sim_stream{}, admit, give_back));
    CHECK(taken == std::vector<bool>{false});  // f.at(0) went on to the pool
    CHECK(admits == 2);
    CHECK(q->blocks() == 1);
  }

  TEST_CASE("what the pool refuses or frees itself is not quarantined")
  {
    fixture f;
    auto q = f.make(options(4, std::size_t{1} << 30, 0xfd));
    give_back_log log;
    auto refuse = []() -> std::optional<std::size_t> {
      throw gpukit::logic_error{"deallocate: pointer was not allocated by this allocator"};
    };
    CHECK_THROWS_AS(q->free(f.at(0), 1000, true, sim_stream{}, refuse, log), gpukit::logic_error);
    CHECK(q->blocks() == 0);
    auto freed_by_pool = []() -> std::optional<std::size_t> { return std::nullopt; };
    CHECK(q->free(f.at(0), 1000, true, sim_stream{}, freed_by_pool, log));
    CHECK(q->blocks() == 0);
    CHECK(f.sim.calls(sim_op::memset_async) == 0);  // not poisoned either
    CHECK(log.entries.empty());
  }

  TEST_CASE("no poison while a graph is being captured")
  {
    fixture f;
    device_buffer<sim_runtime> buf{f.sim, 1024};
    auto q = f.make(options(4, std::size_t{1} << 30, 0xfd));
    give_back_log log;
    f.captures = 1;
    CHECK(q->free(buf.p, 1024, true, sim_stream{}, admit_all(), log));
    CHECK(f.sim.calls(sim_op::memset_async) == 0);
    CHECK(q->blocks() == 1);
    f.captures = 0;
    q->flush_all(log);
    CHECK(pointers(log.entries) == std::vector<void*>{buf.p});
  }

  TEST_CASE("a poison that fails quarantines nothing")
  {
    fixture f;
    device_buffer<sim_runtime> buf{f.sim, 1024};
    auto q = f.make(options(4, std::size_t{1} << 30, 0xfd));
    give_back_log log;
    f.sim.inject_fault(sim_op::memset_async, 1, f.sim.launch_failure);
    CHECK_THROWS_AS(q->free(buf.p, 1024, true, sim_stream{}, admit_all(), log), gpukit::cuda_error);
    CHECK(q->blocks() == 0);
    CHECK(q->free(buf.p, 1024, true, sim_stream{}, admit_all(), log));  // not a double free
    CHECK(q->blocks() == 1);
  }

  TEST_CASE("flush gives back the frees of one stream and flush_all every one oldest first")
  {
    fixture f;
    stream_holder<sim_runtime> a{f.sim}, b{f.sim};
    auto q = f.make(options(100));
    give_back_log none;
    CHECK(q->free(f.at(0), 1000, true, a, admit_all(), none));
    CHECK(q->free(f.at(1), 1000, true, b, admit_all(), none));
    CHECK(q->free(f.at(2), 1000, true, a, admit_all(), none));
    CHECK(q->free(f.at(3), 1000, true, b, admit_all(), none));
    CHECK(none.entries.empty());
    give_back_log on_a;
    q->flush(a, on_a);
    CHECK(pointers(on_a.entries) == std::vector<void*>{f.at(0), f.at(2)});
    CHECK(q->blocks() == 2);
    give_back_log rest;
    q->flush_all(rest);
    CHECK(pointers(rest.entries) == std::vector<void*>{f.at(1), f.at(3)});
    CHECK(q->blocks() == 0);
  }

  TEST_CASE("a give-back that fails leaves that free and the later ones at the front in order")
  {
    fixture f;
    SUBCASE("a flush rethrows")
    {
      auto q = f.make(options(100));
      give_back_log none;
      for (std::size_t i = 0; i < 4; ++i) {
        CHECK(q->free(f.at(i), 1000, true, sim_stream{}, admit_all(), none));
      }
      std::vector<void*> given;
      auto fail_third = [&](entry const& e) {
        if (e.ptr == f.at(2)) { throw std::runtime_error{"free failed"}; }
        given.push_back(e.ptr);
      };
      CHECK_THROWS_AS(q->flush_all(fail_third), std::runtime_error);
      CHECK(quarantine::releasing() == nullptr);
      CHECK(given == std::vector<void*>{f.at(0), f.at(1)});
      CHECK(q->blocks() == 2);
      CHECK_THROWS_WITH_AS(q->free(f.at(3), 1000, true, sim_stream{}, admit_all(), none),
                           doctest::Contains("double free"), gpukit::logic_error);
      give_back_log rest;
      q->flush_all(rest);
      CHECK(pointers(rest.entries) == std::vector<void*>{f.at(2), f.at(3)});
    }
    SUBCASE("a free swallows it: the free itself happened")
    {
      auto q    = f.make(options(1));
      auto fail = [](entry const&) { throw std::runtime_error{"free failed"}; };
      CHECK(q->free(f.at(0), 1000, true, sim_stream{}, admit_all(), fail));
      CHECK(q->free(f.at(1), 1000, true, sim_stream{}, admit_all(), fail));
      CHECK(q->blocks() == 2);  // f.at(0) is back in front of f.at(1)
      give_back_log rest;
      q->flush_all(rest);
      CHECK(pointers(rest.entries) == std::vector<void*>{f.at(0), f.at(1)});
    }
  }

  TEST_CASE("check_free: the pool's books say which frees are good")
  {
    fixture f;
    auto q = f.make(options(4));
    block b;
    b.ptr.store(reinterpret_cast<std::uintptr_t>(f.at(0)));
    b.size      = 1024;
    b.requested = 1000;
    b.state.store(gpukit::detail::block_state::allocated);
    CHECK(q->check_free(&b, f.at(0), 1000, true) == 1024);
    CHECK(q->check_free(&b, f.at(0), 0, false) == 1024);
    CHECK_THROWS_WITH_AS((void)q->check_free(&b, f.at(0), 999, true),
                         doctest::Contains("was allocated with 1000 bytes but freed with 999"),
                         gpukit::logic_error);
    CHECK_THROWS_WITH_AS((void)q->check_free(nullptr, f.at(1), 1000, true),
                         doctest::Contains("was not allocated by this allocator (device 0)"),
                         gpukit::logic_error);
    b.state.store(gpukit::detail::block_state::free);
    CHECK_THROWS_WITH_AS(
      (void)q->check_free(&b, f.at(0), 1000, true),
      doctest::Contains("(a block of 1024 bytes that is already free, device 0)"),
      gpukit::logic_error);
  }

  TEST_CASE(
    "settle_debug_mode: guard pages need growable segments and annotation settles the source")
  {
    using gpukit::segment_source;
    using gpukit::detail::caching::settle_debug_mode;
    gpukit::caching_allocator_options o;
    o.debug.enabled     = false;
    o.nvtx_annotate     = false;
    bool stream_ordered = false;
    bool growable       = false;
    o.source            = segment_source::synchronous;
    o.debug.guard_pages = true;
    CHECK_THROWS_WITH_AS(settle_debug_mode(o, stream_ordered, growable),
                         doctest::Contains("needs segment_source::growable (guard pages are "
                                           "unmapped virtual memory), but source is "
                                           "segment_source::synchronous"),
                         gpukit::logic_error);

    o.source              = segment_source::growable;
    o.nvtx_annotate       = true;
    o.growable_page_bytes = std::size_t{32} << 20;
    growable              = true;
    CHECK(settle_debug_mode(o, stream_ordered, growable));
    CHECK(o.debug.enabled);
    CHECK_FALSE(o.nvtx_annotate);  // a tool rejects annotation over virtual memory
    CHECK(o.growable_page_bytes == 1);
    CHECK(growable);

    gpukit::caching_allocator_options a;
    a.source                   = segment_source::stream_ordered;
    a.nvtx_annotate            = true;
    a.debug.enabled            = true;
    a.debug.sanitizer_segments = true;
    stream_ordered             = true;
    growable                   = false;
    CHECK_FALSE(settle_debug_mode(a, stream_ordered, growable));
    CHECK_FALSE(stream_ordered);  // synchronous segments, which the tool sees
    CHECK(a.nvtx_annotate);

    a.debug.enabled = false;
    stream_ordered  = true;
    CHECK_FALSE(settle_debug_mode(a, stream_ordered, growable));
    CHECK(stream_ordered);
    CHECK_FALSE(a.nvtx_annotate);
  }
}
