// SPDX-License-Identifier: Apache-2.0
// gpukit/memory/ipc.hpp: a block of gpukit's caching allocator, opened by another process.
//
// Quick start (one process per GPU, as DistributedDataParallel runs; a unix socket between them):
//
//   #include <gpukit/memory/ipc.hpp>
//
//   // Exporting process: a block of its allocator, sent over a unix socket.
//   void* share(gpukit::caching_allocator& alloc, std::size_t bytes, cudaStream_t stream, int sock)
//   {
//     // alloc was made with these options:
//     //   o.source             = gpukit::segment_source::growable;  // or ::synchronous
//     //   o.growable_shareable = true;                             // pages exportable
//     void* p = alloc.allocate_async(bytes, stream);
//     gpukit::ipc_block_handle h = gpukit::export_block(alloc, p);
//     gpukit::send_block_handle(sock, h);  // the fields, and descriptors by SCM_RIGHTS
//     return p;                            // keep it allocated while the importer uses it
//   }
//
//   // Importing process (any device current; the block is mapped for device 1):
//   void use(int sock)
//   {
//     gpukit::ipc_block_handle h = gpukit::receive_block_handle(sock);
//     gpukit::imported_block<gpukit::cuda_runtime> block{gpukit::cuda_runtime::instance(), h, 1};
//     // kernel<<<grid, threads, 0, stream>>>(block.data(), block.size());
//   }  // ~imported_block unmaps it (cudaIpcCloseMemHandle, or cuMemUnmap + cuMemAddressFree)
//
// How a block travels depends on its segment:
// - Ordinary segments from cudaMalloc (segment_source::synchronous): the CUDA IPC handle of the
//   segment (cudaIpcGetMemHandle) and the block's offset in it; the importer opens the handle
//   (cudaIpcOpenMemHandle) and adds the offset. Memory from cudaMallocAsync's default pool
//   (segment_source::stream_ordered, the `automatic` choice where pools exist) cannot be exported
//   this way: export_block refuses it.
// - Growable segments (segment_source::growable with growable_shareable): a POSIX file descriptor
//   for each physical page holding the block (cuMemExportToShareableHandle); the importer imports
//   them (cuMemImportFromShareableHandle), maps them into an address range it reserves, and
//   grants its device access. The allocator exports each page once and keeps its descriptor until
//   the page is unmapped (caching_allocator::share_pages); the handle holds copies of them.
//   Descriptors cross processes only over a unix socket (SCM_RIGHTS), which send_block_handle /
//   receive_block_handle do, by fork(), or by pidfd_getfd (as PyTorch's receivers take them).
//
// The exporter must keep the block allocated, and not reuse it, while importers use it: the pages
// (or the segment) stay the exporter's allocator's. Ordering work between the processes is the
// user's (an NCCL call, a CUDA IPC event, a message on the socket after a stream synchronize).
//
// Everything here works over any Runtime: on the simulated GPU (sim_runtime), segments and pages
// are memfds, so a fork()ed child or another process of the same user really shares the bytes.
#pragma once

#include <gpukit/error.hpp>
#include <gpukit/error_macros.hpp>
#include <gpukit/memory/caching_allocator.hpp>
#include <gpukit/runtime/runtime.hpp>

#include <fcntl.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <system_error>
#include <tuple>
#include <utility>
#include <vector>

namespace gpukit {

/// A gpukit block exported for another process (see the top of this header). Move-only: it owns
/// its descriptors (shareable pages) and closes them when destroyed.
struct ipc_block_handle {
  enum class kind : std::uint32_t {
    cuda_ipc        = 1,  ///< a CUDA IPC handle of the block's segment (`memory`) and an offset
    shareable_pages = 2,  ///< one POSIX descriptor per physical page (`fds`) and an offset
  };

  kind type{kind::cuda_ipc};
  int device{0};              ///< the exporting allocator's device
  std::size_t offset{0};      ///< the block's start: from the segment's base, or the first page's
  std::size_t bytes{0};       ///< the block's size (a multiple of 256, at least what was requested)
  ipc_mem_handle memory{};    ///< cuda_ipc: the segment's handle
  std::size_t page_bytes{0};  ///< shareable_pages: the size of each page
  std::vector<int> fds;       ///< shareable_pages: the pages in address order, owned

