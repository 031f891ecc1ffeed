// SPDX-License-Identifier: Apache-2.0
// libgpukit_torch.so: gpukit's caching allocator behind the C ABI that PyTorch's
// torch.cuda.memory.CUDAPluggableAllocator and CuPy (through ctypes) call. The ABI and its error
// contract are documented in gpukit_torch.h; gpukit_torch.pluggable installs it.
//
// Built twice: over the CUDA runtime (libgpukit_torch.so, for PyTorch and CuPy), and with
// GPUKIT_TORCH_SIM=1 over the simulated GPU (tests/pytorch: CI loads it with dlopen and drives the
// same code without a GPU; the cudaStream_t argument is then a sim_runtime stream handle).
#include "gpukit_torch.h"

#include <gpukit/memory/caching_allocator.hpp>
#include <gpukit/memory/memory_history.hpp>
#if GPUKIT_TORCH_SIM
#include <gpukit/runtime/sim_runtime.hpp>
#endif

#include <array>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <fstream>
#include <mutex>
#include <new>
#include <stdexcept>
#include <string>
#include <type_traits>

namespace {

#if GPUKIT_TORCH_SIM
using runtime = gpukit::sim_runtime;
runtime::stream_type to_stream(cudaStream_t s) noexcept
{
  return reinterpret_cast<runtime::stream_type>(s);
}
#else
using runtime = gpukit::cuda_runtime;
runtime::stream_type to_stream(cudaStream_t s) noexcept { return s; }
#endif
using allocator = gpukit::basic_caching_allocator<runtime>;

constexpr int max_devices = 64;

// ---- Segment sources by name
// --------------------------------------------------------------------- segment_source::growable is
// named through a dependent type, so this file builds against a gpukit with or without growable
// segments, and makes them the default as soon as they exist.
template <class E, class = void>
struct has_growable : std::false_type {};
template <class E>
struct has_growable<E, std::void_t<decltype(E::growable)>> : std::true_type {};

template <class E>
bool parse_source(std::string const& name, E& out)
{
  if (name == "automatic") {
    out = E::automatic;
  } else if (name == "stream_ordered") {
    out = E::stream_ordered;
  } else if (name == "synchronous") {
    out = E::synchronous;
  } else if (name == "growable") {
    if constexpr (has_growable<E>::value) {
      out = E::growable;
    } else {
      return false;
    }
  } else {
    return false;
  }
  return true;
}

template <class E>
E default_source() noexcept
{
  if constexpr (has_growable<E>::value) {
    return E::growable;
  } else {
    return E::automatic;
  }
}

template <class E>
char const* source_name(E s) noexcept
{
  if (s == E::automatic) { return "automatic"; }
  if (s == E::stream_ordered) { return "stream_ordered"; }
  if (s == E::synchronous) { return "synchronous"; }
  if constexpr (has_growable<E>::value) {
    if (s == E::growable) { return "growable"; }
  }
  return "unknown";
}

std::string known_sources()
{
  return has_growable<gpukit::segment_source>::value
           ? "growable, stream_ordered, synchronous or automatic"
           : "stream_ordered, synchronous or automatic (this gpukit has no growable segments)";
}

// ---- Process-wide state -------------------------------------------------------------------------
// Allocated once and never destroyed: PyTorch frees tensors while Python shuts down, after this
// library's static destructors may have run, and every such free must still find its allocator.
struct state {
  std::array<std::atomic<allocator*>, max_devices> allocators{};
  std::array<std::atomic<std::int64_t>, max_devices> bad_frees{};
  std::mutex create_mutex;  // creating allocators, and `source` below
  bool configured{false};   // gpukit_torch_configure chose `source`
  gpukit::segment_source source{default_source<gpukit::segment_source>()};
  std::mutex error_mutex;
  std::string last_error;
  bool abort_on_bad_free{false};
};

state& global()
{
  static state* s = [] {
    auto* st              = new state{};
    char const* v         = std::getenv("GPUKIT_TORCH_ABORT_ON_BAD_FREE");
    st->abort_on_bad_free = v != nullptr && *v != '\0' && std::strcmp(v, "0") != 0;
    return st;
  }();
  return *s;
}

void set_last_error(std::string message) noexcept
{
  try {
    auto& g = global();
    std::lock_guard<std::mutex> lock{g.error_mutex};
    g.last_error = std::move(message);
  } catch (...) {  // out of host memory while reporting: keep the previous message
  }
}

int fail(std::string message) noexcept
{
  set_last_error(std::move(message));
  return -1;
}

void check_device_index(int device, char const* what)
{
  if (device < 0 || device >= max_devices) {
    throw gpukit::logic_error{std::string{"gpukit: "} + what + ": device " +
                              std::to_string(device) + " is out of range"};
  }
}

// The source for a new allocator: gpukit_torch_configure's, else GPUKIT_TORCH_SEGMENTS, else the
// default. Called under create_mutex.
gpukit::segment_source source_for_new_allocator(state& g)
{
  if (g.configured) { return g.source; }
  char const* env = std::getenv("GPUKIT_TORCH_SEGMENTS");
  if (env == nullptr || *env == '\0') { return g.source; }
  gpukit::segment_source s{};
  if (!parse_source(std::string{env}, s)) {
    throw gpukit::logic_error{std::string{"gpukit: GPUKIT_TORCH_SEGMENTS="} + env +
                              " is not a segment source: expected " + known_sources()};
  }
  return s;
}

// The device's allocator, or null before its first use.
allocator* existing(int device) noexcept
{
  if (device < 0 || device >= max_devices) { return nullptr; }
  return global().allocators[static_cast<std::size_t>(device)].load(std::memory_order_acquire);
}

// The device's allocator, created on first use (the fast path is one atomic load).
allocator& allocator_for(int device)
{
  check_device_index(device, "allocator");
  auto& g = global();
  if (auto* a = g.allocators[static_cast<std::size_t>(device)].load(std::memory_order_acquire)) {
    return *a;
  }
  std::lock_guard<std::mutex> lock{g.create_mutex};
  auto& slot = g.allocators[static_cast<std::size_t>(device)];
  if (auto* a = slot.load(std::memory_order_relaxed)) { return *a; }
  // The allocator acts on its own device whatever device is current (and refuses one that does
  // not exist), so no call here switches devices.
  gpukit::caching_allocator_options options;
  options.source = source_for_new_allocator(g);
  auto* a        = new allocator{runtime::instance(), device, options};
  slot.store(a, std::memory_order_release);
  return *a;
}

int resolve_device(int device)
{
  if (device >= 0) { return device; }
  GPUKIT_EXPECTS(device == -1, "device " + std::to_string(device) +
                                 " is neither a device nor -1 (the current device)");
  int current = 0;
  GPUKIT_CUDA_TRY(runtime::instance().get_device(current));
  return current;
}

bool is_shutdown_error(gpukit::cuda_error const& e) noexcept
{
  return e.code() == cudaErrorCudartUnloading || e.code() == cudaErrorContextIsDestroyed;
}

std::string hex(void const* p)
{
  char buf[32];
  std::snprintf(buf, sizeof buf, "%p", p);
  return buf;
}

// A free that gpukit refused. Exception or abort? PyTorch calls the free function from
// CUDAPluggableAllocator::raw_delete, the deleter of the tensor's DataPtr, which runs in
// ~StorageImpl and other destructors: implicitly noexcept, so an exception thrown here would not
// reach Python but end in std::terminate, far from the cause and with no chance for the program to
// go on. And nothing needs the abort: gpukit checks the pointer before it touches any state and
// leaves the allocator unchanged when it refuses one (a pointer it never gave, a double free, a
// wrong size), so the process can safely continue. Hence: ignore the free, count it, say so
// clearly on stderr and in gpukit_torch_last_error. GPUKIT_TORCH_ABORT_ON_BAD_FREE=1 aborts
// instead, for a debugger or a CI run that must not continue past it.
void report_bad_free(void* ptr, std::size_t size, int device, char const* why) noexcept
{
  auto& g = global();
  if (device >= 0 && device < max_devices) {
    g.bad_frees[static_cast<std::size_t>(device)].fetch_add(1, std::memory_order_relaxed);
  }
  std::string message;
  try {
    message = "gpukit_torch_free(" + hex(ptr) + ", " + std::to_string(size) + " bytes, device " +
              std::to_string(device) + "): ignored: " + why;
  } catch (...) {
    message = "gpukit_torch_free: ignored a bad free (and ran out of host memory describing it)";
  }
  std::fprintf(stderr, "%s\n", message.c_str());
  std::fflush(stderr);
  if (g.abort_on_bad_free) {
    std::fprintf(stderr, "gpukit: GPUKIT_TORCH_ABORT_ON_BAD_FREE is set: aborting\n");
    std::abort();
  }
  set_last_error(std::move(message));
}

void fill_stats(int device, gpukit_torch_stats& out)
{
  out           = gpukit_torch_stats{};
  auto& g       = global();
  out.bad_frees = g.bad_frees[static_cast<std::size_t>(device)].load(std::memory_order_relaxed);
  allocator* a  = existing(device);
  if (a == nullptr) {  // what the device's allocator will get
    std::lock_guard<std::mutex> lock{g.create_mutex};
    out.segment_source = static_cast<std::int64_t>(source_for_new_allocator(g));
    return;
  }
  auto const s                  = a->stats();
  out.allocated_bytes           = s.allocated_bytes.current;
  out.allocated_bytes_peak      = s.allocated_bytes.peak;
  out.reserved_bytes            = s.reserved_bytes.current;
  out.reserved_bytes_peak       = s.reserved_bytes.peak;
  out.active_bytes              = s.active_bytes.current;
  out.active_bytes_peak         = s.active_bytes.peak;
  out.requested_bytes           = s.requested_bytes.current;
  out.requested_bytes_peak      = s.requested_bytes.peak;
  out.inactive_split_bytes      = s.inactive_split_bytes.current;
  out.inactive_split_bytes_peak = s.inactive_split_bytes.peak;
  out.allocation_count          = s.allocation_count.current;
  out.allocation_count_peak     = s.allocation_count.peak;
  out.segment_count             = s.segment_count.current;
  out.segment_count_peak        = s.segment_count.peak;
  out.num_allocs                = static_cast<std::int64_t>(s.num_allocs);
  out.num_frees                 = static_cast<std::int64_t>(s.num_frees);
  out.num_device_allocs         = static_cast<std::int64_t>(s.num_device_allocs);
  out.num_device_frees          = static_cast<std::int64_t>(s.num_device_frees);
  out.num_alloc_retries         = static_cast<std::int64_t>(s.num_alloc_retries);
  out.num_ooms                  = static_cast<std::int64_t>(s.num_ooms);
  out.synchronizing_frees       = static_cast<std::int64_t>(s.synchronizing_frees);
  out.limit_bytes               = static_cast<std::int64_t>(a->limit());
  out.segment_source            = static_cast<std::int64_t>(a->options().source);
  out.initialized               = 1;
  out.num_cache_hits            = static_cast<std::int64_t>(s.num_cache_hits);
  out.num_pages_created         = static_cast<std::int64_t>(s.num_pages_created);
  out.num_pages_released        = static_cast<std::int64_t>(s.num_pages_released);
  out.num_pages_reused          = static_cast<std::int64_t>(s.num_pages_reused);
}

std::string stats_json(int device)
{
  gpukit_torch_stats s{};
  fill_stats(device, s);
  auto const source = static_cast<gpukit::segment_source>(s.segment_source);
  std::string o =
    "{\"device\": " + std::to_string(device) + ", \"segments\": \"" + source_name(source) + "\"";
  auto field = [&o](char const* name, std::int64_t v) {
    o += ", \"";
    o += name;
    o += "\": " + std::to_string(v);
  };
  field("allocated_bytes", s.allocated_bytes);
  field("allocated_bytes_peak", s.allocated_bytes_peak);
  field("reserved_bytes", s.reserved_bytes);
  field("reserved_bytes_peak", s.reserved_bytes_peak);
  field("active_bytes", s.active_bytes);
  field("active_bytes_peak", s.active_bytes_peak);
  field("requested_bytes", s.requested_bytes);
  field("requested_bytes_peak", s.requested_bytes_peak);
  field("inactive_split_bytes", s.inactive_split_bytes);
  field("inactive_split_bytes_peak", s.inactive_split_bytes_peak);
  field("allocation_count", s.allocation_count);
  field("allocation_count_peak", s.allocation_count_peak);
  field("segment_count", s.segment_count);
  field("segment_count_peak", s.segment_count_peak);
  field("num_allocs", s.num_allocs);
  field("num_frees", s.num_frees);
  field("num_device_allocs", s.num_device_allocs);
  field("num_device_frees", s.num_device_frees);
  field("num_alloc_retries", s.num_alloc_retries);
  field("num_ooms", s.num_ooms);
  field("synchronizing_frees", s.synchronizing_frees);
  field("limit_bytes", s.limit_bytes);
  field("bad_frees", s.bad_frees);
  field("initialized", s.initialized);
  field("num_cache_hits", s.num_cache_hits);
  field("num_pages_created", s.num_pages_created);
  field("num_pages_released", s.num_pages_released);
  field("num_pages_reused", s.num_pages_reused);
  o += "}";
  return o;
}

std::string format_for(std::string const& path, char const* format)
{
  if (format != nullptr && *format != '\0') { return format; }
  auto ends_with = [&path](char const* ext) {
    std::size_t const n = std::strlen(ext);
    return path.size() >= n && path.compare(path.size() - n, n, ext) == 0;
  };
  if (ends_with(".json")) { return "json"; }
  if (ends_with(".trace")) { return "trace"; }
  if (ends_with(".html")) { return "html"; }
  return "pickle";
}

void* malloc_impl(std::size_t size, int device, cudaStream_t stream)
{
  return allocator_for(device).allocate_async(size, to_stream(stream));
}

}  // namespace

