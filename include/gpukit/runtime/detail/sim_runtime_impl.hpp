// SPDX-License-Identifier: Apache-2.0
// gpukit/runtime/detail/sim_runtime_impl.hpp: the bodies of gpukit::sim_runtime. Not public API;
// included by gpukit/runtime/sim_runtime.hpp, or in compiled mode by src/sim_runtime.cpp alone
// (GPUKIT_DETAIL_COMPILED_INLINE, gpukit/detail/compiled_mode.hpp).
//
// Locking (kept simple on purpose):
// - handles_mutex_ (shared): the live stream and event tables; lookups take it shared.
// - mem_mutex_: every memory table (allocations, pinned ranges, reservations, mappings, physical
//   handles). Held across the few syscalls of virtual-memory calls; malloc/free run mmap/munmap
//   outside it.
// - each stream, event and capture has its own mutex; queries are atomic loads.
// - capture_mutex_: the graph captures under way and the events recorded in them.
// - capture_mutex_, misuse_mutex_ and faults_mutex_ are annotated (GPUKIT_GUARDED_BY,
//   GPUKIT_REQUIRES), which clang's -Wthread-safety checks; the others keep to these comments.
// Nesting, always in this order: handles_mutex_ -> draining_mutex_; mem_mutex_ -> misuse_mutex_
// (a misuse found under the memory lock); capture_mutex_ -> misuse_mutex_. Blocking waits hold no
// runtime lock; a stream's worker takes mem_mutex_ (finishing free_async) while holding nothing
// else.
#pragma once

#include <gpukit/detail/compiled_mode.hpp>
#include <gpukit/error_macros.hpp>

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

// ---- sim_op -------------------------------------------------------------------------------------

GPUKIT_DETAIL_COMPILED_INLINE char const* to_string(sim_op op) noexcept
{
  switch (op) {
#define GPUKIT_DETAIL_SIM_OP_NAME(name, params, doc) \
  case sim_op::name: return #name;
    GPUKIT_RUNTIME_OPS(GPUKIT_DETAIL_SIM_OP_NAME)
#undef GPUKIT_DETAIL_SIM_OP_NAME
    case sim_op::count_: break;
  }
  return "unknown";
}

// ---- sim_config
// -----------------------------------------------------------------------------------

GPUKIT_DETAIL_COMPILED_INLINE sim_config& sim_config::with_devices(int count,
                                                                   std::size_t capacity_bytes) &
{
  GPUKIT_EXPECTS(
    count >= 1 && count <= 64,
    "sim_config::with_devices: count must be in [1, 64], got " + std::to_string(count));
  device_capacities.assign(static_cast<std::size_t>(count), capacity_bytes);
  return *this;
}
GPUKIT_DETAIL_COMPILED_INLINE sim_config&& sim_config::with_devices(int count,
                                                                    std::size_t capacity_bytes) &&
{
  return std::move(with_devices(count, capacity_bytes));
}
GPUKIT_DETAIL_COMPILED_INLINE sim_config& sim_config::with_vm_granularity(std::size_t bytes) &
{
  vm_granularity = bytes;
  return *this;
}
GPUKIT_DETAIL_COMPILED_INLINE sim_config&& sim_config::with_vm_granularity(std::size_t bytes) &&
{
  return std::move(with_vm_granularity(bytes));
}
GPUKIT_DETAIL_COMPILED_INLINE sim_config& sim_config::with_device_name(std::string name) &
{
  device_name = std::move(name);
  return *this;
}
GPUKIT_DETAIL_COMPILED_INLINE sim_config&& sim_config::with_device_name(std::string name) &&
{
  return std::move(with_device_name(std::move(name)));
}
GPUKIT_DETAIL_COMPILED_INLINE sim_config& sim_config::with_misuse_log(bool on) &
{
  log_misuse = on;
  return *this;
}
GPUKIT_DETAIL_COMPILED_INLINE sim_config&& sim_config::with_misuse_log(bool on) &&
{
  return std::move(with_misuse_log(on));
}
GPUKIT_DETAIL_COMPILED_INLINE sim_config& sim_config::with_ecc(bool on) &
{
  ecc_enabled = on;
  return *this;
}
GPUKIT_DETAIL_COMPILED_INLINE sim_config&& sim_config::with_ecc(bool on) &&
{
  return std::move(with_ecc(on));
}
GPUKIT_DETAIL_COMPILED_INLINE sim_config& sim_config::with_peer_access(bool on) &
{
  peer_access = on;
  return *this;
}
GPUKIT_DETAIL_COMPILED_INLINE sim_config&& sim_config::with_peer_access(bool on) &&
{
  return std::move(with_peer_access(on));
}
GPUKIT_DETAIL_COMPILED_INLINE sim_config& sim_config::with_virtual_memory(bool on) &
{
  virtual_memory = on;
  return *this;
}
GPUKIT_DETAIL_COMPILED_INLINE sim_config&& sim_config::with_virtual_memory(bool on) &&
{
  return std::move(with_virtual_memory(on));
}

