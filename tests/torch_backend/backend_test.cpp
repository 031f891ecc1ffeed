// SPDX-License-Identifier: Apache-2.0
// The PyTorch backend's translation layer on the simulated GPU: what the c10 CUDAAllocator
// subclass forwards to it (allocation, private pools for graph capture and MemPool, statistics,
// memory fraction, out-of-memory observers, history with contexts, snapshots, IPC handles).
#include <gpukit/memory/alloc_conf.hpp>
#include <gpukit/memory/detail/allocator_invariants.hpp>
#include <gpukit/runtime/sim_runtime.hpp>
#include <gpukit_torch/alloc_conf.hpp>
#include <gpukit_torch/backend.hpp>
#include <gpukit_torch/detail/pidfd.hpp>

#include <doctest/doctest.h>

#include <dirent.h>
#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <deque>
#include <mutex>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

using gpukit::sim_runtime;
using sim_backend = gpukit_torch::backend<sim_runtime>;
using stream_t    = sim_runtime::stream_type;
using gpukit_torch::pool_id;

namespace {

constexpr std::size_t MiB = std::size_t{1} << 20;
constexpr std::size_t GiB = std::size_t{1} << 30;

gpukit::sim_config one_device(std::size_t capacity = 4 * GiB)
{
  return gpukit::sim_config{}.with_devices(1, capacity);
}

gpukit::caching_allocator_options conf(char const* text) { return gpukit::parse_alloc_conf(text); }

gpukit_torch::backend_conf torch_conf(char const* text)
{
  return gpukit_torch::parse_backend_conf(
    text, gpukit_torch::parse_backend_conf(gpukit_torch::backend_default_conf));
}

// PyTorch's statistics of blocks held by users, computed by PyTorch's rules (round_size; the
// small pool for rounded sizes up to 1 MiB; allocated and active bytes count the rounded size,
// requested bytes the size asked for) over a workload of allocations and frees.
struct pytorch_model {
  gpukit_torch::size_rounding rounding;
  // [0] small, [1] large, [2] all
  std::array<gpukit_torch::stat, 3> allocation{}, allocated_bytes{}, requested_bytes{};
  std::vector<std::pair<std::size_t, std::size_t>> live;  // (asked, rounded), by handle

  static void add(gpukit_torch::stat& s, std::int64_t n)
  {
    s.current += n;
    s.allocated += n;
    s.peak = std::max(s.peak, s.current);
  }
  static void take(gpukit_torch::stat& s, std::int64_t n)
  {
    s.current -= n;
    s.freed += n;
  }
  std::size_t alloc(std::size_t bytes)
  {
    std::size_t const size = rounding.round_size(bytes);
    std::size_t const kind = size <= MiB ? 0 : 1;
    for (std::size_t i : {kind, std::size_t{2}}) {
      add(allocation[i], 1);
      add(allocated_bytes[i], static_cast<std::int64_t>(size));
      add(requested_bytes[i], static_cast<std::int64_t>(bytes));
    }
    live.emplace_back(bytes, size);
    return live.size() - 1;
  }
  void free(std::size_t handle)
  {
    auto const [bytes, size] = live[handle];
    std::size_t const kind   = size <= MiB ? 0 : 1;
    for (std::size_t i : {kind, std::size_t{2}}) {
      take(allocation[i], 1);
      take(allocated_bytes[i], static_cast<std::int64_t>(size));
      take(requested_bytes[i], static_cast<std::int64_t>(bytes));
    }
  }
};

void check_stat(gpukit_torch::stat const& got, gpukit_torch::stat const& want)
{
  CHECK(got.current == want.current);
  CHECK(got.peak == want.peak);
  CHECK(got.allocated == want.allocated);
  CHECK(got.freed == want.freed);
}

// Every statistic of blocks held by users, of each pool kind and of both, equals PyTorch's;
// with no frees waiting on other streams, the active ones equal the allocated ones.
void check_pytorch_numbers(gpukit_torch::device_stats const& s, pytorch_model const& m)
{
  std::array<gpukit_torch::device_pool_stats const*, 3> const got{&s.small_pool, &s.large_pool, &s};
  for (std::size_t i = 0; i < 3; ++i) {
    CAPTURE(i);
    check_stat(got[i]->allocation, m.allocation[i]);
    check_stat(got[i]->allocated_bytes, m.allocated_bytes[i]);
    check_stat(got[i]->requested_bytes, m.requested_bytes[i]);
    check_stat(got[i]->active, m.allocation[i]);
    check_stat(got[i]->active_bytes, m.allocated_bytes[i]);
  }
  CHECK(s.max_split_size == -1);
  CHECK(s.oversize_allocations.current == 0);
  CHECK(s.oversize_segments.current == 0);
}

struct stream_guard {
  sim_runtime& rt;
  stream_t s{};
  explicit stream_guard(sim_runtime& r) : rt{r} { GPUKIT_CUDA_TRY(rt.stream_create(s)); }
  ~stream_guard() { (void)rt.stream_destroy(s); }
};

/// Appends `v` as `n` little-endian bytes (the handle's ints, written out by hand).
void put(std::string& s, std::uint64_t v, int n)
{
  for (int i = 0; i < n; ++i) { s.push_back(static_cast<char>((v >> (8 * i)) & 0xff)); }
}

/// PyTorch 2.11's expandable-segment handle, built byte by byte: "\x02e", the pid, 4 zero bytes,
/// the page size, the number of pages, then each descriptor as a 4-byte int.
std::string pytorch_handle(int pid, std::size_t page_bytes, std::vector<int> const& fds)
{
  std::string s{
    "\x02"
    "e"};
  put(s, static_cast<std::uint32_t>(pid), 4);
  put(s, 0, 4);
  put(s, page_bytes, 8);
  put(s, fds.size(), 8);
  for (int fd : fds) { put(s, static_cast<std::uint32_t>(fd), 4); }
  return s;
}

/// Open descriptors of this process.
int open_fds()
{
  int n  = 0;
  DIR* d = ::opendir("/proc/self/fd");
  while (dirent* e = ::readdir(d)) { n += e->d_name[0] != '.' ? 1 : 0; }
  ::closedir(d);
  return n - 1;  // the directory's own
}

/// Replaces the pidfd system calls for a scope.
struct pidfd_override {
  gpukit_torch::detail::pidfd_calls saved = gpukit_torch::detail::pidfd_syscalls();
  explicit pidfd_override(gpukit_torch::detail::pidfd_calls calls)
  {
    gpukit_torch::detail::pidfd_syscalls() = calls;
  }
  ~pidfd_override() { gpukit_torch::detail::pidfd_syscalls() = saved; }
};

// The refusals a test injects: the call fails with this errno.
int injected_errno = 0;
int refuse_open(int) { return errno = injected_errno, -1; }
int refuse_getfd(int, int) { return errno = injected_errno, -1; }
// The first pidfd_getfd succeeds, later ones fail with EBADF.
int getfd_calls = 0;
int getfd_once(int pidfd, int fd)
{
  if (getfd_calls++ == 0) { return gpukit_torch::detail::system_pidfd_getfd(pidfd, fd); }
  return errno = EBADF, -1;
}

/// Copies `bytes` from host to device and waits.
void upload(sim_runtime& sim, void* dst, std::vector<char> const& src, stream_t s)
{
  GPUKIT_CUDA_TRY(
    sim.memcpy_async(dst, src.data(), src.size(), gpukit::memcpy_kind::host_to_device, s));
  GPUKIT_CUDA_TRY(sim.stream_synchronize(s));
}

/// Device bytes, copied to the host.
std::vector<char> download(sim_runtime& sim, void const* src, std::size_t bytes, stream_t s)
{
  std::vector<char> out(bytes);
  GPUKIT_CUDA_TRY(sim.memcpy_async(out.data(), src, bytes, gpukit::memcpy_kind::device_to_host, s));
  GPUKIT_CUDA_TRY(sim.stream_synchronize(s));
  return out;
}

constexpr char const* growable_conf = "segments:growable,growable_shareable:true,page_size:2MiB";

constexpr int capture_modes[] = {cudaStreamCaptureModeGlobal, cudaStreamCaptureModeThreadLocal,
                                 cudaStreamCaptureModeRelaxed};

/// `waiter` waits for the work queued on `on` so far (PyTorch's waiter.wait_stream(on)).
void wait_stream(sim_runtime& sim, stream_t waiter, stream_t on)
{
  sim_runtime::event_type e{};
  GPUKIT_CUDA_TRY(sim.event_create(e));
  GPUKIT_CUDA_TRY(sim.event_record(e, on));
  GPUKIT_CUDA_TRY(sim.stream_wait_event(waiter, e));
  GPUKIT_CUDA_TRY(sim.event_destroy(e));
}

/// What torch.cuda.CUDAGraph does around a capture, through the backend: capture_begin registers
/// the pool with a filter that accepts every stream of this capture (by the runtime's capture id,
/// read with cudaStreamGetCaptureInfo) before cudaStreamBeginCapture; capture_end ends the
/// capture first, then the allocation to the pool.
struct torch_graph {
  sim_runtime& sim;
  sim_backend& b;
  pool_id pool;
  stream_t stream;
  unsigned long long capture_id{0};

