// SPDX-License-Identifier: Apache-2.0
// The transfer pipeline and the prefetcher on the simulated GPU: the conformance cases, plus what
// only a simulated GPU can show (stalled copy streams, injected faults, call counters).
#include "transfer/transfer_conformance.hpp"

#include "support/holders.hpp"
#include "support/pattern.hpp"
#include "support/sim_gpu.hpp"
#include "support/sizes.hpp"
#include "support/transfer_fixture.hpp"
#include "support/wait.hpp"

#include <gpukit/runtime/sim_runtime.hpp>
#include <gpukit/transfer/prefetcher.hpp>
#include <gpukit/transfer/transfer_pipeline.hpp>

#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

using namespace gpukit::test;
using gpukit::sim_op;
using gpukit::sim_runtime;
using sim_pool     = gpukit::basic_pinned_pool<sim_runtime>;
using sim_pipeline = gpukit::basic_transfer_pipeline<sim_runtime>;

TEST_SUITE("transfer")
{
  TEST_CASE_FIXTURE(sim_transfer_fixture,
                    "transfer: the defaults are the H200 sweep's: 4 MiB fixed chunks")
  {
    gpukit::transfer_options const o;
    CHECK(o.chunk_bytes == 4 * mib);
    CHECK(o.min_piece_bytes == 0);
    sim_pipeline pipe{sim, pool, o};
    CHECK(pipe.options().min_piece_bytes == pipe.options().chunk_bytes);  // fixed chunks
  }

  TEST_CASE_FIXTURE(sim_transfer_fixture,
                    "transfer: a staging chunk is never refilled while the copy from it is pending")
  {
    sim_pipeline pipe{sim, pool, chunked(64 * kib, 1, 2)};
    std::size_t const bytes = 5 * 64 * kib + 99;
    transfer_bytes<sim_runtime> t{sim, bytes, 42};
    GPUKIT_CUDA_TRY(sim.stall(pipe.h2d_stream()));
    std::thread copier{[&] { pipe.copy_to_device_async(t.dev.p, t.src.data(), bytes, s.s); }};
    CHECK(wait_until([&] { return pipe.stats().chunks == 2; }));
    std::this_thread::sleep_for(std::chrono::milliseconds{30});
    CHECK(pipe.stats().chunks == 2);  // both chunks' copies are pending: the third waits
    CHECK(pipe.stats().staging_chunks == 2);
    CHECK(sim.calls(sim_op::device_synchronize) == 0);
    GPUKIT_CUDA_TRY(sim.release(pipe.h2d_stream()));
    copier.join();
    CHECK(pipe.stats().chunk_waits >= 1);
    std::vector<unsigned char> back(bytes);
    GPUKIT_CUDA_TRY(
      sim.memcpy_async(back.data(), t.dev.p, bytes, gpukit::memcpy_kind::device_to_host, s.s));
    GPUKIT_CUDA_TRY(sim.stream_synchronize(s.s));
    CHECK(first_mismatch(back.data(), bytes, 42) == bytes);
  }

  TEST_CASE_FIXTURE(
    sim_transfer_fixture,
    "transfer: transfers wait for the consumer stream's earlier work and hand their own to it")
  {
    sim_pipeline pipe{sim, pool, chunked(64 * kib, 1, 3)};
    std::size_t const bytes = 3 * 64 * kib - 5;  // 3 chunks: a ring of 3 never waits
    transfer_bytes<sim_runtime> t{sim, bytes, 5};
    GPUKIT_CUDA_TRY(sim.stall(s.s));  // earlier work on s: the copies must not start
    GPUKIT_CUDA_TRY(sim.memset_async(t.dev.p, 0, bytes, s.s));
    pipe.copy_to_device_async(t.dev.p, t.src.data(), bytes, s.s);  // staged; copies wait on s
    CHECK(pipe.stats().chunks == 3);
    std::this_thread::sleep_for(std::chrono::milliseconds{20});
    CHECK(sim.stream_query(pipe.h2d_stream()) == cudaErrorNotReady);
    std::thread copier{[&] { pipe.copy_to_host_async(t.dst.data(), t.dev.p, bytes, s.s); }};
    std::this_thread::sleep_for(std::chrono::milliseconds{20});
    CHECK(t.dst[0] == 0);  // nothing arrives before s's earlier work has run
    GPUKIT_CUDA_TRY(sim.release(s.s));
    copier.join();
    CHECK(t.arrived());
    CHECK(sim.calls(sim_op::device_synchronize) == 0);
    CHECK(sim.calls(sim_op::launch_host_func) == 0);
  }

  TEST_CASE("transfer: a failing memcpy_async mid-transfer gives a clear error and leaks nothing")
  {
    sim_runtime sim{one_device(gib)};
    std::size_t const bytes = 6 * 64 * kib + 1;
    {
      sim_pool pool{sim};
      {
        sim_pipeline pipe{sim, pool, chunked(64 * kib, 1, 3)};
        stream_holder<sim_runtime> s{sim};
        transfer_bytes<sim_runtime> t{sim, bytes, 9};
        sim.inject_fault(sim_op::memcpy_async, 3, cudaErrorLaunchFailure);
        try {
          pipe.copy_to_device_async(t.dev.p, t.src.data(), bytes, s.s);
          FAIL("the third chunk's copy fails");
        } catch (gpukit::cuda_error const& e) {
          CHECK(e.code() == cudaErrorLaunchFailure);
          CHECK(std::string{e.what()}.find("memcpy_async") != std::string::npos);
        }
        CHECK(pipe.stats().chunks == 2);
        CHECK(pool.stats().allocation_count.current ==
              static_cast<std::int64_t>(pipe.stats().staging_chunks));
        // The pipeline still works, and a device-to-host failure is reported the same way.
        pipe.copy_to_device_async(t.dev.p, t.src.data(), bytes, s.s);
        sim.inject_fault(sim_op::memcpy_async, 2, cudaErrorLaunchFailure);
        CHECK_THROWS_AS(pipe.copy_to_host_async(t.dst.data(), t.dev.p, bytes, s.s),
                        gpukit::cuda_error);
        pipe.copy_to_host_async(t.dst.data(), t.dev.p, bytes, s.s);
        CHECK(t.arrived());
        GPUKIT_CUDA_TRY(sim.stream_synchronize(s.s));
      }
      CHECK(pool.stats().allocation_count.current == 0);  // every staging chunk came back
      GPUKIT_CUDA_TRY(sim.device_synchronize());
      CHECK(pool.release_cached() > 0);
      CHECK(pool.stats().reserved_bytes.current == 0);
    }
    CHECK(sim.calls(sim_op::host_alloc) == sim.calls(sim_op::host_free));
    CHECK(sim.calls(sim_op::host_register) == sim.calls(sim_op::host_unregister));
    CHECK(sim.calls(sim_op::host_register) > 0);
    CHECK(sim.calls(sim_op::event_create) == sim.calls(sim_op::event_destroy));
  }

  TEST_CASE_FIXTURE(sim_transfer_fixture,
                    "transfer: a failing pin of a staging chunk mid-transfer gives a clear error")
  {
    std::size_t const bytes = 8 * 64 * kib;
    // the fixture's pool grows with host_register
    {
      sim_pipeline pipe{sim, pool, chunked(64 * kib, 1, 4)};
      transfer_bytes<sim_runtime> t{sim, bytes, 11};
      // Stalled, the first two chunks' copies stay pending, so the third chunk needs a new slot.
      GPUKIT_CUDA_TRY(sim.stall(pipe.h2d_stream()));
      sim.inject_fault(sim_op::host_register, 3, cudaErrorMemoryAllocation);
      CHECK_THROWS_WITH_AS(pipe.copy_to_device_async(t.dev.p, t.src.data(), bytes, s.s),
                           doctest::Contains("host_register"), gpukit::cuda_error);
      CHECK(pipe.stats().staging_chunks == 2);
      CHECK(pipe.stats().chunks == 2);
      CHECK(pool.stats().allocation_count.current == 2);
      GPUKIT_CUDA_TRY(sim.release(pipe.h2d_stream()));
      pipe.copy_to_device_async(t.dev.p, t.src.data(), bytes, s.s);
      pipe.copy_to_host_async(t.dst.data(), t.dev.p, bytes, s.s);
      CHECK(t.arrived());
      GPUKIT_CUDA_TRY(sim.stream_synchronize(s.s));
    }
    CHECK(pool.stats().allocation_count.current == 0);
  }

  TEST_CASE_FIXTURE(sim_transfer_fixture,
                    "transfer: guided pieces shrink at a transfer's end and every byte arrives")
  {
    for (auto copy : {gpukit::staging_copy::memcpy, gpukit::staging_copy::nontemporal}) {
      gpukit::transfer_options o;
      o.chunk_bytes     = 256 * kib;
      o.min_piece_bytes = 1000;  // rounded up to 64 KiB
      o.staging_threads = 4;
      o.copy            = copy;
      sim_pipeline pipe{sim, pool, o};
      CHECK(pipe.options().min_piece_bytes == 64 * kib);
      std::uint32_t seed = 40;
      for (std::size_t bytes : {3 * mib + 12345, mib - 1, 256 * kib + 1, std::size_t{100}}) {
        CAPTURE(bytes);
        ++seed;
        device_buffer<sim_runtime> dev{sim, bytes};
        // Source and destination off any alignment: the streaming copy's head and tail.
        std::vector<unsigned char> src(bytes + 3), dst(bytes + 70, 0xEE);
        fill_pattern(src.data() + 3, bytes, seed);
        auto const before = pipe.stats();
        pipe.copy_to_device_async(dev.p, src.data() + 3, bytes, gpukit::host_memory::pageable, s.s);
        pipe.copy_to_host_async(dst.data() + 5, dev.p, bytes, gpukit::host_memory::pageable, s.s);
        CHECK(first_mismatch(dst.data() + 5, bytes, seed) == bytes);
        for (std::size_t i = 0; i < 5; ++i) { CHECK(dst[i] == 0xEE); }
        for (std::size_t i = bytes + 5; i < dst.size(); ++i) { CHECK(dst[i] == 0xEE); }
        std::size_t const fixed = (bytes + o.chunk_bytes - 1) / o.chunk_bytes;
        std::size_t const most  = (bytes + 64 * kib - 1) / (64 * kib);
        auto const pieces       = (pipe.stats().chunks - before.chunks) / 2;
        if (bytes > 2 * o.chunk_bytes) { CHECK(pieces > fixed); }  // the tail was split
        CHECK(pieces >= fixed);
        CHECK(pieces <= most);
      }
      GPUKIT_CUDA_TRY(sim.stream_synchronize(s.s));
    }
    // Fixed chunks when min_piece_bytes is 0 or at least chunk_bytes.
    gpukit::transfer_options fixed = chunked(64 * kib, 2);
    fixed.min_piece_bytes          = 0;
    sim_pipeline a{sim, pool, fixed};
    CHECK(a.options().min_piece_bytes == a.options().chunk_bytes);
    device_buffer<sim_runtime> dev{sim, mib};
    std::vector<unsigned char> src(mib - 7);
    a.copy_to_device_async(dev.p, src.data(), src.size(), s.s);
    CHECK(a.stats().chunks == 16);
    GPUKIT_CUDA_TRY(sim.stream_synchronize(s.s));
    gpukit::transfer_options bad;
    bad.copy = static_cast<gpukit::staging_copy>(7);
    CHECK_THROWS_WITH_AS(sim_pipeline(sim, pool, bad), doctest::Contains("staging_copy 7"),
                         gpukit::logic_error);
  }

  TEST_CASE_FIXTURE(sim_transfer_fixture,
                    "transfer: prewarm pins both rings before the first transfer")
  {
    sim_pipeline pipe{sim, pool, chunked(64 * kib, 1, 3)};
    pipe.prewarm();
    CHECK(pipe.stats().staging_chunks == 6);
    CHECK(pool.stats().num_growths == 1);
    device_buffer<sim_runtime> dev{sim, mib};
    std::vector<unsigned char> src(mib);
    pipe.copy_to_device_async(dev.p, src.data(), mib, s.s);
    CHECK(pool.stats().num_growths == 1);
    GPUKIT_CUDA_TRY(sim.stream_synchronize(s.s));
  }
}

