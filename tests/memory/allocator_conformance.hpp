// SPDX-License-Identifier: Apache-2.0
// tests/memory/allocator_conformance.hpp: the caching allocator conformance suite. Every segment
// source (synchronous, stream-ordered, growable) on every runtime (simulated and CUDA) runs the
// same cases, so that what passes on the simulator in CI means the same thing on a GPU.
//
// Use: in a doctest TU, after including the runtime,
//
//   GPUKIT_ALLOCATOR_CONFORMANCE_CASES(gpukit::cuda_runtime::instance(), "cuda_runtime", 8, 2000,
//                                      std::size_t{64} << 20)
//
// defines one TEST_CASE per source and `check_*` below, named "<prefix>, <source> segments:
// <what>"; the last three arguments size the stress case (threads, iterations each, largest
// request). `runtime_expr` is evaluated once per case and bound with `auto&&`: an lvalue (a shared
// runtime) or a prvalue (a fresh one per case, e.g. `gpukit::sim_runtime{config}`) both work.
//
// Each check function takes a Runtime and the allocator's options (the source among them) and
// builds its own allocator, so a test may also call one directly with options of its own.
#pragma once

#include <gpukit/memory/caching_allocator.hpp>
#include <gpukit/memory/detail/allocator_invariants.hpp>

#include <doctest/doctest.h>

#include <atomic>
#include <cstdint>
#include <cstring>
#include <random>
#include <thread>
#include <vector>

