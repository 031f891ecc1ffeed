// SPDX-License-Identifier: Apache-2.0
// Bodies of gpukit/memory/cuda_stream.hpp. Not public API.
#pragma once

#include <gpukit/error_macros.hpp>

#include <algorithm>
#include <cstdio>
#include <exception>

namespace gpukit {

namespace detail {

template <class Runtime>
template <class Allocator>
void owned_stream_state<Runtime>::note(Allocator& alloc)
{
  if constexpr (has_forget_stream<Allocator>::value) {
    static_assert(std::is_same_v<typename Allocator::stream_type, stream_type>,
                  "the allocator serves streams of another runtime");
    void* const target        = static_cast<void*>(&alloc);
    lifetime_token const life = lifetime_of(alloc);
    if (life.is_set() ? last_life.load(std::memory_order_acquire) == life.bits()
                      : last.load(std::memory_order_acquire) == target) {
      return;
    }
    std::lock_guard<std::mutex> lock{mutex};
    // Allocators destroyed since they were noted drop out (a stream may outlive many).
    hooks.erase(
      std::remove_if(hooks.begin(), hooks.end(),
                     [](forget_hook const& h) { return h.life.is_set() && !h.life.alive(); }),
      hooks.end());
    bool const known = std::any_of(hooks.begin(), hooks.end(), [&](forget_hook const& h) {
      return h.target == target && h.life == life;
    });
    if (!known) {
      hooks.push_back({target,
                       [](void* a, stream_type s) { static_cast<Allocator*>(a)->forget_stream(s); },
                       life});
    }
    if (life.is_set()) {
      last_life.store(life.bits(), std::memory_order_release);
    } else {
      last.store(target, std::memory_order_release);
    }
  } else {
    (void)alloc;  // nothing to forget
  }
}

/// Writes what went wrong in a destructor to stderr (destructors never throw).
inline void report_in_destructor(char const* what, char const* why) noexcept
{
  std::fprintf(stderr, "gpukit: %s: %s\n", what, why);
}

}  // namespace detail

template <class Runtime>
basic_cuda_stream<Runtime>::basic_cuda_stream(Runtime& runtime)
    : state_{std::make_unique<state_type>()}
{
  state_->runtime = &runtime;
  GPUKIT_CUDA_TRY(runtime.get_device(state_->device));
  GPUKIT_CUDA_TRY(runtime.stream_create(state_->stream));
}

template <class Runtime>
basic_cuda_stream<Runtime>::~basic_cuda_stream()
{
  destroy();
}

template <class Runtime>
basic_cuda_stream<Runtime>& basic_cuda_stream<Runtime>::operator=(
  basic_cuda_stream&& other) noexcept
{
  if (this != &other) {
    destroy();
    state_ = std::move(other.state_);
  }
  return *this;
}

template <class Runtime>
typename basic_cuda_stream<Runtime>::state_type& basic_cuda_stream<Runtime>::state() const
{
  GPUKIT_EXPECTS(state_ != nullptr, "cuda_stream: the stream was moved from and owns nothing");
  return *state_;
}

template <class Runtime>
void basic_cuda_stream<Runtime>::synchronize() const
{
  GPUKIT_CUDA_TRY(state().runtime->stream_synchronize(state().stream));
}

template <class Runtime>
typename Runtime::error_type basic_cuda_stream<Runtime>::synchronize_no_throw() const noexcept
{
  if (state_ == nullptr) { return Runtime::invalid_resource_handle; }
  return state_->runtime->stream_synchronize(state_->stream);
}

template <class Runtime>
void basic_cuda_stream<Runtime>::destroy() noexcept
{
  if (state_ == nullptr) { return; }
  state_type& st = *state_;
  // Views tell from now on: a buffer destroyed later frees on the default stream.
  st.registration.expire();
  std::vector<typename state_type::forget_hook> hooks;
  try {
    {
      std::lock_guard<std::mutex> lock{st.mutex};
      hooks = st.hooks;
    }
    // The device's default allocator and current resource, when they run on this runtime.
    auto add = [&](basic_caching_allocator<Runtime>* a) {
      if (a == nullptr || &a->runtime() != st.runtime) { return; }
      detail::lifetime_token const life = a->lifetime();
      auto const same  = [&](auto const& h) { return h.target == a && h.life == life; };
      bool const known = std::any_of(hooks.begin(), hooks.end(), same);
      if (!known) {
        hooks.push_back({a,
                         [](void* p, typename state_type::stream_type s) {
                           static_cast<basic_caching_allocator<Runtime>*>(p)->forget_stream(s);
                         },
                         life});
      }
    };
    int device = st.device;
    add(detail::current_resource_slot_of<Runtime>(device).current.load(std::memory_order_acquire));
    if (&Runtime::instance() == st.runtime) { add(&default_caching_allocator<Runtime>(device)); }
  } catch (std::exception const& e) {
    detail::report_in_destructor("cuda_stream: listing the allocators to tell", e.what());
  }
  for (auto const& h : hooks) {
    try {
      if (h.life.is_set()) {
        // Skipped when the allocator is gone; its destructor waits while it forgets.
        (void)h.life.with_alive([&] { h.forget(h.target, st.stream); });
      } else {
        h.forget(h.target, st.stream);
      }
    } catch (std::exception const& e) {
      detail::report_in_destructor("cuda_stream: forget_stream", e.what());
    }
  }
  typename Runtime::error_type const e = st.runtime->stream_destroy(st.stream);
  if (e != Runtime::success) {
    detail::report_in_destructor("cuda_stream: stream_destroy", Runtime::error_string(e));
  }
  state_.reset();
}

template <class Runtime>
basic_stream_pool<Runtime>::basic_stream_pool(std::size_t size, Runtime& runtime)
{
  GPUKIT_EXPECTS(size != 0, "stream_pool: a pool needs at least one stream (size 0)");
  streams_.reserve(size);
  views_.reserve(size);
  for (std::size_t i = 0; i < size; ++i) {
    streams_.emplace_back(runtime);
    views_.push_back(streams_.back().view());
  }
}

template <class Runtime>
typename basic_stream_pool<Runtime>::view_type basic_stream_pool<Runtime>::get_stream()
  const noexcept
{
  return views_[next_.fetch_add(1, std::memory_order_relaxed) % views_.size()];
}

template <class Runtime>
typename basic_stream_pool<Runtime>::view_type basic_stream_pool<Runtime>::get_stream(
  std::size_t stream_id) const noexcept
{
  return views_[stream_id % views_.size()];
}

}  // namespace gpukit
