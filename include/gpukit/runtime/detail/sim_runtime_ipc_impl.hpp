// SPDX-License-Identifier: Apache-2.0
// gpukit/runtime/detail/sim_runtime_ipc_impl.hpp: shareable physical memory and interprocess memory
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
#include <map>
#include <string>
#include <system_error>

namespace gpukit {

// ---- shareable physical memory and IPC ---------------------------------------------------------

namespace detail {

/// The device whose simulated memory the memfd `fd` holds (from its name), or -1 when it is not
/// one: "/memfd:<prefix><device> (deleted)".
GPUKIT_DETAIL_COMPILED_INLINE int sim_memfd_device(int fd, char const* prefix)
{
  char link[64];
  std::snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
  char target[256];
  ssize_t const n = ::readlink(link, target, sizeof target - 1);
  if (n <= 0) { return -1; }
  target[n]               = '\0';
  std::string const want  = std::string{"/memfd:"} + prefix;
  std::string const found = target;
  if (found.compare(0, want.size(), want) != 0) { return -1; }
  char const* digits = target + want.size();
  if (*digits < '0' || *digits > '9') { return -1; }
  return std::atoi(digits);
}

using sim_allocation_map = std::map<std::uintptr_t, sim_allocation>;

/// The allocation of `allocations` whose mapping holds the address `a`, or end().
GPUKIT_DETAIL_COMPILED_INLINE sim_allocation_map::iterator sim_allocation_holding(
  sim_allocation_map& allocations, std::uintptr_t a)
{
  auto it = allocations.upper_bound(a);
  if (it == allocations.begin()) { return allocations.end(); }
  --it;
  return a < it->first + it->second.mapped_bytes ? it : allocations.end();
}

/// Why ipc_get_mem_handle cannot export `al` (the end of its message), or null when it can.
GPUKIT_DETAIL_COMPILED_INLINE char const* sim_ipc_unexportable(sim_allocation const& al) noexcept
{
  if (al.pending_free) { return ": the allocation was freed with free_async"; }
  if (al.async) {
    return ": memory from malloc_async (the default stream-ordered pool) cannot be exported with "
           "ipc_get_mem_handle; use malloc, or shareable virtual memory (vm_create(..., shareable "
           "= true))";
  }
  if (al.imported) { return ": memory opened with ipc_open_mem_handle cannot be exported again"; }
  return nullptr;
}

/// The handle naming `al`, exported (its ipc_fd is set) by this process.
GPUKIT_DETAIL_COMPILED_INLINE sim_runtime::ipc_mem_handle sim_ipc_handle(sim_allocation const& al)
{
  sim_ipc_payload pl{};
  std::memcpy(pl.magic, sim_ipc_magic, sizeof pl.magic);
  pl.pid          = static_cast<std::int64_t>(::getpid());
  pl.fd           = al.ipc_fd;
  pl.bytes        = al.bytes;
  pl.mapped_bytes = al.mapped_bytes;
  pl.device       = al.device;
  sim_runtime::ipc_mem_handle h{};
  std::memcpy(&h, &pl, sizeof pl);
  return h;
}

/// Writes the pages of [base, base + bytes) that hold anything but zeros to `fd` at their offsets
/// (pages never written stay holes); false when a write fails.
GPUKIT_DETAIL_COMPILED_INLINE bool sim_write_pages(int fd, char const* base, std::size_t bytes)
{
  constexpr std::size_t piece    = std::size_t{64} << 10;
  static char const zeros[piece] = {};
  for (std::size_t off = 0; off < bytes; off += piece) {
    std::size_t const n = std::min(piece, bytes - off);
    if (std::memcmp(base + off, zeros, n) == 0) { continue; }
    if (::pwrite(fd, base + off, n, static_cast<off_t>(off)) != static_cast<ssize_t>(n)) {
      return false;
    }
  }
  return true;
}

/// Moves the bytes of the mapping [base, base + bytes) of `device` into a new memfd and maps it
/// over the same addresses (MAP_FIXED replaces the private mapping at once): pointers stay valid,
/// and another process can map the memfd. Returns the memfd, or -1 with nothing changed.
GPUKIT_DETAIL_COMPILED_INLINE int sim_move_to_memfd(std::uintptr_t base, std::size_t bytes,
                                                    int device)
{
  std::string const name = sim_ipc_name + std::to_string(device);
  int const fd           = ::memfd_create(name.c_str(), MFD_CLOEXEC);
  if (fd < 0) { return -1; }
  bool const moved = ::ftruncate(fd, static_cast<off_t>(bytes)) == 0 &&
                     sim_write_pages(fd, reinterpret_cast<char const*>(base), bytes) &&
                     ::mmap(reinterpret_cast<void*>(base), bytes, PROT_READ | PROT_WRITE,
                            MAP_SHARED | MAP_FIXED, fd, 0) != MAP_FAILED;
  if (!moved) {
    ::close(fd);
    return -1;
  }
  return fd;
}

/// The base of the allocation already imported from the exporter's memfd `key` ("<pid>:<fd>"),
/// opened once more; null when none is.
GPUKIT_DETAIL_COMPILED_INLINE void* sim_reopen_imported(sim_allocation_map& allocations,
                                                        std::string const& key)
{
  for (auto& [base, al] : allocations) {
    if (al.imported && al.ipc_key == key) {
      ++al.ipc_refs;
      return reinterpret_cast<void*>(base);
    }
  }
  return nullptr;
}

/// The exporter's memfd that `pl` names, opened through `path` (/proc/<pid>/fd/<fd>); -1 when it
/// cannot be opened or is not the memory `pl` describes.
GPUKIT_DETAIL_COMPILED_INLINE int sim_open_exported(sim_ipc_payload const& pl,
                                                    std::string const& path)
{
  int const fd = ::open(path.c_str(), O_RDWR | O_CLOEXEC);
  struct stat st {};
  if (fd < 0 || ::fstat(fd, &st) != 0 || static_cast<std::uint64_t>(st.st_size) < pl.mapped_bytes ||
      sim_memfd_device(fd, sim_ipc_name) != pl.device) {
    if (fd >= 0) { ::close(fd); }
    return -1;
  }
  return fd;
}

/// The allocation that maps, in this process, the memory `pl` names (the exporter's memfd `key`).
GPUKIT_DETAIL_COMPILED_INLINE sim_allocation sim_imported_allocation(sim_ipc_payload const& pl,
                                                                     std::string const& key)
{
  sim_allocation al;
  al.bytes        = pl.bytes;
  al.mapped_bytes = pl.mapped_bytes;
  al.device       = static_cast<int>(pl.device);
  al.imported     = true;
  al.ipc_refs     = 1;
  al.ipc_key      = key;
  return al;
}

}  // namespace detail

GPUKIT_DETAIL_COMPILED_INLINE cudaError_t sim_runtime::vm_export_shareable(int& fd,
                                                                           physical_handle h)
{
  if (auto e = enter(sim_op::vm_export_shareable); e != cudaSuccess) { return e; }
  std::lock_guard<std::mutex> lock{mem_mutex_};
  auto ph = physicals_.find(h);
  if (ph == physicals_.end() || ph->second.released) {
    return misuse(cudaErrorInvalidValue, "vm_export_shareable(handle " + std::to_string(h) +
                                           "): unknown or released physical handle");
  }
  if (!ph->second.shareable) {
    return misuse(cudaErrorInvalidValue,
                  "vm_export_shareable(handle " + std::to_string(h) +
                    "): the handle was not created shareable (vm_create(..., shareable = true))");
  }
  int const dup = ::fcntl(ph->second.fd, F_DUPFD_CLOEXEC, 0);
  if (dup < 0) { return cudaErrorMemoryAllocation; }  // out of descriptors
  fd = dup;
  return cudaSuccess;
}

GPUKIT_DETAIL_COMPILED_INLINE cudaError_t sim_runtime::vm_import_shareable(physical_handle& h,
                                                                           int fd)
{
  if (auto e = enter(sim_op::vm_import_shareable); e != cudaSuccess) { return e; }
  auto const args  = "vm_import_shareable(fd " + std::to_string(fd) + ")";
  int const device = fd < 0 ? -1 : detail::sim_memfd_device(fd, detail::sim_physical_name);
  struct stat st {};
  if (device < 0 || ::fstat(fd, &st) != 0) {
    return misuse(cudaErrorInvalidValue,
                  args + ": not a descriptor of simulated device memory (vm_export_shareable)");
  }
  if (!valid_device(device)) { return bad_device("vm_import_shareable", device); }
  auto const bytes = static_cast<std::size_t>(st.st_size);
  if (bytes == 0 || bytes % config_.vm_granularity != 0) {
    return misuse(cudaErrorInvalidValue, args + ": " + std::to_string(bytes) +
                                           " bytes, not a multiple of this GPU's granularity " +
                                           std::to_string(config_.vm_granularity));
  }
  int const own = ::fcntl(fd, F_DUPFD_CLOEXEC, 0);
  if (own < 0) { return cudaErrorMemoryAllocation; }
  auto const id = detail::sim_next_id();
  {
    std::lock_guard<std::mutex> lock{mem_mutex_};
    physicals_[id] = detail::sim_physical{own, bytes, device, false, 0, true, true};
  }
  h = id;
  return cudaSuccess;
}

GPUKIT_DETAIL_COMPILED_INLINE cudaError_t sim_runtime::ipc_get_mem_handle(ipc_mem_handle& h,
                                                                          void* p)
{
  if (auto e = enter(sim_op::ipc_get_mem_handle); e != cudaSuccess) { return e; }
  auto const args = "ipc_get_mem_handle(" + detail::sim_hex(p) + ")";
  auto const a    = reinterpret_cast<std::uintptr_t>(p);
  int device      = 0;
  {
    std::lock_guard<std::mutex> lock{mem_mutex_};
    auto it = detail::sim_allocation_holding(allocations_, a);
    if (it == allocations_.end()) {
      return misuse(cudaErrorInvalidValue, args + ": not memory of a malloc allocation");
    }
    if (char const* why = detail::sim_ipc_unexportable(it->second)) {
      return misuse(cudaErrorInvalidValue, args + why);
    }
    if (it->second.ipc_fd >= 0) {  // exported before
      h = detail::sim_ipc_handle(it->second);
      return cudaSuccess;
    }
    device = it->second.device;
  }
  // First export: the work queued on the memory must not run while its pages move.
  wait_all_devices();
  std::lock_guard<std::mutex> lock{mem_mutex_};
  auto it = detail::sim_allocation_holding(allocations_, a);
  if (it == allocations_.end() || it->second.pending_free) {
    return misuse(cudaErrorInvalidValue, args + ": the allocation was freed during the export");
  }
  auto& al = it->second;
  if (al.ipc_fd < 0) {
    int const fd = detail::sim_move_to_memfd(it->first, al.mapped_bytes, device);
    if (fd < 0) { return cudaErrorMemoryAllocation; }
    al.ipc_fd = fd;
  }
  h = detail::sim_ipc_handle(al);
  return cudaSuccess;
}

GPUKIT_DETAIL_COMPILED_INLINE cudaError_t sim_runtime::ipc_open_mem_handle(void** p,
                                                                           ipc_mem_handle h)
{
  if (auto e = enter(sim_op::ipc_open_mem_handle); e != cudaSuccess) { return e; }
  if (p == nullptr) {
    return misuse(cudaErrorInvalidValue, "ipc_open_mem_handle: the output pointer is null");
  }
  detail::sim_ipc_payload pl{};
  std::memcpy(&pl, &h, sizeof pl);
  if (std::memcmp(pl.magic, detail::sim_ipc_magic, sizeof pl.magic) != 0) {
    return misuse(cudaErrorInvalidValue,
                  "ipc_open_mem_handle: not a handle from ipc_get_mem_handle of a simulated GPU");
  }
  std::string const key = std::to_string(pl.pid) + ":" + std::to_string(pl.fd);
  auto const args =
    "ipc_open_mem_handle(process " + std::to_string(pl.pid) + ", fd " + std::to_string(pl.fd) + ")";
  if (pl.pid == static_cast<std::int64_t>(::getpid())) {
    return misuse(cudaErrorInvalidResourceHandle,
                  args +
                    ": the handle was exported by this process; CUDA opens IPC handles only "
                    "in other processes");
  }
  if (pl.device < 0 || pl.device >= static_cast<std::int64_t>(devices_.size())) {
    return bad_device("ipc_open_mem_handle", static_cast<int>(pl.device));
  }
  {
    std::lock_guard<std::mutex> lock{mem_mutex_};
    if (void* again = detail::sim_reopen_imported(allocations_, key)) {
      *p = again;
      return cudaSuccess;
    }
  }
  std::string const path = "/proc/" + std::to_string(pl.pid) + "/fd/" + std::to_string(pl.fd);
  int const fd           = detail::sim_open_exported(pl, path);
  if (fd < 0) {
    return misuse(cudaErrorInvalidValue,
                  args + ": the exported memory cannot be opened through " + path +
                    " (the exporting process exited, or freed the allocation)");
  }
  void* m = ::mmap(nullptr, pl.mapped_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  ::close(fd);
  if (m == MAP_FAILED) { return cudaErrorMemoryAllocation; }
  {
    std::lock_guard<std::mutex> lock{mem_mutex_};
    allocations_[reinterpret_cast<std::uintptr_t>(m)] = detail::sim_imported_allocation(pl, key);
  }
  *p = m;
  return cudaSuccess;
}

GPUKIT_DETAIL_COMPILED_INLINE cudaError_t sim_runtime::ipc_close_mem_handle(void* p)
{
  if (auto e = enter(sim_op::ipc_close_mem_handle); e != cudaSuccess) { return e; }
  auto const base = reinterpret_cast<std::uintptr_t>(p);
  detail::sim_allocation al;
  {
    std::lock_guard<std::mutex> lock{mem_mutex_};
    auto it = allocations_.find(base);
    if (it == allocations_.end() || !it->second.imported) {
      return misuse(cudaErrorInvalidValue, "ipc_close_mem_handle(" + detail::sim_hex(p) +
                                             "): not memory from ipc_open_mem_handle");
    }
    if (--it->second.ipc_refs != 0) { return cudaSuccess; }
    al = it->second;
    allocations_.erase(it);
  }
  wait_device(al.device);  // queued copies may still use the mapping
  ::munmap(p, al.mapped_bytes);
  return cudaSuccess;
}

}  // namespace gpukit
