// SPDX-License-Identifier: Apache-2.0
// gpukit/memory/cuda_stream.hpp: an owning stream that tells gpukit's allocators it is going away,
// a view of a stream, and a pool of owning streams (RMM's cuda_stream, cuda_stream_view and
// cuda_stream_pool).
//
// Quick start:
//
//   #include <gpukit/memory/cuda_stream.hpp>
//   #include <gpukit/memory/device_buffer.hpp>
//
//   void run()
//   {
//     {
//       gpukit::cuda_stream s;                // cudaStreamCreate on the current device
//       gpukit::device_buffer b{1 << 20, s};  // allocated in s's order (current resource)
//       // launch_kernel<<<grid, block, 0, s.value()>>>(b.data());
//       s.synchronize();
//     }  // b is freed on s; then s makes every allocator it knows forget it, and is destroyed
//
//     gpukit::stream_pool pool{4};                        // four owning streams
//     gpukit::cuda_stream_view next = pool.get_stream();  // round robin
//     cudaStreamSynchronize(next.value());
//   }
//
// ## What an owning stream makes forget it
//
// A caching allocator must be told (`forget_stream`) before a stream it served is destroyed: it may
// otherwise record events on it or free memory in its order later. On destruction a cuda_stream
// calls `forget_stream` (which waits for the work queued on the stream) on:
//
// - every allocator that a gpukit RAII type (device_buffer, device_uvector, device_scalar)
//   allocated from, or freed to, on this stream (through a view of it), and every allocator given
//   to `register_allocator`: one atomic compare per operation when the allocator is the last one
//   seen, a lock and a short list otherwise;
// - the current resource of the stream's device (get_current_device_resource) and the device's
//   default allocator (default_caching_allocator), when they run on the stream's runtime.
//
// Not covered: an allocator used with the raw handle (`s.value()`, or the implicit conversion to
// `stream_type`) directly and never registered.
// Call `s.register_allocator(alloc)` for those, or `alloc.forget_stream(s.value())` yourself.
//
// ## Destruction order
//
// A stream and the caching allocators it makes forget it may be declared, and so destroyed, in
// any order. The stream keeps each allocator's lifetime token (gpukit/detail/lifetime.hpp), not
// only its address: on destruction it calls forget_stream only on the allocators still alive,
// holding each one's lifetime lock meanwhile, and an allocator's destructor takes that lock first.
// So an allocator destroyed before the stream is skipped (it gave its memory back already), and
// one destroyed on another thread while the stream forgets itself in it waits for that. The same
// holds for the streams of a stream pool. Nothing is added to allocate or free: the token is read
// when the allocator is registered (once per allocator and stream, after an atomic compare) and
// when the stream is destroyed. Allocators of other types (without `lifetime()`) must still
// outlive the stream.
//
// Errors while forgetting or destroying are written to stderr (destructors never throw).
#pragma once

#include <gpukit/detail/lifetime.hpp>
#include <gpukit/error.hpp>
#include <gpukit/memory/current_resource.hpp>
#include <gpukit/runtime/cuda_runtime.hpp>
#include <gpukit/runtime/runtime.hpp>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <type_traits>
#include <utility>
#include <vector>

namespace gpukit {

template <class Runtime>
class basic_cuda_stream;

namespace detail {

/// What an owning stream shares with its views: the handle, and the allocators to make forget it.
/// Heap-allocated, so that moving the owning stream leaves its views valid.
template <class Runtime>
struct owned_stream_state {
  using stream_type = typename Runtime::stream_type;
  /// An allocator to make forget the stream. `life` is set for allocators that have a lifetime()
  /// (gpukit/detail/lifetime.hpp): `target` is then called only while `life` is alive, under its
  /// lock, so the allocator may be destroyed before the stream (or while it is being destroyed).
  /// Allocators without one must outlive the stream.
  struct forget_hook {
    void* target;
    void (*forget)(void* target, stream_type stream);
    lifetime_token life;
  };

  /// Adds `alloc` (once) to the allocators to make forget the stream. Thread-safe.
  template <class Allocator>
  void note(Allocator& alloc);

