// SPDX-License-Identifier: Apache-2.0
// Statistics per pool kind (small/large, as PyTorch's), memory_summary() against stats(), and
// GPUKIT_ALLOC_CONF read by the default allocators, on the simulated GPU.
#include "support/caching_allocator.hpp"
#include "support/holders.hpp"
#include "support/sim_gpu.hpp"
#include "support/sizes.hpp"

#include <gpukit/memory/caching_allocator.hpp>
#include <gpukit/memory/caching_allocator_stats.hpp>
#include <gpukit/memory/current_resource.hpp>
#include <gpukit/memory/detail/allocator_invariants.hpp>
#include <gpukit/memory/detail/shared_counts.hpp>
#include <gpukit/memory/memory_summary.hpp>
#include <gpukit/runtime/sim_runtime.hpp>

#include <doctest/doctest.h>

#include <algorithm>
#include <condition_variable>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

using namespace gpukit::test;
using gpukit::sim_runtime;

namespace {

std::int64_t i64(std::size_t v) { return static_cast<std::int64_t>(v); }

/// The line of `text` that starts with `prefix` (empty when none).
std::string line_of(std::string const& text, std::string const& prefix)
{
  std::istringstream in{text};
  for (std::string line; std::getline(in, line);) {
    if (line.rfind(prefix, 0) == 0) { return line; }
  }
  return "";
}

/// The allocator's statistics agree with each other and with its segments.
void check_consistent(sim_allocator const& alloc)
{
  std::string const err = gpukit::detail::check_invariants(alloc);
  CHECK_MESSAGE(err == "", err);
}

/// The end of a fixture's test: the statistics still agree, and the streams are forgotten before
/// the fixture destroys them.
template <class Fixture>
void finish(Fixture& f)
{
  check_consistent(f.alloc);
  f.alloc.forget_stream(f.sa);
  f.alloc.forget_stream(f.sb);
}

}  // namespace

