// SPDX-License-Identifier: Apache-2.0
// tests/transfer/transfer_conformance.hpp: the pinned pool, transfer pipeline and prefetcher cases
// that run on every Runtime, so that what passes on the simulated GPU in CI means the same on a
// GPU.
//
// Use: in a doctest TU, after including the runtime,
//
//   GPUKIT_TRANSFER_CONFORMANCE_CASES(gpukit::cuda_runtime::instance(), "cuda_runtime")
//
// defines one TEST_CASE per check below, named "<prefix>: <what>" (support/conformance.hpp).
#pragma once

#include "support/conformance.hpp"
#include "support/holders.hpp"
#include "support/pattern.hpp"
#include "support/sizes.hpp"
#include "support/transfer_fixture.hpp"

#include <gpukit/host/pinned_pool.hpp>
#include <gpukit/memory/caching_allocator.hpp>
#include <gpukit/transfer/prefetcher.hpp>
#include <gpukit/transfer/transfer_pipeline.hpp>

#include <doctest/doctest.h>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <set>
#include <thread>
#include <utility>
#include <vector>

namespace gpukit::test {

/// Reuse, size classes and statistics of the pinned pool, growing as `options` says.
template <class Runtime>
void check_pool_basics(Runtime& rt, pinned_pool_options options = {})
{
  basic_pinned_pool<Runtime> pool{rt, options};
  bool const mapped = options.growth == pinned_growth::map_and_register;
  CHECK(basic_pinned_pool<Runtime>::class_size(1) == 4096);
  CHECK(basic_pinned_pool<Runtime>::class_size(600 * mib) == 640 * mib);  // <= 12.5% lost
  for (std::size_t n : {std::size_t{4097}, std::size_t{100000}, 3 * mib + 1, 600 * mib + 7}) {
    std::size_t const c = basic_pinned_pool<Runtime>::class_size(n);
    CHECK(c >= n);
    CHECK((c - n) * 8 <= n);
  }
  void* a = pool.allocate(100 * kib);
  fill_pattern(a, 100 * kib, 1);
  auto s = pool.stats();
  CHECK(s.num_growths == 1);
  CHECK(s.num_host_allocs == (mapped ? 0 : 1));
  CHECK(s.num_host_registers == (mapped ? 1 : 0));
  CHECK(s.allocated_bytes.current == static_cast<std::int64_t>(pool.class_size(100 * kib)));
  CHECK(s.requested_bytes.current == static_cast<std::int64_t>(100 * kib));
  CHECK(s.allocation_count.current == 1);
  CHECK(pool.owns(a, 100 * kib));
  CHECK_FALSE(pool.owns(&s, 1));
  pool.deallocate(a);
  void* b = pool.allocate(100 * kib - 3);  // same class, no stream used it: the same buffer
  CHECK(b == a);
  s = pool.stats();
  CHECK(s.num_cache_hits == 1);
  CHECK(s.num_growths == 1);
  pool.deallocate(b);
  // Reserved memory is carved: no growth for buffers that fit.
  pool.reserve(4 * mib);
  std::vector<void*> carved;
  for (int i = 0; i < 4; ++i) { carved.push_back(pool.allocate(mib - 100)); }
  s = pool.stats();
  CHECK(s.num_growths == 2);
  CHECK(s.allocation_count.current == 4);
  CHECK(s.reserved_bytes.current ==
        static_cast<std::int64_t>(4 * mib + pool.class_size(100 * kib)));
  for (std::size_t i = 0; i < carved.size(); ++i) {
    fill_pattern(carved[i], mib - 100, static_cast<std::uint32_t>(i));
  }
  for (std::size_t i = 0; i < carved.size(); ++i) {  // no two overlap
    CHECK(first_mismatch(carved[i], mib - 100, static_cast<std::uint32_t>(i)) == mib - 100);
    pool.deallocate(carved[i]);
  }
  s = pool.stats();
  CHECK(s.allocated_bytes.current == 0);
  CHECK(s.allocated_bytes.peak == static_cast<std::int64_t>(4 * mib));
  CHECK(s.cached_bytes.current == s.reserved_bytes.current);
  // RAII handle.
  {
    auto buf = pool.acquire(mib);
    CHECK(buf);
    CHECK(buf.size() == mib);
    CHECK(pool.stats().allocation_count.current == 1);
  }
  CHECK(pool.stats().allocation_count.current == 0);
  CHECK(pool.release_cached() == static_cast<std::size_t>(s.reserved_bytes.current));
  CHECK(pool.stats().reserved_bytes.current == 0);
  // cudaFreeHost only for host_alloc ranges; the pool's mappings are unregistered (and unmapped).
  CHECK(pool.stats().num_host_frees == (mapped ? 0 : 2));
  CHECK(pool.stats().num_host_unregisters == (mapped ? 2 : 0));
}

/// Bad input gets a clear error naming the value, and leaves the pool as it was.
template <class Runtime>
void check_pool_bad_input(Runtime& rt)
{
  basic_pinned_pool<Runtime> pool{rt};
  void* a           = pool.allocate(64 * kib);
  auto const before = pool.stats();
  CHECK_THROWS_WITH_AS((void)pool.allocate(0), doctest::Contains("0 bytes"), gpukit::logic_error);
  CHECK_THROWS_WITH_AS((void)pool.allocate(std::size_t{1} << 60),
                       doctest::Contains("1152921504606846976"), gpukit::bad_alloc);
  int local = 0;
  CHECK_THROWS_WITH_AS(pool.deallocate(&local), doctest::Contains("never handed out"),
                       gpukit::logic_error);
  CHECK_THROWS_AS(pool.deallocate(static_cast<char*>(a) + 16), gpukit::logic_error);
  CHECK_THROWS_AS(pool.record_stream(&local, typename Runtime::stream_type{}), gpukit::logic_error);
  auto const after = pool.stats();
  CHECK(after.allocation_count.current == before.allocation_count.current);
  CHECK(after.num_frees == before.num_frees);
  pool.deallocate(a);
  CHECK_THROWS_WITH_AS(pool.deallocate(a), doctest::Contains("double return"), gpukit::logic_error);
  CHECK(pool.stats().num_frees == before.num_frees + 1);
  CHECK_THROWS_AS(pool.reserve(0), gpukit::logic_error);
  CHECK_THROWS_AS(pool.add_host_memory(nullptr, 4096), gpukit::logic_error);
  // The CCCL resource interface: alignments up to 4 KiB, and every carved buffer is aligned.
  CHECK_THROWS_WITH_AS((void)pool.allocate(100, 8192), doctest::Contains("alignment 8192"),
                       gpukit::logic_error);
  pool.reserve(64 * kib);
  void* x = pool.allocate(5000, 4096);
  void* y = pool.allocate(5000, 4096);
  CHECK(reinterpret_cast<std::uintptr_t>(x) % 4096 == 0);
  CHECK(reinterpret_cast<std::uintptr_t>(y) % 4096 == 0);
  pool.deallocate(x, 5000, 4096);
  pool.deallocate(y, 5000, 4096);
}

/// The limit refuses growth with bad_alloc naming the request and the limit; cached buffers
/// still serve.
template <class Runtime>
void check_pool_limit(Runtime& rt)
{
  pinned_pool_options o;
  o.limit_bytes = 2 * mib;
  basic_pinned_pool<Runtime> pool{rt, o};
  void* a = pool.allocate(mib);
  void* b = pool.allocate(mib);
  CHECK_THROWS_WITH_AS((void)pool.allocate(4096), doctest::Contains("limit of 2097152"),
                       gpukit::bad_alloc);
  CHECK(pool.stats().num_limit_refusals == 1);
  CHECK_THROWS_AS(pool.reserve(mib), gpukit::bad_alloc);
  pool.deallocate(a);
  void* c = pool.allocate(mib);  // cached: fits under the limit
  CHECK(c == a);
  pool.deallocate(b);
  pool.deallocate(c);
  CHECK(pool.stats().reserved_bytes.current == static_cast<std::int64_t>(2 * mib));
  pool.set_limit(0);
  void* d = pool.allocate(4 * mib);
  pool.deallocate(d);
}

/// A buffer returned with a stream is handed out again once that stream's work is done.
template <class Runtime>
void check_pool_stream_return(Runtime& rt)
{
  transfer_fixture<Runtime> f{rt};
  device_buffer<Runtime> dev{rt, mib};
  void* a = f.pool.allocate(mib);
  fill_pattern(a, mib, 7);
  GPUKIT_CUDA_TRY(rt.memcpy_async(dev.p, a, mib, memcpy_kind::host_to_device, f.s));
  f.pool.deallocate_async(a, f.s);
  CHECK(f.pool.stats().num_events_recorded == 1);
  GPUKIT_CUDA_TRY(rt.stream_synchronize(f.s));
  void* b = f.pool.allocate(mib);
  CHECK(b == a);
  std::memset(b, 0, mib);
  GPUKIT_CUDA_TRY(rt.memcpy_async(b, dev.p, mib, memcpy_kind::device_to_host, f.s));
  GPUKIT_CUDA_TRY(rt.stream_synchronize(f.s));
  CHECK(first_mismatch(b, mib, 7) == mib);
  f.pool.deallocate(b);
}

/// Host to device and back through the pipeline, for sizes around the chunk size, pageable and
/// pinned, every byte checked.
template <class Runtime>
void check_pipeline_roundtrip(Runtime& rt, int threads)
{
  transfer_fixture<Runtime> f{rt};
  basic_transfer_pipeline<Runtime> pipe{rt, f.pool, chunked(64 * kib, threads, 3)};
  std::uint32_t seed = 100;
  for (std::size_t bytes : {std::size_t{1}, std::size_t{4095}, 64 * kib, 64 * kib + 1,
                            5 * 64 * kib - 17, 3 * mib + 12345}) {
    for (bool pinned : {false, true}) {
      CAPTURE(bytes);
      CAPTURE(pinned);
      ++seed;
      device_buffer<Runtime> dev{rt, bytes + 64};
      std::vector<unsigned char> pageable_src(bytes), pageable_dst(bytes + 64, 0xEE);
      void* src = pageable_src.data();
      void* dst = pageable_dst.data();
      pinned_buffer<Runtime> psrc, pdst;
      if (pinned) {
        psrc = f.pool.acquire(bytes);
        pdst = f.pool.acquire(bytes);
        src  = psrc.data();
        dst  = pdst.data();
      }
      fill_pattern(src, bytes, seed);
      auto const before = pipe.stats();
      pipe.copy_to_device_async(dev.p, src, bytes, f.s);
      if (!pinned) { std::memset(src, 0, bytes); }  // pageable: reusable once the call returns
      pipe.copy_to_host_async(dst, dev.p, bytes, f.s);
      if (pinned) { GPUKIT_CUDA_TRY(rt.stream_synchronize(f.s)); }
      CHECK(first_mismatch(dst, bytes, seed) == bytes);
      if (!pinned) { CHECK(pageable_dst[bytes] == 0xEE); }  // nothing written past the end
      auto const after = pipe.stats();
      if (pinned) {
        CHECK(after.direct_bytes - before.direct_bytes == 2 * bytes);
      } else {
        CHECK(after.staged_bytes - before.staged_bytes == 2 * bytes);
      }
      if (pinned) {
        psrc.record_stream(f.s);
        pdst.record_stream(f.s);
      }
    }
  }
  CHECK(pipe.stats().staging_chunks <= 6);
  GPUKIT_CUDA_TRY(rt.stream_synchronize(f.s));
}

/// A host-to-device and a device-to-host transfer at once, from two threads, several times.
template <class Runtime>
void check_pipeline_bidirectional(Runtime& rt)
{
  transfer_fixture<Runtime> f{rt};
  basic_transfer_pipeline<Runtime> pipe{rt, f.pool, chunked(256 * kib, 4)};
  stream_holder<Runtime> up{rt}, down{rt};
  std::size_t const bytes = 4 * mib + 777;
  device_buffer<Runtime> dev_in{rt, bytes}, dev_out{rt, bytes};
  std::vector<unsigned char> in(bytes), out(bytes);
  fill_pattern(in.data(), bytes, 1);
  pipe.copy_to_device_async(dev_out.p, in.data(), bytes, down.s);  // what D2H will read
  for (std::uint32_t round = 0; round < 4; ++round) {
    fill_pattern(in.data(), bytes, 10 + round);
    std::thread t{[&] { pipe.copy_to_device_async(dev_in.p, in.data(), bytes, up.s); }};
    pipe.copy_to_host_async(out.data(), dev_out.p, bytes, down.s);
    t.join();
    CHECK(first_mismatch(out.data(), bytes, round == 0 ? 1 : 10 + round - 1) == bytes);
    // What went up this round comes down next round.
    GPUKIT_CUDA_TRY(rt.stream_synchronize(up.s));
    GPUKIT_CUDA_TRY(
      rt.memcpy_async(dev_out.p, dev_in.p, bytes, memcpy_kind::device_to_device, down.s));
    GPUKIT_CUDA_TRY(rt.stream_synchronize(down.s));  // before the next round overwrites dev_in
  }
  CHECK(pipe.stats().h2d_bytes == 5 * bytes);
  CHECK(pipe.stats().d2h_bytes == 4 * bytes);
  GPUKIT_CUDA_TRY(rt.stream_synchronize(down.s));
}

/// Bad input: nothing is copied, a clear error.
template <class Runtime>
void check_pipeline_bad_input(Runtime& rt)
{
  transfer_fixture<Runtime> f{rt};
  basic_transfer_pipeline<Runtime> pipe{rt, f.pool, chunked(64 * kib, 2)};
  device_buffer<Runtime> dev{rt, mib};
  std::vector<unsigned char> host(mib);
  CHECK_THROWS_WITH_AS(pipe.copy_to_device_async(dev.p, host.data(), 0, f.s),
                       doctest::Contains("0 bytes"), gpukit::logic_error);
  CHECK_THROWS_WITH_AS(pipe.copy_to_device_async(nullptr, host.data(), 16, f.s),
                       doctest::Contains("null pointer"), gpukit::logic_error);
  CHECK_THROWS_WITH_AS(pipe.copy_to_host_async(nullptr, dev.p, 16, f.s),
                       doctest::Contains("null pointer"), gpukit::logic_error);
  // Every refusal names both pointers, by role, and the size.
  CHECK_THROWS_WITH_AS(pipe.copy_to_host_async(nullptr, dev.p, 16, f.s),
                       doctest::Contains("(host "), gpukit::logic_error);
  CHECK_THROWS_WITH_AS(pipe.copy_to_host_async(nullptr, dev.p, 16, f.s),
                       doctest::Contains(", device "), gpukit::logic_error);
  CHECK_THROWS_WITH_AS(pipe.copy_to_device_async(dev.p, host.data(), 0, f.s),
                       doctest::Contains(", 0 bytes)"), gpukit::logic_error);
  CHECK_THROWS_WITH_AS(
    pipe.copy_to_device_async(host.data() + 100, host.data(), 1000, host_memory::pageable, f.s),
    doctest::Contains("overlap"), gpukit::logic_error);
  CHECK_THROWS_WITH_AS(pipe.copy_to_device_async(
                         dev.p, reinterpret_cast<void const*>(~std::uintptr_t{0} - 8), 64, f.s),
                       doctest::Contains("wrap"), gpukit::logic_error);
  CHECK(pipe.stats().transfers == 0);
  CHECK(pipe.stats().chunks == 0);
}

/// Completions of submitted transfers, counted, with the first error; waited for with a timeout.
struct completions {
  std::mutex m;
  std::condition_variable cv;
  std::size_t count{0};
  std::exception_ptr first_error;
  std::thread::id last_thread;

