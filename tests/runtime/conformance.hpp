// SPDX-License-Identifier: Apache-2.0
// tests/runtime/conformance.hpp: the Runtime conformance suite. Every runtime (the simulated GPU
// and the real one) runs the same cases, so that what passes on the simulator in CI means the
// same thing on a GPU.
//
// Use: in a doctest TU, after including the runtime,
//
//   GPUKIT_RUNTIME_CONFORMANCE_CASES(gpukit::cuda_runtime::instance(), "cuda_runtime")
//
// defines one TEST_CASE per `check_*` below, named "<prefix>: <what>". `runtime_expr` is evaluated
// once per case and bound with `auto&&`: an lvalue (a shared runtime) or a prvalue (a fresh one
// per case, e.g. `make_sim()`) both work.
//
// Each check acts on device 0, leaves no work pending and frees what it allocated, also when an
// assertion fails (the RAII holders below). Host functions enqueued by the checks never call the
// runtime (the contract forbids it); gates that hold a stream open themselves after 10 s so that
// a broken runtime fails the case instead of hanging it.
#pragma once

#include "support/wait.hpp"

#include <gpukit/runtime/runtime.hpp>

#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

namespace gpukit::test {

inline constexpr std::size_t kib = std::size_t{1} << 10;
inline constexpr std::size_t mib = std::size_t{1} << 20;
inline constexpr std::size_t gib = std::size_t{1} << 30;

/// Runtime-specific hooks of the suite. A TU may specialize it for its runtime (before invoking
/// GPUKIT_RUNTIME_CONFORMANCE_CASES) to let the suite see more than the contract shows.
template <class Runtime>
struct conformance_traits {
  /// An error still waiting in the runtime's last-error slot (CUDA: cudaPeekAtLastError).
  /// Every runtime call must clear its own non-sticky error, so after any call this is success.
  static typename Runtime::error_type pending_error() { return Runtime::success; }
};

template <class Runtime>
void check_no_pending_error()
{
  auto const e = conformance_traits<Runtime>::pending_error();
  CHECK_MESSAGE(e == Runtime::success,
                (std::string{"a failed call left "} + Runtime::error_name(e)));
}

// --- Helpers -------------------------------------------------------------------------------------

/// Byte `i` of pattern `seed`: a sequence that differs between neighbouring bytes and seeds, so a
/// shifted, truncated, reordered or stale copy shows.
inline unsigned char pattern_byte(std::size_t i, unsigned seed)
{
  return static_cast<unsigned char>((i * 131u + (i >> 9) + seed * 97u + 1u) & 0xffu);
}

inline void fill_pattern(void* p, std::size_t n, unsigned seed)
{
  auto* b = static_cast<unsigned char*>(p);
  for (std::size_t i = 0; i < n; ++i) { b[i] = pattern_byte(i, seed); }
}

/// Index of the first byte that is not pattern `seed`; `n` when all match.
inline std::size_t pattern_mismatch(void const* p, std::size_t n, unsigned seed)
{
  auto const* b = static_cast<unsigned char const*>(p);
  for (std::size_t i = 0; i < n; ++i) {
    if (b[i] != pattern_byte(i, seed)) { return i; }
  }
  return n;
}

/// Index of the first byte that is not `value`; `n` when all match.
inline std::size_t value_mismatch(void const* p, std::size_t n, unsigned char value)
{
  auto const* b = static_cast<unsigned char const*>(p);
  for (std::size_t i = 0; i < n; ++i) {
    if (b[i] != value) { return i; }
  }
  return n;
}

/// A host function that holds its stream until the test opens it (or 10 s pass).
struct gate {
  std::atomic<bool> open{false};
  std::atomic<bool> entered{false};
  std::atomic<bool> timed_out{false};

  static void wait(void* self)
  {
    auto* g = static_cast<gate*>(self);
    g->entered.store(true);
    if (!wait_until([g] { return g->open.load(); }, std::chrono::milliseconds{10000})) {
      g->timed_out.store(true);
    }
  }
};

/// Opens a gate and drains the device when the scope ends, also on a failed REQUIRE, so that no
/// host function outlives the stack objects it points to.
template <class Runtime>
class gate_guard final {
 public:
  gate_guard(Runtime& rt, gate& g) : rt_{rt}, gate_{g} {}
  ~gate_guard()
  {
    gate_.open.store(true);
    (void)rt_.device_synchronize();
  }
  gate_guard(gate_guard const&)            = delete;
  gate_guard& operator=(gate_guard const&) = delete;
  gate_guard(gate_guard&&)                 = delete;
  gate_guard& operator=(gate_guard&&)      = delete;

 private:
  Runtime& rt_;
  gate& gate_;
};

/// Host functions that append a value to a shared list, to observe the order they ran in.
struct recorder {
  struct entry {
    recorder* owner;
    int value;
  };

  explicit recorder(std::size_t capacity) { entries_.reserve(capacity); }

  /// An argument for `launch_host_func(s, &recorder::record, arg)`; stable until destruction.
  void* arg(int value)
  {
    REQUIRE(entries_.size() < entries_.capacity());
    entries_.push_back(entry{this, value});
    return &entries_.back();
  }

  static void record(void* p)
  {
    auto* e = static_cast<entry*>(p);
    std::lock_guard<std::mutex> lock{e->owner->mutex_};
    e->owner->order_.push_back(e->value);
  }

  [[nodiscard]] std::vector<int> order()
  {
    std::lock_guard<std::mutex> lock{mutex_};
    return order_;
  }

 private:
  std::mutex mutex_;
  std::vector<int> order_;
  std::vector<entry> entries_;
};

inline void set_flag(void* p) { static_cast<std::atomic<bool>*>(p)->store(true); }

template <class Runtime>
class scoped_stream final {
 public:
  using stream_type = typename Runtime::stream_type;
  explicit scoped_stream(Runtime& rt) : rt_{rt}
  {
    REQUIRE(rt_.stream_create(s_) == Runtime::success);
  }
  ~scoped_stream()
  {
    (void)rt_.stream_synchronize(s_);
    (void)rt_.stream_destroy(s_);
  }
  scoped_stream(scoped_stream const&)            = delete;
  scoped_stream& operator=(scoped_stream const&) = delete;
  scoped_stream(scoped_stream&&)                 = delete;
  scoped_stream& operator=(scoped_stream&&)      = delete;

  [[nodiscard]] stream_type get() const { return s_; }
  operator stream_type() const { return s_; }  // NOLINT: a handle, used like one

 private:
  Runtime& rt_;
  stream_type s_{};
};

template <class Runtime>
class scoped_event final {
 public:
  using event_type = typename Runtime::event_type;
  explicit scoped_event(Runtime& rt, bool timing = false) : rt_{rt}
  {
    REQUIRE(rt_.event_create(e_, timing) == Runtime::success);
  }
  ~scoped_event() { (void)rt_.event_destroy(e_); }
  scoped_event(scoped_event const&)            = delete;
  scoped_event& operator=(scoped_event const&) = delete;
  scoped_event(scoped_event&&)                 = delete;
  scoped_event& operator=(scoped_event&&)      = delete;

  operator event_type() const { return e_; }  // NOLINT: a handle, used like one

