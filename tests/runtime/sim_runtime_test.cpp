// SPDX-License-Identifier: Apache-2.0
// Tests of gpukit::sim_runtime, the simulated GPU: the Runtime contract's semantics (streams,
// events, copies, memory, virtual memory) and the simulation's own controls (capacity, fault
// injection, stalls, counters, misuse messages). Concurrency tests are in TEST_SUITE
// ("sim_concurrency"), which CI also runs under ThreadSanitizer.
//
// No assertion depends on timing: work that must not have run yet is held by a stall.
#include <gpukit/runtime/sim_runtime.hpp>

#include <doctest/doctest.h>

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

namespace {

using gpukit::memcpy_kind;
using gpukit::sim_config;
using gpukit::sim_op;
using gpukit::sim_runtime;
using stream_t = sim_runtime::stream_type;
using event_t  = sim_runtime::event_type;

constexpr std::size_t KiB = std::size_t{1} << 10;
constexpr std::size_t MiB = std::size_t{1} << 20;
constexpr std::size_t GiB = std::size_t{1} << 30;

#define OK(call) REQUIRE_EQ((call), cudaSuccess)

sim_config one_device(std::size_t capacity = GiB) { return sim_config{}.with_devices(1, capacity); }

/// A simulated GPU of one device and a stream on it, destroyed (successfully) after the case.
/// Neither copyable nor movable (sim_runtime is not).
struct one_stream {
  one_stream() { OK(rt.stream_create(s)); }
  ~one_stream() { CHECK(rt.stream_destroy(s) == cudaSuccess); }

  sim_runtime rt{one_device()};
  stream_t s{};
};

/// A simulated GPU of one device and two streams on it, destroyed (successfully) after the case.
struct two_streams {
  two_streams()
  {
    OK(rt.stream_create(a));
    OK(rt.stream_create(b));
  }
  ~two_streams()
  {
    CHECK(rt.stream_destroy(a) == cudaSuccess);
    CHECK(rt.stream_destroy(b) == cudaSuccess);
  }

  sim_runtime rt{one_device()};
  stream_t a{};
  stream_t b{};
};

unsigned char pattern(std::size_t i, unsigned seed)
{
  return static_cast<unsigned char>(i * 131 + seed * 7 + 3);
}

void fill(void* p, std::size_t n, unsigned seed)
{
  auto* b = static_cast<unsigned char*>(p);
  for (std::size_t i = 0; i < n; ++i) { b[i] = pattern(i, seed); }
}

bool holds(void const* p, std::size_t n, unsigned seed)
{
  auto const* b = static_cast<unsigned char const*>(p);
  for (std::size_t i = 0; i < n; ++i) {
    if (b[i] != pattern(i, seed)) { return false; }
  }
  return true;
}

void set_flag(void* p) { static_cast<std::atomic<int>*>(p)->store(1, std::memory_order_release); }

int flag(std::atomic<int> const& f) { return f.load(std::memory_order_acquire); }

// Blocks a stream for a while: lets a test see whether a blocking call really waited for it.
void nap(void*) { std::this_thread::sleep_for(std::chrono::milliseconds(30)); }

std::size_t resident_bytes()
{
  std::ifstream statm{"/proc/self/statm"};
  std::size_t pages    = 0;
  std::size_t resident = 0;
  statm >> pages >> resident;
  return resident * static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
}

bool page_aligned(void const* p)
{
  return reinterpret_cast<std::uintptr_t>(p) %
           static_cast<std::uintptr_t>(::sysconf(_SC_PAGESIZE)) ==
         0;
}

bool mentions(std::string const& text, void const* p)
{
  char buf[32];
  std::snprintf(buf, sizeof(buf), "0x%llx",
                static_cast<unsigned long long>(reinterpret_cast<std::uintptr_t>(p)));
  return text.find(buf) != std::string::npos;
}

}  // namespace

static_assert(gpukit::is_runtime_v<sim_runtime>);
static_assert(sim_runtime::is_simulated);