  void capture_begin(int mode)
  {
    b.begin_allocate_to_pool(0, pool, [this](stream_t s) {
      unsigned long long id = 0;
      return sim.stream_capture_id(s, id) == cudaSuccess && id != 0 && id == capture_id;
    });
    GPUKIT_CUDA_TRY(sim.begin_capture(stream, mode));
    GPUKIT_CUDA_TRY(sim.stream_capture_id(stream, capture_id));
  }
  cudaError_t capture_end()
  {
    cudaError_t const e = sim.end_capture(stream);
    b.end_allocate_to_pool(0, pool);
    return e;
  }
};

}  // namespace

TEST_SUITE("torch_backend")
{
  TEST_CASE("backend: allocations are recorded, freed by pointer alone, and counted")
  {
    sim_runtime sim{one_device()};
    sim_backend b{sim, conf("segments:synchronous")};
    stream_guard s{sim};
    CHECK(b.allocate(0, 0, s.s) == nullptr);  // PyTorch's empty tensors
    void* p = b.allocate(0, 1000, s.s);
    void* q = b.allocate(0, 3 * MiB, s.s);
    CHECK(b.owns(p));
    CHECK(b.device_of(q) == 0);
    auto st = b.stats(0);
    CHECK(st.allocation.current == 2);
    CHECK(st.allocated_bytes.current == 1024 + 3 * MiB);
    CHECK(st.requested_bytes.current == 1000 + 3 * MiB);
    CHECK(st.reserved_bytes.current >= st.allocated_bytes.current);
    CHECK(st.segment.current >= 1);
    b.deallocate(q);
    st = b.stats(0);
    CHECK(st.allocated_bytes.current == 1024);
    CHECK(st.allocated_bytes.peak == 1024 + 3 * MiB);
    CHECK(st.allocated_bytes.allocated == 1024 + 3 * MiB);
    CHECK(st.allocated_bytes.freed == 3 * MiB);
    CHECK(st.allocation.allocated == 2);
    CHECK(st.allocation.freed == 1);
    // PyTorch's per-pool arrays: 1000 bytes from the small pool, 3 MiB from the large one.
    CHECK(st.small_pool.allocated_bytes.current == 1024);
    CHECK(st.small_pool.requested_bytes.current == 1000);
    CHECK(st.small_pool.allocation.allocated == 1);
    CHECK(st.small_pool.reserved_bytes.current == 2 * MiB);
    CHECK(st.large_pool.allocated_bytes.current == 0);
    CHECK(st.large_pool.allocated_bytes.peak == 3 * MiB);
    CHECK(st.large_pool.allocated_bytes.allocated == 3 * MiB);
    CHECK(st.large_pool.allocated_bytes.freed == 3 * MiB);
    CHECK(st.large_pool.allocation.freed == 1);
    CHECK(st.large_pool.segment.current == 1);
    CHECK(st.segment.current == st.small_pool.segment.current + st.large_pool.segment.current);
    CHECK(st.reserved_bytes.current ==
          st.small_pool.reserved_bytes.current + st.large_pool.reserved_bytes.current);
    CHECK(st.active_bytes.freed ==
          st.small_pool.active_bytes.freed + st.large_pool.active_bytes.freed);
    b.reset_peak_stats(0);
    CHECK(b.stats(0).allocated_bytes.peak == 1024);
    b.reset_accumulated_stats(0);
    CHECK(b.stats(0).allocated_bytes.allocated == 0);
    CHECK(b.stats(0).allocation.allocated == 0);
    CHECK(b.stats(0).allocation.current == 1);  // current values stay
    CHECK(b.stats(0).small_pool.allocated_bytes.allocated == 0);
    CHECK(b.stats(0).small_pool.allocated_bytes.current == 1024);
    CHECK_THROWS_AS(b.deallocate(q), gpukit::logic_error);  // double free
    int local = 0;
    CHECK_THROWS_AS(b.deallocate(&local), gpukit::logic_error);
    b.deallocate(p);
    b.deallocate(nullptr);
    CHECK(b.largest_free_block(0) > 0);
    // PyTorch's cacheInfo: from 0, the device's free memory first (cuDNN's workspace bound).
    std::size_t free = 0, total = 0;
    REQUIRE(sim.mem_get_info(free, total) == gpukit::sim_runtime::success);
    CHECK(b.cache_info(0, 0) == std::max(free, b.largest_free_block(0)));
    CHECK(b.cache_info(0, 1) == b.largest_free_block(0));
    CHECK(b.cache_info(0, total * 2) == total * 2);
    CHECK(b.empty_cache() > 0);
    CHECK(b.stats(0).reserved_bytes.current == 0);
    CHECK(b.stats(1).allocation.current == 0);  // a device never used
  }

  TEST_CASE("backend: graph capture allocates from the pool with no call capture forbids")
  {
    sim_runtime sim{one_device()};
    sim_backend b{sim, conf("segments:stream_ordered")};
    stream_guard cap{sim};
    stream_guard other{sim};
    void* before = b.allocate(0, MiB, cap.s);  // cached on the capture stream before capture
    b.deallocate(before);
    pool_id const pool{1, 0};
    // PyTorch's order: the pool first, then cudaStreamBeginCapture; the filter asks the runtime.
    b.begin_allocate_to_pool(0, pool, [&](stream_t st) {
      bool capturing = false;
      return sim.stream_is_capturing(st, capturing) == cudaSuccess && capturing;
    });
    GPUKIT_CUDA_TRY(sim.begin_capture(cap.s));
    auto const misuse = sim.misuse_count();
    void* g1          = b.allocate(0, MiB, cap.s);
    CHECK(g1 != before);
    void* g2 = b.allocate(0, 30 * MiB, cap.s);
    b.deallocate(g1);  // freed inside the graph: reusable inside it only
    void* g3 = b.allocate(0, MiB, cap.s);
    CHECK(g3 == g1);
    void* o = b.allocate(0, MiB, other.s);  // not captured: the default pool, never g1
    CHECK(o != g1);
    CHECK(sim.misuse_count() == misuse);
    GPUKIT_CUDA_TRY(sim.end_capture(cap.s));
    b.end_allocate_to_pool(0, pool);
    CHECK(b.check_pool_live_allocations(0, pool, {g2, g3}));
    CHECK_FALSE(b.check_pool_live_allocations(0, pool, {g2}));
    CHECK_FALSE(b.check_pool_live_allocations(0, pool, {g2, g3, o}));
    auto const snap = b.snapshot(pool);
    REQUIRE_FALSE(snap.segments.empty());
    for (auto const& seg : snap.segments) { CHECK(seg.owner == pool); }

    // A second graph sharing the pool reuses the blocks the first one freed: no new segment.
    b.deallocate(g3);
    auto const reserved = b.stats(0).reserved_bytes.current;
    b.begin_allocate_to_pool(0, pool, [&](stream_t st) { return st == cap.s; });
    CHECK(b.pool_use_count(0, pool) == 2);
    GPUKIT_CUDA_TRY(sim.begin_capture(cap.s));
    void* h1 = b.allocate(0, MiB, cap.s);
    CHECK(b.stats(0).reserved_bytes.current == reserved);
    CHECK(h1 != o);
    GPUKIT_CUDA_TRY(sim.end_capture(cap.s));
    b.end_allocate_to_pool(0, pool);
    CHECK(sim.misuse_count() == misuse);
    CHECK_THROWS_AS(b.end_allocate_to_pool(0, pool), gpukit::logic_error);

    // Until the last use is released, the pool's memory stays the pool's.
    b.deallocate(h1);
    void* after = b.allocate(0, MiB, cap.s);
    CHECK(after != g1);
    CHECK(after != h1);
    b.deallocate(after);
    b.release_pool(0, pool);
    CHECK(b.pool_use_count(0, pool) == 1);
    b.release_pool(0, pool);
    CHECK(b.pool_use_count(0, pool) == 0);
    CHECK_THROWS_AS(b.release_pool(0, pool), gpukit::logic_error);
    b.deallocate(g2);  // outlived its pool: an ordinary block now
    b.deallocate(o);
    CHECK(gpukit::detail::check_invariants(b.allocator(0)) == "");
    b.allocator(0).forget_stream(cap.s);
    b.allocator(0).forget_stream(other.s);
    b.empty_cache();
    CHECK(b.stats(0).reserved_bytes.current == 0);
  }

  TEST_CASE(
    "backend: a side stream forked from a graph capture allocates, frees and records "
    "streams in every capture mode, as torch.cuda.graph does")
  {
    for (int mode : capture_modes) {
      for (char const* segments : {"segments:stream_ordered", "segments:growable"}) {
        INFO("capture mode " << mode << ", " << segments);
        sim_runtime sim{one_device()};
        sim_backend b{sim, conf(segments)};
        stream_guard s1{sim};
        stream_guard s2{sim};                   // never used before the capture
        void* warm = b.allocate(0, MiB, s1.s);  // the graph's stream is used before capture
        b.deallocate(warm);
        auto const baseline = b.stats(0);
        pool_id const pool{1, 0};
        torch_graph g{sim, b, pool, s1.s};
        g.capture_begin(mode);
        auto const misuse = sim.misuse_count();
        wait_stream(sim, s2.s, s1.s);  // s2.wait_stream(s1)
        void* x = b.allocate(0, 2 * MiB, s1.s);
        void* y = b.allocate(0, 3 * MiB, s2.s);  // allocated on the side stream in the capture
        GPUKIT_CUDA_TRY(sim.memset_async(y, 1, 3 * MiB, s2.s));
        b.record_stream(x, s2.s);  // x used on s2 too (tensor.record_stream)
        void* z = b.allocate(0, MiB, s2.s);
        b.deallocate(z);               // a temporary of the side stream
        wait_stream(sim, s1.s, s2.s);  // join back
        b.deallocate(x);               // used on s2: waits for the capture's end
        CHECK(sim.misuse_count() == misuse);
        REQUIRE(g.capture_end() == cudaSuccess);  // nothing invalidated the capture
        // The graph's outputs stay the pool's (its replays write them).
        CHECK(b.check_pool_live_allocations(0, pool, {y}));
        auto const snap = b.snapshot(pool);
        REQUIRE_FALSE(snap.segments.empty());
        for (auto const& seg : snap.segments) { CHECK(seg.owner == pool); }
        // Replays run on s1 (nothing to run on the simulated GPU); the graph is then reset.
        b.deallocate(y);
        b.release_pool(0, pool);
        CHECK(b.pool_use_count(0, pool) == 0);
        (void)b.empty_cache();  // also brings back x, freed with a use on s2 during the capture
        auto const after = b.stats(0);
        CHECK(after.allocated_bytes.current == baseline.allocated_bytes.current);
        CHECK(after.active_bytes.current == baseline.active_bytes.current);
        CHECK(after.allocation.current == 0);
        CHECK(gpukit::detail::check_invariants(b.allocator(0)) == "");
        b.allocator(0).forget_stream(s1.s);
        b.allocator(0).forget_stream(s2.s);
        (void)b.empty_cache();
        CHECK(b.stats(0).reserved_bytes.current == 0);
      }
    }
  }

  TEST_CASE("backend: a second graph captured on a stream never seen before, in every mode")
  {
    for (int mode : capture_modes) {
      INFO("capture mode " << mode);
      sim_runtime sim{one_device()};
      sim_backend b{sim, conf("segments:growable")};
      stream_guard s1{sim};
      torch_graph first{sim, b, pool_id{1, 0}, s1.s};
      first.capture_begin(mode);  // s1 first met inside the capture
      void* p = b.allocate(0, MiB, s1.s);
      REQUIRE(first.capture_end() == cudaSuccess);

      stream_guard s3{sim};  // the second graph's stream
      stream_guard side{sim};
      torch_graph second{sim, b, pool_id{2, 0}, s3.s};
      second.capture_begin(mode);
      void* q = b.allocate(0, 2 * MiB, s3.s);
      wait_stream(sim, side.s, s3.s);
      void* r = b.allocate(0, MiB, side.s);
      b.record_stream(q, side.s);
      wait_stream(sim, s3.s, side.s);
      b.deallocate(q);
      REQUIRE(second.capture_end() == cudaSuccess);
      CHECK(b.check_pool_live_allocations(0, pool_id{2, 0}, {r}));
      CHECK(b.check_pool_live_allocations(0, pool_id{1, 0}, {p}));
      for (void* v : {p, r}) { b.deallocate(v); }
      b.release_pool(0, pool_id{1, 0});
      b.release_pool(0, pool_id{2, 0});
      (void)b.empty_cache();
      CHECK(b.stats(0).active_bytes.current == 0);
      CHECK(gpukit::detail::check_invariants(b.allocator(0)) == "");
      for (stream_t s : {s1.s, s3.s, side.s}) { b.allocator(0).forget_stream(s); }
      (void)b.empty_cache();
      CHECK(b.stats(0).reserved_bytes.current == 0);
    }
  }

  TEST_CASE(
    "backend: between beginAllocateToPool and the capture's first allocation, work on "
    "other streams makes no call a global capture refuses")
  {
    sim_runtime sim{one_device()};
    sim_backend b{sim, conf("segments:stream_ordered")};
    stream_guard cap{sim};
    stream_guard other{sim};
    stream_guard user{sim};
    // A free waiting on another stream's work: the next allocation would query its event.
    void* used = b.allocate(0, MiB, other.s);
    b.record_stream(used, user.s);
    b.deallocate(used);
    torch_graph g{sim, b, pool_id{1, 0}, cap.s};
    g.capture_begin(cudaStreamCaptureModeGlobal);
    auto const misuse = sim.misuse_count();
    void* o           = b.allocate(0, 2 * MiB, other.s);  // an eager allocation elsewhere, first
    void* p           = b.allocate(0, MiB, cap.s);
    CHECK(sim.misuse_count() == misuse);
    REQUIRE(g.capture_end() == cudaSuccess);
    CHECK_THROWS_AS(b.allocator(0).end_capture_window(), gpukit::logic_error);  // none open now
    b.deallocate(o);
    b.deallocate(p);
    b.release_pool(0, pool_id{1, 0});
    (void)b.empty_cache();
    CHECK(b.stats(0).active_bytes.current == 0);
    CHECK(gpukit::detail::check_invariants(b.allocator(0)) == "");
    for (stream_t s : {cap.s, other.s, user.s}) { b.allocator(0).forget_stream(s); }
  }

  TEST_CASE("caching allocator: resume_capture reuses an ended capture pool, and refuses misuse")
  {
    sim_runtime sim{one_device()};
    gpukit::basic_caching_allocator<sim_runtime> alloc{sim, 0, conf("segments:synchronous")};
    stream_guard a{sim};
    stream_guard c{sim};
    auto const id = alloc.begin_capture(a.s);
    void* p       = alloc.allocate_async(MiB, a.s);
    CHECK_THROWS_AS(alloc.resume_capture(c.s, id), gpukit::logic_error);  // under way
    alloc.end_capture(a.s);
    alloc.deallocate_async(p, MiB, a.s);
    auto const reserved = alloc.stats().reserved_bytes.current;
    alloc.resume_capture(c.s, id);  // another stream, the same pool
    void* q = alloc.allocate_async(MiB, c.s);
    CHECK(q == p);  // the pool's free block, no new segment
    CHECK(alloc.stats().reserved_bytes.current == reserved);
    CHECK_THROWS_AS(alloc.resume_capture(c.s, id), gpukit::logic_error);      // c is capturing
    CHECK_THROWS_AS(alloc.resume_capture(a.s, id + 7), gpukit::logic_error);  // unknown pool
    alloc.end_capture(c.s);
    alloc.deallocate_async(q, MiB, c.s);
    alloc.release_capture_pool(id);
    CHECK(gpukit::detail::check_invariants(alloc) == "");
    alloc.forget_stream(a.s);
    alloc.forget_stream(c.s);
  }

  TEST_CASE("backend: a MemPool routes one thread's allocations, and its blocks come back to it")
  {
    sim_runtime sim{one_device()};
    sim_backend b{sim, conf("segments:synchronous")};
    stream_guard s{sim};
    pool_id const pool{0, 1};
    b.create_or_incref_pool(0, pool);  // MemPool()
    auto const me = std::this_thread::get_id();
    b.begin_allocate_to_pool(0, pool, [me](stream_t) { return std::this_thread::get_id() == me; });
    void* a       = b.allocate(0, 4096, s.s);
    void* foreign = nullptr;
    std::thread{[&] { foreign = b.allocate(0, 4096, s.s); }}.join();  // another thread: default
    void* c = b.allocate(0, 4096, s.s);
    b.end_allocate_to_pool(0, pool);
    b.release_pool(0, pool);
    CHECK(b.check_pool_live_allocations(0, pool, {a, c}));
    CHECK(b.check_pool_live_allocations(0, pool_id{0, 0}, {foreign}));
    b.deallocate(a);
    // Used again: a block freed into the pool serves it again.
    b.begin_allocate_to_pool(0, pool, [me](stream_t) { return std::this_thread::get_id() == me; });
    void* a2 = b.allocate(0, 4096, s.s);
    CHECK(a2 == a);
    b.end_allocate_to_pool(0, pool);
    b.release_pool(0, pool);
    void* plain = b.allocate(0, 4096, s.s);  // outside the pool: never a pool block
    CHECK(plain != a);
    CHECK(plain != c);
    CHECK(b.pool_use_count(0, pool) == 1);
    b.release_pool(0, pool);  // ~MemPool
    for (void* p : {a2, c, foreign, plain}) { b.deallocate(p); }
    CHECK(gpukit::detail::check_invariants(b.allocator(0)) == "");
    b.allocator(0).forget_stream(s.s);
  }

  TEST_CASE("backend: memory fraction is enforced and out-of-memory observers are told")
  {
    sim_runtime sim{one_device(GiB)};
    sim_backend b{sim, conf("segments:synchronous")};
    stream_guard s{sim};
    std::vector<gpukit_torch::oom_info> seen;
    b.add_oom_observer([&](gpukit_torch::oom_info const& i) { seen.push_back(i); });
    b.record_history(true, nullptr, 100, gpukit_torch::record_when::state, false);
    void* ok = b.allocate(0, 200 * MiB, s.s);
    b.set_memory_fraction(0, 0.5);
    CHECK(b.memory_fraction(0) == doctest::Approx(0.5));
    CHECK_THROWS_AS((void)b.allocate(0, 400 * MiB, s.s), gpukit::bad_alloc);
    REQUIRE(seen.size() == 1);
    CHECK(seen[0].device == 0);
    CHECK(seen[0].requested == 400 * MiB);
    CHECK(seen[0].allocated >= 200 * MiB);
    CHECK(seen[0].device_total == GiB);
    CHECK(seen[0].message.find("out of memory") != std::string::npos);
    auto const trace = b.snapshot().traces.at(0);
    CHECK(std::any_of(trace.begin(), trace.end(), [](auto const& e) {
      return e.what == gpukit_torch::trace_entry::action::oom && e.bytes == 400 * MiB;
    }));
    CHECK(b.stats(0).num_ooms == 1);
    b.set_memory_fraction(0, 1.0);
    void* big = b.allocate(0, 400 * MiB, s.s);  // fits again
    CHECK_THROWS_AS(b.set_memory_fraction(0, 1.5), gpukit::logic_error);
    b.deallocate(big);
    b.deallocate(ok);
    b.allocator(0).forget_stream(s.s);
  }

  TEST_CASE("backend: history records contexts, segments and frees; snapshots carry them")
  {
    sim_runtime sim{one_device()};
    sim_backend b{sim, conf("segments:synchronous")};
    stream_guard s{sim};
    int calls     = 0;
    auto recorder = [&] { return std::static_pointer_cast<void>(std::make_shared<int>(++calls)); };
    void* early   = b.allocate(0, 4096, s.s);  // before recording: no context
    b.record_history(true, recorder, 1000, gpukit_torch::record_when::all, true);
    CHECK(b.history_enabled());
    void* p = b.allocate(0, 3 * MiB, s.s);
    b.deallocate(p);
    void* q      = b.allocate(0, 8192, s.s);
    auto const m = b.snapshot();
    REQUIRE(m.traces.size() == 1);
    std::vector<gpukit_torch::trace_entry::action> kinds;
    for (auto const& e : m.traces[0]) { kinds.push_back(e.what); }
    using A = gpukit_torch::trace_entry::action;
    CHECK(std::count(kinds.begin(), kinds.end(), A::alloc) == 2);
    CHECK(std::count(kinds.begin(), kinds.end(), A::free_requested) == 1);
    CHECK(std::count(kinds.begin(), kinds.end(), A::free_completed) == 1);
    CHECK(std::count(kinds.begin(), kinds.end(), A::segment_alloc) >= 1);
    for (auto const& e : m.traces[0]) {
      if (e.what == A::alloc) { CHECK(static_cast<bool>(e.context)); }
      CHECK(e.time_us > 1600000000LL * 1000000LL);  // on the Unix epoch
    }
    for (std::size_t i = 1; i < m.traces[0].size(); ++i) {
      CHECK(m.traces[0][i - 1].time_us <= m.traces[0][i].time_us);
    }
    bool found_q = false, found_early = false;
    for (auto const& seg : m.segments) {
      std::size_t sum = 0;
      for (auto const& blk : seg.blocks) {
        sum += blk.size;
        if (blk.address == reinterpret_cast<std::uintptr_t>(q)) {
          found_q = blk.allocated && blk.context != nullptr && blk.requested == 8192;
        }
        if (blk.address == reinterpret_cast<std::uintptr_t>(early)) {
          found_early = blk.allocated && blk.context == nullptr;
        }
      }
      CHECK(sum == seg.total_size);
    }
    CHECK(found_q);
    CHECK(found_early);
    CHECK(b.snapshot({0, 0}, false).traces.at(0).empty());  // include_traces=false
    b.record_history(false, nullptr, 0, gpukit_torch::record_when::never, true);
    CHECK_FALSE(b.history_enabled());
    int const before = calls;
    b.deallocate(q);
    b.deallocate(early);
    CHECK(calls == before);  // no recorder call once off
    CHECK(b.snapshot().traces.at(0).empty());
    b.allocator(0).forget_stream(s.s);
  }

  TEST_CASE("backend: a pool's checkpoint is restored by freeing what was allocated since")
  {
    sim_runtime sim{one_device()};
    sim_backend b{sim, conf("segments:synchronous")};
    stream_guard s{sim};
    pool_id const pool{3, 0};
    auto on_s = [&](stream_t st) { return st == s.s; };
    b.begin_allocate_to_pool(0, pool, on_s);
    void* kept = b.allocate(0, 4096, s.s);
    b.end_allocate_to_pool(0, pool);
    auto const checkpoint = b.pool_live_blocks(0, pool);
    CHECK(checkpoint == std::vector<void*>{kept});
    b.begin_allocate_to_pool(0, pool, on_s);
    void* later = b.allocate(0, 8192, s.s);
    b.end_allocate_to_pool(0, pool);
    void* outside    = b.allocate(0, 4096, s.s);  // not the pool's: untouched
    auto const freed = b.restore_pool(0, pool, checkpoint);
    CHECK(freed == std::vector<void*>{later});
    CHECK_FALSE(b.owns(later));
    CHECK(b.owns(kept));
    CHECK(b.owns(outside));
    b.deallocate(kept);  // a checkpointed block freed since: cannot be restored
    CHECK_THROWS_AS((void)b.restore_pool(0, pool, checkpoint), gpukit::logic_error);
    b.deallocate(outside);
    b.release_pool(0, pool);
    b.release_pool(0, pool);
    b.allocator(0).forget_stream(s.s);
  }

  TEST_CASE("backend: trace observers see every block event, with history off")
  {
    sim_runtime sim{one_device()};
    sim_backend b{sim, conf("segments:synchronous")};
    stream_guard s{sim};
    std::vector<gpukit_torch::trace_entry> seen;
    b.add_trace_observer([&](gpukit_torch::trace_entry const& e) { seen.push_back(e); });
    void* p = b.allocate(0, 4096, s.s);
    b.deallocate(p);
    REQUIRE(seen.size() == 3);
    CHECK(seen[0].what == gpukit_torch::trace_entry::action::alloc);
    CHECK(seen[0].address == reinterpret_cast<std::uintptr_t>(p));
    CHECK(seen[0].bytes == 4096);
    CHECK(seen[2].what == gpukit_torch::trace_entry::action::free_completed);
    CHECK_FALSE(b.history_enabled());
    CHECK(b.snapshot().traces.at(0).empty());  // observed, not recorded
    b.allocator(0).forget_stream(s.s);
  }

  TEST_CASE("backend: base allocation, and IPC handles in PyTorch's format opened by a child")
  {
    sim_runtime sim{one_device()};
    stream_guard s{sim};
    {
      sim_backend so{sim, conf("segments:stream_ordered")};
      void* p = so.allocate(0, MiB, s.s);
      try {
        (void)so.share_ipc_handle(p);
        FAIL("stream-ordered memory cannot be exported");
      } catch (gpukit::logic_error const& e) {
        CHECK(std::string{e.what()}.find("synchronous") != std::string::npos);
      }
      so.deallocate(p);
      so.allocator(0).forget_stream(s.s);
    }
    sim_backend b{sim, conf("segments:synchronous")};
    void* first             = b.allocate(0, 4096, s.s);
    void* p                 = b.allocate(0, 4096, s.s);  // second block of the same small segment
    auto const [base, size] = b.base_allocation(p);
    CHECK(base <= p);
    CHECK(static_cast<char*>(p) + 4096 <= static_cast<char*>(base) + size);
    std::vector<char> bytes(4096, 'g');
    GPUKIT_CUDA_TRY(
      sim.memcpy_async(p, bytes.data(), 4096, gpukit::memcpy_kind::host_to_device, s.s));
    GPUKIT_CUDA_TRY(sim.stream_synchronize(s.s));
    auto const [handle, offset] = b.share_ipc_handle(p);
    CHECK(handle.size() == 2 + sizeof(gpukit::ipc_mem_handle));
    CHECK(handle.substr(0, 2) == std::string{"\x02"
                                             "c"});
    CHECK(static_cast<char*>(base) + offset == p);
    CHECK_THROWS_AS((void)b.open_ipc_handle("\x02"
                                            "e-expandable"),
                    gpukit::logic_error);
    pid_t const pid = ::fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
      int rc = 1;
      try {
        sim_runtime child{one_device()};
        sim_backend cb{child, conf("segments:synchronous")};
        std::shared_ptr<void> seg   = cb.open_ipc_handle(handle);
        std::shared_ptr<void> again = cb.open_ipc_handle(handle);
        std::vector<char> got(4096);
        if (child.memcpy_async(got.data(), static_cast<char*>(seg.get()) + offset, 4096,
                               gpukit::memcpy_kind::device_to_host, stream_t{}) == cudaSuccess &&
            child.stream_synchronize(stream_t{}) == cudaSuccess) {
          rc = (got == std::vector<char>(4096, 'g') && again.get() == seg.get()) ? 0 : 2;
        }
      } catch (...) {
        rc = 3;
      }
      ::_exit(rc);
    }
    int status = 0;
    REQUIRE(::waitpid(pid, &status, 0) == pid);
    CHECK(WIFEXITED(status));
    CHECK(WEXITSTATUS(status) == 0);
    b.deallocate(p);
    b.deallocate(first);
    b.allocator(0).forget_stream(s.s);
  }

  TEST_CASE("backend: growable blocks travel in PyTorch's expandable-segment format, both ways")
  {
    sim_runtime sim{one_device()};
    stream_guard s{sim};
    sim_backend b{sim, conf(growable_conf)};
    void* first = b.allocate(0, 3 * MiB, s.s);         // pages 0 and 1
    void* p     = b.allocate(0, 3 * MiB + 4096, s.s);  // 1 MiB into page 1, through page 3
    REQUIRE(static_cast<char*>(p) - static_cast<char*>(first) ==
            static_cast<std::ptrdiff_t>(3 * MiB));
    std::vector<char> mine(3 * MiB + 4096, 'x');
    upload(sim, p, mine, s.s);

    auto const [handle, offset] = b.share_ipc_handle(p);
    CHECK(b.sharing_refusal().empty());
    CHECK(offset == MiB);
    std::vector<int> fds;
    for (auto const& page : b.allocator(0).share_pages(p).pages) { fds.push_back(page.fd); }
    REQUIRE(fds.size() == 3);
    CHECK(handle == pytorch_handle(::getpid(), 2 * MiB, fds));  // byte for byte
    CHECK(handle.size() == 2 + 24 + 3 * 4);
    CHECK(b.share_ipc_handle(p).first == handle);  // the same string again: receivers' cache key

    // Opened by another process (a child with a simulated GPU of its own), which reads the
    // sender's bytes, writes its own, and opens the same handle to the same mapping.
    pid_t const pid = ::fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
      int rc = 1;
      try {
        sim_runtime child{one_device()};
        sim_backend cb{child, conf(growable_conf)};
        std::shared_ptr<void> seg   = cb.open_ipc_handle(handle);
        std::shared_ptr<void> again = cb.open_ipc_handle(handle);
        char* at                    = static_cast<char*>(seg.get()) + offset;
        bool const same             = download(child, at, mine.size(), stream_t{}) == mine;
        upload(child, at, std::vector<char>(mine.size(), 'y'), stream_t{});
        rc = same && again.get() == seg.get() ? 0 : 2;
      } catch (std::exception const& e) {
        std::fprintf(stderr, "child: %s\n", e.what());
        rc = 3;
      }
      ::_exit(rc);
    }
    int status = 0;
    REQUIRE(::waitpid(pid, &status, 0) == pid);
    CHECK(WIFEXITED(status));
    CHECK(WEXITSTATUS(status) == 0);
    CHECK(download(sim, p, mine.size(), s.s) == std::vector<char>(mine.size(), 'y'));

    // The other way: a handle as PyTorch's own allocator writes it (pages it created and
    // exported itself), opened by gpukit.
    sim_runtime native{one_device()};
    std::vector<sim_runtime::physical_handle> pages(2);
    std::vector<int> native_fds;
    for (auto& ph : pages) {
      GPUKIT_CUDA_TRY(native.vm_create(ph, 2 * MiB, 0, true));
      int fd = -1;
      GPUKIT_CUDA_TRY(native.vm_export_shareable(fd, ph));
      native_fds.push_back(fd);
    }
    void* va = nullptr;
    GPUKIT_CUDA_TRY(native.vm_reserve(&va, 4 * MiB, 0));
    for (std::size_t i = 0; i < 2; ++i) {
      GPUKIT_CUDA_TRY(native.vm_map(static_cast<char*>(va) + i * 2 * MiB, 2 * MiB, pages[i]));
    }
    GPUKIT_CUDA_TRY(native.vm_set_access(va, 4 * MiB, 0));
    std::vector<char> theirs(4 * MiB, 'n');
    upload(native, va, theirs, stream_t{});
    auto const syncs = sim.calls(gpukit::sim_op::device_synchronize);
    {
      std::shared_ptr<void> opened =
        b.open_ipc_handle(pytorch_handle(::getpid(), 2 * MiB, native_fds));
      CHECK(download(sim, opened.get(), theirs.size(), s.s) == theirs);
      CHECK(sim.calls(gpukit::sim_op::device_synchronize) == syncs);
    }
    // Unmapped once the device's work is done.
    CHECK(sim.calls(gpukit::sim_op::device_synchronize) == syncs + 1);
    GPUKIT_CUDA_TRY(native.vm_unmap(va, 4 * MiB));
    GPUKIT_CUDA_TRY(native.vm_free(va, 4 * MiB));
    for (std::size_t i = 0; i < 2; ++i) {
      GPUKIT_CUDA_TRY(native.vm_release(pages[i]));
      ::close(native_fds[i]);
    }

    // Handles of other layouts are refused, naming what they hold.
    std::string fabric = pytorch_handle(::getpid(), 2 * MiB, {});
    fabric.replace(2 + 16, 8, std::string{"\x02\0\0\0\0\0\0\0", 8});  // 2 pages...
    fabric += std::string(2 * 64, '\0');                              // of 64 bytes
    CHECK_THROWS_WITH_AS((void)b.open_ipc_handle(fabric), doctest::Contains("fabric handles"),
                         gpukit::logic_error);
    CHECK_THROWS_WITH_AS((void)b.open_ipc_handle(handle.substr(0, handle.size() - 2)),
                         doctest::Contains("does not hold one descriptor per page"),
                         gpukit::logic_error);
    // A page count whose byte count wraps around is no descriptor list either.
    std::string wraps = handle;
    wraps.replace(2 + 16, 8, std::string{"\x04\0\0\0\0\0\0\x40", 8});  // 2^62 + 4 pages: 16 bytes
    CHECK_THROWS_WITH_AS((void)b.open_ipc_handle(wraps + std::string(4, '\0')),
                         doctest::Contains("does not hold one descriptor per page"),
                         gpukit::logic_error);
    b.set_torch_version(2, 12);
    CHECK_THROWS_WITH_AS((void)b.share_ipc_handle(p), doctest::Contains("PyTorch 2.12"),
                         gpukit::logic_error);
    b.set_torch_version(2, 4);
    CHECK_THROWS_WITH_AS((void)b.open_ipc_handle(handle), doctest::Contains("segments:synchronous"),
                         gpukit::logic_error);
    b.set_torch_version(2, 11);

    // Freed and released in the sender, the pages' descriptors are closed: a receiver opening
    // the handle late is told why.
    b.deallocate(p);
    b.deallocate(first);
    (void)b.empty_cache();
    try {
      (void)b.open_ipc_handle(handle);
      FAIL("the descriptors were closed");
    } catch (std::system_error const& e) {
      CHECK(e.code().value() == EBADF);
      CHECK(std::string{e.what()}.find("EBADF") != std::string::npos);
      CHECK(std::string{e.what()}.find("GPUKIT_ALLOC_CONF=segments:synchronous") !=
            std::string::npos);
    }
    b.allocator(0).forget_stream(s.s);
  }

  TEST_CASE("backend: each refusal of pidfd_open or pidfd_getfd names its cause and the setting")
  {
    sim_runtime sim{one_device()};
    stream_guard s{sim};
    struct expected {
      int error;
      bool on_open;
      char const* says;
    };
    for (auto const& x : {expected{ENOSYS, false, "Linux 5.6"}, expected{EPERM, false, "ptrace"},
                          expected{ESRCH, true, "exited"}, expected{EBADF, false, "freed"},
                          expected{EMFILE, false, "errno"}}) {
      CAPTURE(x.error);
      // The receiver: the handle cannot be opened, with the errno and why.
      sim_backend sender{sim, conf(growable_conf)};
      void* p                     = sender.allocate(0, 3 * MiB, s.s);
      auto const [handle, offset] = sender.share_ipc_handle(p);
      injected_errno              = x.error;
      int const before            = open_fds();
      {
        pidfd_override o{x.on_open ? gpukit_torch::detail::pidfd_calls{&refuse_open, &refuse_getfd}
                                   : gpukit_torch::detail::pidfd_calls{
                                       &gpukit_torch::detail::system_pidfd_open, &refuse_getfd}};
        sim_backend receiver{sim, conf(growable_conf)};
        try {
          (void)receiver.open_ipc_handle(handle);
          FAIL("the refusal was not reported");
        } catch (std::system_error const& e) {
          std::string const what = e.what();
          CHECK(e.code().value() == x.error);
          CHECK(what.find(x.on_open ? "pidfd_open(process " : "pidfd_getfd(process ") !=
                std::string::npos);
          CHECK(what.find(std::to_string(::getpid())) != std::string::npos);
          CHECK(what.find(x.says) != std::string::npos);
          CHECK(what.find("GPUKIT_ALLOC_CONF=segments:synchronous") != std::string::npos);
        }
        // The sender: its probe meets the same refusal, so sharing fails in the sharing thread.
        sim_backend refused{sim, conf(growable_conf)};
        void* q = refused.allocate(0, MiB, s.s);
        try {
          (void)refused.share_ipc_handle(q);
          FAIL("the probe's refusal was not reported");
        } catch (std::system_error const& e) {
          CHECK(e.code().value() == x.error);
          CHECK(std::string{e.what()}.find("cannot be shared with another process") !=
                std::string::npos);
          CHECK(std::string{e.what()}.find(x.says) != std::string::npos);
          CHECK(std::string{e.what()}.find("segments:synchronous") != std::string::npos);
        }
        CHECK_FALSE(refused.sharing_refusal().empty());
        refused.deallocate(q);
        refused.allocator(0).forget_stream(s.s);
      }
      CHECK(open_fds() == before);  // nothing leaked on the way out
      sender.deallocate(p);
      sender.allocator(0).forget_stream(s.s);
    }
    {
      // Descriptors taken before a later page's refusal are closed.
      sim_backend sender{sim, conf(growable_conf)};
      void* p           = sender.allocate(0, 5 * MiB, s.s);
      auto const handle = sender.share_ipc_handle(p).first;
      int const before  = open_fds();
      getfd_calls       = 0;
      pidfd_override o{{&gpukit_torch::detail::system_pidfd_open, &getfd_once}};
      sim_backend receiver{sim, conf(growable_conf)};
      CHECK_THROWS_AS((void)receiver.open_ipc_handle(handle), std::system_error);
      CHECK(getfd_calls == 2);
      CHECK(open_fds() == before);
      sender.deallocate(p);
      sender.allocator(0).forget_stream(s.s);
    }
    {
      // cudaMalloc segments travel as CUDA IPC handles: no probe, no refusal.
      injected_errno = EPERM;
      pidfd_override o{{&refuse_open, &refuse_getfd}};
      sim_backend sync{sim, conf("segments:synchronous")};
      void* p = sync.allocate(0, MiB, s.s);
      CHECK(sync.share_ipc_handle(p).first.substr(0, 2) == std::string{"\x02"
                                                                       "c"});
      sync.deallocate(p);
      sync.allocator(0).forget_stream(s.s);
    }
    // The variable tests use to refuse pidfd_getfd in whole programs names errnos.
    CHECK(gpukit_torch::detail::errno_from_name("EPERM") == EPERM);
    CHECK(gpukit_torch::detail::errno_from_name("ENOSYS") == ENOSYS);
    CHECK(gpukit_torch::detail::errno_from_name("9") == 9);
    CHECK(gpukit_torch::detail::errno_from_name("EPERMX") == 0);
    CHECK(gpukit_torch::detail::errno_from_name("") == 0);
    CHECK(gpukit_torch::detail::errno_from_name(nullptr) == 0);
  }

  TEST_CASE("backend: enablePeerAccess gives the peer the growable pages and opened blocks")
  {
    sim_runtime sim{gpukit::sim_config{}.with_devices(2, 4 * GiB)};
    GPUKIT_CUDA_TRY(sim.set_device(1));
    stream_guard s{sim};  // a stream of device 1
    sim_backend b{sim, conf(growable_conf)};
    void* p = b.allocate(1, 3 * MiB, s.s);
    CHECK_FALSE(sim.vm_accessible(p, 0));
    auto const handle            = b.share_ipc_handle(p).first;
    std::shared_ptr<void> opened = b.open_ipc_handle(handle);  // mapped for device 1 (current)
    CHECK(sim.vm_accessible(opened.get(), 1));
    CHECK_FALSE(sim.vm_accessible(opened.get(), 0));
    b.grant_peer_access(0, 1);  // device 0 may access device 1's memory
    CHECK(sim.vm_accessible(p, 0));
    CHECK(sim.vm_accessible(opened.get(), 0));
    void* q = b.allocate(1, 20 * MiB, s.s);  // mapped later: granted too
    CHECK(sim.vm_accessible(static_cast<char*>(q) + 20 * MiB - 1, 0));
    void* r                  = b.allocate(1, 4 * MiB, s.s);
    std::shared_ptr<void> r2 = b.open_ipc_handle(b.share_ipc_handle(r).first);  // opened later
    CHECK(sim.vm_accessible(r2.get(), 0));
    CHECK_THROWS_AS(b.grant_peer_access(-1, 1), gpukit::logic_error);
    opened.reset();
    r2.reset();
    for (void* x : {p, q, r}) { b.deallocate(x); }
    b.allocator(1).forget_stream(s.s);
    GPUKIT_CUDA_TRY(sim.set_device(0));
  }
}