 private:
  Runtime& rt_;
  event_type e_{};
};

/// Where a runtime_buffer's memory comes from.
enum class buffer_kind {
  device,  ///< `malloc`, freed with `free`
  pinned,  ///< `host_alloc`, freed with `host_free`
};

/// Memory from one of the runtime's allocation calls, freed with the matching call.
template <class Runtime, buffer_kind Kind>
class runtime_buffer final {
 public:
  /// @param flags host_alloc_flags (pinned buffers only)
  runtime_buffer(Runtime& rt, std::size_t bytes, unsigned flags = host_alloc_flags::none)
      : rt_{rt}, bytes_{bytes}
  {
    auto const e =
      Kind == buffer_kind::device ? rt_.malloc(&p_, bytes) : rt_.host_alloc(&p_, bytes, flags);
    REQUIRE(e == Runtime::success);
    REQUIRE(p_ != nullptr);
  }
  ~runtime_buffer() { (void)(Kind == buffer_kind::device ? rt_.free(p_) : rt_.host_free(p_)); }
  runtime_buffer(runtime_buffer const&)            = delete;
  runtime_buffer& operator=(runtime_buffer const&) = delete;
  runtime_buffer(runtime_buffer&&)                 = delete;
  runtime_buffer& operator=(runtime_buffer&&)      = delete;

  [[nodiscard]] unsigned char* get() const { return static_cast<unsigned char*>(p_); }
  [[nodiscard]] std::size_t size() const { return bytes_; }

 private:
  Runtime& rt_;
  std::size_t bytes_;
  void* p_{nullptr};
};

template <class Runtime>
using device_buffer = runtime_buffer<Runtime, buffer_kind::device>;
template <class Runtime>
using pinned_buffer = runtime_buffer<Runtime, buffer_kind::pinned>;

/// Page-aligned pageable host memory (what host_register wants), from the C library.
class pageable_buffer final {
 public:
  explicit pageable_buffer(std::size_t bytes) : bytes_{bytes}
  {
    p_ = std::aligned_alloc(page, (bytes + page - 1) / page * page);
    REQUIRE(p_ != nullptr);
  }
  ~pageable_buffer() { std::free(p_); }
  pageable_buffer(pageable_buffer const&)            = delete;
  pageable_buffer& operator=(pageable_buffer const&) = delete;
  pageable_buffer(pageable_buffer&&)                 = delete;
  pageable_buffer& operator=(pageable_buffer&&)      = delete;

  [[nodiscard]] unsigned char* get() const { return static_cast<unsigned char*>(p_); }
  [[nodiscard]] std::size_t size() const { return bytes_; }