TEST_SUITE("sim_runtime")
{
  TEST_CASE("devices: count and properties and versions and memory info")
  {
    sim_runtime rt{sim_config{}.with_devices(2, 3 * GiB).with_device_name("test GPU")};
    int n = 0;
    OK(rt.device_count(n));
    CHECK(n == 2);
    gpukit::device_properties p;
    OK(rt.get_device_properties(p, 1));
    CHECK(p.name == "test GPU");
    CHECK(p.ordinal == 1);
    CHECK(p.major == 9);
    CHECK(p.minor == 0);
    CHECK(p.total_memory == 3 * GiB);
    CHECK(p.simulated);
    CHECK(p.virtual_memory_management);
    CHECK(p.memory_pools);
    CHECK(p.unified_addressing);
    CHECK(p.async_engine_count == 2);
    CHECK(rt.get_device_properties(p, 2) == cudaErrorInvalidDevice);
    CHECK(rt.get_device_properties(p, -1) == cudaErrorInvalidDevice);
    int v = 0;
    OK(rt.driver_version(v));
    CHECK(v == 13000);
    OK(rt.runtime_version(v));
    CHECK(v == 13000);
    std::size_t free  = 0;
    std::size_t total = 0;
    OK(rt.mem_get_info(free, total));
    CHECK(total == 3 * GiB);
    CHECK(free == 3 * GiB);
    std::size_t g = 0;
    OK(rt.vm_granularity(g, 0));
    CHECK(g == 2 * MiB);
    CHECK(rt.vm_granularity(g, 7) == cudaErrorInvalidDevice);
    CHECK(std::string{sim_runtime::error_name(cudaErrorMemoryAllocation)} ==
          "cudaErrorMemoryAllocation");
    CHECK(std::string{sim_runtime::error_string(cudaSuccess)}.size() > 0);
    CHECK(std::string{gpukit::to_string(sim_op::stream_query)} == "stream_query");
    CHECK(std::string{gpukit::to_string(sim_op::count_)} == "unknown");
  }

  TEST_CASE("config: builder and plain fields and validation and environment")
  {
    sim_config c;
    CHECK(c.device_capacities == std::vector<std::size_t>{80 * GiB});
    CHECK(c.vm_granularity == 2 * MiB);
    c.device_capacities = {GiB, 2 * GiB};
    c.vm_granularity    = 64 * KiB;
    sim_runtime rt{c};
    CHECK(rt.capacity(0) == GiB);
    CHECK(rt.capacity(1) == 2 * GiB);
    std::size_t g = 0;
    OK(rt.vm_granularity(g, 1));
    CHECK(g == 64 * KiB);

    CHECK_THROWS_AS(sim_config{}.with_devices(0, GiB), gpukit::logic_error);
    CHECK_THROWS_AS(sim_runtime{sim_config{}.with_vm_granularity(1000)}, gpukit::logic_error);
    sim_config none;
    none.device_capacities.clear();
    CHECK_THROWS_AS(sim_runtime{none}, gpukit::logic_error);

    ::setenv("GPUKIT_SIM_CAPACITY", "16G", 1);
    ::setenv("GPUKIT_SIM_DEVICES", "3", 1);
    auto const env = sim_config::from_env();
    CHECK(env.device_capacities == std::vector<std::size_t>(3, 16 * GiB));
    ::setenv("GPUKIT_SIM_CAPACITY", "123456", 1);
    ::unsetenv("GPUKIT_SIM_DEVICES");
    CHECK(sim_config::from_env().device_capacities == std::vector<std::size_t>{123456});
    ::setenv("GPUKIT_SIM_CAPACITY", "lots", 1);
    CHECK_THROWS_AS((void)sim_config::from_env(), gpukit::logic_error);
    ::unsetenv("GPUKIT_SIM_CAPACITY");
    CHECK(sim_config::from_env().device_capacities == std::vector<std::size_t>{80 * GiB});
  }

  TEST_CASE("config: a GPU without virtual memory management says so and refuses vm_* calls")
  {
    CHECK(sim_config{}.virtual_memory);
    sim_runtime rt{sim_config{}.with_devices(2, GiB).with_virtual_memory(false)};
    gpukit::device_properties p;
    OK(rt.get_device_properties(p, 1));
    CHECK_FALSE(p.virtual_memory_management);
    CHECK(p.memory_pools);
    std::size_t g = 0;
    CHECK(rt.vm_granularity(g, 0) == cudaErrorNotSupported);
    CHECK(rt.last_misuse().find("sim_config::virtual_memory") != std::string::npos);
    void* va = nullptr;
    CHECK(rt.vm_reserve(&va, 2 * MiB, 0) == cudaErrorNotSupported);
    CHECK(va == nullptr);
    sim_runtime::physical_handle h = 0;
    CHECK(rt.vm_create(h, 2 * MiB, 0, false) == cudaErrorNotSupported);
    CHECK(h == 0);
    std::size_t free = 0, total = 0;
    OK(rt.mem_get_info(free, total));
    CHECK(free == GiB);  // nothing was charged
    void* p0 = nullptr;
    OK(rt.malloc(&p0, MiB));  // ordinary device memory still works
    OK(rt.free(p0));
  }

  TEST_CASE("instance() is one process-wide simulated GPU")
  {
    auto& a = sim_runtime::instance();
    auto& b = sim_runtime::instance();
    CHECK(&a == &b);
    int n = 0;
    OK(a.device_count(n));
    CHECK(n >= 1);
    gpukit::device_properties p;
    OK(a.get_device_properties(p, 0));
    CHECK(p.simulated);
    CHECK(p.name == "gpukit simulated GPU");
  }

  TEST_CASE_FIXTURE(one_stream, "streams run their tasks in FIFO order")
  {
    void* d = nullptr;
    OK(rt.malloc(&d, 64));
    // Each step sets the device byte, then a host function records what it sees: any reordering
    // of the copies and host functions shows in the record.
    constexpr int steps = 2000;
    struct step {
      unsigned char const* device;
      std::vector<int>* seen;
    };
    std::vector<int> seen;
    seen.reserve(steps);
    step st{static_cast<unsigned char const*>(d), &seen};
    for (int i = 0; i < steps; ++i) {
      OK(rt.memset_async(d, i % 251, 1, s));
      OK(rt.launch_host_func(
        s,
        [](void* u) {
          auto* x = static_cast<step*>(u);
          x->seen->push_back(*x->device);
        },
        &st));
    }
    OK(rt.stream_synchronize(s));
    REQUIRE(seen.size() == static_cast<std::size_t>(steps));
    for (int i = 0; i < steps; ++i) { REQUIRE(seen[i] == i % 251); }
    OK(rt.stream_query(s));
    OK(rt.free(d));
  }

  TEST_CASE_FIXTURE(one_stream,
                    "work is asynchronous: calls return before a stalled stream runs it")
  {
    std::atomic<int> ran{0};
    OK(rt.stall(s));
    OK(rt.launch_host_func(s, set_flag, &ran));
    CHECK(flag(ran) == 0);
    CHECK(rt.stream_query(s) == cudaErrorNotReady);
    OK(rt.release(s));
    OK(rt.stream_synchronize(s));
    CHECK(flag(ran) == 1);
    OK(rt.stream_query(s));
  }

  TEST_CASE("the null stream is per device and started lazily and stallable")
  {
    sim_runtime rt{one_device()};
    std::atomic<int> ran{0};
    OK(rt.stream_query(stream_t{}));
    OK(rt.stall(stream_t{}));
    OK(rt.launch_host_func(stream_t{}, set_flag, &ran));
    CHECK(rt.stream_query(stream_t{}) == cudaErrorNotReady);
    CHECK(flag(ran) == 0);
    OK(rt.release(stream_t{}));
    OK(rt.stream_synchronize(stream_t{}));
    CHECK(flag(ran) == 1);
    CHECK(rt.stream_destroy(stream_t{}) == cudaErrorInvalidResourceHandle);
  }

  TEST_CASE("stream_destroy returns at once and queued work still runs")
  {
    std::atomic<int> ran{0};
    {
      sim_runtime rt{one_device()};
      stream_t gate{};
      stream_t s{};
      OK(rt.stream_create(gate));
      OK(rt.stream_create(s));
      event_t e{};
      OK(rt.event_create(e));
      OK(rt.stall(gate));
      OK(rt.event_record(e, gate));
      OK(rt.stream_wait_event(s, e));
      OK(rt.launch_host_func(s, set_flag, &ran));
      OK(rt.stream_destroy(s));  // returns although s cannot run yet
      CHECK(flag(ran) == 0);
      CHECK(rt.stream_query(s) == cudaErrorInvalidResourceHandle);
      OK(rt.release(gate));
      OK(rt.device_synchronize());  // waits for destroyed streams still draining
      CHECK(flag(ran) == 1);
      OK(rt.event_destroy(e));
      OK(rt.stream_destroy(gate));
    }
    std::atomic<int> later{0};
    {
      sim_runtime rt{one_device()};
      stream_t s{};
      OK(rt.stream_create(s));
      OK(rt.stall(s));
      OK(rt.launch_host_func(s, set_flag, &later));
      CHECK(flag(later) == 0);
    }  // the destructor releases the stall and drains
    CHECK(flag(later) == 1);
  }

  TEST_CASE_FIXTURE(two_streams,
                    "events: never recorded then pending then complete then re-recorded")
  {
    event_t e{};
    OK(rt.event_create(e));
    OK(rt.event_query(e));        // never recorded: complete
    OK(rt.event_synchronize(e));  // and does not block

    OK(rt.stall(a));
    OK(rt.event_record(e, a));
    CHECK(rt.event_query(e) == cudaErrorNotReady);

    // Re-recording replaces the capture: e now stands for b's (empty) work, which completes
    // although a is still stalled.
    OK(rt.event_record(e, b));
    OK(rt.stream_synchronize(b));
    OK(rt.event_query(e));
    OK(rt.event_synchronize(e));
    CHECK(rt.stream_query(a) == cudaErrorNotReady);

    // A record on a stream that has run everything (and is not stalled) is complete at once.
    OK(rt.release(a));
    OK(rt.stream_synchronize(a));
    OK(rt.event_record(e, a));
    OK(rt.event_query(e));

    // A record captures only work submitted before it.
    std::atomic<int> ran{0};
    OK(rt.stall(a));
    OK(rt.launch_host_func(a, set_flag, &ran));
    OK(rt.event_query(e));
    CHECK(flag(ran) == 0);
    OK(rt.release(a));
    OK(rt.stream_synchronize(a));

    OK(rt.event_destroy(e));
  }

  TEST_CASE_FIXTURE(two_streams, "stream_wait_event orders work across streams")
  {
    event_t e{};
    event_t before{};
    OK(rt.event_create(e));
    OK(rt.event_create(before));

    std::atomic<int> early{0};
    std::atomic<int> late{0};
    OK(rt.stall(a));
    OK(rt.event_record(e, a));
    OK(rt.launch_host_func(b, set_flag, &early));  // before the wait: not held
    OK(rt.event_record(before, b));
    OK(rt.stream_wait_event(b, e));
    OK(rt.launch_host_func(b, set_flag, &late));
    OK(rt.event_synchronize(before));
    CHECK(flag(early) == 1);
    CHECK(flag(late) == 0);
    CHECK(rt.stream_query(b) == cudaErrorNotReady);
    OK(rt.release(a));
    OK(rt.stream_synchronize(b));
    CHECK(flag(late) == 1);

    // The wait takes the capture current at the time of the call: re-recording e later on a
    // stalled stream does not hold work already waiting on the old capture.
    OK(rt.event_record(e, a));
    OK(rt.event_synchronize(e));
    OK(rt.stall(a));
    OK(rt.stream_wait_event(b, e));  // complete capture: no wait
    OK(rt.event_record(e, a));       // new capture, pending
    std::atomic<int> free_to_run{0};
    OK(rt.launch_host_func(b, set_flag, &free_to_run));
    OK(rt.stream_synchronize(b));  // would block forever if b waited on the new capture
    CHECK(flag(free_to_run) == 1);
    CHECK(rt.event_query(e) == cudaErrorNotReady);

    // Destroying an event that a stream waits on is safe; the wait still holds.
    std::atomic<int> after_destroy{0};
    OK(rt.stream_wait_event(b, e));
    OK(rt.event_destroy(e));
    OK(rt.launch_host_func(b, set_flag, &after_destroy));
    CHECK(rt.stream_query(b) == cudaErrorNotReady);
    CHECK(flag(after_destroy) == 0);
    OK(rt.release(a));
    OK(rt.stream_synchronize(b));
    CHECK(flag(after_destroy) == 1);

    OK(rt.event_destroy(before));
  }

  TEST_CASE_FIXTURE(one_stream,
                    "event_elapsed_time: timing events only and monotone and not before completion")
  {
    event_t t0{};
    event_t t1{};
    event_t t2{};
    event_t plain{};
    OK(rt.event_create(t0, true));
    OK(rt.event_create(t1, true));
    OK(rt.event_create(t2, true));
    OK(rt.event_create(plain, false));
    float ms = -1.0f;
    CHECK(rt.event_elapsed_time(ms, t0, t1) == cudaErrorInvalidResourceHandle);  // never recorded

    OK(rt.event_record(t0, s));
    OK(rt.launch_host_func(s, nap, nullptr));
    OK(rt.event_record(t1, s));
    OK(rt.launch_host_func(s, nap, nullptr));
    OK(rt.event_record(t2, s));
    OK(rt.event_record(plain, s));
    OK(rt.stream_synchronize(s));
    float a = -1.0f;
    float b = -1.0f;
    OK(rt.event_elapsed_time(a, t0, t1));
    OK(rt.event_elapsed_time(b, t0, t2));
    CHECK(a >= 0.0f);
    CHECK(b >= a);
    CHECK(rt.event_elapsed_time(ms, t0, plain) == cudaErrorInvalidResourceHandle);
    CHECK(rt.last_misuse().find("timing") != std::string::npos);

    OK(rt.stall(s));
    OK(rt.event_record(t2, s));
    CHECK(rt.event_elapsed_time(ms, t0, t2) == cudaErrorNotReady);
    OK(rt.release(s));
    OK(rt.event_synchronize(t2));
    OK(rt.event_elapsed_time(ms, t0, t2));
    CHECK(ms >= b);

    for (auto e : {t0, t1, t2, plain}) { OK(rt.event_destroy(e)); }
  }

  TEST_CASE("copies of every kind move the bytes")
  {
    sim_runtime rt{sim_config{}.with_devices(2, GiB)};
    stream_t s{};
    OK(rt.stream_create(s));
    constexpr std::size_t n = 3 * MiB + 123;
    std::vector<unsigned char> src(n);
    std::vector<unsigned char> dst(n);
    fill(src.data(), n, 1);
    void* d1     = nullptr;
    void* d2     = nullptr;
    void* pinned = nullptr;
    OK(rt.malloc(&d1, n));
    OK(rt.malloc(&d2, n));
    OK(rt.host_alloc(&pinned, n, gpukit::host_alloc_flags::none));

    SUBCASE("host to device, device to device, device to host")
    {
      OK(rt.memcpy_async(d1, src.data(), n, memcpy_kind::host_to_device, s));
      OK(rt.memcpy_async(d2, d1, n, memcpy_kind::device_to_device, s));
      OK(rt.memcpy_async(dst.data(), d2, n, memcpy_kind::device_to_host, s));
      OK(rt.stream_synchronize(s));
      CHECK(holds(dst.data(), n, 1));
      CHECK(holds(d1, n, 1));  // device memory is host-readable in the simulation
    }
    SUBCASE("pinned host memory and host to host")
    {
      OK(rt.memcpy_async(pinned, src.data(), n, memcpy_kind::host_to_host, s));
      OK(rt.memcpy_async(d1, pinned, n, memcpy_kind::host_to_device, s));
      CHECK(rt.memset_async(pinned, 0, n, s) == cudaErrorInvalidValue);  // memset: device only
      OK(rt.memcpy_async(dst.data(), d1, n, memcpy_kind::device_to_host, s));
      OK(rt.stream_synchronize(s));
      CHECK(holds(pinned, n, 1));
      CHECK(holds(dst.data(), n, 1));
    }
    SUBCASE("inferred directions")
    {
      OK(rt.memcpy_async(d1, src.data(), n, memcpy_kind::infer, s));
      OK(rt.memcpy_async(d2, d1, n, memcpy_kind::infer, s));
      OK(rt.memcpy_async(pinned, d2, n, memcpy_kind::infer, s));
      OK(rt.memcpy_async(dst.data(), pinned, n, memcpy_kind::infer, s));
      OK(rt.stream_synchronize(s));
      CHECK(holds(dst.data(), n, 1));
    }
    SUBCASE("memset, and copies at an offset")
    {
      OK(rt.memset_async(d1, 0xab, n, s));
      OK(rt.memcpy_async(static_cast<char*>(d1) + 100, src.data(), 1000,
                         memcpy_kind::host_to_device, s));
      OK(rt.memcpy_async(dst.data(), d1, n, memcpy_kind::device_to_host, s));
      OK(rt.stream_synchronize(s));
      CHECK(std::all_of(dst.begin(), dst.begin() + 100, [](unsigned char c) { return c == 0xab; }));
      CHECK(holds(dst.data() + 100, 1000, 1));
      CHECK(std::all_of(dst.begin() + 1100, dst.end(), [](unsigned char c) { return c == 0xab; }));
    }
    SUBCASE("peer copies between devices")
    {
      OK(rt.set_device(1));
      void* other = nullptr;
      OK(rt.malloc(&other, n));
      OK(rt.set_device(0));
      OK(rt.memcpy_async(d1, src.data(), n, memcpy_kind::host_to_device, s));
      OK(rt.memcpy_peer_async(other, 1, d1, 0, n, s));
      OK(rt.memset_async(d1, 0, n, s));
      OK(rt.memcpy_peer_async(d2, 0, other, 1, n, s));
      OK(rt.stream_synchronize(s));
      CHECK(holds(other, n, 1));
      CHECK(holds(d2, n, 1));
      OK(rt.free(other));
    }
    SUBCASE("mapped virtual memory is device memory for copies")
    {
      std::size_t g = 0;
      OK(rt.vm_granularity(g, 0));
      void* va = nullptr;
      OK(rt.vm_reserve(&va, 2 * g, 0));
      gpukit::sim_runtime::physical_handle h1 = 0;
      gpukit::sim_runtime::physical_handle h2 = 0;
      OK(rt.vm_create(h1, g, 0));
      OK(rt.vm_create(h2, g, 0));
      OK(rt.vm_map(va, g, h1));
      OK(rt.vm_map(static_cast<char*>(va) + g, g, h2));
      OK(rt.vm_set_access(va, 2 * g, 0));
      // One copy across the boundary of two mappings.
      std::size_t const m = g + 4096;
      OK(rt.memcpy_async(static_cast<char*>(va) + 100, src.data(), m, memcpy_kind::host_to_device,
                         s));
      OK(rt.memcpy_async(d1, static_cast<char*>(va) + 100, m, memcpy_kind::device_to_device, s));
      OK(rt.memcpy_async(dst.data(), d1, m, memcpy_kind::device_to_host, s));
      OK(rt.stream_synchronize(s));
      CHECK(holds(dst.data(), m, 1));
      CHECK(holds(static_cast<char*>(va) + 100, m, 1));
      OK(rt.vm_unmap(va, 2 * g));
      OK(rt.vm_release(h1));
      OK(rt.vm_release(h2));
      OK(rt.vm_free(va, 2 * g));
    }
    OK(rt.host_free(pinned));
    OK(rt.free(d1));
    OK(rt.free(d2));
    OK(rt.stream_destroy(s));
  }

  TEST_CASE("copies are validated when enqueued")
  {
    sim_runtime rt{sim_config{}.with_devices(2, GiB)};
    stream_t s{};
    OK(rt.stream_create(s));
    std::vector<unsigned char> host(8192);
    void* d = nullptr;
    OK(rt.malloc(&d, 4096));
    auto const before = rt.misuse_count();

    // Host memory where the kind says device memory, and the reverse.
    CHECK(rt.memcpy_async(host.data(), host.data() + 4096, 16, memcpy_kind::host_to_device, s) ==
          cudaErrorInvalidValue);
    CHECK(mentions(rt.last_misuse(), host.data()));
    CHECK(rt.last_misuse().find("not device memory") != std::string::npos);
    CHECK(rt.memcpy_async(host.data(), host.data(), 16, memcpy_kind::device_to_host, s) ==
          cudaErrorInvalidValue);
    CHECK(rt.memcpy_async(d, d, 16, memcpy_kind::host_to_device, s) == cudaErrorInvalidValue);
    CHECK(rt.last_misuse().find("is device memory") != std::string::npos);
    CHECK(rt.memcpy_async(d, d, 16, memcpy_kind::host_to_host, s) == cudaErrorInvalidValue);
    CHECK(rt.memset_async(host.data(), 0, 16, s) == cudaErrorInvalidValue);

    // Ranges past the end of an allocation.
    CHECK(rt.memcpy_async(d, host.data(), 4097, memcpy_kind::host_to_device, s) ==
          cudaErrorInvalidValue);
    CHECK(rt.last_misuse().find("past the end") != std::string::npos);
    CHECK(mentions(rt.last_misuse(), d));
    CHECK(rt.memcpy_async(host.data(), static_cast<char*>(d) + 4000, 97,
                          memcpy_kind::device_to_host, s) == cudaErrorInvalidValue);
    CHECK(rt.memset_async(static_cast<char*>(d) + 1, 0, 4096, s) == cudaErrorInvalidValue);
    CHECK(rt.memcpy_async(host.data(), d, 4097, memcpy_kind::infer, s) == cudaErrorInvalidValue);
    OK(rt.memcpy_async(host.data(), static_cast<char*>(d) + 4000, 96, memcpy_kind::device_to_host,
                       s));

    // Null pointers, bad kinds, bad devices, wrong devices.
    CHECK(rt.memcpy_async(nullptr, host.data(), 16, memcpy_kind::host_to_host, s) ==
          cudaErrorInvalidValue);
    CHECK(rt.memcpy_async(host.data(), nullptr, 16, memcpy_kind::infer, s) ==
          cudaErrorInvalidValue);
    CHECK(rt.memcpy_async(host.data(), d, 16, static_cast<memcpy_kind>(42), s) ==
          cudaErrorInvalidMemcpyDirection);
    CHECK(rt.memcpy_peer_async(d, 0, d, 5, 16, s) == cudaErrorInvalidDevice);
    CHECK(rt.memcpy_peer_async(d, 1, d, 0, 16, s) == cudaErrorInvalidValue);
    CHECK(rt.last_misuse().find("not of device 1") != std::string::npos);
    CHECK(rt.memcpy_peer_async(host.data(), 0, d, 0, 16, s) == cudaErrorInvalidValue);

    // Zero bytes: a no-op success, whatever the pointers.
    OK(rt.memcpy_async(nullptr, nullptr, 0, memcpy_kind::device_to_device, s));
    OK(rt.memset_async(nullptr, 0, 0, s));
    OK(rt.memcpy_peer_async(nullptr, 1, nullptr, 0, 0, s));

    // Memory freed with free_async (not yet reached) and virtual memory not accessible.
    void* doomed = nullptr;
    OK(rt.malloc(&doomed, 4096));
    OK(rt.stall(s));
    OK(rt.free_async(doomed, s));
    CHECK(rt.memset_async(doomed, 0, 16, s) == cudaErrorInvalidValue);
    CHECK(rt.last_misuse().find("free_async") != std::string::npos);
    OK(rt.release(s));
    std::size_t g = 0;
    OK(rt.vm_granularity(g, 0));
    void* va = nullptr;
    OK(rt.vm_reserve(&va, 2 * g, 0));
    CHECK(rt.memset_async(va, 0, 16, s) == cudaErrorInvalidValue);
    CHECK(rt.last_misuse().find("not mapped") != std::string::npos);
    sim_runtime::physical_handle h = 0;
    OK(rt.vm_create(h, g, 0));
    OK(rt.vm_map(va, g, h));
    CHECK(rt.memset_async(va, 0, 16, s) == cudaErrorInvalidValue);
    CHECK(rt.last_misuse().find("vm_set_access") != std::string::npos);
    OK(rt.vm_set_access(va, g, 0));
    OK(rt.memset_async(va, 0, g, s));
    CHECK(rt.memset_async(va, 0, g + 1, s) == cudaErrorInvalidValue);  // into unmapped VA
    CHECK(rt.memcpy_async(va, host.data(), 16, memcpy_kind::host_to_host, s) ==
          cudaErrorInvalidValue);
    CHECK(rt.misuse_count() > before + 15);

    OK(rt.stream_synchronize(s));
    OK(rt.vm_unmap(va, g));
    OK(rt.vm_release(h));
    OK(rt.vm_free(va, 2 * g));
    OK(rt.free(d));
    OK(rt.stream_destroy(s));
  }

  TEST_CASE("device memory: accounting and zero bytes and capacity")
  {
    sim_runtime rt{one_device(GiB)};
    void* p = reinterpret_cast<void*>(0x1);
    OK(rt.malloc(&p, 0));
    CHECK(p == nullptr);
    OK(rt.free(nullptr));
    CHECK(rt.malloc(nullptr, 16) == cudaErrorInvalidValue);

    void* a = nullptr;
    OK(rt.malloc(&a, 100 * MiB + 1));
    CHECK(page_aligned(a));
    CHECK(rt.used_bytes(0) == 100 * MiB + 1);
    std::size_t free  = 0;
    std::size_t total = 0;
    OK(rt.mem_get_info(free, total));
    CHECK(free == GiB - 100 * MiB - 1);
    void* b = nullptr;
    CHECK(rt.malloc(&b, GiB) == cudaErrorMemoryAllocation);
    CHECK(b == nullptr);
    OK(rt.malloc(&b, GiB - 100 * MiB - 1));  // exactly what is left
    OK(rt.mem_get_info(free, total));
    CHECK(free == 0);
    OK(rt.free(a));
    OK(rt.free(b));
    CHECK(rt.used_bytes(0) == 0);
  }

  TEST_CASE("set_capacity: shrinking below use causes OOM and growing lets allocations through")
  {
    sim_runtime rt{one_device(GiB)};
    void* a = nullptr;
    OK(rt.malloc(&a, 512 * MiB));
    OK(rt.set_capacity(0, 256 * MiB));
    std::size_t free  = 1;
    std::size_t total = 0;
    OK(rt.mem_get_info(free, total));
    CHECK(total == 256 * MiB);
    CHECK(free == 0);  // never underflows
    void* b = nullptr;
    CHECK(rt.malloc(&b, 1) == cudaErrorMemoryAllocation);
    sim_runtime::physical_handle h = 0;
    CHECK(rt.vm_create(h, 2 * MiB, 0) == cudaErrorMemoryAllocation);
    gpukit::device_properties p;
    OK(rt.get_device_properties(p, 0));
    CHECK(p.total_memory == 256 * MiB);

    OK(rt.set_capacity(0, 2 * GiB));
    OK(rt.malloc(&b, GiB));
    OK(rt.mem_get_info(free, total));
    CHECK(free == 2 * GiB - 512 * MiB - GiB);
    CHECK(rt.set_capacity(3, GiB) == cudaErrorInvalidDevice);
    OK(rt.free(a));
    OK(rt.free(b));
  }

  TEST_CASE("malloc_async / free_async: the bytes return when the stream reaches the free")
  {
    sim_runtime rt{one_device(GiB)};
    stream_t s{};
    OK(rt.stream_create(s));
    void* p = nullptr;
    OK(rt.malloc_async(&p, 64 * MiB, s));
    CHECK(rt.used_bytes(0) == 64 * MiB);
    OK(rt.memset_async(p, 7, 64 * MiB, s));
    OK(rt.stall(s));
    OK(rt.free_async(p, s));
    CHECK(rt.used_bytes(0) == 64 * MiB);  // not reached yet
    CHECK(rt.free_async(p, s) == cudaErrorInvalidValue);
    CHECK(rt.last_misuse().find("double free") != std::string::npos);
    CHECK(rt.free(p) == cudaErrorInvalidValue);
    OK(rt.release(s));
    OK(rt.stream_synchronize(s));
    CHECK(rt.used_bytes(0) == 0);
    CHECK(rt.free_async(p, s) == cudaErrorInvalidValue);
    CHECK(rt.last_misuse().find("double free") != std::string::npos);

    void* z = reinterpret_cast<void*>(0x1);
    OK(rt.malloc_async(&z, 0, s));
    CHECK(z == nullptr);
    OK(rt.free_async(nullptr, s));
    CHECK(rt.malloc_async(&z, 4096, reinterpret_cast<stream_t>(std::uintptr_t{0xdead})) ==
          cudaErrorInvalidResourceHandle);
    CHECK(rt.malloc_async(&z, 2 * GiB, s) == cudaErrorMemoryAllocation);
    OK(rt.stream_destroy(s));
  }

  TEST_CASE_FIXTURE(one_stream,
                    "free and host_free wait for queued work as cudaFree and cudaFreeHost do")
  {
    void* d = nullptr;
    void* h = nullptr;
    OK(rt.malloc(&d, MiB));
    OK(rt.host_alloc(&h, MiB, 0));
    std::atomic<int> ran{0};
    OK(rt.launch_host_func(s, nap, nullptr));
    OK(rt.memset_async(d, 1, MiB, s));
    OK(rt.memcpy_async(h, d, MiB, memcpy_kind::device_to_host, s));
    OK(rt.launch_host_func(s, set_flag, &ran));
    OK(rt.free(d));
    CHECK(flag(ran) == 1);
    OK(rt.stream_query(s));
    std::atomic<int> ran2{0};
    std::vector<unsigned char> pageable(MiB, 9);
    OK(rt.launch_host_func(s, nap, nullptr));
    OK(rt.memcpy_async(h, pageable.data(), MiB, memcpy_kind::host_to_host, s));
    OK(rt.launch_host_func(s, set_flag, &ran2));
    OK(rt.host_free(h));
    CHECK(flag(ran2) == 1);
  }

  TEST_CASE("pinned host memory: allocation and registration and misuse")
  {
    sim_runtime rt{one_device(GiB)};
    void* h = nullptr;
    OK(rt.host_alloc(&h, 3 * MiB + 5, gpukit::host_alloc_flags::portable));
    CHECK(page_aligned(h));
    std::memset(h, 0x5a, 3 * MiB + 5);
    CHECK(rt.used_bytes(0) == 0);  // pinned memory is not device memory
    CHECK(rt.host_alloc(&h, 16, 0x80u) == cudaErrorInvalidValue);
    void* z = reinterpret_cast<void*>(0x1);
    OK(rt.host_alloc(&z, 0, 0));
    CHECK(z == nullptr);

    std::vector<char> buffer(1 << 16);
    OK(rt.host_register(buffer.data(), buffer.size(), gpukit::host_register_flags::none));
    CHECK(rt.host_register(buffer.data() + 100, 10, 0) == cudaErrorHostMemoryAlreadyRegistered);
    CHECK(mentions(rt.last_misuse(), buffer.data() + 100));
    CHECK(rt.host_register(h, 4096, 0) == cudaErrorHostMemoryAlreadyRegistered);
    CHECK(rt.host_register(nullptr, 10, 0) == cudaErrorInvalidValue);
    CHECK(rt.host_register(buffer.data(), 0, 0) == cudaErrorInvalidValue);
    void* d = nullptr;
    OK(rt.malloc(&d, 4096));
    CHECK(rt.host_register(d, 4096, 0) == cudaErrorInvalidValue);
    CHECK(rt.host_unregister(buffer.data() + 1) == cudaErrorHostMemoryNotRegistered);
    OK(rt.host_unregister(buffer.data()));
    CHECK(rt.host_unregister(buffer.data()) == cudaErrorHostMemoryNotRegistered);
    OK(rt.host_register(buffer.data() + 100, 10, 0));  // free again
    OK(rt.host_unregister(buffer.data() + 100));

    CHECK(rt.host_free(buffer.data()) == cudaErrorInvalidValue);
    CHECK(rt.host_free(d) == cudaErrorInvalidValue);
    OK(rt.host_free(h));
    CHECK(rt.host_free(h) == cudaErrorInvalidValue);
    CHECK(rt.last_misuse().find("double free") != std::string::npos);
    OK(rt.host_free(nullptr));
    OK(rt.free(d));
  }

  TEST_CASE("misuse: each error names the value and is counted")
  {
    sim_runtime rt{one_device()};
    CHECK(rt.last_misuse().empty());
    CHECK(rt.misuse_count() == 0);
    std::vector<char> host(64);

    CHECK(rt.free(host.data()) == cudaErrorInvalidValue);
    CHECK(mentions(rt.last_misuse(), host.data()));
    CHECK(rt.last_misuse().find("never allocated") != std::string::npos);
    CHECK(rt.misuse_count() == 1);

    void* d = nullptr;
    OK(rt.malloc(&d, 8192));
    CHECK(rt.free(static_cast<char*>(d) + 16) == cudaErrorInvalidValue);
    CHECK(rt.last_misuse().find("not the start") != std::string::npos);
    OK(rt.free(d));
    CHECK(rt.free(d) == cudaErrorInvalidValue);
    CHECK(rt.last_misuse().find("double free") != std::string::npos);
    CHECK(mentions(rt.last_misuse(), d));
    CHECK(rt.misuse_count() == 3);

    stream_t s{};
    OK(rt.stream_create(s));
    OK(rt.stream_destroy(s));
    CHECK(rt.stream_query(s) == cudaErrorInvalidResourceHandle);
    CHECK(rt.last_misuse().find("stream_query") != std::string::npos);
    CHECK(rt.stream_synchronize(s) == cudaErrorInvalidResourceHandle);
    CHECK(rt.stream_destroy(s) == cudaErrorInvalidResourceHandle);
    CHECK(rt.launch_host_func(s, set_flag, nullptr) == cudaErrorInvalidResourceHandle);
    CHECK(rt.memcpy_async(host.data(), host.data() + 32, 8, memcpy_kind::host_to_host, s) ==
          cudaErrorInvalidResourceHandle);
    CHECK(rt.stall(s) == cudaErrorInvalidResourceHandle);
    stream_t fresh{};
    OK(rt.stream_create(fresh));
    CHECK(fresh != s);  // handles are never reused
    OK(rt.stream_destroy(fresh));

    event_t e{};
    OK(rt.event_create(e));
    OK(rt.event_destroy(e));
    CHECK(rt.event_query(e) == cudaErrorInvalidResourceHandle);
    CHECK(rt.event_record(e, stream_t{}) == cudaErrorInvalidResourceHandle);
    CHECK(rt.event_destroy(e) == cudaErrorInvalidResourceHandle);
    CHECK(rt.event_query(event_t{}) == cudaErrorInvalidResourceHandle);
    CHECK(rt.launch_host_func(stream_t{}, nullptr, nullptr) == cudaErrorInvalidValue);
    CHECK(rt.set_device(1) == cudaErrorInvalidDevice);
    CHECK(rt.last_misuse().find("set_device") != std::string::npos);

    std::size_t g = 0;
    OK(rt.vm_granularity(g, 0));
    void* va = nullptr;
    OK(rt.vm_reserve(&va, 4 * g, 0));
    CHECK(rt.vm_unmap(va, g) == cudaErrorInvalidValue);
    CHECK(rt.last_misuse().find("vm_unmap") != std::string::npos);
    CHECK(mentions(rt.last_misuse(), va));
    sim_runtime::physical_handle h = 0;
    OK(rt.vm_create(h, 2 * g, 0));
    OK(rt.vm_map(va, 2 * g, h));
    CHECK(rt.vm_unmap(va, g) == cudaErrorInvalidValue);  // part of a mapping
    CHECK(rt.vm_unmap(static_cast<char*>(va) + g, g) == cudaErrorInvalidValue);
    CHECK(rt.vm_unmap(va, 4 * g) == cudaErrorInvalidValue);  // more than is mapped
    CHECK(rt.vm_free(va, 4 * g) == cudaErrorInvalidValue);   // live mapping
    CHECK(rt.last_misuse().find("mapping") != std::string::npos);
    CHECK(rt.vm_free(va, 2 * g) == cudaErrorInvalidValue);  // not the whole range
    CHECK(rt.free(va) == cudaErrorInvalidValue);            // not malloc memory
    CHECK(rt.last_misuse().find("vm_reserve") != std::string::npos);
    OK(rt.vm_unmap(va, 2 * g));
    OK(rt.vm_release(h));
    CHECK(rt.vm_release(h) == cudaErrorInvalidValue);
    OK(rt.vm_free(va, 4 * g));
    CHECK(rt.vm_free(va, 4 * g) == cudaErrorInvalidValue);
    CHECK(rt.misuse_count() == 24);  // one per error above
  }

  TEST_CASE(
    "virtual memory: reserve then create then map then access then unmap then remap then release")
  {
    sim_runtime rt{one_device(GiB)};
    std::size_t g = 0;
    OK(rt.vm_granularity(g, 0));
    void* va = nullptr;
    CHECK(rt.vm_reserve(&va, g + 1, 0) == cudaErrorInvalidValue);
    CHECK(rt.vm_reserve(&va, 0, 0) == cudaErrorInvalidValue);
    CHECK(rt.vm_reserve(&va, g, 3 * g) == cudaErrorInvalidValue);  // not a power of two
    OK(rt.vm_reserve(&va, 4 * g, 8 * g));
    CHECK(reinterpret_cast<std::uintptr_t>(va) % (8 * g) == 0);
    char* const base = static_cast<char*>(va);

    sim_runtime::physical_handle h1 = 0;
    sim_runtime::physical_handle h2 = 0;
    CHECK(rt.vm_create(h1, g / 2, 0) == cudaErrorInvalidValue);
    CHECK(rt.vm_create(h1, g, 1) == cudaErrorInvalidDevice);
    OK(rt.vm_create(h1, 2 * g, 0));
    OK(rt.vm_create(h2, 2 * g, 0));
    CHECK(h1 != h2);
    CHECK(rt.used_bytes(0) == 4 * g);  // physical memory counts, reservations do not

    CHECK(rt.vm_map(base, g, h1) == cudaErrorInvalidValue);              // not the whole handle
    CHECK(rt.vm_map(base + 4096, 2 * g, h1) == cudaErrorInvalidValue);   // misaligned
    CHECK(rt.vm_map(base + 3 * g, 2 * g, h1) == cudaErrorInvalidValue);  // past the reservation
    CHECK(rt.vm_map(base, 2 * g, 12345) == cudaErrorInvalidValue);       // unknown handle
    OK(rt.vm_map(base, 2 * g, h1));
    CHECK(rt.vm_map(base + g, 2 * g, h2) == cudaErrorInvalidValue);  // overlaps h1
    OK(rt.vm_map(base + 2 * g, 2 * g, h2));
    CHECK(rt.vm_set_access(base, g, 0) == cudaErrorInvalidValue);  // part of a mapping
    OK(rt.vm_set_access(base, 4 * g, 0));                          // two whole mappings

    // Host code reads and writes through the virtual addresses.
    fill(base, 2 * g, 11);
    fill(base + 2 * g, 2 * g, 22);
    CHECK(holds(base, 2 * g, 11));
    CHECK(holds(base + 2 * g, 2 * g, 22));

    // Unmap both, then map each handle where the other was: the contents follow the handles.
    OK(rt.vm_unmap(base, 4 * g));
    OK(rt.vm_map(base, 2 * g, h2));
    OK(rt.vm_map(base + 2 * g, 2 * g, h1));
    OK(rt.vm_set_access(base, 2 * g, 0));
    OK(rt.vm_set_access(base + 2 * g, 2 * g, 0));
    CHECK(holds(base, 2 * g, 22));
    CHECK(holds(base + 2 * g, 2 * g, 11));

    // Release ordering: a released handle's memory returns only once it is unmapped.
    OK(rt.vm_release(h1));
    CHECK(rt.used_bytes(0) == 4 * g);
    CHECK(holds(base + 2 * g, 2 * g, 11));  // still mapped and usable
    OK(rt.vm_unmap(base + 2 * g, 2 * g));
    CHECK(rt.used_bytes(0) == 2 * g);
    CHECK(rt.vm_map(base + 2 * g, 2 * g, h1) == cudaErrorInvalidValue);  // released

    // A fresh handle mapped at the same address starts zeroed.
    sim_runtime::physical_handle h3 = 0;
    OK(rt.vm_create(h3, 2 * g, 0));
    OK(rt.vm_map(base + 2 * g, 2 * g, h3));
    OK(rt.vm_set_access(base + 2 * g, 2 * g, 0));
    CHECK(std::all_of(base + 2 * g, base + 4 * g, [](char c) { return c == 0; }));
    CHECK(rt.used_bytes(0) == 4 * g);

    OK(rt.vm_unmap(base, 4 * g));
    CHECK(rt.used_bytes(0) == 4 * g);  // unmapped but not released
    OK(rt.vm_release(h2));
    OK(rt.vm_release(h3));
    CHECK(rt.used_bytes(0) == 0);
    OK(rt.vm_free(va, 4 * g));

    // Capacity bounds physical memory.
    sim_runtime::physical_handle big = 0;
    CHECK(rt.vm_create(big, GiB + g, 0) == cudaErrorMemoryAllocation);
    OK(rt.vm_create(big, GiB, 0));
    OK(rt.vm_release(big));
  }

  TEST_CASE("device memory is backed lazily: 48 GiB on a 64 GiB device costs no RAM")
  {
    sim_runtime rt{one_device(64 * GiB)};
    auto const before = resident_bytes();
    std::vector<void*> blocks(3);
    for (auto& b : blocks) {
      OK(rt.malloc(&b, 16 * GiB));
      auto* c         = static_cast<unsigned char*>(b);
      c[0]            = 1;
      c[8 * GiB]      = 2;
      c[16 * GiB - 1] = 3;
    }
    std::size_t free  = 0;
    std::size_t total = 0;
    OK(rt.mem_get_info(free, total));
    CHECK(free == 16 * GiB);
    // Virtual memory too: a 16 GiB physical handle, mapped and touched.
    void* va = nullptr;
    OK(rt.vm_reserve(&va, 16 * GiB, 0));
    sim_runtime::physical_handle h = 0;
    OK(rt.vm_create(h, 16 * GiB, 0));
    OK(rt.vm_map(va, 16 * GiB, h));
    OK(rt.vm_set_access(va, 16 * GiB, 0));
    static_cast<unsigned char*>(va)[12 * GiB] = 4;
    auto const grown = resident_bytes() - std::min(before, resident_bytes());
    CHECK(grown < 256 * MiB);
    for (auto* b : blocks) {
      auto* c = static_cast<unsigned char*>(b);
      CHECK(c[0] == 1);
      CHECK(c[8 * GiB] == 2);
      CHECK(c[16 * GiB - 1] == 3);
      OK(rt.free(b));
    }
    CHECK(static_cast<unsigned char*>(va)[12 * GiB] == 4);
    OK(rt.vm_unmap(va, 16 * GiB));
    OK(rt.vm_release(h));
    OK(rt.vm_free(va, 16 * GiB));
  }

  TEST_CASE("multiple devices: per-thread current device and per-device accounting and streams")
  {
    sim_runtime rt{sim_config{}.with_devices(2, GiB)};
    OK(rt.set_device(1));
    int d = -1;
    OK(rt.get_device(d));
    CHECK(d == 1);
    int seen_by_other_thread = -1;
    std::thread t{[&] {
      (void)rt.get_device(seen_by_other_thread);
      (void)rt.set_device(0);
    }};
    t.join();
    CHECK(seen_by_other_thread == 0);  // a new thread starts on device 0
    OK(rt.get_device(d));
    CHECK(d == 1);  // unchanged by the other thread

    void* p1 = nullptr;
    OK(rt.malloc(&p1, 10 * MiB));
    CHECK(rt.used_bytes(1) == 10 * MiB);
    CHECK(rt.used_bytes(0) == 0);
    std::size_t free  = 0;
    std::size_t total = 0;
    OK(rt.mem_get_info(free, total));
    CHECK(free == GiB - 10 * MiB);

    stream_t s1{};
    OK(rt.stream_create(s1));  // on device 1
    OK(rt.set_device(0));
    OK(rt.mem_get_info(free, total));
    CHECK(free == GiB);
    void* p2 = nullptr;
    OK(rt.malloc_async(&p2, MiB, s1));  // the stream's device
    CHECK(rt.used_bytes(1) == 11 * MiB);
    sim_runtime::physical_handle h = 0;
    OK(rt.vm_create(h, 2 * MiB, 1));  // the device asked for
    CHECK(rt.used_bytes(1) == 13 * MiB);
    CHECK(rt.used_bytes(0) == 0);

    // Null streams are per device, and device_synchronize waits for the current device only.
    OK(rt.set_device(1));
    OK(rt.stall(stream_t{}));
    std::atomic<int> on_one{0};
    OK(rt.launch_host_func(stream_t{}, set_flag, &on_one));
    OK(rt.set_device(0));
    std::atomic<int> on_zero{0};
    OK(rt.launch_host_func(stream_t{}, set_flag, &on_zero));
    OK(rt.device_synchronize());  // would block forever if it waited for device 1
    CHECK(flag(on_zero) == 1);
    CHECK(flag(on_one) == 0);
    OK(rt.set_device(1));
    OK(rt.release(stream_t{}));
    OK(rt.device_synchronize());
    CHECK(flag(on_one) == 1);

    OK(rt.vm_release(h));
    OK(rt.free_async(p2, s1));
    OK(rt.stream_synchronize(s1));
    OK(rt.free(p1));
    CHECK(rt.used_bytes(1) == 0);
    OK(rt.stream_destroy(s1));
    OK(rt.set_device(0));
  }

  TEST_CASE("fault injection fails the nth call with no side effect")
  {
    sim_runtime rt{one_device(GiB)};
    CHECK_THROWS_AS(rt.inject_fault(sim_op::malloc, 0, cudaErrorMemoryAllocation),
                    gpukit::logic_error);
    CHECK_THROWS_AS(rt.inject_fault(sim_op::count_, 1, cudaErrorMemoryAllocation),
                    gpukit::logic_error);
    CHECK_THROWS_AS(rt.inject_fault(sim_op::malloc, 1, cudaSuccess), gpukit::logic_error);

    SUBCASE("malloc: capacity unchanged, output untouched")
    {
      void* a = nullptr;
      OK(rt.malloc(&a, MiB));  // before the injection: not counted
      rt.inject_fault(sim_op::malloc, 2, cudaErrorMemoryAllocation);
      CHECK(rt.pending_faults() == 1);
      void* b = nullptr;
      OK(rt.malloc(&b, MiB));  // 1st
      void* c = reinterpret_cast<void*>(0x1234);
      CHECK(rt.malloc(&c, MiB) == cudaErrorMemoryAllocation);  // 2nd
      CHECK(c == reinterpret_cast<void*>(0x1234));
      CHECK(rt.used_bytes(0) == 2 * MiB);
      CHECK(rt.pending_faults() == 0);
      OK(rt.malloc(&c, MiB));  // 3rd: injections are one-shot
      CHECK(rt.calls(sim_op::malloc) == 4);
      CHECK(rt.misuse_count() == 0);  // an injected fault is not a misuse
      for (auto* p : {a, b, c}) { OK(rt.free(p)); }
    }
    SUBCASE("free: the pointer stays allocated")
    {
      void* a = nullptr;
      OK(rt.malloc(&a, MiB));
      rt.inject_fault(sim_op::free, 1, cudaErrorInvalidValue);
      CHECK(rt.free(a) == cudaErrorInvalidValue);
      CHECK(rt.used_bytes(0) == MiB);
      stream_t s{};
      OK(rt.stream_create(s));
      OK(rt.memset_async(a, 3, MiB, s));  // still valid device memory
      OK(rt.stream_synchronize(s));
      OK(rt.free(a));
      CHECK(rt.used_bytes(0) == 0);
      OK(rt.stream_destroy(s));
    }
    SUBCASE("several pending injections on different ops")
    {
      rt.inject_fault(sim_op::stream_create, 1, cudaErrorLaunchOutOfResources);
      rt.inject_fault(sim_op::event_record, 2, cudaErrorLaunchFailure);
      rt.inject_fault(sim_op::vm_create, 1, cudaErrorMemoryAllocation);
      rt.inject_fault(sim_op::event_query, 1, cudaErrorNotReady);
      CHECK(rt.pending_faults() == 4);
      stream_t s = reinterpret_cast<stream_t>(std::uintptr_t{0x77});
      CHECK(rt.stream_create(s) == cudaErrorLaunchOutOfResources);
      CHECK(s == reinterpret_cast<stream_t>(std::uintptr_t{0x77}));
      OK(rt.stream_create(s));
      event_t e{};
      OK(rt.event_create(e));
      OK(rt.event_record(e, s));
      CHECK(rt.event_record(e, s) == cudaErrorLaunchFailure);
      CHECK(rt.event_query(e) == cudaErrorNotReady);
      OK(rt.event_synchronize(e));
      OK(rt.event_query(e));
      sim_runtime::physical_handle h = 0;
      CHECK(rt.vm_create(h, 2 * MiB, 0) == cudaErrorMemoryAllocation);
      CHECK(h == 0);
      CHECK(rt.used_bytes(0) == 0);
      CHECK(rt.pending_faults() == 0);
      OK(rt.event_destroy(e));
      OK(rt.stream_destroy(s));
    }
    SUBCASE("same op twice, and clear_faults")
    {
      rt.inject_fault(sim_op::host_alloc, 1, cudaErrorMemoryAllocation);
      rt.inject_fault(sim_op::host_alloc, 3, cudaErrorInvalidValue);
      void* p = nullptr;
      CHECK(rt.host_alloc(&p, 64, 0) == cudaErrorMemoryAllocation);
      OK(rt.host_alloc(&p, 64, 0));
      void* q = nullptr;
      CHECK(rt.host_alloc(&q, 64, 0) == cudaErrorInvalidValue);
      OK(rt.host_free(p));
      rt.inject_fault(sim_op::stream_query, 1, cudaErrorNotReady);
      rt.inject_fault(sim_op::mem_get_info, 1, cudaErrorUnknown);
      rt.clear_faults();
      CHECK(rt.pending_faults() == 0);
      OK(rt.stream_query(stream_t{}));
      std::size_t f = 0;
      std::size_t t = 0;
      OK(rt.mem_get_info(f, t));
    }
  }

  TEST_CASE_FIXTURE(one_stream,
                    "call counters: exact counts with failed calls included and synchronizations")
  {
    rt.reset_counters();
    CHECK(rt.total_calls() == 0);
    CHECK(rt.synchronizations() == 0);

    void* d = nullptr;
    OK(rt.malloc(&d, 4096));
    OK(rt.memset_async(d, 0, 4096, s));
    event_t e{};
    OK(rt.event_create(e));
    OK(rt.event_record(e, s));
    for (int i = 0; i < 3; ++i) { (void)rt.event_query(e); }
    OK(rt.stream_synchronize(s));
    OK(rt.event_synchronize(e));
    CHECK(rt.free(reinterpret_cast<void*>(0x10)) == cudaErrorInvalidValue);  // failed, counted
    OK(rt.free(d));
    OK(rt.device_synchronize());
    OK(rt.event_destroy(e));

    CHECK(rt.calls(sim_op::malloc) == 1);
    CHECK(rt.calls(sim_op::memset_async) == 1);
    CHECK(rt.calls(sim_op::event_create) == 1);
    CHECK(rt.calls(sim_op::event_record) == 1);
    CHECK(rt.calls(sim_op::event_query) == 3);
    CHECK(rt.calls(sim_op::stream_synchronize) == 1);
    CHECK(rt.calls(sim_op::event_synchronize) == 1);
    CHECK(rt.calls(sim_op::free) == 2);
    CHECK(rt.calls(sim_op::device_synchronize) == 1);
    CHECK(rt.calls(sim_op::event_destroy) == 1);
    CHECK(rt.calls(sim_op::stream_create) == 0);
    CHECK(rt.total_calls() == 13);
    CHECK(rt.synchronizations() == 5);  // stream, event, 2 x free, device

    // A hot path that only queries makes device calls but no synchronization; controls and host
    // code make no call at all.
    rt.reset_counters();
    OK(rt.stream_query(s));
    OK(rt.stall(s));
    OK(rt.release(s));
    (void)rt.capacity(0);
    CHECK(rt.total_calls() == 1);
    CHECK(rt.synchronizations() == 0);
  }
}