namespace detail {

GPUKIT_DETAIL_COMPILED_INLINE sim_config sim_config_from_values(char const* devices_text,
                                                                char const* capacity_text);

// The power of two a size suffix names: K (10), M (20), G (30), T (40) in either case; -1 for any
// other character.
inline int sim_suffix_shift(char c) noexcept
{
  static constexpr char suffixes[] = "kmgt";
  char const lower                 = c >= 'A' && c <= 'Z' ? static_cast<char>(c - 'A' + 'a') : c;
  for (int i = 0; i < 4; ++i) {
    if (lower == suffixes[i]) { return 10 * (i + 1); }
  }
  return -1;
}

// Parses "<digits>[K|M|G|T]" (binary multiples); false when it does not parse or overflows.
GPUKIT_DETAIL_COMPILED_INLINE bool sim_parse_bytes(char const* text, std::size_t& out)
{
  if (text == nullptr || *text < '0' || *text > '9') { return false; }
  errno        = 0;
  char* end    = nullptr;
  auto const v = std::strtoull(text, &end, 10);
  if (errno != 0) { return false; }
  int shift = 0;
  if (*end != '\0') {
    shift = sim_suffix_shift(*end++);
    if (shift < 0 || *end != '\0') { return false; }
  }
  if (shift != 0 && v > (std::numeric_limits<std::size_t>::max() >> shift)) { return false; }
  out = static_cast<std::size_t>(v) << shift;
  return true;
}

}  // namespace detail

GPUKIT_DETAIL_COMPILED_INLINE sim_config sim_config::from_env()
{
  return detail::sim_config_from_values(std::getenv("GPUKIT_SIM_DEVICES"),
                                        std::getenv("GPUKIT_SIM_CAPACITY"));
}

namespace detail {

// from_env() on given values (null: unset), so that the parser can be tested and fuzzed.
GPUKIT_DETAIL_COMPILED_INLINE sim_config sim_config_from_values(char const* devices_text,
                                                                char const* capacity_text)
{
  sim_config c;
  std::size_t capacity = std::size_t{80} << 30;
  if (capacity_text != nullptr && *capacity_text != '\0') {
    GPUKIT_EXPECTS(detail::sim_parse_bytes(capacity_text, capacity),
                   std::string{"GPUKIT_SIM_CAPACITY="} + capacity_text +
                     ": expected a number of bytes, optionally with a K, M, G or T suffix");
  }
  std::size_t devices = 1;
  if (devices_text != nullptr && *devices_text != '\0') {
    bool const ok = detail::sim_parse_bytes(devices_text, devices) && devices >= 1 &&
                    devices <= 64 && std::strpbrk(devices_text, "kKmMgGtT") == nullptr;
    GPUKIT_EXPECTS(ok, std::string{"GPUKIT_SIM_DEVICES="} + devices_text +
                         ": expected a number of devices from 1 to 64");
  }
  c.with_devices(static_cast<int>(devices), capacity);
  return c;
}

}  // namespace detail