TEST_SUITE("sim_concurrency")
{
  TEST_CASE_FIXTURE(sim_transfer_fixture,
                    "transfer: a failing copy with staging threads leaks nothing")
  {
    std::size_t const bytes = 40 * 64 * kib + 3;
    {
      sim_pipeline pipe{sim, pool, chunked(64 * kib, 4, 6)};
      transfer_bytes<sim_runtime> t{sim, bytes, 77};
      sim.inject_fault(sim_op::memcpy_async, 10, cudaErrorLaunchFailure);
      CHECK_THROWS_AS(pipe.copy_to_device_async(t.dev.p, t.src.data(), bytes, s.s),
                      gpukit::cuda_error);
      pipe.copy_to_device_async(t.dev.p, t.src.data(), bytes, s.s);
      pipe.copy_to_host_async(t.dst.data(), t.dev.p, bytes, s.s);
      CHECK(t.arrived());
    }
    CHECK(pool.stats().allocation_count.current == 0);
  }
  TEST_CASE_FIXTURE(sim_transfer_fixture, "transfer: many pipelines share one pool and one device")
  {
    std::atomic<int> bad{0};
    std::vector<std::thread> ts;
    for (int t = 0; t < 4; ++t) {
      ts.emplace_back([&, t] {
        sim_pipeline pipe{sim, pool, chunked(64 * kib, 2, 3)};
        for (int i = 0; i < 6; ++i) {
          std::size_t const bytes = 100 * kib + static_cast<std::size_t>(t * 7919 + i * 4111);
          device_buffer<sim_runtime> dev{sim, bytes};
          std::vector<unsigned char> src(bytes), dst(bytes);
          auto const seed = static_cast<std::uint32_t>(t * 10 + i);
          fill_pattern(src.data(), bytes, seed);
          pipe.copy_to_device_async(dev.p, src.data(), bytes, s.s);
          pipe.copy_to_host_async(dst.data(), dev.p, bytes, s.s);
          if (first_mismatch(dst.data(), bytes, seed) != bytes) { ++bad; }
        }
        GPUKIT_CUDA_TRY(sim.stream_synchronize(s.s));
      });
    }
    for (auto& t : ts) { t.join(); }
    CHECK(bad.load() == 0);
    CHECK(pool.stats().allocation_count.current == 0);
  }
  TEST_CASE_FIXTURE(
    sim_transfer_fixture,
    "transfer: a submitted transfer returns at once and completes when its copies can run")
  {
    sim_pipeline pipe{sim, pool, chunked(64 * kib, 3, 2)};
    std::size_t const bytes = 5 * 64 * kib + 99;
    transfer_bytes<sim_runtime> t{sim, bytes, 21};
    GPUKIT_CUDA_TRY(sim.stall(pipe.h2d_stream()));
    completions c;
    pipe.submit_to_device(t.dev.p, t.src.data(), bytes, gpukit::host_memory::detect, s.s, c.one());
    CHECK(wait_until([&] { return pipe.stats().chunks == 2; }));
    std::this_thread::sleep_for(std::chrono::milliseconds{30});
    CHECK(c.done() == 0);  // two chunks' copies pending, a ring of two: staging waits
    CHECK(pipe.stats().chunks == 2);
    CHECK(pipe.stats().transfers == 0);
    GPUKIT_CUDA_TRY(sim.release(pipe.h2d_stream()));
    REQUIRE(c.wait_for(1));
    CHECK_FALSE(c.first_error);
    CHECK((c.last_thread != std::this_thread::get_id()));  // a staging thread ended it
    CHECK(pipe.stats().transfers == 1);
    std::vector<unsigned char> back(bytes);  // s waits for the copy: no other synchronization
    GPUKIT_CUDA_TRY(
      sim.memcpy_async(back.data(), t.dev.p, bytes, gpukit::memcpy_kind::device_to_host, s.s));
    GPUKIT_CUDA_TRY(sim.stream_synchronize(s.s));
    CHECK(first_mismatch(back.data(), bytes, 21) == bytes);
    CHECK(sim.calls(sim_op::device_synchronize) == 0);
  }
  TEST_CASE_FIXTURE(
    sim_transfer_fixture,
    "transfer: the staging threads finish the oldest submitted transfer's chunks first")
  {
    sim_pipeline pipe{sim, pool, chunked(64 * kib, 2)};  // one staging thread of its own
    std::size_t const big = 8 * 64 * kib, small = 2 * 64 * kib;
    device_buffer<sim_runtime> a{sim, big}, b{sim, small};
    std::vector<unsigned char> src(big, 1);
    std::mutex m;
    std::vector<char> order;
    auto note = [&](char who) {
      return [&, who](std::exception_ptr) {
        std::lock_guard<std::mutex> lock{m};
        order.push_back(who);
      };
    };
    pipe.submit_to_device(a.p, src.data(), big, gpukit::host_memory::detect, s.s, note('a'));
    pipe.submit_to_device(b.p, src.data(), small, gpukit::host_memory::detect, s.s, note('b'));
    // Taking turns between the two would end the short one first; oldest first ends a first.
    REQUIRE(wait_until([&] {
      std::lock_guard<std::mutex> lock{m};
      return order.size() == 2;
    }));
    CHECK(order == std::vector<char>{'a', 'b'});
    GPUKIT_CUDA_TRY(sim.stream_synchronize(s.s));
  }
  TEST_CASE_FIXTURE(sim_transfer_fixture,
                    "transfer: a failing copy in a submitted transfer reaches its completion once")
  {
    std::size_t const bytes = 6 * 64 * kib + 1;
    {
      completions c;
      sim_pipeline pipe{sim, pool, chunked(64 * kib, 3, 3)};
      transfer_bytes<sim_runtime> t{sim, bytes, 13};
      sim.inject_fault(sim_op::memcpy_async, 3, cudaErrorLaunchFailure);
      pipe.submit_to_device(t.dev.p, t.src.data(), bytes, gpukit::host_memory::detect, s.s,
                            c.one());
      REQUIRE(c.wait_for(1));
      REQUIRE(c.first_error);
      CHECK_THROWS_WITH_AS(std::rethrow_exception(c.first_error), doctest::Contains("memcpy_async"),
                           gpukit::cuda_error);
      std::this_thread::sleep_for(std::chrono::milliseconds{20});
      CHECK(c.done() == 1);
      CHECK(pipe.stats().transfers == 0);
      // The pipeline still works.
      completions again;
      pipe.submit_to_device(t.dev.p, t.src.data(), bytes, gpukit::host_memory::detect, s.s,
                            again.one());
      REQUIRE(again.wait_for(1));
      CHECK_FALSE(again.first_error);
      pipe.copy_to_host_async(t.dst.data(), t.dev.p, bytes, s.s);
      CHECK(t.arrived());
      GPUKIT_CUDA_TRY(sim.stream_synchronize(s.s));
      CHECK(pool.stats().allocation_count.current ==
            static_cast<std::int64_t>(pipe.stats().staging_chunks));
    }
    CHECK(pool.stats().allocation_count.current == 0);
  }
  TEST_CASE_FIXTURE(sim_transfer_fixture,
                    "transfer: bad input to submit is refused at once and never completes")
  {
    sim_pipeline pipe{sim, pool, chunked(64 * kib, 2)};
    device_buffer<sim_runtime> dev{sim, mib};
    std::vector<unsigned char> host(mib);
    completions c;
    auto const detect = gpukit::host_memory::detect;
    CHECK_THROWS_WITH_AS(pipe.submit_to_device(dev.p, host.data(), 0, detect, s.s, c.one()),
                         doctest::Contains("submit_to_device: 0 bytes"), gpukit::logic_error);
    CHECK_THROWS_WITH_AS(pipe.submit_to_host(nullptr, dev.p, 16, detect, s.s, c.one()),
                         doctest::Contains("submit_to_host: null pointer"), gpukit::logic_error);
    CHECK_THROWS_WITH_AS(pipe.submit_to_device(dev.p, host.data(), 16, detect, s.s, {}),
                         doctest::Contains("the completion is empty"), gpukit::logic_error);
    std::this_thread::sleep_for(std::chrono::milliseconds{20});
    CHECK(c.done() == 0);
    CHECK(pipe.stats().chunks == 0);
  }
  TEST_CASE_FIXTURE(sim_transfer_fixture, "transfer: the destructor waits for submitted transfers")
  {
    std::size_t const bytes = 6 * 64 * kib;
    device_buffer<sim_runtime> dev{sim, bytes};
    std::vector<unsigned char> src(bytes, 3);
    completions c;
    std::thread releaser;
    {
      sim_pipeline pipe{sim, pool, chunked(64 * kib, 3, 2)};
      GPUKIT_CUDA_TRY(sim.stall(pipe.h2d_stream()));
      pipe.submit_to_device(dev.p, src.data(), bytes, gpukit::host_memory::detect, s.s, c.one());
      releaser = std::thread{[&gpu = sim, cs = pipe.h2d_stream()] {
        std::this_thread::sleep_for(std::chrono::milliseconds{50});
        (void)gpu.release(cs);
      }};
    }  // blocks until the copy stream moves and the completion has run
    CHECK(c.done() == 1);
    releaser.join();
    GPUKIT_CUDA_TRY(sim.stream_synchronize(s.s));
    CHECK(pool.stats().allocation_count.current == 0);
  }
  TEST_CASE_FIXTURE(
    sim_transfer_fixture,
    "transfer: without staging threads of its own, submit completes before it returns")
  {
    sim_pipeline pipe{sim, pool, chunked(64 * kib, 1)};
    std::size_t const bytes = 3 * 64 * kib + 7;
    transfer_bytes<sim_runtime> t{sim, bytes, 17};
    completions c;
    pipe.submit_to_device(t.dev.p, t.src.data(), bytes, gpukit::host_memory::detect, s.s, c.one());
    CHECK(c.done() == 1);
    CHECK((c.last_thread == std::this_thread::get_id()));
    pipe.submit_to_host(t.dst.data(), t.dev.p, bytes, gpukit::host_memory::detect, s.s, c.one());
    CHECK(c.done() == 2);
    CHECK_FALSE(c.first_error);
    CHECK(t.arrived());
    GPUKIT_CUDA_TRY(sim.stream_synchronize(s.s));
  }
  TEST_CASE_FIXTURE(sim_transfer_fixture, "prefetcher: keeps exactly the next batch in flight")
  {
    sim_pipeline pipe{sim, pool, chunked(64 * kib, 2)};
    gpukit::basic_caching_allocator<sim_runtime> alloc{sim, 0};
    std::vector<unsigned char> data(200 * kib, 1);
    std::atomic<std::size_t> asked{0};
    {
      gpukit::basic_prefetcher<sim_runtime> loader{
        pipe, alloc, [&](std::size_t i) {
          asked = i + 1;
          if (i == 5) { return gpukit::host_batch{}; }
          return gpukit::host_batch{data.data(), data.size()};
        }};
      auto b0 = loader.next(s.s);
      REQUIRE(b0.has_value());
      CHECK(wait_until([&] { return asked.load() == 2; }));
      std::this_thread::sleep_for(std::chrono::milliseconds{20});
      CHECK(asked.load() == 2);  // batch 1 is in flight, batch 2 is not asked for yet
      loader.release(*b0, s.s);
      CHECK_THROWS_AS(loader.release(*b0, s.s), gpukit::logic_error);
      auto b1 = loader.next(s.s);
      CHECK(b1->index == 1);
      loader.release(*b1, s.s);
      GPUKIT_CUDA_TRY(sim.stream_synchronize(s.s));
    }
    alloc.forget_stream(s.s);
  }
  TEST_CASE_FIXTURE(
    sim_transfer_fixture,
    "prefetcher: the next batch is asked for while the current one is still staging")
  {
    sim_pipeline pipe{sim, pool, chunked(64 * kib, 3, 2)};
    gpukit::basic_caching_allocator<sim_runtime> alloc{sim, 0};
    std::size_t const steps = 6;
    std::vector<std::vector<unsigned char>> data(steps);
    for (std::size_t i = 0; i < steps; ++i) {
      data[i].resize(5 * 64 * kib + i * 313);
      fill_pattern(data[i].data(), data[i].size(), static_cast<std::uint32_t>(70 + i));
    }
    std::atomic<std::size_t> asked{0};
    GPUKIT_CUDA_TRY(sim.stall(pipe.h2d_stream()));  // batch 0 cannot finish staging
    {
      gpukit::prefetcher_options po;
      po.depth = 2;
      gpukit::basic_prefetcher<sim_runtime> loader{
        pipe, alloc,
        [&](std::size_t i) {
          asked = i + 1;
          if (i == steps) { return gpukit::host_batch{}; }
          return gpukit::host_batch{data[i].data(), data[i].size()};
        },
        po};
      CHECK(wait_until([&] { return asked.load() == 2; }));  // batch 1 queued behind batch 0
      std::this_thread::sleep_for(std::chrono::milliseconds{20});
      CHECK(asked.load() == 2);  // and no further: depth 2
      CHECK(pipe.stats().transfers == 0);
      GPUKIT_CUDA_TRY(sim.release(pipe.h2d_stream()));
      std::size_t expect = 0;
      while (auto b = loader.next(s.s)) {
        CHECK(b->index == expect);
        std::vector<unsigned char> back(b->bytes);
        pipe.copy_to_host_async(back.data(), b->data, b->bytes, s.s);
        CHECK(first_mismatch(back.data(), back.size(), static_cast<std::uint32_t>(70 + expect)) ==
              back.size());
        loader.release(*b, s.s);
        ++expect;
      }
      CHECK(expect == steps);
      GPUKIT_CUDA_TRY(sim.stream_synchronize(s.s));
    }
    alloc.forget_stream(s.s);
    CHECK(alloc.stats().allocation_count.current == 0);
  }
  TEST_CASE_FIXTURE(sim_transfer_fixture,
                    "prefetcher: a failing copy reaches the consumer after the batches before it")
  {
    sim_pipeline pipe{sim, pool, chunked(64 * kib, 3)};
    gpukit::basic_caching_allocator<sim_runtime> alloc{sim, 0};
    std::vector<unsigned char> data(4 * 64 * kib, 4);
    // Each batch is 4 chunks: the 10th staging copy belongs to batch 1 or 2 (two staging threads
    // may enqueue the chunks around a batch's end in either order), not to batch 0.
    sim.inject_fault(sim_op::memcpy_async, 10, cudaErrorLaunchFailure);
    {
      gpukit::prefetcher_options po;
      po.depth = 2;
      gpukit::basic_prefetcher<sim_runtime> loader{
        pipe, alloc,
        [&](std::size_t) {
          return gpukit::host_batch{data.data(), data.size()};
        },
        po};
      std::size_t handed = 0;
      bool threw         = false;
      while (!threw && handed < 5) {  // the source never ends: only the failure stops the loop
        try {
          auto b = loader.next(s.s);
          REQUIRE(b.has_value());
          CHECK(b->index == handed);
          loader.release(*b, s.s);
          ++handed;
        } catch (gpukit::cuda_error const& e) {
          CHECK(std::string{e.what()}.find("memcpy_async") != std::string::npos);
          threw = true;
        }
      }
      CHECK(threw);
      CHECK(handed >= 1);
      CHECK(handed <= 2);
      CHECK_FALSE(loader.next().has_value());
      GPUKIT_CUDA_TRY(sim.stream_synchronize(s.s));
    }
    alloc.forget_stream(s.s);
    CHECK(alloc.stats().allocation_count.current == 0);
  }
  TEST_CASE_FIXTURE(
    sim_transfer_fixture,
    "prefetcher: an error of the source reaches the consumer after the batches before it")
  {
    sim_pipeline pipe{sim, pool, chunked(64 * kib, 2)};
    gpukit::basic_caching_allocator<sim_runtime> alloc{sim, 0};
    std::vector<unsigned char> data(100 * kib, 2);
    {
      gpukit::basic_prefetcher<sim_runtime> loader{
        pipe, alloc, [&](std::size_t i) {
          if (i == 3) { throw std::runtime_error{"batch 3 is corrupt"}; }
          return gpukit::host_batch{data.data(), data.size()};
        }};
      for (std::size_t i = 0; i < 3; ++i) {
        auto b = loader.next(s.s);
        REQUIRE(b.has_value());
        CHECK(b->index == i);
        loader.release(*b, s.s);
      }
      CHECK_THROWS_WITH_AS((void)loader.next(), "batch 3 is corrupt", std::runtime_error);
      CHECK_FALSE(loader.next().has_value());
      GPUKIT_CUDA_TRY(sim.stream_synchronize(s.s));
    }
    alloc.forget_stream(s.s);
  }
}