  ipc_block_handle() = default;
  ~ipc_block_handle() { close_fds(); }
  ipc_block_handle(ipc_block_handle const&)            = delete;
  ipc_block_handle& operator=(ipc_block_handle const&) = delete;
  ipc_block_handle(ipc_block_handle&& o) noexcept { swap(o); }
  ipc_block_handle& operator=(ipc_block_handle&& o) noexcept
  {
    ipc_block_handle old{std::move(o)};
    swap(old);  // this handle's descriptors go with `old`, which closes them
    return *this;
  }
  /// Exchanges the contents of two handles.
  void swap(ipc_block_handle& o) noexcept
  {
    auto mine   = std::tie(type, device, offset, bytes, memory, page_bytes, fds);
    auto theirs = std::tie(o.type, o.device, o.offset, o.bytes, o.memory, o.page_bytes, o.fds);
    mine.swap(theirs);
  }
  /// Closes the descriptors now (they are no longer needed once imported or sent).
  void close_fds() noexcept
  {
    for (int fd : fds) { ::close(fd); }
    fds.clear();
  }
};

/// Exports `ptr`, a block `alloc` has handed out (its start), for another process.
/// Acts on the allocator's device whatever device is current. Does not synchronize (on the
/// simulated GPU, the first export of a segment waits for the work queued on it).
/// @throws gpukit::logic_error for a pointer that is not such a block; a block of cudaMallocAsync
///         memory (segment_source::stream_ordered: CUDA cannot export it); a growable block
///         without caching_allocator_options::growable_shareable
/// @throws gpukit::cuda_error when the runtime refuses the export
template <class Runtime>
[[nodiscard]] ipc_block_handle export_block(basic_caching_allocator<Runtime>& alloc,
                                            void const* ptr)
{
  auto const x = alloc.extent(ptr);
  Runtime& rt  = alloc.runtime();
  ipc_block_handle h;
  h.device = alloc.device();
  h.bytes  = x.bytes;
  device_guard<Runtime> guard{rt, alloc.device()};
  if (x.growable) {
    GPUKIT_EXPECTS(alloc.options().growable_shareable,
                   "export_block: the block lies in a growable segment whose pages are not "
                   "shareable: set caching_allocator_options::growable_shareable");
    // Each page is exported once, by the allocator; the handle owns copies of its descriptors.
    auto const shared = alloc.share_pages(ptr);
    h.type            = ipc_block_handle::kind::shareable_pages;
    h.page_bytes      = x.page_bytes;
    h.offset          = shared.offset;
    h.fds.reserve(shared.pages.size());
    for (auto const& page : shared.pages) {
      int const fd = ::fcntl(page.fd, F_DUPFD_CLOEXEC, 0);
      if (fd < 0) {
        throw std::system_error{errno, std::generic_category(),
                                "gpukit: export_block: duplicating a page's descriptor"};
      }
      h.fds.push_back(fd);  // h closes those duplicated so far
    }
  } else {
    GPUKIT_EXPECTS(!x.stream_ordered,
                   "export_block: the block lies in memory from cudaMallocAsync's default pool, "
                   "which CUDA IPC handles cannot export: use segment_source::synchronous, or "
                   "segment_source::growable with growable_shareable");
    h.type   = ipc_block_handle::kind::cuda_ipc;
    h.offset = x.offset;
    GPUKIT_CUDA_TRY(rt.ipc_get_mem_handle(h.memory, x.segment_base));
  }
  return h;
}

/// A block exported by another process, mapped into this one for a device. Move-only; unmapped
/// when destroyed (or by close()).
template <class Runtime>
class imported_block final {
 public:
  /// Maps the block `h` describes for `device` (-1: the current device). `h` keeps its
  /// descriptors (close them with h.close_fds(), or let h go).
  /// @throws gpukit::logic_error for an empty or inconsistent handle
  /// @throws gpukit::cuda_error when the runtime cannot open or map it (nothing stays mapped)
  imported_block(Runtime& rt, ipc_block_handle const& h, int device = -1) : rt_{&rt}
  {
    if (device < 0) { GPUKIT_CUDA_TRY(rt.get_device(device)); }
    device_ = device;
    type_   = h.type;
    bytes_  = h.bytes;
    GPUKIT_EXPECTS(h.bytes != 0, "imported_block: the handle describes an empty block");
    device_guard<Runtime> guard{rt, device_};
    if (h.type == ipc_block_handle::kind::cuda_ipc) {
      GPUKIT_CUDA_TRY(rt.ipc_open_mem_handle(&base_, h.memory));
      data_ = static_cast<char*>(base_) + h.offset;
      return;
    }
    GPUKIT_EXPECTS(
      h.type == ipc_block_handle::kind::shareable_pages,
      "imported_block: unknown handle kind " + std::to_string(static_cast<std::uint32_t>(h.type)));
    std::size_t g = 0;
    GPUKIT_CUDA_TRY(rt.vm_granularity(g, device_));
    std::size_t const n = h.fds.size();
    GPUKIT_EXPECTS(n != 0 && h.page_bytes != 0 && h.page_bytes % g == 0 &&
                     h.offset + h.bytes <= n * h.page_bytes,
                   "imported_block: " + std::to_string(n) + " pages of " +
                     std::to_string(h.page_bytes) + " bytes cannot hold " +
                     std::to_string(h.bytes) + " bytes at offset " + std::to_string(h.offset) +
                     " (granularity " + std::to_string(g) + ")");
    range_bytes_ = n * h.page_bytes;
    GPUKIT_CUDA_TRY(rt.vm_reserve(&base_, range_bytes_, 0));
    std::size_t mapped = 0;
    auto undo          = [&] {
      for (std::size_t i = 0; i < mapped; ++i) {
        (void)rt.vm_unmap(static_cast<char*>(base_) + i * h.page_bytes, h.page_bytes);
      }
      (void)rt.vm_free(base_, range_bytes_);
      base_ = nullptr;
    };
    for (; mapped < n; ++mapped) {
      typename Runtime::physical_handle page{};
      typename Runtime::error_type e = rt.vm_import_shareable(page, h.fds[mapped]);
      if (e == Runtime::success) {
        e = rt.vm_map(static_cast<char*>(base_) + mapped * h.page_bytes, h.page_bytes, page);
        (void)rt.vm_release(page);  // the mapping keeps the memory
      }
      if (e != Runtime::success) {
        undo();
        GPUKIT_CUDA_TRY(e, "vm_import_shareable, vm_map (imported_block)");
      }
    }
    if (typename Runtime::error_type const e = rt.vm_set_access(base_, range_bytes_, device_);
        e != Runtime::success) {
      undo();
      GPUKIT_CUDA_TRY(e, "vm_set_access (imported_block)");
    }
    data_ = static_cast<char*>(base_) + h.offset;
  }
  ~imported_block() { close(); }
  imported_block(imported_block const&) = delete;  // one owner of each mapping
  imported_block(imported_block&& o) noexcept : rt_{o.rt_} { swap(o); }
  /// Move-assigns (takes `o` by value, moved from): this block's mapping leaves with `o`.
  imported_block& operator=(imported_block o) noexcept
  {
    swap(o);
    return *this;
  }
  /// Exchanges two mappings.
  void swap(imported_block& o) noexcept
  {
    auto mine   = std::tie(rt_, device_, type_, base_, range_bytes_, data_, bytes_);
    auto theirs = std::tie(o.rt_, o.device_, o.type_, o.base_, o.range_bytes_, o.data_, o.bytes_);
    mine.swap(theirs);
  }

