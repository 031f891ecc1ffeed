// SPDX-License-Identifier: Apache-2.0
// gpukit/runtime/detail/sim_runtime_memory_impl.hpp: devices, device memory and pinned host memory
// of gpukit::sim_runtime. Not public API; included by gpukit/runtime/detail/sim_runtime_impl.hpp
// (its header comment describes the locking).
#pragma once

#include <gpukit/detail/compiled_mode.hpp>

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

// ---- devices ----------------------------------------------------------------------------------

GPUKIT_DETAIL_COMPILED_INLINE cudaError_t sim_runtime::device_count(int& n)
{
  if (auto e = enter(sim_op::device_count); e != cudaSuccess) { return e; }
  n = static_cast<int>(devices_.size());
  return cudaSuccess;
}

GPUKIT_DETAIL_COMPILED_INLINE cudaError_t sim_runtime::get_device(int& d)
{
  if (auto e = enter(sim_op::get_device); e != cudaSuccess) { return e; }
  d = current_device();
  return cudaSuccess;
}

GPUKIT_DETAIL_COMPILED_INLINE cudaError_t sim_runtime::set_device(int d)
{
  if (auto e = enter(sim_op::set_device); e != cudaSuccess) { return e; }
  if (!valid_device(d)) { return bad_device("set_device", d); }
  detail::sim_thread_device(serial_) = d;
  return cudaSuccess;
}

GPUKIT_DETAIL_COMPILED_INLINE cudaError_t sim_runtime::get_device_properties(device_properties& p,
                                                                             int d)
{
  if (auto e = enter(sim_op::get_device_properties); e != cudaSuccess) { return e; }
  if (!valid_device(d)) { return bad_device("get_device_properties", d); }
  p                           = device_properties{};
  p.name                      = config_.device_name;
  p.ordinal                   = d;
  p.major                     = 9;
  p.minor                     = 0;
  p.total_memory              = capacity(d);
  p.multiprocessor_count      = 132;
  p.async_engine_count        = 2;
  p.pci_domain_id             = 0;
  p.pci_bus_id                = d;
  p.pci_device_id             = 0;
  p.ecc_enabled               = config_.ecc_enabled;
  p.unified_addressing        = true;
  p.virtual_memory_management = config_.virtual_memory;
  p.memory_pools              = true;
  p.simulated                 = true;
  return cudaSuccess;
}

GPUKIT_DETAIL_COMPILED_INLINE cudaError_t sim_runtime::mem_get_info(std::size_t& free,
                                                                    std::size_t& total)
{
  if (auto e = enter(sim_op::mem_get_info); e != cudaSuccess) { return e; }
  auto const& dev = *devices_[static_cast<std::size_t>(current_device())];
  total           = dev.capacity.load(std::memory_order_relaxed);
  free            = dev.free_bytes();
  return cudaSuccess;
}

GPUKIT_DETAIL_COMPILED_INLINE cudaError_t sim_runtime::driver_version(int& v)
{
  if (auto e = enter(sim_op::driver_version); e != cudaSuccess) { return e; }
  v = 13000;
  return cudaSuccess;
}

GPUKIT_DETAIL_COMPILED_INLINE cudaError_t sim_runtime::runtime_version(int& v)
{
  if (auto e = enter(sim_op::runtime_version); e != cudaSuccess) { return e; }
  v = 13000;
  return cudaSuccess;
}

GPUKIT_DETAIL_COMPILED_INLINE cudaError_t sim_runtime::device_synchronize()
{
  synchronizations_.fetch_add(1, std::memory_order_relaxed);
  if (auto e = enter(sim_op::device_synchronize); e != cudaSuccess) { return e; }
  wait_device(current_device());
  return cudaSuccess;
}

GPUKIT_DETAIL_COMPILED_INLINE cudaError_t sim_runtime::device_can_access_peer(int& can, int device,
                                                                              int peer)
{
  if (auto e = enter(sim_op::device_can_access_peer); e != cudaSuccess) { return e; }
  if (!valid_device(device)) { return bad_device("device_can_access_peer", device); }
  if (!valid_device(peer)) { return bad_device("device_can_access_peer", peer); }
  can = config_.peer_access && device != peer ? 1 : 0;
  return cudaSuccess;
}