namespace gpukit::test {

// Fills [p, p + bytes) with `value` on `s` and checks it by copying it back: proves the memory is
// usable and that no other live block overlaps it (every live block has its own value).
template <class Runtime>
void fill(Runtime& rt, void* p, std::size_t bytes, unsigned char value,
          typename Runtime::stream_type s)
{
  GPUKIT_CUDA_TRY(rt.memset_async(p, value, bytes, s));
}

template <class Runtime>
bool holds(Runtime& rt, void* p, std::size_t bytes, unsigned char value,
           typename Runtime::stream_type s)
{
  // Check the first and last 4 KiB and a middle sample: enough to catch an overlap, cheap for large
  // blocks.
  std::vector<unsigned char> h(std::min<std::size_t>(bytes, 4096));
  auto check_at = [&](std::size_t off) {
    std::size_t const n = std::min(h.size(), bytes - off);
    GPUKIT_CUDA_TRY(
      rt.memcpy_async(h.data(), static_cast<char*>(p) + off, n, memcpy_kind::device_to_host, s));
    GPUKIT_CUDA_TRY(rt.stream_synchronize(s));
    for (std::size_t i = 0; i < n; ++i) {
      if (h[i] != value) { return false; }
    }
    return true;
  };
  return check_at(0) && check_at(bytes - std::min(h.size(), bytes)) &&
         check_at(bytes / 2 - std::min(bytes / 2, h.size() / 2));
}

template <class Runtime>
void check_alloc_roundtrip(Runtime& rt, caching_allocator_options const& options = {})
{
  basic_caching_allocator<Runtime> alloc{rt, 0, options};
  typename Runtime::stream_type s{};
  GPUKIT_CUDA_TRY(rt.stream_create(s));
  for (std::size_t bytes :
       {std::size_t{1}, std::size_t{255}, std::size_t{256}, std::size_t{4097}, std::size_t{1} << 20,
        (std::size_t{3} << 20) + 7, std::size_t{64} << 20}) {
    void* p = alloc.allocate_async(bytes, s);
    REQUIRE(p != nullptr);
    CHECK(reinterpret_cast<std::uintptr_t>(p) % 256 == 0);
    fill(rt, p, bytes, 0x5a, s);
    CHECK(holds(rt, p, bytes, 0x5a, s));
    alloc.deallocate_async(p, bytes, s);
  }
  auto const st = alloc.stats();
  CHECK(st.allocated_bytes.current == 0);
  CHECK(st.allocation_count.current == 0);
  CHECK(st.reserved_bytes.current > 0);
  CHECK(st.num_allocs == 7);
  CHECK(st.num_frees == 7);
  CHECK(gpukit::detail::check_invariants(alloc) == "");
  alloc.forget_stream(s);
  CHECK(alloc.release() > 0);
  CHECK(alloc.stats().reserved_bytes.current == 0);
  CHECK(gpukit::detail::check_invariants(alloc) == "");
  GPUKIT_CUDA_TRY(rt.stream_destroy(s));
}

template <class Runtime>
void check_same_stream_reuse(Runtime& rt, caching_allocator_options const& options = {})
{
  basic_caching_allocator<Runtime> alloc{rt, 0, options};
  typename Runtime::stream_type s{};
  GPUKIT_CUDA_TRY(rt.stream_create(s));
  void* p = alloc.allocate_async(65536, s);
  alloc.deallocate_async(p, 65536, s);
  for (int i = 0; i < 1000; ++i) {
    void* q = alloc.allocate_async(65536, s);
    CHECK(q == p);  // freed on s: reusable on s at once
    alloc.deallocate_async(q, 65536, s);
  }
  auto const st = alloc.stats();
  CHECK(st.num_device_allocs == 1);
  CHECK(st.num_cache_hits >= 1000);
  alloc.forget_stream(s);
  GPUKIT_CUDA_TRY(rt.stream_destroy(s));
}

template <class Runtime>
void check_bad_input(Runtime& rt, caching_allocator_options const& options = {})
{
  basic_caching_allocator<Runtime> alloc{rt, 0, options};
  typename Runtime::stream_type s{};
  GPUKIT_CUDA_TRY(rt.stream_create(s));
  CHECK_THROWS_AS((void)alloc.allocate_async(0, s), gpukit::logic_error);
  device_properties props;
  GPUKIT_CUDA_TRY(rt.get_device_properties(props, 0));
  CHECK_THROWS_AS((void)alloc.allocate_async(props.total_memory + 1, s), gpukit::bad_alloc);
  CHECK_THROWS_AS((void)alloc.allocate_async(~std::size_t{0}, s), gpukit::bad_alloc);
  void* p      = alloc.allocate_async(1000, s);
  int on_stack = 0;
  try {
    alloc.deallocate_async(&on_stack, 4, s);
    FAIL("freeing a foreign pointer must throw");
  } catch (gpukit::logic_error const& e) {
    CHECK(std::string{e.what()}.find("was not allocated by this allocator") != std::string::npos);
  }
  // Inside a block, not at its start.
  CHECK_THROWS_AS(alloc.deallocate_async(static_cast<char*>(p) + 256, 744, s), gpukit::logic_error);
  try {
    alloc.deallocate_async(p, 999, s);
    FAIL("a wrong size must throw");
  } catch (gpukit::logic_error const& e) {
    CHECK(std::string{e.what()}.find("allocated with 1000 bytes but freed with 999") !=
          std::string::npos);
  }
  CHECK(alloc.stats().allocation_count.current == 1);  // the failed frees changed nothing
  alloc.deallocate_async(p, 1000, s);
  try {
    alloc.deallocate_async(p, 1000, s);
    FAIL("a double free must throw");
  } catch (gpukit::logic_error const& e) {
    CHECK(std::string{e.what()}.find("double free") != std::string::npos);
  }
  CHECK_THROWS_AS((void)alloc.allocate(8, 512), gpukit::logic_error);  // alignment beyond 256
  alloc.deallocate_async(nullptr, 0, s);                               // ignored, as free(nullptr)
  CHECK(alloc.stats().allocation_count.current == 0);
  CHECK(gpukit::detail::check_invariants(alloc) == "");
  // Still fully usable.
  void* q = alloc.allocate_async(1000, s);
  CHECK(q == p);
  alloc.deallocate_async(q, 1000, s);
  alloc.forget_stream(s);
  GPUKIT_CUDA_TRY(rt.stream_destroy(s));
}

template <class Runtime>
void check_limit_and_oom_report(Runtime& rt, caching_allocator_options o = {})
{
  o.limit_bytes = std::size_t{64} << 20;
  basic_caching_allocator<Runtime> alloc{rt, 0, o};
  typename Runtime::stream_type s{};
  GPUKIT_CUDA_TRY(rt.stream_create(s));
  std::vector<void*> live;
  for (int i = 0; i < 6; ++i) { live.push_back(alloc.allocate_async(std::size_t{10} << 20, s)); }
  try {
    (void)alloc.allocate_async(std::size_t{10} << 20, s);
    FAIL("the limit must stop this allocation");
  } catch (gpukit::out_of_memory const& e) {
    auto const& r = e.report();
    CHECK(r.requested == (std::size_t{10} << 20));
    CHECK(r.limit == (std::size_t{64} << 20));
    CHECK(r.allocated == (std::size_t{60} << 20));
    CHECK(r.reserved <= r.limit);
    CHECK(r.device == 0);
    CHECK(r.hint.find("limit") != std::string::npos);
    CHECK(std::string{e.what()}.find("out of memory on device 0") != std::string::npos);
  }
  CHECK(alloc.stats().num_ooms == 1);
  CHECK(gpukit::detail::check_invariants(alloc) == "");
  for (void* p : live) { alloc.deallocate_async(p, std::size_t{10} << 20, s); }
  // Freed memory comes back under the limit.
  void* big = alloc.allocate_async(std::size_t{40} << 20, s);
  alloc.deallocate_async(big, std::size_t{40} << 20, s);
  alloc.forget_stream(s);
  alloc.release();
  CHECK(alloc.stats().reserved_bytes.current == 0);
  GPUKIT_CUDA_TRY(rt.stream_destroy(s));
}

// Threads x streams x random sizes; every block holds its own byte value, checked before its free.
template <class Runtime>
void check_stress(Runtime& rt, int threads, int iterations, std::size_t max_bytes,
                  caching_allocator_options const& options = {})
{
  basic_caching_allocator<Runtime> alloc{rt, 0, options};
  std::vector<typename Runtime::stream_type> streams(static_cast<std::size_t>(threads));
  for (auto& s : streams) { GPUKIT_CUDA_TRY(rt.stream_create(s)); }
  std::atomic<int> failures{0};
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      GPUKIT_CUDA_TRY(rt.set_device(0));
      std::mt19937_64 rng(static_cast<std::uint64_t>(t) * 7919u + 1u);
      std::uniform_real_distribution<double> lu(std::log(256.0),
                                                std::log(static_cast<double>(max_bytes)));
      struct live_block {
        void* p;
        std::size_t bytes;
        unsigned char value;
        int stream;
      };
      std::vector<live_block> live;
      for (int i = 0; i < iterations; ++i) {
        bool const do_alloc = live.empty() || (live.size() < 64 && rng() % 2 == 0);
        if (do_alloc) {
          auto const bytes = static_cast<std::size_t>(std::exp(lu(rng)));
          int const si     = static_cast<int>(rng() % 2 == 0 ? t : (t + 1) % threads);
          auto const value = static_cast<unsigned char>(rng() % 251 + 1);
          void* p          = alloc.allocate_async(bytes, streams[static_cast<std::size_t>(si)]);
          fill(rt, p, bytes, value, streams[static_cast<std::size_t>(si)]);
          live.push_back({p, bytes, value, si});
        } else {
          std::size_t const k = rng() % live.size();
          auto const b        = live[k];
          if (!holds(rt, b.p, b.bytes, b.value, streams[static_cast<std::size_t>(b.stream)])) {
            ++failures;
          }
          alloc.deallocate_async(b.p, b.bytes, streams[static_cast<std::size_t>(b.stream)]);
          live[k] = live.back();
          live.pop_back();
        }
      }
      for (auto const& b : live) {
        if (!holds(rt, b.p, b.bytes, b.value, streams[static_cast<std::size_t>(b.stream)])) {
          ++failures;
        }
        alloc.deallocate_async(b.p, b.bytes, streams[static_cast<std::size_t>(b.stream)]);
      }
    });
  }
  for (auto& th : pool) { th.join(); }
  CHECK(failures.load() == 0);
  auto const st = alloc.stats();
  CHECK(st.allocated_bytes.current == 0);
  CHECK(st.allocation_count.current == 0);
  CHECK(st.num_allocs == st.num_frees);
  CHECK(gpukit::detail::check_invariants(alloc) == "");
  for (auto& s : streams) {
    GPUKIT_CUDA_TRY(rt.stream_synchronize(s));
    alloc.forget_stream(s);
  }
  for (auto& s : streams) { GPUKIT_CUDA_TRY(rt.stream_destroy(s)); }
}

