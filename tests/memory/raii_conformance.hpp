// SPDX-License-Identifier: Apache-2.0
// tests/memory/raii_conformance.hpp: the RAII conformance suite. device_buffer, device_uvector,
// device_scalar, the owning stream, the stream pool and the current resource run the same cases on
// every runtime (the simulated GPU in CI, the real one on a GPU machine).
//
// Use: in a doctest TU, after including the runtime,
//
//   GPUKIT_RAII_CONFORMANCE_CASES(gpukit::cuda_runtime::instance(), "cuda_runtime")
//
// defines one TEST_CASE per `check_*` below, named "<prefix>: <what>". `runtime_expr` is evaluated
// once per case and bound with `auto&&`. Each check builds its own allocator on device 0 of that
// runtime (declared before any stream, so that it outlives them), except the current-resource
// checks, which act on `Runtime::instance()` as the current resource does, and restore it.
#pragma once

#include "runtime/conformance.hpp"  // patterns, gates

#include <gpukit/memory/caching_allocator.hpp>
#include <gpukit/memory/cuda_stream.hpp>
#include <gpukit/memory/current_resource.hpp>
#include <gpukit/memory/detail/allocator_invariants.hpp>
#include <gpukit/memory/device_buffer.hpp>
#include <gpukit/memory/device_scalar.hpp>
#include <gpukit/memory/device_uvector.hpp>

#include <doctest/doctest.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <limits>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

namespace gpukit::test::raii {

template <class Runtime>
using allocator_t = basic_caching_allocator<Runtime>;
template <class Runtime>
using buffer_t = basic_device_buffer<allocator_t<Runtime>>;
template <class T, class Runtime>
using uvector_t = device_uvector<T, allocator_t<Runtime>>;

/// A raw stream of device 0, destroyed (after the allocators forgot it) at scope exit.
template <class Runtime>
class raw_stream final {
 public:
  raw_stream(Runtime& rt, std::vector<allocator_t<Runtime>*> forget_in)
      : rt_{rt}, forget_in_{std::move(forget_in)}
  {
    REQUIRE(rt_.stream_create(s_) == cudaSuccess);
  }
  ~raw_stream()
  {
    for (auto* a : forget_in_) { a->forget_stream(s_); }
    (void)rt_.stream_destroy(s_);
  }
  raw_stream(raw_stream const&)            = delete;
  raw_stream& operator=(raw_stream const&) = delete;
  raw_stream(raw_stream&&)                 = delete;
  raw_stream& operator=(raw_stream&&)      = delete;
  [[nodiscard]] typename Runtime::stream_type get() const noexcept { return s_; }

 private:
  Runtime& rt_;
  std::vector<allocator_t<Runtime>*> forget_in_;
  typename Runtime::stream_type s_{};
};

/// Writes pattern `seed` into [p, p + bytes) and waits for it.
template <class Runtime>
void write_pattern(Runtime& rt, void* p, std::size_t bytes, unsigned seed,
                   typename Runtime::stream_type s)
{
  std::vector<unsigned char> host(bytes);
  fill_pattern(host.data(), bytes, seed);
  REQUIRE(rt.memcpy_async(p, host.data(), bytes, memcpy_kind::host_to_device, s) == cudaSuccess);
  REQUIRE(rt.stream_synchronize(s) == cudaSuccess);
}

/// Index of the first byte of [p, p + bytes) that is not pattern `seed` (bytes when all are).
template <class Runtime>
std::size_t read_mismatch(Runtime& rt, void const* p, std::size_t bytes, unsigned seed,
                          typename Runtime::stream_type s)
{
  std::vector<unsigned char> host(bytes);
  REQUIRE(rt.memcpy_async(host.data(), p, bytes, memcpy_kind::device_to_host, s) == cudaSuccess);
  REQUIRE(rt.stream_synchronize(s) == cudaSuccess);
  return pattern_mismatch(host.data(), bytes, seed);
}

template <class Runtime>
std::int64_t allocated(allocator_t<Runtime> const& a)
{
  return a.stats().allocated_bytes.current;
}

/// What most checks start from: device 0, an allocator of their own and an owning stream declared
/// after it. When the check ends (unless a REQUIRE threw), every byte must be back and the pool
/// consistent.
template <class Runtime>
struct fixture {
  explicit fixture(Runtime& r) : rt{(use_device_zero(r), r)} {}
  ~fixture()
  {
    if (std::uncaught_exceptions() == 0) {
      CHECK(allocated(alloc) == 0);
      CHECK(gpukit::detail::check_invariants(alloc).empty());
    }
  }
  fixture(fixture const&)            = delete;
  fixture& operator=(fixture const&) = delete;
  fixture(fixture&&)                 = delete;
  fixture& operator=(fixture&&)      = delete;