  Runtime* runtime{nullptr};
  stream_type stream{};
  int device{0};
  // The allocator noted last, the lock-free fast path: its lifetime token (bits) when it has one,
  // which a new allocator at the same address never shares; else its address.
  std::atomic<std::uint64_t> last_life{0};
  std::atomic<void*> last{nullptr};
  std::mutex mutex;                // guards hooks
  std::vector<forget_hook> hooks;  // allocators that die drop out when the next one is noted
  // Expired when the stream is destroyed: its views (a buffer's stream) can tell, and no longer
  // reach this state.
  lifetime_registration registration;
};

template <class A, class = void>
struct has_lifetime : std::false_type {};
template <class A>
struct has_lifetime<A, std::void_t<decltype(std::declval<A const&>().lifetime())>>
    : std::is_same<decltype(std::declval<A const&>().lifetime()), lifetime_token> {};

/// `alloc`'s lifetime token, or an unset one for allocators without lifetime().
template <class A>
lifetime_token lifetime_of(A const& alloc) noexcept
{
  if constexpr (has_lifetime<A>::value) {
    return alloc.lifetime();
  } else {
    (void)alloc;
    return {};
  }
}

template <class A, class = void>
struct has_forget_stream : std::false_type {};
template <class A>
struct has_forget_stream<A, std::void_t<decltype(std::declval<A&>().forget_stream(
                              std::declval<typename A::stream_type>()))>> : std::true_type {};

}  // namespace detail

/// A stream handle that does not own the stream, plus (when it comes from a basic_cuda_stream) the
/// link that lets RAII types register their allocator with the owning stream. Trivially copyable;
/// converts to and from `Runtime::stream_type` (a raw handle makes a view without that link).
/// A value-initialized view is the device's default stream.
template <class Runtime>
class basic_cuda_stream_view {
 public:
  using runtime_type = Runtime;
  using stream_type  = typename Runtime::stream_type;

  constexpr basic_cuda_stream_view() noexcept = default;
  /// A view of `stream` (not owned by a gpukit stream, or owned but reached by its raw handle).
  constexpr basic_cuda_stream_view(stream_type stream) noexcept : stream_{stream} {}  // NOLINT

  /// The raw handle.
  [[nodiscard]] constexpr stream_type value() const noexcept { return stream_; }
  constexpr operator stream_type() const noexcept { return stream_; }  // NOLINT
  /// True for the default (null) stream.
  [[nodiscard]] bool is_default() const noexcept { return stream_ == stream_type{}; }
  /// True when the view came from an owning basic_cuda_stream.
  [[nodiscard]] bool is_owned() const noexcept { return owner_ != nullptr; }
  /// True when the view came from an owning basic_cuda_stream that has been destroyed since: its
  /// handle names no stream any more (its work completed before it went: every gpukit allocator
  /// used on it forgot it, which waits for that). A buffer whose stream is destroyed frees on the
  /// default stream instead. One atomic load; never throws.
  [[nodiscard]] bool is_destroyed() const noexcept
  {
    return owner_life_.is_set() && !owner_life_.alive();
  }

  /// When the view came from an owning stream that still exists: that stream makes `alloc` forget
  /// it before it is destroyed, if `alloc` is still alive then (for allocators without
  /// `forget_stream`, and for other views: nothing). An allocator without `lifetime()` must
  /// outlive the stream. Thread-safe; does not synchronize.
  template <class Allocator>
  void register_allocator(Allocator& alloc) const
  {
    if (owner_ != nullptr && !is_destroyed()) { owner_->note(alloc); }
  }

 private:
  friend class basic_cuda_stream<Runtime>;
  constexpr basic_cuda_stream_view(stream_type stream,
                                   detail::owned_stream_state<Runtime>* owner) noexcept
      : stream_{stream}, owner_{owner}, owner_life_{owner->registration.token()}
  {}

  stream_type stream_{};
  detail::owned_stream_state<Runtime>* owner_{nullptr};  // read only while owner_life_ is alive
  detail::lifetime_token owner_life_;
};

/// An owning stream (RMM's cuda_stream): created on construction, on the calling thread's current
/// device; before it is destroyed, every allocator listed at the top of this header forgets it.
/// Move-only; a moved-from stream owns nothing and refuses value(), view() and synchronize().
template <class Runtime = cuda_runtime>
class basic_cuda_stream final {
 public:
  using runtime_type = Runtime;
  using stream_type  = typename Runtime::stream_type;
  using view_type    = basic_cuda_stream_view<Runtime>;

  /// Creates a stream (non-blocking with respect to the null stream) on the current device.
  /// @throws gpukit::cuda_error when the device cannot be read or the stream cannot be created
  explicit basic_cuda_stream(Runtime& runtime = Runtime::instance());
  /// Makes the allocators still alive forget the stream (each waits for its work), then destroys
  /// it. Never throws: errors go to stderr.
  ~basic_cuda_stream();