  /// The block's first byte in this process (device memory of the exporter's device).
  [[nodiscard]] void* data() const noexcept { return data_; }
  /// The block's size in bytes.
  [[nodiscard]] std::size_t size() const noexcept { return bytes_; }
  /// The device the block is mapped for.
  [[nodiscard]] int device() const noexcept { return device_; }

  /// Grants device `peer` read-write access to the mapping too (cuMemSetAccess), as PyTorch's
  /// enablePeerAccess asks. Only blocks of shareable pages need it: a CUDA IPC handle's memory is
  /// opened with lazy peer access. Does nothing for the block's own device or a closed block.
  /// Does not synchronize.
  /// @throws gpukit::cuda_error when the runtime refuses (e.g. a device that does not exist)
  void grant_access(int peer)
  {
    if (base_ == nullptr || type_ != ipc_block_handle::kind::shareable_pages || peer == device_) {
      return;
    }
    device_guard<Runtime> guard{*rt_, device_};
    GPUKIT_CUDA_TRY(rt_->vm_set_access(base_, range_bytes_, peer),
                    "vm_set_access of an imported block for peer device " + std::to_string(peer));
  }

  /// Unmaps the block (cudaIpcCloseMemHandle, or cuMemUnmap and cuMemAddressFree). Work that
  /// uses it must have completed. Never throws; idempotent.
  void close() noexcept
  {
    if (base_ == nullptr) { return; }
    try {
      device_guard<Runtime> guard{*rt_, device_};
      if (type_ == ipc_block_handle::kind::cuda_ipc) {
        (void)rt_->ipc_close_mem_handle(base_);
      } else {
        (void)rt_->vm_unmap(base_, range_bytes_);
        (void)rt_->vm_free(base_, range_bytes_);
      }
    } catch (...) {  // the device could not be made current: the mapping stays
    }
    base_ = nullptr;
    data_ = nullptr;
  }

