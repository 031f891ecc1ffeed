// SPDX-License-Identifier: Apache-2.0
// gpukit/memory/adaptors/detail/resource_adaptor_base.hpp: what every resource adaptor shares, so
// that each adaptor holds only its own concern. Not public API.
//
// - The entry points of the upstream, each present on the adaptor exactly when the upstream has
//   it, with the same signature, and routed through the adaptor's two hooks:
//     gpukit's       allocate_async(bytes, stream), deallocate_async(p, bytes, stream),
//                    allocate(bytes), deallocate(p, bytes)            (default stream)
//     CCCL 3.0's     allocate(bytes, align), deallocate(p, bytes, align),
//                    allocate_async(bytes, align, stream_ref), deallocate_async(p, bytes, align,
//                    ref)
//     CCCL 3.1's     allocate_sync(bytes, align), deallocate_sync(p, bytes, align),
//                    allocate(stream_ref, bytes, align), deallocate(stream_ref, p, bytes, align)
//   so an adaptor satisfies whichever CCCL memory-resource concepts its upstream satisfies.
// - The upstream's memory-access properties (device_accessible, host_accessible), its
//   `runtime_type`, `runtime()` and `device()` (what gpukit's RAII types need).
// - Identity equality: memory is freed through the adaptor object that allocated it.
//
// The derived adaptor (CRTP, no virtual call) declares `friend base;` and two private hooks:
//
//   template <class Allocate>   // allocate(): void*, calls the upstream; allocate.undo(p) frees p
//   void* do_allocate(std::size_t bytes, stream_type stream, Allocate&& allocate);
//   template <class Deallocate> // Deallocate: void() calls the upstream
//   void do_deallocate(void* p, std::size_t bytes, stream_type stream, Deallocate&& deallocate);
//
// A hook that only notes each allocation calls allocate.then_record(f): the upstream, then f(p),
// with p given back should f throw.
//
// Synchronous entry points pass the default stream (a value-initialized stream_type). A null
// pointer's deallocation goes to the upstream without the hook (resources ignore it).
#pragma once

#include <gpukit/detail/cccl_compat.hpp>
#include <gpukit/error.hpp>
#include <gpukit/runtime/runtime.hpp>

#include <cuda_runtime_api.h>  // cudaStream_t: the stream of upstreams without a stream_type
#include <cuda/stream_ref>

#include <cstddef>
#include <cstdint>
#include <type_traits>
#include <utility>

