// SPDX-License-Identifier: Apache-2.0
// gpukit/host/detail/host_pages.hpp: ordinary host memory mapped for fast pinning: 2 MiB aligned,
// advised to use transparent huge pages, and faulted in by several threads at once. Not public API.
//
// Why: cudaHostAlloc pins 2-4 GB/s on the H200 host, because one thread faults in (and the kernel
// zeroes) every 4 KiB page before locking it. Anonymous memory backed by 2 MiB pages, touched by
// several threads in parallel, then page-locked with cudaHostRegister (which then only has to
// look up pages already present), pins at about 16 GB/s.
#pragma once

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <thread>
#include <vector>

namespace gpukit::detail {

/// A transparent huge page on x86-64 and most aarch64 kernels.
inline constexpr std::size_t huge_page_bytes = std::size_t{2} << 20;

/// An anonymous mapping from map_host_pages: `bytes` (page rounded) at `base`.
struct host_mapping {
  void* base{nullptr};
  std::size_t bytes{0};
  int error{0};  ///< errno of the failed call when base is null
};

inline std::size_t host_page_bytes() noexcept
{
  static std::size_t const page = [] {
    long const p = ::sysconf(_SC_PAGESIZE);
    return p > 0 ? static_cast<std::size_t>(p) : std::size_t{4096};
  }();
  return page;
}

/// Writes one byte of every page of [p, p + bytes) (page aligned) so that the kernel backs it now.
inline void touch_host_pages(char* p, std::size_t bytes) noexcept
{
  std::size_t const page = host_page_bytes();
  for (std::size_t off = 0; off < bytes; off += page) { *static_cast<char volatile*>(p + off) = 0; }
}

/// Faults in [p, p + bytes) with up to `threads` threads (the calling thread included), each taking
/// whole 2 MiB extents. Ranges below 16 MiB per thread are not worth a thread's start.
inline void touch_host_pages_parallel(char* p, std::size_t bytes, int threads) noexcept
{
  std::size_t const per_thread_min = std::size_t{16} << 20;
  std::size_t n = std::min<std::size_t>(static_cast<std::size_t>(std::max(threads, 1)),
                                        std::max<std::size_t>(1, bytes / per_thread_min));
  if (n <= 1) {
    touch_host_pages(p, bytes);
    return;
  }
  std::size_t const extents = (bytes + huge_page_bytes - 1) / huge_page_bytes;
  std::size_t const part    = (extents + n - 1) / n * huge_page_bytes;
  std::vector<std::thread> helpers;
  std::size_t off = part;  // the calling thread takes [0, part)
  try {
    helpers.reserve(n - 1);
    for (; off < bytes && helpers.size() + 1 < n; off += part) {
      std::size_t const len = std::min(part, bytes - off);
      helpers.emplace_back([p, off, len] { touch_host_pages(p + off, len); });
    }
  } catch (...) {  // no thread to spare: the calling thread touches what is left
  }
  touch_host_pages(p, std::min(part, bytes));
  if (off < bytes) { touch_host_pages(p + off, bytes - off); }
  for (auto& t : helpers) { t.join(); }
}

/// Maps at least `bytes` of private anonymous memory (rounded up to the page), 2 MiB aligned and
/// advised MADV_HUGEPAGE when `huge` (a kernel without transparent huge pages ignores the advice),
/// and faults every page in with up to `threads` threads. On failure returns a null base and the
/// errno. Never throws.
inline host_mapping map_host_pages(std::size_t bytes, bool huge, int threads) noexcept
{
  host_mapping m;
  std::size_t const page = host_page_bytes();
  if (bytes == 0 || bytes > (std::size_t{1} << 62)) {
    m.error = EINVAL;
    return m;
  }
  std::size_t const len   = (bytes + page - 1) & ~(page - 1);
  std::size_t const align = huge ? huge_page_bytes : page;
  std::size_t const span  = len + (align > page ? align : 0);
  void* const raw =
    ::mmap(nullptr, span, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (raw == MAP_FAILED) {
    m.error = errno;
    return m;
  }
  auto const r = reinterpret_cast<std::uintptr_t>(raw);
  auto const b = (r + align - 1) & ~(std::uintptr_t{align} - 1);
  if (b > r) { ::munmap(raw, b - r); }  // trim to the aligned range
  if (r + span > b + len) { ::munmap(reinterpret_cast<void*>(b + len), r + span - (b + len)); }
  m.base  = reinterpret_cast<void*>(b);
  m.bytes = len;
#ifdef MADV_HUGEPAGE
  if (huge) { (void)::madvise(m.base, len, MADV_HUGEPAGE); }
#endif
  touch_host_pages_parallel(static_cast<char*>(m.base), len, threads);
  return m;
}

/// Unmaps a mapping from map_host_pages (unregister it from CUDA first). Returns 0 or the errno.
inline int unmap_host_pages(void* base, std::size_t bytes) noexcept
{
  return ::munmap(base, bytes) == 0 ? 0 : errno;
}

}  // namespace gpukit::detail