GPUKIT_DETAIL_COMPILED_INLINE cudaError_t sim_runtime::device_enable_peer_access(int peer)
{
  if (auto e = enter(sim_op::device_enable_peer_access); e != cudaSuccess) { return e; }
  int const d = current_device();
  if (!valid_device(peer)) { return bad_device("device_enable_peer_access", peer); }
  if (peer == d) {
    return misuse(cudaErrorInvalidDevice, "device_enable_peer_access(" + std::to_string(peer) +
                                            "): a device cannot be its own peer");
  }
  if (!config_.peer_access) {
    return misuse(cudaErrorPeerAccessUnsupported,
                  "device_enable_peer_access(" + std::to_string(peer) + ") with device " +
                    std::to_string(d) +
                    " current: this simulated GPU has no peer access (sim_config::peer_access)");
  }
  auto const bit  = std::uint64_t{1} << peer;
  auto const prev = peer_enabled_[static_cast<std::size_t>(d)].fetch_or(bit);
  return (prev & bit) != 0 ? cudaErrorPeerAccessAlreadyEnabled : cudaSuccess;
}

// ---- device memory ------------------------------------------------------------------------------

GPUKIT_DETAIL_COMPILED_INLINE cudaError_t sim_runtime::allocate(void** p, std::size_t bytes,
                                                                int device, bool async)
{
  auto& dev = *devices_[static_cast<std::size_t>(device)];
  if (bytes > std::numeric_limits<std::size_t>::max() - page_size_) {
    return cudaErrorMemoryAllocation;
  }
  std::size_t const mapped = (bytes + page_size_ - 1) / page_size_ * page_size_;
  if (!dev.try_charge(bytes)) { return cudaErrorMemoryAllocation; }
  void* m = ::mmap(nullptr, mapped, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (m == MAP_FAILED) {
    dev.uncharge(bytes);
    return cudaErrorMemoryAllocation;
  }
  {
    std::lock_guard<std::mutex> lock{mem_mutex_};
    detail::sim_allocation a;
    a.bytes                                           = bytes;
    a.mapped_bytes                                    = mapped;
    a.device                                          = device;
    a.async                                           = async;
    allocations_[reinterpret_cast<std::uintptr_t>(m)] = std::move(a);
  }
  *p = m;
  return cudaSuccess;
}

GPUKIT_DETAIL_COMPILED_INLINE std::string sim_runtime::describe_unknown(std::uintptr_t a) const
{
  if (auto it = allocations_.upper_bound(a); it != allocations_.begin()) {
    --it;
    if (a < it->first + it->second.mapped_bytes) {
      return "not the start of an allocation: it lies inside the allocation at " +
             detail::sim_hex(it->first) + " of " + std::to_string(it->second.bytes) + " bytes";
    }
  }
  if (host_allocs_.count(a) != 0) { return "pinned host memory from host_alloc (use host_free)"; }
  if (auto it = reservations_.upper_bound(a); it != reservations_.begin()) {
    --it;
    if (a < it->first + it->second.bytes) {
      return "a virtual-memory address from vm_reserve (use vm_unmap / vm_free)";
    }
  }
  if (std::find(recently_freed_.begin(), recently_freed_.end(), a) != recently_freed_.end()) {
    return "double free: the pointer was already freed";
  }
  return "pointer was never allocated by this simulated device";
}

GPUKIT_DETAIL_COMPILED_INLINE cudaError_t sim_runtime::malloc(void** p, std::size_t bytes)
{
  if (auto e = enter(sim_op::malloc); e != cudaSuccess) { return e; }
  if (p == nullptr) {
    return misuse(cudaErrorInvalidValue,
                  "malloc(nullptr, " + std::to_string(bytes) + "): the output pointer is null");
  }
  if (bytes == 0) {
    *p = nullptr;
    return cudaSuccess;
  }
  return allocate(p, bytes, current_device(), false);
}

GPUKIT_DETAIL_COMPILED_INLINE cudaError_t sim_runtime::find_freeable(char const* call, void* p,
                                                                     detail::sim_allocation*& found)
{
  auto const base        = reinterpret_cast<std::uintptr_t>(p);
  auto it                = allocations_.find(base);
  std::string const head = std::string{call} + "(" + detail::sim_hex(p) + "): ";
  if (it == allocations_.end()) {
    return misuse(cudaErrorInvalidValue, head + describe_unknown(base));
  }
  if (it->second.pending_free) {
    return misuse(cudaErrorInvalidValue,
                  head + "double free: the pointer was already freed with free_async");
  }
  if (it->second.imported) {
    return misuse(cudaErrorInvalidValue,
                  head + "memory opened with ipc_open_mem_handle (use ipc_close_mem_handle)");
  }
  found = &it->second;
  return cudaSuccess;
}

GPUKIT_DETAIL_COMPILED_INLINE void sim_runtime::remember_freed(std::uintptr_t base)
{
  recently_freed_.push_back(base);
  if (recently_freed_.size() > 4096) { recently_freed_.pop_front(); }
}

GPUKIT_DETAIL_COMPILED_INLINE void sim_runtime::forget_allocation(std::uintptr_t base)
{
  allocations_.erase(base);
  remember_freed(base);
}

GPUKIT_DETAIL_COMPILED_INLINE void sim_runtime::unmap_allocation(std::uintptr_t base,
                                                                 detail::sim_allocation const& a)
{
  ::munmap(reinterpret_cast<void*>(base), a.mapped_bytes);
  if (a.ipc_fd >= 0) { ::close(a.ipc_fd); }
  devices_[static_cast<std::size_t>(a.device)]->uncharge(a.bytes);
}

GPUKIT_DETAIL_COMPILED_INLINE cudaError_t sim_runtime::free(void* p)
{
  synchronizations_.fetch_add(1, std::memory_order_relaxed);
  if (auto e = enter(sim_op::free); e != cudaSuccess) { return e; }
  if (p == nullptr) { return cudaSuccess; }
  auto const base = reinterpret_cast<std::uintptr_t>(p);
  detail::sim_allocation a;
  {
    std::lock_guard<std::mutex> lock{mem_mutex_};
    detail::sim_allocation* found = nullptr;
    if (auto e = find_freeable("free", p, found); e != cudaSuccess) { return e; }
    a = *found;
    forget_allocation(base);
  }
  // cudaFree synchronizes: work already queued may still read or write this memory.
  wait_device(a.device);
  unmap_allocation(base, a);
  return cudaSuccess;
}

GPUKIT_DETAIL_COMPILED_INLINE cudaError_t sim_runtime::malloc_async(void** p, std::size_t bytes,
                                                                    stream_type s)
{
  if (auto e = enter(sim_op::malloc_async); e != cudaSuccess) { return e; }
  cudaError_t err = cudaSuccess;
  auto stream     = find_stream(s, "malloc_async", err);
  if (!stream) { return err; }
  if (capturing(stream->id)) {
    return misuse(cudaErrorStreamCaptureUnsupported,
                  "malloc_async(" + std::to_string(bytes) +
                    "): the stream is being captured: on CUDA this allocation would become a "
                    "node of the graph, freed only with it");
  }
  if (p == nullptr) {
    return misuse(cudaErrorInvalidValue, "malloc_async(nullptr, " + std::to_string(bytes) +
                                           "): the output pointer is null");
  }
  if (bytes == 0) {
    *p = nullptr;
    return cudaSuccess;
  }
  return allocate(p, bytes, stream->device, true);
}

GPUKIT_DETAIL_COMPILED_INLINE cudaError_t sim_runtime::free_async(void* p, stream_type s)
{
  if (auto e = enter(sim_op::free_async); e != cudaSuccess) { return e; }
  cudaError_t err = cudaSuccess;
  auto stream     = find_stream(s, "free_async", err);
  if (!stream) { return err; }
  if (p == nullptr) { return cudaSuccess; }
  auto const base = reinterpret_cast<std::uintptr_t>(p);
  detail::sim_allocation a;
  {
    std::lock_guard<std::mutex> lock{mem_mutex_};
    detail::sim_allocation* found = nullptr;
    if (auto e = find_freeable("free_async", p, found); e != cudaSuccess) { return e; }
    found->pending_free = true;
    a                   = *found;
  }
  auto release = [this, base, a] {
    {
      std::lock_guard<std::mutex> lock{mem_mutex_};
      forget_allocation(base);
    }
    unmap_allocation(base, a);
  };
  if (auto e = enqueue(*stream, std::move(release), "free_async"); e != cudaSuccess) {
    std::lock_guard<std::mutex> lock{mem_mutex_};
    allocations_[base].pending_free = false;
    return e;
  }
  return cudaSuccess;
}

// ---- pinned host memory -------------------------------------------------------------------------

GPUKIT_DETAIL_COMPILED_INLINE cudaError_t sim_runtime::host_alloc(void** p, std::size_t bytes,
                                                                  unsigned flags)
{
  if (auto e = enter(sim_op::host_alloc); e != cudaSuccess) { return e; }
  unsigned const known =
    host_alloc_flags::portable | host_alloc_flags::mapped | host_alloc_flags::write_combined;
  if (p == nullptr || (flags & ~known) != 0) {
    return misuse(cudaErrorInvalidValue,
                  "host_alloc(" + detail::sim_hex(p) + ", " + std::to_string(bytes) + ", flags " +
                    std::to_string(flags) + "): null output pointer or unknown flags");
  }
  if (bytes == 0) {
    *p = nullptr;
    return cudaSuccess;
  }
  if (bytes > std::numeric_limits<std::size_t>::max() - page_size_) {
    return cudaErrorMemoryAllocation;
  }
  std::size_t const mapped = (bytes + page_size_ - 1) / page_size_ * page_size_;
  void* m = ::mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (m == MAP_FAILED) { return cudaErrorMemoryAllocation; }
  {
    std::uint64_t const devices = (flags & host_alloc_flags::portable) != 0
                                    ? ~std::uint64_t{0}
                                    : std::uint64_t{1} << current_device();
    std::lock_guard<std::mutex> lock{mem_mutex_};
    host_allocs_[reinterpret_cast<std::uintptr_t>(m)] = mapped;
    pinned_for_[reinterpret_cast<std::uintptr_t>(m)]  = devices;
  }
  *p = m;
  return cudaSuccess;
}

GPUKIT_DETAIL_COMPILED_INLINE cudaError_t sim_runtime::host_free(void* p)
{
  synchronizations_.fetch_add(1, std::memory_order_relaxed);
  if (auto e = enter(sim_op::host_free); e != cudaSuccess) { return e; }
  if (p == nullptr) { return cudaSuccess; }
  auto const base    = reinterpret_cast<std::uintptr_t>(p);
  std::size_t mapped = 0;
  {
    std::lock_guard<std::mutex> lock{mem_mutex_};
    auto it = host_allocs_.find(base);
    if (it == host_allocs_.end()) {
      std::string why = "pointer was not allocated by host_alloc of this simulated GPU";
      if (std::find(recently_freed_.begin(), recently_freed_.end(), base) !=
          recently_freed_.end()) {
        why = "double free: the pointer was already freed";
      }
      return misuse(cudaErrorInvalidValue, "host_free(" + detail::sim_hex(p) + "): " + why);
    }
    mapped = it->second;
    host_allocs_.erase(it);
    pinned_for_.erase(base);
    remember_freed(base);
  }
  wait_all_devices();  // cudaFreeHost synchronizes: queued copies may still use the buffer
  ::munmap(p, mapped);
  return cudaSuccess;
}

GPUKIT_DETAIL_COMPILED_INLINE cudaError_t sim_runtime::host_register(void* p, std::size_t bytes,
                                                                     unsigned flags)
{
  if (auto e = enter(sim_op::host_register); e != cudaSuccess) { return e; }
  auto const args = "host_register(" + detail::sim_hex(p) + ", " + std::to_string(bytes) + ")";
  unsigned const known =
    host_register_flags::portable | host_register_flags::mapped | host_register_flags::read_only;
  if (p == nullptr || bytes == 0 || (flags & ~known) != 0) {
    return misuse(cudaErrorInvalidValue,
                  args + ": null pointer, zero bytes or unknown flags " + std::to_string(flags));
  }
  auto const a = reinterpret_cast<std::uintptr_t>(p);
  if (bytes > std::numeric_limits<std::uintptr_t>::max() - a) {
    return misuse(cudaErrorInvalidValue, args + ": the range wraps around the address space");
  }
  std::lock_guard<std::mutex> lock{mem_mutex_};
  if (place(p, 1).kind != placement::where::host) {
    return misuse(cudaErrorInvalidValue, args + ": the range is device memory");
  }
  auto overlaps = [&](std::map<std::uintptr_t, std::size_t> const& ranges) {
    auto it = ranges.lower_bound(a + bytes);  // first range starting at or after the end
    if (it == ranges.begin()) { return false; }
    --it;
    return it->first + it->second > a;
  };
  if (overlaps(host_registered_) || overlaps(host_allocs_)) {
    return misuse(cudaErrorHostMemoryAlreadyRegistered,
                  args + ": the range overlaps memory already registered or from host_alloc");
  }
  host_registered_[a] = bytes;
  pinned_for_[a]      = (flags & host_register_flags::portable) != 0
                          ? ~std::uint64_t{0}
                          : std::uint64_t{1} << current_device();
  return cudaSuccess;
}

GPUKIT_DETAIL_COMPILED_INLINE cudaError_t sim_runtime::host_unregister(void* p)
{
  if (auto e = enter(sim_op::host_unregister); e != cudaSuccess) { return e; }
  std::lock_guard<std::mutex> lock{mem_mutex_};
  if (host_registered_.erase(reinterpret_cast<std::uintptr_t>(p)) == 0) {
    return misuse(cudaErrorHostMemoryNotRegistered,
                  "host_unregister(" + detail::sim_hex(p) +
                    "): no range registered with host_register starts there");
  }
  pinned_for_.erase(reinterpret_cast<std::uintptr_t>(p));
  return cudaSuccess;
}

}  // namespace gpukit