 private:
  static constexpr std::size_t page = 4096;
  std::size_t bytes_;
  void* p_{nullptr};
};

template <class Runtime>
void use_device_zero(Runtime& rt)
{
  REQUIRE(rt.set_device(0) == Runtime::success);
}

// --- Devices -------------------------------------------------------------------------------------

/// device_count, get/set_device, get_device_properties, versions, device_synchronize.
template <class Runtime>
void check_devices(Runtime& rt)
{
  int n = -1;
  REQUIRE(rt.device_count(n) == Runtime::success);
  REQUIRE(n >= 1);
  use_device_zero(rt);

  int d = -1;
  CHECK(rt.get_device(d) == Runtime::success);
  CHECK(d == 0);
  CHECK(rt.set_device(n) == Runtime::invalid_device);
  CHECK(rt.set_device(-1) == Runtime::invalid_device);
  check_no_pending_error<Runtime>();
  CHECK(rt.get_device(d) == Runtime::success);
  CHECK(d == 0);  // a refused set_device changes nothing

  // The current device is per thread, and a new thread starts on device 0.
  if (n >= 2) {
    REQUIRE(rt.set_device(1) == Runtime::success);
    int seen = -1;
    std::thread{[&] { (void)rt.get_device(seen); }}.join();
    CHECK(seen == 0);
    CHECK(rt.get_device(d) == Runtime::success);
    CHECK(d == 1);
    use_device_zero(rt);
  }

  for (int i = 0; i < n; ++i) {
    CAPTURE(i);
    device_properties p{};
    p.ordinal = -1;
    REQUIRE(rt.get_device_properties(p, i) == Runtime::success);
    CHECK(p.ordinal == i);
    CHECK(!p.name.empty());
    CHECK(p.major >= 1);
    CHECK(p.minor >= 0);
    CHECK(p.total_memory >= 64 * mib);
    CHECK(p.multiprocessor_count >= 1);
    CHECK(p.async_engine_count >= 1);
    CHECK(p.unified_addressing);
    CHECK(p.memory_pools);               // the suite uses malloc_async
    CHECK(p.virtual_memory_management);  // and vm_*
    CHECK(p.simulated == Runtime::is_simulated);
  }
  device_properties p{};
  CHECK(rt.get_device_properties(p, n) == Runtime::invalid_device);
  check_no_pending_error<Runtime>();

  int v = -1;
  CHECK(rt.driver_version(v) == Runtime::success);
  CHECK(v >= 1000);
  v = -1;
  CHECK(rt.runtime_version(v) == Runtime::success);
  CHECK(v >= 1000);
  CHECK(rt.device_synchronize() == Runtime::success);
}

/// mem_get_info is consistent, and malloc/free move the free figure by what they take.
template <class Runtime>
void check_mem_get_info(Runtime& rt)
{
  use_device_zero(rt);
  device_properties p{};
  REQUIRE(rt.get_device_properties(p, 0) == Runtime::success);

  std::size_t free0 = 0;
  std::size_t total = 0;
  REQUIRE(rt.mem_get_info(free0, total) == Runtime::success);
  CHECK(total > 0);
  CHECK(total <= p.total_memory);
  CHECK(total >= p.total_memory / 2);
  CHECK(free0 <= total);

  // A big allocation shows up in the free figure (real devices round to pages: tolerance).
  std::size_t const bytes     = 256 * mib;
  std::size_t const tolerance = 32 * mib;
  REQUIRE(free0 > bytes + tolerance);
  long long taken = 0;
  {
    device_buffer<Runtime> big{rt, bytes};
    std::size_t free1  = 0;
    std::size_t total1 = 0;
    REQUIRE(rt.mem_get_info(free1, total1) == Runtime::success);
    CHECK(total1 == total);
    taken = static_cast<long long>(free0) - static_cast<long long>(free1);
    CHECK(taken >= static_cast<long long>(bytes - tolerance));
    CHECK(taken <= static_cast<long long>(bytes + tolerance));
  }
  std::size_t free2 = 0;
  REQUIRE(rt.mem_get_info(free2, total) == Runtime::success);
  long long const drift = static_cast<long long>(free0) - static_cast<long long>(free2);
  CHECK(drift <= static_cast<long long>(tolerance));
  CHECK(drift >= -static_cast<long long>(tolerance));
}

// --- Streams -------------------------------------------------------------------------------------

/// Work on one stream runs in FIFO order: host functions see the order they were enqueued in,
/// and chained copies produce what only the enqueued order produces. A gate holds the stream
/// until everything is enqueued, so a runtime that ran work early or out of order would show.
template <class Runtime>
void check_stream_order(Runtime& rt)
{
  use_device_zero(rt);
  std::size_t const n = mib + 3;  // odd, to catch rounding
  scoped_stream<Runtime> s{rt};
  device_buffer<Runtime> a{rt, n};
  device_buffer<Runtime> b{rt, n};
  device_buffer<Runtime> c{rt, n};
  pinned_buffer<Runtime> src{rt, n};
  pinned_buffer<Runtime> out{rt, 3 * n};
  fill_pattern(src.get(), n, 1);
  std::memset(out.get(), 0, 3 * n);

  constexpr int extra = 64;
  recorder rec{8 + extra};
  auto step = [&](int i) {
    REQUIRE(rt.launch_host_func(s, &recorder::record, rec.arg(i)) == Runtime::success);
  };
  auto copy = [&](void* dst, void const* from, memcpy_kind k) {
    REQUIRE(rt.memcpy_async(dst, from, n, k, s) == Runtime::success);
  };
  gate g;
  gate_guard<Runtime> guard{rt, g};
  REQUIRE(rt.launch_host_func(s, &gate::wait, &g) == Runtime::success);

  step(0);
  copy(a.get(), src.get(), memcpy_kind::host_to_device);
  step(1);
  copy(b.get(), a.get(), memcpy_kind::device_to_device);
  step(2);
  REQUIRE(rt.memset_async(a.get(), 0x22, n, s) == Runtime::success);
  step(3);
  copy(c.get(), a.get(), memcpy_kind::device_to_device);
  step(4);
  REQUIRE(rt.memset_async(a.get(), 0x33, n, s) == Runtime::success);
  step(5);
  for (int i = 0; i < extra; ++i) { step(6 + i); }
  copy(out.get(), b.get(), memcpy_kind::device_to_host);
  copy(out.get() + n, c.get(), memcpy_kind::device_to_host);
  copy(out.get() + 2 * n, a.get(), memcpy_kind::device_to_host);
  CHECK(rt.stream_query(s) == Runtime::not_ready);
  CHECK(rec.order().empty());

  g.open.store(true);
  REQUIRE(rt.stream_synchronize(s) == Runtime::success);
  CHECK(rt.stream_query(s) == Runtime::success);
  CHECK_FALSE(g.timed_out.load());

  std::vector<int> expected(6 + extra);
  for (int i = 0; i < 6 + extra; ++i) { expected[static_cast<std::size_t>(i)] = i; }
  CHECK(rec.order() == expected);
  CHECK(pattern_mismatch(out.get(), n, 1) == n);           // b copied a before the memsets
  CHECK(value_mismatch(out.get() + n, n, 0x22) == n);      // c copied a between them
  CHECK(value_mismatch(out.get() + 2 * n, n, 0x33) == n);  // a ends with the last
}

/// Work on a stream runs asynchronously: enqueueing never waits for it, stream_query says
/// NotReady while it is pending, stream_synchronize waits for all of it.
template <class Runtime>
void check_stream_async(Runtime& rt)
{
  use_device_zero(rt);
  std::size_t const n = 64 * kib;
  scoped_stream<Runtime> s{rt};
  scoped_event<Runtime> e{rt};
  device_buffer<Runtime> d{rt, n};
  pinned_buffer<Runtime> out{rt, n};
  std::memset(out.get(), 0, n);
  gate g;
  std::atomic<bool> done{false};
  gate_guard<Runtime> guard{rt, g};

  CHECK(rt.stream_query(s) == Runtime::success);  // a new stream is idle
  REQUIRE(rt.launch_host_func(s, &gate::wait, &g) == Runtime::success);
  REQUIRE(rt.memset_async(d.get(), 0x5c, n, s) == Runtime::success);
  REQUIRE(rt.memcpy_async(out.get(), d.get(), n, memcpy_kind::device_to_host, s) ==
          Runtime::success);
  REQUIRE(rt.event_record(e, s) == Runtime::success);
  REQUIRE(rt.launch_host_func(s, &set_flag, &done) == Runtime::success);

  CHECK(rt.stream_query(s) == Runtime::not_ready);
  CHECK(rt.event_query(e) == Runtime::not_ready);
  CHECK(wait_until([&] { return g.entered.load(); }));  // the gate really runs, on its own
  std::this_thread::sleep_for(std::chrono::milliseconds{20});
  CHECK(rt.stream_query(s) == Runtime::not_ready);  // and really holds the stream
  CHECK_FALSE(done.load());
  CHECK(value_mismatch(out.get(), n, 0) == n);  // the copy behind it has not run
  check_no_pending_error<Runtime>();            // NotReady is an answer, not an error

  g.open.store(true);
  CHECK(rt.stream_synchronize(s) == Runtime::success);
  CHECK(done.load());  // stream_synchronize returned after the last host function
  CHECK_FALSE(g.timed_out.load());
  CHECK(rt.stream_query(s) == Runtime::success);
  CHECK(rt.event_query(e) == Runtime::success);
  CHECK(value_mismatch(out.get(), n, 0x5c) == n);
}

/// stream_destroy returns at once; the work already queued on the stream still runs.
template <class Runtime>
void check_stream_destroy_pending(Runtime& rt)
{
  use_device_zero(rt);
  gate g;
  std::atomic<bool> done{false};
  gate_guard<Runtime> guard{rt, g};
  typename Runtime::stream_type s{};
  REQUIRE(rt.stream_create(s) == Runtime::success);
  REQUIRE(rt.launch_host_func(s, &gate::wait, &g) == Runtime::success);
  REQUIRE(rt.launch_host_func(s, &set_flag, &done) == Runtime::success);
  CHECK(rt.stream_destroy(s) == Runtime::success);
  CHECK_FALSE(done.load());
  CHECK_FALSE(g.timed_out.load());  // destroy did not wait for the gate
  g.open.store(true);
  CHECK(wait_until([&] { return done.load(); }));
  CHECK(rt.device_synchronize() == Runtime::success);
}

/// The default stream (a value-initialized stream_type) takes work like any other.
template <class Runtime>
void check_default_stream(Runtime& rt)
{
  use_device_zero(rt);
  std::size_t const n = 4 * kib + 1;
  typename Runtime::stream_type const s{};
  device_buffer<Runtime> d{rt, n};
  pinned_buffer<Runtime> out{rt, n};
  scoped_event<Runtime> e{rt};
  std::atomic<bool> done{false};
  REQUIRE(rt.memset_async(d.get(), 0x6d, n, s) == Runtime::success);
  REQUIRE(rt.memcpy_async(out.get(), d.get(), n, memcpy_kind::device_to_host, s) ==
          Runtime::success);
  REQUIRE(rt.launch_host_func(s, &set_flag, &done) == Runtime::success);
  REQUIRE(rt.event_record(e, s) == Runtime::success);
  CHECK(rt.stream_synchronize(s) == Runtime::success);
  CHECK(done.load());
  CHECK(rt.event_query(e) == Runtime::success);
  CHECK(rt.stream_query(s) == Runtime::success);
  CHECK(value_mismatch(out.get(), n, 0x6d) == n);
}

/// Several threads allocate, copy and synchronize on their own streams at once.
template <class Runtime>
void check_threads(Runtime& rt)
{
  use_device_zero(rt);
  constexpr int threads    = 4;
  constexpr int iterations = 16;
  std::size_t const n      = 64 * kib;
  std::atomic<int> failures{0};
  std::atomic<int> wrong_device{0};
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      int d = -1;
      if (rt.get_device(d) != Runtime::success || d != 0) { ++wrong_device; }
      typename Runtime::stream_type s{};
      if (rt.stream_create(s) != Runtime::success) {
        ++failures;
        return;
      }
      void* host = nullptr;
      if (rt.host_alloc(&host, n, host_alloc_flags::none) != Runtime::success) { ++failures; }
      for (int i = 0; i < iterations && host != nullptr; ++i) {
        void* a          = nullptr;
        void* b          = nullptr;
        auto const value = static_cast<unsigned char>(t * 31 + i);
        bool ok          = rt.malloc(&a, n) == Runtime::success;
        ok               = ok && rt.malloc_async(&b, n, s) == Runtime::success;
        ok               = ok && rt.memset_async(a, value, n, s) == Runtime::success;
        ok = ok && rt.memcpy_async(b, a, n, memcpy_kind::device_to_device, s) == Runtime::success;
        ok = ok && rt.memcpy_async(host, b, n, memcpy_kind::device_to_host, s) == Runtime::success;
        ok = ok && rt.free_async(b, s) == Runtime::success;
        ok = ok && rt.stream_synchronize(s) == Runtime::success;
        ok = ok && rt.free(a) == Runtime::success;
        ok = ok && value_mismatch(host, n, value) == n;
        if (!ok) { ++failures; }
      }
      if (host != nullptr && rt.host_free(host) != Runtime::success) { ++failures; }
      if (rt.stream_destroy(s) != Runtime::success) { ++failures; }
    });
  }
  for (auto& th : pool) { th.join(); }
  CHECK(failures.load() == 0);
  CHECK(wrong_device.load() == 0);
}

