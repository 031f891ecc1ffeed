// SPDX-License-Identifier: Apache-2.0
// tests/memory/adaptors/adaptor_conformance.hpp: the resource adaptors' conformance suite. Each
// adaptor alone, and every ordered pair of adaptors stacked, over the caching allocator and over
// malloc_async_resource, runs the same workload on every runtime (simulated and CUDA): blocks of
// many sizes filled with their own value and read back (no overlap), every entry point the
// upstream has (gpukit's, CCCL 3.0's and 3.1's names), several threads at once; then each layer
// must be idle (its counts back to zero, its log a complete trace, its callback never called) and
// the caching allocator must hold no allocated byte.
//
// Use: in a doctest TU, after including the runtime,
//
//   GPUKIT_ADAPTOR_CONFORMANCE_CASES(gpukit::cuda_runtime::instance(), "cuda_runtime", 8, 1000)
//
// defines one TEST_CASE per check below, named "resource adaptors on <prefix>: <what>"; the last
// two arguments size the threaded part (threads, iterations each).
#pragma once

#include "memory/allocator_conformance.hpp"  // fill, holds
#include "support/conformance.hpp"
#include "support/holders.hpp"
#include "support/sizes.hpp"

#include <gpukit/memory/adaptors/failure_callback_resource_adaptor.hpp>
#include <gpukit/memory/adaptors/limiting_resource_adaptor.hpp>
#include <gpukit/memory/adaptors/logging_resource_adaptor.hpp>
#include <gpukit/memory/adaptors/statistics_resource_adaptor.hpp>
#include <gpukit/memory/adaptors/tracking_resource_adaptor.hpp>
#include <gpukit/memory/allocation_trace.hpp>
#include <gpukit/memory/caching_allocator.hpp>
#include <gpukit/memory/detail/allocator_invariants.hpp>
#include <gpukit/memory/device_buffer.hpp>
#include <gpukit/memory/malloc_async_resource.hpp>

#include <doctest/doctest.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <random>
#include <sstream>
#include <thread>
#include <utility>
#include <vector>

