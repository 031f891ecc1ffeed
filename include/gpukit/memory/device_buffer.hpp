// SPDX-License-Identifier: Apache-2.0
// gpukit/memory/device_buffer.hpp: untyped, stream-ordered, owning device memory (RMM's
// device_buffer) over any gpukit allocator.
//
// Quick start:
//
//   #include <gpukit/memory/device_buffer.hpp>
//   #include <gpukit/runtime/sim_runtime.hpp>
//
//   #include <utility>
//
//   void run()
//   {
//     gpukit::cuda_stream s;
//     gpukit::device_buffer b{1 << 20, s};  // 1 MiB from the current device's current resource,
//                                           // usable in s's order at once (uninitialized)
//     b.resize(2 << 20, s);                 // grows: a new block, the old bytes copied on s
//     gpukit::device_buffer moved = std::move(b);  // b is empty now
//     std::size_t const bytes = moved.capacity();
//     void* raw = moved.release();          // the caller frees it now:
//     moved.allocator().deallocate_async(raw, bytes, s);
//
//     // Any allocator, e.g. a caching allocator on the simulated GPU:
//     gpukit::sim_runtime sim{gpukit::sim_config{}.with_devices(1, std::size_t{8} << 30)};
//     gpukit::basic_caching_allocator<gpukit::sim_runtime> alloc{sim, 0};
//     gpukit::basic_device_buffer<decltype(alloc)> on_sim{4096, {}, alloc};
//   }
//
// ## Semantics
//
// - Memory is allocated and freed in the order of the buffer's stream: the stream given to the
//   constructor, changed by set_stream() and by every member that takes a stream. The destructor
//   frees on the last stream set, so work queued on that stream may still use the memory; work on
//   other streams must be ordered before it (an event) by the caller, as with the allocator.
//   An owning stream (gpukit/memory/cuda_stream.hpp) may be destroyed before the buffer: its work
//   has completed then, and the buffer frees on the default stream instead of the dead handle.
// - A size of 0 allocates nothing: data() is null.
// - Moves leave the source empty (null, size 0) with the same allocator and stream.
// - The buffer keeps a reference to its allocator. An allocator with `lifetime()` (gpukit's caching
//   allocator) may be destroyed first, whatever the declaration order: its destructor takes back
//   every block, the buffer's destructor (and move assignment) then frees nothing, and the
//   members that allocate or free (resize, reserve, shrink_to_fit, set_stream) throw
//   gpukit::logic_error; data() then names freed memory, which no work may use. The check is one
//   load of a word written only when an allocator is created or destroyed. Other allocators must
//   outlive the buffer.
// - An allocator serves one device; copies run with that device current.
//
// Allocator requirements: `runtime_type`, `stream_type`, `allocate_async(bytes, stream)`,
// `deallocate_async(p, bytes, stream)`, `runtime()` and `device()`, as
// basic_caching_allocator has. Allocators with `forget_stream` are registered with the owning
// stream (gpukit/memory/cuda_stream.hpp) of the views they are used on.
#pragma once

#include <gpukit/error.hpp>
#include <gpukit/memory/caching_allocator.hpp>
#include <gpukit/memory/cuda_stream.hpp>
#include <gpukit/memory/current_resource.hpp>
#include <gpukit/runtime/runtime.hpp>

#include <cstddef>
#include <type_traits>
#include <utility>

namespace gpukit {

namespace detail {

template <class A>
struct is_caching_allocator : std::false_type {};
template <class R>
struct is_caching_allocator<basic_caching_allocator<R>> : std::true_type {};

/// The default allocator of RAII types: the current resource of the current device. Only caching
/// allocators have one; other allocators must be passed explicitly.
template <class Allocator>
Allocator& current_resource_for()
{
  static_assert(is_caching_allocator<Allocator>::value,
                "only caching allocators have a current resource: pass the allocator explicitly");
  return get_current_device_resource<typename Allocator::runtime_type>();
}

}  // namespace detail

/// Untyped owning device memory over `Allocator` (see the top of this header). Not thread-safe
/// (like std::vector); distinct buffers may be used from distinct threads.
template <class Allocator = caching_allocator>
class basic_device_buffer final {
 public:
  using allocator_type = Allocator;
  using runtime_type   = typename Allocator::runtime_type;
  using stream_type    = typename Allocator::stream_type;
  using stream_view    = basic_cuda_stream_view<runtime_type>;

  /// An empty buffer (no memory) on the default stream over the current resource.
  /// @throws as get_current_device_resource
  basic_device_buffer() : basic_device_buffer{0, stream_view{}} {}

  /// `bytes` uninitialized bytes, allocated in `stream` order. Does not synchronize.
  /// @throws what `alloc.allocate_async` throws (gpukit::bad_alloc, gpukit::out_of_memory,
  ///         gpukit::cuda_error)
  basic_device_buffer(std::size_t bytes, stream_view stream,
                      Allocator& alloc = detail::current_resource_for<Allocator>());