// --- Events --------------------------------------------------------------------------------------

/// Event states: never recorded, recorded and complete, re-recorded behind pending work,
/// destroyed while pending.
template <class Runtime>
void check_events(Runtime& rt)
{
  use_device_zero(rt);
  scoped_stream<Runtime> s{rt};
  device_buffer<Runtime> d{rt, mib};
  scoped_event<Runtime> e{rt};

  CHECK(rt.event_query(e) == Runtime::success);  // never recorded: nothing to wait for
  CHECK(rt.event_synchronize(e) == Runtime::success);

  REQUIRE(rt.memset_async(d.get(), 1, mib, s) == Runtime::success);
  REQUIRE(rt.event_record(e, s) == Runtime::success);
  CHECK(rt.event_synchronize(e) == Runtime::success);
  CHECK(rt.event_query(e) == Runtime::success);

  gate g;
  gate_guard<Runtime> guard{rt, g};
  REQUIRE(rt.launch_host_func(s, &gate::wait, &g) == Runtime::success);
  REQUIRE(rt.event_record(e, s) == Runtime::success);  // re-record: now it captures the gate
  CHECK(rt.event_query(e) == Runtime::not_ready);

  typename Runtime::event_type doomed{};
  REQUIRE(rt.event_create(doomed, false) == Runtime::success);
  REQUIRE(rt.event_record(doomed, s) == Runtime::success);
  CHECK(rt.event_destroy(doomed) == Runtime::success);  // returns at once while pending
  CHECK_FALSE(g.timed_out.load());

  // An event recorded on another, idle stream is complete at once even though e is not.
  scoped_stream<Runtime> idle{rt};
  scoped_event<Runtime> f{rt};
  REQUIRE(rt.event_record(f, idle) == Runtime::success);
  CHECK(rt.event_synchronize(f) == Runtime::success);
  CHECK(rt.event_query(e) == Runtime::not_ready);
  check_no_pending_error<Runtime>();

  g.open.store(true);
  CHECK(rt.event_synchronize(e) == Runtime::success);
  CHECK(rt.event_query(e) == Runtime::success);
  CHECK_FALSE(g.timed_out.load());
}

/// stream_wait_event orders work across streams: B's work waits for A's capture.
template <class Runtime>
void check_stream_wait_event(Runtime& rt)
{
  use_device_zero(rt);
  scoped_stream<Runtime> a{rt};
  scoped_stream<Runtime> b{rt};
  scoped_event<Runtime> on_a{rt};
  scoped_event<Runtime> on_b{rt};
  recorder rec{4};
  gate g;
  gate_guard<Runtime> guard{rt, g};

  REQUIRE(rt.launch_host_func(a, &gate::wait, &g) == Runtime::success);
  REQUIRE(rt.launch_host_func(a, &recorder::record, rec.arg(1)) == Runtime::success);
  REQUIRE(rt.event_record(on_a, a) == Runtime::success);

  REQUIRE(rt.stream_wait_event(b, on_a) == Runtime::success);
  REQUIRE(rt.launch_host_func(b, &recorder::record, rec.arg(2)) == Runtime::success);
  REQUIRE(rt.event_record(on_b, b) == Runtime::success);

  // Re-recording on_a afterwards must not change what b already waits for.
  scoped_stream<Runtime> idle{rt};
  REQUIRE(rt.event_record(on_a, idle) == Runtime::success);

  CHECK(rt.event_query(on_b) == Runtime::not_ready);
  std::this_thread::sleep_for(std::chrono::milliseconds{20});
  CHECK(rt.event_query(on_b) == Runtime::not_ready);
  CHECK(rt.stream_query(b) == Runtime::not_ready);
  CHECK(rec.order().empty());

  g.open.store(true);
  CHECK(rt.stream_synchronize(b) == Runtime::success);
  CHECK(rec.order() == std::vector<int>{1, 2});
  CHECK(rt.event_query(on_b) == Runtime::success);
  CHECK(rt.stream_synchronize(a) == Runtime::success);
  CHECK_FALSE(g.timed_out.load());

  // Waiting on an event that was never recorded waits for nothing.
  scoped_event<Runtime> never{rt};
  scoped_event<Runtime> after{rt};
  REQUIRE(rt.stream_wait_event(b, never) == Runtime::success);
  REQUIRE(rt.event_record(after, b) == Runtime::success);
  CHECK(rt.event_synchronize(after) == Runtime::success);
}

