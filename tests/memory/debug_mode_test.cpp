// SPDX-License-Identifier: Apache-2.0
// The caching allocator's debug mode on the simulated GPU: poisoning of freed blocks, the
// quarantine (reuse delayed, double frees caught while a block waits in it), the GPUKIT_DEBUG
// switch, and the segment source it takes when a sanitizer is attached.
#include "support/caching_allocator.hpp"

#include <gpukit/memory/caching_allocator.hpp>
#include <gpukit/runtime/sim_runtime.hpp>

#include <doctest/doctest.h>

#include <cstdlib>
#include <vector>

using namespace gpukit::test;  // sim_allocator, sim_stream, one_device, mib, gib
using gpukit::sim_op;
using gpukit::sim_runtime;

namespace {

sim_runtime make_sim() { return sim_runtime{gpukit::sim_config{}.with_devices(1, 16 * gib)}; }

// A simulated GPU and a stream; an allocator declared after it goes first.
struct sim_and_stream {
  sim_runtime sim = make_sim();
  sim_stream s{};
  sim_and_stream() { GPUKIT_CUDA_TRY(sim.stream_create(s)); }
  ~sim_and_stream() { (void)sim.stream_destroy(s); }
  sim_and_stream(sim_and_stream const&)            = delete;
  sim_and_stream& operator=(sim_and_stream const&) = delete;
};

gpukit::caching_allocator_options debug_options(std::size_t quarantine_blocks = 4)
{
  gpukit::caching_allocator_options o;
  o.nvtx_annotate           = false;
  o.source                  = gpukit::segment_source::synchronous;
  o.debug.enabled           = true;
  o.debug.quarantine_blocks = quarantine_blocks;
  o.debug.quarantine_bytes  = std::size_t{1} << 30;
  return o;
}

std::vector<unsigned char> read_back(sim_runtime& sim, void const* p, std::size_t n, sim_stream s)
{
  std::vector<unsigned char> host(n);
  GPUKIT_CUDA_TRY(sim.memcpy_async(host.data(), p, n, gpukit::memcpy_kind::device_to_host, s));
  GPUKIT_CUDA_TRY(sim.stream_synchronize(s));
  return host;
}

}  // namespace