TEST_SUITE("sim_concurrency")
{
  TEST_CASE("many threads create and use and destroy streams and events")
  {
    sim_runtime rt{sim_config{}.with_devices(2, 8 * GiB)};
    constexpr int threads = 6;
    constexpr int rounds  = 60;
    std::atomic<int> failures{0};
    std::vector<std::thread> pool;
    for (int t = 0; t < threads; ++t) {
      pool.emplace_back([&, t] {
        if (rt.set_device(t % 2) != cudaSuccess) { ++failures; }
        std::vector<unsigned char> in(64 * KiB);
        std::vector<unsigned char> out(64 * KiB);
        for (int r = 0; r < rounds; ++r) {
          unsigned const seed = static_cast<unsigned>(t * 1000 + r);
          fill(in.data(), in.size(), seed);
          stream_t a{};
          stream_t b{};
          event_t e{};
          event_t done{};
          void* d = nullptr;
          bool ok =
            rt.stream_create(a) == cudaSuccess && rt.stream_create(b) == cudaSuccess &&
            rt.event_create(e) == cudaSuccess && rt.event_create(done, true) == cudaSuccess &&
            rt.malloc_async(&d, in.size(), a) == cudaSuccess &&
            rt.memcpy_async(d, in.data(), in.size(), memcpy_kind::host_to_device, a) ==
              cudaSuccess &&
            rt.event_record(e, a) == cudaSuccess && rt.stream_wait_event(b, e) == cudaSuccess &&
            rt.event_destroy(e) == cudaSuccess &&  // with a wait pending on it
            rt.memcpy_async(out.data(), d, out.size(), memcpy_kind::device_to_host, b) ==
              cudaSuccess &&
            rt.event_record(done, b) == cudaSuccess;
          if (ok) { ok = rt.stream_destroy(a) == cudaSuccess; }  // queued work still runs
          while (ok) {
            auto const q = rt.event_query(done);
            if (q == cudaSuccess) { break; }
            ok = q == cudaErrorNotReady;
            std::this_thread::yield();
          }
          ok = ok && rt.free_async(d, b) == cudaSuccess &&
               rt.stream_synchronize(b) == cudaSuccess && holds(out.data(), out.size(), seed) &&
               rt.event_destroy(done) == cudaSuccess && rt.stream_destroy(b) == cudaSuccess;
          if (!ok) { ++failures; }
        }
      });
    }
    for (auto& th : pool) { th.join(); }
    CHECK(failures.load() == 0);
    CHECK(rt.used_bytes(0) == 0);
    CHECK(rt.used_bytes(1) == 0);
    CHECK(rt.misuse_count() == 0);
  }

  TEST_CASE("queries from other threads while streams and events are destroyed")
  {
    sim_runtime rt{one_device()};
    constexpr int handles = 200;
    std::vector<stream_t> streams(handles);
    std::vector<event_t> events(handles);
    for (int i = 0; i < handles; ++i) {
      OK(rt.stream_create(streams[i]));
      OK(rt.event_create(events[i]));
      OK(rt.launch_host_func(streams[i], nap, nullptr));
      OK(rt.event_record(events[i], streams[i]));
    }
    std::atomic<bool> stop{false};
    std::atomic<int> unexpected{0};
    std::vector<std::thread> readers;
    for (int t = 0; t < 3; ++t) {
      readers.emplace_back([&] {
        while (!stop.load()) {
          for (int i = 0; i < handles; ++i) {
            auto const q = rt.stream_query(streams[i]);
            auto const e = rt.event_query(events[i]);
            if (q != cudaSuccess && q != cudaErrorNotReady && q != cudaErrorInvalidResourceHandle) {
              ++unexpected;
            }
            if (e != cudaSuccess && e != cudaErrorNotReady && e != cudaErrorInvalidResourceHandle) {
              ++unexpected;
            }
          }
        }
      });
    }
    // Two threads race to destroy each handle: exactly one wins.
    std::atomic<int> destroyed{0};
    std::vector<std::thread> killers;
    for (int t = 0; t < 2; ++t) {
      killers.emplace_back([&] {
        for (int i = 0; i < handles; ++i) {
          if (rt.stream_destroy(streams[i]) == cudaSuccess) { ++destroyed; }
          if (rt.event_destroy(events[i]) == cudaSuccess) { ++destroyed; }
        }
      });
    }
    for (auto& k : killers) { k.join(); }
    stop = true;
    for (auto& r : readers) { r.join(); }
    CHECK(destroyed.load() == 2 * handles);
    CHECK(unexpected.load() == 0);
    OK(rt.device_synchronize());
  }

  TEST_CASE("concurrent allocations never exceed capacity")
  {
    constexpr std::size_t blocks = 512;
    sim_runtime rt{one_device(blocks * MiB)};
    std::atomic<std::size_t> got{0};
    std::vector<std::vector<void*>> held(4);
    std::vector<std::thread> pool;
    for (std::size_t t = 0; t < held.size(); ++t) {
      pool.emplace_back([&, t] {
        for (;;) {
          void* p      = nullptr;
          auto const e = rt.malloc(&p, MiB);
          if (e == cudaErrorMemoryAllocation) { break; }
          if (e != cudaSuccess) { continue; }
          std::memset(p, static_cast<int>(t + 1), 64);
          held[t].push_back(p);
          ++got;
        }
      });
    }
    for (auto& th : pool) { th.join(); }
    CHECK(got.load() == blocks);
    CHECK(rt.used_bytes(0) == blocks * MiB);
    // Distinct blocks: each still holds its owner's pattern.
    for (std::size_t t = 0; t < held.size(); ++t) {
      for (void* p : held[t]) {
        REQUIRE(static_cast<unsigned char*>(p)[63] == t + 1);
        OK(rt.free(p));
      }
    }
    CHECK(rt.used_bytes(0) == 0);
  }

  TEST_CASE("cross-thread events: one thread records while another waits and synchronizes")
  {
    sim_runtime rt{one_device()};
    constexpr int steps = 300;
    stream_t producer{};
    OK(rt.stream_create(producer));
    std::vector<event_t> events(steps);
    for (auto& e : events) { OK(rt.event_create(e)); }
    std::vector<int> values(steps, 0);
    struct cell {
      int* slot;
      int value;
    };
    std::vector<cell> cells(steps);
    std::atomic<int> recorded{0};
    std::atomic<int> wrong{0};
    std::thread consumer{[&] {
      stream_t s{};
      if (rt.stream_create(s) != cudaSuccess) {
        ++wrong;
        return;
      }
      for (int i = 0; i < steps; ++i) {
        while (recorded.load(std::memory_order_acquire) <= i) { std::this_thread::yield(); }
        if (rt.stream_wait_event(s, events[i]) != cudaSuccess) { ++wrong; }
        if (i % 3 == 0 && rt.event_synchronize(events[i]) != cudaSuccess) { ++wrong; }
        if (i % 3 == 0 && values[i] != i + 1) { ++wrong; }
      }
      if (rt.stream_synchronize(s) != cudaSuccess || rt.stream_destroy(s) != cudaSuccess) {
        ++wrong;
      }
    }};
    for (int i = 0; i < steps; ++i) {
      cells[i] = cell{&values[i], i + 1};
      OK(rt.launch_host_func(
        producer, [](void* u) { *static_cast<cell*>(u)->slot = static_cast<cell*>(u)->value; },
        &cells[i]));
      OK(rt.event_record(events[i], producer));
      recorded.store(i + 1, std::memory_order_release);
    }
    consumer.join();
    CHECK(wrong.load() == 0);
    OK(rt.stream_synchronize(producer));
    for (int i = 0; i < steps; ++i) { CHECK(values[i] == i + 1); }
    for (auto e : events) { OK(rt.event_destroy(e)); }
    OK(rt.stream_destroy(producer));
  }
}

