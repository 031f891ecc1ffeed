// SPDX-License-Identifier: Apache-2.0
// Ownership of the caching allocator's blocks under racing frees, on the simulated GPU: a free is
// accepted exactly once whichever threads race, a thread's stale record of an earlier life of a
// block never lets two frees of one life through, and many threads double-freeing never get one
// block handed to two users (each block carries its owner's tag, checked before every free).
//
// GPUKIT_OWNERSHIP_ROUNDS (default 3000) sets the stress test's rounds and
// GPUKIT_OWNERSHIP_BLOCKS (default 16) the blocks each of its 8 threads frees per round; it also
// stops after GPUKIT_OWNERSHIP_SECONDS (default 20) seconds, and reports the racing frees it made
// (two per block per round). GPUKIT_OWNERSHIP_MIN_FREES (default 0) makes fewer a failure: the
// CTest entry ownership.stress_under_tsan (label sim_concurrency, so the tsan preset runs it) asks
// for a million.
#include <gpukit/memory/caching_allocator.hpp>
#include <gpukit/memory/detail/allocator_invariants.hpp>
#include <gpukit/runtime/sim_runtime.hpp>

#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <set>
#include <thread>
#include <vector>

using gpukit::sim_runtime;
using sim_allocator = gpukit::basic_caching_allocator<sim_runtime>;
using stream_t      = sim_runtime::stream_type;

namespace {

constexpr std::size_t GiB = std::size_t{1} << 30;

long env_or(char const* name, long fallback)
{
  char const* v = std::getenv(name);
  return v != nullptr ? std::atol(v) : fallback;
}

/// A reusable barrier for a fixed number of threads (spinning, with yields).
class spin_barrier {
 public:
  explicit spin_barrier(int n) : n_{n} {}
  void arrive_and_wait()
  {
    int const gen = gen_.load(std::memory_order_acquire);
    if (count_.fetch_add(1, std::memory_order_acq_rel) + 1 == n_) {
      count_.store(0, std::memory_order_relaxed);
      gen_.fetch_add(1, std::memory_order_acq_rel);
      return;
    }
    // More threads than cores (and ThreadSanitizer) make long spins cost whole time slices.
    for (int spins = 0; gen_.load(std::memory_order_acquire) == gen; ++spins) {
      if (spins > 64) { std::this_thread::yield(); }
    }
  }

 private:
  int const n_;
  std::atomic<int> count_{0};
  std::atomic<int> gen_{0};
};

/// Frees `p`; true when accepted, false when refused as a double free.
bool try_free(sim_allocator& alloc, void* p, std::size_t bytes, stream_t s)
{
  try {
    alloc.deallocate_async(p, bytes, s);
    return true;
  } catch (gpukit::logic_error const&) {
    return false;
  }
}

/// Spins until `ready()`, yielding after a while.
template <class F>
void wait_until(F&& ready)
{
  for (int spins = 0; !ready(); ++spins) {
    if (spins > 4096) { std::this_thread::yield(); }
  }
}

/// A random delay of a few hundred cycles, so that two racing frees' windows overlap in some
/// rounds whatever their relative speeds.
void jitter(std::uint64_t& rng)
{
  rng ^= rng << 13;
  rng ^= rng >> 7;
  rng ^= rng << 17;
  for (std::uint64_t i = 0, n = rng % 1024; i < n; ++i) { asm volatile("" ::: "memory"); }
}

/// Block contents are host memory on the simulated GPU: the owner's tag lives in the first word.
std::atomic<std::uint64_t>& tag_of(void* p) { return *static_cast<std::atomic<std::uint64_t>*>(p); }

}  // namespace

