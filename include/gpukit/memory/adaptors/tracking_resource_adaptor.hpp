// SPDX-License-Identifier: Apache-2.0
// gpukit/memory/adaptors/tracking_resource_adaptor.hpp: remembers every allocation that goes
// through a resource until it is freed, to report leaks (RMM's tracking_resource_adaptor), over
// any gpukit or CCCL memory resource.
//
// Quick start:
//
//   #include <gpukit/memory/adaptors/tracking_resource_adaptor.hpp>
//   #include <gpukit/memory/caching_allocator.hpp>
//
//   #include <iostream>
//
//   void step(gpukit::caching_allocator& alloc, cudaStream_t stream)
//   {
//     gpukit::tracking_resource_adaptor tracked{alloc, &std::cerr};  // leaks reported at its end
//     void* p = tracked.allocate_async(1 << 20, stream);
//     for (gpukit::tracked_allocation const& a : tracked.outstanding()) {
//       std::cout << a.ptr << ": " << a.bytes << " bytes\n";  // p: 1048576 bytes
//     }
//     std::cout << tracked.leak_report();  // the same, as text
//     tracked.deallocate_async(p, 1 << 20, stream);
//   }
//
// What adaptors share (upstream by reference, entry points and CCCL concepts of the upstream, no
// virtual call) is at the top of gpukit/memory/adaptors/limiting_resource_adaptor.hpp.
#pragma once

#include <gpukit/detail/hex.hpp>
#include <gpukit/error.hpp>
#include <gpukit/error_macros.hpp>
#include <gpukit/memory/adaptors/detail/resource_adaptor_base.hpp>

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <ostream>
#include <string>
#include <unordered_map>
#include <vector>