/// Graph capture as CUDA does it (measured on an H200), for the runtimes that can begin one (both
/// shipped ones: begin_capture/end_capture are theirs, not the contract's): a stream that waits on
/// an event recorded in a capture joins it; stream_is_capturing and stream_capture_id are legal
/// on any capturing stream, stream_get_device invalidates the capture; work forked and not joined
/// back fails the end; an event recorded in a capture cannot be queried; unsafe calls follow the
/// capture's mode.
template <class Runtime>
void check_graph_capture(Runtime& rt)
{
  use_device_zero(rt);
  scoped_stream<Runtime> a{rt};
  scoped_stream<Runtime> b{rt};
  scoped_event<Runtime> fork{rt};
  scoped_event<Runtime> join{rt};
  void* d = nullptr;
  REQUIRE(rt.malloc(&d, 64 * kib) == Runtime::success);
  auto capturing = [&](typename Runtime::stream_type s) {
    bool c = false;
    CHECK(rt.stream_is_capturing(s, c) == Runtime::success);
    return c;
  };
  auto capture_id = [&](typename Runtime::stream_type s) {
    unsigned long long id = 0;
    CHECK(rt.stream_capture_id(s, id) == Runtime::success);
    return id;
  };
  for (int mode : {Runtime::capture_mode_global, Runtime::capture_mode_thread_local,
                   Runtime::capture_mode_relaxed}) {
    INFO("capture mode " << mode);
    // Fork and join: legal, and the side stream is part of the capture.
    REQUIRE(rt.begin_capture(a, mode) == Runtime::success);
    CHECK(rt.event_record(fork, a) == Runtime::success);
    CHECK(rt.stream_wait_event(b, fork) == Runtime::success);
    CHECK(capturing(b));
    CHECK(capture_id(b) != 0);
    CHECK(capture_id(b) == capture_id(a));
    CHECK(rt.memset_async(d, 1, 64 * kib, b) == Runtime::success);
    CHECK(rt.event_record(join, b) == Runtime::success);
    CHECK(rt.stream_wait_event(a, join) == Runtime::success);
    CHECK(rt.end_capture(a) == Runtime::success);
    CHECK_FALSE(capturing(a));
    CHECK_FALSE(capturing(b));
    CHECK(capture_id(b) == 0);

    // Asking a joined stream its device invalidates the capture.
    REQUIRE(rt.begin_capture(a, mode) == Runtime::success);
    CHECK(rt.event_record(fork, a) == Runtime::success);
    CHECK(rt.stream_wait_event(b, fork) == Runtime::success);
    int device = -1;
    CHECK(rt.stream_get_device(b, device) == Runtime::stream_capture_unsupported);
    CHECK(rt.event_record(join, b) == Runtime::stream_capture_invalidated);
    CHECK(rt.end_capture(a) == Runtime::stream_capture_invalidated);
    CHECK_FALSE(capturing(b));

    // Work forked and never joined back.
    REQUIRE(rt.begin_capture(a, mode) == Runtime::success);
    CHECK(rt.event_record(fork, a) == Runtime::success);
    CHECK(rt.stream_wait_event(b, fork) == Runtime::success);
    CHECK(rt.memset_async(d, 2, 64 * kib, b) == Runtime::success);
    CHECK(rt.end_capture(a) == Runtime::stream_capture_unjoined);
    CHECK_FALSE(capturing(b));
  }

  // An event recorded in a capture is no work that completes (relaxed everywhere: only that rule
  // is at stake).
  int thread_mode = Runtime::capture_mode_relaxed;
  REQUIRE(rt.exchange_capture_mode(thread_mode) == Runtime::success);
  REQUIRE(rt.begin_capture(a, Runtime::capture_mode_relaxed) == Runtime::success);
  CHECK(rt.event_record(fork, a) == Runtime::success);
  CHECK(rt.event_query(fork) == Runtime::captured_event);
  (void)rt.end_capture(a);
  CHECK_FALSE(capturing(a));
  CHECK(rt.exchange_capture_mode(thread_mode) == Runtime::success);

  // Modes: a global capture refuses the capturing thread's malloc; a thread-local one lets
  // another thread's through.
  REQUIRE(rt.begin_capture(a, Runtime::capture_mode_global) == Runtime::success);
  void* p = nullptr;
  CHECK(rt.malloc(&p, 4 * kib) == Runtime::stream_capture_unsupported);
  CHECK(rt.end_capture(a) == Runtime::stream_capture_invalidated);
  REQUIRE(rt.begin_capture(a, Runtime::capture_mode_thread_local) == Runtime::success);
  typename Runtime::error_type other = Runtime::unknown;
  std::thread{[&] {
    if (rt.set_device(0) == Runtime::success) { other = rt.malloc(&p, 4 * kib); }
  }}.join();
  CHECK(other == Runtime::success);
  CHECK(rt.end_capture(a) == Runtime::success);
  if (p != nullptr) { CHECK(rt.free(p) == Runtime::success); }
  CHECK(rt.free(d) == Runtime::success);
  check_no_pending_error<Runtime>();
}

/// Elapsed time between timing events; an error for events created without timing.
template <class Runtime>
void check_elapsed_time(Runtime& rt)
{
  use_device_zero(rt);
  scoped_stream<Runtime> s{rt};
  device_buffer<Runtime> d{rt, 16 * mib};
  scoped_event<Runtime> start{rt, true};
  scoped_event<Runtime> stop{rt, true};
  float ms = -1.0f;

  CHECK(rt.event_elapsed_time(ms, start, stop) == Runtime::invalid_resource_handle);  // unrecorded
  REQUIRE(rt.event_record(start, s) == Runtime::success);
  REQUIRE(rt.memset_async(d.get(), 3, d.size(), s) == Runtime::success);
  REQUIRE(rt.event_record(stop, s) == Runtime::success);
  REQUIRE(rt.event_synchronize(stop) == Runtime::success);
  ms = -1.0f;
  CHECK(rt.event_elapsed_time(ms, start, stop) == Runtime::success);
  CHECK(ms >= 0.0f);
  CHECK(ms < 10000.0f);

  scoped_event<Runtime> plain_start{rt};
  scoped_event<Runtime> plain_stop{rt};
  REQUIRE(rt.event_record(plain_start, s) == Runtime::success);
  REQUIRE(rt.event_record(plain_stop, s) == Runtime::success);
  REQUIRE(rt.stream_synchronize(s) == Runtime::success);
  CHECK(rt.event_elapsed_time(ms, plain_start, plain_stop) == Runtime::invalid_resource_handle);
  CHECK(rt.event_elapsed_time(ms, start, plain_stop) == Runtime::invalid_resource_handle);
  check_no_pending_error<Runtime>();
}

// --- Copies --------------------------------------------------------------------------------------