// ---- construction -----------------------------------------------------------------------------

GPUKIT_DETAIL_COMPILED_INLINE sim_runtime::sim_runtime(sim_config config)
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

GPUKIT_DETAIL_COMPILED_INLINE sim_runtime::~sim_runtime()
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

GPUKIT_DETAIL_COMPILED_INLINE sim_runtime& sim_runtime::instance()
{
  static sim_runtime rt{sim_config::from_env()};
  return rt;
}

// ---- plumbing ---------------------------------------------------------------------------------

namespace detail {
GPUKIT_DETAIL_COMPILED_INLINE int& sim_capture_mode() noexcept
{
  thread_local int mode = cudaStreamCaptureModeGlobal;
  return mode;
}

// The calls CUDA refuses while a capture concerns the calling thread (see capture_violation).
inline constexpr sim_op sim_capture_refused_ops[] = {
  sim_op::malloc,
  sim_op::free,
  sim_op::host_alloc,
  sim_op::host_free,
  sim_op::event_query,
  sim_op::event_synchronize,
  sim_op::stream_query,
  sim_op::stream_synchronize,
  sim_op::device_synchronize,
};

inline bool sim_refused_in_capture(sim_op op) noexcept
{
  for (sim_op refused : sim_capture_refused_ops) {
    if (op == refused) { return true; }
  }
  return false;
}

inline char const* sim_capture_mode_name(int mode) noexcept
{
  switch (mode) {
    case cudaStreamCaptureModeGlobal: return "global";
    case cudaStreamCaptureModeThreadLocal: return "thread-local";
    case cudaStreamCaptureModeRelaxed: return "relaxed";
    default: return "unknown";
  }
}
}  // namespace detail

GPUKIT_DETAIL_COMPILED_INLINE cudaError_t sim_runtime::capture_violation(sim_op op) noexcept
{
  if (!detail::sim_refused_in_capture(op)) { return cudaSuccess; }
  int const mode = detail::sim_capture_mode();
  if (mode == cudaStreamCaptureModeRelaxed) { return cudaSuccess; }
  capture_blame const blamed = invalidate_captures(op, mode);
  if (blamed.id == 0) { return cudaSuccess; }
  try {
    return misuse(cudaErrorStreamCaptureUnsupported,
                  std::string{to_string(op)} + ": not allowed while capture " +
                    std::to_string(blamed.id) + " (" + detail::sim_capture_mode_name(blamed.mode) +
                    " mode, begun by " + (blamed.own ? "this" : "another") +
                    " thread) is under way and this thread is in " +
                    detail::sim_capture_mode_name(mode) +
                    " capture mode; the capture is invalidated (call it before the capture, or "
                    "in relaxed capture mode)");
  } catch (...) {
    return cudaErrorStreamCaptureUnsupported;
  }
}

// CUDA's rule: refused when this thread began a capture that is not relaxed, or when this thread
// is in global mode and another thread's capture is global. Each such capture is invalidated.
GPUKIT_DETAIL_COMPILED_INLINE sim_runtime::capture_blame sim_runtime::invalidate_captures(
  sim_op op, int mode) noexcept
{
  auto const self = std::this_thread::get_id();
  capture_blame blamed;
  detail::pool_lock lock{capture_mutex_};
  for (auto& c : captures_) {
    bool const own   = c.thread == self && c.mode != cudaStreamCaptureModeRelaxed;
    bool const other = mode == cudaStreamCaptureModeGlobal && c.thread != self &&
                       c.mode == cudaStreamCaptureModeGlobal;
    if (!own && !other) { continue; }
    c.invalidate(to_string(op));
    if (blamed.id == 0) { blamed = capture_blame{c.id, c.mode, own}; }
  }
  return blamed;
}