namespace gpukit {

/// One allocation a tracking_resource_adaptor has handed out and not taken back.
struct tracked_allocation {
  void* ptr{nullptr};
  std::size_t bytes{0};       ///< as requested
  std::uintptr_t stream{0};   ///< the stream it was allocated on, as a number (0: default stream)
  std::uint64_t sequence{0};  ///< 1 for the adaptor's first allocation, 2 for the next, ...
};

/// Remembers each allocation (pointer, size, stream) until it is freed (see the top of this
/// header); reports what is still allocated on demand and, when given a stream at construction,
/// at its destruction. Its map takes one lock per allocation and free (uncontended: about the
/// cost of an unordered_map insert). Checks every free: a pointer it did not hand out, or a size
/// other than the one allocated, is refused before the upstream sees it. Thread-safe when the
/// upstream is.
///
/// @tparam Upstream any resource with gpukit's or CCCL's interface (held by reference)
template <class Upstream>
class tracking_resource_adaptor final
    : public detail::resource_adaptor_base<tracking_resource_adaptor<Upstream>, Upstream> {
  using base = detail::resource_adaptor_base<tracking_resource_adaptor<Upstream>, Upstream>;
  friend base;

 public:
  using typename base::stream_type;

  /// Tracks what is allocated from `upstream` (which must outlive the adaptor) through it. When
  /// `report_at_destruction` is not null, the destructor writes leak_report() there if anything
  /// is still allocated (the stream must outlive the adaptor).
  explicit tracking_resource_adaptor(Upstream& upstream,
                                     std::ostream* report_at_destruction = nullptr) noexcept
      : base{upstream}, report_at_destruction_{report_at_destruction}
  {}
  /// Writes the leak report (see the constructor). Frees nothing: what is still allocated stays
  /// the upstream's. Never throws.
  ~tracking_resource_adaptor()
  {
    if (report_at_destruction_ == nullptr || outstanding_bytes() == 0) { return; }
    try {
      *report_at_destruction_ << leak_report() << std::flush;
    } catch (...) {  // a destructor never throws; the report is lost
    }
  }

  tracking_resource_adaptor(tracking_resource_adaptor const&)            = delete;
  tracking_resource_adaptor& operator=(tracking_resource_adaptor const&) = delete;
  tracking_resource_adaptor(tracking_resource_adaptor&&)                 = delete;
  tracking_resource_adaptor& operator=(tracking_resource_adaptor&&)      = delete;

  /// What is allocated through the adaptor now, oldest first. Takes the lock.
  [[nodiscard]] std::vector<tracked_allocation> outstanding() const
  {
    std::vector<tracked_allocation> all;
    {
      std::lock_guard<std::mutex> lock{mutex_};
      all.reserve(live_.size());
      for (auto const& [ptr, a] : live_) { all.push_back(a); }
    }
    std::sort(all.begin(), all.end(),
              [](auto const& x, auto const& y) { return x.sequence < y.sequence; });
    return all;
  }
  /// Bytes allocated through the adaptor now (one atomic load, no lock).
  [[nodiscard]] std::size_t outstanding_bytes() const noexcept
  {
    return bytes_.load(std::memory_order_relaxed);
  }
  /// outstanding() as text: a line saying how many allocations and bytes are still allocated,
  /// then one line each: "  <ptr>: <bytes> bytes on stream <stream>, allocation <sequence>".
  /// "nothing is still allocated" when nothing is.
  [[nodiscard]] std::string leak_report() const
  {
    std::vector<tracked_allocation> const all = outstanding();
    std::size_t bytes                         = 0;
    for (auto const& a : all) { bytes += a.bytes; }
    std::string s = "gpukit: tracking_resource_adaptor: ";
    if (all.empty()) { return s + "nothing is still allocated\n"; }
    s += std::to_string(all.size()) + " allocation" + (all.size() == 1 ? "" : "s") + " (" +
         std::to_string(bytes) + " bytes) still allocated:\n";
    for (auto const& a : all) {
      s += "  " + detail::hex(a.ptr) + ": " + std::to_string(a.bytes) + " bytes on stream " +
           detail::hex(a.stream) + ", allocation " + std::to_string(a.sequence) + "\n";
    }
    return s;
  }

 private:
  template <class Allocate>
  void* do_allocate(std::size_t bytes, stream_type stream, Allocate&& allocate)
  {
    // A map that cannot grow gives the memory back, as if it never came.
    void* p = allocate.then_record([&](void* q) {
      std::lock_guard<std::mutex> lock{mutex_};
      live_[q] = tracked_allocation{q, bytes, detail::stream_number(stream), ++sequence_};
    });
    if (p != nullptr) { bytes_.fetch_add(bytes, std::memory_order_relaxed); }
    return p;
  }

  /// @throws gpukit::logic_error naming the pointer for one not allocated through this adaptor
  ///         (or freed already), and naming both sizes for a size other than the one allocated;
  ///         nothing changes then, and the upstream is not called
  template <class Deallocate>
  void do_deallocate(void* p, std::size_t bytes, stream_type, Deallocate&& deallocate)
  {
    tracked_allocation taken;
    {
      std::lock_guard<std::mutex> lock{mutex_};
      auto it = live_.find(p);
      GPUKIT_EXPECTS(it != live_.end(), "tracking_resource_adaptor: deallocation of " +
                                          detail::hex(p) +
                                          ", which is not allocated through this adaptor "
                                          "(never allocated, or freed already)");
      GPUKIT_EXPECTS(it->second.bytes == bytes,
                     "tracking_resource_adaptor: deallocation of " + detail::hex(p) + " with " +
                       std::to_string(bytes) + " bytes; it was allocated with " +
                       std::to_string(it->second.bytes) + " bytes");
      taken = it->second;
      live_.erase(it);
    }
    try {
      deallocate();
    } catch (...) {  // the upstream refused: the allocation is still there
      std::lock_guard<std::mutex> lock{mutex_};
      live_.emplace(p, taken);
      throw;
    }
    bytes_.fetch_sub(bytes, std::memory_order_relaxed);
  }

  mutable std::mutex mutex_;  // guards live_ and sequence_
  std::unordered_map<void*, tracked_allocation> live_;
  std::uint64_t sequence_{0};
  std::atomic<std::size_t> bytes_{0};
  std::ostream* report_at_destruction_;
};

#if GPUKIT_HAS_CCCL_MEMORY_RESOURCE
static_assert(
  detail::is_device_async_resource_v<tracking_resource_adaptor<detail::cccl_archetype_resource>>,
  "a tracking_resource_adaptor must be the CCCL resource its upstream is");
#endif

}  // namespace gpukit
