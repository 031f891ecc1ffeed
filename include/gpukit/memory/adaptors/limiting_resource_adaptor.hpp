// SPDX-License-Identifier: Apache-2.0
// gpukit/memory/adaptors/limiting_resource_adaptor.hpp: a cap on the bytes allocated through a
// resource (RMM's limiting_resource_adaptor), over any gpukit or CCCL memory resource.
//
// Quick start:
//
//   #include <gpukit/memory/adaptors/limiting_resource_adaptor.hpp>
//   #include <gpukit/memory/caching_allocator.hpp>
//
//   void step(gpukit::caching_allocator& alloc, cudaStream_t stream)
//   {
//     gpukit::limiting_resource_adaptor capped{alloc, std::size_t{1} << 30};  // 1 GiB through it
//     void* p = capped.allocate_async(1 << 20, stream);  // gpukit::out_of_memory past the cap
//     capped.deallocate_async(p, 1 << 20, stream);
//   }
//
// ## What every adaptor under gpukit/memory/adaptors/ shares
//
// - The upstream is held by reference: it must outlive the adaptor, and memory allocated through
//   the adaptor must be freed through it (with the size it was allocated with). Adaptors stack:
//   `statistics_resource_adaptor stats{capped};` counts what goes through `capped`.
// - An adaptor has the upstream's entry points, each exactly when the upstream has it: gpukit's
//   `allocate_async(bytes, stream)` / `deallocate_async(p, bytes, stream)` and `allocate(bytes)`,
//   CCCL 3.0's (`allocate(bytes, align)`, `allocate_async(bytes, align, stream_ref)`) and CCCL
//   3.1's (`allocate_sync`, `allocate(stream_ref, bytes, align)`) with their frees; also the
//   upstream's device_accessible / host_accessible properties, `runtime_type`, `runtime()` and
//   `device()`. So it satisfies whichever CCCL memory-resource concepts its upstream satisfies
//   (the tests check it for every CCCL gpukit supports), and gpukit's RAII types accept it:
//   `gpukit::basic_device_buffer<decltype(capped)> b{bytes, stream, capped};`.
// - No virtual call and no type erasure: each adaptor is a `final` class template whose members
//   the compiler inlines; nothing changes in the upstream, which costs nothing when not adapted.
// - Two adaptors are equal when they are the same object. Adaptors are neither copyable nor
//   movable (their state is atomics and locks).
// - Errors thrown by the upstream pass through unchanged; the adaptor's accounting is then as it
//   was before the call. A null pointer's deallocation goes to the upstream unaccounted.
#pragma once

#include <gpukit/error.hpp>
#include <gpukit/memory/adaptors/detail/resource_adaptor_base.hpp>

#include <atomic>
#include <cstddef>
#include <string>

namespace gpukit {

/// Refuses allocations that would bring the bytes allocated through it above a limit (see the top
/// of this header). Bytes are counted as requested (not as the upstream rounds them). The count is
/// one atomic that a request raises with a compare-exchange only when the result stays within the
/// limit (and lowers again if the upstream then fails): concurrent requests never pass the limit
/// together, allocated_bytes() never reads above it, and a refused request never makes another
/// fail (RMM's fetch_add-then-check can). No lock. Thread-safe when the upstream is.
///
/// @tparam Upstream any resource with gpukit's or CCCL's interface (held by reference)
template <class Upstream>
class limiting_resource_adaptor final
    : public detail::resource_adaptor_base<limiting_resource_adaptor<Upstream>, Upstream> {
  using base = detail::resource_adaptor_base<limiting_resource_adaptor<Upstream>, Upstream>;
  friend base;

 public:
  using typename base::stream_type;

  /// Allocates from `upstream` (which must outlive the adaptor) up to `limit_bytes` at once.
  limiting_resource_adaptor(Upstream& upstream, std::size_t limit_bytes) noexcept
      : base{upstream}, limit_{limit_bytes}
  {}
  ~limiting_resource_adaptor() = default;

  limiting_resource_adaptor(limiting_resource_adaptor const&)            = delete;
  limiting_resource_adaptor& operator=(limiting_resource_adaptor const&) = delete;
  limiting_resource_adaptor(limiting_resource_adaptor&&)                 = delete;
  limiting_resource_adaptor& operator=(limiting_resource_adaptor&&)      = delete;

  /// The limit in bytes.
  [[nodiscard]] std::size_t limit() const noexcept
  {
    return limit_.load(std::memory_order_relaxed);
  }
  /// Changes the limit. Lowering it below what is allocated frees nothing: later requests are
  /// refused until enough is freed. Thread-safe.
  void set_limit(std::size_t bytes) noexcept { limit_.store(bytes, std::memory_order_relaxed); }
  /// Bytes allocated through the adaptor and not yet freed.
  [[nodiscard]] std::size_t allocated_bytes() const noexcept
  {
    return used_.load(std::memory_order_relaxed);
  }

 private:
  /// @throws gpukit::out_of_memory naming the request, the limit and the bytes in use when the
  ///         request would pass the limit (the upstream is not called)
  template <class Allocate>
  void* do_allocate(std::size_t bytes, stream_type, Allocate&& allocate)
  {
    std::size_t before = used_.load(std::memory_order_relaxed);
    do {
      std::size_t const limit = limit_.load(std::memory_order_relaxed);
      if (bytes > limit || before > limit - bytes) {
        throw out_of_memory{refusal(bytes, before, limit)};
      }
    } while (!used_.compare_exchange_weak(before, before + bytes, std::memory_order_relaxed));
    void* p = nullptr;
    try {
      p = allocate();
    } catch (...) {
      used_.fetch_sub(bytes, std::memory_order_relaxed);
      throw;
    }
    if (p == nullptr) { used_.fetch_sub(bytes, std::memory_order_relaxed); }
    return p;
  }

  template <class Deallocate>
  void do_deallocate(void*, std::size_t bytes, stream_type, Deallocate&& deallocate)
  {
    deallocate();
    used_.fetch_sub(bytes, std::memory_order_relaxed);
  }

  oom_report refusal(std::size_t bytes, std::size_t in_use, std::size_t limit) const
  {
    oom_report r = detail::adaptor_oom_report(this->upstream_resource(), bytes);
    r.allocated  = in_use;
    r.limit      = limit;
    r.hint       = "limiting_resource_adaptor: " + std::to_string(in_use) + " of its limit of " +
             std::to_string(limit) + " bytes are in use, so " + std::to_string(bytes) +
             " more would pass it; raise it with set_limit() or free memory allocated through it";
    return r;
  }

  std::atomic<std::size_t> limit_;
  std::atomic<std::size_t> used_{0};
};

#if GPUKIT_HAS_CCCL_MEMORY_RESOURCE
static_assert(
  detail::is_device_async_resource_v<limiting_resource_adaptor<detail::cccl_archetype_resource>>,
  "a limiting_resource_adaptor must be the CCCL resource its upstream is");
#endif

}  // namespace gpukit