namespace gpukit::test {

/// What cuda::stream_ref is to cuda_runtime, for any runtime: a value whose get() is the stream.
template <class Stream>
struct any_stream_ref {
  Stream stream;
  [[nodiscard]] Stream get() const noexcept { return stream; }
};

// One layer kind per adaptor: `make(upstream)` builds the adaptor over any upstream, and
// `check_idle(adaptor)` checks, once the workload has freed everything, what that adaptor saw.

struct limiting_layer {
  static constexpr char const* name  = "limiting";
  static constexpr std::size_t limit = std::size_t{512} << 20;
  template <class U>
  static auto make(U& upstream)
  {
    return std::make_unique<limiting_resource_adaptor<U>>(upstream, limit);
  }
  template <class A>
  void check_idle(A const& a) const
  {
    CHECK(a.allocated_bytes() == 0);
    CHECK(a.limit() == limit);
  }
};

struct statistics_layer {
  static constexpr char const* name = "statistics";
  template <class U>
  static auto make(U& upstream)
  {
    return std::make_unique<statistics_resource_adaptor<U>>(upstream);
  }
  template <class A>
  void check_idle(A const& a) const
  {
    resource_stats const s = a.stats();
    CHECK(s.bytes.current == 0);
    CHECK(s.allocations.current == 0);
    CHECK(s.allocations.allocated > 0);
    CHECK(s.allocations.allocated == s.allocations.freed);
    CHECK(s.bytes.allocated == s.bytes.freed);
    CHECK(s.bytes.peak >= static_cast<std::int64_t>(3 * mib + 7));  // the largest block
    CHECK(s.bytes.peak <= s.bytes.allocated);
  }
};

struct tracking_layer {
  static constexpr char const* name = "tracking";
  template <class U>
  static auto make(U& upstream)
  {
    return std::make_unique<tracking_resource_adaptor<U>>(upstream);
  }
  template <class A>
  void check_idle(A const& a) const
  {
    CHECK(a.outstanding().empty());
    CHECK(a.outstanding_bytes() == 0);
    CHECK(a.leak_report() == "gpukit: tracking_resource_adaptor: nothing is still allocated\n");
  }
};

struct logging_layer {
  static constexpr char const* name = "logging";
  std::ostringstream log;
  template <class U>
  auto make(U& upstream)
  {
    return std::make_unique<logging_resource_adaptor<U>>(upstream, log);
  }
  template <class A>
  void check_idle(A const&) const
  {
    // The log is a trace gpukit reads (which refuses a free before its allocation, or an id
    // allocated twice while live), and every allocation in it was freed.
    std::istringstream in{log.str()};
    allocation_trace const t = read_allocation_trace(in, "adaptor log");
    std::size_t allocs = 0, frees = 0;
    for (auto const& e : t.events) { (e.alloc ? allocs : frees) += 1; }
    CHECK(allocs > 0);
    CHECK(allocs == frees);
    CHECK(t.peak_live_bytes >= 3 * mib + 7);
    CHECK(t.streams >= 2);  // the default stream and the workload's
  }
};

struct failure_callback_layer {
  static constexpr char const* name = "failure_callback";
  std::shared_ptr<int> calls        = std::make_shared<int>(0);
  template <class U>
  auto make(U& upstream)
  {
    return std::make_unique<failure_callback_resource_adaptor<U>>(
      upstream, [calls = calls](oom_context const&) {
        ++*calls;
        return false;
      });
  }
  template <class A>
  void check_idle(A const&) const
  {
    CHECK(*calls == 0);  // nothing failed
  }
};

template <class... Layers>
struct layer_list {};
using all_layers = layer_list<limiting_layer, statistics_layer, tracking_layer, logging_layer,
                              failure_callback_layer>;

template <class... Layers, class F>
void for_each_layer(layer_list<Layers...>, F&& f)
{
  (f(Layers{}), ...);
}

/// The workload, through resource `r` on runtime `rt`: every entry point `r` has, then `threads`
/// threads of `iterations` allocations each. Frees all it allocates; `forget(stream)` runs before
/// each of its streams is destroyed, in the thread that used it.
template <class Runtime, class R, class Forget>
void exercise(Runtime& rt, R& r, int threads, int iterations, Forget const& forget)
{
  using stream_type = typename Runtime::stream_type;
  using ref         = any_stream_ref<stream_type>;
  stream_holder<Runtime> s{rt};
  {
    std::vector<std::pair<void*, std::size_t>> live;
    unsigned char value = 1;
    for (std::size_t bytes : {std::size_t{1}, std::size_t{255}, std::size_t{256}, std::size_t{4097},
                              mib, 3 * mib + 7}) {
      void* p = r.allocate_async(bytes, s);
      REQUIRE(p != nullptr);
      CHECK(reinterpret_cast<std::uintptr_t>(p) % 256 == 0);
      fill(rt, p, bytes, value++, s);
      live.emplace_back(p, bytes);
    }
    value = 1;
    for (auto [p, bytes] : live) { CHECK(holds(rt, p, bytes, value++, s)); }
    for (auto [p, bytes] : live) { r.deallocate_async(p, bytes, s); }
  }
  // CCCL 3.0's and 3.1's names, and the default stream.
  void* a = r.allocate_async(1000, 128, ref{s});
  void* b = r.allocate(ref{s}, 2000, 256);
  void* c = r.allocate_sync(3000, 64);
  void* d = r.allocate(4000, 64);
  void* e = r.allocate(5000);
  for (void* p : {a, b, c, d, e}) {
    REQUIRE(p != nullptr);
    fill(rt, p, 1000, 0x5a, s);
  }
  r.deallocate_async(a, 1000, 128, ref{s});
  r.deallocate(ref{s}, b, 2000, 256);
  GPUKIT_CUDA_TRY(rt.stream_synchronize(s));
  r.deallocate_sync(c, 3000, 64);
  r.deallocate(d, 4000, 64);
  r.deallocate(e, 5000);
  r.deallocate_async(nullptr, 0, s);  // a null pointer passes through, unaccounted
  GPUKIT_CUDA_TRY(rt.stream_synchronize(s));
  forget(s.s);

  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      stream_holder<Runtime> own{rt};
      std::mt19937 rng{static_cast<std::uint32_t>(t + 1)};
      std::uniform_int_distribution<std::size_t> size{1, 64 * kib};
      std::vector<std::pair<void*, std::size_t>> held;
      bool ok = true;
      for (int i = 0; i < iterations; ++i) {
        std::size_t const bytes = size(rng);
        void* p                 = r.allocate_async(bytes, own);
        auto const v            = static_cast<unsigned char>(t + 1);
        fill(rt, p, bytes, v, own);
        if (i == iterations - 1) { ok = holds(rt, p, bytes, v, own); }
        held.emplace_back(p, bytes);
        if (held.size() > 8 || i == iterations - 1) {
          for (auto [q, n] : held) { r.deallocate_async(q, n, own); }
          held.clear();
        }
      }
      GPUKIT_CUDA_TRY(rt.stream_synchronize(own));
      forget(own.s);
      CHECK(ok);
    });
  }
  for (auto& th : pool) { th.join(); }
}