TEST_SUITE("caching_allocator")
{
  TEST_CASE_FIXTURE(sim_allocator_fixture<>, "stats: each pool kind counts its own blocks")
  {
    void* small = alloc.allocate_async(500'000, sa);  // rounded to 500,224
    void* large = alloc.allocate_async(3 * mib, sa);  // a 20 MiB segment of the large pool
    auto s      = alloc.stats();
    CHECK(s.small_pool.allocated_bytes.current == 500'224);
    CHECK(s.small_pool.requested_bytes.current == 500'000);
    CHECK(s.large_pool.allocated_bytes.current == i64(3 * mib));
    CHECK(s.small_pool.reserved_bytes.current == i64(2 * mib));
    CHECK(s.large_pool.reserved_bytes.current == i64(20 * mib));
    CHECK(s.small_pool.segment_count.current == 1);
    CHECK(s.large_pool.segment_count.current == 1);
    CHECK(s.small_pool.allocation_count.current == 1);
    CHECK(s.large_pool.allocation_count.current == 1);
    CHECK(s.small_pool.inactive_split_bytes.current == i64(2 * mib) - 500'224);
    CHECK(s.large_pool.inactive_split_bytes.current == i64(17 * mib));
    CHECK(s.allocated_bytes.current == 500'224 + i64(3 * mib));
    check_consistent(alloc);

    alloc.deallocate_async(small, 500'000, sa);
    alloc.deallocate_async(large, 3 * mib, sa);
    void* again = alloc.allocate_async(3 * mib, sa);
    s           = alloc.stats();
    CHECK(s.small_pool.allocated_bytes.current == 0);
    CHECK(s.small_pool.allocated_bytes.peak == 500'224);
    CHECK(s.small_pool.allocated_bytes.allocated == 500'224);
    CHECK(s.small_pool.allocated_bytes.freed == 500'224);
    CHECK(s.small_pool.requested_bytes.freed == 500'000);
    CHECK(s.large_pool.allocated_bytes.allocated == i64(6 * mib));
    CHECK(s.large_pool.allocated_bytes.freed == i64(3 * mib));
    CHECK(s.large_pool.allocation_count.allocated == 2);
    CHECK(s.large_pool.allocation_count.freed == 1);
    CHECK(s.large_pool.segment_count.allocated == 1);  // the block was reused
    CHECK(s.large_pool.reserved_bytes.allocated == i64(20 * mib));
    CHECK(s.num_allocs == 3);
    CHECK(s.num_frees == 2);
    check_consistent(alloc);

    alloc.deallocate_async(again, 3 * mib, sa);
    CHECK(alloc.release() == 22 * mib);
    s = alloc.stats();
    CHECK(s.large_pool.reserved_bytes.current == 0);
    CHECK(s.large_pool.reserved_bytes.freed == i64(20 * mib));
    CHECK(s.small_pool.reserved_bytes.freed == i64(2 * mib));
    CHECK(s.large_pool.segment_count.freed == 1);
    CHECK(s.large_pool.reserved_bytes.peak == i64(20 * mib));
    finish(*this);
  }

  TEST_CASE_FIXTURE(sim_allocator_fixture<>, "stats: reset_peak resets the pools' peaks too")
  {
    void* a = alloc.allocate_async(4 * mib, sa);
    void* b = alloc.allocate_async(4 * mib, sa);
    void* c = alloc.allocate_async(64 * kib, sa);
    void* d = alloc.allocate_async(64 * kib, sa);
    alloc.deallocate_async(b, 4 * mib, sa);
    alloc.deallocate_async(d, 64 * kib, sa);
    auto s = alloc.stats();
    CHECK(s.large_pool.allocated_bytes.peak == i64(8 * mib));
    CHECK(s.small_pool.allocated_bytes.peak == i64(128 * kib));
    CHECK(s.small_pool.allocation_count.peak == 2);
    alloc.reset_peak();
    s = alloc.stats();
    for (gpukit::caching_pool_stats const* p : {&s.small_pool, &s.large_pool}) {
      CHECK(p->allocated_bytes.peak == p->allocated_bytes.current);
      CHECK(p->requested_bytes.peak == p->requested_bytes.current);
      CHECK(p->allocation_count.peak == p->allocation_count.current);
      CHECK(p->active_bytes.peak == p->active_bytes.current);
      CHECK(p->reserved_bytes.peak == p->reserved_bytes.current);
    }
    CHECK(s.active_bytes.peak == s.active_bytes.current);
    CHECK(s.large_pool.allocated_bytes.peak == i64(4 * mib));
    CHECK(s.large_pool.allocated_bytes.allocated == i64(8 * mib));  // totals stay
    // A single thread's peak between two reads is exact, per pool as for the whole.
    void* e = alloc.allocate_async(8 * mib, sa);
    alloc.deallocate_async(e, 8 * mib, sa);
    s = alloc.stats();
    CHECK(s.large_pool.allocated_bytes.peak == i64(12 * mib));
    CHECK(s.allocated_bytes.peak == i64(12 * mib) + i64(64 * kib));
    CHECK(s.small_pool.allocated_bytes.peak == i64(64 * kib));
    alloc.deallocate_async(a, 4 * mib, sa);
    alloc.deallocate_async(c, 64 * kib, sa);
    finish(*this);
  }

  TEST_CASE("stats: growable pages count for their pool, spare ones for their list")
  {
    for (std::size_t page : {2 * mib, 8 * mib}) {  // one shared spare list, then one per pool
      CAPTURE(page);
      sim_runtime sim{one_device(gib)};
      sim_allocator alloc{sim, 0, segments_from(gpukit::segment_source::growable, page)};
      stream_holder<sim_runtime> sa{sim}, sb{sim};
      std::vector<void*> blocks;
      for (std::size_t bytes : {300 * kib, 20 * mib, 700 * kib, 12 * mib, 64 * kib}) {
        blocks.push_back(alloc.allocate_async(bytes, sa));
      }
      check_consistent(alloc);
      auto s = alloc.stats();
      CHECK(s.large_pool.allocated_bytes.current == i64(32 * mib));
      CHECK(s.small_pool.reserved_bytes.current >= i64(2 * mib));
      CHECK(s.large_pool.reserved_bytes.current >= i64(32 * mib));
      alloc.deallocate_async(blocks[1], 20 * mib, sa);
      alloc.deallocate_async(blocks[0], 300 * kib, sa);
      alloc.forget_stream(sa);
      CHECK(alloc.trim(static_cast<std::size_t>(s.reserved_bytes.current) - page) > 0);  // unmaps
      check_consistent(alloc);
      void* big = alloc.allocate_async(30 * mib, sb);  // maps pages again (spares first)
      void* sml = alloc.allocate_async(900 * kib, sb);
      check_consistent(alloc);
      s = alloc.stats();
      CHECK(s.large_pool.reserved_bytes.allocated - s.large_pool.reserved_bytes.freed ==
            s.large_pool.reserved_bytes.current);
      alloc.deallocate_async(big, 30 * mib, sb);
      alloc.deallocate_async(sml, 900 * kib, sb);
      alloc.deallocate_async(blocks[2], 700 * kib, sa);
      alloc.deallocate_async(blocks[3], 12 * mib, sa);
      alloc.deallocate_async(blocks[4], 64 * kib, sa);
      alloc.forget_stream(sa);
      alloc.forget_stream(sb);
      alloc.release();
      s = alloc.stats();
      CHECK(s.reserved_bytes.current == 0);
      CHECK(s.small_pool.reserved_bytes.current == 0);
      CHECK(s.large_pool.reserved_bytes.current == 0);
      CHECK(s.large_pool.reserved_bytes.peak >= i64(30 * mib));
      check_consistent(alloc);
    }
  }

  TEST_CASE_FIXTURE(sim_allocator_fixture<>, "stats: blocks freed by other threads")
  {
    std::vector<void*> blocks(64);
    std::thread producer{[&] {
      for (std::size_t i = 0; i < blocks.size(); ++i) {
        blocks[i] = alloc.allocate_async(i % 2 == 0 ? 128 * kib : 2 * mib, sa);
      }
    }};
    producer.join();
    std::thread consumer{[&] {
      for (std::size_t i = 0; i < blocks.size(); i += 2) {
        alloc.deallocate_async(blocks[i], 128 * kib, sa);
      }
    }};
    consumer.join();
    auto const s = alloc.stats();
    CHECK(s.small_pool.allocation_count.current == 0);
    CHECK(s.small_pool.allocation_count.allocated == 32);
    CHECK(s.small_pool.allocation_count.freed == 32);
    CHECK(s.large_pool.allocated_bytes.current == i64(64 * mib));
    // The producer's peak, exact (one thread allocated), survives the other thread's frees.
    CHECK(s.small_pool.allocated_bytes.peak == i64(32 * 128 * kib));
    CHECK(s.allocated_bytes.peak == i64(32 * 128 * kib + 32 * 2 * mib));
    check_consistent(alloc);
    for (std::size_t i = 1; i < blocks.size(); i += 2) {
      alloc.deallocate_async(blocks[i], 2 * mib, sa);
    }
    finish(*this);
  }

  TEST_CASE("stats: a block allocated and freed before anything is read still makes the peaks")
  {
    sim_runtime sim{one_device(gib)};
    sim_allocator alloc{sim, 0};
    stream_holder<sim_runtime> s{sim};
    alloc.deallocate_async(alloc.allocate_async(256 * mib, s), 256 * mib, s);
    auto const st = alloc.stats();
    CHECK(st.allocated_bytes.peak == i64(256 * mib));
    CHECK(st.active_bytes.peak == i64(256 * mib));
    CHECK(st.active_count.peak == 1);
    CHECK(st.large_pool.active_bytes.peak == i64(256 * mib));
    CHECK(st.active_bytes.current == 0);
    // A free that waits on another stream's work keeps its block active, and its peak with it.
    stream_holder<sim_runtime> other{sim};
    GPUKIT_CUDA_TRY(sim.stall(other));
    void* p = alloc.allocate_async(300 * mib, s);
    alloc.record_stream(p, other);
    alloc.deallocate_async(p, 300 * mib, s);
    void* q = alloc.allocate_async(100 * mib, s);  // while p's free is pending: 400 MiB active
    GPUKIT_CUDA_TRY(sim.release(other));
    alloc.deallocate_async(q, 100 * mib, s);
    (void)alloc.release();
    auto const t = alloc.stats();
    CHECK(t.active_bytes.peak == i64(400 * mib));
    CHECK(t.allocated_bytes.peak == i64(300 * mib));
    alloc.forget_stream(s);
    alloc.forget_stream(other);
  }

  TEST_CASE(
    "stats: every current value is the reference model's after every operation, on any "
    "thread; every peak within the batch bound below the model's, never above")
  {
    // A thread that runs what it is given, one task at a time, and waits for the next.
    class worker {
     public:
      worker()
          : thread_{[this] {
              std::unique_lock<std::mutex> lock{m_};
              for (;;) {
                cv_.wait(lock, [this] { return task_ || stop_; });
                if (!task_) { return; }
                task_();
                task_ = nullptr;
                cv_.notify_all();
              }
            }}
      {}
      ~worker()
      {
        {
          std::lock_guard<std::mutex> lock{m_};
          stop_ = true;
        }
        cv_.notify_all();
        thread_.join();
      }
      void run(std::function<void()> f)
      {
        std::unique_lock<std::mutex> lock{m_};
        task_ = std::move(f);
        cv_.notify_all();
        cv_.wait(lock, [this] { return !task_; });
      }

     private:
      std::mutex m_;
      std::condition_variable cv_;
      std::function<void()> task_;
      bool stop_{false};
      std::thread thread_;
    };
    struct model {  // by pool kind, then [2]: both
      std::int64_t bytes[3]{}, requested[3]{}, count[3]{};
      std::int64_t peak_bytes[3]{}, peak_requested[3]{}, peak_count[3]{};
      void add(int k, std::int64_t b, std::int64_t r, std::int64_t n)
      {
        for (int i : {k, 2}) {
          bytes[i] += b;
          requested[i] += r;
          count[i] += n;
          peak_bytes[i]     = std::max(peak_bytes[i], bytes[i]);
          peak_requested[i] = std::max(peak_requested[i], requested[i]);
          peak_count[i]     = std::max(peak_count[i], count[i]);
        }
      }
    };
    for (bool const cache : {true, false}) {
      for (std::uint64_t seed = 1; seed <= 3; ++seed) {
        CAPTURE(cache);
        CAPTURE(seed);
        sim_runtime sim{one_device(16 * gib)};
        gpukit::caching_allocator_options o;
        // Without the thread cache every block is exactly its rounded size, so the model knows
        // the allocated bytes too; with it, requested bytes and counts.
        if (!cache) { o.thread_cache_max_block_bytes = 0; }
        sim_allocator alloc{sim, 0, o};
        stream_holder<sim_runtime> s0{sim}, s1{sim};
        sim_stream const streams[] = {s0, s1};
        worker workers[3];
        model m;
        struct live {
          void* p;
          std::size_t bytes;
        };
        std::vector<live> blocks;
        std::uint64_t rng = seed * 0x9e3779b97f4a7c15ull;
        auto next         = [&] {
          rng ^= rng << 13;
          rng ^= rng >> 7;
          rng ^= rng << 17;
          return rng;
        };
        auto kind_of = [](std::size_t bytes) { return (bytes + 255) / 256 * 256 <= mib ? 0 : 1; };
        // From the second thread on, the peaks are batched (detail::shared_counts): each of the
        // three threads may hold up to a batch per pool kind unfolded.
        using shared = gpukit::detail::shared_counts;
        auto within  = [](std::int64_t peak, std::int64_t model, std::int64_t slack) {
          return peak <= model && peak >= model - slack;
        };
        auto check = [&](int op) {
          auto const st = alloc.stats();
          CAPTURE(op);
          gpukit::caching_pool_stats const* pools[] = {&st.small_pool, &st.large_pool};
          for (int i = 0; i < 2; ++i) {
            CAPTURE(i);
            CHECK(pools[i]->requested_bytes.current == m.requested[i]);
            CHECK(pools[i]->allocation_count.current == m.count[i]);
            CHECK(
              within(pools[i]->requested_bytes.peak, m.peak_requested[i], 3 * shared::batch_bytes));
            CHECK(
              within(pools[i]->allocation_count.peak, m.peak_count[i], 3 * shared::batch_count));
            if (!cache) {
              CHECK(pools[i]->allocated_bytes.current == m.bytes[i]);
              CHECK(
                within(pools[i]->allocated_bytes.peak, m.peak_bytes[i], 3 * shared::batch_bytes));
            }
          }
          CHECK(within(st.requested_bytes.peak, m.peak_requested[2], 6 * shared::batch_bytes));
          CHECK(within(st.allocation_count.peak, m.peak_count[2], 6 * shared::batch_count));
          // No free waits on another stream: active is allocated.
          CHECK(st.active_count.peak == st.allocation_count.peak);
          if (!cache) {
            CHECK(within(st.allocated_bytes.peak, m.peak_bytes[2], 6 * shared::batch_bytes));
            CHECK(st.active_bytes.peak == st.allocated_bytes.peak);
          }
        };
        for (int op = 0; op < 400; ++op) {
          worker& w = workers[next() % 3];
          if (blocks.empty() || next() % 5 < 3) {
            std::size_t const bytes =
              next() % 2 == 0 ? 1 + next() % mib : mib + 1 + next() % (48 * mib);
            void* p = nullptr;
            w.run([&] { p = alloc.allocate_async(bytes, streams[next() % 2]); });
            blocks.push_back({p, bytes});
            std::int64_t const size = static_cast<std::int64_t>((bytes + 255) / 256 * 256);
            m.add(kind_of(bytes), size, static_cast<std::int64_t>(bytes), 1);
          } else {
            std::size_t const i = next() % blocks.size();
            live const b        = blocks[i];
            blocks.erase(blocks.begin() + static_cast<std::ptrdiff_t>(i));
            w.run([&] { alloc.deallocate_async(b.p, b.bytes, streams[next() % 2]); });
            std::int64_t const size = static_cast<std::int64_t>((b.bytes + 255) / 256 * 256);
            m.add(kind_of(b.bytes), -size, -static_cast<std::int64_t>(b.bytes), -1);
          }
          if (next() % 7 == 0) { check(op); }
        }
        check(-1);
        for (live const& b : blocks) { alloc.deallocate_async(b.p, b.bytes, s0); }
        alloc.forget_stream(s0);
        alloc.forget_stream(s1);
      }
    }
  }

  TEST_CASE_FIXTURE(sim_allocator_fixture<>, "memory_summary: PyTorch's table, from stats()")
  {
    void* large = alloc.allocate_async(3 * mib, sa);
    void* small = alloc.allocate_async(512 * kib, sa);
    void* gone  = alloc.allocate_async(64 * kib, sa);
    alloc.deallocate_async(gone, 64 * kib, sa);
    std::string const text = gpukit::memory_summary(alloc);
    INFO(text);
    CHECK(line_of(text, "|           gpukit caching allocator memory summary, device ID 0") != "");
    // Each column's unit is chosen on the row's first value, as PyTorch does: 64 KiB freed is
    // below 768 KiB, so bytes. Non-releasable totals are not tracked; nothing is oversize.
    for (char const* row : {
           "| Allocated memory      |   3584 KiB |   3648 KiB |   3648 KiB |  65536 B   |",
           "|       from large pool |   3072 KiB |   3072 KiB |   3072 KiB |      0 B   |",
           "|       from small pool |    512 KiB |    576 KiB |    576 KiB |  65536 B   |",
           "| Active memory         |   3584 KiB |   3648 KiB |   3648 KiB |  65536 B   |",
           "| Non-releasable memory |  18880 KiB |  18880 KiB |       -    |       -    |",
           "| GPU reserved memory   |  22528 KiB |  22528 KiB |  22528 KiB |      0 B   |",
           "| Allocations           |       2    |       3    |       3    |       1    |",
           "| GPU reserved segments |       2    |       2    |       2    |       0    |",
           "| Non-releasable allocs |       2    |       2    |       -    |       -    |",
           "| Oversize allocations  |       0    |       0    |       0    |       0    |",
         }) {
      CHECK_MESSAGE(line_of(text, row) == row, row);
    }
    CHECK(line_of(text, "gpukit: segments: stream_ordered;") != "");
    CHECK(line_of(text, "gpukit: thread caches: 64 KiB cached; 0 of 3 allocations") != "");
    CHECK(line_of(text, "gpukit:   step 1, collect blocks") != "");
    // Every line of the table is as wide as PyTorch's.
    std::istringstream in{text};
    for (std::string line; std::getline(in, line);) {
      if (line.rfind('|', 0) == 0) { CHECK(line.size() == 77); }
    }
    // Abbreviated: no per-pool rows; the same aggregates.
    std::string const brief = gpukit::memory_summary(alloc, true);
    CHECK(brief.find("from large pool") == std::string::npos);
    CHECK(line_of(brief, "| Allocated memory ") == line_of(text, "| Allocated memory "));
    // From statistics alone: the same table, the segment source unknown.
    std::string const from_stats = gpukit::memory_summary(alloc.stats(), 3);
    CHECK(line_of(from_stats, "| Allocations ") == line_of(text, "| Allocations "));
    CHECK(from_stats.find("device ID 3") != std::string::npos);
    CHECK(line_of(from_stats, "gpukit: segments: (see the allocator)") != "");
    alloc.deallocate_async(large, 3 * mib, sa);
    alloc.deallocate_async(small, 512 * kib, sa);
    finish(*this);
  }

  TEST_CASE("memory_summary: units follow PyTorch's, counts and retries shown")
  {
    sim_runtime sim{one_device(64 * mib)};
    sim_allocator alloc{sim, 0, segments_from(gpukit::segment_source::synchronous)};
    void* a = alloc.allocate_async(40 * mib, {});
    CHECK_THROWS_AS((void)alloc.allocate_async(40 * mib, {}), gpukit::out_of_memory);
    auto const s           = alloc.stats();
    std::string const text = gpukit::memory_summary(alloc);
    INFO(text);
    CHECK(line_of(text, "| Allocated memory ") ==
          "| Allocated memory      |  40960 KiB |  40960 KiB |  40960 KiB |      0 B   |");
    CHECK(s.num_ooms == 1);
    CHECK(line_of(text, "|           CUDA OOMs: 1            |        cudaMalloc retries: 1") !=
          "");
    CHECK(line_of(text, "gpukit: segments: synchronous;") != "");
    CHECK(line_of(text, "gpukit: OOM recoveries: 1 allocations needed recovery, 1 failed") != "");
    alloc.deallocate_async(a, 40 * mib, {});
    // 1 GiB and more: MiB.
    sim_runtime big{one_device(8 * gib)};
    sim_allocator b{big, 0};
    void* g = b.allocate_async(3 * gib, {});
    CHECK(line_of(gpukit::memory_summary(b), "| Allocated memory ") ==
          "| Allocated memory      |   3072 MiB |   3072 MiB |   3072 MiB |      0 B   |");
    b.deallocate_async(g, 3 * gib, {});
  }

  TEST_CASE("GPUKIT_ALLOC_CONF: the default allocator takes its options from it")
  {
    setenv("GPUKIT_SIM_DEVICES", "4", 0);  // before the process's simulated GPU exists
    REQUIRE(setenv("GPUKIT_ALLOC_CONF", "segments:synchronous, limit:1GiB", 1) == 0);
    auto& a = gpukit::default_caching_allocator<sim_runtime>(1);
    unsetenv("GPUKIT_ALLOC_CONF");
    CHECK(a.options().source == gpukit::segment_source::synchronous);
    CHECK(a.segment_source_in_use() == gpukit::segment_source::synchronous);
    CHECK(a.limit() == gib);
    CHECK(&gpukit::get_current_device_resource<sim_runtime>(1) == &a);
    // Read once, when the allocator is created: later changes do not affect it.
    REQUIRE(setenv("GPUKIT_ALLOC_CONF", "limit:2GiB", 1) == 0);
    CHECK(gpukit::default_caching_allocator<sim_runtime>(1).limit() == gib);
    unsetenv("GPUKIT_ALLOC_CONF");
  }

  TEST_CASE("GPUKIT_ALLOC_CONF: a bad value throws at first use, naming the key and the value")
  {
    setenv("GPUKIT_SIM_DEVICES", "4", 0);
    REQUIRE(setenv("GPUKIT_ALLOC_CONF", "segments:growable,limit:lots", 1) == 0);
    for (int attempt = 0; attempt < 2; ++attempt) {  // nothing was created: it throws again
      try {
        (void)gpukit::default_caching_allocator<sim_runtime>(2);
        FAIL("no error for limit:lots");
      } catch (gpukit::logic_error const& e) {
        std::string const what = e.what();
        CHECK(what.find("'limit'") != std::string::npos);
        CHECK(what.find("'lots'") != std::string::npos);
        CHECK(what.find("GPUKIT_ALLOC_CONF") != std::string::npos);
        CHECK(what.find("default_caching_allocator(2)") != std::string::npos);
      }
    }
    CHECK_THROWS_AS((void)gpukit::get_current_device_resource<sim_runtime>(3), gpukit::logic_error);
    REQUIRE(setenv("GPUKIT_ALLOC_CONF", "segmentz:growable", 1) == 0);
    CHECK_THROWS_WITH_AS((void)gpukit::default_caching_allocator<sim_runtime>(2),
                         doctest::Contains("segmentz"), gpukit::logic_error);
    unsetenv("GPUKIT_ALLOC_CONF");
    auto& fixed = gpukit::default_caching_allocator<sim_runtime>(2);  // defaults once it is fixed
    CHECK(fixed.options().source == gpukit::caching_allocator_options{}.source);
    CHECK(fixed.limit() == 0);
  }
}

// ---------------------------------------------------------------------------------------------
// Batched peaks under concurrency (detail::shared_counts): from the second thread on, each thread
// folds its delta into the shared values only past a batch, so a peak may be below the true one
// by at most threads x batch (per pool kind; both kinds: twice that), never above it; current
// values read with no operation in flight are exact.

namespace {

/// Threads wait here for each other (C++17 has no std::barrier): the n-th arrival releases all.
class phase_barrier {
 public:
  explicit phase_barrier(int n) : n_{n} {}
  void arrive_and_wait()
  {
    std::unique_lock<std::mutex> lock{m_};
    int const phase = phase_;
    if (++arrived_ == n_) {
      arrived_ = 0;
      ++phase_;
      cv_.notify_all();
      return;
    }
    cv_.wait(lock, [&] { return phase_ != phase; });
  }

 private:
  std::mutex m_;
  std::condition_variable cv_;
  int n_;
  int arrived_{0};
  int phase_{0};
};

/// Per pool kind, then [2]: both.
struct kind_sums {
  std::int64_t requested[3]{}, count[3]{};
  void add(std::size_t bytes, int sign)
  {
    int const k = (bytes + 255) / 256 * 256 <= mib ? 0 : 1;
    for (int i : {k, 2}) {
      requested[i] += sign * static_cast<std::int64_t>(bytes);
      count[i] += sign;
    }
  }
};

std::uint64_t xorshift(std::uint64_t& s)
{
  s ^= s << 13;
  s ^= s >> 7;
  s ^= s << 17;
  return s;
}

/// A size of either pool kind: half up to 1 MiB, half up to 6 MiB.
std::size_t random_size(std::uint64_t& rng)
{
  return xorshift(rng) % 2 == 0 ? 1 + xorshift(rng) % mib : mib + 1 + xorshift(rng) % (5 * mib);
}

using shared = gpukit::detail::shared_counts;

/// The slack a batched peak may have below the true one, with `threads` threads holding deltas:
/// per pool kind (i < 2), then both (i == 2).
std::int64_t slack_bytes(int threads, int i)
{
  return (i == 2 ? 2 : 1) * threads * shared::batch_bytes;
}
std::int64_t slack_count(int threads, int i)
{
  return (i == 2 ? 2 : 1) * threads * shared::batch_count;
}

/// The statistics `which` of pool kind i (< 2) or of both (2).
gpukit::stat_pair pair_of(gpukit::caching_allocator_stats const& s, int i,
                          gpukit::stat_pair gpukit::caching_allocator_stats::*all,
                          gpukit::stat_totals gpukit::caching_pool_stats::*pool)
{
  if (i == 2) { return s.*all; }
  gpukit::stat_totals const& t = (i == 0 ? s.small_pool : s.large_pool).*pool;
  return {t.current, t.peak};
}
gpukit::stat_pair requested_of(gpukit::caching_allocator_stats const& s, int i)
{
  return pair_of(s, i, &gpukit::caching_allocator_stats::requested_bytes,
                 &gpukit::caching_pool_stats::requested_bytes);
}
gpukit::stat_pair count_of(gpukit::caching_allocator_stats const& s, int i)
{
  return pair_of(s, i, &gpukit::caching_allocator_stats::allocation_count,
                 &gpukit::caching_pool_stats::allocation_count);
}

/// A block a thread holds.
struct held {
  void* p;
  std::size_t bytes;
};

/// An allocator on a 64 GiB simulated device and one stream per thread.
struct threads_fixture {
  explicit threads_fixture(int threads)
  {
    for (int t = 0; t < threads; ++t) {
      streams.push_back(std::make_unique<stream_holder<sim_runtime>>(sim));
    }
  }
  sim_runtime sim{one_device(64 * gib)};
  sim_allocator alloc{sim, 0};
  std::vector<std::unique_ptr<stream_holder<sim_runtime>>> streams;
};

}  // namespace

TEST_SUITE("sim_concurrency")
{
  TEST_CASE(
    "batched stats: threads x random operations, then exact current values, alive or "
    "exited, and peaks between the current values and the threads' own maxima summed")
  {
    constexpr int threads = 8, ops = 1500, max_live = 24;
    threads_fixture fx{threads};
    auto& alloc   = fx.alloc;
    auto& streams = fx.streams;
    std::vector<std::vector<held>> blocks(threads);
    std::vector<kind_sums> net(threads), top(threads);  // each thread's own, and their highest
    phase_barrier done{threads + 1}, leave{threads + 1};
    std::vector<std::thread> pool;
    for (int t = 0; t < threads; ++t) {
      pool.emplace_back([&, t] {
        std::uint64_t rng  = 0x9e3779b97f4a7c15ull * static_cast<std::uint64_t>(t + 1);
        sim_stream const s = *streams[static_cast<std::size_t>(t)];
        auto& mine         = blocks[static_cast<std::size_t>(t)];
        kind_sums& n       = net[static_cast<std::size_t>(t)];
        kind_sums& m       = top[static_cast<std::size_t>(t)];
        for (int op = 0; op < ops; ++op) {
          bool const grow = mine.empty() || (mine.size() < max_live && xorshift(rng) % 5 < 3);
          if (grow) {
            std::size_t const bytes = random_size(rng);
            mine.push_back({alloc.allocate_async(bytes, s), bytes});
            n.add(bytes, 1);
          } else {
            std::size_t const i = xorshift(rng) % mine.size();
            alloc.deallocate_async(mine[i].p, mine[i].bytes, s);
            n.add(mine[i].bytes, -1);
            mine.erase(mine.begin() + static_cast<std::ptrdiff_t>(i));
          }
          for (int i = 0; i < 3; ++i) {
            m.requested[i] = std::max(m.requested[i], n.requested[i]);
            m.count[i]     = std::max(m.count[i], n.count[i]);
          }
        }
        done.arrive_and_wait();
        leave.arrive_and_wait();  // alive, deltas unfolded, while the main thread reads
      });
    }
    auto check = [&](char const* when) {
      CAPTURE(when);
      auto const st = alloc.stats();
      for (int i = 0; i < 3; ++i) {
        CAPTURE(i);
        std::int64_t requested = 0, count = 0, top_requested = 0, top_count = 0;
        for (int t = 0; t < threads; ++t) {
          requested += net[static_cast<std::size_t>(t)].requested[i];
          count += net[static_cast<std::size_t>(t)].count[i];
          top_requested += top[static_cast<std::size_t>(t)].requested[i];
          top_count += top[static_cast<std::size_t>(t)].count[i];
        }
        CHECK(requested_of(st, i).current == requested);
        CHECK(count_of(st, i).current == count);
        // The true peak is at most the threads' own highest values together (each frees only its
        // own blocks); batching keeps the reported one at or below the true one.
        CHECK(requested_of(st, i).peak >= requested);
        CHECK(requested_of(st, i).peak <= top_requested);
        CHECK(count_of(st, i).peak >= count);
        CHECK(count_of(st, i).peak <= top_count);
      }
      check_consistent(alloc);
    };
    done.arrive_and_wait();
    check("threads alive");
    leave.arrive_and_wait();
    for (auto& th : pool) { th.join(); }
    check("threads exited");
    for (int t = 0; t < threads; ++t) {
      for (held const& b : blocks[static_cast<std::size_t>(t)]) {
        alloc.deallocate_async(b.p, b.bytes, *streams[static_cast<std::size_t>(t)]);
        net[static_cast<std::size_t>(t)].add(b.bytes, -1);
      }
    }
    check("every block freed");
    CHECK(alloc.stats().allocation_count.current == 0);
    for (auto& s : streams) { alloc.forget_stream(*s); }
  }

  TEST_CASE(
    "batched stats: a peak made between barriers is at most threads x batch below the "
    "true one and never above it; reset_peak starts the next phase from the current "
    "values")
  {
    constexpr int threads = 8;
    threads_fixture fx{threads};
    auto& alloc   = fx.alloc;
    auto& streams = fx.streams;
    // Round r: every thread allocates `blocks_per_thread[r]` blocks, the threads meet, and each
    // frees the blocks of the next thread (so that every thread's own net values go negative
    // too). The true peak is the sum at the barrier: only allocations come before it.
    for (int const round : {0, 1}) {
      CAPTURE(round);
      int const per_thread = round == 0 ? 40 : 12;
      std::vector<std::vector<held>> blocks(threads);
      kind_sums truth;  // at the barrier
      std::mutex truth_mutex;
      phase_barrier met{threads};
      std::vector<std::thread> pool;
      for (int t = 0; t < threads; ++t) {
        pool.emplace_back([&, t] {
          std::uint64_t rng  = 0x2545f4914f6cdd1dull * static_cast<std::uint64_t>(t + 3 + round);
          sim_stream const s = *streams[static_cast<std::size_t>(t)];
          auto& mine         = blocks[static_cast<std::size_t>(t)];
          kind_sums added;
          for (int b = 0; b < per_thread; ++b) {
            std::size_t const bytes = random_size(rng);
            mine.push_back({alloc.allocate_async(bytes, s), bytes});
            added.add(bytes, 1);
          }
          {
            std::lock_guard<std::mutex> lock{truth_mutex};
            for (int i = 0; i < 3; ++i) {
              truth.requested[i] += added.requested[i];
              truth.count[i] += added.count[i];
            }
          }
          met.arrive_and_wait();
          for (held const& b : blocks[static_cast<std::size_t>((t + 1) % threads)]) {
            alloc.deallocate_async(b.p, b.bytes, s);
          }
        });
      }
      for (auto& th : pool) { th.join(); }
      auto const st = alloc.stats();
      for (int i = 0; i < 3; ++i) {
        CAPTURE(i);
        CHECK(requested_of(st, i).current == 0);
        CHECK(count_of(st, i).current == 0);
        std::int64_t const peak_requested = requested_of(st, i).peak;
        std::int64_t const peak_count     = count_of(st, i).peak;
        CHECK(peak_requested <= truth.requested[i]);
        CHECK(peak_requested >= truth.requested[i] - slack_bytes(threads, i));
        CHECK(peak_count <= truth.count[i]);
        CHECK(peak_count >= truth.count[i] - slack_count(threads, i));
      }
      CHECK(st.active_count.peak == st.allocation_count.peak);  // no free waited on a stream
      check_consistent(alloc);
      alloc.reset_peak();
      auto const reset = alloc.stats();
      CHECK(reset.requested_bytes.peak == 0);
      CHECK(reset.allocation_count.peak == 0);
      CHECK(reset.large_pool.requested_bytes.peak == 0);
    }
    for (auto& s : streams) { alloc.forget_stream(*s); }
  }

  TEST_CASE(
    "batched stats: a thread that exits folds its delta, so the peak it is part of stays "
    "within the live threads' bound")
  {
    constexpr int exiting = 4;
    sim_runtime sim{one_device(64 * gib)};
    sim_allocator alloc{sim, 0};
    stream_holder<sim_runtime> s{sim};
    // Two threads have used the allocator: the shared counts are on before the others come.
    alloc.deallocate_async(alloc.allocate_async(mib, s), mib, s);
    std::thread{[&] { alloc.deallocate_async(alloc.allocate_async(mib, s), mib, s); }}.join();
    // Each exiting thread holds less than a batch (its delta, never folded while it runs). They
    // are alive together, so each has a cache of its own (a cache outlives its thread, and the
    // next thread to come adopts it with its counters).
    std::int64_t const held_bytes = shared::batch_bytes - 2 * mib;
    std::vector<void*> left(exiting);
    phase_barrier all_in{exiting};
    std::vector<std::thread> pool;
    for (int t = 0; t < exiting; ++t) {
      pool.emplace_back([&, t] {
        left[static_cast<std::size_t>(t)] =
          alloc.allocate_async(static_cast<std::size_t>(held_bytes), s);
        all_in.arrive_and_wait();
      });
    }
    for (auto& th : pool) { th.join(); }
    // One live thread allocates a block larger than a batch and frees it: it folds both times.
    std::int64_t const big = 8 * shared::batch_bytes;
    std::thread{[&] {
      alloc.deallocate_async(alloc.allocate_async(static_cast<std::size_t>(big), s),
                             static_cast<std::size_t>(big), s);
    }}.join();
    auto const st            = alloc.stats();
    std::int64_t const truth = exiting * held_bytes + big;
    CHECK(st.requested_bytes.current == exiting * held_bytes);
    CHECK(st.requested_bytes.peak <= truth);
    // Only the big block's thread held a delta at the peak (the exited ones folded theirs): had
    // their deltas stayed unfolded, the peak would miss the bytes of the three caches the big
    // block's thread did not adopt.
    CHECK(st.requested_bytes.peak >= truth - shared::batch_bytes);
    CHECK(st.large_pool.requested_bytes.peak >= truth - shared::batch_bytes);
    for (void* p : left) { alloc.deallocate_async(p, static_cast<std::size_t>(held_bytes), s); }
    alloc.forget_stream(s);
  }
}
