// SPDX-License-Identifier: Apache-2.0
// libgpukit_torch's C ABI (bindings/torch/gpukit_torch.h), loaded with dlopen and called through
// dlsym as PyTorch and CuPy call it, over the simulated GPU: the same source as the CUDA library,
// built with GPUKIT_TORCH_SIM=1 (the cudaStream_t argument is a sim_runtime stream; null is the
// device's null stream). Three simulated devices of 1 GiB each (set before the library's simulated
// GPU is built, on first use). Cases share the library and its allocators, so each one measures
// changes from what it finds and gives back what it takes.
#include "gpukit_torch.h"

#include <gpukit/memory/caching_allocator.hpp>  // only for the default segment source

#include <doctest/doctest.h>

#include <dlfcn.h>
#include <sys/stat.h>
#include <unistd.h>

#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <new>
#include <stdexcept>
#include <string>
#include <type_traits>

namespace {

constexpr std::size_t MiB = std::size_t{1} << 20;

// The library built beside this test; found next to the executable when the build tree has moved
// (the h200 build runs on another machine).
std::string library_path()
{
  char const* built_at = GPUKIT_TORCH_SIM_LIB;
  if (access(built_at, R_OK) == 0) { return built_at; }
  char exe[PATH_MAX] = {};
  ssize_t const n    = readlink("/proc/self/exe", exe, sizeof exe - 1);
  std::string dir    = n > 0 ? std::string(exe, static_cast<std::size_t>(n)) : std::string{"."};
  dir                = dir.substr(0, dir.find_last_of('/'));
  std::string name   = built_at;
  return dir + "/" + name.substr(name.find_last_of('/') + 1);
}

struct abi {
  decltype(&gpukit_torch_malloc) malloc_fn{};
  decltype(&gpukit_torch_free) free_fn{};
  decltype(&gpukit_torch_malloc_nothrow) malloc_nothrow{};
  decltype(&gpukit_torch_configure) configure{};
  decltype(&gpukit_torch_get_stats) get_stats{};
  decltype(&gpukit_torch_stats_json) stats_json{};
  decltype(&gpukit_torch_empty_cache) empty_cache{};
  decltype(&gpukit_torch_reset_peak) reset_peak{};
  decltype(&gpukit_torch_set_limit) set_limit{};
  decltype(&gpukit_torch_record_history) record_history{};
  decltype(&gpukit_torch_snapshot) snapshot{};
  decltype(&gpukit_torch_last_error) last_error{};

  gpukit_torch_stats stats(int device) const
  {
    gpukit_torch_stats s{};
    REQUIRE(get_stats(device, &s, sizeof s) == 0);
    return s;
  }
  std::string json(int device) const
  {
    long long const n = stats_json(device, nullptr, 0);
    REQUIRE(n > 0);
    std::string s(static_cast<std::size_t>(n) + 1, '\0');
    REQUIRE(stats_json(device, s.data(), s.size()) == n);
    s.resize(static_cast<std::size_t>(n));
    return s;
  }
  std::string error() const
  {
    std::size_t const n = last_error(nullptr, 0);
    std::string s(n + 1, '\0');
    CHECK(last_error(s.data(), s.size()) == n);
    s.resize(n);
    return s;
  }
};

template <class F>
void bind(void* lib, F& f, char const* name)
{
  void* sym = dlsym(lib, name);
  REQUIRE_MESSAGE(sym != nullptr, name);
  f = reinterpret_cast<F>(sym);
}

abi const& library()
{
  static abi const a = [] {
    // The library's simulated GPU reads these on its first use.
    setenv("GPUKIT_SIM_DEVICES", "3", 1);
    setenv("GPUKIT_SIM_CAPACITY", "1G", 1);
    unsetenv("GPUKIT_TORCH_SEGMENTS");
    unsetenv("GPUKIT_TORCH_ABORT_ON_BAD_FREE");
    void* lib = dlopen(library_path().c_str(), RTLD_NOW | RTLD_LOCAL);
    REQUIRE_MESSAGE(lib != nullptr, dlerror());
    abi r;
    bind(lib, r.malloc_fn, "gpukit_torch_malloc");
    bind(lib, r.free_fn, "gpukit_torch_free");
    bind(lib, r.malloc_nothrow, "gpukit_torch_malloc_nothrow");
    bind(lib, r.configure, "gpukit_torch_configure");
    bind(lib, r.get_stats, "gpukit_torch_get_stats");
    bind(lib, r.stats_json, "gpukit_torch_stats_json");
    bind(lib, r.empty_cache, "gpukit_torch_empty_cache");
    bind(lib, r.reset_peak, "gpukit_torch_reset_peak");
    bind(lib, r.set_limit, "gpukit_torch_set_limit");
    bind(lib, r.record_history, "gpukit_torch_record_history");
    bind(lib, r.snapshot, "gpukit_torch_snapshot");
    bind(lib, r.last_error, "gpukit_torch_last_error");
    return r;
  }();
  return a;
}

bool contains(std::string const& s, std::string const& part)
{
  return s.find(part) != std::string::npos;
}

std::string hex(void const* p)
{
  char buf[32];
  std::snprintf(buf, sizeof buf, "%p", p);
  return buf;
}

std::string read_file(std::string const& path)
{
  std::ifstream in{path, std::ios::binary};
  return {std::istreambuf_iterator<char>{in}, std::istreambuf_iterator<char>{}};
}

// The library's default source, computed the way it does: growable once gpukit has it.
template <class E, class = void>
struct has_growable : std::false_type {};
template <class E>
struct has_growable<E, std::void_t<decltype(E::growable)>> : std::true_type {};
constexpr char const* expected_default_source =
  has_growable<gpukit::segment_source>::value ? "growable" : "automatic";

// Any malloc on the calling thread must leave memory the size asked for and not overlap others.
void fill(void* p, std::size_t n, unsigned char v) { std::memset(p, v, n); }
bool holds(void const* p, std::size_t n, unsigned char v)
{
  auto const* b = static_cast<unsigned char const*>(p);
  for (std::size_t i = 0; i < n; ++i) {
    if (b[i] != v) { return false; }
  }
  return true;
}

}  // namespace

