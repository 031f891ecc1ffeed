// SPDX-License-Identifier: Apache-2.0
// detail::caching::thread_cache_front alone over the simulated GPU's types, with a pool of its own
// around it in place of the allocator's (its front_operations): a thread finds its cache again
// without the lock, one cache per front (allocator) and thread; freed blocks stay in the cache of
// the stream they were freed on, within its limits; drain and flush return every cached block to
// the pool under its lock; a thread that exits returns its cached blocks and leaves its cache,
// counters intact, to the next thread; a thread that meets contention on the pool lock caches
// larger blocks, and lowers that again once it meets none; a front that left is no longer called
// by exiting threads.
#include <gpukit/memory/caching_allocator_options.hpp>
#include <gpukit/memory/detail/caching/thread_cache_front.hpp>
#include <gpukit/memory/detail/caching_block.hpp>
#include <gpukit/runtime/sim_runtime.hpp>

#include <doctest/doctest.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <future>
#include <memory>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

namespace {

using gpukit::sim_runtime;
using block      = gpukit::detail::caching_block<sim_runtime>;
using front      = gpukit::detail::caching::thread_cache_front<sim_runtime>;
using cache      = front::cache;
using sim_stream = sim_runtime::stream_type;

sim_stream stream_at(std::uintptr_t n) { return reinterpret_cast<sim_stream>(n * 64); }

/// The pool around the front, in place of the allocator's: its lock, and what the front tells it.
struct pool_state {
  std::mutex mutex;
  bool held{false};
  std::vector<std::pair<sim_stream, block*>> freed;
  int freed_unlocked{0};  // blocks given back without the lock held
  int wakes{0};
  int shares{0};
  std::size_t caches_at_share{0};
  bool shared_on{false};
  int joins{0};
};

struct fake_pool {
  pool_state& s;

  static fake_pool of(void* context) { return fake_pool{*static_cast<pool_state*>(context)}; }
  [[nodiscard]] void* context() const noexcept { return &s; }
  template <class F>
  void locked(F&& f) const
  {
    std::lock_guard<std::mutex> lock{s.mutex};
    s.held = true;
    f();
    s.held = false;
  }
  void free_to_pool(block* b, sim_stream stream) const
  {
    if (!s.held) { ++s.freed_unlocked; }
    s.freed.emplace_back(stream, b);
  }
  void wake_waiters() const { ++s.wakes; }
  void share_counts(front::cache_list const& caches) const
  {
    ++s.shares;
    s.caches_at_share = caches.size();
  }
  void join_counts(cache& tc) const
  {
    if (s.shared_on && !tc.joined) { ++s.joins; }
  }
};

/// Blocks of `size` bytes at distinct addresses (descriptors stay put: a deque).
struct blocks {
  std::deque<block> all;
  block* make(std::size_t size)
  {
    block& b = all.emplace_back();
    b.ptr.store(0x10000000 + all.size() * 0x100000);
    b.size = size;
    b.state.store(gpukit::detail::block_state::cached);
    return &b;
  }
};

}  // namespace

