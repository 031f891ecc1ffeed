// SPDX-License-Identifier: Apache-2.0
// The fault sweep: for each segment source, a fixed random workload of the caching allocator
// (allocate, free across threads and streams, record_stream, migrate, out-of-memory recovery,
// release, trim, graph capture, forget_stream, the destructor) is run once to count its runtime
// calls, then once per call with that call made to fail (each call index of each operation the
// workload makes). After each run: nothing crashed, no error but the runtime's own escaped, the
// invariants hold, the allocator still serves, and once it is destroyed the simulated device is
// back to zero bytes in use. Prints "fault points tried: N, survived: N".
//
// GPUKIT_FAULT_SWEEP_STRIDE=k tries every k-th call index only (default 1: all of them).
#include "support/caching_allocator.hpp"

#include <gpukit/memory/caching_allocator.hpp>
#include <gpukit/memory/detail/allocator_invariants.hpp>
#include <gpukit/runtime/sim_runtime.hpp>

#include <doctest/doctest.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>
#include <thread>
#include <vector>

using namespace gpukit::test;  // sim_allocator, sim_stream, one_device, mib, gib
using gpukit::sim_op;
using gpukit::sim_runtime;

namespace {

struct live_block {
  void* p;
  std::size_t bytes;
  sim_stream stream;
};

/// The outcome of one run.
struct run_result {
  std::string failure;  // empty: survived
  int runtime_errors{0};
};

class sweep_run {
 public:
  sweep_run(gpukit::segment_source source, std::optional<std::pair<sim_op, std::uint64_t>> fault,
            cudaError_t error)
      : source_{source}, fault_{fault}, error_{error}
  {}

  run_result run()
  {
    run_result r;
    sim_runtime sim{gpukit::sim_config{}.with_devices(1, 256 * mib)};
    sim_stream s1{}, s2{};
    GPUKIT_CUDA_TRY(sim.stream_create(s1));
    GPUKIT_CUDA_TRY(sim.stream_create(s2));
    streams_ = {s1, s2};
    {
      std::optional<sim_allocator> alloc;
      gpukit::caching_allocator_options o;
      o.source = source_;
      alloc.emplace(sim, 0, o);
      sim.reset_counters();
      if (fault_) { sim.inject_fault(fault_->first, fault_->second, error_); }
      workload(sim, *alloc, r);
      std::string const inv = gpukit::detail::check_invariants(*alloc);
      if (!inv.empty()) { r.failure = "invariants after the workload: " + inv; }
      calls_ = sim.total_calls();
      for (int i = 0; i < static_cast<int>(sim_op::count_); ++i) {
        per_op_[static_cast<std::size_t>(i)] = sim.calls(static_cast<sim_op>(i));
      }
      if (!fault_) {
        // The baseline also counts the destructor's calls: they are fault points too.
        alloc.reset();
        for (int i = 0; i < static_cast<int>(sim_op::count_); ++i) {
          per_op_[static_cast<std::size_t>(i)] = sim.calls(static_cast<sim_op>(i));
        }
      } else {
        alloc.reset();  // the destructor, with the fault still pending if it was not reached
      }
    }
    sim.clear_faults();
    (void)sim.device_synchronize();
    if (r.failure.empty() && sim.used_bytes(0) != 0) {
      r.failure = "leak: " + std::to_string(sim.used_bytes(0)) + " bytes in use after teardown";
    }
    (void)sim.stream_destroy(s1);
    (void)sim.stream_destroy(s2);
    return r;
  }

  [[nodiscard]] std::uint64_t calls(sim_op op) const
  {
    return per_op_[static_cast<std::size_t>(op)];
  }

 private:
  // One step: runtime errors (cuda_error, out of memory) are expected; anything else is a bug.
  template <class F>
  void step(run_result& r, char const* what, F&& f)
  {
    try {
      f();
    } catch (gpukit::cuda_error const&) {
      ++r.runtime_errors;
    } catch (gpukit::bad_alloc const&) {
      ++r.runtime_errors;
    } catch (std::exception const& e) {
      if (r.failure.empty()) { r.failure = std::string{what} + ": " + e.what(); }
    }
  }