/// Every copy kind, from pinned and pageable host memory, at odd sizes and offsets.
template <class Runtime>
void check_copies(Runtime& rt)
{
  use_device_zero(rt);
  std::size_t const n = mib + 7;
  scoped_stream<Runtime> s{rt};
  device_buffer<Runtime> d1{rt, n};
  device_buffer<Runtime> d2{rt, n};
  pinned_buffer<Runtime> pinned_src{rt, n};
  pinned_buffer<Runtime> pinned_dst{rt, n};
  std::vector<unsigned char> pageable_src(n);
  std::vector<unsigned char> pageable_dst(n);
  auto copy = [&](void* dst, void const* src, std::size_t bytes, memcpy_kind k) {
    REQUIRE(rt.memcpy_async(dst, src, bytes, k, s) == Runtime::success);
  };
  auto sync  = [&] { REQUIRE(rt.stream_synchronize(s) == Runtime::success); };
  auto clear = [&] { pageable_dst.assign(n, 0), (void)std::memset(pinned_dst.get(), 0, n); };

  SUBCASE("pinned H2D, D2D, D2H to pageable")
  {
    clear();
    fill_pattern(pinned_src.get(), n, 11);
    copy(d1.get(), pinned_src.get(), n, memcpy_kind::host_to_device);
    copy(d2.get(), d1.get(), n, memcpy_kind::device_to_device);
    copy(pageable_dst.data(), d2.get(), n, memcpy_kind::device_to_host);
    sync();
    CHECK(pattern_mismatch(pageable_dst.data(), n, 11) == n);
  }
  SUBCASE("pageable H2D, D2H to pinned")
  {
    clear();
    fill_pattern(pageable_src.data(), n, 12);
    copy(d1.get(), pageable_src.data(), n, memcpy_kind::host_to_device);
    copy(pinned_dst.get(), d1.get(), n, memcpy_kind::device_to_host);
    sync();
    CHECK(pattern_mismatch(pinned_dst.get(), n, 12) == n);
  }
  SUBCASE("H2H, pageable and pinned")
  {
    clear();
    fill_pattern(pageable_src.data(), n, 13);
    copy(pinned_dst.get(), pageable_src.data(), n, memcpy_kind::host_to_host);
    sync();
    CHECK(pattern_mismatch(pinned_dst.get(), n, 13) == n);
    copy(pageable_dst.data(), pinned_dst.get(), n, memcpy_kind::host_to_host);
    sync();
    CHECK(pattern_mismatch(pageable_dst.data(), n, 13) == n);
  }
  SUBCASE("inferred directions")
  {
    clear();
    fill_pattern(pageable_src.data(), n, 14);
    copy(d1.get(), pageable_src.data(), n, memcpy_kind::infer);
    copy(d2.get(), d1.get(), n, memcpy_kind::infer);
    copy(pinned_dst.get(), d2.get(), n, memcpy_kind::infer);
    copy(pageable_dst.data(), pinned_dst.get(), n, memcpy_kind::infer);
    sync();
    CHECK(pattern_mismatch(pinned_dst.get(), n, 14) == n);
    CHECK(pattern_mismatch(pageable_dst.data(), n, 14) == n);
  }
  SUBCASE("unaligned offsets")
  {
    clear();
    std::size_t const m = n - 64;
    fill_pattern(pinned_src.get() + 5, m, 15);
    copy(d1.get() + 1, pinned_src.get() + 5, m, memcpy_kind::host_to_device);
    copy(d2.get() + 3, d1.get() + 1, m, memcpy_kind::device_to_device);
    copy(pageable_dst.data() + 7, d2.get() + 3, m, memcpy_kind::device_to_host);
    sync();
    CHECK(pattern_mismatch(pageable_dst.data() + 7, m, 15) == m);
    CHECK(value_mismatch(pageable_dst.data(), 7, 0) == 7);  // nothing written before dst
    CHECK(value_mismatch(pageable_dst.data() + 7 + m, n - 7 - m, 0) == n - 7 - m);  // or after
  }
  SUBCASE("memset a window")
  {
    clear();
    fill_pattern(pinned_src.get(), n, 16);
    copy(d1.get(), pinned_src.get(), n, memcpy_kind::host_to_device);
    REQUIRE(rt.memset_async(d1.get() + 100, 0x5a, 1000, s) == Runtime::success);
    REQUIRE(rt.memset_async(d1.get() + n - 1, 0x1ff, 1, s) == Runtime::success);  // value is a byte
    copy(pinned_dst.get(), d1.get(), n, memcpy_kind::device_to_host);
    sync();
    CHECK(pattern_mismatch(pinned_dst.get(), 100, 16) == 100);
    CHECK(value_mismatch(pinned_dst.get() + 100, 1000, 0x5a) == 1000);
    std::vector<unsigned char> rest(pinned_src.get() + 1100, pinned_src.get() + n - 1);
    CHECK(std::memcmp(pinned_dst.get() + 1100, rest.data(), rest.size()) == 0);
    CHECK(pinned_dst.get()[n - 1] == 0xff);
  }
  SUBCASE("peer copy within one device")
  {
    clear();
    fill_pattern(pinned_src.get(), n, 17);
    copy(d1.get(), pinned_src.get(), n, memcpy_kind::host_to_device);
    REQUIRE(rt.memcpy_peer_async(d2.get(), 0, d1.get(), 0, n, s) == Runtime::success);
    copy(pinned_dst.get(), d2.get(), n, memcpy_kind::device_to_host);
    sync();
    CHECK(pattern_mismatch(pinned_dst.get(), n, 17) == n);
  }
  SUBCASE("peer copy between devices")
  {
    int count = 0;
    REQUIRE(rt.device_count(count) == Runtime::success);
    if (count < 2) { return; }  // needs a second device
    clear();
    REQUIRE(rt.set_device(1) == Runtime::success);
    void* remote     = nullptr;
    auto const alloc = rt.malloc(&remote, n);
    use_device_zero(rt);
    REQUIRE(alloc == Runtime::success);
    fill_pattern(pinned_src.get(), n, 18);
    copy(d1.get(), pinned_src.get(), n, memcpy_kind::host_to_device);
    REQUIRE(rt.memcpy_peer_async(remote, 1, d1.get(), 0, n, s) == Runtime::success);
    REQUIRE(rt.memcpy_peer_async(d2.get(), 0, remote, 1, n, s) == Runtime::success);
    copy(pinned_dst.get(), d2.get(), n, memcpy_kind::device_to_host);
    sync();
    CHECK(pattern_mismatch(pinned_dst.get(), n, 18) == n);
    CHECK(rt.free(remote) == Runtime::success);
  }
}

// --- Memory --------------------------------------------------------------------------------------

/// Stream-ordered allocation: distinct, usable blocks; free_async after use.
template <class Runtime>
void check_malloc_async(Runtime& rt)
{
  use_device_zero(rt);
  scoped_stream<Runtime> s{rt};
  constexpr int blocks = 12;
  std::size_t sizes[blocks];
  void* ptrs[blocks] = {};
  std::size_t total  = 0;
  for (int i = 0; i < blocks; ++i) {
    sizes[i] = (std::size_t{1} << (8 + i)) + static_cast<std::size_t>(i) * 3;  // 256 B .. 512 KiB
    total += sizes[i];
    REQUIRE(rt.malloc_async(&ptrs[i], sizes[i], s) == Runtime::success);
    REQUIRE(ptrs[i] != nullptr);
    REQUIRE(rt.memset_async(ptrs[i], 0x10 + i, sizes[i], s) == Runtime::success);
  }
  pinned_buffer<Runtime> out{rt, total};
  std::size_t offset = 0;
  for (int i = 0; i < blocks; ++i) {
    REQUIRE(rt.memcpy_async(out.get() + offset, ptrs[i], sizes[i], memcpy_kind::device_to_host,
                            s) == Runtime::success);
    offset += sizes[i];
  }
  for (int i = 0; i < blocks; ++i) { REQUIRE(rt.free_async(ptrs[i], s) == Runtime::success); }
  REQUIRE(rt.stream_synchronize(s) == Runtime::success);

  offset = 0;
  for (int i = 0; i < blocks; ++i) {
    CAPTURE(i);
    // Overlapping blocks would have overwritten each other's value.
    CHECK(value_mismatch(out.get() + offset, sizes[i], static_cast<unsigned char>(0x10 + i)) ==
          sizes[i]);
    offset += sizes[i];
    for (int j = 0; j < i; ++j) {
      auto const a = reinterpret_cast<std::uintptr_t>(ptrs[i]);
      auto const b = reinterpret_cast<std::uintptr_t>(ptrs[j]);
      CHECK((a + sizes[i] <= b || b + sizes[j] <= a));
    }
  }
}

