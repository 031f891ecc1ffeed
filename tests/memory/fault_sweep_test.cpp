// SPDX-License-Identifier: Apache-2.0
// The fault sweep: for each segment source (stream-ordered, synchronous, growable, growable with
// shared pages and a peer device granted access, debug mode's quarantine, guard pages), a fixed
// random workload of the caching allocator runs once to count its
// runtime calls, phase by phase, then once per call with that call made to fail (every call index
// of every operation the workload makes, with each error the call can return). The workload's
// phases: allocate; free with other-stream uses (record_stream, pending frees, frees on another
// stream and from another thread); growth and out-of-memory recovery; release and trim; graph
// capture (one the allocator is told about, with a side stream forked into it that allocates
// and is recorded on a block, one begun on the stream directly, a release during each); free;
// reclaim; teardown (the destructor). The allocator lives on device 1 while the calling thread's
// device is 0, so every device query and switch is a fault point too.
//
// After each run: nothing crashed, no error but the runtime's own escaped, every free that failed
// succeeds when tried again (no block is stranded), the invariants hold, and the reclaim phase
// gives everything back (release: nothing reserved and nothing held on the device) and then
// allocates the device's whole capacity; once the allocator is destroyed the simulated device is
// back to zero bytes in use, and no descriptor the run opened is left open. Prints, per phase, the
// fault points tried and survived, and the time.
//
// GPUKIT_FAULT_SWEEP_STRIDE=k tries every k-th call index only (default 1: all of them);
// GPUKIT_FAULT_SWEEP_STRIDE=k:o every k-th from the o-th on, so that two runs, k:0 and k:(k/2),
// share a sweep of stride k/2 between them (CI: the plain build and the sanitizer build).
#include "support/caching_allocator.hpp"

#include <gpukit/memory/caching_allocator.hpp>
#include <gpukit/memory/detail/allocator_invariants.hpp>
#include <gpukit/runtime/sim_runtime.hpp>

#include <doctest/doctest.h>

#include <dirent.h>

#include <array>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <optional>
#include <string>
#include <thread>
#include <vector>

using namespace gpukit::test;  // sim_allocator, sim_stream, mib, gib
using gpukit::sim_op;
using gpukit::sim_runtime;

namespace {

constexpr int device                = 1;  // the allocator's; the calling thread's device is 0
constexpr std::size_t capacity      = 256 * mib;
constexpr std::size_t op_count      = static_cast<std::size_t>(sim_op::count_);
using op_counts                     = std::array<std::uint64_t, op_count>;
constexpr char const* phase_names[] = {
  "allocate",
  "free with other-stream uses",
  "growth and out-of-memory",
  "release and trim",
  "capture",
  "free",
  "reclaim",
  "teardown",
};
constexpr std::size_t phase_count = std::size(phase_names);

/// A segment source, or a debug mode over one.
struct configuration {
  char const* name;
  gpukit::caching_allocator_options options;
  std::size_t reclaim_bytes;  // what the reclaim phase allocates at once once all is given back
};

std::vector<configuration> configurations()
{
  auto with = [](gpukit::segment_source source) {
    gpukit::caching_allocator_options o;
    o.source        = source;
    o.debug.enabled = false;
    return o;
  };
  std::vector<configuration> c;
  c.push_back({"stream_ordered", with(gpukit::segment_source::stream_ordered), capacity});
  c.push_back({"synchronous", with(gpukit::segment_source::synchronous), capacity});
  c.push_back({"growable", with(gpukit::segment_source::growable), capacity});
  // Every growable block exported as pages (share_pages), device 0 granted access to every page.
  gpukit::caching_allocator_options shared = with(gpukit::segment_source::growable);
  shared.growable_shareable                = true;
  c.push_back({"growable shared", shared, capacity});
  gpukit::caching_allocator_options debug = with(gpukit::segment_source::synchronous);
  debug.debug.enabled                     = true;
  debug.debug.quarantine_bytes            = 8 * mib;
  c.push_back({"debug quarantine", debug, capacity});
  gpukit::caching_allocator_options guard = with(gpukit::segment_source::growable);
  guard.debug.enabled                     = true;
  guard.debug.guard_pages                 = true;
  // A block between guard pages: the whole device less a page on either side.
  c.push_back({"guard pages", guard, capacity - 16 * mib});
  return c;
}

struct live_block {
  void* p;
  std::size_t bytes;
  sim_stream stream;
};

/// Descriptors this process has open.
int open_descriptors()
{
  int n  = 0;
  DIR* d = ::opendir("/proc/self/fd");
  if (d == nullptr) { return -1; }
  while (dirent const* e = ::readdir(d)) { n += e->d_name[0] != '.' ? 1 : 0; }
  ::closedir(d);
  return n;
}

/// The outcome of one run.
struct run_result {
  std::string failure;  // empty: survived
  int runtime_errors{0};
};

class sweep_run {
 public:
  sweep_run(configuration const& config, std::optional<std::pair<sim_op, std::uint64_t>> fault,
            cudaError_t error)
      : config_{config}, fault_{fault}, error_{error}
  {}