  void alloc_step(run_result& r, sim_allocator& a, std::size_t bytes, sim_stream s)
  {
    step(r, "allocate", [&] {
      void* p = a.allocate_async(bytes, s);
      live_.push_back({p, bytes, s});
    });
  }

  void free_step(run_result& r, sim_allocator& a, std::size_t i, sim_stream s)
  {
    if (i >= live_.size()) { return; }
    live_block const b = live_[i];
    step(r, "free", [&] {
      a.deallocate_async(b.p, b.bytes, s);
      live_.erase(live_.begin() + static_cast<std::ptrdiff_t>(i));
    });
  }

  std::uint64_t next()
  {
    rng_ ^= rng_ << 13;
    rng_ ^= rng_ >> 7;
    rng_ ^= rng_ << 17;
    return rng_;
  }

  void workload(sim_runtime& sim, sim_allocator& a, run_result& r)
  {
    std::size_t const sizes[] = {512, 4096, 200 * 1024, 3 * mib, 12 * mib, 40 * mib};
    // Random allocations and frees over two streams, some frees on the other stream.
    for (int i = 0; i < 24; ++i) {
      sim_stream const s = streams_[next() % 2];
      if (live_.size() < 3 || next() % 3 != 0) {
        alloc_step(r, a, sizes[next() % std::size(sizes)], s);
      } else {
        free_step(r, a, static_cast<std::size_t>(next() % live_.size()), streams_[next() % 2]);
      }
    }
    // record_stream, then the free waits for the other stream (pending); a cross-thread free.
    if (!live_.empty()) {
      step(r, "record_stream", [&] { a.record_stream(live_.front().p, streams_[1]); });
      free_step(r, a, 0, streams_[0]);
    }
    if (!live_.empty()) {
      std::thread t{[&] { free_step(r, a, live_.size() - 1, streams_[1]); }};
      t.join();
    }
    // Cross-stream reuse (migration), then out of memory and its recovery.
    alloc_step(r, a, 40 * mib, streams_[1]);
    for (int i = 0; i < 6; ++i) { alloc_step(r, a, 60 * mib, streams_[i % 2]); }
    while (live_.size() > 4) { free_step(r, a, live_.size() - 1, streams_[0]); }
    step(r, "trim", [&] { (void)a.trim(8 * mib); });
    step(r, "release", [&] { (void)a.release(); });
    alloc_step(r, a, 100 * mib, streams_[0]);
    capture(sim, a, r);
    while (!live_.empty()) { free_step(r, a, 0, live_.front().stream); }
    step(r, "forget_stream", [&] { a.forget_stream(streams_[1]); });
    step(r, "release", [&] { (void)a.release(); });
    // Frees that failed left their block allocated: freed now (the fault is single-shot).
    for (int attempt = 0; attempt < 2; ++attempt) {
      for (std::size_t i = live_.size(); i-- > 0;) { free_step(r, a, i, live_[i].stream); }
    }
    // The allocator still serves (a second try once the fault, if it lands here, is used up).
    // A fault not reached yet stays pending for the destructor.
    for (int attempt = 0; attempt < 2; ++attempt) {
      std::uint64_t const pending = sim.pending_faults();
      try {
        void* p = a.allocate_async(5 * mib, streams_[1]);
        a.deallocate_async(p, 5 * mib, streams_[1]);
        break;
      } catch (std::exception const& e) {
        if (attempt == 1 || sim.pending_faults() == pending) {
          if (r.failure.empty()) { r.failure = std::string{"no longer serves: "} + e.what(); }
          break;
        }
      }
    }
  }