/// Pinned host memory: host_alloc/host_free with each flag, host_register/unregister and the
/// errors of registering twice and unregistering what is not registered.
template <class Runtime>
void check_pinned_host(Runtime& rt)
{
  use_device_zero(rt);
  std::size_t const n = mib;
  scoped_stream<Runtime> s{rt};
  device_buffer<Runtime> d{rt, n};

  for (unsigned flags :
       {host_alloc_flags::none, host_alloc_flags::portable, host_alloc_flags::mapped,
        host_alloc_flags::write_combined, host_alloc_flags::portable | host_alloc_flags::mapped}) {
    CAPTURE(flags);
    void* p = nullptr;
    REQUIRE(rt.host_alloc(&p, n, flags) == Runtime::success);
    REQUIRE(p != nullptr);
    fill_pattern(p, n, 21);  // host-writable (write-combined memory is too)
    REQUIRE(rt.memcpy_async(d.get(), p, n, memcpy_kind::host_to_device, s) == Runtime::success);
    REQUIRE(rt.stream_synchronize(s) == Runtime::success);
    CHECK(rt.host_free(p) == Runtime::success);
  }
  pinned_buffer<Runtime> back{rt, n};
  REQUIRE(rt.memcpy_async(back.get(), d.get(), n, memcpy_kind::device_to_host, s) ==
          Runtime::success);
  REQUIRE(rt.stream_synchronize(s) == Runtime::success);
  CHECK(pattern_mismatch(back.get(), n, 21) == n);

  pageable_buffer host{n};
  fill_pattern(host.get(), n, 22);
  REQUIRE(rt.host_register(host.get(), n, host_register_flags::none) == Runtime::success);
  CHECK(rt.host_register(host.get(), n, host_register_flags::none) ==
        Runtime::host_memory_already_registered);
  check_no_pending_error<Runtime>();
  REQUIRE(rt.memcpy_async(d.get(), host.get(), n, memcpy_kind::host_to_device, s) ==
          Runtime::success);
  std::memset(back.get(), 0, n);
  REQUIRE(rt.memcpy_async(back.get(), d.get(), n, memcpy_kind::device_to_host, s) ==
          Runtime::success);
  REQUIRE(rt.stream_synchronize(s) == Runtime::success);
  CHECK(pattern_mismatch(back.get(), n, 22) == n);
  CHECK(rt.host_unregister(host.get()) == Runtime::success);
  CHECK(rt.host_unregister(host.get()) == Runtime::host_memory_not_registered);
  check_no_pending_error<Runtime>();

  // Registered again after unregistering, with flags passed through.
  CHECK(
    rt.host_register(host.get(), n, host_register_flags::portable | host_register_flags::mapped) ==
    Runtime::success);
  CHECK(rt.host_unregister(host.get()) == Runtime::success);
}

/// Virtual memory: reserve four granules, back two with separate physical handles mapped side by
/// side, copy across the boundary, and undo it all in order.
template <class Runtime>
void check_virtual_memory(Runtime& rt)
{
  use_device_zero(rt);
  std::size_t g = 0;
  REQUIRE(rt.vm_granularity(g, 0) == Runtime::success);
  REQUIRE(g > 0);
  CHECK((g & (g - 1)) == 0);

  void* va = nullptr;
  REQUIRE(rt.vm_reserve(&va, 4 * g, 0) == Runtime::success);
  REQUIRE(va != nullptr);
  CHECK(reinterpret_cast<std::uintptr_t>(va) % g == 0);
  auto* const base = static_cast<unsigned char*>(va);

  typename Runtime::physical_handle h1{};
  typename Runtime::physical_handle h2{};
  REQUIRE(rt.vm_create(h1, g, 0) == Runtime::success);
  REQUIRE(rt.vm_create(h2, g, 0) == Runtime::success);
  REQUIRE(rt.vm_map(base, g, h1) == Runtime::success);
  REQUIRE(rt.vm_map(base + g, g, h2) == Runtime::success);
  REQUIRE(rt.vm_set_access(base, 2 * g, 0) == Runtime::success);  // one call over both mappings
  CHECK(rt.vm_set_access(base + g, g, 0) == Runtime::success);    // and again over one: idempotent
  CHECK(rt.vm_release(h2) == Runtime::success);  // still mapped: the memory stays until unmapped

  CHECK(rt.vm_map(base, g, h1) != Runtime::success);  // already mapped there
  check_no_pending_error<Runtime>();

  {
    std::size_t const n = 2 * g;
    scoped_stream<Runtime> s{rt};
    pinned_buffer<Runtime> src{rt, n};
    pinned_buffer<Runtime> dst{rt, n};
    device_buffer<Runtime> plain{rt, g};
    fill_pattern(src.get(), n, 31);
    std::memset(dst.get(), 0, n);
    REQUIRE(rt.memcpy_async(base, src.get(), n, memcpy_kind::host_to_device, s) ==
            Runtime::success);
    REQUIRE(rt.memcpy_async(dst.get(), base, n, memcpy_kind::device_to_host, s) ==
            Runtime::success);
    REQUIRE(rt.stream_synchronize(s) == Runtime::success);
    CHECK(pattern_mismatch(dst.get(), n, 31) == n);

    // Device-to-device across the boundary, and a memset straddling it.
    REQUIRE(rt.memcpy_async(plain.get(), base + g / 2, g, memcpy_kind::device_to_device, s) ==
            Runtime::success);
    REQUIRE(rt.memset_async(base + g - 8, 0x77, 16, s) == Runtime::success);
    REQUIRE(rt.memcpy_async(dst.get(), plain.get(), g, memcpy_kind::device_to_host, s) ==
            Runtime::success);
    REQUIRE(rt.memcpy_async(dst.get() + g, base + g - 8, 16, memcpy_kind::device_to_host, s) ==
            Runtime::success);
    REQUIRE(rt.stream_synchronize(s) == Runtime::success);
    CHECK(std::memcmp(dst.get(), src.get() + g / 2, g) == 0);
    CHECK(value_mismatch(dst.get() + g, 16, 0x77) == 16);
  }

  // Unmapping what is not mapped: CUDA (driver 580 on the H200) returns success; the simulated
  // GPU reports it as misuse, which is stricter. Either way nothing changes.
  auto const unmapped = rt.vm_unmap(base + 2 * g, g);  // reserved but never mapped
  if (Runtime::is_simulated) { CHECK(unmapped != Runtime::success); }
  check_no_pending_error<Runtime>();
  CHECK(rt.vm_unmap(base, g) == Runtime::success);
  CHECK(rt.vm_unmap(base + g, g) == Runtime::success);
  auto const twice = rt.vm_unmap(base, g);  // twice
  if (Runtime::is_simulated) { CHECK(twice != Runtime::success); }
  check_no_pending_error<Runtime>();

  // The range is a plain reservation again: map h1 elsewhere in it, use it, undo.
  REQUIRE(rt.vm_map(base + 3 * g, g, h1) == Runtime::success);
  REQUIRE(rt.vm_set_access(base + 3 * g, g, 0) == Runtime::success);
  {
    scoped_stream<Runtime> s{rt};
    pinned_buffer<Runtime> out{rt, g};
    REQUIRE(rt.memset_async(base + 3 * g, 0x42, g, s) == Runtime::success);
    REQUIRE(rt.memcpy_async(out.get(), base + 3 * g, g, memcpy_kind::device_to_host, s) ==
            Runtime::success);
    REQUIRE(rt.stream_synchronize(s) == Runtime::success);
    CHECK(value_mismatch(out.get(), g, 0x42) == g);
  }
  CHECK(rt.vm_unmap(base + 3 * g, g) == Runtime::success);
  CHECK(rt.vm_release(h1) == Runtime::success);
  CHECK(rt.vm_free(va, 4 * g) == Runtime::success);
}