  basic_cuda_stream(basic_cuda_stream const&)            = delete;
  basic_cuda_stream& operator=(basic_cuda_stream const&) = delete;
  /// Takes `other`'s stream; `other` owns nothing afterwards. Views of the stream stay valid.
  basic_cuda_stream(basic_cuda_stream&& other) noexcept = default;
  /// Destroys this stream (as the destructor does), then takes `other`'s.
  basic_cuda_stream& operator=(basic_cuda_stream&& other) noexcept;

  /// False once moved from.
  [[nodiscard]] bool is_valid() const noexcept { return state_ != nullptr; }
  /// The raw handle. @throws gpukit::logic_error when moved from
  [[nodiscard]] stream_type value() const { return state().stream; }
  /// A view that RAII types use to register their allocators with this stream.
  /// @throws gpukit::logic_error when moved from
  [[nodiscard]] view_type view() const { return view_type{state().stream, state_.get()}; }
  operator view_type() const { return view(); }     // NOLINT
  operator stream_type() const { return value(); }  // NOLINT
  /// The device the stream was created on. @throws gpukit::logic_error when moved from
  [[nodiscard]] int device() const { return state().device; }
  /// The runtime the stream belongs to. @throws gpukit::logic_error when moved from
  [[nodiscard]] Runtime& runtime() const { return *state().runtime; }

  /// Blocks until the work queued on the stream has completed.
  /// @throws gpukit::cuda_error when the runtime fails; gpukit::logic_error when moved from
  void synchronize() const;
  /// As synchronize(), reporting failure as an error code instead (cudaErrorInvalidResourceHandle
  /// when moved from). Never throws.
  [[nodiscard]] typename Runtime::error_type synchronize_no_throw() const noexcept;

  /// Makes `alloc` forget this stream when it is destroyed, if `alloc` is still alive then (for
  /// memory taken with `alloc.allocate_async(bytes, s.value())` directly). An allocator without
  /// `lifetime()` must outlive the stream.
  /// Thread-safe; does not synchronize. @throws gpukit::logic_error when moved from
  template <class Allocator>
  void register_allocator(Allocator& alloc) const
  {
    state().note(alloc);
  }

 private:
  using state_type = detail::owned_stream_state<Runtime>;
  state_type& state() const;
  void destroy() noexcept;

  std::unique_ptr<state_type> state_;
};

/// A fixed set of owning streams handed out round robin (RMM's cuda_stream_pool). Thread-safe.
/// Not movable: views of its streams stay valid until it is destroyed.
template <class Runtime = cuda_runtime>
class basic_stream_pool final {
 public:
  using runtime_type = Runtime;
  using view_type    = basic_cuda_stream_view<Runtime>;

  static constexpr std::size_t default_size = 16;

  /// Creates `size` streams on the calling thread's current device.
  /// @throws gpukit::logic_error when size is 0; gpukit::cuda_error when a stream cannot be created
  explicit basic_stream_pool(std::size_t size = default_size,
                             Runtime& runtime = Runtime::instance());
  ~basic_stream_pool() = default;

  basic_stream_pool(basic_stream_pool const&)            = delete;
  basic_stream_pool& operator=(basic_stream_pool const&) = delete;
  basic_stream_pool(basic_stream_pool&&)                 = delete;
  basic_stream_pool& operator=(basic_stream_pool&&)      = delete;

  /// The next stream, round robin (one atomic increment). Never throws.
  [[nodiscard]] view_type get_stream() const noexcept;
  /// Stream `stream_id % get_pool_size()`: the same id always names the same stream. Never throws.
  [[nodiscard]] view_type get_stream(std::size_t stream_id) const noexcept;
  /// Number of streams.
  [[nodiscard]] std::size_t get_pool_size() const noexcept { return views_.size(); }

 private:
  std::vector<basic_cuda_stream<Runtime>> streams_;
  std::vector<view_type> views_;  // views_[i] == streams_[i].view()
  mutable std::atomic<std::size_t> next_{0};
};

/// An owning stream over the CUDA runtime.
using cuda_stream = basic_cuda_stream<cuda_runtime>;
/// A view of a CUDA stream.
using cuda_stream_view = basic_cuda_stream_view<cuda_runtime>;
/// A pool of owning CUDA streams.
using stream_pool = basic_stream_pool<cuda_runtime>;

}  // namespace gpukit

#include <gpukit/memory/detail/cuda_stream_impl.hpp>
