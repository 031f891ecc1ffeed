// SPDX-License-Identifier: Apache-2.0
// gpukit/memory/ipc.hpp on the simulated GPU: a block exported by one process and opened by a
// fork()ed child, which reads and writes its bytes. The simulated GPU's exported memory is memfd
// memory (malloc allocations move into a memfd on their first export; virtual-memory pages are
// memfds from the start), so the two processes really share it, as two processes share a GPU.
#include "support/caching_allocator.hpp"
#include "support/pattern.hpp"
#include "support/sim_gpu.hpp"
#include "support/sizes.hpp"

#include <gpukit/memory/caching_allocator.hpp>
#include <gpukit/memory/detail/allocator_invariants.hpp>
#include <gpukit/memory/ipc.hpp>
#include <gpukit/runtime/sim_runtime.hpp>

#include <doctest/doctest.h>

#include <fcntl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

using namespace gpukit::test;
using gpukit::sim_runtime;
using sim_allocator = gpukit::basic_caching_allocator<sim_runtime>;

namespace {

/// Two devices of 4 GiB whose memory maps in pages of `granularity`.
gpukit::sim_config two_gpus(std::size_t granularity = 2 * mib)
{
  return devices(2).with_vm_granularity(granularity);
}

/// A socket pair, closed on scope exit.
struct socket_pair {
  int fd[2]{-1, -1};
  socket_pair() { REQUIRE(::socketpair(AF_UNIX, SOCK_STREAM, 0, fd) == 0); }
  ~socket_pair()
  {
    for (int f : fd) {
      if (f >= 0) { ::close(f); }
    }
  }
};

/// Whether `fd` is an open descriptor of this process.
bool is_open(int fd) { return ::fcntl(fd, F_GETFD) != -1 || errno != EBADF; }

/// Copies `bytes` of device memory of `device` to host through a stream of that device.
std::vector<char> read_device(sim_runtime& sim, int device, void const* p, std::size_t bytes)
{
  gpukit::device_guard<sim_runtime> guard{sim, device};
  std::vector<char> out(bytes);
  if (sim.memcpy_async(out.data(), p, bytes, gpukit::memcpy_kind::device_to_host, sim_stream{}) !=
        cudaSuccess ||
      sim.stream_synchronize(sim_stream{}) != cudaSuccess) {
    out.clear();
  }
  return out;
}

bool write_device(sim_runtime& sim, int device, void* p, void const* src, std::size_t bytes)
{
  gpukit::device_guard<sim_runtime> guard{sim, device};
  return sim.memcpy_async(p, src, bytes, gpukit::memcpy_kind::host_to_device, sim_stream{}) ==
           cudaSuccess &&
         sim.stream_synchronize(sim_stream{}) == cudaSuccess;
}

/// The child's side: receives a handle, opens it on a simulated GPU of its own (device 1, with
/// device 0 current), checks that it holds pattern `seen`, writes pattern `written`, closes it,
/// and answers one byte. Returns the exit code (0: all held).
int child_reads_and_writes(int sock, std::uint32_t seen, std::uint32_t written)
{
  try {
    sim_runtime sim{two_gpus()};
    gpukit::ipc_block_handle h = gpukit::receive_block_handle(sock);
    gpukit::imported_block<sim_runtime> block{sim, h, 1};
    h.close_fds();
    if (block.device() != 1 || block.size() != h.bytes) { return 2; }
    std::vector<char> got = read_device(sim, 1, block.data(), block.size());
    if (got.size() != block.size() || first_mismatch(got.data(), got.size(), seen) != got.size()) {
      std::fprintf(stderr, "child: the block does not hold the exporter's bytes\n");
      return 3;
    }
    std::vector<char> mine(block.size());
    fill_pattern(mine.data(), mine.size(), written);
    if (!write_device(sim, 1, block.data(), mine.data(), mine.size())) { return 4; }
    if (h.type == gpukit::ipc_block_handle::kind::cuda_ipc) {
      // Opened again in the same process: the same mapping (reference counted, as on CUDA).
      void* again = nullptr;
      if (sim.ipc_open_mem_handle(&again, h.memory) != cudaSuccess ||
          static_cast<char*>(again) + h.offset != block.data() ||
          sim.ipc_close_mem_handle(again) != cudaSuccess) {
        return 5;
      }
    }
    block.close();
    char const ack = 'k';
    if (::write(sock, &ack, 1) != 1) { return 6; }
    return 0;
  } catch (std::exception const& e) {
    std::fprintf(stderr, "child: %s\n", e.what());
    return 7;
  }
}

/// Sends `h` to a fork()ed child that runs child_reads_and_writes; returns its exit code.
int share_with_child(gpukit::ipc_block_handle& h, std::uint32_t seen, std::uint32_t written)
{
  socket_pair sp;
  pid_t const pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    ::close(sp.fd[0]);
    ::_exit(child_reads_and_writes(sp.fd[1], seen, written));
  }
  ::close(sp.fd[1]);
  sp.fd[1] = -1;
  gpukit::send_block_handle(sp.fd[0], h);
  h.close_fds();  // the child has its own copies now
  char ack        = 0;
  ssize_t const n = ::read(sp.fd[0], &ack, 1);
  int status      = 0;
  REQUIRE(::waitpid(pid, &status, 0) == pid);
  REQUIRE(WIFEXITED(status));
  CHECK(n == 1);
  return WEXITSTATUS(status);
}

}  // namespace

