// gpukit/runtime/detail/sim_runtime.inl: the bodies of gpukit::sim_runtime. Not public API;
// included by gpukit/runtime/sim_runtime.hpp.
//
// Locking (kept simple on purpose):
// - handles_mutex_ (shared): the live stream and event tables; lookups take it shared.
// - mem_mutex_: every memory table (allocations, pinned ranges, reservations, mappings, physical
//   handles). Held across the few syscalls of virtual-memory calls; malloc/free run mmap/munmap
//   outside it.
// - each stream, event and capture has its own mutex; queries are atomic loads.
// Nesting, always in this order: handles_mutex_ -> draining_mutex_; mem_mutex_ -> misuse_mutex_
// (a misuse found under the memory lock). Blocking waits hold no runtime lock; a stream's worker
// takes mem_mutex_ (finishing free_async) while holding nothing else.
#pragma once

#include <gpukit/runtime/sim_runtime.hpp>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <system_error>

namespace gpukit {

// ---- sim_op
// ---------------------------------------------------------------------------------------

inline char const* to_string(sim_op op) noexcept
{
  switch (op) {
    case sim_op::device_count: return "device_count";
    case sim_op::get_device: return "get_device";
    case sim_op::set_device: return "set_device";
    case sim_op::get_device_properties: return "get_device_properties";
    case sim_op::mem_get_info: return "mem_get_info";
    case sim_op::driver_version: return "driver_version";
    case sim_op::runtime_version: return "runtime_version";
    case sim_op::device_synchronize: return "device_synchronize";
    case sim_op::malloc: return "malloc";
    case sim_op::free: return "free";
    case sim_op::malloc_async: return "malloc_async";
    case sim_op::free_async: return "free_async";
    case sim_op::host_alloc: return "host_alloc";
    case sim_op::host_free: return "host_free";
    case sim_op::host_register: return "host_register";
    case sim_op::host_unregister: return "host_unregister";
    case sim_op::vm_granularity: return "vm_granularity";
    case sim_op::vm_reserve: return "vm_reserve";
    case sim_op::vm_free: return "vm_free";
    case sim_op::vm_create: return "vm_create";
    case sim_op::vm_release: return "vm_release";
    case sim_op::vm_map: return "vm_map";
    case sim_op::vm_unmap: return "vm_unmap";
    case sim_op::vm_set_access: return "vm_set_access";
    case sim_op::stream_create: return "stream_create";
    case sim_op::stream_destroy: return "stream_destroy";
    case sim_op::stream_synchronize: return "stream_synchronize";
    case sim_op::stream_query: return "stream_query";
    case sim_op::stream_wait_event: return "stream_wait_event";
    case sim_op::event_create: return "event_create";
    case sim_op::event_destroy: return "event_destroy";
    case sim_op::event_record: return "event_record";
    case sim_op::event_query: return "event_query";
    case sim_op::event_synchronize: return "event_synchronize";
    case sim_op::event_elapsed_time: return "event_elapsed_time";
    case sim_op::memcpy_async: return "memcpy_async";
    case sim_op::memcpy_peer_async: return "memcpy_peer_async";
    case sim_op::memset_async: return "memset_async";
    case sim_op::launch_host_func: return "launch_host_func";
    case sim_op::stream_is_capturing: return "stream_is_capturing";
    case sim_op::exchange_capture_mode: return "exchange_capture_mode";
    case sim_op::stream_get_device: return "stream_get_device";
    case sim_op::device_can_access_peer: return "device_can_access_peer";
    case sim_op::device_enable_peer_access: return "device_enable_peer_access";
    case sim_op::vm_export_shareable: return "vm_export_shareable";
    case sim_op::vm_import_shareable: return "vm_import_shareable";
    case sim_op::ipc_get_mem_handle: return "ipc_get_mem_handle";
    case sim_op::ipc_open_mem_handle: return "ipc_open_mem_handle";
    case sim_op::ipc_close_mem_handle: return "ipc_close_mem_handle";
    case sim_op::count_: break;
  }
  return "unknown";
}

// ---- sim_config
// -----------------------------------------------------------------------------------

inline sim_config& sim_config::with_devices(int count, std::size_t capacity_bytes) &
{
  GPUKIT_EXPECTS(
    count >= 1 && count <= 64,
    "sim_config::with_devices: count must be in [1, 64], got " + std::to_string(count));
  device_capacities.assign(static_cast<std::size_t>(count), capacity_bytes);
  return *this;
}
inline sim_config&& sim_config::with_devices(int count, std::size_t capacity_bytes) &&
{
  return std::move(with_devices(count, capacity_bytes));
}
inline sim_config& sim_config::with_vm_granularity(std::size_t bytes) &
{
  vm_granularity = bytes;
  return *this;
}
inline sim_config&& sim_config::with_vm_granularity(std::size_t bytes) &&
{
  return std::move(with_vm_granularity(bytes));
}
inline sim_config& sim_config::with_device_name(std::string name) &
{
  device_name = std::move(name);
  return *this;
}
inline sim_config&& sim_config::with_device_name(std::string name) &&
{
  return std::move(with_device_name(std::move(name)));
}
inline sim_config& sim_config::with_misuse_log(bool on) &
{
  log_misuse = on;
  return *this;
}
inline sim_config&& sim_config::with_misuse_log(bool on) &&
{
  return std::move(with_misuse_log(on));
}
inline sim_config& sim_config::with_ecc(bool on) &
{
  ecc_enabled = on;
  return *this;
}
inline sim_config&& sim_config::with_ecc(bool on) && { return std::move(with_ecc(on)); }
inline sim_config& sim_config::with_peer_access(bool on) &
{
  peer_access = on;
  return *this;
}
inline sim_config&& sim_config::with_peer_access(bool on) &&
{
  return std::move(with_peer_access(on));
}

namespace detail {

// Parses "<digits>[K|M|G|T]" (binary multiples); false when it does not parse or overflows.
inline bool sim_parse_bytes(char const* text, std::size_t& out)
{
  if (text == nullptr || *text < '0' || *text > '9') { return false; }
  errno        = 0;
  char* end    = nullptr;
  auto const v = std::strtoull(text, &end, 10);
  if (errno != 0) { return false; }
  unsigned shift = 0;
  switch (*end) {
    case '\0': break;
    case 'k':
    case 'K':
      shift = 10;
      ++end;
      break;
    case 'm':
    case 'M':
      shift = 20;
      ++end;
      break;
    case 'g':
    case 'G':
      shift = 30;
      ++end;
      break;
    case 't':
    case 'T':
      shift = 40;
      ++end;
      break;
    default: return false;
  }
  if (*end != '\0') { return false; }
  if (shift != 0 && v > (std::numeric_limits<std::size_t>::max() >> shift)) { return false; }
  out = static_cast<std::size_t>(v) << shift;
  return true;
}

}  // namespace detail

inline sim_config sim_config::from_env()
{
  sim_config c;
  std::size_t capacity = std::size_t{80} << 30;
  if (char const* text = std::getenv("GPUKIT_SIM_CAPACITY"); text != nullptr && *text != '\0') {
    GPUKIT_EXPECTS(detail::sim_parse_bytes(text, capacity),
                   std::string{"GPUKIT_SIM_CAPACITY="} + text +
                     ": expected a number of bytes, optionally with a K, M, G or T suffix");
  }
  std::size_t devices = 1;
  if (char const* text = std::getenv("GPUKIT_SIM_DEVICES"); text != nullptr && *text != '\0') {
    bool const ok = detail::sim_parse_bytes(text, devices) && devices >= 1 && devices <= 64 &&
                    std::strpbrk(text, "kKmMgGtT") == nullptr;
    GPUKIT_EXPECTS(ok, std::string{"GPUKIT_SIM_DEVICES="} + text +
                         ": expected a number of devices from 1 to 64");
  }
  c.with_devices(static_cast<int>(devices), capacity);
  return c;
}

// ---- construction -----------------------------------------------------------------------------

inline sim_runtime::sim_runtime(sim_config config)
    : serial_{detail::sim_next_id()}, config_{std::move(config)},
      page_size_{static_cast<std::size_t>(::sysconf(_SC_PAGESIZE))}
{
  auto const n = config_.device_capacities.size();
  GPUKIT_EXPECTS(n >= 1 && n <= 64,
                 "sim_runtime: the config must list 1 to 64 devices, got " + std::to_string(n));
  GPUKIT_EXPECTS(config_.vm_granularity != 0 && config_.vm_granularity % page_size_ == 0,
                 "sim_runtime: vm_granularity " + std::to_string(config_.vm_granularity) +
                   " is not a non-zero multiple of the host page size " +
                   std::to_string(page_size_));
  devices_.reserve(n);
  for (auto const cap : config_.device_capacities) {
    devices_.push_back(std::make_unique<detail::sim_device>(cap));
  }
  for (auto& c : calls_) { c.store(0, std::memory_order_relaxed); }
  for (auto& p : peer_enabled_) { p.store(0, std::memory_order_relaxed); }
}

inline sim_runtime::~sim_runtime()
{
  // Every stream, live, destroyed or null, drains its queue (stalls released) and exits.
  std::vector<std::shared_ptr<detail::sim_stream>> all;
  {
    std::unique_lock<std::shared_mutex> lock{handles_mutex_};
    for (auto& [id, s] : streams_) { all.push_back(s); }
    streams_.clear();
    events_.clear();
  }
  {
    std::lock_guard<std::mutex> lock{draining_mutex_};
    for (auto& s : draining_) { all.push_back(s); }
    draining_.clear();
  }
  for (auto& d : devices_) {
    if (d->null_started.load(std::memory_order_acquire)) { all.push_back(d->null_stream); }
  }
  for (auto& s : all) {
    s->set_stalled(false);
    s->stop();
  }
  for (auto& s : all) { s->join(); }
  all.clear();
  for (auto& d : devices_) { d->null_stream.reset(); }

  std::lock_guard<std::mutex> lock{mem_mutex_};
  for (auto const& [base, a] : allocations_) {
    ::munmap(reinterpret_cast<void*>(base), a.mapped_bytes);
    if (a.ipc_fd >= 0) { ::close(a.ipc_fd); }
  }
  for (auto const& [base, bytes] : host_allocs_) { ::munmap(reinterpret_cast<void*>(base), bytes); }
  for (auto const& [base, r] : reservations_) {
    ::munmap(reinterpret_cast<void*>(base), r.bytes);  // also removes the mappings inside
  }
  for (auto const& [id, ph] : physicals_) { ::close(ph.fd); }
}

inline sim_runtime& sim_runtime::instance()
{
  static sim_runtime rt{sim_config::from_env()};
  return rt;
}

inline char const* sim_runtime::error_name(cudaError_t e) noexcept { return ::cudaGetErrorName(e); }
inline char const* sim_runtime::error_string(cudaError_t e) noexcept
{
  return ::cudaGetErrorString(e);
}

// ---- plumbing ---------------------------------------------------------------------------------

namespace detail {
inline int& sim_capture_mode() noexcept
{
  thread_local int mode = cudaStreamCaptureModeGlobal;
  return mode;
}
}  // namespace detail

inline cudaError_t sim_runtime::capture_violation(sim_op op) noexcept
{
  switch (op) {
    case sim_op::malloc:
    case sim_op::free:
    case sim_op::host_alloc:
    case sim_op::host_free:
    case sim_op::event_query:
    case sim_op::event_synchronize:
    case sim_op::stream_query:
    case sim_op::stream_synchronize:
    case sim_op::device_synchronize: break;
    default: return cudaSuccess;
  }
  if (detail::sim_capture_mode() == cudaStreamCaptureModeRelaxed) { return cudaSuccess; }
  try {
    return misuse(cudaErrorStreamCaptureUnsupported,
                  std::string{to_string(op)} +
                    ": not allowed while a stream is being captured in global mode (call it "
                    "before the capture, or in relaxed capture mode)");
  } catch (...) {
    return cudaErrorStreamCaptureUnsupported;
  }
}

inline bool sim_runtime::capturing(std::uint64_t stream_id) const
{
  if (captures_underway_.load(std::memory_order_acquire) == 0) { return false; }
  std::lock_guard<std::mutex> lock{capture_mutex_};
  return std::find(capturing_.begin(), capturing_.end(), stream_id) != capturing_.end();
}

inline cudaError_t sim_runtime::enter(sim_op op) noexcept
{
  calls_[static_cast<std::size_t>(op)].fetch_add(1, std::memory_order_relaxed);
  if (captures_underway_.load(std::memory_order_acquire) != 0) {
    if (auto const e = capture_violation(op); e != cudaSuccess) { return e; }
  }
  if (faults_pending_.load(std::memory_order_acquire) == 0) { return cudaSuccess; }
  return take_fault(op);
}

inline cudaError_t sim_runtime::take_fault(sim_op op) noexcept
{
  std::lock_guard<std::mutex> lock{faults_mutex_};
  cudaError_t result = cudaSuccess;
  for (auto it = faults_.begin(); it != faults_.end();) {
    if (it->op == op && --it->remaining == 0) {
      if (result == cudaSuccess) { result = it->error; }
      it = faults_.erase(it);
    } else {
      ++it;
    }
  }
  faults_pending_.store(faults_.size(), std::memory_order_release);
  return result;
}

inline cudaError_t sim_runtime::misuse(cudaError_t error, std::string message)
{
  message = "gpukit sim: " + message;
  if (config_.log_misuse) {
    std::fprintf(stderr, "%s [%s]\n", message.c_str(), ::cudaGetErrorName(error));
  }
  {
    std::lock_guard<std::mutex> lock{misuse_mutex_};
    last_misuse_ = std::move(message);
  }
  misuse_count_.fetch_add(1, std::memory_order_relaxed);
  return error;
}

inline int sim_runtime::current_device() const { return detail::sim_thread_device(serial_); }

inline bool sim_runtime::valid_device(int d) const noexcept
{
  return d >= 0 && static_cast<std::size_t>(d) < devices_.size();
}

inline cudaError_t sim_runtime::bad_device(char const* call, int d)
{
  return misuse(cudaErrorInvalidDevice, std::string{call} + "(device " + std::to_string(d) +
                                          "): this simulated GPU has devices 0 to " +
                                          std::to_string(devices_.size() - 1));
}

inline std::shared_ptr<detail::sim_stream> sim_runtime::null_stream(int device)
{
  auto& dev = *devices_[static_cast<std::size_t>(device)];
  std::call_once(dev.null_once, [&] {
    auto s = std::make_shared<detail::sim_stream>(0, device);
    s->start();
    dev.null_stream = std::move(s);
    dev.null_started.store(true, std::memory_order_release);
  });
  return dev.null_stream;
}

inline std::shared_ptr<detail::sim_stream> sim_runtime::find_stream(stream_type s, char const* call,
                                                                    cudaError_t& err)
{
  if (s == nullptr) { return null_stream(current_device()); }
  auto const id = reinterpret_cast<std::uintptr_t>(s);
  {
    std::shared_lock<std::shared_mutex> lock{handles_mutex_};
    if (auto it = streams_.find(id); it != streams_.end()) { return it->second; }
  }
  err = misuse(cudaErrorInvalidResourceHandle,
               std::string{call} + "(stream " + detail::sim_hex(id) +
                 "): not a live stream of this simulated GPU (destroyed, or never created by it)");
  return nullptr;
}

inline std::shared_ptr<detail::sim_event> sim_runtime::find_event(event_type e, char const* call,
                                                                  cudaError_t& err)
{
  auto const id = reinterpret_cast<std::uintptr_t>(e);
  if (e != nullptr) {
    std::shared_lock<std::shared_mutex> lock{handles_mutex_};
    if (auto it = events_.find(id); it != events_.end()) { return it->second; }
  }
  err =
    misuse(cudaErrorInvalidResourceHandle,
           std::string{call} + "(event " + detail::sim_hex(id) +
             "): not a live event of this simulated GPU (null, destroyed, or never created by it)");
  return nullptr;
}

inline cudaError_t sim_runtime::enqueue(detail::sim_stream& s, std::function<void()> task,
                                        char const* call)
{
  if (capturing(s.id)) { return cudaSuccess; }  // captured into a graph: recorded, not run
  if (s.enqueue(std::move(task))) { return cudaSuccess; }
  return misuse(cudaErrorInvalidResourceHandle,
                std::string{call} + "(stream " + detail::sim_hex(std::uintptr_t{s.id}) +
                  "): the stream was destroyed while this call was in flight");
}

inline void sim_runtime::reap_streams()
{
  std::lock_guard<std::mutex> lock{draining_mutex_};
  auto const done =
    std::partition(draining_.begin(), draining_.end(), [](auto const& s) { return !s->exited(); });
  for (auto it = done; it != draining_.end(); ++it) { (*it)->join(); }
  draining_.erase(done, draining_.end());
}

inline void sim_runtime::wait_device(int device)
{
  std::vector<std::pair<std::shared_ptr<detail::sim_stream>, std::uint64_t>> marks;
  {
    std::shared_lock<std::shared_mutex> lock{handles_mutex_};
    for (auto const& [id, s] : streams_) {
      if (s->device == device) { marks.emplace_back(s, s->mark()); }
    }
    std::lock_guard<std::mutex> drain_lock{draining_mutex_};
    for (auto const& s : draining_) {
      if (s->device == device) { marks.emplace_back(s, s->mark()); }
    }
  }
  auto& dev = *devices_[static_cast<std::size_t>(device)];
  if (dev.null_started.load(std::memory_order_acquire)) {
    marks.emplace_back(dev.null_stream, dev.null_stream->mark());
  }
  for (auto& [s, mark] : marks) { s->wait_for(mark); }
}

inline void sim_runtime::wait_all_devices()
{
  for (std::size_t d = 0; d < devices_.size(); ++d) { wait_device(static_cast<int>(d)); }
}

// ---- devices ----------------------------------------------------------------------------------

inline cudaError_t sim_runtime::device_count(int& n)
{
  if (auto e = enter(sim_op::device_count); e != cudaSuccess) { return e; }
  n = static_cast<int>(devices_.size());
  return cudaSuccess;
}

inline cudaError_t sim_runtime::get_device(int& d)
{
  if (auto e = enter(sim_op::get_device); e != cudaSuccess) { return e; }
  d = current_device();
  return cudaSuccess;
}

inline cudaError_t sim_runtime::set_device(int d)
{
  if (auto e = enter(sim_op::set_device); e != cudaSuccess) { return e; }
  if (!valid_device(d)) { return bad_device("set_device", d); }
  detail::sim_thread_device(serial_) = d;
  return cudaSuccess;
}

inline cudaError_t sim_runtime::get_device_properties(device_properties& p, int d)
{
  if (auto e = enter(sim_op::get_device_properties); e != cudaSuccess) { return e; }
  if (!valid_device(d)) { return bad_device("get_device_properties", d); }
  p                           = device_properties{};
  p.name                      = config_.device_name;
  p.ordinal                   = d;
  p.major                     = 9;
  p.minor                     = 0;
  p.total_memory              = capacity(d);
  p.multiprocessor_count      = 132;
  p.async_engine_count        = 2;
  p.pci_domain_id             = 0;
  p.pci_bus_id                = d;
  p.pci_device_id             = 0;
  p.ecc_enabled               = config_.ecc_enabled;
  p.unified_addressing        = true;
  p.virtual_memory_management = true;
  p.memory_pools              = true;
  p.simulated                 = true;
  return cudaSuccess;
}

inline cudaError_t sim_runtime::mem_get_info(std::size_t& free, std::size_t& total)
{
  if (auto e = enter(sim_op::mem_get_info); e != cudaSuccess) { return e; }
  auto const& dev = *devices_[static_cast<std::size_t>(current_device())];
  total           = dev.capacity.load(std::memory_order_relaxed);
  free            = dev.free_bytes();
  return cudaSuccess;
}

inline cudaError_t sim_runtime::driver_version(int& v)
{
  if (auto e = enter(sim_op::driver_version); e != cudaSuccess) { return e; }
  v = 13000;
  return cudaSuccess;
}

inline cudaError_t sim_runtime::runtime_version(int& v)
{
  if (auto e = enter(sim_op::runtime_version); e != cudaSuccess) { return e; }
  v = 13000;
  return cudaSuccess;
}

inline cudaError_t sim_runtime::device_synchronize()
{
  synchronizations_.fetch_add(1, std::memory_order_relaxed);
  if (auto e = enter(sim_op::device_synchronize); e != cudaSuccess) { return e; }
  wait_device(current_device());
  return cudaSuccess;
}

inline cudaError_t sim_runtime::device_can_access_peer(int& can, int device, int peer)
{
  if (auto e = enter(sim_op::device_can_access_peer); e != cudaSuccess) { return e; }
  if (!valid_device(device)) { return bad_device("device_can_access_peer", device); }
  if (!valid_device(peer)) { return bad_device("device_can_access_peer", peer); }
  can = config_.peer_access && device != peer ? 1 : 0;
  return cudaSuccess;
}

inline cudaError_t sim_runtime::device_enable_peer_access(int peer)
{
  if (auto e = enter(sim_op::device_enable_peer_access); e != cudaSuccess) { return e; }
  int const d = current_device();
  if (!valid_device(peer)) { return bad_device("device_enable_peer_access", peer); }
  if (peer == d) {
    return misuse(cudaErrorInvalidDevice, "device_enable_peer_access(" + std::to_string(peer) +
                                            "): a device cannot be its own peer");
  }
  if (!config_.peer_access) {
    return misuse(cudaErrorPeerAccessUnsupported,
                  "device_enable_peer_access(" + std::to_string(peer) + ") with device " +
                    std::to_string(d) +
                    " current: this simulated GPU has no peer access (sim_config::peer_access)");
  }
  auto const bit  = std::uint64_t{1} << peer;
  auto const prev = peer_enabled_[static_cast<std::size_t>(d)].fetch_or(bit);
  return (prev & bit) != 0 ? cudaErrorPeerAccessAlreadyEnabled : cudaSuccess;
}

// ---- device memory ------------------------------------------------------------------------------

inline cudaError_t sim_runtime::allocate(void** p, std::size_t bytes, int device, bool async)
{
  auto& dev = *devices_[static_cast<std::size_t>(device)];
  if (bytes > std::numeric_limits<std::size_t>::max() - page_size_) {
    return cudaErrorMemoryAllocation;
  }
  std::size_t const mapped = (bytes + page_size_ - 1) / page_size_ * page_size_;
  if (!dev.try_charge(bytes)) { return cudaErrorMemoryAllocation; }
  void* m = ::mmap(nullptr, mapped, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (m == MAP_FAILED) {
    dev.uncharge(bytes);
    return cudaErrorMemoryAllocation;
  }
  {
    std::lock_guard<std::mutex> lock{mem_mutex_};
    detail::sim_allocation a;
    a.bytes                                           = bytes;
    a.mapped_bytes                                    = mapped;
    a.device                                          = device;
    a.async                                           = async;
    allocations_[reinterpret_cast<std::uintptr_t>(m)] = std::move(a);
  }
  *p = m;
  return cudaSuccess;
}

inline std::string sim_runtime::describe_unknown(std::uintptr_t a) const
{
  if (auto it = allocations_.upper_bound(a); it != allocations_.begin()) {
    --it;
    if (a < it->first + it->second.mapped_bytes) {
      return "not the start of an allocation: it lies inside the allocation at " +
             detail::sim_hex(it->first) + " of " + std::to_string(it->second.bytes) + " bytes";
    }
  }
  if (host_allocs_.count(a) != 0) { return "pinned host memory from host_alloc (use host_free)"; }
  if (auto it = reservations_.upper_bound(a); it != reservations_.begin()) {
    --it;
    if (a < it->first + it->second.bytes) {
      return "a virtual-memory address from vm_reserve (use vm_unmap / vm_free)";
    }
  }
  if (std::find(recently_freed_.begin(), recently_freed_.end(), a) != recently_freed_.end()) {
    return "double free: the pointer was already freed";
  }
  return "pointer was never allocated by this simulated device";
}

inline cudaError_t sim_runtime::malloc(void** p, std::size_t bytes)
{
  if (auto e = enter(sim_op::malloc); e != cudaSuccess) { return e; }
  if (p == nullptr) {
    return misuse(cudaErrorInvalidValue,
                  "malloc(nullptr, " + std::to_string(bytes) + "): the output pointer is null");
  }
  if (bytes == 0) {
    *p = nullptr;
    return cudaSuccess;
  }
  return allocate(p, bytes, current_device(), false);
}

inline cudaError_t sim_runtime::free(void* p)
{
  synchronizations_.fetch_add(1, std::memory_order_relaxed);
  if (auto e = enter(sim_op::free); e != cudaSuccess) { return e; }
  if (p == nullptr) { return cudaSuccess; }
  auto const base = reinterpret_cast<std::uintptr_t>(p);
  detail::sim_allocation a;
  {
    std::lock_guard<std::mutex> lock{mem_mutex_};
    auto it = allocations_.find(base);
    if (it == allocations_.end()) {
      return misuse(cudaErrorInvalidValue,
                    "free(" + detail::sim_hex(p) + "): " + describe_unknown(base));
    }
    if (it->second.pending_free) {
      return misuse(cudaErrorInvalidValue, "free(" + detail::sim_hex(p) +
                                             "): double free: the pointer was already freed "
                                             "with free_async");
    }
    if (it->second.imported) {
      return misuse(cudaErrorInvalidValue, "free(" + detail::sim_hex(p) +
                                             "): memory opened with ipc_open_mem_handle (use "
                                             "ipc_close_mem_handle)");
    }
    a = it->second;
    allocations_.erase(it);
    recently_freed_.push_back(base);
    if (recently_freed_.size() > 4096) { recently_freed_.pop_front(); }
  }
  // cudaFree synchronizes: work already queued may still read or write this memory.
  wait_device(a.device);
  ::munmap(p, a.mapped_bytes);
  if (a.ipc_fd >= 0) { ::close(a.ipc_fd); }
  devices_[static_cast<std::size_t>(a.device)]->uncharge(a.bytes);
  return cudaSuccess;
}

inline cudaError_t sim_runtime::malloc_async(void** p, std::size_t bytes, stream_type s)
{
  if (auto e = enter(sim_op::malloc_async); e != cudaSuccess) { return e; }
  cudaError_t err = cudaSuccess;
  auto stream     = find_stream(s, "malloc_async", err);
  if (!stream) { return err; }
  if (capturing(stream->id)) {
    return misuse(cudaErrorStreamCaptureUnsupported,
                  "malloc_async(" + std::to_string(bytes) +
                    "): the stream is being captured: on CUDA this allocation would become a "
                    "node of the graph, freed only with it");
  }
  if (p == nullptr) {
    return misuse(cudaErrorInvalidValue, "malloc_async(nullptr, " + std::to_string(bytes) +
                                           "): the output pointer is null");
  }
  if (bytes == 0) {
    *p = nullptr;
    return cudaSuccess;
  }
  return allocate(p, bytes, stream->device, true);
}

inline cudaError_t sim_runtime::free_async(void* p, stream_type s)
{
  if (auto e = enter(sim_op::free_async); e != cudaSuccess) { return e; }
  cudaError_t err = cudaSuccess;
  auto stream     = find_stream(s, "free_async", err);
  if (!stream) { return err; }
  if (p == nullptr) { return cudaSuccess; }
  auto const base = reinterpret_cast<std::uintptr_t>(p);
  detail::sim_allocation a;
  {
    std::lock_guard<std::mutex> lock{mem_mutex_};
    auto it = allocations_.find(base);
    if (it == allocations_.end()) {
      return misuse(cudaErrorInvalidValue,
                    "free_async(" + detail::sim_hex(p) + "): " + describe_unknown(base));
    }
    if (it->second.pending_free) {
      return misuse(cudaErrorInvalidValue, "free_async(" + detail::sim_hex(p) +
                                             "): double free: the pointer was already freed "
                                             "with free_async");
    }
    if (it->second.imported) {
      return misuse(cudaErrorInvalidValue, "free_async(" + detail::sim_hex(p) +
                                             "): memory opened with ipc_open_mem_handle (use "
                                             "ipc_close_mem_handle)");
    }
    it->second.pending_free = true;
    a                       = it->second;
  }
  auto release = [this, base, a] {
    {
      std::lock_guard<std::mutex> lock{mem_mutex_};
      allocations_.erase(base);
      recently_freed_.push_back(base);
      if (recently_freed_.size() > 4096) { recently_freed_.pop_front(); }
    }
    ::munmap(reinterpret_cast<void*>(base), a.mapped_bytes);
    if (a.ipc_fd >= 0) { ::close(a.ipc_fd); }
    devices_[static_cast<std::size_t>(a.device)]->uncharge(a.bytes);
  };
  if (auto e = enqueue(*stream, std::move(release), "free_async"); e != cudaSuccess) {
    std::lock_guard<std::mutex> lock{mem_mutex_};
    allocations_[base].pending_free = false;
    return e;
  }
  return cudaSuccess;
}

// ---- pinned host memory -------------------------------------------------------------------------

inline cudaError_t sim_runtime::host_alloc(void** p, std::size_t bytes, unsigned flags)
{
  if (auto e = enter(sim_op::host_alloc); e != cudaSuccess) { return e; }
  unsigned const known =
    host_alloc_flags::portable | host_alloc_flags::mapped | host_alloc_flags::write_combined;
  if (p == nullptr || (flags & ~known) != 0) {
    return misuse(cudaErrorInvalidValue,
                  "host_alloc(" + detail::sim_hex(p) + ", " + std::to_string(bytes) + ", flags " +
                    std::to_string(flags) + "): null output pointer or unknown flags");
  }
  if (bytes == 0) {
    *p = nullptr;
    return cudaSuccess;
  }
  if (bytes > std::numeric_limits<std::size_t>::max() - page_size_) {
    return cudaErrorMemoryAllocation;
  }
  std::size_t const mapped = (bytes + page_size_ - 1) / page_size_ * page_size_;
  void* m = ::mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (m == MAP_FAILED) { return cudaErrorMemoryAllocation; }
  {
    std::uint64_t const devices = (flags & host_alloc_flags::portable) != 0
                                    ? ~std::uint64_t{0}
                                    : std::uint64_t{1} << current_device();
    std::lock_guard<std::mutex> lock{mem_mutex_};
    host_allocs_[reinterpret_cast<std::uintptr_t>(m)] = mapped;
    pinned_for_[reinterpret_cast<std::uintptr_t>(m)]  = devices;
  }
  *p = m;
  return cudaSuccess;
}

inline cudaError_t sim_runtime::host_free(void* p)
{
  synchronizations_.fetch_add(1, std::memory_order_relaxed);
  if (auto e = enter(sim_op::host_free); e != cudaSuccess) { return e; }
  if (p == nullptr) { return cudaSuccess; }
  auto const base    = reinterpret_cast<std::uintptr_t>(p);
  std::size_t mapped = 0;
  {
    std::lock_guard<std::mutex> lock{mem_mutex_};
    auto it = host_allocs_.find(base);
    if (it == host_allocs_.end()) {
      std::string why = "pointer was not allocated by host_alloc of this simulated GPU";
      if (std::find(recently_freed_.begin(), recently_freed_.end(), base) !=
          recently_freed_.end()) {
        why = "double free: the pointer was already freed";
      }
      return misuse(cudaErrorInvalidValue, "host_free(" + detail::sim_hex(p) + "): " + why);
    }
    mapped = it->second;
    host_allocs_.erase(it);
    pinned_for_.erase(base);
    recently_freed_.push_back(base);
    if (recently_freed_.size() > 4096) { recently_freed_.pop_front(); }
  }
  wait_all_devices();  // cudaFreeHost synchronizes: queued copies may still use the buffer
  ::munmap(p, mapped);
  return cudaSuccess;
}

inline cudaError_t sim_runtime::host_register(void* p, std::size_t bytes, unsigned flags)
{
  if (auto e = enter(sim_op::host_register); e != cudaSuccess) { return e; }
  auto const args = "host_register(" + detail::sim_hex(p) + ", " + std::to_string(bytes) + ")";
  unsigned const known =
    host_register_flags::portable | host_register_flags::mapped | host_register_flags::read_only;
  if (p == nullptr || bytes == 0 || (flags & ~known) != 0) {
    return misuse(cudaErrorInvalidValue,
                  args + ": null pointer, zero bytes or unknown flags " + std::to_string(flags));
  }
  auto const a = reinterpret_cast<std::uintptr_t>(p);
  if (bytes > std::numeric_limits<std::uintptr_t>::max() - a) {
    return misuse(cudaErrorInvalidValue, args + ": the range wraps around the address space");
  }
  std::lock_guard<std::mutex> lock{mem_mutex_};
  if (place(p, 1).kind != placement::where::host) {
    return misuse(cudaErrorInvalidValue, args + ": the range is device memory");
  }
  auto overlaps = [&](std::map<std::uintptr_t, std::size_t> const& ranges) {
    auto it = ranges.lower_bound(a + bytes);  // first range starting at or after the end
    if (it == ranges.begin()) { return false; }
    --it;
    return it->first + it->second > a;
  };
  if (overlaps(host_registered_) || overlaps(host_allocs_)) {
    return misuse(cudaErrorHostMemoryAlreadyRegistered,
                  args + ": the range overlaps memory already registered or from host_alloc");
  }
  host_registered_[a] = bytes;
  pinned_for_[a]      = (flags & host_register_flags::portable) != 0
                          ? ~std::uint64_t{0}
                          : std::uint64_t{1} << current_device();
  return cudaSuccess;
}

inline cudaError_t sim_runtime::host_unregister(void* p)
{
  if (auto e = enter(sim_op::host_unregister); e != cudaSuccess) { return e; }
  std::lock_guard<std::mutex> lock{mem_mutex_};
  if (host_registered_.erase(reinterpret_cast<std::uintptr_t>(p)) == 0) {
    return misuse(cudaErrorHostMemoryNotRegistered,
                  "host_unregister(" + detail::sim_hex(p) +
                    "): no range registered with host_register starts there");
  }
  pinned_for_.erase(reinterpret_cast<std::uintptr_t>(p));
  return cudaSuccess;
}

// ---- virtual memory -----------------------------------------------------------------------------

inline cudaError_t sim_runtime::vm_granularity(std::size_t& g, int device)
{
  if (auto e = enter(sim_op::vm_granularity); e != cudaSuccess) { return e; }
  if (!valid_device(device)) { return bad_device("vm_granularity", device); }
  g = config_.vm_granularity;
  return cudaSuccess;
}

inline cudaError_t sim_runtime::vm_reserve(void** va, std::size_t bytes, std::size_t alignment)
{
  if (auto e = enter(sim_op::vm_reserve); e != cudaSuccess) { return e; }
  auto const g = config_.vm_granularity;
  auto const args =
    "vm_reserve(" + std::to_string(bytes) + ", alignment " + std::to_string(alignment) + ")";
  if (va == nullptr) {
    return misuse(cudaErrorInvalidValue, args + ": the output pointer is null");
  }
  if (bytes == 0 || bytes % g != 0) {
    return misuse(
      cudaErrorInvalidValue,
      args + ": size is not a non-zero multiple of the granularity " + std::to_string(g));
  }
  if ((alignment & (alignment - 1)) != 0) {
    return misuse(cudaErrorInvalidValue, args + ": alignment is not a power of two");
  }
  std::size_t const align = std::max(alignment, g);
  if (bytes > std::numeric_limits<std::size_t>::max() - align) { return cudaErrorMemoryAllocation; }
  std::size_t const span = bytes + align;
  void* m = ::mmap(nullptr, span, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (m == MAP_FAILED) { return cudaErrorMemoryAllocation; }
  auto const raw  = reinterpret_cast<std::uintptr_t>(m);
  auto const base = (raw + align - 1) / align * align;
  if (base > raw) { ::munmap(m, base - raw); }
  if (raw + span > base + bytes) {
    ::munmap(reinterpret_cast<void*>(base + bytes), raw + span - (base + bytes));
  }
  {
    std::lock_guard<std::mutex> lock{mem_mutex_};
    reservations_[base] = detail::sim_reservation{bytes};
  }
  *va = reinterpret_cast<void*>(base);
  return cudaSuccess;
}

inline cudaError_t sim_runtime::vm_free(void* va, std::size_t bytes)
{
  if (auto e = enter(sim_op::vm_free); e != cudaSuccess) { return e; }
  auto const args = "vm_free(" + detail::sim_hex(va) + ", " + std::to_string(bytes) + ")";
  auto const base = reinterpret_cast<std::uintptr_t>(va);
  std::lock_guard<std::mutex> lock{mem_mutex_};
  auto it = reservations_.find(base);
  if (it == reservations_.end()) {
    return misuse(cudaErrorInvalidValue, args + ": no reservation from vm_reserve starts there");
  }
  if (it->second.bytes != bytes) {
    return misuse(cudaErrorInvalidValue, args + ": the reservation is " +
                                           std::to_string(it->second.bytes) +
                                           " bytes; vm_free takes the whole range");
  }
  auto m           = mappings_.lower_bound(base);
  std::size_t live = 0;
  for (; m != mappings_.end() && m->first < base + bytes; ++m) { ++live; }
  if (live != 0) {
    return misuse(cudaErrorInvalidValue, args + ": " + std::to_string(live) +
                                           " mapping(s) remain in the range; vm_unmap them first");
  }
  ::munmap(va, bytes);
  reservations_.erase(it);
  return cudaSuccess;
}

inline cudaError_t sim_runtime::vm_create(physical_handle& h, std::size_t bytes, int device,
                                          bool shareable)
{
  if (auto e = enter(sim_op::vm_create); e != cudaSuccess) { return e; }
  if (!valid_device(device)) { return bad_device("vm_create", device); }
  auto const g = config_.vm_granularity;
  if (bytes == 0 || bytes % g != 0) {
    return misuse(cudaErrorInvalidValue,
                  "vm_create(" + std::to_string(bytes) + ", device " + std::to_string(device) +
                    "): size is not a non-zero multiple of the granularity " + std::to_string(g));
  }
  auto& dev = *devices_[static_cast<std::size_t>(device)];
  if (!dev.try_charge(bytes)) { return cudaErrorMemoryAllocation; }
  std::string const name = detail::sim_physical_name + std::to_string(device);
  int const fd           = ::memfd_create(name.c_str(), MFD_CLOEXEC);
  if (fd < 0 || ::ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
    if (fd >= 0) { ::close(fd); }
    dev.uncharge(bytes);
    return cudaErrorMemoryAllocation;
  }
  auto const id = detail::sim_next_id();
  {
    std::lock_guard<std::mutex> lock{mem_mutex_};
    physicals_[id] = detail::sim_physical{fd, bytes, device, false, 0, shareable, false};
  }
  h = id;
  return cudaSuccess;
}

inline void sim_runtime::release_physical(std::uint64_t id)
{
  auto it = physicals_.find(id);
  ::close(it->second.fd);
  if (!it->second.imported) {
    devices_[static_cast<std::size_t>(it->second.device)]->uncharge(it->second.bytes);
  }
  physicals_.erase(it);
}

inline cudaError_t sim_runtime::vm_release(physical_handle h)
{
  if (auto e = enter(sim_op::vm_release); e != cudaSuccess) { return e; }
  std::lock_guard<std::mutex> lock{mem_mutex_};
  auto it = physicals_.find(h);
  if (it == physicals_.end() || it->second.released) {
    return misuse(cudaErrorInvalidValue, "vm_release(handle " + std::to_string(h) +
                                           "): unknown or already released physical handle");
  }
  it->second.released = true;
  if (it->second.map_count == 0) { release_physical(h); }
  return cudaSuccess;
}

inline cudaError_t sim_runtime::vm_map(void* va, std::size_t bytes, physical_handle h)
{
  if (auto e = enter(sim_op::vm_map); e != cudaSuccess) { return e; }
  auto const args = "vm_map(" + detail::sim_hex(va) + ", " + std::to_string(bytes) + ", handle " +
                    std::to_string(h) + ")";
  auto const a = reinterpret_cast<std::uintptr_t>(va);
  std::lock_guard<std::mutex> lock{mem_mutex_};
  auto ph = physicals_.find(h);
  if (ph == physicals_.end() || ph->second.released) {
    return misuse(cudaErrorInvalidValue, args + ": unknown or released physical handle");
  }
  if (bytes != ph->second.bytes) {
    return misuse(cudaErrorInvalidValue, args + ": the handle is " +
                                           std::to_string(ph->second.bytes) +
                                           " bytes; vm_map maps it whole");
  }
  if (a % config_.vm_granularity != 0) {
    return misuse(cudaErrorInvalidValue, args + ": the address is not aligned to the granularity");
  }
  auto r      = reservations_.upper_bound(a);
  bool inside = false;
  if (r != reservations_.begin()) {
    --r;
    inside = a >= r->first && bytes <= r->second.bytes && a - r->first <= r->second.bytes - bytes;
  }
  if (!inside) {
    return misuse(cudaErrorInvalidValue, args + ": the range does not lie inside one reservation");
  }
  auto m       = mappings_.lower_bound(a);
  bool overlap = m != mappings_.end() && m->first < a + bytes;
  if (!overlap && m != mappings_.begin()) {
    --m;
    overlap = m->first + m->second.bytes > a;
  }
  if (overlap) { return misuse(cudaErrorInvalidValue, args + ": the range is already mapped"); }
  void* got = ::mmap(va, bytes, PROT_NONE, MAP_SHARED | MAP_FIXED, ph->second.fd, 0);
  if (got == MAP_FAILED) { return cudaErrorMemoryAllocation; }
  ++ph->second.map_count;
  mappings_[a] = detail::sim_mapping{bytes, h, ph->second.device, 0};
  return cudaSuccess;
}

inline bool sim_runtime::whole_mappings(std::uintptr_t va, std::size_t bytes,
                                        std::string& why) const
{
  if (bytes == 0) {
    why = "zero bytes";
    return false;
  }
  auto m = mappings_.find(va);
  if (m == mappings_.end()) {
    why = "no mapping starts at " + detail::sim_hex(va);
    return false;
  }
  std::uintptr_t cursor    = va;
  std::uintptr_t const end = va + bytes;
  while (cursor < end) {
    if (m == mappings_.end() || m->first != cursor) {
      why = "nothing is mapped at " + detail::sim_hex(cursor);
      return false;
    }
    cursor = m->first + m->second.bytes;
    ++m;
  }
  if (cursor != end) {
    why = "the range ends inside the mapping that ends at " + detail::sim_hex(cursor) +
          " (only whole mappings)";
    return false;
  }
  return true;
}

inline cudaError_t sim_runtime::vm_unmap(void* va, std::size_t bytes)
{
  if (auto e = enter(sim_op::vm_unmap); e != cudaSuccess) { return e; }
  auto const a = reinterpret_cast<std::uintptr_t>(va);
  std::lock_guard<std::mutex> lock{mem_mutex_};
  std::string why;
  if (!whole_mappings(a, bytes, why)) {
    return misuse(cudaErrorInvalidValue,
                  "vm_unmap(" + detail::sim_hex(va) + ", " + std::to_string(bytes) + "): " + why);
  }
  // Back to an inaccessible reservation (MAP_FIXED replaces the file mappings atomically).
  void* got =
    ::mmap(va, bytes, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1, 0);
  if (got == MAP_FAILED) { return cudaErrorMemoryAllocation; }
  auto m = mappings_.find(a);
  while (m != mappings_.end() && m->first < a + bytes) {
    auto ph = physicals_.find(m->second.handle);
    if (--ph->second.map_count == 0 && ph->second.released) { release_physical(ph->first); }
    m = mappings_.erase(m);
  }
  return cudaSuccess;
}

inline cudaError_t sim_runtime::vm_set_access(void* va, std::size_t bytes, int device)
{
  if (auto e = enter(sim_op::vm_set_access); e != cudaSuccess) { return e; }
  if (!valid_device(device)) { return bad_device("vm_set_access", device); }
  auto const a = reinterpret_cast<std::uintptr_t>(va);
  std::lock_guard<std::mutex> lock{mem_mutex_};
  std::string why;
  if (!whole_mappings(a, bytes, why)) {
    return misuse(cudaErrorInvalidValue, "vm_set_access(" + detail::sim_hex(va) + ", " +
                                           std::to_string(bytes) + "): " + why);
  }
  if (::mprotect(va, bytes, PROT_READ | PROT_WRITE) != 0) { return cudaErrorInvalidValue; }
  for (auto m = mappings_.find(a); m != mappings_.end() && m->first < a + bytes; ++m) {
    m->second.access_mask |= std::uint64_t{1} << device;
  }
  return cudaSuccess;
}

// ---- shareable physical memory and IPC ---------------------------------------------------------

namespace detail {

/// The device whose simulated memory the memfd `fd` holds (from its name), or -1 when it is not
/// one: "/memfd:<prefix><device> (deleted)".
inline int sim_memfd_device(int fd, char const* prefix)
{
  char link[64];
  std::snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
  char target[256];
  ssize_t const n = ::readlink(link, target, sizeof target - 1);
  if (n <= 0) { return -1; }
  target[n]               = '\0';
  std::string const want  = std::string{"/memfd:"} + prefix;
  std::string const found = target;
  if (found.compare(0, want.size(), want) != 0) { return -1; }
  char const* digits = target + want.size();
  if (*digits < '0' || *digits > '9') { return -1; }
  return std::atoi(digits);
}

}  // namespace detail

inline cudaError_t sim_runtime::vm_export_shareable(int& fd, physical_handle h)
{
  if (auto e = enter(sim_op::vm_export_shareable); e != cudaSuccess) { return e; }
  std::lock_guard<std::mutex> lock{mem_mutex_};
  auto ph = physicals_.find(h);
  if (ph == physicals_.end() || ph->second.released) {
    return misuse(cudaErrorInvalidValue, "vm_export_shareable(handle " + std::to_string(h) +
                                           "): unknown or released physical handle");
  }
  if (!ph->second.shareable) {
    return misuse(cudaErrorInvalidValue,
                  "vm_export_shareable(handle " + std::to_string(h) +
                    "): the handle was not created shareable (vm_create(..., shareable = true))");
  }
  int const dup = ::fcntl(ph->second.fd, F_DUPFD_CLOEXEC, 0);
  if (dup < 0) { return cudaErrorMemoryAllocation; }  // out of descriptors
  fd = dup;
  return cudaSuccess;
}

inline cudaError_t sim_runtime::vm_import_shareable(physical_handle& h, int fd)
{
  if (auto e = enter(sim_op::vm_import_shareable); e != cudaSuccess) { return e; }
  auto const args  = "vm_import_shareable(fd " + std::to_string(fd) + ")";
  int const device = fd < 0 ? -1 : detail::sim_memfd_device(fd, detail::sim_physical_name);
  struct stat st {};
  if (device < 0 || ::fstat(fd, &st) != 0) {
    return misuse(cudaErrorInvalidValue,
                  args + ": not a descriptor of simulated device memory (vm_export_shareable)");
  }
  if (!valid_device(device)) { return bad_device("vm_import_shareable", device); }
  auto const bytes = static_cast<std::size_t>(st.st_size);
  if (bytes == 0 || bytes % config_.vm_granularity != 0) {
    return misuse(cudaErrorInvalidValue, args + ": " + std::to_string(bytes) +
                                           " bytes, not a multiple of this GPU's granularity " +
                                           std::to_string(config_.vm_granularity));
  }
  int const own = ::fcntl(fd, F_DUPFD_CLOEXEC, 0);
  if (own < 0) { return cudaErrorMemoryAllocation; }
  auto const id = detail::sim_next_id();
  {
    std::lock_guard<std::mutex> lock{mem_mutex_};
    physicals_[id] = detail::sim_physical{own, bytes, device, false, 0, true, true};
  }
  h = id;
  return cudaSuccess;
}

inline cudaError_t sim_runtime::ipc_get_mem_handle(ipc_mem_handle& h, void* p)
{
  if (auto e = enter(sim_op::ipc_get_mem_handle); e != cudaSuccess) { return e; }
  auto const args = "ipc_get_mem_handle(" + detail::sim_hex(p) + ")";
  auto const a    = reinterpret_cast<std::uintptr_t>(p);
  auto find       = [&]() -> std::map<std::uintptr_t, detail::sim_allocation>::iterator {
    auto it = allocations_.upper_bound(a);
    if (it == allocations_.begin()) { return allocations_.end(); }
    --it;
    return a < it->first + it->second.mapped_bytes ? it : allocations_.end();
  };
  auto handle = [&](detail::sim_allocation const& al) {
    detail::sim_ipc_payload pl{};
    std::memcpy(pl.magic, detail::sim_ipc_magic, sizeof pl.magic);
    pl.pid          = static_cast<std::int64_t>(::getpid());
    pl.fd           = al.ipc_fd;
    pl.bytes        = al.bytes;
    pl.mapped_bytes = al.mapped_bytes;
    pl.device       = al.device;
    h               = ipc_mem_handle{};
    std::memcpy(&h, &pl, sizeof pl);
    return cudaSuccess;
  };
  int device = 0;
  {
    std::lock_guard<std::mutex> lock{mem_mutex_};
    auto it = find();
    if (it == allocations_.end()) {
      return misuse(cudaErrorInvalidValue, args + ": not memory of a malloc allocation");
    }
    auto const& al = it->second;
    if (al.pending_free) {
      return misuse(cudaErrorInvalidValue, args + ": the allocation was freed with free_async");
    }
    if (al.async) {
      return misuse(cudaErrorInvalidValue,
                    args +
                      ": memory from malloc_async (the default stream-ordered pool) cannot "
                      "be exported with ipc_get_mem_handle; use malloc, or shareable "
                      "virtual memory (vm_create(..., shareable = true))");
    }
    if (al.imported) {
      return misuse(cudaErrorInvalidValue,
                    args + ": memory opened with ipc_open_mem_handle cannot be exported again");
    }
    if (al.ipc_fd >= 0) { return handle(al); }  // exported before
    device = al.device;
  }
  // First export: the work queued on the memory must not run while its pages move.
  wait_all_devices();
  std::lock_guard<std::mutex> lock{mem_mutex_};
  auto it = find();
  if (it == allocations_.end() || it->second.pending_free) {
    return misuse(cudaErrorInvalidValue, args + ": the allocation was freed during the export");
  }
  auto& al = it->second;
  if (al.ipc_fd < 0) {
    // Move the bytes into a memfd and map it over the same addresses (MAP_FIXED replaces the
    // private mapping at once): pointers stay valid, and another process can map the memfd.
    std::string const name = detail::sim_ipc_name + std::to_string(device);
    int const fd           = ::memfd_create(name.c_str(), MFD_CLOEXEC);
    if (fd < 0) { return cudaErrorMemoryAllocation; }
    if (::ftruncate(fd, static_cast<off_t>(al.mapped_bytes)) != 0) {
      ::close(fd);
      return cudaErrorMemoryAllocation;
    }
    auto const* base               = reinterpret_cast<char const*>(it->first);
    constexpr std::size_t piece    = std::size_t{64} << 10;
    static char const zeros[piece] = {};
    for (std::size_t off = 0; off < al.mapped_bytes; off += piece) {  // pages never written: holes
      std::size_t const n = std::min(piece, al.mapped_bytes - off);
      if (std::memcmp(base + off, zeros, n) == 0) { continue; }
      if (::pwrite(fd, base + off, n, static_cast<off_t>(off)) != static_cast<ssize_t>(n)) {
        ::close(fd);
        return cudaErrorMemoryAllocation;
      }
    }
    void* got = ::mmap(reinterpret_cast<void*>(it->first), al.mapped_bytes, PROT_READ | PROT_WRITE,
                       MAP_SHARED | MAP_FIXED, fd, 0);
    if (got == MAP_FAILED) {
      ::close(fd);
      return cudaErrorMemoryAllocation;
    }
    al.ipc_fd = fd;
  }
  return handle(al);
}

inline cudaError_t sim_runtime::ipc_open_mem_handle(void** p, ipc_mem_handle h)
{
  if (auto e = enter(sim_op::ipc_open_mem_handle); e != cudaSuccess) { return e; }
  if (p == nullptr) {
    return misuse(cudaErrorInvalidValue, "ipc_open_mem_handle: the output pointer is null");
  }
  detail::sim_ipc_payload pl{};
  std::memcpy(&pl, &h, sizeof pl);
  if (std::memcmp(pl.magic, detail::sim_ipc_magic, sizeof pl.magic) != 0) {
    return misuse(cudaErrorInvalidValue,
                  "ipc_open_mem_handle: not a handle from ipc_get_mem_handle of a simulated GPU");
  }
  std::string const key = std::to_string(pl.pid) + ":" + std::to_string(pl.fd);
  auto const args =
    "ipc_open_mem_handle(process " + std::to_string(pl.pid) + ", fd " + std::to_string(pl.fd) + ")";
  if (pl.pid == static_cast<std::int64_t>(::getpid())) {
    return misuse(cudaErrorInvalidResourceHandle,
                  args +
                    ": the handle was exported by this process; CUDA opens IPC handles only "
                    "in other processes");
  }
  if (pl.device < 0 || pl.device >= static_cast<std::int64_t>(devices_.size())) {
    return bad_device("ipc_open_mem_handle", static_cast<int>(pl.device));
  }
  {
    std::lock_guard<std::mutex> lock{mem_mutex_};
    for (auto& [base, al] : allocations_) {
      if (al.imported && al.ipc_key == key) {
        ++al.ipc_refs;
        *p = reinterpret_cast<void*>(base);
        return cudaSuccess;
      }
    }
  }
  std::string const path = "/proc/" + std::to_string(pl.pid) + "/fd/" + std::to_string(pl.fd);
  int const fd           = ::open(path.c_str(), O_RDWR | O_CLOEXEC);
  struct stat st {};
  if (fd < 0 || ::fstat(fd, &st) != 0 || static_cast<std::uint64_t>(st.st_size) < pl.mapped_bytes ||
      detail::sim_memfd_device(fd, detail::sim_ipc_name) != pl.device) {
    if (fd >= 0) { ::close(fd); }
    return misuse(cudaErrorInvalidValue,
                  args + ": the exported memory cannot be opened through " + path +
                    " (the exporting process exited, or freed the allocation)");
  }
  void* m = ::mmap(nullptr, pl.mapped_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  ::close(fd);
  if (m == MAP_FAILED) { return cudaErrorMemoryAllocation; }
  detail::sim_allocation al;
  al.bytes        = pl.bytes;
  al.mapped_bytes = pl.mapped_bytes;
  al.device       = static_cast<int>(pl.device);
  al.imported     = true;
  al.ipc_refs     = 1;
  al.ipc_key      = key;
  {
    std::lock_guard<std::mutex> lock{mem_mutex_};
    allocations_[reinterpret_cast<std::uintptr_t>(m)] = std::move(al);
  }
  *p = m;
  return cudaSuccess;
}

inline cudaError_t sim_runtime::ipc_close_mem_handle(void* p)
{
  if (auto e = enter(sim_op::ipc_close_mem_handle); e != cudaSuccess) { return e; }
  auto const base = reinterpret_cast<std::uintptr_t>(p);
  detail::sim_allocation al;
  {
    std::lock_guard<std::mutex> lock{mem_mutex_};
    auto it = allocations_.find(base);
    if (it == allocations_.end() || !it->second.imported) {
      return misuse(cudaErrorInvalidValue, "ipc_close_mem_handle(" + detail::sim_hex(p) +
                                             "): not memory from ipc_open_mem_handle");
    }
    if (--it->second.ipc_refs != 0) { return cudaSuccess; }
    al = it->second;
    allocations_.erase(it);
  }
  wait_device(al.device);  // queued copies may still use the mapping
  ::munmap(p, al.mapped_bytes);
  return cudaSuccess;
}

// ---- streams ------------------------------------------------------------------------------------

inline cudaError_t sim_runtime::stream_create(stream_type& s)
{
  if (auto e = enter(sim_op::stream_create); e != cudaSuccess) { return e; }
  auto const id = detail::sim_next_id();
  auto stream   = std::make_shared<detail::sim_stream>(id, current_device());
  stream->start();
  {
    std::unique_lock<std::shared_mutex> lock{handles_mutex_};
    streams_.emplace(id, std::move(stream));
  }
  reap_streams();
  s = reinterpret_cast<stream_type>(static_cast<std::uintptr_t>(id));
  return cudaSuccess;
}

inline cudaError_t sim_runtime::stream_destroy(stream_type s)
{
  if (auto e = enter(sim_op::stream_destroy); e != cudaSuccess) { return e; }
  if (s == nullptr) {
    return misuse(cudaErrorInvalidResourceHandle,
                  "stream_destroy(null stream): the default stream cannot be destroyed");
  }
  auto const id = reinterpret_cast<std::uintptr_t>(s);
  std::shared_ptr<detail::sim_stream> stream;
  {
    std::unique_lock<std::shared_mutex> lock{handles_mutex_};
    auto it = streams_.find(id);
    if (it != streams_.end()) {
      stream = std::move(it->second);
      streams_.erase(it);
      // Moved to draining_ under the same lock, so wait_device never misses its queued work.
      std::lock_guard<std::mutex> drain_lock{draining_mutex_};
      draining_.push_back(stream);
    }
  }
  if (!stream) {
    return misuse(cudaErrorInvalidResourceHandle,
                  "stream_destroy(stream " + detail::sim_hex(id) +
                    "): not a live stream of this simulated GPU (already destroyed, or never "
                    "created by it)");
  }
  stream->stop();
  reap_streams();
  return cudaSuccess;
}

inline cudaError_t sim_runtime::stream_synchronize(stream_type s)
{
  synchronizations_.fetch_add(1, std::memory_order_relaxed);
  if (auto e = enter(sim_op::stream_synchronize); e != cudaSuccess) { return e; }
  cudaError_t err = cudaSuccess;
  auto stream     = find_stream(s, "stream_synchronize", err);
  if (!stream) { return err; }
  stream->wait_for(stream->mark());
  return cudaSuccess;
}

inline cudaError_t sim_runtime::stream_query(stream_type s)
{
  if (auto e = enter(sim_op::stream_query); e != cudaSuccess) { return e; }
  cudaError_t err = cudaSuccess;
  auto stream     = find_stream(s, "stream_query", err);
  if (!stream) { return err; }
  return stream->idle() ? cudaSuccess : cudaErrorNotReady;
}

inline cudaError_t sim_runtime::stream_wait_event(stream_type s, event_type e)
{
  if (auto f = enter(sim_op::stream_wait_event); f != cudaSuccess) { return f; }
  cudaError_t err = cudaSuccess;
  auto stream     = find_stream(s, "stream_wait_event", err);
  if (!stream) { return err; }
  auto event = find_event(e, "stream_wait_event", err);
  if (!event) { return err; }
  auto capture = event->current();
  if (!capture || capture->is_done()) { return cudaSuccess; }
  return enqueue(
    *stream, [capture] { capture->wait(); }, "stream_wait_event");
}

inline cudaError_t sim_runtime::stream_get_device(stream_type s, int& device)
{
  if (auto e = enter(sim_op::stream_get_device); e != cudaSuccess) { return e; }
  cudaError_t err = cudaSuccess;
  auto stream     = find_stream(s, "stream_get_device", err);
  if (!stream) { return err; }
  device = stream->device;
  return cudaSuccess;
}

// ---- events -------------------------------------------------------------------------------------

inline cudaError_t sim_runtime::event_create(event_type& e, bool timing)
{
  if (auto f = enter(sim_op::event_create); f != cudaSuccess) { return f; }
  auto const id = detail::sim_next_id();
  auto event    = std::make_shared<detail::sim_event>(id, timing, current_device());
  {
    std::unique_lock<std::shared_mutex> lock{handles_mutex_};
    events_.emplace(id, std::move(event));
  }
  e = reinterpret_cast<event_type>(static_cast<std::uintptr_t>(id));
  return cudaSuccess;
}

inline cudaError_t sim_runtime::event_destroy(event_type e)
{
  if (auto f = enter(sim_op::event_destroy); f != cudaSuccess) { return f; }
  auto const id      = reinterpret_cast<std::uintptr_t>(e);
  std::size_t erased = 0;
  {
    std::unique_lock<std::shared_mutex> lock{handles_mutex_};
    erased = events_.erase(id);
  }
  if (erased == 0) {
    return misuse(cudaErrorInvalidResourceHandle,
                  "event_destroy(event " + detail::sim_hex(id) +
                    "): not a live event of this simulated GPU (already destroyed, or never "
                    "created by it)");
  }
  return cudaSuccess;
}

inline cudaError_t sim_runtime::event_record(event_type e, stream_type s)
{
  if (auto f = enter(sim_op::event_record); f != cudaSuccess) { return f; }
  cudaError_t err = cudaSuccess;
  auto event      = find_event(e, "event_record", err);
  if (!event) { return err; }
  auto stream = find_stream(s, "event_record", err);
  if (!stream) { return err; }
  if (stream->device != event->device) {
    return misuse(cudaErrorInvalidResourceHandle,
                  "event_record(event " + detail::sim_hex(e) + ", stream " + detail::sim_hex(s) +
                    "): the event belongs to device " + std::to_string(event->device) +
                    " and the stream to device " + std::to_string(stream->device) +
                    " (create the event with the stream's device current)");
  }
  auto capture = std::make_shared<detail::sim_capture>(event->timing);
  if (stream->caught_up()) {
    capture->complete();  // nothing to wait for: complete now, as an idle GPU would almost at once
  } else if (auto f = enqueue(
               *stream, [capture] { capture->complete(); }, "event_record");
             f != cudaSuccess) {
    return f;
  }
  event->set(std::move(capture));
  return cudaSuccess;
}

inline cudaError_t sim_runtime::event_query(event_type e)
{
  if (auto f = enter(sim_op::event_query); f != cudaSuccess) { return f; }
  if (e != nullptr) {
    // The hot path: no reference counting, one shared lock and the event's own mutex.
    std::shared_lock<std::shared_mutex> lock{handles_mutex_};
    if (auto it = events_.find(reinterpret_cast<std::uintptr_t>(e)); it != events_.end()) {
      return it->second->completed() ? cudaSuccess : cudaErrorNotReady;
    }
  }
  cudaError_t err = cudaSuccess;
  (void)find_event(e, "event_query", err);  // records the misuse
  return err;
}

inline cudaError_t sim_runtime::event_synchronize(event_type e)
{
  synchronizations_.fetch_add(1, std::memory_order_relaxed);
  if (auto f = enter(sim_op::event_synchronize); f != cudaSuccess) { return f; }
  cudaError_t err = cudaSuccess;
  auto event      = find_event(e, "event_synchronize", err);
  if (!event) { return err; }
  if (auto capture = event->current()) { capture->wait(); }
  return cudaSuccess;
}

inline cudaError_t sim_runtime::event_elapsed_time(float& ms, event_type start, event_type stop)
{
  if (auto f = enter(sim_op::event_elapsed_time); f != cudaSuccess) { return f; }
  cudaError_t err = cudaSuccess;
  auto a          = find_event(start, "event_elapsed_time", err);
  if (!a) { return err; }
  auto b = find_event(stop, "event_elapsed_time", err);
  if (!b) { return err; }
  auto const args =
    "event_elapsed_time(" + detail::sim_hex(start) + ", " + detail::sim_hex(stop) + ")";
  if (!a->timing || !b->timing) {
    return misuse(cudaErrorInvalidResourceHandle,
                  args + ": both events must be created with timing = true");
  }
  if (a->device != b->device) {
    return misuse(cudaErrorInvalidResourceHandle, args + ": the events belong to devices " +
                                                    std::to_string(a->device) + " and " +
                                                    std::to_string(b->device));
  }
  auto ca = a->current();
  auto cb = b->current();
  if (!ca || !cb) {
    return misuse(cudaErrorInvalidResourceHandle, args + ": an event was never recorded");
  }
  if (!ca->is_done() || !cb->is_done()) { return cudaErrorNotReady; }
  ms = std::chrono::duration<float, std::milli>(cb->when - ca->when).count();
  return cudaSuccess;
}

// ---- copies and host functions ------------------------------------------------------------------

inline sim_runtime::placement sim_runtime::place(void const* p, std::size_t bytes) const
{
  placement out;
  auto const a = reinterpret_cast<std::uintptr_t>(p);
  if (bytes > std::numeric_limits<std::uintptr_t>::max() - a) {
    out.kind = placement::where::invalid;
    out.why  = "the range wraps around the address space";
    return out;
  }
  auto const end = a + bytes;
  if (auto it = allocations_.upper_bound(a); it != allocations_.begin()) {
    --it;
    auto const& al = it->second;
    if (a < it->first + al.mapped_bytes) {
      out.device = al.device;
      if (al.pending_free) {
        out.kind = placement::where::invalid;
        out.why  = "the allocation at " + detail::sim_hex(it->first) + " was freed with free_async";
      } else if (end > it->first + al.bytes) {
        out.kind = placement::where::invalid;
        out.why  = std::to_string(bytes) + " bytes from here run " +
                  std::to_string(end - (it->first + al.bytes)) +
                  " bytes past the end of the allocation at " + detail::sim_hex(it->first) +
                  " of " + std::to_string(al.bytes) + " bytes";
      } else {
        out.kind = placement::where::device;
      }
      return out;
    }
  }
  if (auto r = reservations_.upper_bound(a); r != reservations_.begin()) {
    --r;
    if (a < r->first + r->second.bytes) {
      out.kind = placement::where::invalid;
      if (end > r->first + r->second.bytes) {
        out.why = "the range runs past the end of the reservation at " + detail::sim_hex(r->first);
        return out;
      }
      auto m = mappings_.upper_bound(a);
      if (m == mappings_.begin()) {
        out.why = "virtual memory not mapped at " + detail::sim_hex(a);
        return out;
      }
      --m;
      out.device            = m->second.device;
      std::uintptr_t cursor = a;
      while (cursor < end) {
        if (m == mappings_.end() || m->first > cursor || m->first + m->second.bytes <= cursor) {
          out.why = "virtual memory not mapped at " + detail::sim_hex(cursor);
          return out;
        }
        if (m->second.access_mask == 0) {
          out.why = "virtual memory at " + detail::sim_hex(cursor) +
                    " is mapped but not accessible (vm_set_access was not called)";
          return out;
        }
        cursor = m->first + m->second.bytes;
        ++m;
      }
      out.kind = placement::where::device;
      return out;
    }
  }
  out.kind = placement::where::host;
  return out;
}

inline cudaError_t sim_runtime::check_side(char const* call, std::string const& args,
                                           char const* side, void const* p, std::size_t bytes,
                                           bool want_device, int want_device_id)
{
  auto const fail = [&](std::string const& why) {
    return misuse(cudaErrorInvalidValue, std::string{call} + "(" + args + "): " + side + " " +
                                           detail::sim_hex(p) + ": " + why);
  };
  if (p == nullptr) { return fail("null pointer"); }
  placement pl;
  {
    std::lock_guard<std::mutex> lock{mem_mutex_};
    pl = place(p, bytes);
  }
  if (pl.kind == placement::where::invalid) { return fail(pl.why); }
  if (want_device && pl.kind != placement::where::device) {
    return fail("not device memory of this simulated GPU (host memory, never allocated, or freed)");
  }
  if (!want_device && pl.kind != placement::where::host) {
    return fail("is device memory (on device " + std::to_string(pl.device) +
                "), but the copy kind says host memory");
  }
  if (want_device && want_device_id >= 0 && pl.device != want_device_id) {
    return fail("is memory of device " + std::to_string(pl.device) + ", not of device " +
                std::to_string(want_device_id));
  }
  return cudaSuccess;
}

inline cudaError_t sim_runtime::memcpy_async(void* dst, void const* src, std::size_t bytes,
                                             memcpy_kind kind, stream_type s)
{
  if (auto e = enter(sim_op::memcpy_async); e != cudaSuccess) { return e; }
  cudaError_t err = cudaSuccess;
  auto stream     = find_stream(s, "memcpy_async", err);
  if (!stream) { return err; }
  auto const args = "dst " + detail::sim_hex(dst) + ", src " + detail::sim_hex(src) + ", " +
                    std::to_string(bytes) + ", kind " + std::to_string(static_cast<int>(kind));
  bool dst_device = false;
  bool src_device = false;
  switch (kind) {
    case memcpy_kind::host_to_host: break;
    case memcpy_kind::host_to_device: dst_device = true; break;
    case memcpy_kind::device_to_host: src_device = true; break;
    case memcpy_kind::device_to_device: dst_device = src_device = true; break;
    case memcpy_kind::infer: break;
    default:
      return misuse(cudaErrorInvalidMemcpyDirection,
                    "memcpy_async(" + args + "): unknown memcpy_kind");
  }
  if (bytes == 0) { return cudaSuccess; }
  if (kind == memcpy_kind::infer) {
    // Either side may be anything valid: only invalid placements (bad ranges) are refused.
    for (auto [side, p] : {std::pair<char const*, void const*>{"dst", dst}, {"src", src}}) {
      if (p == nullptr) {
        return misuse(cudaErrorInvalidValue, "memcpy_async(" + args + "): " + side + " is null");
      }
      placement pl;
      {
        std::lock_guard<std::mutex> lock{mem_mutex_};
        pl = place(p, bytes);
      }
      if (pl.kind == placement::where::invalid) {
        return misuse(cudaErrorInvalidValue, "memcpy_async(" + args + "): " + side + " " +
                                               detail::sim_hex(p) + ": " + pl.why);
      }
    }
  } else {
    if (auto e = check_side("memcpy_async", args, "dst", dst, bytes, dst_device, -1);
        e != cudaSuccess) {
      return e;
    }
    if (auto e = check_side("memcpy_async", args, "src", src, bytes, src_device, -1);
        e != cudaSuccess) {
      return e;
    }
  }
  return enqueue(
    *stream, [dst, src, bytes] { std::memmove(dst, src, bytes); }, "memcpy_async");
}

inline cudaError_t sim_runtime::memcpy_peer_async(void* dst, int dst_device, void const* src,
                                                  int src_device, std::size_t bytes, stream_type s)
{
  if (auto e = enter(sim_op::memcpy_peer_async); e != cudaSuccess) { return e; }
  cudaError_t err = cudaSuccess;
  auto stream     = find_stream(s, "memcpy_peer_async", err);
  if (!stream) { return err; }
  if (!valid_device(dst_device)) { return bad_device("memcpy_peer_async", dst_device); }
  if (!valid_device(src_device)) { return bad_device("memcpy_peer_async", src_device); }
  if (bytes == 0) { return cudaSuccess; }
  auto const args = "dst " + detail::sim_hex(dst) + " on device " + std::to_string(dst_device) +
                    ", src " + detail::sim_hex(src) + " on device " + std::to_string(src_device) +
                    ", " + std::to_string(bytes);
  if (auto e = check_side("memcpy_peer_async", args, "dst", dst, bytes, true, dst_device);
      e != cudaSuccess) {
    return e;
  }
  if (auto e = check_side("memcpy_peer_async", args, "src", src, bytes, true, src_device);
      e != cudaSuccess) {
    return e;
  }
  if (src_device != dst_device && !peer_access_enabled(src_device, dst_device) &&
      !peer_access_enabled(dst_device, src_device)) {
    staged_peer_copies_.fetch_add(1, std::memory_order_relaxed);
  }
  return enqueue(
    *stream, [dst, src, bytes] { std::memmove(dst, src, bytes); }, "memcpy_peer_async");
}

inline cudaError_t sim_runtime::memset_async(void* dst, int value, std::size_t bytes, stream_type s)
{
  if (auto e = enter(sim_op::memset_async); e != cudaSuccess) { return e; }
  cudaError_t err = cudaSuccess;
  auto stream     = find_stream(s, "memset_async", err);
  if (!stream) { return err; }
  if (bytes == 0) { return cudaSuccess; }
  auto const args = "dst " + detail::sim_hex(dst) + ", value " + std::to_string(value) + ", " +
                    std::to_string(bytes);
  if (auto e = check_side("memset_async", args, "dst", dst, bytes, true, -1); e != cudaSuccess) {
    return e;
  }
  return enqueue(
    *stream, [dst, value, bytes] { std::memset(dst, value, bytes); }, "memset_async");
}

inline cudaError_t sim_runtime::launch_host_func(stream_type s, host_fn fn, void* user)
{
  if (auto e = enter(sim_op::launch_host_func); e != cudaSuccess) { return e; }
  cudaError_t err = cudaSuccess;
  auto stream     = find_stream(s, "launch_host_func", err);
  if (!stream) { return err; }
  if (fn == nullptr) {
    return misuse(cudaErrorInvalidValue,
                  "launch_host_func(fn null, user " + detail::sim_hex(user) + "): null function");
  }
  return enqueue(
    *stream, [fn, user] { fn(user); }, "launch_host_func");
}

// ---- simulation controls ------------------------------------------------------------------------

inline cudaError_t sim_runtime::set_capacity(int device, std::size_t bytes)
{
  if (!valid_device(device)) { return bad_device("set_capacity", device); }
  devices_[static_cast<std::size_t>(device)]->capacity.store(bytes, std::memory_order_relaxed);
  return cudaSuccess;
}

inline std::size_t sim_runtime::capacity(int device) const noexcept
{
  if (!valid_device(device)) { return 0; }
  return devices_[static_cast<std::size_t>(device)]->capacity.load(std::memory_order_relaxed);
}

inline std::size_t sim_runtime::used_bytes(int device) const noexcept
{
  if (!valid_device(device)) { return 0; }
  return devices_[static_cast<std::size_t>(device)]->used.load(std::memory_order_relaxed);
}

inline bool sim_runtime::host_pinned_for(void const* p, std::size_t bytes, int device) const
{
  if (p == nullptr || !valid_device(device)) { return false; }
  auto const a = reinterpret_cast<std::uintptr_t>(p);
  if (bytes > std::numeric_limits<std::uintptr_t>::max() - a) { return false; }
  std::lock_guard<std::mutex> lock{mem_mutex_};
  for (auto const* ranges : {&host_allocs_, &host_registered_}) {
    auto it = ranges->upper_bound(a);
    if (it == ranges->begin()) { continue; }
    --it;
    if (a + bytes > it->first + it->second) { continue; }
    auto const pin = pinned_for_.find(it->first);
    return pin != pinned_for_.end() && ((pin->second >> device) & 1) != 0;
  }
  return false;
}

inline bool sim_runtime::peer_access_enabled(int device, int peer) const noexcept
{
  if (!valid_device(device) || !valid_device(peer)) { return false; }
  return ((peer_enabled_[static_cast<std::size_t>(device)].load() >> peer) & 1) != 0;
}

inline std::uint64_t sim_runtime::staged_peer_copies() const noexcept
{
  return staged_peer_copies_.load(std::memory_order_relaxed);
}

inline void sim_runtime::inject_fault(sim_op op, std::uint64_t nth, cudaError_t error)
{
  GPUKIT_EXPECTS(
    op >= sim_op::device_count && op < sim_op::count_,
    "inject_fault: op " + std::to_string(static_cast<int>(op)) + " is not a runtime call");
  GPUKIT_EXPECTS(
    nth >= 1, std::string{"inject_fault("} + to_string(op) + ", 0, ...): nth counts calls from 1");
  GPUKIT_EXPECTS(error != cudaSuccess,
                 std::string{"inject_fault("} + to_string(op) + ", ...): the error is cudaSuccess");
  std::lock_guard<std::mutex> lock{faults_mutex_};
  faults_.push_back(pending_fault{op, nth, error});
  faults_pending_.store(faults_.size(), std::memory_order_release);
}

inline void sim_runtime::clear_faults()
{
  std::lock_guard<std::mutex> lock{faults_mutex_};
  faults_.clear();
  faults_pending_.store(0, std::memory_order_release);
}

inline std::size_t sim_runtime::pending_faults() const
{
  std::lock_guard<std::mutex> lock{faults_mutex_};
  return faults_.size();
}

inline cudaError_t sim_runtime::stall(stream_type s)
{
  cudaError_t err = cudaSuccess;
  auto stream     = find_stream(s, "stall", err);
  if (!stream) { return err; }
  stream->set_stalled(true);
  return cudaSuccess;
}

inline cudaError_t sim_runtime::release(stream_type s)
{
  cudaError_t err = cudaSuccess;
  auto stream     = find_stream(s, "release", err);
  if (!stream) { return err; }
  stream->set_stalled(false);
  return cudaSuccess;
}

inline std::uint64_t sim_runtime::calls(sim_op op) const noexcept
{
  if (op < sim_op::device_count || op >= sim_op::count_) { return 0; }
  return calls_[static_cast<std::size_t>(op)].load(std::memory_order_relaxed);
}

inline std::uint64_t sim_runtime::total_calls() const noexcept
{
  std::uint64_t sum = 0;
  for (auto const& c : calls_) { sum += c.load(std::memory_order_relaxed); }
  return sum;
}

inline std::uint64_t sim_runtime::synchronizations() const noexcept
{
  return synchronizations_.load(std::memory_order_relaxed);
}

inline void sim_runtime::reset_counters() noexcept
{
  for (auto& c : calls_) { c.store(0, std::memory_order_relaxed); }
  synchronizations_.store(0, std::memory_order_relaxed);
}

inline std::string sim_runtime::last_misuse() const
{
  std::lock_guard<std::mutex> lock{misuse_mutex_};
  return last_misuse_;
}

inline std::uint64_t sim_runtime::misuse_count() const noexcept
{
  return misuse_count_.load(std::memory_order_relaxed);
}

// --- Graph capture (simulated) -------------------------------------------------------------------

inline cudaError_t sim_runtime::stream_is_capturing(stream_type s, bool& is_capturing)
{
  is_capturing = false;
  if (auto e = enter(sim_op::stream_is_capturing); e != cudaSuccess) { return e; }
  cudaError_t err = cudaSuccess;
  auto stream     = find_stream(s, "stream_is_capturing", err);
  if (!stream) { return err; }
  is_capturing = capturing(stream->id);
  return cudaSuccess;
}

inline cudaError_t sim_runtime::exchange_capture_mode(int& mode)
{
  if (auto e = enter(sim_op::exchange_capture_mode); e != cudaSuccess) { return e; }
  std::swap(mode, detail::sim_capture_mode());
  return cudaSuccess;
}

inline cudaError_t sim_runtime::begin_capture(stream_type s)
{
  cudaError_t err = cudaSuccess;
  auto stream     = find_stream(s, "begin_capture", err);
  if (!stream) { return err; }
  std::lock_guard<std::mutex> lock{capture_mutex_};
  if (std::find(capturing_.begin(), capturing_.end(), stream->id) != capturing_.end()) {
    return misuse(cudaErrorInvalidValue, "begin_capture: the stream is already capturing");
  }
  capturing_.push_back(stream->id);
  captures_underway_.fetch_add(1, std::memory_order_acq_rel);
  return cudaSuccess;
}

inline cudaError_t sim_runtime::end_capture(stream_type s)
{
  cudaError_t err = cudaSuccess;
  auto stream     = find_stream(s, "end_capture", err);
  if (!stream) { return err; }
  std::lock_guard<std::mutex> lock{capture_mutex_};
  auto it = std::find(capturing_.begin(), capturing_.end(), stream->id);
  if (it == capturing_.end()) {
    return misuse(cudaErrorInvalidValue, "end_capture: the stream is not capturing");
  }
  capturing_.erase(it);
  captures_underway_.fetch_sub(1, std::memory_order_acq_rel);
  return cudaSuccess;
}

}  // namespace gpukit
