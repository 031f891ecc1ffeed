// SPDX-License-Identifier: Apache-2.0
// The PyTorch backend's translation layer on the simulated GPU: what the c10 CUDAAllocator
// subclass forwards to it (allocation, private pools for graph capture and MemPool, statistics,
// memory fraction, out-of-memory observers, history with contexts, snapshots, IPC handles).
#include <gpukit/memory/alloc_conf.hpp>
#include <gpukit/memory/detail/allocator_invariants.hpp>
#include <gpukit/runtime/sim_runtime.hpp>
#include <gpukit_torch/backend.hpp>

#include <doctest/doctest.h>

#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <string>
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

struct stream_guard {
  sim_runtime& rt;
  stream_t s{};
  explicit stream_guard(sim_runtime& r) : rt{r} { GPUKIT_CUDA_TRY(rt.stream_create(s)); }
  ~stream_guard() { (void)rt.stream_destroy(s); }
};

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
}