  void capture(sim_runtime& sim, sim_allocator& a, run_result& r)
  {
    sim_stream const s = streams_[0];
    if (sim.begin_capture(s) != cudaSuccess) { return; }
    std::optional<sim_allocator::capture_id> id;
    step(r, "begin_capture", [&] { id = a.begin_capture(s); });
    if (id) {
      std::size_t const before = live_.size();
      alloc_step(r, a, 2 * mib, s);
      alloc_step(r, a, 4096, s);
      step(r, "release during capture", [&] { (void)a.release(); });
      while (live_.size() > before) { free_step(r, a, live_.size() - 1, s); }
      step(r, "end_capture", [&] { a.end_capture(s); });
    }
    (void)sim.end_capture(s);
    if (id) {
      step(r, "release_capture_pool", [&] { a.release_capture_pool(*id); });
    }
  }

  gpukit::segment_source source_;
  std::optional<std::pair<sim_op, std::uint64_t>> fault_;
  cudaError_t error_;
  std::vector<sim_stream> streams_;
  std::vector<live_block> live_;
  std::uint64_t rng_{0x9e3779b97f4a7c15ull};
  std::uint64_t calls_{0};
  std::uint64_t per_op_[static_cast<std::size_t>(sim_op::count_)]{};
};

/// The errors a fault of `op` reports: out of memory for the calls that take memory, else an
/// unknown error; the calls that name a stream also get an invalid handle (as if the stream had
/// been destroyed).
std::vector<cudaError_t> errors_for(sim_op op)
{
  switch (op) {
    case sim_op::malloc:
    case sim_op::vm_create:
    case sim_op::vm_reserve: return {cudaErrorMemoryAllocation};
    case sim_op::malloc_async: return {cudaErrorMemoryAllocation, cudaErrorInvalidResourceHandle};
    case sim_op::stream_get_device:
    case sim_op::stream_query:
    case sim_op::stream_synchronize:
    case sim_op::event_record:
    case sim_op::free_async: return {cudaErrorUnknown, cudaErrorInvalidResourceHandle};
    default: return {cudaErrorUnknown};
  }
}

}  // namespace

TEST_SUITE("fault_sweep")
{
  TEST_CASE("every runtime call of a random workload fails once and the allocator survives")
  {
    long const stride = [] {
      char const* v = std::getenv("GPUKIT_FAULT_SWEEP_STRIDE");
      return v != nullptr && std::atol(v) > 0 ? std::atol(v) : 1L;
    }();
    long tried = 0, survived = 0;
    for (auto source : {gpukit::segment_source::stream_ordered, gpukit::segment_source::synchronous,
                        gpukit::segment_source::growable}) {
      CAPTURE(static_cast<int>(source));
      sweep_run baseline{source, std::nullopt, cudaSuccess};
      run_result const b = baseline.run();
      REQUIRE(b.failure == "");
      if (std::getenv("GPUKIT_FAULT_SWEEP_VERBOSE") != nullptr) {
        std::printf("source %d: baseline runtime errors %d;", static_cast<int>(source),
                    b.runtime_errors);
        for (int i = 0; i < static_cast<int>(sim_op::count_); ++i) {
          auto const op = static_cast<sim_op>(i);
          if (baseline.calls(op) != 0) {
            std::printf(" %s %llu", gpukit::to_string(op),
                        static_cast<unsigned long long>(baseline.calls(op)));
          }
        }
        std::printf("\n");
      }
      for (int i = 0; i < static_cast<int>(sim_op::count_); ++i) {
        auto const op = static_cast<sim_op>(i);
        for (cudaError_t const error : errors_for(op)) {
          for (std::uint64_t nth = 1; nth <= baseline.calls(op);
               nth += static_cast<std::uint64_t>(stride)) {
            sweep_run one{source, std::make_pair(op, nth), error};
            run_result const r = one.run();
            ++tried;
            if (r.failure.empty()) {
              ++survived;
            } else {
              CAPTURE(gpukit::to_string(op));
              CAPTURE(nth);
              CAPTURE(static_cast<int>(error));
              CHECK(r.failure == "");
            }
          }
        }
      }
    }
    std::printf("fault points tried: %ld, survived: %ld\n", tried, survived);
    CHECK(tried > 0);
    CHECK(survived == tried);
  }
}