// ---- Graph capture ------------------------------------------------------------------------------

namespace {

constexpr int capture_modes[] = {cudaStreamCaptureModeGlobal, cudaStreamCaptureModeThreadLocal,
                                 cudaStreamCaptureModeRelaxed};

/// A capture begun on `origin` in `mode` and forked to `side` (side waits on an event recorded on
/// origin), as PyTorch's `side.wait_stream(origin)` does.
void fork(sim_runtime& rt, stream_t origin, stream_t side, event_t e, int mode)
{
  OK(rt.begin_capture(origin, mode));
  OK(rt.event_record(e, origin));
  OK(rt.stream_wait_event(side, e));
}

/// Joins `side` back into `origin` (origin waits on an event recorded on side).
void join(sim_runtime& rt, stream_t origin, stream_t side, event_t e)
{
  OK(rt.event_record(e, side));
  OK(rt.stream_wait_event(origin, e));
}

bool is_capturing(sim_runtime& rt, stream_t s)
{
  bool capturing = false;
  OK(rt.stream_is_capturing(s, capturing));
  return capturing;
}

unsigned long long capture_id(sim_runtime& rt, stream_t s)
{
  unsigned long long id = 0;
  OK(rt.stream_capture_id(s, id));
  return id;
}

}  // namespace