// A call CUDA refuses on a capturing stream in every capture mode (cudaStreamGetDevice,
// cudaStreamQuery, cudaStreamSynchronize, ...): refused, and the capture invalidated.
GPUKIT_DETAIL_COMPILED_INLINE cudaError_t sim_runtime::on_capturing_stream(char const* call,
                                                                           std::uint64_t stream_id)
{
  if (captures_underway_.load(std::memory_order_acquire) == 0) { return cudaSuccess; }
  std::uint64_t id = 0;
  {
    detail::pool_lock lock{capture_mutex_};
    detail::sim_graph_capture* c = capture_of(stream_id);
    if (c == nullptr) { return cudaSuccess; }
    c->invalidate(call);
    id = c->id;
  }
  return misuse(cudaErrorStreamCaptureUnsupported,
                std::string{call} + "(stream " + detail::sim_hex(std::uintptr_t{stream_id}) +
                  "): the stream is being captured (capture " + std::to_string(id) +
                  "), where CUDA refuses this call in every capture mode; the capture is "
                  "invalidated (ask stream_is_capturing first)");
}

// A query of an event last recorded in a capture: cudaErrorCapturedEvent, and the capture, if
// still under way, is invalidated.
GPUKIT_DETAIL_COMPILED_INLINE cudaError_t sim_runtime::on_captured_event(char const* call,
                                                                         std::uint64_t event_id)
{
  std::uint64_t id = 0;
  {
    detail::pool_lock lock{capture_mutex_};
    auto it = captured_events_.find(event_id);
    if (it == captured_events_.end()) { return cudaSuccess; }
    id = it->second.capture;
    if (detail::sim_graph_capture* c = capture_by_id(id)) { c->invalidate(call); }
  }
  return misuse(cudaErrorCapturedEvent,
                std::string{call} + "(event " + detail::sim_hex(std::uintptr_t{event_id}) +
                  "): the event was last recorded during capture " + std::to_string(id) +
                  ", where it marks a point of the graph, not work that completes");
}

GPUKIT_DETAIL_COMPILED_INLINE detail::sim_graph_capture* sim_runtime::capture_of(
  std::uint64_t stream_id)
{
  for (auto& c : captures_) {
    if (c.find(stream_id) != nullptr) { return &c; }
  }
  return nullptr;
}

GPUKIT_DETAIL_COMPILED_INLINE detail::sim_graph_capture* sim_runtime::capture_by_id(
  std::uint64_t id)
{
  for (auto& c : captures_) {
    if (c.id == id) { return &c; }
  }
  return nullptr;
}

GPUKIT_DETAIL_COMPILED_INLINE bool sim_runtime::capturing(std::uint64_t stream_id) const
{
  if (captures_underway_.load(std::memory_order_acquire) == 0) { return false; }
  detail::pool_lock lock{capture_mutex_};
  for (auto const& c : captures_) {
    for (auto const& m : c.members) {
      if (m.stream == stream_id) { return true; }
    }
  }
  return false;
}

// Counts one operation captured on `stream_id`; false when the stream is not capturing. In a
// capture already invalidated, nothing is captured any more: err =
// cudaErrorStreamCaptureInvalidated.
GPUKIT_DETAIL_COMPILED_INLINE bool sim_runtime::note_captured_work(std::uint64_t stream_id,
                                                                   cudaError_t& err)
{
  if (captures_underway_.load(std::memory_order_acquire) == 0) { return false; }
  detail::pool_lock lock{capture_mutex_};
  for (auto& c : captures_) {
    if (auto* m = c.find(stream_id)) {
      if (c.invalidated) {
        err = cudaErrorStreamCaptureInvalidated;
      } else {
        ++m->work;
      }
      return true;
    }
  }
  return false;
}

GPUKIT_DETAIL_COMPILED_INLINE cudaError_t sim_runtime::enter(sim_op op) noexcept
{
  calls_[static_cast<std::size_t>(op)].fetch_add(1, std::memory_order_relaxed);
  if (captures_underway_.load(std::memory_order_acquire) != 0) {
    if (auto const e = capture_violation(op); e != cudaSuccess) { return e; }
  }
  if (faults_pending_.load(std::memory_order_acquire) == 0) { return cudaSuccess; }
  return take_fault(op);
}