  /// `bytes` bytes copied from `source` (host or device memory; a pageable host source may block
  /// the host on CUDA) in `stream` order. `source` must stay valid until the copy has run (until
  /// `stream` is synchronized). Does not synchronize.
  /// @throws as the sized constructor; gpukit::cuda_error when the copy cannot be enqueued (the
  ///         memory is freed again)
  basic_device_buffer(void const* source, std::size_t bytes, stream_view stream,
                      Allocator& alloc = detail::current_resource_for<Allocator>());

  /// A deep copy of `other`'s size() bytes, in `stream` order (work on other's stream that writes
  /// it must be ordered before `stream`). Does not synchronize. @throws as the copying constructor
  basic_device_buffer(basic_device_buffer const& other, stream_view stream,
                      Allocator& alloc = detail::current_resource_for<Allocator>());

  /// Frees the memory on stream(), or on the default stream when stream() came from an owning
  /// stream destroyed since (its work is complete); nothing when the allocator was destroyed first
  /// (it took the memory back). Never throws: errors go to stderr.
  ~basic_device_buffer();

  basic_device_buffer(basic_device_buffer const&)            = delete;
  basic_device_buffer& operator=(basic_device_buffer const&) = delete;
  /// Takes `other`'s memory, size, stream and allocator; `other` is left empty.
  basic_device_buffer(basic_device_buffer&& other) noexcept;
  /// Frees this buffer's memory (on its stream), then takes `other`'s; `other` is left empty.
  basic_device_buffer& operator=(basic_device_buffer&& other) noexcept;

  [[nodiscard]] void* data() noexcept { return data_; }
  [[nodiscard]] void const* data() const noexcept { return data_; }
  /// Bytes in use.
  [[nodiscard]] std::size_t size() const noexcept { return size_; }
  /// Bytes allocated (at least size()).
  [[nodiscard]] std::size_t capacity() const noexcept { return capacity_; }
  [[nodiscard]] bool is_empty() const noexcept { return size_ == 0; }
  /// The stream the memory is freed on.
  [[nodiscard]] stream_view stream() const noexcept { return stream_; }
  [[nodiscard]] Allocator& allocator() const noexcept { return *alloc_; }

  /// Frees on `stream` from now on (the destructor, shrinking, growing). Work on the previous
  /// stream that uses the memory must be ordered before work on `stream` by the caller.
  /// @throws gpukit::logic_error when the allocator was destroyed; std::bad_alloc when registering
  ///         the allocator with an owning stream fails
  void set_stream(stream_view stream);

  /// Makes capacity() at least `bytes`: a new block, the size() bytes in use copied to it and the
  /// old block freed, all in `stream` order (which becomes the buffer's stream). Does not
  /// synchronize. On failure the buffer is unchanged.
  /// @throws as the copying constructor; gpukit::logic_error when the allocator was destroyed
  void reserve(std::size_t bytes, stream_view stream);

  /// Makes size() `bytes`. Within capacity() only the size changes; beyond it, as reserve(bytes)
  /// (the bytes in use are kept, the new ones are uninitialized). `stream` becomes the buffer's
  /// stream. Does not synchronize. On failure the buffer is unchanged.
  /// @throws as reserve
  void resize(std::size_t bytes, stream_view stream);

  /// Makes capacity() equal size() (a new block and a copy, in `stream` order; size 0 frees the
  /// memory). `stream` becomes the buffer's stream. Does not synchronize.
  /// @throws as reserve
  void shrink_to_fit(stream_view stream);

  /// Hands the memory to the caller and leaves the buffer empty (allocator and stream kept).
  /// Read capacity() first: the caller frees the pointer with
  /// `allocator().deallocate_async(p, capacity, stream)`. Never throws.
  [[nodiscard]] void* release() noexcept;

 private:
  void* allocate(std::size_t bytes, stream_view stream);
  void free_now() noexcept;
  void copy_async(void* dst, void const* src, std::size_t bytes, memcpy_kind kind,
                  stream_view stream);
  void reallocate(std::size_t new_capacity, stream_view stream);
  /// True when the allocator has a lifetime and it has ended.
  [[nodiscard]] bool allocator_gone() const noexcept { return life_.is_set() && !life_.alive(); }
  /// @throws gpukit::logic_error naming `call` when the allocator was destroyed
  void expect_allocator(char const* call) const;

  Allocator* alloc_;
  detail::lifetime_token life_;  // alloc_'s, when it has one (see "Semantics" above)
  stream_view stream_{};
  void* data_{nullptr};
  std::size_t size_{0};
  std::size_t capacity_{0};
};

/// Untyped device memory over the caching allocator on the CUDA runtime.
using device_buffer = basic_device_buffer<caching_allocator>;

}  // namespace gpukit

#include <gpukit/memory/detail/device_buffer_impl.hpp>