extern "C" {

void* gpukit_torch_malloc(size_t size, int device, cudaStream_t stream)
{
  if (size == 0) { return nullptr; }
  try {
    return malloc_impl(size, device, stream);
  } catch (std::bad_alloc const& e) {
    // gpukit::out_of_memory / gpukit::bad_alloc: the message names the size and the device.
    set_last_error(e.what());
    throw;
  } catch (std::exception const& e) {
    std::string message = "gpukit_torch_malloc(" + std::to_string(size) + " bytes, device " +
                          std::to_string(device) + "): " + e.what();
    set_last_error(message);
    throw std::runtime_error{message};
  }
}

int gpukit_torch_malloc_nothrow(size_t size, int device, cudaStream_t stream, void** out)
{
  if (out == nullptr) { return fail("gpukit_torch_malloc_nothrow: out is null"); }
  *out = nullptr;
  if (size == 0) { return 0; }
  try {
    *out = malloc_impl(size, device, stream);
    return 0;
  } catch (std::bad_alloc const& e) {
    set_last_error(e.what());
    return 1;
  } catch (std::exception const& e) {
    return fail("gpukit_torch_malloc(" + std::to_string(size) + " bytes, device " +
                std::to_string(device) + "): " + e.what());
  }
}

void gpukit_torch_free(void* ptr, size_t size, int device, cudaStream_t stream)
{
  if (ptr == nullptr) { return; }
  try {
    allocator* a = existing(device);
    if (a == nullptr) {
      report_bad_free(ptr, size, device,
                      device < 0 || device >= max_devices
                        ? "the device is out of range: gpukit never gave this pointer"
                        : "gpukit has made no allocation on this device: it never gave this "
                          "pointer");
      return;
    }
    if (size == 0) {
      a->deallocate_async(ptr, to_stream(stream));
    } else {
      a->deallocate_async(ptr, size, to_stream(stream));
    }
  } catch (gpukit::logic_error const& e) {
    report_bad_free(ptr, size, device, e.what());
  } catch (gpukit::cuda_error const& e) {
    if (is_shutdown_error(e)) { return; }  // the process is exiting: the memory goes with it
    std::fprintf(stderr, "gpukit_torch_free(%p, %zu bytes, device %d): %s\n", ptr, size, device,
                 e.what());
    set_last_error(e.what());
  } catch (std::exception const& e) {
    std::fprintf(stderr, "gpukit_torch_free(%p, %zu bytes, device %d): %s\n", ptr, size, device,
                 e.what());
    set_last_error(e.what());
  } catch (...) {
    set_last_error("gpukit_torch_free: unknown exception");
  }
}

int gpukit_torch_configure(char const* segments)
{
  try {
    auto& g = global();
    std::lock_guard<std::mutex> lock{g.create_mutex};
    if (segments == nullptr || *segments == '\0') {
      g.configured = false;
      g.source     = default_source<gpukit::segment_source>();
      return 0;
    }
    gpukit::segment_source s{};
    if (!parse_source(segments, s)) {
      return fail(std::string{"gpukit_torch_configure: \""} + segments +
                  "\" is not a segment source: expected " + known_sources());
    }
    g.source     = s;
    g.configured = true;
    return 0;
  } catch (std::exception const& e) {
    return fail(e.what());
  }
}

int gpukit_torch_get_stats(int device, gpukit_torch_stats* out, size_t out_size)
{
  if (out == nullptr) { return fail("gpukit_torch_get_stats: out is null"); }
  try {
    int const d = resolve_device(device);
    check_device_index(d, "get_stats");
    gpukit_torch_stats s{};
    fill_stats(d, s);
    std::memcpy(out, &s, out_size < sizeof s ? out_size : sizeof s);
    return 0;
  } catch (std::exception const& e) {
    return fail(e.what());
  }
}

long long gpukit_torch_stats_json(int device, char* buf, size_t buf_size)
{
  try {
    int const d = resolve_device(device);
    check_device_index(d, "stats_json");
    std::string const s = stats_json(d);
    if (buf != nullptr && buf_size > 0) {
      std::size_t const n = s.size() < buf_size - 1 ? s.size() : buf_size - 1;
      std::memcpy(buf, s.data(), n);
      buf[n] = '\0';
    }
    return static_cast<long long>(s.size());
  } catch (std::exception const& e) {
    return fail(e.what());
  }
}

long long gpukit_torch_empty_cache(int device)
{
  try {
    int first = device, last = device;
    if (device == -1) {
      first = 0;
      last  = max_devices - 1;
    } else {
      check_device_index(device, "empty_cache");
    }
    long long released = 0;
    for (int d = first; d <= last; ++d) {
      if (allocator* a = existing(d)) { released += static_cast<long long>(a->release()); }
    }
    return released;
  } catch (std::exception const& e) {
    return fail(e.what());
  }
}

int gpukit_torch_reset_peak(int device)
{
  try {
    int const d = resolve_device(device);
    check_device_index(d, "reset_peak");
    if (allocator* a = existing(d)) { a->reset_peak(); }
    return 0;
  } catch (std::exception const& e) {
    return fail(e.what());
  }
}

int gpukit_torch_set_limit(int device, size_t bytes)
{
  try {
    allocator_for(resolve_device(device)).set_limit(bytes);
    return 0;
  } catch (std::exception const& e) {
    return fail(e.what());
  }
}

int gpukit_torch_record_history(int device, int enabled, size_t events_per_thread)
{
  try {
    allocator& a = allocator_for(resolve_device(device));
    if (enabled != 0) {
      a.start_recording(events_per_thread == 0 ? std::size_t{1} << 16 : events_per_thread);
    } else {
      a.stop_recording();
    }
    return 0;
  } catch (std::exception const& e) {
    return fail(e.what());
  }
}

int gpukit_torch_snapshot(int device, char const* path, char const* format)
{
  try {
    if (path == nullptr || *path == '\0') { return fail("gpukit_torch_snapshot: no path"); }
    int const d         = resolve_device(device);
    std::string const f = format_for(path, format);
    if (f != "pickle" && f != "json" && f != "trace" && f != "html") {
      return fail("gpukit_torch_snapshot: format \"" + f +
                  "\" is not one of pickle, json, trace, html");
    }
    gpukit::memory_snapshot snap;
    if (allocator* a = existing(d)) {
      snap = a->snapshot();
    } else {
      check_device_index(d, "snapshot");
      snap.device = d;  // nothing allocated yet: an empty snapshot
    }
    std::string const body = f == "pickle"  ? gpukit::to_pytorch_pickle(snap)
                             : f == "json"  ? gpukit::to_json(snap)
                             : f == "trace" ? gpukit::to_trace(snap)
                                            : gpukit::to_html(snap);
    std::ofstream out{path, std::ios::binary | std::ios::trunc};
    if (!out) {
      return fail(std::string{"gpukit_torch_snapshot: cannot open "} + path +
                  " for writing: " + std::strerror(errno));
    }
    out.write(body.data(), static_cast<std::streamsize>(body.size()));
    out.close();
    if (!out) { return fail(std::string{"gpukit_torch_snapshot: writing "} + path + " failed"); }
    return 0;
  } catch (std::exception const& e) {
    return fail(e.what());
  }
}

size_t gpukit_torch_last_error(char* buf, size_t buf_size)
{
  auto& g = global();
  std::lock_guard<std::mutex> lock{g.error_mutex};
  if (buf != nullptr && buf_size > 0) {
    std::size_t const n = g.last_error.size() < buf_size - 1 ? g.last_error.size() : buf_size - 1;
    std::memcpy(buf, g.last_error.data(), n);
    buf[n] = '\0';
  }
  return g.last_error.size();
}

}  // extern "C"