TEST_SUITE("sim_runtime")
{
  TEST_CASE_FIXTURE(two_streams,
                    "graph capture: a stream that waits on the capture joins it, and "
                    "must be joined back before it ends")
  {
    event_t fork_e{}, join_e{};
    OK(rt.event_create(fork_e));
    OK(rt.event_create(join_e));
    void* d = nullptr;
    OK(rt.malloc(&d, 4 * KiB));
    OK(rt.memset_async(d, 1, 4 * KiB, b));
    OK(rt.stream_synchronize(b));
    for (int mode : capture_modes) {
      INFO("capture mode " << mode);
      fork(rt, a, b, fork_e, mode);
      CHECK(is_capturing(rt, a));
      CHECK(is_capturing(rt, b));
      CHECK(capture_id(rt, a) != 0);
      CHECK(capture_id(rt, b) == capture_id(rt, a));
      OK(rt.memset_async(d, 2, 4 * KiB, b));  // captured, not run
      join(rt, a, b, join_e);
      OK(rt.end_capture(a));
      CHECK_FALSE(is_capturing(rt, a));
      CHECK_FALSE(is_capturing(rt, b));
      CHECK(capture_id(rt, b) == 0);
      OK(rt.stream_synchronize(b));  // legal again
      CHECK(static_cast<unsigned char*>(d)[0] == 1);
    }

    // Work on the side stream after its last join: the capture ends unjoined, and ends.
    fork(rt, a, b, fork_e, cudaStreamCaptureModeGlobal);
    join(rt, a, b, join_e);
    OK(rt.memset_async(d, 3, 4 * KiB, b));
    CHECK(rt.end_capture(a) == cudaErrorStreamCaptureUnjoined);
    CHECK(rt.last_misuse().find("never waited for") != std::string::npos);
    CHECK_FALSE(is_capturing(rt, a));
    CHECK_FALSE(is_capturing(rt, b));

    // A fork with no work on the side stream needs no join; two captures have two ids.
    fork(rt, a, b, fork_e, cudaStreamCaptureModeGlobal);
    auto const first = capture_id(rt, a);
    OK(rt.end_capture(a));
    fork(rt, a, b, fork_e, cudaStreamCaptureModeGlobal);
    CHECK(capture_id(rt, b) != first);
    CHECK(rt.begin_capture(b) == cudaErrorInvalidValue);  // already capturing (joined)
    OK(rt.end_capture(a));
    CHECK(rt.end_capture(a) == cudaErrorInvalidValue);  // not capturing
    CHECK(rt.begin_capture(a, 7) == cudaErrorInvalidValue);
    CHECK(rt.last_misuse().find("mode 7") != std::string::npos);
    OK(rt.free(d));
    OK(rt.event_destroy(fork_e));
    OK(rt.event_destroy(join_e));
  }

  TEST_CASE_FIXTURE(two_streams,
                    "graph capture: stream_get_device, stream_query and "
                    "stream_synchronize on any capturing stream invalidate it")
  {
    event_t fork_e{}, join_e{};
    OK(rt.event_create(fork_e));
    OK(rt.event_create(join_e));
    using call_fn                                 = cudaError_t (*)(sim_runtime&, stream_t);
    std::pair<char const*, call_fn> const calls[] = {
      {"stream_get_device",
       [](sim_runtime& r, stream_t s) {
         int d = -1;
         return r.stream_get_device(s, d);
       }},
      {"stream_query", [](sim_runtime& r, stream_t s) { return r.stream_query(s); }},
      {"stream_synchronize", [](sim_runtime& r, stream_t s) { return r.stream_synchronize(s); }},
    };
    for (int mode : capture_modes) {
      // Relaxed mode on this thread too: only the stream rule can refuse the call.
      int thread_mode = cudaStreamCaptureModeRelaxed;
      OK(rt.exchange_capture_mode(thread_mode));
      for (auto const& [name, call] : calls) {
        for (bool on_side : {false, true}) {
          INFO("capture mode " << mode << ", " << name << " on the "
                               << (on_side ? "joined" : "origin") << " stream");
          fork(rt, a, b, fork_e, mode);
          // What capture allows leaves it valid.
          CHECK(is_capturing(rt, b));
          CHECK(capture_id(rt, b) != 0);
          CHECK(call(rt, on_side ? b : a) == cudaErrorStreamCaptureUnsupported);
          CHECK(rt.last_misuse().find(std::string{name} + "(stream") != std::string::npos);
          CHECK(rt.last_misuse().find("invalidated") != std::string::npos);
          CHECK(is_capturing(rt, b));  // invalidated, still capturing until it ends
          // Nothing more is captured: work, records and joins fail until the end.
          CHECK(rt.launch_host_func(
                  b, [](void*) {}, nullptr) == cudaErrorStreamCaptureInvalidated);
          CHECK(rt.event_record(join_e, b) == cudaErrorStreamCaptureInvalidated);
          CHECK(rt.stream_wait_event(a, fork_e) == cudaErrorStreamCaptureInvalidated);
          CHECK(rt.end_capture(a) == cudaErrorStreamCaptureInvalidated);
          CHECK_FALSE(is_capturing(rt, a));
          CHECK_FALSE(is_capturing(rt, b));
          CHECK(call(rt, on_side ? b : a) == cudaSuccess);  // after the capture: legal
        }
      }
      OK(rt.exchange_capture_mode(thread_mode));
    }
    OK(rt.event_destroy(fork_e));
    OK(rt.event_destroy(join_e));
  }

  TEST_CASE_FIXTURE(two_streams,
                    "graph capture: an event recorded in a capture cannot be queried (907)")
  {
    event_t e{};
    OK(rt.event_create(e));
    int thread_mode = cudaStreamCaptureModeRelaxed;  // the capture rule alone, not the mode's
    OK(rt.exchange_capture_mode(thread_mode));
    OK(rt.begin_capture(a, cudaStreamCaptureModeRelaxed));
    OK(rt.event_record(e, a));
    CHECK(rt.event_query(e) == cudaErrorCapturedEvent);
    CHECK(rt.last_misuse().find("event_query(event") != std::string::npos);
    CHECK(rt.end_capture(a) == cudaErrorStreamCaptureInvalidated);

    OK(rt.begin_capture(a, cudaStreamCaptureModeRelaxed));
    OK(rt.event_record(e, a));
    CHECK(rt.event_synchronize(e) == cudaErrorCapturedEvent);
    CHECK(rt.end_capture(a) == cudaErrorStreamCaptureInvalidated);

    // Still a captured event after the capture, until recorded again outside one.
    OK(rt.begin_capture(a, cudaStreamCaptureModeRelaxed));
    OK(rt.event_record(e, a));
    OK(rt.end_capture(a));
    CHECK(rt.event_query(e) == cudaErrorCapturedEvent);
    CHECK(rt.stream_wait_event(b, e) == cudaErrorCapturedEvent);
    CHECK_FALSE(is_capturing(rt, b));
    OK(rt.event_record(e, a));
    OK(rt.event_query(e));
    OK(rt.event_synchronize(e));
    OK(rt.exchange_capture_mode(thread_mode));
    OK(rt.event_destroy(e));
  }

  TEST_CASE("graph capture: only the stream that began a capture ends it; captures stay apart")
  {
    sim_runtime rt{one_device()};
    stream_t a{}, b{}, c{};
    OK(rt.stream_create(a));
    OK(rt.stream_create(b));
    OK(rt.stream_create(c));
    event_t e{}, f{};
    OK(rt.event_create(e));
    OK(rt.event_create(f));
    fork(rt, a, b, e, cudaStreamCaptureModeGlobal);
    CHECK(rt.end_capture(b) == cudaErrorStreamCaptureUnmatched);
    CHECK(rt.last_misuse().find("which must end it") != std::string::npos);
    CHECK(is_capturing(rt, b));
    CHECK(rt.end_capture(a) == cudaErrorStreamCaptureInvalidated);
    CHECK_FALSE(is_capturing(rt, b));

    // A stream of one capture waiting on an event of another: both are invalidated.
    OK(rt.begin_capture(a, cudaStreamCaptureModeGlobal));
    OK(rt.begin_capture(c, cudaStreamCaptureModeGlobal));
    CHECK(capture_id(rt, a) != capture_id(rt, c));
    OK(rt.event_record(f, c));
    CHECK(rt.stream_wait_event(a, f) == cudaErrorStreamCaptureIsolation);
    CHECK(rt.end_capture(c) == cudaErrorStreamCaptureInvalidated);
    CHECK(rt.end_capture(a) == cudaErrorStreamCaptureInvalidated);
    OK(rt.event_destroy(e));
    OK(rt.event_destroy(f));
    for (stream_t s : {a, b, c}) { OK(rt.stream_destroy(s)); }
  }

  TEST_CASE("graph capture modes: which threads' unsafe calls fail and invalidate the capture")
  {
    // (capture mode, the calling thread, its capture mode) -> refused?
    struct row {
      int capture_mode;
      bool same_thread;
      int thread_mode;
      bool refused;
    };
    int const G = cudaStreamCaptureModeGlobal, T = cudaStreamCaptureModeThreadLocal,
              R      = cudaStreamCaptureModeRelaxed;
    row const rows[] = {
      {G, true, G, true},   {G, true, T, true},   {G, true, R, false},  {G, false, G, true},
      {G, false, T, false}, {G, false, R, false}, {T, true, G, true},   {T, true, T, true},
      {T, true, R, false},  {T, false, G, false}, {T, false, T, false}, {T, false, R, false},
      {R, true, G, false},  {R, true, T, false},  {R, true, R, false},  {R, false, G, false},
      {R, false, T, false}, {R, false, R, false},
    };
    sim_runtime rt{one_device()};
    stream_t s{};
    OK(rt.stream_create(s));
    for (row const& r : rows) {
      INFO("capture mode " << r.capture_mode << ", " << (r.same_thread ? "same" : "other")
                           << " thread in mode " << r.thread_mode);
      OK(rt.begin_capture(s, r.capture_mode));
      cudaError_t got_malloc = cudaSuccess, got_sync = cudaSuccess;
      auto unsafe_calls = [&] {
        int mode = r.thread_mode;
        (void)rt.exchange_capture_mode(mode);
        void* p    = nullptr;
        got_malloc = rt.malloc(&p, 4 * KiB);
        if (got_malloc == cudaSuccess) { (void)rt.free(p); }
        got_sync = rt.device_synchronize();
        (void)rt.exchange_capture_mode(mode);
      };
      if (r.same_thread) {
        unsafe_calls();
      } else {
        std::thread{unsafe_calls}.join();
      }
      auto const want = r.refused ? cudaErrorStreamCaptureUnsupported : cudaSuccess;
      CHECK(got_malloc == want);
      CHECK(got_sync == want);
      CHECK(rt.end_capture(s) == (r.refused ? cudaErrorStreamCaptureInvalidated : cudaSuccess));
    }
    CHECK(rt.used_bytes(0) == 0);
    OK(rt.stream_destroy(s));
  }
}