TEST_SUITE("thread_cache_front")
{
  TEST_CASE("a thread finds its cache again and has one per front")
  {
    pool_state ps, qs;
    front f, g;
    CHECK(f.uid() != g.uid());
    cache& a = f.local(fake_pool{ps});
    CHECK(&f.local(fake_pool{ps}) == &a);
    CHECK(f.caches().size() == 1);
    CHECK(ps.shares == 0);              // one thread: no shared counts
    cache& b = g.local(fake_pool{qs});  // a second allocator on the same thread: its own cache
    CHECK(&b != &a);
    CHECK(g.caches().size() == 1);
    CHECK(&f.local(fake_pool{ps}) == &a);  // back to the first: found in the registry's entries
    CHECK(f.caches().size() == 1);
  }

  TEST_CASE(
    "freed blocks stay in the cache of their stream within its limits and drain returns them")
  {
    pool_state ps;
    front f;
    blocks bs;
    gpukit::caching_allocator_options o;
    o.thread_cache_blocks_per_class = 2;
    std::atomic<int> captures{0};
    cache& tc           = f.local(fake_pool{ps});
    sim_stream const s1 = stream_at(1), s2 = stream_at(2);
    block* x = bs.make(4096);
    block* y = bs.make(4096);
    block* z = bs.make(4096);
    CHECK(front::push(tc, x, s1, o, captures));
    CHECK(front::push(tc, y, s1, o, captures));
    CHECK_FALSE(front::push(tc, z, s1, o, captures));  // two a class
    CHECK(front::push(tc, z, s2, o, captures));        // another stream: its own lists
    CHECK(tc.cached_bytes.get() == 3 * 4096);
    CHECK_FALSE(front::push(tc, bs.make(o.thread_cache_max_block_bytes + 256), s1, o, captures));
    block* cap        = bs.make(4096);
    cap->capture_pool = 7;
    CHECK_FALSE(front::push(tc, cap, s2, o, captures));  // a capture's block
    captures = 1;
    CHECK_FALSE(front::push(tc, bs.make(4096), s2, o, captures));  // a capture under way
    captures = 0;
    CHECK(tc.pop(s1, 4096) == y);  // LIFO, on its stream only
    CHECK(tc.pop(stream_at(3), 4096) == nullptr);
    CHECK(front::push(tc, y, s1, o, captures));

    tc.flush_requested = true;
    fake_pool{ps}.locked([&] { front::drain(tc, fake_pool{ps}); });
    REQUIRE(ps.freed.size() == 3);
    CHECK(ps.freed_unlocked == 0);
    int on_s1 = 0, on_s2 = 0;
    for (auto const& [s, b] : ps.freed) {
      on_s1 += s == s1 && (b == x || b == y) ? 1 : 0;
      on_s2 += s == s2 && b == z ? 1 : 0;
    }
    CHECK(on_s1 == 2);
    CHECK(on_s2 == 1);
    CHECK(tc.cached_bytes.get() == 0);
    CHECK(ps.wakes == 1);
    CHECK_FALSE(tc.flush_requested.load());
    CHECK(tc.pop(s1, 4096) == nullptr);
  }

  TEST_CASE("release_fitting gives back the smallest cached block that holds a request, alone")
  {
    pool_state ps;
    front f;
    blocks bs;
    gpukit::caching_allocator_options o;
    std::atomic<int> captures{0};
    cache& tc           = f.local(fake_pool{ps});
    sim_stream const s1 = stream_at(1), s2 = stream_at(2);
    block* small      = bs.make(4096);
    block* mid        = bs.make(64 * 1024);
    block* other_kind = bs.make(32 * 1024);
    other_kind->kind  = 1;
    block* big        = bs.make(256 * 1024);
    block* elsewhere  = bs.make(16 * 1024);
    for (block* b : {small, mid, other_kind, big}) { CHECK(front::push(tc, b, s1, o, captures)); }
    CHECK(front::push(tc, elsewhere, s2, o, captures));
    std::int64_t const cached = tc.cached_bytes.get();
    fake_pool{ps}.locked([&] {
      // 20 KiB of pool 0 on s1: not the 4 KiB block (too small), not pool 1's, not s2's block.
      CHECK(front::release_fitting(tc, s1, 20 * 1024, 0, fake_pool{ps}));
    });
    REQUIRE(ps.freed.size() == 1);
    CHECK(ps.freed[0].first == s1);
    CHECK(ps.freed[0].second == mid);
    CHECK(tc.cached_bytes.get() == cached - 64 * 1024);
    fake_pool{ps}.locked([&] {
      CHECK(front::release_fitting(tc, s1, 100 * 1024, 0, fake_pool{ps}));        // the next one up
      CHECK_FALSE(front::release_fitting(tc, s1, 512 * 1024, 0, fake_pool{ps}));  // none holds it
      CHECK_FALSE(front::release_fitting(tc, stream_at(3), 1024, 0, fake_pool{ps}));
      CHECK(front::release_fitting(tc, s1, 1024, 1, fake_pool{ps}));  // pool 1's, for pool 1
    });
    REQUIRE(ps.freed.size() == 3);
    CHECK(ps.freed[1].second == big);
    CHECK(ps.freed[2].second == other_kind);
    CHECK(ps.freed_unlocked == 0);
    CHECK(tc.pop(s1, 4096) == small);  // the rest stays cached
    CHECK(tc.pop(s2, 16 * 1024) == elsewhere);
    CHECK(tc.cached_bytes.get() == 0);
  }

  TEST_CASE("a thread that meets contention on the pool lock caches larger blocks, then lowers")
  {
    pool_state ps;
    front f;
    blocks bs;
    gpukit::caching_allocator_options o;  // 1 MiB, raised up to 4 MiB
    std::atomic<int> const captures{0};
    std::size_t const mib = std::size_t{1} << 20;
    cache& tc             = f.local(fake_pool{ps});
    sim_stream const s    = stream_at(1);
    REQUIRE(o.thread_cache_max_block_bytes == mib);
    REQUIRE(o.thread_cache_contended_max_block_bytes == 4 * mib);
    CHECK(front::admission(tc, o) == mib);
    CHECK(front::admits(tc, o, mib));
    CHECK_FALSE(front::admits(tc, o, mib + 1));
    CHECK_FALSE(front::push(tc, bs.make(2 * mib), s, o, captures));
    for (int i = 0; i < 1000; ++i) { front::note_pool_lock(tc, false, o); }  // alone: unchanged
    CHECK(front::admission(tc, o) == mib);
    front::note_pool_lock(tc, true, o);  // another thread held the lock: doubled
    CHECK(front::admission(tc, o) == 2 * mib);
    CHECK(front::admits(tc, o, 2 * mib));
    CHECK_FALSE(front::admits(tc, o, 2 * mib + 1));
    block* two = bs.make(2 * mib);
    CHECK(front::push(tc, two, s, o, captures));
    CHECK(tc.pop(s, 2 * mib) == two);
    // A large block never serves a small request (the allocator passes the small pool's largest
    // block); a large request takes it.
    block* large = bs.make(mib + 4096);
    CHECK(front::push(tc, large, s, o, captures));
    CHECK(tc.pop(s, mib, mib) == nullptr);
    CHECK(tc.pop(s, mib - 4096, mib) == nullptr);
    CHECK(tc.pop(s, mib + 256, mib) == large);
    front::note_pool_lock(tc, true, o);
    front::note_pool_lock(tc, true, o);  // at the most: stays
    CHECK(front::admission(tc, o) == 4 * mib);
    CHECK_FALSE(front::push(tc, bs.make(4 * mib + 256), s, o, captures));
    // Halved after calm_before_lowering slow paths in a row find the lock free; contention in
    // between starts the count again.
    for (std::uint32_t i = 1; i < front::calm_before_lowering; ++i) {
      front::note_pool_lock(tc, false, o);
    }
    front::note_pool_lock(tc, true, o);
    for (std::uint32_t i = 1; i < front::calm_before_lowering; ++i) {
      front::note_pool_lock(tc, false, o);
    }
    CHECK(front::admission(tc, o) == 4 * mib);
    front::note_pool_lock(tc, false, o);
    CHECK(front::admission(tc, o) == 2 * mib);
    for (std::uint32_t i = 0; i < front::calm_before_lowering; ++i) {
      front::note_pool_lock(tc, false, o);
    }
    CHECK(front::admission(tc, o) == mib);
    CHECK(tc.raised_admission == 0);

    // No caches (0) and a most at or below the base: never raised. An odd most is reached exactly.
    gpukit::caching_allocator_options off = o;
    off.thread_cache_max_block_bytes      = 0;
    front::note_pool_lock(tc, true, off);
    CHECK(front::admission(tc, off) == 0);
    gpukit::caching_allocator_options low      = o;
    low.thread_cache_contended_max_block_bytes = mib / 2;
    front::note_pool_lock(tc, true, low);
    CHECK(front::admission(tc, low) == mib);
    gpukit::caching_allocator_options odd      = o;
    odd.thread_cache_contended_max_block_bytes = 3 * mib;
    front::note_pool_lock(tc, true, odd);
    front::note_pool_lock(tc, true, odd);
    CHECK(front::admission(tc, odd) == 3 * mib);
  }

  TEST_CASE("flush takes the pool lock and request_flush_except flags the other threads' caches")
  {
    pool_state ps;
    front f;
    blocks bs;
    gpukit::caching_allocator_options const o;
    std::atomic<int> const captures{0};
    cache& mine   = f.local(fake_pool{ps});
    cache* theirs = nullptr;
    std::thread t{[&] { theirs = &f.local(fake_pool{ps}); }};
    t.join();
    REQUIRE(theirs != nullptr);
    CHECK(ps.shares == 1);  // the second thread's cache switched the shared counts on
    CHECK(ps.caches_at_share == 2);
    front::purge_handed_out(*theirs);  // nothing to purge; a thread since gone
    f.request_flush_except(mine);
    CHECK_FALSE(mine.flush_requested.load());
    CHECK(theirs->flush_requested.load());
    CHECK(front::push(mine, bs.make(512), stream_at(1), o, captures));
    front::flush(mine, fake_pool{ps});
    CHECK(ps.freed.size() == 1);
    CHECK(ps.freed_unlocked == 0);
    CHECK(mine.cached_bytes.get() == 0);
  }

  TEST_CASE("a thread that exits returns its cached blocks and leaves its cache to the next thread")
  {
    pool_state ps;
    ps.shared_on = true;
    front f;
    blocks bs;
    gpukit::caching_allocator_options const o;
    std::atomic<int> const captures{0};
    block* x     = bs.make(1024);
    block* y     = bs.make(8192);
    block* held  = bs.make(2048);
    cache* first = nullptr;
    std::thread t{[&] {
      cache& tc = f.local(fake_pool{ps});
      first     = &tc;
      CHECK(front::push(tc, x, stream_at(1), o, captures));
      CHECK(front::push(tc, y, stream_at(2), o, captures));
      tc.handed_out.insert(held->address(), held);
      tc.checked_stream = stream_at(2);
      front::note_pool_lock(tc, true, o);  // contention raised its admission
      tc.count_free(0, 1024, 1000);
    }};
    t.join();
    REQUIRE(first != nullptr);
    CHECK(ps.freed.size() == 2);
    CHECK(ps.freed_unlocked == 0);
    CHECK(first->orphaned);
    CHECK(first->cached_bytes.get() == 0);
    CHECK(first->handed_out.size() == 0);
    CHECK(first->checked_stream == sim_stream{});
    CHECK(front::admission(*first, o) == o.thread_cache_max_block_bytes);  // not the next thread's
    CHECK(ps.joins == 1);                            // its last counts into the shared ones
    CHECK(first->pools[0].bytes_out.get() == 1024);  // the counters stay
    cache* second = nullptr;
    std::thread u{[&] { second = &f.local(fake_pool{ps}); }};
    u.join();
    CHECK(second == first);  // adopted, not a new cache
    CHECK(f.caches().size() == 1);
    CHECK(ps.shares == 0);  // still one cache
  }

  TEST_CASE("a front that left is not called when a thread exits")
  {
    pool_state ps;
    blocks bs;
    gpukit::caching_allocator_options const o;
    std::atomic<int> const captures{0};
    auto f = std::make_unique<front>();
    std::promise<void> registered, left;
    std::thread t{[&] {
      cache& tc = f->local(fake_pool{ps});
      CHECK(front::push(tc, bs.make(1024), stream_at(1), o, captures));
      registered.set_value();
      left.get_future().wait();
    }};
    registered.get_future().wait();
    f->leave();
    left.set_value();
    t.join();
    CHECK(ps.freed.empty());
    CHECK(ps.wakes == 0);
  }

  TEST_CASE("purge_handed_out drops the entries of blocks another thread freed since")
  {
    pool_state ps;
    front f;
    blocks bs;
    cache& tc   = f.local(fake_pool{ps});
    block* mine = bs.make(256);
    block* gone = bs.make(256);
    mine->owner.store(&tc);
    gone->owner.store(nullptr);  // another thread's free claimed it
    tc.handed_out.insert(mine->address(), mine);
    tc.handed_out.insert(gone->address(), gone);
    front::purge_handed_out(tc);
    CHECK(tc.handed_out.size() == 1);
    CHECK(tc.handed_out.find(mine->address()) == mine);
    CHECK(tc.handed_out.find(gone->address()) == nullptr);
    CHECK(tc.purge_at == 4096);
  }
}