TEST_SUITE("gpukit_torch")
{
  TEST_CASE("gpukit_torch: malloc and free through dlsym and the statistics that follow them")
  {
    auto const& lib      = library();
    gpukit_torch_stats b = lib.stats(0);
    void* p              = lib.malloc_fn(1000, 0, nullptr);
    void* q              = lib.malloc_fn(3 * MiB, 0, nullptr);
    REQUIRE(p != nullptr);
    REQUIRE(q != nullptr);
    CHECK(reinterpret_cast<std::uintptr_t>(p) % 256 == 0);
    CHECK(reinterpret_cast<std::uintptr_t>(q) % 256 == 0);
    fill(p, 1000, 0xab);
    fill(q, 3 * MiB, 0xcd);
    CHECK(holds(p, 1000, 0xab));
    CHECK(holds(q, 3 * MiB, 0xcd));

    gpukit_torch_stats s = lib.stats(0);
    CHECK(s.initialized == 1);
    CHECK(s.allocated_bytes == b.allocated_bytes + 1024 + static_cast<std::int64_t>(3 * MiB));
    CHECK(s.requested_bytes == b.requested_bytes + 1000 + static_cast<std::int64_t>(3 * MiB));
    CHECK(s.allocation_count == b.allocation_count + 2);
    CHECK(s.num_allocs == b.num_allocs + 2);
    CHECK(s.reserved_bytes >= s.allocated_bytes);
    CHECK(s.reserved_bytes_peak >= s.reserved_bytes);
    CHECK(s.allocated_bytes_peak >= s.allocated_bytes);

    std::string const j = lib.json(0);
    CHECK(contains(j, "\"device\": 0"));
    CHECK(contains(j, "\"allocated_bytes\": " + std::to_string(s.allocated_bytes) + ","));
    CHECK(contains(j, "\"reserved_bytes_peak\": " + std::to_string(s.reserved_bytes_peak) + ","));
    CHECK(contains(j, "\"initialized\": 1,"));
    CHECK(contains(j, "\"num_pages_created\": " + std::to_string(s.num_pages_created) + ","));
    if (std::string{expected_default_source} == "growable") {
      CHECK(s.num_pages_created > 0);  // physical pages back every growable segment
    }
    // A buffer too small gets a truncated, terminated copy and the full length.
    char small[8] = {};
    CHECK(lib.stats_json(0, small, sizeof small) == static_cast<long long>(j.size()));
    CHECK(std::string{small} == j.substr(0, 7));

    // PyTorch's empty tensors: size 0 gives null, and freeing null does nothing.
    CHECK(lib.malloc_fn(0, 0, nullptr) == nullptr);
    lib.free_fn(nullptr, 0, 0, nullptr);
    CHECK(lib.stats(0).num_allocs == s.num_allocs);

    lib.free_fn(p, 1000, 0, nullptr);
    lib.free_fn(q, 3 * MiB, 0, nullptr);
    s = lib.stats(0);
    CHECK(s.allocated_bytes == b.allocated_bytes);
    CHECK(s.allocation_count == b.allocation_count);
    CHECK(s.num_frees == b.num_frees + 2);
    CHECK(s.bad_frees == b.bad_frees);

    // empty_cache returns every fully free segment; what it reports is what reserved lost.
    long long const released   = lib.empty_cache(0);
    gpukit_torch_stats const e = lib.stats(0);
    CHECK(released >= 0);
    CHECK(released == s.reserved_bytes - e.reserved_bytes);
    if (e.allocated_bytes == 0) { CHECK(e.reserved_bytes == 0); }

    // reset_peak brings the peaks down to the current values.
    REQUIRE(lib.reset_peak(0) == 0);
    gpukit_torch_stats const r = lib.stats(0);
    CHECK(r.reserved_bytes_peak == r.reserved_bytes);
    CHECK(r.allocated_bytes_peak == r.allocated_bytes);
  }

  TEST_CASE("gpukit_torch: one allocator per device and each allocation on the device it names")
  {
    auto const& lib = library();
    // 700 MiB on each of two 1 GiB devices fits only when each lands on its own device, whatever
    // the calling thread's current device is (the library sets it for each call).
    void* on1 = lib.malloc_fn(700 * MiB, 1, nullptr);
    REQUIRE(on1 != nullptr);
    // The library restored the current device it found (0) after working on device 1.
    CHECK(contains(lib.json(-1), "\"device\": 0,"));
    void* on0 = lib.malloc_fn(700 * MiB, 0, nullptr);
    REQUIRE(on0 != nullptr);
    fill(on1, 4096, 1);
    fill(on0, 4096, 2);
    CHECK(lib.stats(1).allocated_bytes >= static_cast<std::int64_t>(700 * MiB));
    CHECK(lib.stats(0).allocated_bytes >= static_cast<std::int64_t>(700 * MiB));

    // Freed with the wrong device: device 0's allocator never gave it; nothing changes.
    auto const before = lib.stats(1);
    lib.free_fn(on1, 700 * MiB, 0, nullptr);
    CHECK(contains(lib.error(), hex(on1)));
    CHECK(lib.stats(1).allocated_bytes == before.allocated_bytes);
    CHECK(holds(on1, 4096, 1));

    lib.free_fn(on1, 700 * MiB, 1, nullptr);
    lib.free_fn(on0, 700 * MiB, 0, nullptr);
    CHECK(lib.empty_cache(-1) >= static_cast<long long>(2 * 700 * MiB));
    CHECK(lib.stats(1).allocated_bytes ==
          before.allocated_bytes - static_cast<std::int64_t>(700 * MiB));
  }

  TEST_CASE("gpukit_torch: out of memory throws through the C function and names size and device")
  {
    auto const& lib = library();
    auto const b    = lib.stats(0);

    // Larger than the device: a std::bad_alloc naming the size and the device.
    std::size_t const huge = std::size_t{2} << 30;
    try {
      (void)lib.malloc_fn(huge, 0, nullptr);
      FAIL("a 2 GiB allocation on a 1 GiB device returned");
    } catch (std::bad_alloc const& e) {
      CHECK(contains(e.what(), std::to_string(huge)));
      CHECK(contains(e.what(), "device 0"));
      CHECK(lib.error() == e.what());
    }

    // Full after recovery: gpukit's out-of-memory report, through the C function.
    void* a = lib.malloc_fn(600 * MiB, 0, nullptr);
    REQUIRE(a != nullptr);
    try {
      (void)lib.malloc_fn(600 * MiB, 0, nullptr);
      FAIL("two 600 MiB allocations fit a 1 GiB device");
    } catch (std::bad_alloc const& e) {
      CHECK(contains(e.what(), "out of memory on device 0"));
      CHECK(contains(e.what(), std::to_string(600 * MiB) + " bytes"));
    }
    CHECK(lib.stats(0).num_ooms == b.num_ooms + 1);
    void* out = &out;
    CHECK(lib.malloc_nothrow(600 * MiB, 0, nullptr, &out) == 1);
    CHECK(out == nullptr);
    CHECK(contains(lib.error(), "out of memory on device 0"));

    // The allocator is consistent afterwards: once `a` is gone, 600 MiB fit again.
    lib.free_fn(a, 600 * MiB, 0, nullptr);
    REQUIRE(lib.malloc_nothrow(600 * MiB, 0, nullptr, &out) == 0);
    REQUIRE(out != nullptr);
    fill(out, 600 * MiB, 7);
    CHECK(holds(out, 600 * MiB, 7));
    lib.free_fn(out, 600 * MiB, 0, nullptr);

    // A limit is out of memory too (it caps what is reserved: cached segments go first).
    CHECK(lib.empty_cache(0) >= 0);
    REQUIRE(lib.set_limit(0, 64 * MiB) == 0);
    CHECK(lib.stats(0).limit_bytes == static_cast<std::int64_t>(64 * MiB));
    CHECK_THROWS_AS((void)lib.malloc_fn(128 * MiB, 0, nullptr), std::bad_alloc);
    CHECK(contains(lib.error(), std::to_string(128 * MiB)));
    REQUIRE(lib.set_limit(0, 0) == 0);

    // Not a memory problem: a device that does not exist is a std::runtime_error naming both.
    try {
      (void)lib.malloc_fn(4096, 5, nullptr);
      FAIL("an allocation on device 5 of 3 returned");
    } catch (std::bad_alloc const&) {
      FAIL("a missing device reported as out of memory");
    } catch (std::runtime_error const& e) {
      CHECK(contains(e.what(), "4096 bytes, device 5"));
      CHECK(contains(e.what(), "does not exist"));
    }
    CHECK(lib.malloc_nothrow(4096, 5, nullptr, &out) == -1);
    CHECK(lib.malloc_nothrow(4096, -3, nullptr, &out) == -1);
    CHECK(contains(lib.error(), "device -3"));
    CHECK(lib.malloc_nothrow(4096, 0, nullptr, nullptr) == -1);
    CHECK(lib.stats(0).allocated_bytes == b.allocated_bytes);
  }

  TEST_CASE("gpukit_torch: a pointer gpukit never gave is reported and ignored and changes nothing")
  {
    auto const& lib = library();
    int local       = 0;
    lib.free_fn(&local, 16, 0, nullptr);  // before device 0's first allocation, if run alone
    CHECK(contains(lib.error(), hex(&local)));
    lib.free_fn(lib.malloc_fn(256, 0, nullptr), 256, 0, nullptr);  // device 0 has an allocator
    auto const b = lib.stats(0);
    lib.free_fn(&local, 16, 0, nullptr);  // no exception, no abort
    CHECK(contains(lib.error(), hex(&local)));
    CHECK(contains(lib.error(), "not allocated by this allocator"));
    CHECK(lib.stats(0).bad_frees == b.bad_frees + 1);

    // A double free and a wrong size: reported, and the allocator keeps its blocks.
    void* p = lib.malloc_fn(4096, 0, nullptr);
    REQUIRE(p != nullptr);
    lib.free_fn(p, 100, 0, nullptr);
    CHECK(contains(lib.error(), "was allocated with 4096 bytes but freed with 100"));
    CHECK(lib.stats(0).allocation_count == b.allocation_count + 1);
    lib.free_fn(p, 4096, 0, nullptr);
    lib.free_fn(p, 4096, 0, nullptr);
    CHECK(contains(lib.error(), "double free of " + hex(p)));
    auto const s = lib.stats(0);
    CHECK(s.bad_frees == b.bad_frees + 3);
    CHECK(s.allocation_count == b.allocation_count);
    CHECK(s.allocated_bytes == b.allocated_bytes);

    // Size 0 frees without checking the size (callers that do not know it).
    p = lib.malloc_fn(5000, 0, nullptr);
    lib.free_fn(p, 0, 0, nullptr);
    CHECK(lib.stats(0).allocation_count == b.allocation_count);
    CHECK(lib.stats(0).bad_frees == b.bad_frees + 3);

    // Devices without an allocator, or out of range.
    lib.free_fn(&local, 16, 2, nullptr);
    CHECK(contains(lib.error(), "device 2"));
    lib.free_fn(&local, 16, 99, nullptr);
    CHECK(contains(lib.error(), "device 99"));
    CHECK(contains(lib.error(), "out of range"));
    // And the allocator still works.
    p = lib.malloc_fn(4096, 0, nullptr);
    REQUIRE(p != nullptr);
    lib.free_fn(p, 4096, 0, nullptr);
    CHECK(lib.stats(0).allocation_count == b.allocation_count);
  }

  TEST_CASE("gpukit_torch: snapshots in PyTorch's pickle and gpukit's JSON trace and HTML")
  {
    auto const& lib = library();
    REQUIRE(lib.record_history(0, 1, 1024) == 0);
    void* p = lib.malloc_fn(5000, 0, nullptr);
    REQUIRE(p != nullptr);
    std::string const dir = "gpukit_torch_abi_test_" + std::to_string(getpid());
    REQUIRE(mkdir(dir.c_str(), 0755) == 0);

    REQUIRE(lib.snapshot(0, (dir + "/s.pickle").c_str(), nullptr) == 0);
    std::string const pickle = read_file(dir + "/s.pickle");
    REQUIRE(pickle.size() > 2);
    CHECK(pickle.compare(0, 2, "\x80\x02") == 0);  // pickle protocol 2
    CHECK(pickle.back() == '.');                   // STOP
    CHECK(contains(pickle, "segments"));
    CHECK(contains(pickle, "device_traces"));
    CHECK(contains(pickle, "active_allocated"));

    REQUIRE(lib.snapshot(0, (dir + "/s.json").c_str(), "") == 0);
    std::string const json = read_file(dir + "/s.json");
    CHECK(contains(json, "\"device\": 0"));
    CHECK(contains(json, "\"address\": " + std::to_string(reinterpret_cast<std::uintptr_t>(p))));
    CHECK(contains(json, "\"action\": \"alloc\""));

    REQUIRE(lib.snapshot(0, (dir + "/s.out").c_str(), "trace") == 0);
    CHECK(contains(read_file(dir + "/s.out"), " 5120 "));  // a <id> <block bytes> <stream>
    REQUIRE(lib.snapshot(0, (dir + "/s.html").c_str(), nullptr) == 0);
    CHECK(contains(read_file(dir + "/s.html"), "<html"));

    CHECK(lib.snapshot(0, (dir + "/s.x").c_str(), "xml") == -1);
    CHECK(contains(lib.error(), "\"xml\""));
    CHECK(lib.snapshot(0, "/nonexistent-gpukit-dir/s.json", nullptr) == -1);
    CHECK(contains(lib.error(), "/nonexistent-gpukit-dir/s.json"));
    CHECK(lib.snapshot(0, nullptr, nullptr) == -1);

    REQUIRE(lib.record_history(0, 0, 0) == 0);
    lib.free_fn(p, 5000, 0, nullptr);
    for (char const* f : {"s.pickle", "s.json", "s.out", "s.html"}) {
      std::remove((dir + "/" + f).c_str());
    }
    rmdir(dir.c_str());
  }

  TEST_CASE("gpukit_torch: the segment source is chosen by name before a device's first allocation")
  {
    auto const& lib = library();
    CHECK(lib.configure("bogus") == -1);
    CHECK(contains(lib.error(), "\"bogus\" is not a segment source"));
    CHECK(lib.configure("growable") == (has_growable<gpukit::segment_source>::value ? 0 : -1));
    REQUIRE(lib.configure(nullptr) == 0);
    // Device 0 took the default (nothing configured it).
    CHECK(contains(lib.json(0), std::string{"\"segments\": \""} + expected_default_source + "\""));

    // Device 2 is only used here: no allocator yet, then one with the configured source.
    CHECK(lib.stats(2).initialized == 0);
    REQUIRE(lib.configure("synchronous") == 0);
    void* p = lib.malloc_fn(1 * MiB, 2, nullptr);
    REQUIRE(p != nullptr);
    CHECK(lib.stats(2).initialized == 1);
    CHECK(lib.stats(2).segment_source ==
          static_cast<std::int64_t>(gpukit::segment_source::synchronous));
    CHECK(contains(lib.json(2), "\"segments\": \"synchronous\""));
    lib.free_fn(p, 1 * MiB, 2, nullptr);
    CHECK(lib.empty_cache(2) > 0);
    CHECK(lib.stats(2).synchronizing_frees >= 1);  // cudaFree, counted
    REQUIRE(lib.configure(nullptr) == 0);

    // Devices that do not exist or are out of range are errors, not crashes.
    gpukit_torch_stats s{};
    CHECK(lib.get_stats(64, &s, sizeof s) == -1);
    CHECK(contains(lib.error(), "device 64"));
    CHECK(lib.get_stats(-2, &s, sizeof s) == -1);
    CHECK(lib.get_stats(0, nullptr, 0) == -1);
    CHECK(lib.set_limit(7, 1) == -1);
    CHECK(contains(lib.error(), "device 7 does not exist"));
    CHECK(lib.empty_cache(64) == -1);
    // A smaller struct (an older caller) gets the fields it knows.
    std::int64_t first_two[2] = {-1, -1};
    REQUIRE(lib.get_stats(0, reinterpret_cast<gpukit_torch_stats*>(first_two), sizeof first_two) ==
            0);
    CHECK(first_two[0] == lib.stats(0).allocated_bytes);
  }
}