  /// A completion for submit_to_*.
  std::function<void(std::exception_ptr)> one()
  {
    return [this](std::exception_ptr e) {
      {
        std::lock_guard<std::mutex> lock{m};
        ++count;
        if (e && !first_error) { first_error = std::move(e); }
        last_thread = std::this_thread::get_id();
        cv.notify_all();  // under the lock: the waiter may destroy this once it is released
      }
    };
  }
  /// Whether `n` completions have run within 10 s.
  bool wait_for(std::size_t n)
  {
    std::unique_lock<std::mutex> lock{m};
    return cv.wait_for(lock, std::chrono::seconds{10}, [&] { return count >= n; });
  }
  std::size_t done()
  {
    std::lock_guard<std::mutex> lock{m};
    return count;
  }
};

/// Submitted transfers: several queued at once from one thread, both directions, sizes that are
/// not multiples of the chunk; each completion means its bytes have arrived (device to host: in
/// the destination, without waiting for the stream).
template <class Runtime>
void check_submitted_transfers(Runtime& rt)
{
  transfer_fixture<Runtime> f{rt};
  basic_transfer_pipeline<Runtime> pipe{rt, f.pool, chunked(128 * kib, 4)};
  std::size_t const n = 8;
  std::vector<std::vector<unsigned char>> src(n), dst(n);
  std::vector<std::unique_ptr<device_buffer<Runtime>>> dev;
  for (std::size_t i = 0; i < n; ++i) {
    std::size_t const bytes = 700 * kib + i * 12289;
    src[i].resize(bytes);
    dst[i].assign(bytes, 0);
    fill_pattern(src[i].data(), bytes, static_cast<std::uint32_t>(300 + i));
    dev.push_back(std::make_unique<device_buffer<Runtime>>(rt, bytes));
  }
  completions up, down;
  for (std::size_t i = 0; i < n; ++i) {
    pipe.submit_to_device(dev[i]->p, src[i].data(), src[i].size(), host_memory::detect, f.s,
                          up.one());
  }
  REQUIRE(up.wait_for(n));
  CHECK_FALSE(up.first_error);
  for (std::size_t i = 0; i < n; ++i) {
    pipe.submit_to_host(dst[i].data(), dev[i]->p, dst[i].size(), host_memory::detect, f.s,
                        down.one());
  }
  REQUIRE(down.wait_for(n));
  CHECK_FALSE(down.first_error);
  for (std::size_t i = 0; i < n; ++i) {  // complete when the completion ran: no stream wait
    CHECK(first_mismatch(dst[i].data(), dst[i].size(), static_cast<std::uint32_t>(300 + i)) ==
          dst[i].size());
  }
  CHECK(down.done() == n);
  // Pinned memory is copied on the stream at once, and the completion runs on the calling thread.
  auto pinned = f.pool.acquire(64 * kib);
  fill_pattern(pinned.data(), 64 * kib, 9);
  completions direct;
  pipe.submit_to_device(dev[0]->p, pinned.data(), 64 * kib, host_memory::detect, f.s, direct.one());
  CHECK(direct.done() == 1);
  CHECK((direct.last_thread == std::this_thread::get_id()));
  GPUKIT_CUDA_TRY(rt.stream_synchronize(f.s));
  auto const st = pipe.stats();
  CHECK(st.transfers == 2 * n + 1);
  CHECK(st.direct_bytes == 64 * kib);
  CHECK(st.h2d_bytes + st.d2h_bytes == st.staged_bytes + st.direct_bytes);
}

/// The prefetcher hands batches out in order, each with its bytes, ready after its event.
template <class Runtime>
void check_prefetcher_order(Runtime& rt, int device = 0)
{
  transfer_fixture<Runtime> f{rt};
  basic_transfer_pipeline<Runtime> pipe{rt, f.pool, chunked(128 * kib, 3)};
  basic_caching_allocator<Runtime> alloc{rt, device};
  std::size_t const steps = 12;
  std::vector<std::vector<unsigned char>> data(steps);
  for (std::size_t i = 0; i < steps; ++i) {
    data[i].resize(300 * kib + i * 4099);
    fill_pattern(data[i].data(), data[i].size(), static_cast<std::uint32_t>(1000 + i));
  }
  std::vector<unsigned char> back;
  {
    prefetcher_options po;
    po.depth = 2;
    basic_prefetcher<Runtime> loader{pipe, alloc,
                                     [&](std::size_t i) {
                                       if (i == steps) { return host_batch{}; }
                                       return host_batch{data[i].data(), data[i].size()};
                                     },
                                     po};
    std::size_t expect = 0;
    while (auto b = loader.next(f.s)) {
      CHECK(b->index == expect);
      REQUIRE(b->bytes == data[expect].size());
      back.assign(b->bytes, 0);
      pipe.copy_to_host_async(back.data(), b->data, b->bytes, host_memory::pageable, f.s);
      CHECK(first_mismatch(back.data(), back.size(), static_cast<std::uint32_t>(1000 + expect)) ==
            back.size());
      loader.release(*b, f.s);
      ++expect;
    }
    CHECK(expect == steps);
    CHECK(loader.handed_out() == steps);
    CHECK_FALSE(loader.next().has_value());  // stays at the end
    GPUKIT_CUDA_TRY(rt.stream_synchronize(f.s));
  }
  alloc.forget_stream(f.s);
  CHECK(alloc.stats().allocation_count.current == 0);
}

/// check_pool_basics with a pool that grows with host_alloc instead of mapping and registering.
template <class Runtime>
void check_pool_basics_host_alloc(Runtime& rt)
{
  pinned_pool_options o;
  o.growth = pinned_growth::host_alloc;
  check_pool_basics(rt, o);
}

template <class Runtime>
void check_pipeline_roundtrip_calling_thread(Runtime& rt)
{
  check_pipeline_roundtrip(rt, 1);
}

template <class Runtime>
void check_pipeline_roundtrip_staging_threads(Runtime& rt)
{
  check_pipeline_roundtrip(rt, 4);
}

}  // namespace gpukit::test

