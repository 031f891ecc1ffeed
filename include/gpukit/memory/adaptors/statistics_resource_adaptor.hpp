// SPDX-License-Identifier: Apache-2.0
// gpukit/memory/adaptors/statistics_resource_adaptor.hpp: current and peak bytes and allocation
// counts of what goes through a resource (RMM's statistics_resource_adaptor), over any gpukit or
// CCCL memory resource, with atomics only.
//
// Quick start:
//
//   #include <gpukit/memory/adaptors/statistics_resource_adaptor.hpp>
//   #include <gpukit/memory/caching_allocator.hpp>
//
//   #include <cstdio>
//
//   void step(gpukit::caching_allocator& alloc, cudaStream_t stream)
//   {
//     gpukit::statistics_resource_adaptor counted{alloc};
//     void* p = counted.allocate_async(1 << 20, stream);
//     counted.deallocate_async(p, 1 << 20, stream);
//     gpukit::resource_stats const s = counted.stats();
//     std::printf("peak %lld bytes in %lld allocations\n",
//                 static_cast<long long>(s.bytes.peak), static_cast<long
//                 long>(s.allocations.peak));
//   }
//
// What adaptors share (upstream by reference, entry points and CCCL concepts of the upstream, no
// virtual call) is at the top of gpukit/memory/adaptors/limiting_resource_adaptor.hpp.
#pragma once

#include <gpukit/memory/adaptors/detail/resource_adaptor_base.hpp>
#include <gpukit/stats.hpp>

#include <atomic>
#include <cstddef>
#include <cstdint>

namespace gpukit {

/// What a statistics_resource_adaptor counted, in gpukit's vocabulary (gpukit/stats.hpp):
/// `current` and `peak`, and the totals `allocated` and `freed` since construction.
struct resource_stats {
  stat_totals bytes;        ///< bytes as requested
  stat_totals allocations;  ///< allocations
};

/// Counts the bytes and allocations that go through it (see the top of this header): current,
/// peak, and totals allocated and freed. Each allocation and free updates shared atomics (a
/// fetch_add per counter and a compare-exchange when a peak rises), never a lock; concurrent
/// threads contend on those cache lines only. Counts change after the upstream succeeded, so a
/// failed call counts nothing. Thread-safe when the upstream is.
///
/// @tparam Upstream any resource with gpukit's or CCCL's interface (held by reference)
template <class Upstream>
class statistics_resource_adaptor final
    : public detail::resource_adaptor_base<statistics_resource_adaptor<Upstream>, Upstream> {
  using base = detail::resource_adaptor_base<statistics_resource_adaptor<Upstream>, Upstream>;
  friend base;

 public:
  using typename base::stream_type;

  /// Counts what is allocated from `upstream` (which must outlive the adaptor) through it.
  explicit statistics_resource_adaptor(Upstream& upstream) noexcept : base{upstream} {}
  ~statistics_resource_adaptor() = default;

  statistics_resource_adaptor(statistics_resource_adaptor const&)            = delete;
  statistics_resource_adaptor& operator=(statistics_resource_adaptor const&) = delete;
  statistics_resource_adaptor(statistics_resource_adaptor&&)                 = delete;
  statistics_resource_adaptor& operator=(statistics_resource_adaptor&&)      = delete;

  /// The counts now: each field is read atomically, the fields one after another (a call racing
  /// with allocations may see one counted and not the other). Never throws.
  [[nodiscard]] resource_stats stats() const noexcept
  {
    return {bytes_.read(), allocations_.read()};
  }
  /// Sets each peak to its current value (PyTorch's reset_peak_memory_stats). Never throws.
  void reset_peak() noexcept
  {
    bytes_.reset_peak();
    allocations_.reset_peak();
  }

 private:
  /// One statistic as atomics.
  struct counter {
    std::atomic<std::int64_t> current{0};
    std::atomic<std::int64_t> peak{0};
    std::atomic<std::int64_t> allocated{0};
    std::atomic<std::int64_t> freed{0};

    void add(std::int64_t n) noexcept
    {
      allocated.fetch_add(n, std::memory_order_relaxed);
      std::int64_t const now = current.fetch_add(n, std::memory_order_relaxed) + n;
      std::int64_t seen      = peak.load(std::memory_order_relaxed);
      while (seen < now && !peak.compare_exchange_weak(seen, now, std::memory_order_relaxed)) {}
    }
    void sub(std::int64_t n) noexcept
    {
      freed.fetch_add(n, std::memory_order_relaxed);
      current.fetch_sub(n, std::memory_order_relaxed);
    }
    void reset_peak() noexcept
    {
      peak.store(current.load(std::memory_order_relaxed), std::memory_order_relaxed);
    }
    [[nodiscard]] stat_totals read() const noexcept
    {
      return {current.load(std::memory_order_relaxed), peak.load(std::memory_order_relaxed),
              allocated.load(std::memory_order_relaxed), freed.load(std::memory_order_relaxed)};
    }
  };

  template <class Allocate>
  void* do_allocate(std::size_t bytes, stream_type, Allocate&& allocate)
  {
    return allocate.then_record([&](void*) {
      bytes_.add(static_cast<std::int64_t>(bytes));
      allocations_.add(1);
    });
  }

  template <class Deallocate>
  void do_deallocate(void*, std::size_t bytes, stream_type, Deallocate&& deallocate)
  {
    deallocate();
    bytes_.sub(static_cast<std::int64_t>(bytes));
    allocations_.sub(1);
  }

  counter bytes_;
  counter allocations_;
};

#if GPUKIT_HAS_CCCL_MEMORY_RESOURCE
static_assert(
  detail::is_device_async_resource_v<statistics_resource_adaptor<detail::cccl_archetype_resource>>,
  "a statistics_resource_adaptor must be the CCCL resource its upstream is");
#endif

}  // namespace gpukit