TEST_SUITE("ipc")
{
  TEST_CASE("ipc: a block of a growable segment is read and written by another process")
  {
    sim_runtime sim{two_gpus()};
    auto o               = segments_from(gpukit::segment_source::growable, 2 * mib);
    o.growable_shareable = true;
    sim_allocator alloc{sim, 1, o};
    REQUIRE(sim.set_device(0) == cudaSuccess);  // not the allocator's device
    void* first                 = alloc.allocate(3 * mib);
    constexpr std::size_t bytes = 5 * mib + 4096;
    void* b                     = alloc.allocate(bytes);  // starts inside a page, spans 3 or 4
    std::vector<char> mine(bytes);
    fill_pattern(mine.data(), bytes, 31);
    REQUIRE(write_device(sim, 1, b, mine.data(), bytes));

    gpukit::ipc_block_handle h = gpukit::export_block(alloc, b);
    CHECK(h.type == gpukit::ipc_block_handle::kind::shareable_pages);
    CHECK(h.device == 1);
    CHECK(h.bytes >= bytes);
    CHECK(h.page_bytes == 2 * mib);
    CHECK(h.offset == 3 * mib - 2 * mib);  // the block starts 1 MiB into its first page
    CHECK(h.fds.size() == (h.offset + h.bytes + 2 * mib - 1) / (2 * mib));

    CHECK(share_with_child(h, 31, 32) == 0);
    std::vector<char> now = read_device(sim, 1, b, bytes);  // the child's bytes
    CHECK(first_mismatch(now.data(), bytes, 32) == bytes);

    alloc.deallocate(b, bytes);
    alloc.deallocate(first, 3 * mib);
    CHECK(gpukit::detail::check_invariants(alloc).empty());
    alloc.release();
    CHECK(sim.used_bytes(1) == 0);
    CHECK(sim.used_bytes(0) == 0);
  }

  TEST_CASE("ipc: a block of a cudaMalloc segment travels as a CUDA IPC handle")
  {
    sim_runtime sim{two_gpus()};
    sim_allocator alloc{sim, 1, segments_from(gpukit::segment_source::synchronous)};
    void* first                 = alloc.allocate(100 * kib);
    constexpr std::size_t bytes = 300 * kib + 256;  // a multiple of 256: the block is all of it
    void* b                     = alloc.allocate(bytes);  // same small segment, at an offset
    std::vector<char> mine(bytes);
    fill_pattern(mine.data(), bytes, 41);
    REQUIRE(write_device(sim, 1, b, mine.data(), bytes));

    gpukit::ipc_block_handle h = gpukit::export_block(alloc, b);
    CHECK(h.type == gpukit::ipc_block_handle::kind::cuda_ipc);
    CHECK(h.offset == static_cast<char*>(b) - static_cast<char*>(first));
    CHECK(h.fds.empty());
    // The handle cannot be opened by the process that made it (as on CUDA).
    void* self = nullptr;
    CHECK(sim.ipc_open_mem_handle(&self, h.memory) == cudaErrorInvalidResourceHandle);

    CHECK(share_with_child(h, 41, 42) == 0);
    std::vector<char> now = read_device(sim, 1, b, bytes);
    CHECK(first_mismatch(now.data(), bytes, 42) == bytes);
    // The neighbour the export moved into the memfd too kept its memory.
    std::vector<char> head(100 * kib, 7);
    REQUIRE(write_device(sim, 1, first, head.data(), head.size()));
    CHECK(read_device(sim, 1, first, head.size()) == head);

    alloc.deallocate(b, bytes);
    alloc.deallocate(first, 100 * kib);
    alloc.release();
    CHECK(sim.used_bytes(1) == 0);
  }

  TEST_CASE("ipc: many pages travel in several descriptor messages")
  {
    // 64 KiB pages: a 10 MiB block is 160+ descriptors (sent 64 a message).
    sim_runtime a{two_gpus(64 * kib)};
    auto o               = segments_from(gpukit::segment_source::growable, 64 * kib);
    o.growable_shareable = true;
    sim_allocator alloc{a, 0, o};
    constexpr std::size_t bytes = 10 * mib + 300;
    void* p                     = alloc.allocate(bytes);
    std::vector<char> mine(bytes);
    fill_pattern(mine.data(), bytes, 51);
    REQUIRE(write_device(a, 0, p, mine.data(), bytes));
    gpukit::ipc_block_handle h = gpukit::export_block(alloc, p);
    CHECK(h.fds.size() >= 161);

    socket_pair sp;
    gpukit::send_block_handle(sp.fd[0], h);
    gpukit::ipc_block_handle got = gpukit::receive_block_handle(sp.fd[1]);
    CHECK(got.fds.size() == h.fds.size());
    CHECK(got.offset == h.offset);
    CHECK(got.bytes == h.bytes);
    h.close_fds();
    // Imported by a second simulated GPU of this process: the same bytes.
    sim_runtime b{two_gpus(64 * kib)};
    {
      gpukit::imported_block<sim_runtime> block{b, got, 0};
      got.close_fds();
      std::vector<char> seen = read_device(b, 0, block.data(), bytes);
      CHECK(first_mismatch(seen.data(), bytes, 51) == bytes);
      // A peer of the importing device is granted the imported pages (enablePeerAccess).
      CHECK_FALSE(b.vm_accessible(block.data(), 1));
      block.grant_access(1);
      CHECK(b.vm_accessible(block.data(), 1));
      CHECK(b.vm_accessible(static_cast<char*>(block.data()) + bytes - 1, 1));
      CHECK(b.used_bytes(0) == 0);  // imported memory is the exporter's device's
    }
    alloc.deallocate(p, bytes);
  }

  TEST_CASE("ipc: each page is exported once, and its descriptor closed when the page goes")
  {
    sim_runtime sim{two_gpus()};
    auto o               = segments_from(gpukit::segment_source::growable, 2 * mib);
    o.growable_shareable = true;
    std::vector<int> kept;
    {
      sim_allocator alloc{sim, 0, o};
      void* a       = alloc.allocate(3 * mib);         // pages 0 and 1, from the start
      void* b       = alloc.allocate(3 * mib + 4096);  // 1 MiB into page 1, through page 3
      auto const sa = alloc.share_pages(a);
      auto const sb = alloc.share_pages(b);
      CHECK(sa.offset == 0);
      CHECK(sa.bytes == 3 * mib);
      REQUIRE(sa.pages.size() == 2);
      REQUIRE(static_cast<char*>(b) - static_cast<char*>(a) == 3 * mib);
      CHECK(sb.offset == mib);
      CHECK(sb.bytes >= 3 * mib + 4096);
      REQUIRE(sb.pages.size() == 3);
      for (auto const& page : sb.pages) {
        CHECK(page.bytes == 2 * mib);
        CHECK(is_open(page.fd));
      }
      CHECK(sb.pages[0].fd == sa.pages[1].fd);  // the page both blocks lie on: exported once
      CHECK(sim.calls(gpukit::sim_op::vm_export_shareable) == 4);
      auto const again = alloc.share_pages(b);  // no new export
      CHECK(sim.calls(gpukit::sim_op::vm_export_shareable) == 4);
      for (std::size_t i = 0; i < 3; ++i) { CHECK(again.pages[i].fd == sb.pages[i].fd); }
      // export_block hands out its own copies, which it closes; the allocator's stay open.
      {
        gpukit::ipc_block_handle h = gpukit::export_block(alloc, b);
        REQUIRE(h.fds.size() == 3);
        for (std::size_t i = 0; i < 3; ++i) { CHECK(h.fds[i] != sb.pages[i].fd); }
      }
      CHECK(sim.calls(gpukit::sim_op::vm_export_shareable) == 4);
      for (auto const& page : sb.pages) { CHECK(is_open(page.fd)); }

      // Freed and released: the pages are unmapped and their descriptors closed.
      alloc.deallocate(b, 3 * mib + 4096);
      alloc.deallocate(a, 3 * mib);
      alloc.release();
      for (auto const& page : sb.pages) { CHECK_FALSE(is_open(page.fd)); }
      CHECK_FALSE(is_open(sa.pages[0].fd));
      CHECK(sim.used_bytes(0) == 0);

      // Pages exported again after they come back are new descriptors of the new pages; those
      // still mapped when the allocator goes are closed by its destructor.
      void* c = alloc.allocate(5 * mib);
      for (auto const& page : alloc.share_pages(c).pages) { kept.push_back(page.fd); }
      CHECK(kept.size() == 3);
      for (int fd : kept) { CHECK(is_open(fd)); }
      alloc.deallocate(c, 5 * mib);
    }
    for (int fd : kept) { CHECK_FALSE(is_open(fd)); }
  }

  TEST_CASE("ipc: share_pages refuses what is not a shareable growable block, naming it")
  {
    sim_runtime sim{two_gpus()};
    sim_allocator fixed{sim, 0, segments_from(gpukit::segment_source::synchronous)};
    void* p = fixed.allocate(mib);
    CHECK_THROWS_WITH_AS((void)fixed.share_pages(p), doctest::Contains("cudaMalloc segment"),
                         gpukit::logic_error);
    CHECK_THROWS_WITH_AS((void)fixed.share_pages(static_cast<char*>(p) + 256),
                         doctest::Contains("is not a block this allocator has handed out"),
                         gpukit::logic_error);
    fixed.deallocate(p, mib);
    sim_allocator plain{sim, 0, segments_from(gpukit::segment_source::growable, 2 * mib)};
    void* q = plain.allocate(mib);
    CHECK_THROWS_WITH_AS((void)plain.share_pages(q), doctest::Contains("growable_shareable"),
                         gpukit::logic_error);
    plain.deallocate(q, mib);
    // An export the runtime refuses leaves nothing half-exported: the next call exports it.
    auto o               = segments_from(gpukit::segment_source::growable, 2 * mib);
    o.growable_shareable = true;
    sim_allocator shared{sim, 0, o};
    void* r = shared.allocate(3 * mib);
    sim.inject_fault(gpukit::sim_op::vm_export_shareable, 2, cudaErrorMemoryAllocation);
    CHECK_THROWS_AS((void)shared.share_pages(r), gpukit::cuda_error);
    auto const pages = shared.share_pages(r);
    REQUIRE(pages.pages.size() == 2);
    CHECK(pages.pages[0].fd != pages.pages[1].fd);
    shared.deallocate(r, 3 * mib);
    CHECK(gpukit::detail::check_invariants(shared).empty());
  }

  TEST_CASE("ipc: grant_access gives a peer device the growable pages, now and when mapped")
  {
    sim_runtime sim{two_gpus()};
    sim_allocator alloc{sim, 0, segments_from(gpukit::segment_source::growable, 2 * mib)};
    void* a = alloc.allocate(3 * mib);
    CHECK(sim.vm_accessible(a, 0));
    CHECK_FALSE(sim.vm_accessible(a, 1));
    alloc.grant_access(1);
    CHECK(sim.vm_accessible(a, 1));
    CHECK(sim.vm_accessible(static_cast<char*>(a) + 3 * mib - 1, 1));
    CHECK(alloc.peers() == std::vector<int>{1});
    void* b = alloc.allocate(9 * mib);  // new pages: granted as they are mapped
    CHECK(sim.vm_accessible(b, 1));
    CHECK(sim.vm_accessible(static_cast<char*>(b) + 9 * mib - 1, 1));
    alloc.grant_access(1);  // again, and the allocator's own device: nothing more
    alloc.grant_access(0);
    CHECK(alloc.peers() == std::vector<int>{1});
    CHECK_THROWS_WITH_AS(alloc.grant_access(-1), doctest::Contains("device -1"),
                         gpukit::logic_error);
    CHECK_THROWS_AS(alloc.grant_access(5), gpukit::cuda_error);  // no such device here
    CHECK(alloc.peers() == std::vector<int>{1});

    // A peer's access refused while mapping: the mapping is undone, the allocator stays whole.
    alloc.deallocate(b, 9 * mib);
    alloc.release();
    sim.inject_fault(gpukit::sim_op::vm_set_access, 2, cudaErrorInvalidValue);  // the peer's
    CHECK_THROWS_AS((void)alloc.allocate(20 * mib), gpukit::cuda_error);
    CHECK(gpukit::detail::check_invariants(alloc).empty());
    void* c = alloc.allocate(20 * mib);
    CHECK(sim.vm_accessible(static_cast<char*>(c) + 20 * mib - 1, 1));
    alloc.deallocate(c, 20 * mib);
    alloc.deallocate(a, 3 * mib);
    CHECK(gpukit::detail::check_invariants(alloc).empty());
  }

  TEST_CASE("ipc: what cannot be exported or imported is refused clearly")
  {
    sim_runtime sim{two_gpus()};
    {
      sim_allocator pooled{sim, 0, segments_from(gpukit::segment_source::stream_ordered)};
      void* p = pooled.allocate(mib);
      CHECK_THROWS_WITH_AS((void)gpukit::export_block(pooled, p),
                           doctest::Contains("cudaMallocAsync"), gpukit::logic_error);
      CHECK_THROWS_WITH_AS((void)gpukit::export_block(pooled, static_cast<char*>(p) + 256),
                           doctest::Contains("is not a block this allocator has handed out"),
                           gpukit::logic_error);
      pooled.deallocate(p, mib);
      CHECK_THROWS_AS((void)gpukit::export_block(pooled, p), gpukit::logic_error);  // freed
      // The runtime refuses cudaMallocAsync memory too.
      void* q = nullptr;
      REQUIRE(sim.malloc_async(&q, mib, sim_stream{}) == cudaSuccess);
      gpukit::ipc_mem_handle mh{};
      CHECK(sim.ipc_get_mem_handle(mh, q) == cudaErrorInvalidValue);
      CHECK(sim.last_misuse().find("malloc_async") != std::string::npos);
      CHECK(sim.free_async(q, sim_stream{}) == cudaSuccess);
    }
    {
      // growable_shareable left off
      sim_allocator growable{sim, 0, segments_from(gpukit::segment_source::growable)};
      void* p = growable.allocate(mib);
      CHECK_THROWS_WITH_AS((void)gpukit::export_block(growable, p),
                           doctest::Contains("growable_shareable"), gpukit::logic_error);
      growable.deallocate(p, mib);
    }
    // Physical memory not created shareable cannot be exported; a descriptor that is not
    // simulated device memory cannot be imported.
    sim_runtime::physical_handle ph{};
    REQUIRE(sim.vm_create(ph, 2 * mib, 0) == cudaSuccess);
    int fd = -1;
    CHECK(sim.vm_export_shareable(fd, ph) == cudaErrorInvalidValue);
    CHECK(sim.vm_release(ph) == cudaSuccess);
    int pipe_fds[2];
    REQUIRE(::pipe(pipe_fds) == 0);
    CHECK(sim.vm_import_shareable(ph, pipe_fds[0]) == cudaErrorInvalidValue);
    ::close(pipe_fds[0]);
    ::close(pipe_fds[1]);
    gpukit::ipc_mem_handle junk{};
    void* out = nullptr;
    CHECK(sim.ipc_open_mem_handle(&out, junk) == cudaErrorInvalidValue);
    CHECK(sim.ipc_close_mem_handle(&junk) == cudaErrorInvalidValue);
    // Something else on the socket is not taken for a handle.
    socket_pair sp;
    std::vector<char> garbage(200, 'x');
    REQUIRE(::write(sp.fd[0], garbage.data(), garbage.size()) ==
            static_cast<ssize_t>(garbage.size()));
    CHECK_THROWS_WITH_AS((void)gpukit::receive_block_handle(sp.fd[1]),
                         doctest::Contains("not a gpukit block handle"), gpukit::logic_error);
  }
}