// --- Errors --------------------------------------------------------------------------------------

/// Bad input gets an error (CUDA's code), leaves nothing behind, and the runtime keeps working.
template <class Runtime>
void check_errors(Runtime& rt)
{
  use_device_zero(rt);
  int on_stack = 0;
  CHECK(rt.free(&on_stack) == Runtime::invalid_value);  // never returned by malloc
  check_no_pending_error<Runtime>();
  CHECK(rt.free(nullptr) == Runtime::success);  // as with cudaFree: nothing to do
  CHECK(rt.host_unregister(&on_stack) == Runtime::host_memory_not_registered);
  check_no_pending_error<Runtime>();

  {
    device_buffer<Runtime> still_works{rt, 4 * kib};
    scoped_stream<Runtime> s{rt};
    CHECK(rt.memset_async(still_works.get(), 0, 4 * kib, s) == Runtime::success);
    CHECK(rt.stream_synchronize(s) == Runtime::success);
  }

  std::string const oom_name = Runtime::error_name(Runtime::out_of_memory);
  CHECK_FALSE(oom_name.empty());
  CHECK(oom_name != Runtime::error_name(Runtime::success));
  CHECK(oom_name != Runtime::error_name(Runtime::not_ready));
  CHECK_FALSE(std::string{Runtime::error_string(Runtime::out_of_memory)}.empty());
  CHECK(std::string{Runtime::error_string(Runtime::out_of_memory)} !=
        std::string{Runtime::error_string(Runtime::invalid_value)});
}

/// Asking for more than the device has fails with Runtime::out_of_memory, and the next
/// allocation works (the error did not stick).
template <class Runtime>
void check_out_of_memory(Runtime& rt)
{
  use_device_zero(rt);
  std::size_t free_bytes = 0;
  std::size_t total      = 0;
  REQUIRE(rt.mem_get_info(free_bytes, total) == Runtime::success);
  std::size_t const too_much = total + gib;

  void* p = nullptr;
  CHECK(rt.malloc(&p, too_much) == Runtime::out_of_memory);
  check_no_pending_error<Runtime>();
  void* q = nullptr;
  CHECK(rt.malloc(&q, mib) == Runtime::success);
  CHECK(q != nullptr);
  CHECK(rt.free(q) == Runtime::success);

  scoped_stream<Runtime> s{rt};
  CHECK(rt.malloc_async(&p, too_much, s) == Runtime::out_of_memory);
  check_no_pending_error<Runtime>();
  q = nullptr;
  CHECK(rt.malloc_async(&q, mib, s) == Runtime::success);
  CHECK(rt.memset_async(q, 0, mib, s) == Runtime::success);
  CHECK(rt.free_async(q, s) == Runtime::success);
  CHECK(rt.stream_synchronize(s) == Runtime::success);

  std::size_t g = 0;
  REQUIRE(rt.vm_granularity(g, 0) == Runtime::success);
  typename Runtime::physical_handle h{};
  CHECK(rt.vm_create(h, (too_much + g - 1) / g * g, 0) == Runtime::out_of_memory);
  check_no_pending_error<Runtime>();
  CHECK(rt.vm_create(h, g, 0) == Runtime::success);
  CHECK(rt.vm_release(h) == Runtime::success);
}

}  // namespace gpukit::test

#define GPUKIT_RUNTIME_CONFORMANCE_CASE_DETAIL(runtime_expr, name_prefix, title, check) \
  TEST_CASE(name_prefix ": " title)                                                     \
  {                                                                                     \
    auto&& gpukit_rt_ = runtime_expr;                                                   \
    ::gpukit::test::check(gpukit_rt_);                                                  \
  }

/// Defines the conformance TEST_CASEs for the runtime `runtime_expr` (evaluated in each case),
/// named "<name_prefix>: <what>" (`name_prefix` is a string literal).
#define GPUKIT_RUNTIME_CONFORMANCE_CASES(runtime_expr, name_prefix)                              \
  GPUKIT_RUNTIME_CONFORMANCE_CASE_DETAIL(runtime_expr, name_prefix, "devices", check_devices)    \
  GPUKIT_RUNTIME_CONFORMANCE_CASE_DETAIL(runtime_expr, name_prefix, "mem_get_info",              \
                                         check_mem_get_info)                                     \
  GPUKIT_RUNTIME_CONFORMANCE_CASE_DETAIL(runtime_expr, name_prefix, "stream order",              \
                                         check_stream_order)                                     \
  GPUKIT_RUNTIME_CONFORMANCE_CASE_DETAIL(runtime_expr, name_prefix, "stream async",              \
                                         check_stream_async)                                     \
  GPUKIT_RUNTIME_CONFORMANCE_CASE_DETAIL(                                                        \
    runtime_expr, name_prefix, "stream destroy with pending work", check_stream_destroy_pending) \
  GPUKIT_RUNTIME_CONFORMANCE_CASE_DETAIL(runtime_expr, name_prefix, "default stream",            \
                                         check_default_stream)                                   \
  GPUKIT_RUNTIME_CONFORMANCE_CASE_DETAIL(runtime_expr, name_prefix, "threads", check_threads)    \
  GPUKIT_RUNTIME_CONFORMANCE_CASE_DETAIL(runtime_expr, name_prefix, "events", check_events)      \
  GPUKIT_RUNTIME_CONFORMANCE_CASE_DETAIL(runtime_expr, name_prefix, "stream_wait_event",         \
                                         check_stream_wait_event)                                \
  GPUKIT_RUNTIME_CONFORMANCE_CASE_DETAIL(runtime_expr, name_prefix, "graph capture",             \
                                         check_graph_capture)                                    \
  GPUKIT_RUNTIME_CONFORMANCE_CASE_DETAIL(runtime_expr, name_prefix, "elapsed time",              \
                                         check_elapsed_time)                                     \
  GPUKIT_RUNTIME_CONFORMANCE_CASE_DETAIL(runtime_expr, name_prefix, "copies", check_copies)      \
  GPUKIT_RUNTIME_CONFORMANCE_CASE_DETAIL(runtime_expr, name_prefix, "malloc_async",              \
                                         check_malloc_async)                                     \
  GPUKIT_RUNTIME_CONFORMANCE_CASE_DETAIL(runtime_expr, name_prefix, "pinned host memory",        \
                                         check_pinned_host)                                      \
  GPUKIT_RUNTIME_CONFORMANCE_CASE_DETAIL(runtime_expr, name_prefix, "virtual memory",            \
                                         check_virtual_memory)                                   \
  GPUKIT_RUNTIME_CONFORMANCE_CASE_DETAIL(runtime_expr, name_prefix, "errors", check_errors)      \
  GPUKIT_RUNTIME_CONFORMANCE_CASE_DETAIL(runtime_expr, name_prefix, "out of memory",             \
                                         check_out_of_memory)