/// Each adaptor alone over `upstream`; `forget` as for exercise.
template <class Runtime, class Upstream, class Forget>
void check_each_alone(Runtime& rt, Upstream& upstream, int threads, int iterations,
                      Forget const& forget)
{
  for_each_layer(all_layers{}, [&](auto layer) {
    CAPTURE(layer.name);
    auto adaptor = layer.make(upstream);
    exercise(rt, *adaptor, threads, iterations, forget);
    layer.check_idle(*adaptor);
  });
}

/// `Outer` stacked over each adaptor (itself included) over `upstream`; `forget` as for exercise.
template <class Outer, class Runtime, class Upstream, class Forget>
void check_over_each(Runtime& rt, Upstream& upstream, int threads, int iterations,
                     Forget const& forget)
{
  for_each_layer(all_layers{}, [&](auto inner_layer) {
    Outer outer_layer;
    CAPTURE(Outer::name);
    CAPTURE(inner_layer.name);
    auto inner = inner_layer.make(upstream);
    auto outer = outer_layer.make(*inner);
    exercise(rt, *outer, threads, iterations, forget);
    outer_layer.check_idle(*outer);
    inner_layer.check_idle(*inner);
  });
}

template <class Runtime>
void check_alone_over_caching_allocator(Runtime& rt, int threads, int iterations)
{
  basic_caching_allocator<Runtime> alloc{rt, 0};
  // On CUDA a destroyed stream's handle must never reach the driver again: forgotten first.
  check_each_alone(rt, alloc, threads, iterations,
                   [&alloc](typename Runtime::stream_type s) { alloc.forget_stream(s); });
  CHECK(alloc.stats().allocated_bytes.current == 0);
  CHECK(detail::check_invariants(alloc) == "");
}

template <class Runtime>
void check_alone_over_malloc_async(Runtime& rt, int threads, int iterations)
{
  basic_malloc_async_resource<Runtime> mr{rt, 0};
  check_each_alone(rt, mr, threads, iterations, [](typename Runtime::stream_type) {});
}

template <class Outer, class Runtime>
void check_pairs_over_caching_allocator(Runtime& rt, int threads, int iterations)
{
  basic_caching_allocator<Runtime> alloc{rt, 0};
  check_over_each<Outer>(rt, alloc, threads, iterations,
                         [&alloc](typename Runtime::stream_type s) { alloc.forget_stream(s); });
  CHECK(alloc.stats().allocated_bytes.current == 0);
  CHECK(detail::check_invariants(alloc) == "");
}

/// A stack of all five serves gpukit's RAII types (device_buffer takes any allocator).
template <class Runtime>
void check_stack_serves_device_buffer(Runtime& rt)
{
  basic_caching_allocator<Runtime> alloc{rt, 0};
  limiting_resource_adaptor limited{alloc, 64 * mib};
  statistics_resource_adaptor counted{limited};
  tracking_resource_adaptor tracked{counted};
  std::ostringstream log;
  logging_resource_adaptor logged{tracked, log};
  failure_callback_resource_adaptor top{logged, [](oom_context const&) { return false; }};
  stream_holder<Runtime> s{rt};
  {
    basic_device_buffer<decltype(top)> b{mib, basic_cuda_stream_view<Runtime>{s.s}, top};
    CHECK(b.size() == mib);
    CHECK(tracked.outstanding().size() == 1);
    CHECK(limited.allocated_bytes() == mib);
    b.resize(2 * mib, basic_cuda_stream_view<Runtime>{s.s});  // a new block, the old one freed
    CHECK(counted.stats().allocations.allocated == 2);
    CHECK(limited.allocated_bytes() == 2 * mib);
    CHECK(&b.allocator() == &top);
    CHECK(top.device() == 0);
    CHECK(&top.runtime() == &rt);
    GPUKIT_CUDA_TRY(rt.stream_synchronize(s));
  }
  alloc.forget_stream(s);
  CHECK(tracked.outstanding().empty());
  CHECK(counted.stats().bytes.current == 0);
  CHECK(alloc.stats().allocated_bytes.current == 0);
  std::istringstream in{log.str()};
  CHECK(read_allocation_trace(in, "device_buffer log").events.size() == 4);
}