/// One TEST_CASE per transfer conformance check, on the runtime `runtime_expr` yields.
#define GPUKIT_TRANSFER_CONFORMANCE_CASES(runtime_expr, name_prefix)                               \
  GPUKIT_TEST_CONFORMANCE_CASE(runtime_expr, name_prefix,                                          \
                               "pinned_pool: reuse and size classes and statistics",               \
                               check_pool_basics)                                                  \
  GPUKIT_TEST_CONFORMANCE_CASE(runtime_expr, name_prefix,                                          \
                               "pinned_pool: the same with host_alloc growth",                     \
                               check_pool_basics_host_alloc)                                       \
  GPUKIT_TEST_CONFORMANCE_CASE(runtime_expr, name_prefix,                                          \
                               "pinned_pool: bad input gets a clear error and changes nothing",    \
                               check_pool_bad_input)                                               \
  GPUKIT_TEST_CONFORMANCE_CASE(runtime_expr, name_prefix, "pinned_pool: the limit refuses growth", \
                               check_pool_limit)                                                   \
  GPUKIT_TEST_CONFORMANCE_CASE(                                                                    \
    runtime_expr, name_prefix,                                                                     \
    "pinned_pool: a buffer returned with a stream comes back after its work",                      \
    check_pool_stream_return)                                                                      \
  GPUKIT_TEST_CONFORMANCE_CASE(runtime_expr, name_prefix,                                          \
                               "transfer: round trips on the calling thread",                      \
                               check_pipeline_roundtrip_calling_thread)                            \
  GPUKIT_TEST_CONFORMANCE_CASE(runtime_expr, name_prefix,                                          \
                               "transfer: round trips with staging threads",                       \
                               check_pipeline_roundtrip_staging_threads)                           \
  GPUKIT_TEST_CONFORMANCE_CASE(runtime_expr, name_prefix, "transfer: both directions at once",     \
                               check_pipeline_bidirectional)                                       \
  GPUKIT_TEST_CONFORMANCE_CASE(runtime_expr, name_prefix,                                          \
                               "transfer: bad input is refused before anything is copied",         \
                               check_pipeline_bad_input)                                           \
  GPUKIT_TEST_CONFORMANCE_CASE(runtime_expr, name_prefix,                                          \
                               "transfer: submitted transfers complete with their bytes",          \
                               check_submitted_transfers)                                          \
  GPUKIT_TEST_CONFORMANCE_CASE(runtime_expr, name_prefix,                                          \
                               "prefetcher: batches arrive in order with their bytes",             \
                               check_prefetcher_order)