namespace gpukit::detail {

/// The upstream's `stream_type`, else CUDA's stream (what cuda::stream_ref holds).
template <class U, class = void>
struct adaptor_stream_type {
  using type = cudaStream_t;
};
template <class U>
struct adaptor_stream_type<U, std::void_t<typename U::stream_type>> {
  using type = typename U::stream_type;
};

/// `runtime_type` where the upstream has one.
template <class U, class = void>
struct adaptor_runtime_type {};
template <class U>
struct adaptor_runtime_type<U, std::void_t<typename U::runtime_type>> {
  using runtime_type = typename U::runtime_type;
};

// Which entry points an upstream U has (S: its stream; R: a stream_ref-like type).
template <class U, class S, class = void>
inline constexpr bool has_gpukit_async_v = false;
template <class U, class S>
inline constexpr bool has_gpukit_async_v<
  U, S,
  std::void_t<decltype(std::declval<U&>().allocate_async(std::size_t{}, std::declval<S>())),
              decltype(std::declval<U&>().deallocate_async(std::declval<void*>(), std::size_t{},
                                                           std::declval<S>()))>> = true;
template <class U, class = void>
inline constexpr bool has_default_stream_v = false;
template <class U>
inline constexpr bool has_default_stream_v<
  U, std::void_t<decltype(std::declval<U&>().allocate(std::size_t{})),
                 decltype(std::declval<U&>().deallocate(std::declval<void*>(), std::size_t{}))>> =
  true;
template <class U, class = void>
inline constexpr bool has_cccl30_sync_v = false;
template <class U>
inline constexpr bool has_cccl30_sync_v<
  U, std::void_t<decltype(std::declval<U&>().allocate(std::size_t{}, std::size_t{})),
                 decltype(std::declval<U&>().deallocate(std::declval<void*>(), std::size_t{},
                                                        std::size_t{}))>> = true;
template <class U, class R, class = void>
inline constexpr bool has_cccl30_async_v = false;
template <class U, class R>
inline constexpr bool has_cccl30_async_v<
  U, R,
  std::void_t<decltype(std::declval<U&>().allocate_async(std::size_t{}, std::size_t{},
                                                         std::declval<R>())),
              decltype(std::declval<U&>().deallocate_async(
                std::declval<void*>(), std::size_t{}, std::size_t{}, std::declval<R>()))>> = true;
template <class U, class = void>
inline constexpr bool has_cccl31_sync_v = false;
template <class U>
inline constexpr bool has_cccl31_sync_v<
  U, std::void_t<decltype(std::declval<U&>().allocate_sync(std::size_t{}, std::size_t{})),
                 decltype(std::declval<U&>().deallocate_sync(std::declval<void*>(), std::size_t{},
                                                             std::size_t{}))>> = true;
template <class U, class R, class = void>
inline constexpr bool has_cccl31_async_v = false;
template <class U, class R>
inline constexpr bool has_cccl31_async_v<
  U, R,
  std::void_t<decltype(std::declval<U&>().allocate(std::declval<R>(), std::size_t{},
                                                   std::size_t{})),
              decltype(std::declval<U&>().deallocate(std::declval<R>(), std::declval<void*>(),
                                                     std::size_t{}, std::size_t{}))>> = true;

/// Whether `get_property(u, P{})` is valid for an upstream U (found by argument-dependent lookup).
template <class U, class P, class = void>
inline constexpr bool upstream_has_property_v = false;
template <class U, class P>
inline constexpr bool upstream_has_property_v<
  U, P, std::void_t<decltype(get_property(std::declval<U const&>(), std::declval<P>()))>> = true;

/// The properties adaptors forward: the memory-access tags gpukit's resources declare.
template <class P>
inline constexpr bool is_forwarded_property_v =
  std::is_same_v<P, cccl_device_accessible> || std::is_same_v<P, cccl_host_accessible>;

/// A stream as the number that traces and reports print (its handle's value; 0: default stream).
template <class S>
std::uintptr_t stream_number(S stream) noexcept
{
  if constexpr (std::is_pointer_v<S>) {
    return reinterpret_cast<std::uintptr_t>(stream);
  } else {
    return static_cast<std::uintptr_t>(stream);
  }
}

template <class U, class = void>
inline constexpr bool has_device_v = false;
template <class U>
inline constexpr bool has_device_v<U, std::void_t<decltype(std::declval<U const&>().device())>> =
  true;
template <class U, class = void>
inline constexpr bool has_runtime_v = false;
template <class U>
inline constexpr bool has_runtime_v<U, std::void_t<decltype(std::declval<U const&>().runtime())>> =
  true;

/// An out-of-memory report for a request of `bytes` that an adaptor refuses: the upstream's device
/// (-1 when it does not say) and, when the upstream has a runtime, that device's memory as the
/// runtime reports it (left 0 when it cannot be read: the report is being made for an error).
template <class U>
oom_report adaptor_oom_report(U const& upstream, std::size_t bytes)
{
  oom_report r;
  r.requested = bytes;
  if constexpr (has_device_v<U>) { r.device = upstream.device(); }
  if constexpr (has_device_v<U> && has_runtime_v<U>) {
    try {
      auto& rt = upstream.runtime();
      device_guard<std::remove_reference_t<decltype(rt)>> guard{rt, r.device};
      if (!is_success(rt.mem_get_info(r.device_free, r.device_total))) {
        r.device_free = r.device_total = 0;
      }
    } catch (...) {  // the device cannot be read: the report says 0
    }
  }
  return r;
}

/// The upstream call an adaptor's allocation hook makes: `allocate()` calls the upstream;
/// `undo(p)` gives `p` back through the matching free (same stream, size and alignment), for a hook
/// that fails after the upstream succeeded (its own error is what the caller gets);
/// `then_record(record)` does both, for a hook that notes each allocation.
template <class Allocate, class GiveBack>
struct upstream_allocation {
  Allocate allocate;
  GiveBack give_back;

  void* operator()() { return allocate(); }
  void undo(void* p) noexcept
  {
    try {
      give_back(p);
    } catch (...) {  // the hook's error is the one reported
    }
  }
  /// Calls the upstream, then `record(p)` unless it returned null. Should `record` throw, `p` goes
  /// back to the upstream (undo) and the error propagates: as if nothing was allocated.
  template <class Record>
  void* then_record(Record&& record)
  {
    void* p = allocate();
    if (p == nullptr) { return p; }
    try {
      record(p);
    } catch (...) {
      undo(p);
      throw;
    }
    return p;
  }
};
template <class Allocate, class GiveBack>
upstream_allocation(Allocate, GiveBack) -> upstream_allocation<Allocate, GiveBack>;

/// The shared part of every resource adaptor (see the top of this header).
template <class Derived, class Upstream>
class resource_adaptor_base : public adaptor_runtime_type<Upstream> {
 public:
  using upstream_type = Upstream;
  using stream_type   = typename adaptor_stream_type<Upstream>::type;