TEST_SUITE("torch_backend")
{
  TEST_CASE("backend: a mixed-size workload gives PyTorch's memory_stats() numbers")
  {
    // Sizes on both sides of 512, of the small pool's 1 MiB, of PyTorch's 10 MiB segment
    // threshold, and not multiples of 512 (gpukit alone would round them to 256).
    std::vector<std::size_t> const sizes{
      1,         511, 512,     513,     1000,          4096,         65537,
      MiB - 100, MiB, MiB + 1, 3 * MiB, 5 * MiB + 300, 10 * MiB + 1, 32 * MiB + 777};
    for (char const* text : {"", "segments:synchronous", "roundup_power2_divisions:4",
                             "roundup_power2_divisions:[1:2,4:8,>:4],segments:synchronous"}) {
      CAPTURE(text);
      sim_runtime sim{one_device()};
      auto const c = torch_conf(text);
      sim_backend b{sim, c};
      stream_guard s{sim};
      pytorch_model m;
      m.rounding = c.rounding;
      std::vector<std::pair<void*, std::size_t>> held;  // (pointer, model handle)
      for (int round = 0; round < 3; ++round) {
        for (std::size_t i = 0; i < sizes.size(); ++i) {
          std::size_t const bytes = sizes[(i * 5 + static_cast<std::size_t>(round)) % sizes.size()];
          held.emplace_back(b.allocate(0, bytes, s.s), m.alloc(bytes));
        }
        check_pytorch_numbers(b.stats(0), m);
        // Free every other block, oldest first: frees and reuse mix with new allocations.
        for (std::size_t i = 0; i < held.size(); i += 2) {
          b.deallocate(held[i].first);
          m.free(held[i].second);
        }
        std::vector<std::pair<void*, std::size_t>> kept;
        for (std::size_t i = 1; i < held.size(); i += 2) { kept.push_back(held[i]); }
        held = kept;
        check_pytorch_numbers(b.stats(0), m);
        if (round == 1) {  // PyTorch's resets
          b.reset_peak_stats(0);
          b.reset_accumulated_stats(0);
          for (auto* a : {&m.allocation, &m.allocated_bytes, &m.requested_bytes}) {
            for (auto& st : *a) {
              st.peak      = st.current;
              st.allocated = 0;
              st.freed     = 0;
            }
          }
          check_pytorch_numbers(b.stats(0), m);
        }
      }
      auto const st = b.stats(0);
      CHECK(st.reserved_bytes.current >= st.allocated_bytes.current);
      CHECK(st.small_pool.reserved_bytes.current >= st.small_pool.allocated_bytes.current);
      CHECK(st.large_pool.reserved_bytes.current >= st.large_pool.allocated_bytes.current);
      for (auto const& [p, h] : held) {
        b.deallocate(p);
        m.free(h);
      }
      check_pytorch_numbers(b.stats(0), m);
      CHECK(b.stats(0).allocated_bytes.current == 0);
      CHECK(gpukit::detail::check_invariants(b.allocator(0)).empty());
    }
  }

  TEST_CASE("backend: PyTorch's worked example: 512 B, 1 MiB, 3 MiB and 10 MiB + 1 B")
  {
    sim_runtime sim{one_device()};
    sim_backend b{sim, torch_conf("")};
    stream_guard s{sim};
    std::vector<void*> ps;
    for (std::size_t n : {std::size_t{512}, MiB, 3 * MiB, 10 * MiB + 1}) {
      ps.push_back(b.allocate(0, n, s.s));
    }
    auto const st = b.stats(0);
    CHECK(st.allocated_bytes.current == 14681088);  // native PyTorch 2.11's memory_allocated()
    CHECK(st.requested_bytes.current == 512 + MiB + 3 * MiB + 10 * MiB + 1);
    CHECK(st.small_pool.allocated_bytes.current == 512 + MiB);
    CHECK(st.large_pool.allocated_bytes.current == 3 * MiB + 10 * MiB + 512);
    CHECK(st.small_pool.allocation.current == 2);
    CHECK(st.large_pool.allocation.current == 2);
    // The snapshot names the bytes asked for and the rounded block.
    auto const snap = b.snapshot();
    bool found      = false;
    for (auto const& seg : snap.segments) {
      for (auto const& blk : seg.blocks) {
        if (blk.allocated && blk.requested == 10 * MiB + 1) {
          found = true;
          CHECK(blk.size == 10 * MiB + 512);
        }
      }
    }
    CHECK(found);
    for (void* p : ps) { b.deallocate(p); }
    // A size no rounding can hold is refused as too large, not rounded to 0.
    CHECK_THROWS_AS((void)b.allocate(0, ~std::size_t{0} - 10, s.s), gpukit::bad_alloc);
    CHECK_THROWS_AS((void)b.allocate(0, (~std::size_t{0} >> 1) + 1, s.s), gpukit::bad_alloc);
    CHECK(b.stats(0).allocation.current == 0);
  }

  TEST_CASE("backend: a block freed while another stream uses it stays active, not allocated")
  {
    sim_runtime sim{one_device()};
    sim_backend b{sim, torch_conf("segments:synchronous")};
    stream_guard s{sim}, other{sim};
    void* p = b.allocate(0, 1000, s.s);
    b.record_stream(p, other.s);
    GPUKIT_CUDA_TRY(sim.stall(other.s));  // its work, and so the free, cannot complete
    b.deallocate(p);
    auto st = b.stats(0);
    CHECK(st.allocation.current == 0);
    CHECK(st.allocated_bytes.current == 0);
    CHECK(st.active.current == 1);
    CHECK(st.active_bytes.current == 1024);
    CHECK(st.small_pool.active_bytes.current == 1024);
    CHECK(st.active_bytes.freed == 0);
    // A new block while the old one waits: the active peak counts both.
    void* q = b.allocate(0, 2000, s.s);
    st      = b.stats(0);
    CHECK(st.active_bytes.current == 1024 + 2048);
    CHECK(st.active_bytes.peak == 1024 + 2048);
    CHECK(st.allocated_bytes.peak == 2048);
    GPUKIT_CUDA_TRY(sim.release(other.s));
    GPUKIT_CUDA_TRY(sim.stream_synchronize(other.s));
    b.deallocate(q);
    void* r = b.allocate(0, 3000, s.s);  // polls the completed free
    st      = b.stats(0);
    CHECK(st.active_bytes.current == 3072);
    CHECK(st.active_bytes.peak == 1024 + 2048);
    CHECK(st.active_bytes.freed == 1024 + 2048);
    CHECK(st.active_bytes.allocated == 1024 + 2048 + 3072);
    b.deallocate(r);
    b.allocator(0).forget_stream(other.s);
  }

  TEST_CASE("backend: growable segments are the default; without virtual memory, synchronous")
  {
    {
      sim_runtime sim{one_device()};
      sim_backend b{sim, gpukit_torch::parse_backend_conf(gpukit_torch::backend_default_conf)};
      stream_guard s{sim};
      void* p = b.allocate(0, 3 * MiB, s.s);
      CHECK(b.allocator(0).segment_source_in_use() == gpukit::segment_source::growable);
      CHECK(b.snapshot().segments.at(0).is_expandable);
      b.deallocate(p);
    }
    sim_runtime sim{gpukit::sim_config{}.with_devices(2, 4 * GiB).with_virtual_memory(false)};
    sim_backend b{sim, gpukit_torch::parse_backend_conf(gpukit_torch::backend_default_conf)};
    std::vector<std::string> warnings;
    b.set_warning_handler([&](std::string const& w) { warnings.push_back(w); });
    stream_guard s{sim};
    void* p = b.allocate(0, 3 * MiB, s.s);
    CHECK(b.allocator(0).segment_source_in_use() == gpukit::segment_source::synchronous);
    CHECK_FALSE(b.snapshot().segments.at(0).is_expandable);
    CHECK(b.stats(0).allocated_bytes.current == 3 * MiB);
    CHECK(b.allocator(1).segment_source_in_use() == gpukit::segment_source::synchronous);
    REQUIRE(warnings.size() == 1);  // once, for both devices
    CHECK(warnings[0].find("device 0") != std::string::npos);
    CHECK(warnings[0].find("no virtual memory management") != std::string::npos);
    CHECK(warnings[0].find("segments:synchronous") != std::string::npos);
    b.deallocate(p);
    // Asking for synchronous segments gives no warning.
    sim_backend quiet{sim, torch_conf("segments:synchronous")};
    quiet.set_warning_handler([&](std::string const& w) { warnings.push_back(w); });
    CHECK(quiet.allocator(0).segment_source_in_use() == gpukit::segment_source::synchronous);
    CHECK(warnings.size() == 1);
  }

  TEST_CASE("backend: per_process_memory_fraction limits each device from the start")
  {
    sim_runtime sim{one_device(GiB)};
    sim_backend b{sim, torch_conf("per_process_memory_fraction:0.25")};
    stream_guard s{sim};
    CHECK(b.memory_fraction(0) == doctest::Approx(0.25));
    void* p = b.allocate(0, 200 * MiB, s.s);
    CHECK_THROWS_AS((void)b.allocate(0, 100 * MiB, s.s), gpukit::bad_alloc);
    b.deallocate(p);
  }
}