 private:
  Runtime* rt_;
  int device_{0};
  ipc_block_handle::kind type_{ipc_block_handle::kind::cuda_ipc};
  void* base_{nullptr};
  std::size_t range_bytes_{0};
  void* data_{nullptr};
  std::size_t bytes_{0};
};

namespace detail {

/// What send_block_handle writes before the descriptors.
struct ipc_wire_header {
  std::uint32_t magic;
  std::uint32_t version;
  std::uint32_t type;
  std::int32_t device;
  std::uint64_t offset;
  std::uint64_t bytes;
  std::uint64_t page_bytes;
  std::uint64_t fd_count;
  ipc_mem_handle memory;
};
inline constexpr std::uint32_t ipc_wire_magic    = 0x67706b69;  // "gpki"
inline constexpr std::size_t ipc_fds_per_message = 64;

/// One socket message of a block handle: a one-byte payload and room for `n` descriptors.
/// Not copyable: `msg` points into the object itself.
struct ipc_fd_message {
  ipc_fd_message(char payload, std::size_t n)
      : byte{payload}, iov{&byte, 1}, control(CMSG_SPACE(sizeof(int) * n))
  {
    msg.msg_iov        = &iov;
    msg.msg_iovlen     = 1;
    msg.msg_control    = control.data();
    msg.msg_controllen = control.size();
  }
  ipc_fd_message(ipc_fd_message const&)            = delete;
  ipc_fd_message& operator=(ipc_fd_message const&) = delete;

