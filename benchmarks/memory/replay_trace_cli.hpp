// SPDX-License-Identifier: Apache-2.0
// replay_trace_cli.hpp: replay_trace's command line and its replay through gpukit's caching
// allocator, callable in-process: shared by the program (replay_trace.cpp, which adds the CUDA
// anchors: cudaMalloc, cudaMallocAsync, CUB) and its argument fuzz harness
// (tests/fuzz/replay_args_fuzz.cpp). Host code only. Not installed.
#pragma once

#include <gpukit/error.hpp>
#include <gpukit/memory/allocation_trace.hpp>
#include <gpukit/memory/caching_allocator.hpp>
#include <gpukit/runtime/sim_runtime.hpp>

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <fstream>
#include <ostream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

namespace replay_trace_cli {

inline constexpr int exit_ok     = 0;
inline constexpr int exit_failed = 1;  ///< the replay failed (a runtime error, out of memory)
inline constexpr int exit_usage  = 2;  ///< a bad command line or a malformed trace

inline char const* const usage_text =
  "usage: replay_trace --trace FILE [--runtime sim|cuda] "
  "[--allocator gpukit|gpukit_vmm|cuda_malloc|cuda_malloc_async|cub] [--repeat N] "
  "[--page-bytes N] [--medium-segment N] [--thread-cache-bytes N] [--thread-cache-max-block N] "
  "[--no-release-before-grow] [--busy-streams [--catch-up-every N]]\n";

struct usage_error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

using trace = gpukit::allocation_trace;

/// The largest byte count an option takes: 2^48, beyond any device (the allocator's own limit).
inline constexpr std::uint64_t most_bytes = std::uint64_t{1} << 48;

/// gpukit's messages start with "gpukit: ": the program prints its own prefix.
inline std::string plain(std::string message)
{
  if (message.rfind("gpukit: ", 0) == 0) message.erase(0, 8);
  return message;
}

inline trace load(std::string const& path)
{
  std::ifstream in{path, std::ios::binary};
  if (!in) { throw usage_error{"cannot open trace '" + path + "'"}; }
  try {
    return gpukit::read_allocation_trace(in, path);
  } catch (gpukit::trace_error const& e) {
    throw usage_error{plain(e.what())};
  }
}

/// A command-line number: unsigned decimal digits only (no sign, no space), any length, within
/// [low, high]; else a usage_error naming the option, the value and the range.
inline std::uint64_t parse_number(std::string const& option, std::string const& text,
                                  std::uint64_t low, std::uint64_t high)
{
  std::uint64_t v      = 0;
  bool const digits    = !text.empty() && text.find_first_not_of("0123456789") == std::string::npos;
  auto const [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (!digits || ec != std::errc{} || end != text.data() + text.size() || v < low || v > high) {
    throw usage_error{option + " takes a whole number from " + std::to_string(low) + " to " +
                      std::to_string(high) + ", not '" + text + "'"};
  }
  return v;
}

/// What the command line asks for.
struct command_line {
  bool help{false};
  std::string trace_path;
  std::string runtime{"sim"};
  std::string allocator{"gpukit"};
  int repeat{3};
  // sim only: every stream holds unfinished work through the replay (stream_query: not ready), as
  // on a GPU whose work trails the host; else the simulated streams are idle at every query.
  bool busy_streams{false};
  // With busy_streams: every this many events the streams run what they had queued (the GPU
  // catches up), then are busy again; 0: never.
  std::uint64_t catch_up_every{0};
  gpukit::caching_allocator_options options;
};

/// gpukit's caching allocator (fixed or growable segments), which runs on either runtime.
inline bool is_gpukit(command_line const& c)
{
  return c.allocator == "gpukit" || c.allocator == "gpukit_vmm";
}

/// Bounds of the work one run may do (the program's by default; the fuzz harness lowers them).
struct run_limits {
  std::uint64_t max_repeat{1000000};
};

/// The command line, checked: throws usage_error naming what is wrong.
inline command_line parse_arguments(int argc, char** argv, run_limits const& limits = {})
{
  command_line c;
  auto& o = c.options;
  for (int i = 1; i < argc; ++i) {
    std::string const a = argv[i];
    auto value          = [&]() -> std::string {
      if (i + 1 >= argc) { throw usage_error{a + " needs a value"}; }
      return argv[++i];
    };
    if (a == "--trace") {
      c.trace_path = value();
    } else if (a == "--runtime") {
      c.runtime = value();
    } else if (a == "--allocator") {
      c.allocator = value();
    } else if (a == "--thread-cache-bytes") {
      o.thread_cache_bytes = static_cast<std::size_t>(parse_number(a, value(), 0, most_bytes));
    } else if (a == "--thread-cache-max-block") {
      o.thread_cache_max_block_bytes =
        static_cast<std::size_t>(parse_number(a, value(), 0, most_bytes));
    } else if (a == "--medium-segment") {
      // What the allocator accepts: a multiple of 256 no smaller than the medium requests it
      // serves.
      std::string const text = value();
      std::uint64_t v        = 0;
      try {
        v = parse_number(a, text, o.medium_request_bytes, most_bytes);
      } catch (usage_error const&) {
        v = 1;  // refused below, with the whole rule
      }
      if (v % 256 != 0) {
        throw usage_error{a + " takes a multiple of 256 from " +
                          std::to_string(o.medium_request_bytes) + " to " +
                          std::to_string(most_bytes) + ", not '" + text + "'"};
      }
      o.medium_segment_bytes = static_cast<std::size_t>(v);
    } else if (a == "--page-bytes") {
      o.growable_page_bytes = static_cast<std::size_t>(parse_number(a, value(), 1, most_bytes));
    } else if (a == "--no-release-before-grow") {
      o.release_before_grow = false;
    } else if (a == "--busy-streams") {
      c.busy_streams = true;
    } else if (a == "--catch-up-every") {
      c.catch_up_every = parse_number(a, value(), 1, most_bytes);

    } else if (a == "--repeat") {
      c.repeat = static_cast<int>(parse_number(a, value(), 1, limits.max_repeat));
    } else if (a == "--help" || a == "-h") {
      c.help = true;
      return c;
    } else {
      throw usage_error{"unknown argument '" + a + "'"};
    }
  }
  if (c.trace_path.empty()) { throw usage_error{"--trace FILE is required"}; }
  if (c.runtime != "sim" && c.runtime != "cuda") {
    throw usage_error{"--runtime must be sim or cuda, not '" + c.runtime + "'"};
  }
  if (c.allocator != "gpukit" && c.allocator != "gpukit_vmm" && c.allocator != "cuda_malloc" &&
      c.allocator != "cuda_malloc_async" && c.allocator != "cub") {
    throw usage_error{
      "--allocator must be gpukit, gpukit_vmm, cuda_malloc, cuda_malloc_async or cub, not '" +
      c.allocator + "'"};
  }
  if (c.allocator == "gpukit_vmm") { o.source = gpukit::segment_source::growable; }
  if (!is_gpukit(c) && c.runtime != "cuda") {
    throw usage_error{"--allocator " + c.allocator + " needs --runtime cuda"};
  }
  if (c.catch_up_every != 0 && !c.busy_streams) {
    throw usage_error{"--catch-up-every needs --busy-streams"};
  }
  if (c.busy_streams && c.runtime != "sim") {
    throw usage_error{
      "--busy-streams needs --runtime sim (a real GPU's streams are as busy as its work)"};
  }
  return c;
}

struct result {
  std::size_t peak_reserved{0};
  std::uint64_t device_allocs{0};
  std::uint64_t device_frees{0};
  double ns_per_event{0};
};

using clk = std::chrono::steady_clock;

// Replays `t` `repeat` times with alloc(bytes, stream_index) / dealloc(ptr, bytes, stream_index);
// sample() is called after every allocation when given (an untimed pass measures memory).
template <class Alloc, class Dealloc>
double replay(trace const& t, int repeat, Alloc&& alloc, Dealloc&& dealloc)
{
  std::vector<void*> ptrs;
  std::vector<std::size_t> sizes;
  std::vector<int> streams;
  ptrs.assign(t.ids, nullptr);
  sizes.assign(t.ids, 0);
  streams.assign(t.ids, 0);
  auto const t0 = clk::now();
  for (int r = 0; r < repeat; ++r) {
    for (auto const& e : t.events) {
      if (e.alloc) {
        ptrs[e.id]    = e.bytes == 0 ? nullptr : alloc(e.bytes, e.stream);
        sizes[e.id]   = e.bytes;
        streams[e.id] = e.stream;
      } else if (ptrs[e.id] != nullptr) {
        dealloc(ptrs[e.id], sizes[e.id], streams[e.id]);
        ptrs[e.id] = nullptr;
      }
    }
    // Whatever the trace leaves live is freed between repetitions (not timed as events).
    for (std::size_t i = 0; i < t.ids; ++i) {
      if (ptrs[i] != nullptr) {
        dealloc(ptrs[i], sizes[i], streams[i]);
        ptrs[i] = nullptr;
      }
    }
  }
  return std::chrono::duration<double, std::nano>(clk::now() - t0).count() /
         (static_cast<double>(std::max<std::size_t>(t.events.size(), 1)) * repeat);
}

/// --busy-streams: each stream of the simulated GPU stalled with a task queued, so that it is never
/// idle (stream_query: not ready), as on a GPU whose work trails the host at every allocation.
inline void keep_busy(gpukit::sim_runtime& sim,
                      std::vector<gpukit::sim_runtime::stream_type> const& streams)
{
  for (auto s : streams) {
    GPUKIT_CUDA_TRY(sim.stall(s));
    GPUKIT_CUDA_TRY(sim.launch_host_func(
      s, [](void*) {}, nullptr));
  }
}

/// The streams keep_busy held run what they had queued (with `wait`, until they have).
inline void let_run(gpukit::sim_runtime& sim,
                    std::vector<gpukit::sim_runtime::stream_type> const& streams, bool wait)
{
  for (auto s : streams) {
    GPUKIT_CUDA_TRY(sim.release(s));
    if (wait) { GPUKIT_CUDA_TRY(sim.stream_synchronize(s)); }
  }
}

template <class Runtime>
result run_gpukit(Runtime& rt, trace const& t, int repeat,
                  gpukit::caching_allocator_options const& options,
                  [[maybe_unused]] bool busy_streams            = false,
                  [[maybe_unused]] std::uint64_t catch_up_every = 0)
{
  std::vector<typename Runtime::stream_type> streams(std::max<std::size_t>(t.streams, 1));
  for (auto& s : streams) { GPUKIT_CUDA_TRY(rt.stream_create(s)); }
  // What the allocator does only for an idle stream (unmap its free pages for another range,
  // "harvest") it then never does, but right after a catch-up.
  constexpr bool sim = std::is_same_v<Runtime, gpukit::sim_runtime>;
  if constexpr (sim) {
    if (busy_streams) { keep_busy(rt, streams); }
  }
  [[maybe_unused]] std::uint64_t events = 0;
  // Every catch_up_every events: the streams run what they had queued, then are busy again.
  auto tick = [&] {
    if constexpr (sim) {
      if (catch_up_every == 0 || ++events % catch_up_every != 0) { return; }
      let_run(rt, streams, true);
      keep_busy(rt, streams);
    }
  };
  result res;
  {
    gpukit::basic_caching_allocator<Runtime> alloc{rt, 0, options};
    res.ns_per_event = replay(
      t, repeat,
      [&](std::size_t b, int s) {
        tick();
        return alloc.allocate_async(b, streams[static_cast<std::size_t>(s)]);
      },
      [&](void* p, std::size_t b, int s) {
        tick();
        alloc.deallocate_async(p, b, streams[static_cast<std::size_t>(s)]);
      });
    auto const st     = alloc.stats();
    res.peak_reserved = static_cast<std::size_t>(st.reserved_bytes.peak);
    res.device_allocs = st.num_device_allocs;
    res.device_frees  = st.num_device_frees;
    if constexpr (sim) {
      if (busy_streams) { let_run(rt, streams, false); }  // synchronized below
    }
    for (auto& s : streams) {
      GPUKIT_CUDA_TRY(rt.stream_synchronize(s));
      alloc.forget_stream(s);
    }
  }
  for (auto& s : streams) { GPUKIT_CUDA_TRY(rt.stream_destroy(s)); }
  return res;
}

inline std::string base_name(std::string const& path)
{
  auto const slash = path.find_last_of('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

/// replay_trace with arguments `argv` (see replay_trace.cpp): the report goes to `out`, errors to
/// `err`; returns exit_ok, exit_failed or exit_usage. `cuda` is the runtime of --runtime cuda for
/// gpukit's allocators, and `anchor(allocator, trace, repeat) -> result` replays the CUDA anchors
/// (cuda_malloc, cuda_malloc_async, cub). Throws nothing.
template <class CudaRuntime, class Anchor>
int run(int argc, char** argv, std::ostream& out, std::ostream& err, CudaRuntime& cuda,
        Anchor&& anchor, run_limits const& limits = {}) noexcept
{
  try {
    try {
      command_line const c = parse_arguments(argc, argv, limits);
      if (c.help) {
        out << usage_text;
        return exit_ok;
      }
      trace const t = load(c.trace_path);
      char line[512];
      std::snprintf(line, sizeof line,
                    ": %zu events, %zu stream(s), peak live %.2f GiB, %zu zero-byte allocations "
                    "skipped\n",
                    t.events.size(), t.streams,
                    static_cast<double>(t.peak_live_bytes) / 1073741824.0, t.zero_byte_allocs);
      out << "trace " << c.trace_path << line;
      result r;
      if (c.runtime == "sim") {
        std::size_t const capacity =
          std::max<std::size_t>(std::size_t{80} << 30, 4 * t.peak_live_bytes);
        gpukit::sim_runtime sim{gpukit::sim_config{}.with_devices(1, capacity)};
        r = run_gpukit(sim, t, c.repeat, c.options, c.busy_streams, c.catch_up_every);
      } else if (is_gpukit(c)) {
        r = run_gpukit(cuda, t, c.repeat, c.options);
      } else {
        r = anchor(c.allocator, t, c.repeat);
      }
      std::snprintf(line, sizeof line,
                    "\"peak_live_bytes\": %zu, \"peak_reserved_bytes\": %zu, \"ratio\": %.4f, "
                    "\"device_allocs\": %llu, \"device_frees\": %llu, \"ns_per_event\": %.1f, "
                    "\"busy_streams\": %s, \"catch_up_every\": %llu, \"repeat\": %d}\n",
                    t.peak_live_bytes, r.peak_reserved,
                    t.peak_live_bytes == 0 ? 0.0
                                           : static_cast<double>(r.peak_reserved) /
                                               static_cast<double>(t.peak_live_bytes),
                    static_cast<unsigned long long>(r.device_allocs),
                    static_cast<unsigned long long>(r.device_frees), r.ns_per_event,
                    c.busy_streams ? "true" : "false",
                    static_cast<unsigned long long>(c.catch_up_every), c.repeat);
      out << "{\"trace\": \"" << base_name(c.trace_path) << "\", \"runtime\": \"" << c.runtime
          << "\", \"allocator\": \"" << c.allocator << "\", \"events\": " << t.events.size() << ", "
          << line << std::flush;
      return exit_ok;
    } catch (usage_error const& e) {
      err << "replay_trace: " << e.what() << '\n';
      return exit_usage;
    } catch (std::exception const& e) {
      err << "replay_trace: " << plain(e.what()) << '\n';
      return exit_failed;
    }
  } catch (...) {  // the error stream itself failed
    return exit_failed;
  }
}

}  // namespace replay_trace_cli