  run_result run()
  {
    run_result r;
    int const descriptors = open_descriptors();
    sim_runtime sim{devices(2, capacity)};
    sim_ = &sim;
    sim_stream s1{}, s2{}, side{};
    GPUKIT_CUDA_TRY(sim.set_device(device));
    GPUKIT_CUDA_TRY(sim.stream_create(s1));
    GPUKIT_CUDA_TRY(sim.stream_create(s2));
    GPUKIT_CUDA_TRY(sim.stream_create(side));
    GPUKIT_CUDA_TRY(sim.event_create(fork_));
    GPUKIT_CUDA_TRY(sim.event_create(join_));
    GPUKIT_CUDA_TRY(sim.set_device(0));
    streams_ = {s1, s2};
    side_    = side;
    {
      std::optional<sim_allocator> alloc;
      alloc.emplace(sim, device, config_.options);
      sim.reset_counters();
      if (fault_) { sim.inject_fault(fault_->first, fault_->second, error_); }
      workload(*alloc, r);
      phase(phase_count - 1);  // teardown
      alloc.reset();           // with the fault still pending if it was not reached
      phase_end_ = counts();
    }
    sim.clear_faults();
    (void)sim.set_device(device);
    (void)sim.device_synchronize();
    if (r.failure.empty() && sim.used_bytes(device) != 0) {
      r.failure =
        "leak: " + std::to_string(sim.used_bytes(device)) + " bytes in use after teardown";
    }
    (void)sim.stream_destroy(s1);
    (void)sim.stream_destroy(s2);
    (void)sim.stream_destroy(side);
    (void)sim.event_destroy(fork_);
    (void)sim.event_destroy(join_);
    sim_ = nullptr;
    if (r.failure.empty() && open_descriptors() != descriptors) {
      r.failure = "leak: " + std::to_string(open_descriptors() - descriptors) +
                  " descriptor(s) left open after teardown";
    }
    return r;
  }

  /// The calls of `op` that phase `p` makes: (first, last], counted from the workload's start.
  [[nodiscard]] std::pair<std::uint64_t, std::uint64_t> calls(sim_op op, std::size_t p) const
  {
    auto const i = static_cast<std::size_t>(op);
    return {phase_start_[p][i], p + 1 < phase_count ? phase_start_[p + 1][i] : phase_end_[i]};
  }

 private:
  op_counts counts() const
  {
    op_counts c{};
    for (std::size_t i = 0; i < op_count; ++i) { c[i] = sim_->calls(static_cast<sim_op>(i)); }
    return c;
  }

  void phase(std::size_t p)
  {
    op_counts const now = counts();
    for (std::size_t q = p; q < phase_count; ++q) { phase_start_[q] = now; }
  }

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
    std::size_t const before = live_.size();
    step(r, "allocate", [&] {
      void* p = a.allocate_async(bytes, s);
      live_.push_back({p, bytes, s});
    });
    if (a.options().growable_shareable && live_.size() > before) {
      void* const p = live_.back().p;
      step(r, "share_pages", [&] {
        if (a.extent(p).growable) { (void)a.share_pages(p); }  // capture pools' are not
      });
    }
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

