// SPDX-License-Identifier: Apache-2.0
// gpukit/memory/detail/caching/capture_pools.hpp: the private pools of CUDA graph captures, for the
// caching allocator: one pool per capture (begun or resumed on a stream, ended, released), the
// capture windows opened before a capture's streams are known, and which pool a stream allocates
// from (its own capture's, or the capture it is joined to, asked of the runtime). Not public API.
//
// Single-threaded: the allocator calls it under its pool lock, and keeps the count of captures and
// windows under way in an atomic of its own, which its fast path reads without the lock. The
// blocks in a pool's indices are the allocator's (detail/caching/block_index.hpp).
#pragma once

#include <gpukit/error_macros.hpp>
#include <gpukit/memory/detail/tlsf_index.hpp>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace gpukit::detail::caching {

/// The private pools of graph captures; see the top of this file.
template <class Runtime, class Block>
class capture_pools {
 public:
  using stream_type = typename Runtime::stream_type;
  using capture_id  = std::uint64_t;

  /// One capture's pool: its free blocks per pool kind.
  struct pool {
    capture_id id{0};
    stream_type stream{};
    bool active{true};  // between begin (or resume) and end
    tlsf_index<Block> index[2];
  };

  capture_pools()                                = default;
  ~capture_pools()                               = default;
  capture_pools(capture_pools const&)            = delete;
  capture_pools& operator=(capture_pools const&) = delete;
  capture_pools(capture_pools&&)                 = delete;
  capture_pools& operator=(capture_pools&&)      = delete;

  /// A new pool for the capture begun on `stream`; returns its id.
  /// @throws gpukit::logic_error if a capture is under way on `stream`
  capture_id begin(stream_type stream)
  {
    GPUKIT_EXPECTS(active_on(stream) == nullptr,
                   "begin_capture: the stream already has a capture under way on this allocator");
    pools_.push_back(std::make_unique<pool>());
    pools_.back()->id     = next_id_++;
    pools_.back()->stream = stream;
    return pools_.back()->id;
  }
  /// The capture begun on `stream` allocates from the ended pool `id`.
  /// @throws gpukit::logic_error for an unknown id, a pool under way, or a capture on `stream`
  void resume(stream_type stream, capture_id id)
  {
    GPUKIT_EXPECTS(active_on(stream) == nullptr,
                   "resume_capture: the stream already has a capture under way on this allocator");
    pool& cp = at(id);
    GPUKIT_EXPECTS(!cp.active, "resume_capture: capture pool " + std::to_string(id) + " is in use");
    cp.active = true;
    cp.stream = stream;
  }
  /// The capture on `stream` has ended; its pool stays private.
  /// @throws gpukit::logic_error if no capture is under way on `stream`
  void end(stream_type stream)
  {
    pool* cp = active_on(stream);
    GPUKIT_EXPECTS(cp != nullptr, "end_capture: no capture is under way on this stream");
    cp->active = false;
  }

  void open_window() noexcept { ++windows_; }
  /// @throws gpukit::logic_error without a window open
  void close_window(int device)
  {
    GPUKIT_EXPECTS(windows_ > 0,
                   "end_capture_window: no capture window is open on this allocator (device " +
                     std::to_string(device) + ")");
    --windows_;
  }

  /// Takes the ended pool `id` away and returns its free blocks, out of its indices (the caller
  /// makes them ordinary blocks).
  /// @throws gpukit::logic_error for an unknown id or a capture that has not ended
  std::vector<Block*> release(capture_id id)
  {
    auto it =
      std::find_if(pools_.begin(), pools_.end(), [&](auto const& cp) { return cp->id == id; });
    GPUKIT_EXPECTS(it != pools_.end(),
                   "release_capture_pool: no capture pool " + std::to_string(id));
    GPUKIT_EXPECTS(!(*it)->active,
                   "release_capture_pool: capture " + std::to_string(id) + " has not ended");
    std::vector<Block*> blocks;
    for (auto& idx : (*it)->index) {
      idx.for_each([&](Block* b) { blocks.push_back(b); });
    }
    for (Block* b : blocks) { (*it)->index[b->kind].remove(b); }
    pools_.erase(it);
    return blocks;
  }

  /// The pool of the capture begun (or resumed) on `stream` and not ended, or nullptr.
  [[nodiscard]] pool* active_on(stream_type stream) noexcept
  {
    for (auto& cp : pools_) {
      if (cp->active && cp->stream == stream) { return cp.get(); }
    }
    return nullptr;
  }

  /// The capture under way that `stream` takes part in: the one begun on it, else, for a stream
  /// the runtime says is joined to a capture (a side stream that waited on an event recorded in
  /// it), the one begun on a stream of that same runtime capture; nullptr when none (`underway`:
  /// whether any capture or window is under way; the null stream is never captured). Only
  /// stream_capture_id is asked, which is legal during capture. With `guess_on_error`, a failing
  /// query gives the oldest capture under way (its pool holds a block longer than needed, never
  /// while a graph may use it); without, it throws gpukit::cuda_error.
  pool* find_for(Runtime& runtime, stream_type stream, bool underway, bool guess_on_error)
  {
    if (pool* cp = active_on(stream)) { return cp; }
    if (!underway || stream == stream_type{}) { return nullptr; }
    unsigned long long id          = 0;
    typename Runtime::error_type e = runtime.stream_capture_id(stream, id);
    if (e == Runtime::invalid_resource_handle) { return nullptr; }  // destroyed: not capturing
    if (e != Runtime::success) { return failed(e, guess_on_error); }
    if (id == 0) { return nullptr; }
    for (auto& cp : pools_) {
      if (!cp->active) { continue; }
      unsigned long long origin = 0;
      e                         = runtime.stream_capture_id(cp->stream, origin);
      if (e != Runtime::success) { return failed(e, guess_on_error); }
      if (origin == id) { return cp.get(); }
    }
    return nullptr;
  }

  /// Pool `id`. @throws gpukit::logic_error when it is gone
  [[nodiscard]] pool& at(capture_id id)
  {
    for (auto& cp : pools_) {
      if (cp->id == id) { return *cp; }
    }
    GPUKIT_EXPECTS(false, "caching_allocator: capture pool " + std::to_string(id) + " is gone");
    return *pools_.front();  // not reached
  }

  /// Every pool, oldest first.
  [[nodiscard]] std::vector<std::unique_ptr<pool>> const& pools() const noexcept { return pools_; }
  [[nodiscard]] int windows() const noexcept { return windows_; }

 private:
  pool* failed(typename Runtime::error_type e, bool guess_on_error)
  {
    if (!guess_on_error) { GPUKIT_CUDA_TRY(e, "stream_capture_id"); }
    for (auto& cp : pools_) {
      if (cp->active) { return cp.get(); }
    }
    return nullptr;
  }

  std::vector<std::unique_ptr<pool>> pools_;
  capture_id next_id_{1};
  int windows_{0};  // begin_capture_window calls not yet ended
};

}  // namespace gpukit::detail::caching
