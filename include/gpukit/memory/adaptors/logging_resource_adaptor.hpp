// SPDX-License-Identifier: Apache-2.0
// gpukit/memory/adaptors/logging_resource_adaptor.hpp: writes every allocation and free that goes
// through a resource as an allocation trace (gpukit/memory/allocation_trace.hpp), which
// benchmarks/memory/replay_trace replays against any allocator (RMM's logging_resource_adaptor,
// in the format gpukit reads), over any gpukit or CCCL memory resource.
//
// Quick start:
//
//   #include <gpukit/memory/adaptors/logging_resource_adaptor.hpp>
//   #include <gpukit/memory/allocation_trace.hpp>
//   #include <gpukit/memory/caching_allocator.hpp>
//
//   #include <fstream>
//
//   void step(gpukit::caching_allocator& alloc, cudaStream_t stream)
//   {
//     {
//       std::ofstream log{"step.trace"};
//       gpukit::logging_resource_adaptor logged{alloc, log};
//       void* p = logged.allocate_async(1 << 20, stream);  // a <address> 1048576 <stream>
//       logged.deallocate_async(p, 1 << 20, stream);       // f <address>
//     }
//     std::ifstream in{"step.trace"};
//     gpukit::allocation_trace const t = gpukit::read_allocation_trace(in, "step.trace");
//     (void)t.peak_live_bytes;  // 1048576
//   }
//
// The trace: a `#` comment line first, then one line per event, `a <id> <bytes> <stream>` for an
// allocation and `f <id>` for its free, where the id is the block's address and the stream its
// handle's value (0: the default stream), both in decimal. Allocations that fail are not written;
// neither are null pointers (what some resources return for 0 bytes).
//
// What adaptors share (upstream by reference, entry points and CCCL concepts of the upstream, no
// virtual call) is at the top of gpukit/memory/adaptors/limiting_resource_adaptor.hpp.
#pragma once

#include <gpukit/memory/adaptors/detail/resource_adaptor_base.hpp>

#include <cstddef>
#include <cstdint>
#include <mutex>
#include <ostream>

namespace gpukit {

/// Writes each allocation and free as a line of an allocation trace (see the top of this header).
/// One lock orders the lines: an allocation writes its line after the upstream returned; a free
/// holds the lock from before the upstream's free until its line is written, so that a block
/// handed out again at once (by a caching upstream, to another thread) is never written as
/// allocated before its free. Costs a lock and a formatted write per call, and frees through the
/// adaptor are serialized: a debugging and tracing tool, not for the hot path of production. The
/// stream is not flushed (call flush(), or let it flush itself). Thread-safe when the upstream is.
///
/// @tparam Upstream any resource with gpukit's or CCCL's interface (held by reference)
template <class Upstream>
class logging_resource_adaptor final
    : public detail::resource_adaptor_base<logging_resource_adaptor<Upstream>, Upstream> {
  using base = detail::resource_adaptor_base<logging_resource_adaptor<Upstream>, Upstream>;
  friend base;

 public:
  using typename base::stream_type;

  /// Logs what is allocated from `upstream` through it to `log`; both must outlive the adaptor.
  /// Writes the trace's comment line at once. Never throws unless `log` has exceptions enabled.
  logging_resource_adaptor(Upstream& upstream, std::ostream& log) : base{upstream}, log_{log}
  {
    log_ << "# gpukit logging_resource_adaptor: a <address> <bytes> <stream>, f <address>\n";
  }
  ~logging_resource_adaptor() = default;

  logging_resource_adaptor(logging_resource_adaptor const&)            = delete;
  logging_resource_adaptor& operator=(logging_resource_adaptor const&) = delete;
  logging_resource_adaptor(logging_resource_adaptor&&)                 = delete;
  logging_resource_adaptor& operator=(logging_resource_adaptor&&)      = delete;

  /// Flushes the log. Takes the lock.
  void flush()
  {
    std::lock_guard<std::mutex> lock{mutex_};
    log_.flush();
  }

 private:
  template <class Allocate>
  void* do_allocate(std::size_t bytes, stream_type stream, Allocate&& allocate)
  {
    // A log with exceptions enabled that fails undoes the allocation.
    return allocate.then_record([&](void* p) {
      std::lock_guard<std::mutex> lock{mutex_};
      log_ << "a " << reinterpret_cast<std::uintptr_t>(p) << ' ' << bytes << ' '
           << detail::stream_number(stream) << '\n';
    });
  }

  template <class Deallocate>
  void do_deallocate(void* p, std::size_t, stream_type, Deallocate&& deallocate)
  {
    auto const id = reinterpret_cast<std::uintptr_t>(p);  // read before the block is freed
    std::lock_guard<std::mutex> lock{mutex_};
    deallocate();
    log_ << "f " << id << '\n';
  }

  std::mutex mutex_;  // guards log_ and orders its lines (see the class)
  std::ostream& log_;
};

#if GPUKIT_HAS_CCCL_MEMORY_RESOURCE
static_assert(
  detail::is_device_async_resource_v<logging_resource_adaptor<detail::cccl_archetype_resource>>,
  "a logging_resource_adaptor must be the CCCL resource its upstream is");
#endif

}  // namespace gpukit