  void workload(sim_allocator& a, run_result& r)
  {
    std::size_t const sizes[] = {512, 4096, 200 * 1024, 3 * mib, 12 * mib, 40 * mib};
    phase(0);  // allocate: random allocations and frees over two streams
    if (a.options().growable_shareable) {
      step(r, "grant_access", [&] { a.grant_access(0); });
    }
    for (int i = 0; i < 24; ++i) {
      sim_stream const s = streams_[next() % 2];
      if (live_.size() < 3 || next() % 3 != 0) {
        alloc_step(r, a, sizes[next() % std::size(sizes)], s);
      } else {
        free_step(r, a, static_cast<std::size_t>(next() % live_.size()), s);
      }
    }
    phase(1);  // free with other-stream uses
    for (int i = 0; i < 3 && live_.size() > 1; ++i) {
      step(r, "record_stream", [&] { a.record_stream(live_.front().p, streams_[1]); });
      free_step(r, a, 0, streams_[0]);                 // waits for stream 1 (pending)
      free_step(r, a, live_.size() - 1, streams_[1]);  // on another stream than its own
    }
    if (!live_.empty()) {
      step(r, "record_stream", [&] { a.record_stream(live_.back().p, streams_[0]); });
      std::thread t{[&] { free_step(r, a, live_.size() - 1, streams_[1]); }};
      t.join();
    }
    phase(2);  // growth and out-of-memory: cross-stream reuse, then out of memory and recovery
    alloc_step(r, a, 40 * mib, streams_[1]);
    for (int i = 0; i < 6; ++i) { alloc_step(r, a, 60 * mib, streams_[i % 2]); }
    for (int i = 0; i < 4; ++i) { alloc_step(r, a, 4096, streams_[i % 2]); }
    phase(3);                                         // release and trim
    for (std::size_t n = live_.size(); n > 4; --n) {  // a failed free leaves its block live
      free_step(r, a, n - 1, streams_[0]);
    }
    step(r, "trim", [&] { (void)a.trim(8 * mib); });
    step(r, "release", [&] { (void)a.release(); });
    alloc_step(r, a, 100 * mib, streams_[0]);
    phase(4);
    capture(a, r);
    unannounced_capture(a, r);
    phase(5);  // free: everything, then the frees that failed once more (the fault is single-shot)
    while (!live_.empty()) {
      std::size_t const before = live_.size();
      free_step(r, a, 0, live_.front().stream);
      if (live_.size() == before) { break; }
    }
    step(r, "forget_stream", [&] { a.forget_stream(streams_[1]); });
    for (std::size_t i = live_.size(); i-- > 0;) { free_step(r, a, i, live_[i].stream); }
    if (!live_.empty() && r.failure.empty()) {
      r.failure = std::to_string(live_.size()) + " block(s) cannot be freed after a failed free";
    }
    phase(6);
    reclaim(a, r);
  }

  // Everything back, then the whole capacity in one block: a stranded block or a segment the
  // allocator forgot shows here. Tried twice: the fault may land in the first try.
  void reclaim(sim_allocator& a, run_result& r)
  {
    std::string why;
    for (int attempt = 0; attempt < 2; ++attempt) {
      std::uint64_t const pending = sim_->pending_faults();
      why                         = reclaim_once(a);
      if (why.empty() || sim_->pending_faults() == pending) { break; }
    }
    if (!why.empty() && r.failure.empty()) { r.failure = "reclaim: " + why; }
    std::string const inv = gpukit::detail::check_invariants(a);
    if (!inv.empty() && r.failure.empty()) { r.failure = "invariants: " + inv; }
  }

  std::string reclaim_once(sim_allocator& a)
  {
    try {
      if (reclaim_block_ != nullptr) {  // the last try's block, whose free failed
        a.deallocate_async(reclaim_block_, config_.reclaim_bytes, streams_[0]);
        reclaim_block_ = nullptr;
      }
      (void)a.release();
      GPUKIT_CUDA_TRY(sim_->set_device(device));
      cudaError_t const e = sim_->device_synchronize();
      GPUKIT_CUDA_TRY(sim_->set_device(0));
      GPUKIT_CUDA_TRY(e);
      auto const reserved = a.stats().reserved_bytes.current;
      if (reserved != 0) {
        return std::to_string(reserved) + " bytes reserved after a full release";
      }
      if (reserved == 0 && sim_->used_bytes(device) != 0) {
        return "nothing reserved, but the device holds " +
               std::to_string(sim_->used_bytes(device)) + " bytes after a full release";
      }
      void* p        = a.allocate_async(config_.reclaim_bytes, streams_[0]);
      reclaim_block_ = p;
      char* const c  = static_cast<char*>(p);  // its first and last pages are the device's
      cudaError_t e1 = sim_->memset_async(c, 7, 4096, streams_[0]);
      cudaError_t e2 = sim_->memset_async(c + config_.reclaim_bytes - 4096, 7, 4096, streams_[0]);
      a.deallocate_async(p, config_.reclaim_bytes, streams_[0]);
      reclaim_block_ = nullptr;
      GPUKIT_CUDA_TRY(e1);
      GPUKIT_CUDA_TRY(e2);
      (void)a.release();
      return {};
    } catch (std::exception const& e) {
      return e.what();
    }
  }