TEST_SUITE("caching_allocator_debug")
{
  TEST_CASE("debug mode poisons a freed block in the freeing stream's order")
  {
    sim_and_stream f;
    auto& sim = f.sim;
    auto s    = f.s;
    sim_allocator alloc{sim, 0, debug_options()};
    void* p = alloc.allocate_async(1000, s);
    GPUKIT_CUDA_TRY(sim.memset_async(p, 0x11, 1000, s));
    alloc.deallocate_async(p, 1000, s);
    auto const bytes = read_back(sim, p, 1024, s);
    for (unsigned char c : bytes) { REQUIRE(c == 0xfd); }
    alloc.forget_stream(s);
  }

  TEST_CASE("without debug mode a freed block keeps its bytes")
  {
    sim_and_stream f;
    auto& sim       = f.sim;
    auto s          = f.s;
    auto o          = debug_options();
    o.debug.enabled = false;
    sim_allocator alloc{sim, 0, o};
    void* p = alloc.allocate_async(1000, s);
    GPUKIT_CUDA_TRY(sim.memset_async(p, 0x11, 1000, s));
    alloc.deallocate_async(p, 1000, s);
    auto const bytes = read_back(sim, p, 1000, s);
    for (unsigned char c : bytes) { REQUIRE(c == 0x11); }
    CHECK(alloc.debug_quarantined_blocks() == 0);
    alloc.forget_stream(s);
  }

  TEST_CASE("the quarantine delays reuse and catches a double free inside it")
  {
    sim_and_stream f;
    auto& sim = f.sim;
    auto s    = f.s;
    sim_allocator alloc{sim, 0, debug_options(4)};
    void* p = alloc.allocate_async(1000, s);
    alloc.deallocate_async(p, 1000, s);
    CHECK(alloc.debug_quarantined_blocks() == 1);
    void* q = alloc.allocate_async(1000, s);
    CHECK(q != p);  // without the quarantine the same block comes straight back
    CHECK_THROWS_WITH_AS(alloc.deallocate_async(p, 1000, s), doctest::Contains("double free"),
                         gpukit::logic_error);
    CHECK(alloc.debug_quarantined_blocks() == 1);  // the failed free changed nothing
    alloc.deallocate_async(q, 1000, s);
    // Past its capacity the oldest blocks (p, then q) go back to the pool and are reused.
    std::vector<void*> more;
    for (int i = 0; i < 4; ++i) { more.push_back(alloc.allocate_async(1000, s)); }
    for (void* m : more) { alloc.deallocate_async(m, 1000, s); }
    CHECK(alloc.debug_quarantined_blocks() == 4);
    void* r = alloc.allocate_async(1000, s);
    CHECK((r == p || r == q));
    alloc.deallocate_async(r, 1000, s);
    alloc.forget_stream(s);  // hands the stream's quarantined blocks back while it lives
    CHECK(alloc.debug_quarantined_blocks() == 0);
  }

  TEST_CASE("a size mismatch and a foreign pointer are refused before the quarantine")
  {
    sim_and_stream f;
    auto& sim = f.sim;
    auto s    = f.s;
    sim_allocator alloc{sim, 0, debug_options()};
    void* p = alloc.allocate_async(1000, s);
    CHECK_THROWS_WITH_AS(alloc.deallocate_async(p, 999, s), doctest::Contains("999"),
                         gpukit::logic_error);
    int local = 0;
    CHECK_THROWS_WITH_AS(alloc.deallocate_async(&local, 4, s),
                         doctest::Contains("not allocated by this allocator"), gpukit::logic_error);
    CHECK(alloc.debug_quarantined_blocks() == 0);
    alloc.deallocate_async(p, 1000, s);
    alloc.forget_stream(s);
  }

  TEST_CASE("debug mode with annotation takes synchronous segments whatever the source")
  {
    for (auto source : {gpukit::segment_source::stream_ordered, gpukit::segment_source::growable}) {
      sim_runtime sim = make_sim();
      auto o          = debug_options();
      o.source        = source;
      o.nvtx_annotate = true;
      {
        sim_allocator alloc{sim, 0, o};
        void* p = alloc.allocate_async(1000, sim_stream{});
        alloc.deallocate_async(p, 1000, sim_stream{});
      }
      CHECK(sim.calls(sim_op::malloc) == 1);
      CHECK(sim.calls(sim_op::malloc_async) == 0);
      CHECK(sim.calls(sim_op::vm_reserve) == 0);
      // Without debug mode the source stays, and the annotation the tool would reject is off.
      sim.reset_counters();
      o.debug.enabled = false;
      sim_allocator plain{sim, 0, o};
      CHECK_FALSE(plain.options().nvtx_annotate);
      void* p = plain.allocate_async(1000, sim_stream{});
      plain.deallocate_async(p, 1000, sim_stream{});
      CHECK(sim.calls(sim_op::malloc) == 0);
    }
  }

  TEST_CASE("GPUKIT_DEBUG turns debug mode on")
  {
    CHECK_FALSE(gpukit::detail::env_switch_on(nullptr));
    for (char const* off : {"", "0", "false", "OFF", "No"}) {
      CHECK_FALSE(gpukit::detail::env_switch_on(off));
    }
    for (char const* on : {"1", "true", "yes", "ON", "2", "verbose-and-long"}) {
      CHECK(gpukit::detail::env_switch_on(on));
    }
    ::setenv("GPUKIT_DEBUG", "1", 1);
    CHECK(gpukit::caching_allocator_options{}.debug.enabled);
    ::setenv("GPUKIT_DEBUG", "0", 1);
    CHECK_FALSE(gpukit::caching_allocator_options{}.debug.enabled);
    ::unsetenv("GPUKIT_DEBUG");
  }
}