  char byte;
  iovec iov;
  std::vector<char> control;
  msghdr msg{};
};

[[noreturn]] inline void throw_socket_error(char const* what, int error)
{
  throw std::system_error{error, std::generic_category(), std::string{"gpukit: "} + what};
}

inline void write_all(int socket, void const* data, std::size_t bytes, char const* what)
{
  auto const* p = static_cast<char const*>(data);
  while (bytes != 0) {
    ssize_t const n = ::send(socket, p, bytes, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) { continue; }
    if (n <= 0) { throw_socket_error(what, n < 0 ? errno : EPIPE); }
    p += n;
    bytes -= static_cast<std::size_t>(n);
  }
}

inline void read_all(int socket, void* data, std::size_t bytes, char const* what)
{
  auto* p = static_cast<char*>(data);
  while (bytes != 0) {
    ssize_t const n = ::recv(socket, p, bytes, 0);
    if (n < 0 && errno == EINTR) { continue; }
    if (n <= 0) { throw_socket_error(what, n < 0 ? errno : ECONNRESET); }
    p += n;
    bytes -= static_cast<std::size_t>(n);
  }
}

}  // namespace detail

/// Sends `h` over a connected unix-domain stream socket (socketpair(AF_UNIX, SOCK_STREAM), or an
/// accepted AF_UNIX connection): its fields, then its descriptors in SCM_RIGHTS messages. `h`
/// keeps its descriptors. Blocks until written.
/// @throws std::system_error when the socket fails (e.g. the peer closed it)
inline void send_block_handle(int socket, ipc_block_handle const& h)
{
  detail::ipc_wire_header hdr{};
  hdr.magic      = detail::ipc_wire_magic;
  hdr.version    = 1;
  hdr.type       = static_cast<std::uint32_t>(h.type);
  hdr.device     = h.device;
  hdr.offset     = h.offset;
  hdr.bytes      = h.bytes;
  hdr.page_bytes = h.page_bytes;
  hdr.fd_count   = h.fds.size();
  hdr.memory     = h.memory;
  detail::write_all(socket, &hdr, sizeof hdr, "send_block_handle");
  for (std::size_t i = 0; i < h.fds.size(); i += detail::ipc_fds_per_message) {
    std::size_t const n = std::min(detail::ipc_fds_per_message, h.fds.size() - i);
    detail::ipc_fd_message m{'f', n};
    cmsghdr* cm    = CMSG_FIRSTHDR(&m.msg);
    cm->cmsg_level = SOL_SOCKET;
    cm->cmsg_type  = SCM_RIGHTS;
    cm->cmsg_len   = CMSG_LEN(sizeof(int) * n);
    std::memcpy(CMSG_DATA(cm), h.fds.data() + i, sizeof(int) * n);
    ssize_t sent = -1;
    do {
      sent = ::sendmsg(socket, &m.msg, MSG_NOSIGNAL);
    } while (sent < 0 && errno == EINTR);
    if (sent != 1) { detail::throw_socket_error("send_block_handle", sent < 0 ? errno : EPIPE); }
  }
}

/// Receives a handle sent by send_block_handle (the descriptors arrive close-on-exec).
/// Blocks until it has arrived.
/// @throws std::system_error when the socket fails or closes first
/// @throws gpukit::logic_error when what arrives is not a block handle
inline ipc_block_handle receive_block_handle(int socket)
{
  detail::ipc_wire_header hdr{};
  detail::read_all(socket, &hdr, sizeof hdr, "receive_block_handle");
  GPUKIT_EXPECTS(hdr.magic == detail::ipc_wire_magic && hdr.version == 1,
                 "receive_block_handle: what arrived is not a gpukit block handle");
  ipc_block_handle h;
  h.type       = static_cast<ipc_block_handle::kind>(hdr.type);
  h.device     = hdr.device;
  h.offset     = static_cast<std::size_t>(hdr.offset);
  h.bytes      = static_cast<std::size_t>(hdr.bytes);
  h.page_bytes = static_cast<std::size_t>(hdr.page_bytes);
  h.memory     = hdr.memory;
  h.fds.reserve(static_cast<std::size_t>(hdr.fd_count));
  while (h.fds.size() < hdr.fd_count) {
    std::size_t const n =
      std::min<std::size_t>(detail::ipc_fds_per_message, hdr.fd_count - h.fds.size());
    detail::ipc_fd_message m{0, n};
    msghdr& msg = m.msg;
    ssize_t got = -1;
    do {
      got = ::recvmsg(socket, &msg, MSG_CMSG_CLOEXEC);
    } while (got < 0 && errno == EINTR);
    if (got != 1) {
      detail::throw_socket_error("receive_block_handle", got < 0 ? errno : ECONNRESET);
    }
    std::size_t const before = h.fds.size();
    for (cmsghdr* cm = CMSG_FIRSTHDR(&msg); cm != nullptr; cm = CMSG_NXTHDR(&msg, cm)) {
      if (cm->cmsg_level != SOL_SOCKET || cm->cmsg_type != SCM_RIGHTS) { continue; }
      std::size_t const k = (cm->cmsg_len - CMSG_LEN(0)) / sizeof(int);
      for (std::size_t j = 0; j < k; ++j) {
        int fd = -1;
        std::memcpy(&fd, CMSG_DATA(cm) + j * sizeof(int), sizeof(int));
        h.fds.push_back(fd);
      }
    }
    GPUKIT_EXPECTS(
      (msg.msg_flags & MSG_CTRUNC) == 0 && h.fds.size() > before && h.fds.size() <= hdr.fd_count,
      "receive_block_handle: descriptors were lost in transit (" + std::to_string(h.fds.size()) +
        " of " + std::to_string(hdr.fd_count) + ")");
  }
  return h;
}

}  // namespace gpukit