  // Ends the capture on `s`: whatever call failed, the allocator never made one that
  // invalidates a capture (on CUDA the graph would be lost).
  void capture_ended(run_result& r, sim_stream s)
  {
    cudaError_t const e = sim_->end_capture(s);
    if (e != cudaSuccess && r.failure.empty()) {
      r.failure = std::string{"the capture ended with "} + sim_runtime::error_name(e) + ": " +
                  sim_->last_misuse();
    }
  }

  // A capture the allocator is told about: its allocations come from a private pool. A side
  // stream the allocator has never seen is forked into it (it waits on an event of the capture),
  // allocates there and uses a block of the capture's stream (record_stream), then joins back.
  void capture(sim_allocator& a, run_result& r)
  {
    sim_stream const s = streams_[0];
    if (sim_->begin_capture(s) != cudaSuccess) { return; }
    std::optional<sim_allocator::capture_id> id;
    step(r, "begin_capture", [&] { id = a.begin_capture(s); });
    if (id) {
      std::size_t const before = live_.size();
      alloc_step(r, a, 2 * mib, s);
      alloc_step(r, a, 4096, s);
      bool const forked = sim_->event_record(fork_, s) == cudaSuccess &&
                          sim_->stream_wait_event(side_, fork_) == cudaSuccess;
      if (forked) {
        alloc_step(r, a, mib, side_);
        if (live_.size() > before) {
          step(r, "record_stream on the side stream",
               [&] { a.record_stream(live_[before].p, side_); });
        }
        (void)sim_->event_record(join_, side_);
        (void)sim_->stream_wait_event(s, join_);
      }
      step(r, "release during capture", [&] { (void)a.release(); });
      while (live_.size() > before) {
        std::size_t const n = live_.size();
        free_step(r, a, live_.size() - 1, s);
        if (live_.size() == n) { break; }
      }
      step(r, "end_capture", [&] { a.end_capture(s); });
    }
    capture_ended(r, s);
    if (id) {
      step(r, "release_capture_pool", [&] { a.release_capture_pool(*id); });
    }
  }

  // A capture begun on the stream directly: the allocator learns of it only by asking the stream.
  // Releasing cached memory then must not free segments of that stream (the free would join the
  // graph instead of happening), nor ask, query or wait for that stream (which invalidates the
  // capture). Relaxed mode: of a capture it was not told about, the allocator cannot know that
  // calls unsafe in global mode (event queries, synchronizations) would fail on other streams.
  void unannounced_capture(sim_allocator& a, run_result& r)
  {
    sim_stream const s = streams_[1];
    step(r, "release", [&] { (void)a.release(); });  // so that the next block is a new segment
    alloc_step(r, a, 20 * mib, s);
    if (!live_.empty() && live_.back().stream == s) { free_step(r, a, live_.size() - 1, s); }
    if (sim_->begin_capture(s, cudaStreamCaptureModeRelaxed) != cudaSuccess) { return; }
    step(r, "release during a capture begun on the stream", [&] { (void)a.release(); });
    capture_ended(r, s);
    step(r, "release after the capture", [&] { (void)a.release(); });
  }

  configuration const& config_;
  std::optional<std::pair<sim_op, std::uint64_t>> fault_;
  cudaError_t error_;
  sim_runtime* sim_{nullptr};
  std::vector<sim_stream> streams_;
  sim_stream side_{};  // used only inside the capture
  gpukit::sim_runtime::event_type fork_{}, join_{};
  std::vector<live_block> live_;
  void* reclaim_block_{nullptr};
  std::uint64_t rng_{0x9e3779b97f4a7c15ull};
  std::array<op_counts, phase_count> phase_start_{};
  op_counts phase_end_{};
};

/// The errors a fault of `op` reports: out of memory for the calls that take memory, else an
/// unknown error; the calls that name a stream or an event also get an invalid handle (as if it
/// had been destroyed), but for stream_is_capturing: the workload asks it of streams it is
/// capturing, which CUDA cannot report destroyed.
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
    case sim_op::stream_wait_event:
    case sim_op::event_record:
    case sim_op::memset_async:
    case sim_op::free_async: return {cudaErrorUnknown, cudaErrorInvalidResourceHandle};
    default: return {cudaErrorUnknown};
  }
}

}  // namespace