  /// The resource this adaptor allocates from.
  [[nodiscard]] Upstream& upstream_resource() const noexcept { return upstream_; }

  /// The upstream's runtime (gpukit's resources have one).
  template <class U = Upstream>
  [[nodiscard]] auto runtime() const noexcept -> decltype(std::declval<U const&>().runtime())
  {
    return upstream_.runtime();
  }
  /// The upstream's device (gpukit's resources have one).
  template <class U = Upstream>
  [[nodiscard]] auto device() const noexcept -> decltype(std::declval<U const&>().device())
  {
    return upstream_.device();
  }

  // gpukit's names.
  template <class U = Upstream, std::enable_if_t<has_gpukit_async_v<U, stream_type>, int> = 0>
  [[nodiscard]] void* allocate_async(std::size_t bytes, stream_type stream)
  {
    return self().do_allocate(
      bytes, stream,
      upstream_allocation{[&]() -> void* { return upstream_.allocate_async(bytes, stream); },
                          [&](void* p) { upstream_.deallocate_async(p, bytes, stream); }});
  }
  template <class U = Upstream, std::enable_if_t<has_gpukit_async_v<U, stream_type>, int> = 0>
  void deallocate_async(void* ptr, std::size_t bytes, stream_type stream)
  {
    deallocate_through(ptr, bytes, stream, [&] { upstream_.deallocate_async(ptr, bytes, stream); });
  }
  template <class U = Upstream, std::enable_if_t<has_default_stream_v<U>, int> = 0>
  [[nodiscard]] void* allocate(std::size_t bytes)
  {
    return self().do_allocate(
      bytes, stream_type{},
      upstream_allocation{[&]() -> void* { return upstream_.allocate(bytes); },
                          [&](void* p) { upstream_.deallocate(p, bytes); }});
  }
  template <class U = Upstream, std::enable_if_t<has_default_stream_v<U>, int> = 0>
  void deallocate(void* ptr, std::size_t bytes)
  {
    deallocate_through(ptr, bytes, stream_type{}, [&] { upstream_.deallocate(ptr, bytes); });
  }

  // CCCL 3.0's names.
  template <class U = Upstream, std::enable_if_t<has_cccl30_sync_v<U>, int> = 0>
  [[nodiscard]] void* allocate(std::size_t bytes, std::size_t align)
  {
    return self().do_allocate(
      bytes, stream_type{},
      upstream_allocation{[&]() -> void* { return upstream_.allocate(bytes, align); },
                          [&](void* p) { upstream_.deallocate(p, bytes, align); }});
  }
  template <class U = Upstream, std::enable_if_t<has_cccl30_sync_v<U>, int> = 0>
  void deallocate(void* ptr, std::size_t bytes, std::size_t align)
  {
    deallocate_through(ptr, bytes, stream_type{}, [&] { upstream_.deallocate(ptr, bytes, align); });
  }
  template <class StreamRef, class U = Upstream,
            std::enable_if_t<has_cccl30_async_v<U, StreamRef>, int> = 0>
  [[nodiscard]] void* allocate_async(std::size_t bytes, std::size_t align, StreamRef stream)
  {
    return self().do_allocate(
      bytes, stream_type(stream.get()),
      upstream_allocation{[&]() -> void* { return upstream_.allocate_async(bytes, align, stream); },
                          [&](void* p) { upstream_.deallocate_async(p, bytes, align, stream); }});
  }
  template <class StreamRef, class U = Upstream,
            std::enable_if_t<has_cccl30_async_v<U, StreamRef>, int> = 0>
  void deallocate_async(void* ptr, std::size_t bytes, std::size_t align, StreamRef stream)
  {
    deallocate_through(ptr, bytes, stream_type(stream.get()),
                       [&] { upstream_.deallocate_async(ptr, bytes, align, stream); });
  }