  Runtime& rt;
  allocator_t<Runtime> alloc{rt, 0};
  basic_cuda_stream<Runtime> s{rt};
};

// --- device_buffer -------------------------------------------------------------------------------

template <class Runtime>
void check_buffer_basics(Runtime& rt)
{
  fixture<Runtime> f{rt};
  {
    buffer_t<Runtime> b{3000, f.s, f.alloc};
    CHECK(b.data() != nullptr);
    CHECK(reinterpret_cast<std::uintptr_t>(b.data()) % 256 == 0);
    CHECK(b.size() == 3000);
    CHECK(b.capacity() == 3000);
    CHECK_FALSE(b.is_empty());
    CHECK(b.stream().value() == f.s.value());
    CHECK(&b.allocator() == &f.alloc);
    CHECK(allocated(f.alloc) >= 3000);
    write_pattern(rt, b.data(), b.size(), 1, f.s.value());
    CHECK(read_mismatch(rt, b.data(), b.size(), 1, f.s.value()) == b.size());

    // A copy is deep and in stream order.
    buffer_t<Runtime> c{b, f.s, f.alloc};
    CHECK(c.data() != b.data());
    CHECK(c.size() == 3000);
    CHECK(read_mismatch(rt, c.data(), c.size(), 1, f.s.value()) == c.size());
    // From host memory.
    std::vector<unsigned char> host(777);
    fill_pattern(host.data(), host.size(), 2);
    buffer_t<Runtime> h{host.data(), host.size(), f.s, f.alloc};
    CHECK(read_mismatch(rt, h.data(), h.size(), 2, f.s.value()) == h.size());
  }
  CHECK(allocated(f.alloc) == 0);  // every destructor gave its memory back
  CHECK(f.alloc.stats().num_frees == f.alloc.stats().num_allocs);
}

template <class Runtime>
void check_buffer_zero_size(Runtime& rt)
{
  fixture<Runtime> f{rt};
  buffer_t<Runtime> b{0, f.s, f.alloc};
  CHECK(b.data() == nullptr);
  CHECK(b.size() == 0);
  CHECK(b.capacity() == 0);
  CHECK(b.is_empty());
  CHECK(f.alloc.stats().num_allocs == 0);   // nothing was allocated
  buffer_t<Runtime> copy{b, f.s, f.alloc};  // a copy of nothing is nothing
  CHECK(copy.data() == nullptr);
  buffer_t<Runtime> from_null{nullptr, 0, f.s, f.alloc};
  CHECK(from_null.data() == nullptr);

  b.resize(512, f.s);  // grows from nothing
  CHECK(b.data() != nullptr);
  CHECK(b.size() == 512);
  b.resize(0, f.s);  // within capacity: only the size changes
  CHECK(b.size() == 0);
  CHECK(b.capacity() == 512);
  b.shrink_to_fit(f.s);  // size 0: the memory goes back
  CHECK(b.data() == nullptr);
  CHECK(b.capacity() == 0);
  CHECK(allocated(f.alloc) == 0);
  CHECK(f.alloc.stats().num_frees == f.alloc.stats().num_allocs);
}

template <class Runtime>
void check_buffer_moves(Runtime& rt)
{
  fixture<Runtime> f{rt};
  buffer_t<Runtime> a{4096, f.s, f.alloc};
  void* const p = a.data();
  buffer_t<Runtime> b{std::move(a)};
  CHECK(b.data() == p);
  CHECK(b.size() == 4096);
  CHECK(b.capacity() == 4096);
  CHECK(a.data() == nullptr);  // NOLINT(bugprone-use-after-move): moves leave the source empty
  CHECK(a.size() == 0);
  CHECK(a.capacity() == 0);
  CHECK(&a.allocator() == &f.alloc);
  CHECK(a.stream().value() == f.s.value());

  buffer_t<Runtime> c{1024, f.s, f.alloc};
  CHECK(f.alloc.stats().allocation_count.current == 2);
  c = std::move(b);  // c'f.s own block is freed
  CHECK(c.data() == p);
  CHECK(b.data() == nullptr);  // NOLINT(bugprone-use-after-move)
  CHECK(f.alloc.stats().allocation_count.current == 1);
  auto& self = c;
  c          = std::move(self);  // self-move keeps the memory
  CHECK(c.data() == p);
  CHECK(f.alloc.stats().allocation_count.current == 1);
  a = std::move(c);  // into a moved-from buffer
  CHECK(a.data() == p);
}

template <class Runtime>
void check_buffer_resize(Runtime& rt)
{
  fixture<Runtime> f{rt};
  auto const q = f.s.value();
  {
    std::size_t const n = 100 * kib + 3;
    buffer_t<Runtime> b{n, f.s, f.alloc};
    write_pattern(rt, b.data(), n, 7, q);
    void* const first = b.data();

    b.resize(3 * mib + 11, f.s);  // grows: a new block, every old byte kept
    CHECK(b.size() == 3 * mib + 11);
    CHECK(b.capacity() == 3 * mib + 11);
    CHECK(b.data() != first);
    CHECK(read_mismatch(rt, b.data(), n, 7, q) == n);
    CHECK(f.alloc.stats().allocation_count.current == 1);  // the old block went back

    void* const grown = b.data();
    b.resize(n / 2, f.s);  // within capacity: same block, nothing copied
    CHECK(b.data() == grown);
    CHECK(b.size() == n / 2);
    CHECK(b.capacity() == 3 * mib + 11);
    b.shrink_to_fit(f.s);  // a block of the size, contents kept
    CHECK(b.capacity() == n / 2);
    CHECK(read_mismatch(rt, b.data(), n / 2, 7, q) == n / 2);

    b.reserve(2 * n, f.s);
    CHECK(b.size() == n / 2);
    CHECK(b.capacity() == 2 * n);
    CHECK(read_mismatch(rt, b.data(), n / 2, 7, q) == n / 2);
    b.reserve(10, f.s);  // never shrinks
    CHECK(b.capacity() == 2 * n);

    // A failed growth leaves the buffer as it was.
    void* const before = b.data();
    f.alloc.set_limit(8 * mib);
    CHECK_THROWS_AS(b.resize(64 * mib, f.s), gpukit::bad_alloc);
    f.alloc.set_limit(0);
    CHECK(b.data() == before);
    CHECK(b.size() == n / 2);
    CHECK(b.capacity() == 2 * n);
    CHECK(read_mismatch(rt, b.data(), n / 2, 7, q) == n / 2);
  }
}

template <class Runtime>
void check_buffer_release(Runtime& rt)
{
  fixture<Runtime> f{rt};
  void* raw               = nullptr;
  std::size_t raw_bytes   = 0;
  std::int64_t const held = [&] {
    buffer_t<Runtime> b{5000, f.s, f.alloc};
    raw_bytes = b.capacity();
    raw       = b.release();
    CHECK(raw != nullptr);
    CHECK(b.data() == nullptr);
    CHECK(b.size() == 0);
    CHECK(b.capacity() == 0);
    return allocated(f.alloc);
  }();
  CHECK(held >= 5000);
  CHECK(allocated(f.alloc) == held);  // the destructor left the released memory alone
  write_pattern(rt, raw, raw_bytes, 3, f.s.value());  // still usable
  f.alloc.deallocate_async(raw, raw_bytes, f.s.value());
}

/// The memory is freed on the stream set last: a block freed on a stream whose work is held by a
/// gate is not handed to another stream until that work has run.
template <class Runtime>
void check_buffer_stream_order(Runtime& rt)
{
  fixture<Runtime> f{rt};
  auto& alloc = f.alloc;
  auto& s1    = f.s;
  basic_cuda_stream<Runtime> s2{rt};
  gate g;
  gate_guard<Runtime> guard{rt, g};
  void* first = nullptr;
  {
    buffer_t<Runtime> b{64 * kib, s2, alloc};
    write_pattern(rt, b.data(), b.size(), 4, s2.value());
    b.set_stream(s1);  // freed on s1 from now on
    CHECK(b.stream().value() == s1.value());
    REQUIRE(rt.launch_host_func(s1.value(), &gate::wait, &g) == cudaSuccess);  // s1 is held
    first = b.data();
  }
  // On s2 the block must not come back while s1's work before the free is pending.
  buffer_t<Runtime> other{64 * kib, s2, alloc};
  CHECK(other.data() != first);
  g.open.store(true);
  s1.synchronize();
  // On s1 itself a freed block is reusable at once.
  void* const on_s1 = other.data();
  other.set_stream(s1);
  other = buffer_t<Runtime>{0, s1, alloc};
  buffer_t<Runtime> again{64 * kib, s1, alloc};
  CHECK((again.data() == on_s1 || again.data() == first));
  CHECK(allocated(alloc) == static_cast<std::int64_t>(again.capacity()));
}

// --- device_uvector and device_scalar ------------------------------------------------------------

template <class Runtime>
void check_uvector_elements(Runtime& rt)
{
  fixture<Runtime> f{rt};
  uvector_t<std::uint64_t, Runtime> v{1000, f.s, f.alloc};
  CHECK(v.size() == 1000);
  CHECK(v.capacity() == 1000);
  CHECK(v.end() - v.begin() == 1000);
  CHECK(static_cast<void*>(v.element_ptr(10)) == static_cast<void*>(v.data() + 10));

  std::vector<std::uint64_t> host(1000);
  for (std::size_t i = 0; i < host.size(); ++i) { host[i] = i * 0x9e3779b97f4a7c15ull; }
  v.copy_from_host_async(host.data(), host.size(), f.s);
  std::uint64_t const x = 0xabcdef0123456789ull;
  v.set_element_async(5, x, f.s);
  v.set_element(6, std::uint64_t{42}, f.s);  // a temporary: set_element synchronizes
  v.set_element_to_zero_async(7, f.s);
  CHECK(v.element(5, f.s) == x);
  CHECK(v.element(6, f.s) == 42);
  CHECK(v.element(7, f.s) == 0);
  CHECK(v.front_element(f.s) == host.front());
  CHECK(v.back_element(f.s) == host.back());

  // Pinned host memory, part of the range.
  void* pinned = nullptr;
  REQUIRE(rt.host_alloc(&pinned, 100 * sizeof(std::uint64_t), host_alloc_flags::none) ==
          cudaSuccess);
  auto* out = static_cast<std::uint64_t*>(pinned);
  v.copy_to_host_async(out, 100, f.s, 900);
  f.s.synchronize();
  std::size_t wrong = 0;
  for (std::size_t i = 0; i < 100; ++i) { wrong += out[i] != host[900 + i] ? 1 : 0; }
  CHECK(wrong == 0);
  REQUIRE(rt.host_free(pinned) == cudaSuccess);

  // Every element, through a resize that grows.
  v.resize(5000, f.s);
  CHECK(v.size() == 5000);
  std::vector<std::uint64_t> back(1000);
  v.copy_to_host_async(back.data(), back.size(), f.s);
  f.s.synchronize();
  host[5] = x;
  host[6] = 42;
  host[7] = 0;
  CHECK(back == host);

  // Bad indices and ranges name the values.
  CHECK_THROWS_WITH_AS((void)v.element(5000, f.s), doctest::Contains("index 5000"),
                       gpukit::logic_error);
  CHECK_THROWS_AS(v.set_element_async(5000, x, f.s), gpukit::logic_error);
  CHECK_THROWS_AS((void)v.element_ptr(5000), gpukit::logic_error);
  CHECK_THROWS_WITH_AS(v.copy_to_host_async(back.data(), 2, f.s, 4999), doctest::Contains("4999"),
                       gpukit::logic_error);
  CHECK_THROWS_AS(v.copy_from_host_async(nullptr, 1, f.s), gpukit::logic_error);

  // release hands the memory over as an untyped buffer.
  auto const* p         = v.data();
  buffer_t<Runtime> raw = v.release();
  CHECK(raw.data() == p);
  CHECK(raw.size() == 5000 * sizeof(std::uint64_t));
  CHECK(v.data() == nullptr);  // NOLINT(bugprone-use-after-move)
  CHECK(v.size() == 0);
  uvector_t<std::uint64_t, Runtime> again{std::move(raw)};
  CHECK(again.data() == p);
  CHECK(again.element(5, f.s) == x);
  buffer_t<Runtime> odd{12, f.s, f.alloc};
  CHECK_THROWS_AS((uvector_t<std::uint64_t, Runtime>{std::move(odd)}), gpukit::logic_error);
  CHECK(odd.size() == 12);  // NOLINT(bugprone-use-after-move): refused, so left as it was
}

template <class Runtime>
void check_uvector_moves_and_copies(Runtime& rt)
{
  fixture<Runtime> f{rt};
  uvector_t<float, Runtime> a{256, f.s, f.alloc};
  std::vector<float> host(256);
  for (std::size_t i = 0; i < host.size(); ++i) { host[i] = static_cast<float>(i) * 0.5f; }
  a.copy_from_host_async(host.data(), host.size(), f.s);
  uvector_t<float, Runtime> copy{a, f.s, f.alloc};
  CHECK(copy.data() != a.data());
  float* const p = a.data();
  uvector_t<float, Runtime> b{std::move(a)};
  CHECK(b.data() == p);
  CHECK(a.is_empty());  // NOLINT(bugprone-use-after-move)
  std::vector<float> back(256);
  copy.copy_to_host_async(back.data(), back.size(), f.s);
  f.s.synchronize();
  CHECK(back == host);
  b.shrink_to_fit(f.s);  // already exact: nothing moves
  CHECK(b.data() == p);
  uvector_t<float, Runtime> empty{0, f.s, f.alloc};
  CHECK(empty.is_empty());
  CHECK(empty.data() == nullptr);
}

template <class Runtime>
void check_size_overflow(Runtime& rt)
{
  fixture<Runtime> f{rt};
  std::size_t const max   = std::numeric_limits<std::size_t>::max();
  std::size_t const count = max / sizeof(double) + 1;  // count * 8 wraps around
  CHECK_THROWS_WITH_AS((uvector_t<double, Runtime>{count, f.s, f.alloc}),
                       doctest::Contains(std::to_string(count).c_str()), gpukit::bad_alloc);
  CHECK_THROWS_AS((uvector_t<double, Runtime>{max, f.s, f.alloc}), gpukit::bad_alloc);
  uvector_t<double, Runtime> v{4, f.s, f.alloc};
  double* const p = v.data();
  CHECK_THROWS_WITH_AS(v.resize(count, f.s), doctest::Contains(std::to_string(count).c_str()),
                       gpukit::bad_alloc);
  CHECK_THROWS_AS(v.reserve(max / 2, f.s), gpukit::bad_alloc);
  CHECK(v.data() == p);  // unchanged
  CHECK(v.size() == 4);
  // The largest size that does not wrap is still refused by the allocator, naming the size.
  CHECK_THROWS_WITH_AS((buffer_t<Runtime>{max, f.s, f.alloc}),
                       doctest::Contains(std::to_string(max).c_str()), gpukit::bad_alloc);
  CHECK_THROWS_AS((uvector_t<double, Runtime>{max / sizeof(double), f.s, f.alloc}),
                  gpukit::bad_alloc);
  CHECK(f.alloc.stats().allocation_count.current == 1);
}

template <class Runtime>
void check_scalar(Runtime& rt)
{
  fixture<Runtime> f{rt};
  using scalar = device_scalar<std::int32_t, allocator_t<Runtime>>;
  scalar a{-17, f.s, f.alloc};  // a temporary: the constructor synchronizes
  CHECK(a.size() == 1);
  CHECK(a.value(f.s) == -17);
  std::int32_t const v = 1234567;
  a.set_value_async(v, f.s);
  CHECK(a.value(f.s) == v);
  a.set_value_to_zero_async(f.s);
  CHECK(a.value(f.s) == 0);
  scalar b{std::move(a)};
  CHECK(b.value(f.s) == 0);
  CHECK(a.data() == nullptr);  // NOLINT(bugprone-use-after-move)
  CHECK(a.size() == 0);
  CHECK_THROWS_AS((void)a.value(f.s), gpukit::logic_error);
  scalar c{b, f.s, f.alloc};
  b.set_value_async(v, f.s);
  CHECK(c.value(f.s) == 0);
  CHECK(b.value(f.s) == v);
  scalar u{f.s, f.alloc};
  CHECK(u.data() != nullptr);
}

// --- the owning stream and the pool --------------------------------------------------------------

/// Frees `bytes` on `on` through a buffer, then checks that after `on` is gone another stream
/// reuses that memory without the allocator recording a cross-stream event on it: the owning stream
/// made the allocator forget it (the block moved to every stream's pool when it was destroyed).
template <class Runtime, class MakeAndDestroy>
void check_forgotten(Runtime& rt, allocator_t<Runtime>& alloc, MakeAndDestroy&& make_and_destroy)
{
  raw_stream<Runtime> other{rt, {&alloc}};
  auto const events_before = alloc.stats().num_cross_stream_events;
  void* const freed        = make_and_destroy();
  buffer_t<Runtime> reuse{256 * kib, other.get(), alloc};
  CHECK(reuse.data() == freed);
  CHECK(alloc.stats().num_cross_stream_events == events_before);
  CHECK(gpukit::detail::check_invariants(alloc).empty());
}

template <class Runtime>
void check_owning_stream(Runtime& rt)
{
  use_device_zero(rt);
  allocator_t<Runtime> alloc{rt, 0};
  allocator_t<Runtime> direct{rt, 0};
  SUBCASE("RAII types register their allocator")
  {
    check_forgotten(rt, alloc, [&] {
      basic_cuda_stream<Runtime> s{rt};
      CHECK(s.is_valid());
      CHECK(s.device() == 0);
      CHECK(&s.runtime() == &rt);
      CHECK(s.view().is_owned());
      CHECK_FALSE(s.view().is_default());
      buffer_t<Runtime> b{256 * kib, s, alloc};
      return b.data();  // freed on s, then s forgets itself in alloc
    });
  }
  SUBCASE("register_allocator covers raw use")
  {
    check_forgotten(rt, direct, [&] {
      basic_cuda_stream<Runtime> s{rt};
      s.register_allocator(direct);
      void* p = direct.allocate_async(256 * kib, s.value());
      direct.deallocate_async(p, 256 * kib, s.value());
      return p;
    });
  }
  SUBCASE("a moved stream keeps its views and registrations")
  {
    check_forgotten(rt, alloc, [&] {
      basic_cuda_stream<Runtime> s{rt};
      auto const view = s.view();
      basic_cuda_stream<Runtime> t{std::move(s)};
      CHECK_FALSE(s.is_valid());  // NOLINT(bugprone-use-after-move)
      CHECK_THROWS_AS((void)s.view(), gpukit::logic_error);
      CHECK_THROWS_AS(s.synchronize(), gpukit::logic_error);
      CHECK(s.synchronize_no_throw() == cudaErrorInvalidResourceHandle);
      CHECK(t.value() == view.value());
      void* p = nullptr;
      {
        buffer_t<Runtime> b{256 * kib, view, alloc};  // registered through the old view
        p = b.data();
      }
      basic_cuda_stream<Runtime> u{rt};
      u = std::move(t);  // u's own stream is destroyed, t's taken
      CHECK(u.value() == view.value());
      return p;
    });
  }
  SUBCASE("set_stream registers too")
  {
    check_forgotten(rt, alloc, [&] {
      raw_stream<Runtime> first{rt, {&alloc}};
      basic_cuda_stream<Runtime> s{rt};
      buffer_t<Runtime> b{256 * kib, first.get(), alloc};
      void* p = b.data();
      b.set_stream(s);
      b = buffer_t<Runtime>{0, s, alloc};  // freed on s
      return p;
    });
  }
  CHECK(allocated(alloc) == 0);
  CHECK(allocated(direct) == 0);
}

/// Threads that allocate on one owning stream, each from its own allocator, register them all.
template <class Runtime>
void check_owning_stream_threads(Runtime& rt)
{
  use_device_zero(rt);
  constexpr int threads = 4;
  std::vector<std::unique_ptr<allocator_t<Runtime>>> many;
  std::vector<allocator_t<Runtime>*> raw;
  for (int i = 0; i < threads; ++i) {
    many.push_back(std::make_unique<allocator_t<Runtime>>(rt, 0));
    raw.push_back(many.back().get());
  }
  raw_stream<Runtime> other{rt, raw};
  {
    basic_cuda_stream<Runtime> s{rt};
    auto const view = s.view();
    std::vector<std::thread> pool;
    for (int t = 0; t < threads; ++t) {
      pool.emplace_back([&, t] {
        (void)rt.set_device(0);
        for (int i = 0; i < 50; ++i) { buffer_t<Runtime> b{256 * kib, view, *many[t]}; }
      });
    }
    for (auto& th : pool) { th.join(); }  // exiting threads return their cached blocks
  }
  for (auto* a : raw) {
    auto const events = a->stats().num_cross_stream_events;
    {
      buffer_t<Runtime> reuse{256 * kib, other.get(), *a};
    }
    CHECK(a->stats().num_cross_stream_events == events);  // forgotten: no event on the dead stream
    CHECK(allocated(*a) == 0);
    CHECK(gpukit::detail::check_invariants(*a).empty());
  }
}

template <class Runtime>
void check_stream_pool(Runtime& rt)
{
  use_device_zero(rt);
  allocator_t<Runtime> alloc{rt, 0};
  CHECK_THROWS_AS(basic_stream_pool<Runtime>(0, rt), gpukit::logic_error);
  check_forgotten(rt, alloc, [&] {
    basic_stream_pool<Runtime> pool{3, rt};
    CHECK(pool.get_pool_size() == 3);
    std::vector<typename Runtime::stream_type> seen;
    for (int i = 0; i < 7; ++i) { seen.push_back(pool.get_stream().value()); }
    std::set<typename Runtime::stream_type> distinct(seen.begin(), seen.end());
    CHECK(distinct.size() == 3);
    for (std::size_t i = 3; i < seen.size(); ++i) { CHECK(seen[i] == seen[i - 3]); }  // round robin
    for (std::size_t i = 0; i < 6; ++i) {
      CHECK(pool.get_stream(i).value() == pool.get_stream(i + 3).value());
      CHECK(pool.get_stream(i).is_owned());
    }
    CHECK(distinct.count(pool.get_stream(1).value()) == 1);
    buffer_t<Runtime> b{256 * kib, pool.get_stream(1), alloc};
    return b.data();  // freed on a pool stream, which is forgotten with the pool
  });
  CHECK(allocated(alloc) == 0);
}

// --- the current resource -----------------------------------------------------------------------

/// Restores the current resource of device 0 at scope exit, also when a check fails.
template <class Runtime>
class restore_current final {
 public:
  restore_current() : previous_{&get_current_device_resource<Runtime>(0)} {}
  ~restore_current() { set_current_device_resource(0, previous_); }
  restore_current(restore_current const&)            = delete;
  restore_current& operator=(restore_current const&) = delete;
  restore_current(restore_current&&)                 = delete;
  restore_current& operator=(restore_current&&)      = delete;