/// Options that take segments from `source` and are otherwise the defaults.
inline caching_allocator_options options_for(segment_source source)
{
  caching_allocator_options o;
  o.source = source;
  return o;
}

}  // namespace gpukit::test

#define GPUKIT_ALLOCATOR_CONFORMANCE_CASE_DETAIL(runtime_expr, name_prefix, source, title, call) \
  TEST_CASE(name_prefix ", " #source " segments: " title)                                        \
  {                                                                                              \
    auto&& gpukit_rt_ = runtime_expr;                                                            \
    ::gpukit::caching_allocator_options const gpukit_options_ =                                  \
      ::gpukit::test::options_for(::gpukit::segment_source::source);                             \
    ::gpukit::test::call;                                                                        \
  }

/// Defines the conformance TEST_CASEs of one segment source (an enumerator of segment_source).
#define GPUKIT_ALLOCATOR_CONFORMANCE_SOURCE_CASES(runtime_expr, name_prefix, source, threads,      \
                                                  iterations, max_bytes)                           \
  GPUKIT_ALLOCATOR_CONFORMANCE_CASE_DETAIL(runtime_expr, name_prefix, source,                      \
                                           "round trip of many sizes",                             \
                                           check_alloc_roundtrip(gpukit_rt_, gpukit_options_))     \
  GPUKIT_ALLOCATOR_CONFORMANCE_CASE_DETAIL(runtime_expr, name_prefix, source, "same-stream reuse", \
                                           check_same_stream_reuse(gpukit_rt_, gpukit_options_))   \
  GPUKIT_ALLOCATOR_CONFORMANCE_CASE_DETAIL(runtime_expr, name_prefix, source,                      \
                                           "bad input gets a clear error and changes nothing",     \
                                           check_bad_input(gpukit_rt_, gpukit_options_))           \
  GPUKIT_ALLOCATOR_CONFORMANCE_CASE_DETAIL(                                                        \
    runtime_expr, name_prefix, source, "limit and out-of-memory report",                           \
    check_limit_and_oom_report(gpukit_rt_, gpukit_options_))                                       \
  GPUKIT_ALLOCATOR_CONFORMANCE_CASE_DETAIL(                                                        \
    runtime_expr, name_prefix, source,                                                             \
    "stress: threads x streams x random sizes with patterns checked",                              \
    check_stress(gpukit_rt_, threads, iterations, max_bytes, gpukit_options_))

/// Defines the conformance TEST_CASEs of every segment source for the runtime `runtime_expr`
/// (evaluated in each case), named "<name_prefix>, <source> segments: <what>" (`name_prefix` is a
/// string literal). The stress case runs `threads` threads of `iterations` steps, requests of up
/// to `max_bytes`.
#define GPUKIT_ALLOCATOR_CONFORMANCE_CASES(runtime_expr, name_prefix, threads, iterations,      \
                                           max_bytes)                                           \
  GPUKIT_ALLOCATOR_CONFORMANCE_SOURCE_CASES(runtime_expr, name_prefix, synchronous, threads,    \
                                            iterations, max_bytes)                              \
  GPUKIT_ALLOCATOR_CONFORMANCE_SOURCE_CASES(runtime_expr, name_prefix, stream_ordered, threads, \
                                            iterations, max_bytes)                              \
  GPUKIT_ALLOCATOR_CONFORMANCE_SOURCE_CASES(runtime_expr, name_prefix, growable, threads,       \
                                            iterations, max_bytes)