  // CCCL 3.1's names.
  template <class U = Upstream, std::enable_if_t<has_cccl31_sync_v<U>, int> = 0>
  [[nodiscard]] void* allocate_sync(std::size_t bytes, std::size_t align)
  {
    return self().do_allocate(
      bytes, stream_type{},
      upstream_allocation{[&]() -> void* { return upstream_.allocate_sync(bytes, align); },
                          [&](void* p) { upstream_.deallocate_sync(p, bytes, align); }});
  }
  template <class U = Upstream, std::enable_if_t<has_cccl31_sync_v<U>, int> = 0>
  void deallocate_sync(void* ptr, std::size_t bytes, std::size_t align)
  {
    deallocate_through(ptr, bytes, stream_type{},
                       [&] { upstream_.deallocate_sync(ptr, bytes, align); });
  }
  template <class StreamRef, class U = Upstream,
            std::enable_if_t<has_cccl31_async_v<U, StreamRef>, int> = 0>
  [[nodiscard]] void* allocate(StreamRef stream, std::size_t bytes, std::size_t align)
  {
    return self().do_allocate(
      bytes, stream_type(stream.get()),
      upstream_allocation{[&]() -> void* { return upstream_.allocate(stream, bytes, align); },
                          [&](void* p) { upstream_.deallocate(stream, p, bytes, align); }});
  }
  template <class StreamRef, class U = Upstream,
            std::enable_if_t<has_cccl31_async_v<U, StreamRef>, int> = 0>
  void deallocate(StreamRef stream, void* ptr, std::size_t bytes, std::size_t align)
  {
    deallocate_through(ptr, bytes, stream_type(stream.get()),
                       [&] { upstream_.deallocate(stream, ptr, bytes, align); });
  }

  /// The upstream's memory-access properties (for CCCL's property queries).
  template <class P, std::enable_if_t<
                       is_forwarded_property_v<P> && upstream_has_property_v<Upstream, P>, int> = 0>
  friend void get_property(Derived const&, P) noexcept
  {}
  /// Two adaptors are equal when they are the same object: memory is freed through the adaptor
  /// that allocated it, so that its accounting stays right.
  friend bool operator==(Derived const& a, Derived const& b) noexcept { return &a == &b; }
  friend bool operator!=(Derived const& a, Derived const& b) noexcept { return &a != &b; }

 protected:
  explicit resource_adaptor_base(Upstream& upstream) noexcept : upstream_{upstream} {}
  ~resource_adaptor_base() = default;

  resource_adaptor_base(resource_adaptor_base const&)            = delete;
  resource_adaptor_base& operator=(resource_adaptor_base const&) = delete;
  resource_adaptor_base(resource_adaptor_base&&)                 = delete;
  resource_adaptor_base& operator=(resource_adaptor_base&&)      = delete;

 private:
  Derived& self() noexcept { return static_cast<Derived&>(*this); }

  template <class Deallocate>
  void deallocate_through(void* ptr, std::size_t bytes, stream_type stream, Deallocate&& dealloc)
  {
    if (ptr == nullptr) {
      dealloc();
      return;
    }
    self().do_deallocate(ptr, bytes, stream, std::forward<Deallocate>(dealloc));
  }

  Upstream& upstream_;
};

#if GPUKIT_HAS_CCCL_MEMORY_RESOURCE
/// The smallest stream-ordered, device-accessible resource of the CCCL in use (declarations only):
/// what each adaptor header checks itself over, right after its class, without including a real
/// resource.
struct cccl_archetype_resource {
  void* allocate(std::size_t bytes, std::size_t align);
  void deallocate(void* p, std::size_t bytes, std::size_t align);
  void* allocate_sync(std::size_t bytes, std::size_t align);
  void deallocate_sync(void* p, std::size_t bytes, std::size_t align);
  void* allocate_async(std::size_t bytes, std::size_t align, ::cuda::stream_ref stream);
  void deallocate_async(void* p, std::size_t bytes, std::size_t align, ::cuda::stream_ref stream);
  void* allocate(::cuda::stream_ref stream, std::size_t bytes, std::size_t align);
  void deallocate(::cuda::stream_ref stream, void* p, std::size_t bytes, std::size_t align);
  friend bool operator==(cccl_archetype_resource const&, cccl_archetype_resource const&);
  friend bool operator!=(cccl_archetype_resource const&, cccl_archetype_resource const&);
  friend void get_property(cccl_archetype_resource const&, cccl_device_accessible) noexcept {}
};
static_assert(is_device_async_resource_v<cccl_archetype_resource>);
#endif

}  // namespace gpukit::detail