 private:
  allocator_t<Runtime>* previous_;
};

template <class Runtime>
void check_current_resource(Runtime& rt)
{
  use_device_zero(rt);
  auto& instance = Runtime::instance();
  REQUIRE(instance.set_device(0) == cudaSuccess);
  allocator_t<Runtime> mine{rt, 0};  // declared before `restore`: outlives its time as current
  restore_current<Runtime> restore;
  auto* const original = &get_current_device_resource<Runtime>(0);
  CHECK(original == &get_current_device_resource<Runtime>());  // device 0 is current

  auto* previous = set_current_device_resource(0, &mine);
  CHECK(previous == original);
  CHECK(&get_current_device_resource<Runtime>(0) == &mine);
  {
    // RAII types built without an allocator use it.
    basic_cuda_stream_view<Runtime> const s{};
    buffer_t<Runtime> b{1000, s};
    CHECK(&b.allocator() == &mine);
    CHECK(allocated(mine) >= 1000);
    uvector_t<int, Runtime> v{10, s};
    CHECK(&v.allocator() == &mine);
    // Replacing it moves no existing buffer: b frees to `mine` below.
    set_current_device_resource<Runtime>(0, nullptr);  // the default again
    CHECK(&get_current_device_resource<Runtime>(0) == &default_caching_allocator<Runtime>(0));
    CHECK(&b.allocator() == &mine);
  }
  CHECK(allocated(mine) == 0);
  CHECK_THROWS_AS(set_current_device_resource(1, &mine), gpukit::logic_error);  // serves device 0
  CHECK_THROWS_AS((void)get_current_device_resource<Runtime>(1 << 20), gpukit::logic_error);

  // reset_current_device_resource builds one with options, owned by gpukit.
  caching_allocator_options o;
  o.limit_bytes = 4 * mib;
  auto& built   = reset_current_device_resource<Runtime>(0, o);
  CHECK(&get_current_device_resource<Runtime>(0) == &built);
  CHECK(built.options().limit_bytes == 4 * mib);
  CHECK(built.device() == 0);
  {
    basic_cuda_stream_view<Runtime> const s{};
    CHECK_THROWS_AS(buffer_t<Runtime>(8 * mib, s), gpukit::bad_alloc);  // over its limit
    buffer_t<Runtime> fits{mib, s};
    CHECK(&fits.allocator() == &built);
  }
  auto& again = reset_current_device_resource<Runtime>(0, o);
  CHECK(&again != &built);
  CHECK(built.stats().reserved_bytes.current == 0);  // the replaced one gave its cache back
  CHECK(set_current_device_resource(0, original) == &again);
}

template <class Runtime>
void check_current_resource_threads(Runtime& rt)
{
  use_device_zero(rt);
  REQUIRE(Runtime::instance().set_device(0) == cudaSuccess);
  constexpr int threads = 4;
  std::vector<std::unique_ptr<allocator_t<Runtime>>> mine;
  for (int i = 0; i < threads; ++i) {
    mine.push_back(std::make_unique<allocator_t<Runtime>>(rt, 0));
  }
  restore_current<Runtime> restore;
  auto* const original = &get_current_device_resource<Runtime>(0);
  std::set<allocator_t<Runtime>*> valid{original};
  for (auto const& m : mine) { valid.insert(m.get()); }
  std::atomic<int> bad{0};
  std::atomic<int> go{0};
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      (void)Runtime::instance().set_device(0);
      go.fetch_add(1);
      while (go.load() < threads) { std::this_thread::yield(); }
      for (int i = 0; i < 500; ++i) {
        auto* prev = set_current_device_resource(0, mine[t].get());
        auto* now  = &get_current_device_resource<Runtime>(0);
        if (valid.count(prev) == 0 || valid.count(now) == 0) { bad.fetch_add(1); }
        // Replace and restore: what this thread set is put back only if it is still current.
        auto* back = set_current_device_resource(0, prev);
        if (valid.count(back) == 0) { bad.fetch_add(1); }
      }
    });
  }
  for (auto& th : pool) { th.join(); }
  CHECK(bad.load() == 0);
  CHECK(valid.count(&get_current_device_resource<Runtime>(0)) == 1);
  set_current_device_resource(0, original);
  CHECK(&get_current_device_resource<Runtime>(0) == original);
}

}  // namespace gpukit::test::raii