GPUKIT_DETAIL_COMPILED_INLINE cudaError_t sim_runtime::take_fault(sim_op op) noexcept
{
  detail::pool_lock lock{faults_mutex_};
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

GPUKIT_DETAIL_COMPILED_INLINE cudaError_t sim_runtime::misuse(cudaError_t error,
                                                              std::string message)
{
  message = "gpukit sim: " + message;
  if (config_.log_misuse) { std::fprintf(stderr, "%s [%s]\n", message.c_str(), error_name(error)); }
  {
    detail::pool_lock lock{misuse_mutex_};
    last_misuse_ = std::move(message);
  }
  misuse_count_.fetch_add(1, std::memory_order_relaxed);
  return error;
}

GPUKIT_DETAIL_COMPILED_INLINE int sim_runtime::current_device() const
{
  return detail::sim_thread_device(serial_);
}

GPUKIT_DETAIL_COMPILED_INLINE bool sim_runtime::valid_device(int d) const noexcept
{
  return d >= 0 && static_cast<std::size_t>(d) < devices_.size();
}

GPUKIT_DETAIL_COMPILED_INLINE cudaError_t sim_runtime::bad_device(char const* call, int d)
{
  return misuse(cudaErrorInvalidDevice, std::string{call} + "(device " + std::to_string(d) +
                                          "): this simulated GPU has devices 0 to " +
                                          std::to_string(devices_.size() - 1));
}

GPUKIT_DETAIL_COMPILED_INLINE std::shared_ptr<detail::sim_stream> sim_runtime::null_stream(
  int device)
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

GPUKIT_DETAIL_COMPILED_INLINE std::shared_ptr<detail::sim_stream> sim_runtime::find_stream(
  stream_type s, char const* call, cudaError_t& err)
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

GPUKIT_DETAIL_COMPILED_INLINE std::shared_ptr<detail::sim_event> sim_runtime::find_event(
  event_type e, char const* call, cudaError_t& err)
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

GPUKIT_DETAIL_COMPILED_INLINE cudaError_t sim_runtime::enqueue(detail::sim_stream& s,
                                                               std::function<void()> task,
                                                               char const* call)
{
  cudaError_t err = cudaSuccess;
  if (note_captured_work(s.id, err)) { return err; }  // captured into a graph: recorded, not run
  if (s.enqueue(std::move(task))) { return cudaSuccess; }
  return misuse(cudaErrorInvalidResourceHandle,
                std::string{call} + "(stream " + detail::sim_hex(std::uintptr_t{s.id}) +
                  "): the stream was destroyed while this call was in flight");
}

GPUKIT_DETAIL_COMPILED_INLINE void sim_runtime::reap_streams()
{
  std::lock_guard<std::mutex> lock{draining_mutex_};
  auto const done =
    std::partition(draining_.begin(), draining_.end(), [](auto const& s) { return !s->exited(); });
  for (auto it = done; it != draining_.end(); ++it) { (*it)->join(); }
  draining_.erase(done, draining_.end());
}

GPUKIT_DETAIL_COMPILED_INLINE void sim_runtime::wait_device(int device)
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

GPUKIT_DETAIL_COMPILED_INLINE void sim_runtime::wait_all_devices()
{
  for (std::size_t d = 0; d < devices_.size(); ++d) { wait_device(static_cast<int>(d)); }
}

}  // namespace gpukit

#include <gpukit/runtime/detail/sim_runtime_controls_impl.hpp>
#include <gpukit/runtime/detail/sim_runtime_ipc_impl.hpp>
#include <gpukit/runtime/detail/sim_runtime_memory_impl.hpp>
#include <gpukit/runtime/detail/sim_runtime_streams_impl.hpp>
#include <gpukit/runtime/detail/sim_runtime_vm_impl.hpp>
