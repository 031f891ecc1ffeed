// SPDX-License-Identifier: Apache-2.0
// Every kind of error gpukit throws, provoked through public API on the simulated GPU, and its
// message read as a user reads it: one "gpukit: " prefix at the start, the offending value named,
// and, unless GPUKIT_ERROR_LOCATIONS is on (debug builds), no source file, header path or C++
// condition text.
#include "support/caching_allocator.hpp"
#include "support/sim_gpu.hpp"

#include <gpukit/checkpoint/planners.hpp>
#include <gpukit/error_macros.hpp>
#include <gpukit/host/pinned_pool.hpp>
#include <gpukit/memory/adaptors/limiting_resource_adaptor.hpp>
#include <gpukit/memory/adaptors/tracking_resource_adaptor.hpp>
#include <gpukit/memory/alloc_conf.hpp>
#include <gpukit/memory/caching_allocator.hpp>
#include <gpukit/memory/malloc_async_resource.hpp>
#include <gpukit/runtime/sim_runtime.hpp>
#include <gpukit/transfer/transfer_pipeline.hpp>

#include <doctest/doctest.h>

#include <cstddef>
#include <initializer_list>
#include <limits>
#include <string>
#include <typeinfo>
#include <vector>

using namespace gpukit::test;  // sim_allocator, sim_stream, one_device, mib, gib
using gpukit::sim_op;
using gpukit::sim_runtime;

namespace {

using sim_pool     = gpukit::basic_pinned_pool<sim_runtime>;
using sim_pipeline = gpukit::basic_transfer_pipeline<sim_runtime>;

bool contains(std::string const& text, std::string const& part)
{
  return text.find(part) != std::string::npos;
}

std::size_t count(std::string const& text, std::string const& part)
{
  std::size_t n = 0;
  for (auto at = text.find(part); at != std::string::npos; at = text.find(part, at + 1)) { ++n; }
  return n;
}

/// What source text looks like; none of it belongs in a release build's message. ("::" alone is
/// allowed: members a user calls are named as in the API, e.g. pinned_pool::allocate.)
constexpr char const* source_text[] = {
  "include/",    ".hpp",  ".inl",      ".cpp",    "__FILE__",   "__LINE__", "precondition `",
  "status is `", "!= ",   "== ",       "&&",      "||",         "nullptr",  "gpukit::",
  "detail::",    "std::", "Runtime::", "_locked", "static_cast"};

/// Checks the rules every message keeps; `values` are what the message must name.
void check_message(std::string const& what, std::initializer_list<std::string> values)
{
  CAPTURE(what);
  CHECK(what.rfind("gpukit: ", 0) == 0);
  CHECK(count(what, "gpukit: ") == 1);
  CHECK_FALSE(contains(what, "gpukit: gpukit"));
  CHECK_FALSE(contains(what, "gpukit_torch: "));
#if !GPUKIT_ERROR_LOCATIONS
  for (char const* s : source_text) {
    CAPTURE(s);
    CHECK_FALSE(contains(what, s));
  }
#endif
  for (auto const& v : values) {
    CAPTURE(v);
    CHECK(contains(what, v));
  }
}

/// The message of the exception of exactly type E that `f` throws ("" after a failed check when
/// it throws nothing or another type).
template <class E, class F>
std::string message_of(F&& f)
{
  try {
    f();
  } catch (E const& e) {
    CHECK(typeid(e) == typeid(E));
    return e.what();
  } catch (std::exception const& e) {
    FAIL_CHECK("threw " << typeid(e).name() << " instead: " << e.what());
    return "";
  }
  FAIL_CHECK("did not throw " << typeid(E).name());
  return "";
}

sim_stream new_stream(sim_runtime& sim)
{
  sim_stream s{};
  GPUKIT_CUDA_TRY(sim.stream_create(s));
  return s;
}

gpukit::checkpoint_chain small_chain()
{
  return gpukit::checkpoint_chain::uniform(8, gpukit::checkpoint_stage{1, 2, 100, 100});
}

}  // namespace