/// Defines the RAII conformance TEST_CASEs for the runtime `runtime_expr` (evaluated in each case),
/// named "<name_prefix>: <what>".
#define GPUKIT_RAII_CONFORMANCE_CASES(runtime_expr, name_prefix)                                   \
  GPUKIT_RUNTIME_CONFORMANCE_CASE_DETAIL(runtime_expr, name_prefix, "device_buffer basics",        \
                                         raii::check_buffer_basics)                                \
  GPUKIT_RUNTIME_CONFORMANCE_CASE_DETAIL(runtime_expr, name_prefix, "zero-size buffers",           \
                                         raii::check_buffer_zero_size)                             \
  GPUKIT_RUNTIME_CONFORMANCE_CASE_DETAIL(runtime_expr, name_prefix, "buffer moves",                \
                                         raii::check_buffer_moves)                                 \
  GPUKIT_RUNTIME_CONFORMANCE_CASE_DETAIL(runtime_expr, name_prefix, "resize keeps every byte",     \
                                         raii::check_buffer_resize)                                \
  GPUKIT_RUNTIME_CONFORMANCE_CASE_DETAIL(runtime_expr, name_prefix, "release",                     \
                                         raii::check_buffer_release)                               \
  GPUKIT_RUNTIME_CONFORMANCE_CASE_DETAIL(                                                          \
    runtime_expr, name_prefix, "stream order across two streams", raii::check_buffer_stream_order) \
  GPUKIT_RUNTIME_CONFORMANCE_CASE_DETAIL(runtime_expr, name_prefix, "uvector elements",            \
                                         raii::check_uvector_elements)                             \
  GPUKIT_RUNTIME_CONFORMANCE_CASE_DETAIL(runtime_expr, name_prefix, "uvector moves and copies",    \
                                         raii::check_uvector_moves_and_copies)                     \
  GPUKIT_RUNTIME_CONFORMANCE_CASE_DETAIL(runtime_expr, name_prefix, "size overflow",               \
                                         raii::check_size_overflow)                                \
  GPUKIT_RUNTIME_CONFORMANCE_CASE_DETAIL(runtime_expr, name_prefix, "device_scalar",               \
                                         raii::check_scalar)                                       \
  GPUKIT_RUNTIME_CONFORMANCE_CASE_DETAIL(runtime_expr, name_prefix,                                \
                                         "owning stream makes allocators forget it",               \
                                         raii::check_owning_stream)                                \
  GPUKIT_RUNTIME_CONFORMANCE_CASE_DETAIL(                                                          \
    runtime_expr, name_prefix, "owning stream registers allocators from several threads",          \
    raii::check_owning_stream_threads)                                                             \
  GPUKIT_RUNTIME_CONFORMANCE_CASE_DETAIL(runtime_expr, name_prefix, "stream pool",                 \
                                         raii::check_stream_pool)                                  \
  GPUKIT_RUNTIME_CONFORMANCE_CASE_DETAIL(runtime_expr, name_prefix, "current resource",            \
                                         raii::check_current_resource)                             \
  GPUKIT_RUNTIME_CONFORMANCE_CASE_DETAIL(runtime_expr, name_prefix,                                \
                                         "current resource from several threads",                  \
                                         raii::check_current_resource_threads)