/// A runtime that records misuses (the simulated GPU: a dead stream handle passed on, a bad
/// pointer, ...) recorded none: what would crash or corrupt on CUDA fails the test here.
template <class Runtime>
auto check_no_misuse(Runtime& rt, int) -> decltype(void(rt.misuse_count()))
{
  CHECK_MESSAGE(rt.misuse_count() == 0, rt.last_misuse());
}
template <class Runtime>
void check_no_misuse(Runtime&, long)
{}

}  // namespace gpukit::test

// One TEST_CASE per check, each on a fresh `runtime_expr` (see support/conformance.hpp).
#define GPUKIT_ADAPTOR_CONFORMANCE_CASE(runtime_expr, prefix, what, ...) \
  TEST_CASE("resource adaptors on " prefix ": " what)                    \
  {                                                                      \
    auto&& gpukit_conformance_rt = runtime_expr;                         \
    ::gpukit::test::__VA_ARGS__;                                         \
    ::gpukit::test::check_no_misuse(gpukit_conformance_rt, 0);           \
  }

#define GPUKIT_ADAPTOR_CONFORMANCE_CASES(runtime_expr, prefix, threads, iterations)             \
  GPUKIT_ADAPTOR_CONFORMANCE_CASE(                                                              \
    runtime_expr, prefix, "each adaptor alone over the caching allocator",                      \
    check_alone_over_caching_allocator(gpukit_conformance_rt, threads, iterations))             \
  GPUKIT_ADAPTOR_CONFORMANCE_CASE(                                                              \
    runtime_expr, prefix, "each adaptor alone over malloc_async_resource",                      \
    check_alone_over_malloc_async(gpukit_conformance_rt, threads, iterations))                  \
  GPUKIT_ADAPTOR_CONFORMANCE_CASE(                                                              \
    runtime_expr, prefix, "limiting over each adaptor over the caching allocator",              \
    check_pairs_over_caching_allocator<::gpukit::test::limiting_layer>(gpukit_conformance_rt,   \
                                                                       threads, iterations))    \
  GPUKIT_ADAPTOR_CONFORMANCE_CASE(                                                              \
    runtime_expr, prefix, "statistics over each adaptor over the caching allocator",            \
    check_pairs_over_caching_allocator<::gpukit::test::statistics_layer>(gpukit_conformance_rt, \
                                                                         threads, iterations))  \
  GPUKIT_ADAPTOR_CONFORMANCE_CASE(                                                              \
    runtime_expr, prefix, "tracking over each adaptor over the caching allocator",              \
    check_pairs_over_caching_allocator<::gpukit::test::tracking_layer>(gpukit_conformance_rt,   \
                                                                       threads, iterations))    \
  GPUKIT_ADAPTOR_CONFORMANCE_CASE(                                                              \
    runtime_expr, prefix, "logging over each adaptor over the caching allocator",               \
    check_pairs_over_caching_allocator<::gpukit::test::logging_layer>(gpukit_conformance_rt,    \
                                                                      threads, iterations))     \
  GPUKIT_ADAPTOR_CONFORMANCE_CASE(                                                              \
    runtime_expr, prefix, "failure_callback over each adaptor over the caching allocator",      \
    check_pairs_over_caching_allocator<::gpukit::test::failure_callback_layer>(                 \
      gpukit_conformance_rt, threads, iterations))                                              \
  GPUKIT_ADAPTOR_CONFORMANCE_CASE(runtime_expr, prefix,                                         \
                                  "a stack of all five serves device_buffer",                   \
                                  check_stack_serves_device_buffer(gpukit_conformance_rt))
