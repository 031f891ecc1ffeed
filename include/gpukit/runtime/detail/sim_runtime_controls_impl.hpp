// SPDX-License-Identifier: Apache-2.0
// gpukit/runtime/detail/sim_runtime_controls_impl.hpp: simulation controls: capacity, fault
// injection, stalls, counters, capture of gpukit::sim_runtime. Not public API; included by
// gpukit/runtime/detail/sim_runtime_impl.hpp (its header comment describes the locking).
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

// ---- simulation controls ------------------------------------------------------------------------

GPUKIT_DETAIL_COMPILED_INLINE cudaError_t sim_runtime::set_capacity(int device, std::size_t bytes)
{
  if (!valid_device(device)) { return bad_device("set_capacity", device); }
  devices_[static_cast<std::size_t>(device)]->capacity.store(bytes, std::memory_order_relaxed);
  return cudaSuccess;
}

GPUKIT_DETAIL_COMPILED_INLINE std::size_t sim_runtime::capacity(int device) const noexcept
{
  if (!valid_device(device)) { return 0; }
  return devices_[static_cast<std::size_t>(device)]->capacity.load(std::memory_order_relaxed);
}

GPUKIT_DETAIL_COMPILED_INLINE std::size_t sim_runtime::used_bytes(int device) const noexcept
{
  if (!valid_device(device)) { return 0; }
  return devices_[static_cast<std::size_t>(device)]->used.load(std::memory_order_relaxed);
}

GPUKIT_DETAIL_COMPILED_INLINE bool sim_runtime::host_pinned_for(void const* p, std::size_t bytes,
                                                                int device) const
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

GPUKIT_DETAIL_COMPILED_INLINE bool sim_runtime::peer_access_enabled(int device,
                                                                    int peer) const noexcept
{
  if (!valid_device(device) || !valid_device(peer)) { return false; }
  return ((peer_enabled_[static_cast<std::size_t>(device)].load() >> peer) & 1) != 0;
}

GPUKIT_DETAIL_COMPILED_INLINE bool sim_runtime::vm_accessible(void const* p, int device) const
{
  if (!valid_device(device)) { return false; }
  auto const a = reinterpret_cast<std::uintptr_t>(p);
  std::lock_guard<std::mutex> lock{mem_mutex_};
  auto m = mappings_.upper_bound(a);
  if (m == mappings_.begin()) { return false; }
  --m;
  return a < m->first + m->second.bytes && ((m->second.access_mask >> device) & 1) != 0;
}

GPUKIT_DETAIL_COMPILED_INLINE std::uint64_t sim_runtime::staged_peer_copies() const noexcept
{
  return staged_peer_copies_.load(std::memory_order_relaxed);
}

GPUKIT_DETAIL_COMPILED_INLINE void sim_runtime::inject_fault(sim_op op, std::uint64_t nth,
                                                             cudaError_t error)
{
  GPUKIT_EXPECTS(
    op >= sim_op::device_count && op < sim_op::count_,
    "inject_fault: op " + std::to_string(static_cast<int>(op)) + " is not a runtime call");
  GPUKIT_EXPECTS(
    nth >= 1, std::string{"inject_fault("} + to_string(op) + ", 0, ...): nth counts calls from 1");
  GPUKIT_EXPECTS(error != cudaSuccess,
                 std::string{"inject_fault("} + to_string(op) + ", ...): the error is cudaSuccess");
  detail::pool_lock lock{faults_mutex_};
  faults_.push_back(pending_fault{op, nth, error});
  faults_pending_.store(faults_.size(), std::memory_order_release);
}

GPUKIT_DETAIL_COMPILED_INLINE void sim_runtime::clear_faults()
{
  detail::pool_lock lock{faults_mutex_};
  faults_.clear();
  faults_pending_.store(0, std::memory_order_release);
}

GPUKIT_DETAIL_COMPILED_INLINE std::size_t sim_runtime::pending_faults() const
{
  detail::pool_lock lock{faults_mutex_};
  return faults_.size();
}

GPUKIT_DETAIL_COMPILED_INLINE cudaError_t sim_runtime::stall(stream_type s)
{
  cudaError_t err = cudaSuccess;
  auto stream     = find_stream(s, "stall", err);
  if (!stream) { return err; }
  stream->set_stalled(true);
  return cudaSuccess;
}

GPUKIT_DETAIL_COMPILED_INLINE cudaError_t sim_runtime::release(stream_type s)
{
  cudaError_t err = cudaSuccess;
  auto stream     = find_stream(s, "release", err);
  if (!stream) { return err; }
  stream->set_stalled(false);
  return cudaSuccess;
}

GPUKIT_DETAIL_COMPILED_INLINE std::uint64_t sim_runtime::calls(sim_op op) const noexcept
{
  if (op < sim_op::device_count || op >= sim_op::count_) { return 0; }
  return calls_[static_cast<std::size_t>(op)].load(std::memory_order_relaxed);
}

GPUKIT_DETAIL_COMPILED_INLINE std::uint64_t sim_runtime::total_calls() const noexcept
{
  std::uint64_t sum = 0;
  for (auto const& c : calls_) { sum += c.load(std::memory_order_relaxed); }
  return sum;
}

GPUKIT_DETAIL_COMPILED_INLINE std::uint64_t sim_runtime::synchronizations() const noexcept
{
  return synchronizations_.load(std::memory_order_relaxed);
}

GPUKIT_DETAIL_COMPILED_INLINE void sim_runtime::reset_counters() noexcept
{
  for (auto& c : calls_) { c.store(0, std::memory_order_relaxed); }
  synchronizations_.store(0, std::memory_order_relaxed);
}