TEST_SUITE("fault_sweep")
{
  TEST_CASE("one fault point, to debug a failure: GPUKIT_FAULT_SWEEP_ONLY=source,op,nth,error" *
            doctest::skip(std::getenv("GPUKIT_FAULT_SWEEP_ONLY") == nullptr))
  {
    std::string const only = std::getenv("GPUKIT_FAULT_SWEEP_ONLY");
    std::vector<std::string> f;
    for (std::size_t at = 0, comma = 0; comma != std::string::npos; at = comma + 1) {
      comma = only.find(',', at);
      f.push_back(only.substr(at, comma == std::string::npos ? comma : comma - at));
    }
    REQUIRE(f.size() == 4);
    for (configuration const& config : configurations()) {
      if (f[0] != config.name) { continue; }
      for (std::size_t i = 0; i < op_count; ++i) {
        if (f[1] != gpukit::to_string(static_cast<sim_op>(i))) { continue; }
        sweep_run one{config, std::make_pair(static_cast<sim_op>(i), std::stoull(f[2])),
                      static_cast<cudaError_t>(std::stoi(f[3]))};
        run_result const r = one.run();
        CHECK(r.failure == "");
        return;
      }
    }
    FAIL("no such source or operation: " << only);
  }

  TEST_CASE("every runtime call of every phase fails once and nothing is lost")
  {
    char const* const stride_text = std::getenv("GPUKIT_FAULT_SWEEP_STRIDE");
    long const stride =
      stride_text != nullptr && std::atol(stride_text) > 0 ? std::atol(stride_text) : 1L;
    long const offset = [&] {
      char const* colon = stride_text != nullptr ? std::strchr(stride_text, ':') : nullptr;
      return colon != nullptr && std::atol(colon + 1) > 0 ? std::atol(colon + 1) % stride : 0L;
    }();
    auto const start = std::chrono::steady_clock::now();
    std::array<long, phase_count> tried{}, survived{};
    std::map<std::string, long> per_configuration;
    for (configuration const& config : configurations()) {
      std::string const config_name = config.name;
      CAPTURE(config_name);
      sweep_run baseline{config, std::nullopt, cudaSuccess};
      run_result const b = baseline.run();
      REQUIRE(b.failure == "");
      for (std::size_t i = 0; i < op_count; ++i) {
        auto const op = static_cast<sim_op>(i);
        for (cudaError_t const error : errors_for(op)) {
          for (std::size_t phase = 0; phase < phase_count; ++phase) {
            // Each phase's calls from its first one: a bounded sweep still tries every phase.
            auto const [first, last] = baseline.calls(op, phase);
            // From the offset on, where the phase is that long; else from its first call.
            std::uint64_t from = first + 1 + static_cast<std::uint64_t>(offset);
            if (from > last) { from = first + 1; }
            for (std::uint64_t nth = from; nth <= last; nth += static_cast<std::uint64_t>(stride)) {
              sweep_run one{config, std::make_pair(op, nth), error};
              run_result const r = one.run();
              ++tried[phase];
              ++per_configuration[config.name];
              if (r.failure.empty()) {
                ++survived[phase];
              } else {
                std::string const phase_name = phase_names[phase], op_name = gpukit::to_string(op);
                CAPTURE(phase_name);
                CAPTURE(op_name);
                CAPTURE(nth);
                CAPTURE(static_cast<int>(error));
                CHECK(r.failure == "");
              }
            }
          }
        }
      }
    }
    double const seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    long all_tried = 0, all_survived = 0;
    for (std::size_t p = 0; p < phase_count; ++p) {
      std::printf("fault sweep: phase %-28s %6ld tried, %6ld survived\n", phase_names[p], tried[p],
                  survived[p]);
      all_tried += tried[p];
      all_survived += survived[p];
      CHECK_MESSAGE(tried[p] > 0, "no fault point in phase ", phase_names[p]);
    }
    for (auto const& [name, n] : per_configuration) {
      std::printf("fault sweep: source %-20s %6ld tried\n", name.c_str(), n);
    }
    std::printf(
      "fault points tried: %ld, survived: %ld (survived: no leak, no invariant failure, everything "
      "reclaimed), %.1f s; every %ld-th point from the %ld-th\n",
      all_tried, all_survived, seconds, stride, offset);
    CHECK(all_survived == all_tried);
  }
}