TEST_SUITE("error")
{
  TEST_CASE("messages: cuda_error for a failed runtime call names the call and the error")
  {
    sim_runtime sim{one_device(gib)};
    gpukit::pinned_pool_options o;
    o.growth = gpukit::pinned_growth::host_alloc;
    sim_pool pool{sim, o};
    sim.inject_fault(sim_op::host_alloc, 1, cudaErrorMemoryAllocation);
    check_message(message_of<gpukit::cuda_error>([&] { (void)pool.allocate(mib); }),
                  {"host_alloc", "cudaErrorMemoryAllocation"});
  }

  TEST_CASE(
    "messages: a destroyed stream is named as such with what to do and keeps its runtime error")
  {
    sim_runtime sim{one_device(gib)};
    sim_allocator alloc{sim, 0};
    sim_stream const s = new_stream(sim);
    GPUKIT_CUDA_TRY(sim.stream_destroy(s));
    try {
      (void)alloc.allocate_async(mib, s);
      FAIL("a destroyed stream was accepted");
    } catch (gpukit::cuda_error const& e) {
      CHECK(e.code() == cudaErrorInvalidResourceHandle);
      CHECK(std::string{e.name()} == "cudaErrorInvalidResourceHandle");
      std::string const what = e.what();
      check_message(what, {"allocate_async", "is not a live stream of device 0", "destroyed",
                           "cudaErrorInvalidResourceHandle"});
      CHECK_FALSE(contains(what, "stream_is_capturing"));
      CHECK_FALSE(contains(what, "stream_get_device"));
    }
  }

  TEST_CASE("messages: the caching allocator's refusals name the value and the device")
  {
    sim_runtime sim{one_device(gib)};
    sim_allocator alloc{sim, 0};
    check_message(message_of<gpukit::logic_error>([&] { (void)alloc.allocate_async(0, {}); }),
                  {"0 bytes", "device 0"});

    int on_stack = 0;
    check_message(message_of<gpukit::logic_error>([&] { alloc.deallocate_async(&on_stack, {}); }),
                  {gpukit::detail::hex(&on_stack), "device 0"});

    void* p = alloc.allocate_async(mib, {});
    alloc.deallocate_async(p, {});
    check_message(message_of<gpukit::logic_error>([&] { alloc.deallocate_async(p, {}); }),
                  {"double free", gpukit::detail::hex(p)});

    std::size_t const absurd = std::numeric_limits<std::size_t>::max();
    check_message(message_of<gpukit::bad_alloc>([&] { (void)alloc.allocate_async(absurd, {}); }),
                  {std::to_string(absurd), std::to_string(gib)});
  }

  TEST_CASE("messages: a limit and a full device name the request and what is there")
  {
    sim_runtime sim{one_device(64 * mib)};
    gpukit::caching_allocator_options limited;
    limited.limit_bytes = 16 * mib;
    sim_allocator small{sim, 0, limited};
    std::string const over_limit =
      message_of<gpukit::out_of_memory>([&] { (void)small.allocate_async(32 * mib, {}); });
    check_message(over_limit, {std::to_string(32 * mib), "limit"});

    sim_allocator alloc{sim, 0};
    void* held = alloc.allocate_async(48 * mib, {});
    std::string full =
      message_of<gpukit::out_of_memory>([&] { (void)alloc.allocate_async(48 * mib, {}); });
    check_message(full, {"out of memory on device 0", std::to_string(48 * mib), "hint: "});
    alloc.deallocate_async(held, {});
  }

  TEST_CASE("messages: the resource adaptors' refusals name the request, the limit and the block")
  {
    sim_runtime sim{one_device(64 * mib)};
    sim_allocator alloc{sim, 0};
    gpukit::limiting_resource_adaptor limited{alloc, mib};
    void* held = limited.allocate_async(600 * kib, {});
    check_message(
      message_of<gpukit::out_of_memory>([&] { (void)limited.allocate_async(500 * kib, {}); }),
      {std::to_string(500 * kib), std::to_string(mib), std::to_string(600 * kib), "limit"});
    limited.deallocate_async(held, 600 * kib, {});

    gpukit::tracking_resource_adaptor tracked{alloc};
    void* mine   = tracked.allocate_async(1024, {});
    int on_stack = 0;
    check_message(
      message_of<gpukit::logic_error>([&] { tracked.deallocate_async(&on_stack, 4, {}); }),
      {gpukit::detail::hex(&on_stack), "not allocated through this adaptor"});
    check_message(
      message_of<gpukit::logic_error>([&] { tracked.deallocate_async(mine, 1000, {}); }),
      {gpukit::detail::hex(mine), "1000 bytes", "1024 bytes"});
    tracked.deallocate_async(mine, 1024, {});

    gpukit::basic_malloc_async_resource<sim_runtime> mr{sim, 0};
    check_message(message_of<gpukit::logic_error>([&] { (void)mr.allocate(64, 512); }),
                  {"alignment 512", "256"});
    void* big = mr.allocate(48 * mib);
    check_message(message_of<gpukit::out_of_memory>([&] { (void)mr.allocate(32 * mib); }),
                  {"out of memory on device 0", std::to_string(32 * mib), "hint: "});
    mr.deallocate(big, 48 * mib);
  }

  TEST_CASE("messages: bad options and alloc conf entries name the key and the value")
  {
    sim_runtime sim{one_device(gib)};
    gpukit::pinned_pool_options bad_pool;
    bad_pool.pin_threads = -3;
    check_message(message_of<gpukit::logic_error>([&] {
                    sim_pool pool{sim, bad_pool};
                  }),
                  {"pin_threads", "-3"});

    check_message(
      message_of<gpukit::logic_error>([] { (void)gpukit::parse_alloc_conf("no_such_key:1"); }),
      {"no_such_key"});
    check_message(
      message_of<gpukit::logic_error>([] { (void)gpukit::parse_alloc_conf("segments:sideways"); }),
      {"sideways", "segments"});
    check_message(message_of<gpukit::logic_error>(
                    [] { (void)gpukit::parse_alloc_conf("limit:1MiB,limit:2MiB"); }),
                  {"limit", "twice"});
    check_message(
      message_of<gpukit::logic_error>([] { (void)gpukit::parse_alloc_conf_size("20 parsecs"); }),
      {"20 parsecs"});
  }

  TEST_CASE("messages: the pinned pool's and the pipeline's refusals name the value")
  {
    sim_runtime sim{one_device(gib)};
    gpukit::pinned_pool_options limited;
    limited.limit_bytes = 4 * mib;
    sim_pool pool{sim, limited};
    check_message(message_of<gpukit::logic_error>([&] { (void)pool.allocate(0); }),
                  {"pinned_pool::allocate", "0 bytes"});
    check_message(message_of<gpukit::bad_alloc>([&] { (void)pool.allocate(64 * mib); }),
                  {"pinned_pool::allocate", std::to_string(64 * mib), std::to_string(4 * mib)});
    std::size_t const absurd = std::numeric_limits<std::size_t>::max();
    check_message(message_of<gpukit::bad_alloc>([&] { (void)pool.allocate(absurd); }),
                  {std::to_string(absurd)});

    gpukit::transfer_options no_chunks;
    no_chunks.chunk_bytes = 0;
    check_message(message_of<gpukit::logic_error>([&] {
                    sim_pipeline p{sim, pool, no_chunks};
                  }),
                  {"chunk_bytes", "0"});
    sim_pipeline pipe{sim, pool};
    std::vector<char> host(16);
    int device_word = 0;
    check_message(message_of<gpukit::logic_error>(
                    [&] { pipe.copy_to_device_async(&device_word, host.data(), 0, {}); }),
                  {"0 bytes"});
  }

  TEST_CASE("messages: the planners' refusals name the budget and what would fit")
  {
    gpukit::checkpoint_chain const chain = small_chain();
    std::int64_t const least             = gpukit::optimal_min_budget(chain);
    std::string const infeasible         = message_of<gpukit::checkpoint_infeasible>(
      [&] { (void)gpukit::plan_optimal(chain, least - 1); });
    check_message(infeasible, {std::to_string(least - 1), std::to_string(least)});

    check_message(message_of<gpukit::logic_error>([] {
                    (void)gpukit::checkpoint_chain{gpukit::checkpoint_stage{-5, 1, 1, 1}};
                  }),
                  {"-5"});
    check_message(message_of<gpukit::logic_error>([&] { (void)gpukit::plan_sequential(chain, 0); }),
                  {"0"});
  }

  TEST_CASE("messages: GPUKIT_EXPECTS and GPUKIT_FAIL in this build")
  {
    std::size_t const bytes = 0;
    std::string const expects =
      message_of<gpukit::logic_error>([&] { GPUKIT_EXPECTS(bytes > 0, "upload of 0 bytes"); });
    check_message(expects, {"upload of 0 bytes"});
    std::string const fail = message_of<gpukit::logic_error>([] { GPUKIT_FAIL("dtype 7"); });
    check_message(fail, {"dtype 7"});
#if GPUKIT_ERROR_LOCATIONS
    CHECK(contains(expects, "precondition `bytes > 0` failed at "));
    CHECK(contains(expects, __FILE__));
    CHECK(contains(fail, __FILE__));
#else
    CHECK(expects == "gpukit: upload of 0 bytes");
    CHECK(fail == "gpukit: dtype 7");
#endif
  }
}