GPUKIT_DETAIL_COMPILED_INLINE std::string sim_runtime::last_misuse() const
{
  detail::pool_lock lock{misuse_mutex_};
  return last_misuse_;
}

GPUKIT_DETAIL_COMPILED_INLINE std::uint64_t sim_runtime::misuse_count() const noexcept
{
  return misuse_count_.load(std::memory_order_relaxed);
}

// --- Graph capture (simulated) -------------------------------------------------------------------

GPUKIT_DETAIL_COMPILED_INLINE cudaError_t sim_runtime::stream_is_capturing(stream_type s,
                                                                           bool& is_capturing)
{
  is_capturing = false;
  if (auto e = enter(sim_op::stream_is_capturing); e != cudaSuccess) { return e; }
  cudaError_t err = cudaSuccess;
  auto stream     = find_stream(s, "stream_is_capturing", err);
  if (!stream) { return err; }
  is_capturing = capturing(stream->id);
  return cudaSuccess;
}

GPUKIT_DETAIL_COMPILED_INLINE cudaError_t sim_runtime::stream_capture_id(stream_type s,
                                                                         unsigned long long& id)
{
  id = 0;
  if (auto e = enter(sim_op::stream_capture_id); e != cudaSuccess) { return e; }
  cudaError_t err = cudaSuccess;
  auto stream     = find_stream(s, "stream_capture_id", err);
  if (!stream) { return err; }
  if (captures_underway_.load(std::memory_order_acquire) == 0) { return cudaSuccess; }
  detail::pool_lock lock{capture_mutex_};
  if (detail::sim_graph_capture const* c = capture_of(stream->id)) { id = c->id; }
  return cudaSuccess;
}

GPUKIT_DETAIL_COMPILED_INLINE cudaError_t sim_runtime::exchange_capture_mode(int& mode)
{
  if (auto e = enter(sim_op::exchange_capture_mode); e != cudaSuccess) { return e; }
  std::swap(mode, detail::sim_capture_mode());
  return cudaSuccess;
}

GPUKIT_DETAIL_COMPILED_INLINE cudaError_t sim_runtime::begin_capture(stream_type s, int mode)
{
  cudaError_t err = cudaSuccess;
  auto stream     = find_stream(s, "begin_capture", err);
  if (!stream) { return err; }
  if (mode != cudaStreamCaptureModeGlobal && mode != cudaStreamCaptureModeThreadLocal &&
      mode != cudaStreamCaptureModeRelaxed) {
    return misuse(cudaErrorInvalidValue, "begin_capture(stream " + detail::sim_hex(s) + ", mode " +
                                           std::to_string(mode) +
                                           "): not a capture mode (global 0, thread-local 1, "
                                           "relaxed 2)");
  }
  detail::pool_lock lock{capture_mutex_};
  if (detail::sim_graph_capture const* c = capture_of(stream->id)) {
    return misuse(
      cudaErrorInvalidValue,
      "begin_capture: the stream is already capturing (capture " + std::to_string(c->id) + ")");
  }
  detail::sim_graph_capture c;
  c.id     = next_capture_id_++;
  c.mode   = mode;
  c.thread = std::this_thread::get_id();
  c.members.push_back({stream->id, 0, {}});
  captures_.push_back(std::move(c));
  captures_underway_.fetch_add(1, std::memory_order_acq_rel);
  return cudaSuccess;
}

GPUKIT_DETAIL_COMPILED_INLINE cudaError_t sim_runtime::end_capture(stream_type s)
{
  cudaError_t err = cudaSuccess;
  auto stream     = find_stream(s, "end_capture", err);
  if (!stream) { return err; }
  std::string why;
  {
    detail::pool_lock lock{capture_mutex_};
    detail::sim_graph_capture* c = capture_of(stream->id);
    if (c == nullptr) {
      err = cudaErrorInvalidValue;
      why = "end_capture: the stream is not capturing";
    } else if (c->members.front().stream != stream->id) {
      c->invalidate("end_capture");
      err = cudaErrorStreamCaptureUnmatched;
      why = "end_capture(stream " + detail::sim_hex(s) + "): capture " + std::to_string(c->id) +
            " was begun on stream " + detail::sim_hex(std::uintptr_t{c->members.front().stream}) +
            ", which must end it; the capture is invalidated";
    } else {
      auto const& origin = c->members.front();
      if (c->invalidated) {
        err = cudaErrorStreamCaptureInvalidated;
        why = "end_capture(stream " + detail::sim_hex(s) + "): capture " + std::to_string(c->id) +
              " was invalidated by " + c->invalidated_by +
              ", which it does not allow (see the misuse recorded then)";
      } else {
        for (auto const& m : c->members) {
          std::uint64_t const joined = detail::sim_reached(origin.reach, m.stream);
          if (m.stream == origin.stream || m.work <= joined) { continue; }
          err = cudaErrorStreamCaptureUnjoined;
          why = "end_capture(stream " + detail::sim_hex(s) + "): stream " +
                detail::sim_hex(std::uintptr_t{m.stream}) + " joined capture " +
                std::to_string(c->id) + " and captured " + std::to_string(m.work - joined) +
                " operation(s) the origin never waited for (record an event on it and make the "
                "origin wait on it before ending the capture)";
          break;
        }
      }
      captures_.erase(captures_.begin() + (c - captures_.data()));
      captures_underway_.fetch_sub(1, std::memory_order_acq_rel);
    }
  }
  return err == cudaSuccess ? err : misuse(err, std::move(why));
}

}  // namespace gpukit