TEST_SUITE("sim_concurrency")
{
  TEST_CASE("backend: a training step's two threads (forward, autograd) keep every peak exact")
  {
    // The main thread allocates activations (the step's peak comes at the end of the forward),
    // the autograd thread frees them while it allocates smaller gradients, as a training step
    // does. Up to exact_stats_threads writers nothing is batched: the peaks read afterwards, when
    // far less is held, are the true ones (batched, a shard's delta of up to 4 MiB would hide it).
    sim_runtime sim{one_device(16 * GiB)};
    sim_backend b{sim, torch_conf("")};
    std::vector<std::pair<void*, std::size_t>> held;
    std::int64_t live = 0, peak = 0;
    auto take = [&](std::size_t bytes) {
      held.emplace_back(b.allocate(0, bytes, stream_t{}), bytes);
      live += static_cast<std::int64_t>(gpukit_torch::size_rounding{}.round_size(bytes));
      peak = std::max(peak, live);
    };
    auto give = [&] {
      b.deallocate(held.front().first);
      live -=
        static_cast<std::int64_t>(gpukit_torch::size_rounding{}.round_size(held.front().second));
      held.erase(held.begin());
    };
    take(4096);  // the main thread first: the autograd thread ends the single-thread mode
    // The autograd thread, as PyTorch's: one for the whole run, woken for each backward.
    std::atomic<int> backwards{0}, done{0};
    std::thread autograd{[&] {
      for (int step = 0; step < 3; ++step) {
        while (backwards.load() == step) { std::this_thread::yield(); }
        for (std::size_t i = 0; i < 20; ++i) {
          give();
          give();
          take(256 * 1024 + 512 * i);  // a gradient
        }
        done.store(step + 1);
      }
    }};
    for (int step = 0; step < 3; ++step) {
      b.reset_peak_stats(0);
      peak = live;
      // The forward: activations of 1 to 2 MiB.
      for (std::size_t i = 0; i < 40; ++i) { take(MiB + 512 * 1024 * (i % 3) + 512 * i); }
      backwards.store(step + 1);
      while (done.load() == step) { std::this_thread::yield(); }
      auto const st = b.stats(0);
      CHECK(st.allocated_bytes.current == live);
      CHECK(st.allocated_bytes.peak == peak);
      CHECK(st.active_bytes.peak == peak);
      CHECK(st.allocation.current == static_cast<std::int64_t>(held.size()));
      while (held.size() > 1) { give(); }  // the optimizer's step, on the main thread
    }
    autograd.join();
    give();
    CHECK(b.stats(0).allocated_bytes.current == 0);
  }

  TEST_CASE("backend: threads allocating and freeing mixed sizes at once keep the counts exact")
  {
    constexpr int threads = 16, held = 8, rounds = 200;
    // Small and large blocks, some rounded up (PyTorch's sizes: 512-byte multiples).
    constexpr std::array<std::size_t, 6> sizes{1000, 512, 4096 + 1, MiB, MiB + 1, 3 * MiB};
    sim_runtime sim{one_device(16 * GiB)};
    sim_backend b{sim, torch_conf("segments:synchronous")};
    stream_guard other{sim};
    std::deque<stream_guard> streams;  // never moved: each destroys its stream
    for (int t = 0; t < threads; ++t) { streams.emplace_back(sim); }

    struct totals {
      std::int64_t blocks[2]{}, rounded[2]{}, requested[2]{};  // [small, large]
      std::int64_t first_rounded{0};                           // of the blocks held at the barrier
      int failures{0};
    };
    std::vector<totals> per_thread(threads);
    std::atomic<int> arrived{0};
    std::atomic<bool> done{false};
    std::atomic<int> reader_failures{0};
    gpukit_torch::size_rounding const rounding{};

    auto work = [&](int t) {
      totals& mine     = per_thread[static_cast<std::size_t>(t)];
      stream_t const s = streams[static_cast<std::size_t>(t)].s;
      struct block {
        void* p;
        std::size_t bytes;
        unsigned char value;
      };
      std::vector<block> live;
      auto take = [&](std::size_t i) {
        std::size_t const bytes = sizes[(i + static_cast<std::size_t>(t)) % sizes.size()];
        auto const value        = static_cast<unsigned char>(1 + (i * 7 + t) % 251);
        void* p                 = b.allocate(0, bytes, s);
        GPUKIT_CUDA_TRY(sim.memset_async(p, value, bytes, s));
        if (i % 5 == 0) { b.record_stream(p, other.s); }  // its free may wait: active, not held
        std::size_t const rounded = rounding.round_size(bytes);
        std::size_t const kind    = rounded > MiB ? 1 : 0;
        mine.blocks[kind] += 1;
        mine.rounded[kind] += static_cast<std::int64_t>(rounded);
        mine.requested[kind] += static_cast<std::int64_t>(bytes);
        live.push_back({p, bytes, value});
      };
      auto give = [&](std::size_t k) {
        block const x = live[k];
        std::array<unsigned char, 64> head{}, tail{};
        GPUKIT_CUDA_TRY(
          sim.memcpy_async(head.data(), x.p, head.size(), gpukit::memcpy_kind::device_to_host, s));
        GPUKIT_CUDA_TRY(sim.memcpy_async(tail.data(),
                                         static_cast<char*>(x.p) + x.bytes - tail.size(),
                                         tail.size(), gpukit::memcpy_kind::device_to_host, s));
        GPUKIT_CUDA_TRY(sim.stream_synchronize(s));
        for (std::size_t j = 0; j < head.size(); ++j) {
          if (head[j] != x.value || tail[j] != x.value) { ++mine.failures; }
        }
        b.deallocate(x.p);
        live[k] = live.back();
        live.pop_back();
      };
      std::size_t i = 0;
      for (; i < held; ++i) { take(i); }
      for (block const& x : live) {
        mine.first_rounded += static_cast<std::int64_t>(rounding.round_size(x.bytes));
      }
      // Every thread holds its first blocks at once before any is freed: a known peak.
      arrived.fetch_add(1);
      while (arrived.load() < threads) { std::this_thread::yield(); }
      for (int r = 0; r < rounds; ++r, ++i) {
        give((i * 3) % live.size());
        take(i);
      }
      while (!live.empty()) { give(live.size() - 1); }
      // Then pairs back to back, with no copy between: every count written as often as it can be.
      for (std::size_t j = 0; j < 2000; ++j, ++i) {
        std::size_t const bytes   = sizes[(i + static_cast<std::size_t>(t)) % sizes.size()];
        std::size_t const rounded = rounding.round_size(bytes);
        std::size_t const kind    = rounded > MiB ? 1 : 0;
        b.deallocate(b.allocate(0, bytes, s));
        mine.blocks[kind] += 1;
        mine.rounded[kind] += static_cast<std::int64_t>(rounded);
        mine.requested[kind] += static_cast<std::int64_t>(bytes);
      }
    };
    // A reader meanwhile: the statistics it gets never have a peak below their current value.
    std::thread reader{[&] {
      while (!done.load()) {
        auto const st = b.stats(0);
        for (auto const* pool : {static_cast<gpukit_torch::device_pool_stats const*>(&st),
                                 &st.small_pool, &st.large_pool}) {
          for (auto const* x : {&pool->allocation, &pool->allocated_bytes, &pool->requested_bytes,
                                &pool->active, &pool->active_bytes}) {
            if (x->peak < x->current) { reader_failures.fetch_add(1); }
          }
        }
        std::this_thread::yield();
      }
    }};
    std::vector<std::thread> workers;
    for (int t = 0; t < threads; ++t) { workers.emplace_back(work, t); }
    for (auto& w : workers) { w.join(); }
    done.store(true);
    reader.join();

    totals all;
    std::int64_t held_rounded = 0;
    for (totals const& t : per_thread) {
      for (int k = 0; k < 2; ++k) {
        all.blocks[k] += t.blocks[k];
        all.rounded[k] += t.rounded[k];
        all.requested[k] += t.requested[k];
      }
      held_rounded += t.first_rounded;
      all.failures += t.failures;
    }
    CHECK(all.failures == 0);  // no two blocks overlapped
    CHECK(reader_failures.load() == 0);
    auto const st = b.stats(0);
    std::array<gpukit_torch::device_pool_stats const*, 2> const pools{&st.small_pool,
                                                                      &st.large_pool};
    for (std::size_t k = 0; k < 2; ++k) {
      CAPTURE(k);
      gpukit_torch::device_pool_stats const& p = *pools[k];
      CHECK(p.allocation.current == 0);
      CHECK(p.allocated_bytes.current == 0);
      CHECK(p.requested_bytes.current == 0);
      CHECK(p.allocation.allocated == all.blocks[k]);
      CHECK(p.allocation.freed == all.blocks[k]);
      CHECK(p.allocated_bytes.allocated == all.rounded[k]);
      CHECK(p.allocated_bytes.freed == all.rounded[k]);
      CHECK(p.requested_bytes.allocated == all.requested[k]);
      CHECK(p.requested_bytes.freed == all.requested[k]);
      CHECK(p.active.allocated == all.blocks[k]);
      CHECK(p.active_bytes.allocated == all.rounded[k]);
    }
    CHECK(st.allocation.current == 0);
    CHECK(st.allocation.allocated == all.blocks[0] + all.blocks[1]);
    CHECK(st.allocation.freed == st.allocation.allocated);
    CHECK(st.allocated_bytes.freed == all.rounded[0] + all.rounded[1]);
    CHECK(st.requested_bytes.freed == all.requested[0] + all.requested[1]);
    // At the barrier every thread held its first blocks: the peaks are batched (per records
    // shard), so at most the batches below.
    CHECK(st.allocation.peak >=
          threads * held - 2 * sim_backend::stats_slots * sim_backend::stats_batch_count);
    CHECK(st.allocated_bytes.peak >=
          held_rounded - 2 * sim_backend::stats_slots * sim_backend::stats_batch_bytes);
    CHECK(st.active.peak >= st.allocation.peak);
    CHECK(st.active_bytes.peak >= st.allocated_bytes.peak);
    CHECK(st.allocated_bytes.peak <= all.rounded[0] + all.rounded[1]);
    // Once the frees waiting on `other` complete, nothing is active.
    GPUKIT_CUDA_TRY(sim.stream_synchronize(other.s));
    b.deallocate(b.allocate(0, 512, streams[0].s));  // polls the completed frees
    CHECK(b.stats(0).active.current == 0);
    CHECK(b.stats(0).active_bytes.current == 0);
    b.reset_peak_stats(0);
    CHECK(b.stats(0).allocated_bytes.peak == 0);
    b.reset_accumulated_stats(0);
    CHECK(b.stats(0).allocation.allocated == 0);
    CHECK(b.stats(0).allocation.freed == 0);
    for (auto& g : streams) { b.allocator(0).forget_stream(g.s); }
    b.allocator(0).forget_stream(other.s);
  }

  TEST_CASE(
    "backend: batched statistics: exact current values with threads alive, and a peak made "
    "between barriers at most the batches below the true one, never above")
  {
    constexpr int threads = 8, per_thread = 300;
    sim_runtime sim{one_device(64 * GiB)};
    sim_backend b{sim, torch_conf("segments:synchronous")};
    std::deque<stream_guard> streams;
    for (int t = 0; t < threads; ++t) { streams.emplace_back(sim); }
    gpukit_torch::size_rounding const rounding{};
    // [statistic][kind]: blocks, rounded bytes, requested bytes; small, large, both.
    using sums = std::array<std::array<std::int64_t, 3>, 3>;
    auto count = [&](sums& m, std::size_t bytes, int sign) {
      std::size_t const rounded = rounding.round_size(bytes);
      std::size_t const kind    = rounded > MiB ? 1 : 0;
      for (std::size_t i : {kind, std::size_t{2}}) {
        m[0][i] += sign;
        m[1][i] += sign * static_cast<std::int64_t>(rounded);
        m[2][i] += sign * static_cast<std::int64_t>(bytes);
      }
    };
    auto stats_of = [](gpukit_torch::device_stats const& st, std::size_t i) {
      gpukit_torch::device_pool_stats const& p = i == 0   ? st.small_pool
                                                 : i == 1 ? st.large_pool
                                                          : st;
      return std::array<gpukit_torch::stat, 5>{p.allocation, p.allocated_bytes, p.requested_bytes,
                                               p.active, p.active_bytes};
    };
    auto slack = [](std::size_t statistic, std::size_t i) {
      std::int64_t const batch = statistic == 0 || statistic == 3 ? sim_backend::stats_batch_count
                                                                  : sim_backend::stats_batch_bytes;
      return (i == 2 ? 2 : 1) * sim_backend::stats_slots * batch;
    };
    for (int const round : {0, 1}) {
      CAPTURE(round);
      std::vector<std::vector<std::pair<void*, std::size_t>>> blocks(threads);
      std::vector<sums> held(threads);
      std::mutex m;
      std::condition_variable cv;
      int arrived = 0, phase = 0;
      auto meet = [&] {  // every worker and the main thread
        std::unique_lock<std::mutex> lock{m};
        int const p = phase;
        if (++arrived == threads + 1) {
          arrived = 0;
          ++phase;
          cv.notify_all();
          return;
        }
        cv.wait(lock, [&] { return phase != p; });
      };
      std::vector<std::thread> workers;
      for (int t = 0; t < threads; ++t) {
        workers.emplace_back([&, t] {
          std::uint64_t rng = 0x9e3779b97f4a7c15ull * static_cast<std::uint64_t>(t + 1 + round);
          auto next         = [&] {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            return rng;
          };
          stream_t const s = streams[static_cast<std::size_t>(t)].s;
          auto& mine       = blocks[static_cast<std::size_t>(t)];
          for (int k = 0; k < (round == 0 ? per_thread : per_thread / 3); ++k) {
            std::size_t const bytes = next() % 2 == 0 ? 1 + next() % MiB : MiB + next() % (5 * MiB);
            mine.emplace_back(b.allocate(0, bytes, s), bytes);
            count(held[static_cast<std::size_t>(t)], bytes, 1);
          }
          meet();  // the main thread reads with every thread holding its blocks, alive
          meet();
          // Each frees the next thread's blocks: only allocations came before the first meeting,
          // so the sum there is the true peak.
          for (auto const& [p, bytes] : blocks[static_cast<std::size_t>((t + 1) % threads)]) {
            b.deallocate(p);
          }
        });
      }
      meet();
      sums truth{};
      for (sums const& h : held) {
        for (std::size_t x = 0; x < 3; ++x) {
          for (std::size_t i = 0; i < 3; ++i) { truth[x][i] += h[x][i]; }
        }
      }
      {
        auto const st = b.stats(0);
        for (std::size_t i = 0; i < 3; ++i) {
          CAPTURE(i);
          auto const v = stats_of(st, i);
          for (std::size_t x = 0; x < 5; ++x) {
            CAPTURE(x);
            CHECK(v[x].current == truth[x % 3][i]);  // active: no free waits on a stream
          }
        }
      }
      meet();
      for (auto& w : workers) { w.join(); }
      auto const st = b.stats(0);
      for (std::size_t i = 0; i < 3; ++i) {
        CAPTURE(i);
        auto const v = stats_of(st, i);
        for (std::size_t x = 0; x < 5; ++x) {
          CAPTURE(x);
          CHECK(v[x].current == 0);
          CHECK(v[x].peak <= truth[x % 3][i]);
          CHECK(v[x].peak >= truth[x % 3][i] - slack(x, i));
        }
      }
      b.reset_peak_stats(0);
      CHECK(b.stats(0).allocated_bytes.peak == 0);
      CHECK(b.stats(0).large_pool.requested_bytes.peak == 0);
      CHECK(b.stats(0).active.peak == 0);
    }
    for (auto& g : streams) { b.allocator(0).forget_stream(g.s); }
  }
}
