// SPDX-License-Identifier: Apache-2.0
// gpukit/runtime/detail/sim_runtime_vm_impl.hpp: virtual memory of gpukit::sim_runtime. Not public
// API; included by gpukit/runtime/detail/sim_runtime_impl.hpp (its header comment describes the
// locking).
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

// ---- virtual memory -----------------------------------------------------------------------------

GPUKIT_DETAIL_COMPILED_INLINE cudaError_t sim_runtime::no_virtual_memory(char const* op)
{
  return misuse(
    cudaErrorNotSupported,
    std::string{op} +
      ": this simulated GPU has no virtual memory management (sim_config::virtual_memory)");
}

GPUKIT_DETAIL_COMPILED_INLINE cudaError_t sim_runtime::vm_granularity(std::size_t& g, int device)
{
  if (auto e = enter(sim_op::vm_granularity); e != cudaSuccess) { return e; }
  if (!config_.virtual_memory) { return no_virtual_memory("vm_granularity"); }
  if (!valid_device(device)) { return bad_device("vm_granularity", device); }
  g = config_.vm_granularity;
  return cudaSuccess;
}

GPUKIT_DETAIL_COMPILED_INLINE cudaError_t sim_runtime::vm_reserve(void** va, std::size_t bytes,
                                                                  std::size_t alignment)
{
  if (auto e = enter(sim_op::vm_reserve); e != cudaSuccess) { return e; }
  if (!config_.virtual_memory) { return no_virtual_memory("vm_reserve"); }
  auto const g = config_.vm_granularity;
  auto const args =
    "vm_reserve(" + std::to_string(bytes) + ", alignment " + std::to_string(alignment) + ")";
  if (va == nullptr) {
    return misuse(cudaErrorInvalidValue, args + ": the output pointer is null");
  }
  if (bytes == 0 || bytes % g != 0) {
    return misuse(
      cudaErrorInvalidValue,
      args + ": size is not a non-zero multiple of the granularity " + std::to_string(g));
  }
  if ((alignment & (alignment - 1)) != 0) {
    return misuse(cudaErrorInvalidValue, args + ": alignment is not a power of two");
  }
  std::size_t const align = std::max(alignment, g);
  if (bytes > std::numeric_limits<std::size_t>::max() - align) { return cudaErrorMemoryAllocation; }
  std::size_t const span = bytes + align;
  void* m = ::mmap(nullptr, span, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (m == MAP_FAILED) { return cudaErrorMemoryAllocation; }
  auto const raw  = reinterpret_cast<std::uintptr_t>(m);
  auto const base = (raw + align - 1) / align * align;
  if (base > raw) { ::munmap(m, base - raw); }
  if (raw + span > base + bytes) {
    ::munmap(reinterpret_cast<void*>(base + bytes), raw + span - (base + bytes));
  }
  {
    std::lock_guard<std::mutex> lock{mem_mutex_};
    reservations_[base] = detail::sim_reservation{bytes};
  }
  *va = reinterpret_cast<void*>(base);
  return cudaSuccess;
}

GPUKIT_DETAIL_COMPILED_INLINE cudaError_t sim_runtime::vm_free(void* va, std::size_t bytes)
{
  if (auto e = enter(sim_op::vm_free); e != cudaSuccess) { return e; }
  auto const args = "vm_free(" + detail::sim_hex(va) + ", " + std::to_string(bytes) + ")";
  auto const base = reinterpret_cast<std::uintptr_t>(va);
  std::lock_guard<std::mutex> lock{mem_mutex_};
  auto it = reservations_.find(base);
  if (it == reservations_.end()) {
    return misuse(cudaErrorInvalidValue, args + ": no reservation from vm_reserve starts there");
  }
  if (it->second.bytes != bytes) {
    return misuse(cudaErrorInvalidValue, args + ": the reservation is " +
                                           std::to_string(it->second.bytes) +
                                           " bytes; vm_free takes the whole range");
  }
  auto m           = mappings_.lower_bound(base);
  std::size_t live = 0;
  for (; m != mappings_.end() && m->first < base + bytes; ++m) { ++live; }
  if (live != 0) {
    return misuse(cudaErrorInvalidValue, args + ": " + std::to_string(live) +
                                           " mapping(s) remain in the range; vm_unmap them first");
  }
  ::munmap(va, bytes);
  reservations_.erase(it);
  return cudaSuccess;
}

GPUKIT_DETAIL_COMPILED_INLINE cudaError_t sim_runtime::vm_create(physical_handle& h,
                                                                 std::size_t bytes, int device,
                                                                 bool shareable)
{
  if (auto e = enter(sim_op::vm_create); e != cudaSuccess) { return e; }
  if (!config_.virtual_memory) { return no_virtual_memory("vm_create"); }
  if (!valid_device(device)) { return bad_device("vm_create", device); }
  auto const g = config_.vm_granularity;
  if (bytes == 0 || bytes % g != 0) {
    return misuse(cudaErrorInvalidValue,
                  "vm_create(" + std::to_string(bytes) + ", device " + std::to_string(device) +
                    "): size is not a non-zero multiple of the granularity " + std::to_string(g));
  }
  auto& dev = *devices_[static_cast<std::size_t>(device)];
  if (!dev.try_charge(bytes)) { return cudaErrorMemoryAllocation; }
  std::string const name = detail::sim_physical_name + std::to_string(device);
  int const fd           = ::memfd_create(name.c_str(), MFD_CLOEXEC);
  if (fd < 0 || ::ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
    if (fd >= 0) { ::close(fd); }
    dev.uncharge(bytes);
    return cudaErrorMemoryAllocation;
  }
  auto const id = detail::sim_next_id();
  {
    std::lock_guard<std::mutex> lock{mem_mutex_};
    physicals_[id] = detail::sim_physical{fd, bytes, device, false, 0, shareable, false};
  }
  h = id;
  return cudaSuccess;
}

GPUKIT_DETAIL_COMPILED_INLINE void sim_runtime::release_physical(std::uint64_t id)
{
  auto it = physicals_.find(id);
  ::close(it->second.fd);
  if (!it->second.imported) {
    devices_[static_cast<std::size_t>(it->second.device)]->uncharge(it->second.bytes);
  }
  physicals_.erase(it);
}

GPUKIT_DETAIL_COMPILED_INLINE cudaError_t sim_runtime::vm_release(physical_handle h)
{
  if (auto e = enter(sim_op::vm_release); e != cudaSuccess) { return e; }
  std::lock_guard<std::mutex> lock{mem_mutex_};
  auto it = physicals_.find(h);
  if (it == physicals_.end() || it->second.released) {
    return misuse(cudaErrorInvalidValue, "vm_release(handle " + std::to_string(h) +
                                           "): unknown or already released physical handle");
  }
  it->second.released = true;
  if (it->second.map_count == 0) { release_physical(h); }
  return cudaSuccess;
}

GPUKIT_DETAIL_COMPILED_INLINE cudaError_t sim_runtime::vm_map(void* va, std::size_t bytes,
                                                              physical_handle h)
{
  if (auto e = enter(sim_op::vm_map); e != cudaSuccess) { return e; }
  auto const args = "vm_map(" + detail::sim_hex(va) + ", " + std::to_string(bytes) + ", handle " +
                    std::to_string(h) + ")";
  auto const a = reinterpret_cast<std::uintptr_t>(va);
  std::lock_guard<std::mutex> lock{mem_mutex_};
  auto ph = physicals_.find(h);
  if (ph == physicals_.end() || ph->second.released) {
    return misuse(cudaErrorInvalidValue, args + ": unknown or released physical handle");
  }
  if (bytes != ph->second.bytes) {
    return misuse(cudaErrorInvalidValue, args + ": the handle is " +
                                           std::to_string(ph->second.bytes) +
                                           " bytes; vm_map maps it whole");
  }
  if (a % config_.vm_granularity != 0) {
    return misuse(cudaErrorInvalidValue, args + ": the address is not aligned to the granularity");
  }
  auto r      = reservations_.upper_bound(a);
  bool inside = false;
  if (r != reservations_.begin()) {
    --r;
    inside = a >= r->first && bytes <= r->second.bytes && a - r->first <= r->second.bytes - bytes;
  }
  if (!inside) {
    return misuse(cudaErrorInvalidValue, args + ": the range does not lie inside one reservation");
  }
  auto m       = mappings_.lower_bound(a);
  bool overlap = m != mappings_.end() && m->first < a + bytes;
  if (!overlap && m != mappings_.begin()) {
    --m;
    overlap = m->first + m->second.bytes > a;
  }
  if (overlap) { return misuse(cudaErrorInvalidValue, args + ": the range is already mapped"); }
  void* got = ::mmap(va, bytes, PROT_NONE, MAP_SHARED | MAP_FIXED, ph->second.fd, 0);
  if (got == MAP_FAILED) { return cudaErrorMemoryAllocation; }
  ++ph->second.map_count;
  mappings_[a] = detail::sim_mapping{bytes, h, ph->second.device, 0};
  return cudaSuccess;
}

GPUKIT_DETAIL_COMPILED_INLINE bool sim_runtime::whole_mappings(std::uintptr_t va, std::size_t bytes,
                                                               std::string& why) const
{
  if (bytes == 0) {
    why = "zero bytes";
    return false;
  }
  auto m = mappings_.find(va);
  if (m == mappings_.end()) {
    why = "no mapping starts at " + detail::sim_hex(va);
    return false;
  }
  std::uintptr_t cursor    = va;
  std::uintptr_t const end = va + bytes;
  while (cursor < end) {
    if (m == mappings_.end() || m->first != cursor) {
      why = "nothing is mapped at " + detail::sim_hex(cursor);
      return false;
    }
    cursor = m->first + m->second.bytes;
    ++m;
  }
  if (cursor != end) {
    why = "the range ends inside the mapping that ends at " + detail::sim_hex(cursor) +
          " (only whole mappings)";
    return false;
  }
  return true;
}

GPUKIT_DETAIL_COMPILED_INLINE cudaError_t sim_runtime::vm_unmap(void* va, std::size_t bytes)
{
  if (auto e = enter(sim_op::vm_unmap); e != cudaSuccess) { return e; }
  auto const a = reinterpret_cast<std::uintptr_t>(va);
  std::lock_guard<std::mutex> lock{mem_mutex_};
  std::string why;
  if (!whole_mappings(a, bytes, why)) {
    return misuse(cudaErrorInvalidValue,
                  "vm_unmap(" + detail::sim_hex(va) + ", " + std::to_string(bytes) + "): " + why);
  }
  // Back to an inaccessible reservation (MAP_FIXED replaces the file mappings atomically).
  void* got =
    ::mmap(va, bytes, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1, 0);
  if (got == MAP_FAILED) { return cudaErrorMemoryAllocation; }
  auto m = mappings_.find(a);
  while (m != mappings_.end() && m->first < a + bytes) {
    auto ph = physicals_.find(m->second.handle);
    if (--ph->second.map_count == 0 && ph->second.released) { release_physical(ph->first); }
    m = mappings_.erase(m);
  }
  return cudaSuccess;
}

GPUKIT_DETAIL_COMPILED_INLINE cudaError_t sim_runtime::vm_set_access(void* va, std::size_t bytes,
                                                                     int device)
{
  if (auto e = enter(sim_op::vm_set_access); e != cudaSuccess) { return e; }
  if (!valid_device(device)) { return bad_device("vm_set_access", device); }
  auto const a = reinterpret_cast<std::uintptr_t>(va);
  std::lock_guard<std::mutex> lock{mem_mutex_};
  std::string why;
  if (!whole_mappings(a, bytes, why)) {
    return misuse(cudaErrorInvalidValue, "vm_set_access(" + detail::sim_hex(va) + ", " +
                                           std::to_string(bytes) + "): " + why);
  }
  if (::mprotect(va, bytes, PROT_READ | PROT_WRITE) != 0) { return cudaErrorInvalidValue; }
  for (auto m = mappings_.find(a); m != mappings_.end() && m->first < a + bytes; ++m) {
    m->second.access_mask |= std::uint64_t{1} << device;
  }
  return cudaSuccess;
}

}  // namespace gpukit