TEST_SUITE("ownership")
{
  TEST_CASE("threads freeing one block at once: exactly one free is accepted")
  {
    // The owner frees on its lock-free path while another thread frees the same block through the
    // pool, both released at once from a spinning gate.
    sim_runtime sim{gpukit::sim_config{}.with_devices(1, 4 * GiB)};
    sim_allocator alloc{sim, 0};
    stream_t s{};
    GPUKIT_CUDA_TRY(sim.stream_create(s));
    constexpr std::size_t bytes = 4096;
    long const rounds           = env_or("GPUKIT_OWNERSHIP_RACE_ROUNDS", 50000);
    std::atomic<long> go{-1};  // the round now racing
    std::atomic<int> done{0};  // the other thread's frees finished
    std::atomic<int> accepted{0};
    std::atomic<void*> shared{nullptr};
    std::atomic<bool> stop{false};

    std::thread other([&] {
      std::uint64_t rng = 88172645463325252ull;
      for (long r = 0; r < rounds; ++r) {
        wait_until([&] { return go.load(std::memory_order_acquire) >= r || stop.load(); });
        if (stop.load()) { return; }
        jitter(rng);
        if (try_free(alloc, shared.load(), bytes, s)) { accepted.fetch_add(1); }
        done.fetch_add(1, std::memory_order_release);
      }
    });
    long bad_round    = -1;
    std::uint64_t rng = 0x2545f4914f6cdd1dull;
    for (long r = 0; r < rounds; ++r) {
      void* p = alloc.allocate_async(bytes, s);
      shared.store(p);
      accepted.store(0);
      go.store(r, std::memory_order_release);
      jitter(rng);
      if (try_free(alloc, p, bytes, s)) { accepted.fetch_add(1); }
      wait_until([&] { return done.load(std::memory_order_acquire) == r + 1; });
      if (accepted.load() != 1) {
        bad_round = r;
        break;
      }
    }
    stop.store(true);
    other.join();
    if (bad_round >= 0) {  // the allocator may be corrupt now: leave it without touching it more
      FAIL("round " << bad_round << ": " << accepted.load() << " frees of one block accepted");
    }
    CHECK(gpukit::detail::check_invariants(alloc) == "");
    CHECK(alloc.stats().allocated_bytes.current == 0);
    (void)sim.stream_destroy(s);
  }

  TEST_CASE("a stale record of an earlier life racing with the new owner's free: one is accepted")
  {
    // A allocates p; C frees it (legitimately, across threads) and gets p again. A's record of p
    // now describes an earlier life: A freeing p again and C freeing p race. A pointer-based
    // allocator cannot tell which of the two is the bad one, but it must accept only one.
    sim_runtime sim{gpukit::sim_config{}.with_devices(1, 4 * GiB)};
    gpukit::caching_allocator_options o;
    o.thread_cache_contended_max_block_bytes = 0;  // not raised when the two threads contend
    sim_allocator alloc{sim, 0, o};
    stream_t s{};
    GPUKIT_CUDA_TRY(sim.stream_create(s));
    constexpr std::size_t bytes = 2 << 20;  // beyond the thread caches: every block meets the pool
    long const rounds           = env_or("GPUKIT_OWNERSHIP_RACE_ROUNDS", 50000) / 2;
    std::atomic<long> handed{-1}, go{-1}, checked{-1};
    std::atomic<int> done{0}, accepted{0};
    std::atomic<void*> p{nullptr};
    std::atomic<bool> stop{false};
    std::thread a([&] {
      std::uint64_t rng = 88172645463325252ull;
      for (long r = 0; r < rounds; ++r) {
        // The next life starts only once this round is judged: an allocation of A's racing with
        // C's free would be a new life that C's free legitimately releases.
        wait_until([&] { return checked.load(std::memory_order_acquire) >= r - 1 || stop.load(); });
        if (stop.load()) { return; }
        p.store(alloc.allocate_async(bytes, s));
        handed.store(r, std::memory_order_release);
        wait_until([&] { return go.load(std::memory_order_acquire) >= r || stop.load(); });
        if (stop.load()) { return; }
        jitter(rng);
        if (try_free(alloc, p.load(), bytes, s)) { accepted.fetch_add(1); }
        done.fetch_add(1, std::memory_order_release);
      }
    });
    long raced = 0, bad_round = -1;
    std::uint64_t rng = 0x2545f4914f6cdd1dull;
    for (long r = 0; r < rounds; ++r) {
      wait_until([&] { return handed.load(std::memory_order_acquire) >= r; });
      void* const mine_p = p.load();             // A publishes the next round's block once done
      alloc.deallocate_async(mine_p, bytes, s);  // "B"
      void* q         = alloc.allocate_async(bytes, s);  // C: p again (the pool's only free block)
      bool const same = q == mine_p;
      raced += same ? 1 : 0;
      accepted.store(same ? 0 : 1);  // otherwise A frees a free block: refused
      go.store(r, std::memory_order_release);
      jitter(rng);
      bool const mine = try_free(alloc, q, bytes, s);
      wait_until([&] { return done.load(std::memory_order_acquire) == r + 1; });
      if (accepted.load() + (mine ? 1 : 0) != (same ? 1 : 2)) {
        bad_round = r;
        break;
      }
      checked.store(r, std::memory_order_release);
    }
    stop.store(true);
    a.join();
    if (bad_round >= 0) {  // the allocator may be corrupt now: leave it without touching it more
      FAIL("round " << bad_round << ": both frees of one life were accepted");
    }
    CHECK(raced > rounds / 2);
    CHECK(gpukit::detail::check_invariants(alloc) == "");
    CHECK(alloc.stats().allocated_bytes.current == 0);
    (void)sim.stream_destroy(s);
  }

  TEST_CASE("a stale free after the block was handed out again is taken as the new owner's free")
  {
    // What a pointer-based allocator can and cannot detect, in order: A's second free cannot be
    // told from a legitimate free of C's block by A, so it is accepted (as a free across threads:
    // not into A's cache); C's own free then is the one reported, and changes nothing.
    sim_runtime sim{gpukit::sim_config{}.with_devices(1, 4 * GiB)};
    sim_allocator alloc{sim, 0};
    constexpr std::size_t bytes = 4096;
    void* p                     = alloc.allocate_async(bytes, stream_t{});      // A
    std::thread{[&] { alloc.deallocate_async(p, bytes, stream_t{}); }}.join();  // B
    void* q = nullptr;
    std::thread c_alloc{[&] { q = alloc.allocate_async(bytes, stream_t{}); }};  // C
    c_alloc.join();
    REQUIRE(q == p);
    CHECK(try_free(alloc, p, bytes, stream_t{}));  // A again: accepted
    auto const before = alloc.stats();
    bool c_ok         = true;
    std::thread{[&] { c_ok = try_free(alloc, q, bytes, stream_t{}); }}.join();  // C: refused
    CHECK_FALSE(c_ok);
    auto const after = alloc.stats();
    CHECK(after.allocated_bytes.current == before.allocated_bytes.current);
    CHECK(after.num_frees == before.num_frees);
    CHECK(gpukit::detail::check_invariants(alloc) == "");
    // The block is free exactly once: two live allocations never share it.
    void* x = alloc.allocate_async(bytes, stream_t{});
    void* y = alloc.allocate_async(bytes, stream_t{});
    CHECK(x != y);
    alloc.deallocate_async(x, bytes, stream_t{});
    alloc.deallocate_async(y, bytes, stream_t{});
    // A double free of a block not handed out again is caught, whichever thread frees.
    void* z = alloc.allocate_async(bytes, stream_t{});
    std::thread{[&] { alloc.deallocate_async(z, bytes, stream_t{}); }}.join();
    CHECK_FALSE(try_free(alloc, z, bytes, stream_t{}));
    bool other_ok = true;
    std::thread{[&] { other_ok = try_free(alloc, z, bytes, stream_t{}); }}.join();
    CHECK_FALSE(other_ok);
  }

  TEST_CASE("many threads double-freeing never hand one block to two users")
  {
    sim_runtime sim{gpukit::sim_config{}.with_devices(1, 8 * GiB)};
    sim_allocator alloc{sim, 0};
    int const threads    = 8;
    int const per_thread = static_cast<int>(env_or("GPUKIT_OWNERSHIP_BLOCKS", 16));
    long const rounds    = env_or("GPUKIT_OWNERSHIP_ROUNDS", 3000);
    long const seconds   = env_or("GPUKIT_OWNERSHIP_SECONDS", 20);
    long const min_frees = env_or("GPUKIT_OWNERSHIP_MIN_FREES", 0);
    REQUIRE(per_thread > 0);
    auto const started       = std::chrono::steady_clock::now();
    std::size_t const size[] = {256, 768, 4096, 65536, 1 << 20, 3 << 20};
    std::vector<stream_t> streams(2);
    for (auto& s : streams) { GPUKIT_CUDA_TRY(sim.stream_create(s)); }
    struct slot {
      void* p{nullptr};
      std::size_t bytes{0};
      stream_t stream{};
      std::atomic<int> accepted{0};
    };
    std::vector<slot> slots(static_cast<std::size_t>(threads * per_thread));
    spin_barrier phase{threads};
    std::atomic<long> double_handouts{0}, wrong_accepts{0}, rounds_run{0};
    std::atomic<bool> stop{false};
    auto const deadline = std::chrono::steady_clock::now() + std::chrono::seconds(seconds);
    auto worker         = [&](int t) {
      std::uint64_t rng = 0x9e3779b97f4a7c15ull * static_cast<std::uint64_t>(t + 1);
      auto next         = [&] {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        return rng;
      };
      for (long r = 0; r < rounds; ++r) {
        // 1. Allocate and tag.
        for (int k = 0; k < per_thread; ++k) {
          slot& sl  = slots[static_cast<std::size_t>(t * per_thread + k)];
          sl.bytes  = size[next() % std::size(size)];
          sl.stream = streams[next() % streams.size()];
          sl.p      = alloc.allocate_async(sl.bytes, sl.stream);
          sl.accepted.store(0, std::memory_order_relaxed);
          tag_of(sl.p).store((static_cast<std::uint64_t>(t) << 48) | static_cast<std::uint64_t>(r),
                                     std::memory_order_relaxed);
        }
        phase.arrive_and_wait();
        // 2. Every block still carries its owner's tag (none was handed to two threads), then its
        //    owner and a neighbour both free it, racing.
        for (int k = 0; k < per_thread; ++k) {
          slot const& sl = slots[static_cast<std::size_t>(t * per_thread + k)];
          std::uint64_t const tg =
            (static_cast<std::uint64_t>(t) << 48) | static_cast<std::uint64_t>(r);
          if (tag_of(sl.p).load(std::memory_order_relaxed) != tg) { double_handouts.fetch_add(1); }
        }
        phase.arrive_and_wait();
        int const victim = (t + 1 + static_cast<int>(r % (threads - 1))) % threads;
        for (int k = 0; k < per_thread; ++k) {
          slot& mine   = slots[static_cast<std::size_t>(t * per_thread + k)];
          slot& theirs = slots[static_cast<std::size_t>(victim * per_thread + k)];
          if (try_free(alloc, mine.p, mine.bytes, mine.stream)) { mine.accepted.fetch_add(1); }
          if (try_free(alloc, theirs.p, theirs.bytes, theirs.stream)) {
            theirs.accepted.fetch_add(1);
          }
        }
        phase.arrive_and_wait();
        for (int k = 0; k < per_thread; ++k) {
          if (slots[static_cast<std::size_t>(t * per_thread + k)].accepted.load() != 1) {
            wrong_accepts.fetch_add(1);
          }
        }
        if (t == 0) {
          rounds_run.fetch_add(1);
          if (double_handouts.load() + wrong_accepts.load() != 0 ||
              std::chrono::steady_clock::now() > deadline) {
            stop.store(true);
          }
        }
        phase.arrive_and_wait();
        if (stop.load()) { return; }
      }
    };
    std::vector<std::thread> pool;
    for (int t = 0; t < threads; ++t) { pool.emplace_back(worker, t); }
    for (auto& th : pool) { th.join(); }
    long const frees = rounds_run.load() * threads * per_thread;
    double const took =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
    std::printf(
      "ownership stress: %ld rounds in %.1f s, %ld blocks each freed twice at once (%ld racing "
      "frees), %ld double hand-outs, %ld blocks not freed exactly once\n",
      rounds_run.load(), took, frees, 2 * frees, double_handouts.load(), wrong_accepts.load());
    CHECK(double_handouts.load() == 0);
    CHECK(2 * frees >= min_frees);
    CHECK(wrong_accepts.load() == 0);
    if (double_handouts.load() + wrong_accepts.load() == 0) {
      CHECK(gpukit::detail::check_invariants(alloc) == "");
      CHECK(alloc.stats().allocated_bytes.current == 0);
    }
    for (auto& s : streams) {
      alloc.forget_stream(s);
      (void)sim.stream_destroy(s);
    }
  }
}
