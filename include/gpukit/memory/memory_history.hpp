// SPDX-License-Identifier: Apache-2.0
// gpukit/memory/memory_history.hpp: what a caching allocator did, and what it holds, exported.
//
// Quick start:
//
//   #include <gpukit/memory/caching_allocator.hpp>
//   #include <gpukit/memory/memory_history.hpp>
//
//   #include <fstream>
//
//   void record(gpukit::caching_allocator& alloc, void (*train_steps)())
//   {
//     alloc.start_recording();                          // a ring of events per thread (<= 50 ns)
//     train_steps();
//     gpukit::memory_snapshot snap = alloc.snapshot();  // segments, blocks, recorded events
//     std::ofstream{"snap.json"} << gpukit::to_json(snap);
//     std::ofstream{"run.trace"} << gpukit::to_trace(snap);  // replay_trace's format
//     std::ofstream{"snap.pickle", std::ios::binary} << gpukit::to_pytorch_pickle(snap);
//     //   python -m torch.cuda._memory_viz trace_plot snap.pickle -o trace.html
//     std::ofstream{"report.html"} << gpukit::to_html(snap);  // no network needed
//   }
//
// Nothing here synchronizes or calls the runtime: a snapshot is host-side bookkeeping.
#pragma once

#include <gpukit/detail/json.hpp>

#include <gpukit/memory/detail/memory_history_html.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <unordered_map>
#include <vector>

namespace gpukit {

/// One recorded allocator event.
struct memory_event {
  enum class action : std::uint8_t {
    alloc,          ///< a block handed to a user
    free,           ///< a block returned by a user (reusable in its stream's order)
    segment_alloc,  ///< memory taken from the runtime
    segment_free,   ///< memory returned to the runtime
    oom,            ///< an allocation that failed after recovery
  };
  action what{action::alloc};
  std::uint64_t time_ns{0};  ///< steady clock
  std::uintptr_t address{0};
  std::size_t bytes{0};  ///< block or segment size; for oom, the bytes requested
  std::uintptr_t stream{0};
};

[[nodiscard]] inline char const* to_string(memory_event::action a) noexcept
{
  switch (a) {
    case memory_event::action::alloc: return "alloc";
    case memory_event::action::free: return "free";
    case memory_event::action::segment_alloc: return "segment_alloc";
    case memory_event::action::segment_free: return "segment_free";
    case memory_event::action::oom: return "oom";
  }
  return "unknown";
}

/// The allocator's memory at one moment, and the events recorded before it.
struct memory_snapshot {
  struct block {
    std::uintptr_t address{0};
    std::size_t size{0};
    std::size_t requested{0};  ///< bytes the user asked for (0 when free)
    bool allocated{false};
  };
  struct segment {
    std::uintptr_t address{0};
    std::size_t size{0};
    std::uintptr_t stream{0};
    bool small{false};  ///< from the small pool (blocks <= 1 MiB)
    std::vector<block> blocks;
  };
  int device{0};
  std::vector<segment> segments;
  std::vector<memory_event> events;  ///< in time order
  std::uint64_t dropped_events{0};   ///< overwritten in full rings
};

namespace detail {

/// A minimal pickle (protocol 2) writer: dicts, lists, tuples, str, int, bool, None.
class pickle_writer {
 public:
  pickle_writer() { out_ += "\x80\x02"; }
  void none() { out_ += 'N'; }
  void boolean(bool v) { out_ += v ? '\x88' : '\x89'; }
  void integer(long long v)
  {
    if (v >= -2147483648LL && v <= 2147483647LL) {
      out_ += 'J';
      auto const u = static_cast<std::uint32_t>(static_cast<std::int32_t>(v));
      for (int i = 0; i < 4; ++i) { out_ += static_cast<char>((u >> (8 * i)) & 0xff); }
      return;
    }
    // LONG1: little-endian two's complement, as few bytes as hold the sign.
    std::string bytes;
    long long x = v;
    for (;;) {
      auto const b = static_cast<unsigned char>(x & 0xff);
      bytes += static_cast<char>(b);
      x >>= 8;
      bool const sign_ok = (x == 0 && !(b & 0x80)) || (x == -1 && (b & 0x80));
      if (sign_ok) { break; }
    }
    out_ += '\x8a';
    out_ += static_cast<char>(bytes.size());
    out_ += bytes;
  }
  void str(std::string const& s)
  {
    out_ += 'X';
    auto const n = static_cast<std::uint32_t>(s.size());
    for (int i = 0; i < 4; ++i) { out_ += static_cast<char>((n >> (8 * i)) & 0xff); }
    out_ += s;
  }
  void begin_dict() { out_ += "}("; }  // EMPTY_DICT, MARK
  void end_dict() { out_ += 'u'; }     // SETITEMS
  void begin_list() { out_ += "]("; }  // EMPTY_LIST, MARK
  void end_list() { out_ += 'e'; }     // APPENDS
  void begin_tuple() { out_ += '('; }  // MARK
  void end_tuple() { out_ += 't'; }    // TUPLE
  std::string finish()
  {
    out_ += '.';
    return std::move(out_);
  }

 private:
  std::string out_;
};

/// A segment as PyTorch's snapshot describes it, its blocks included.
inline void pickle_segment(pickle_writer& w, int device, memory_snapshot::segment const& g)
{
  std::size_t allocated = 0, requested = 0;
  for (auto const& b : g.blocks) {
    if (b.allocated) {
      allocated += b.size;
      requested += b.requested;
    }
  }
  w.begin_dict();
  w.str("device"), w.integer(device);
  w.str("address"), w.integer(static_cast<long long>(g.address));
  w.str("total_size"), w.integer(static_cast<long long>(g.size));
  w.str("allocated_size"), w.integer(static_cast<long long>(allocated));
  w.str("active_size"), w.integer(static_cast<long long>(allocated));
  w.str("requested_size"), w.integer(static_cast<long long>(requested));
  w.str("stream"), w.integer(static_cast<long long>(g.stream));
  w.str("segment_type"), w.str(g.small ? "small" : "large");
  w.str("segment_pool_id");
  w.begin_tuple();
  w.integer(0);
  w.integer(0);
  w.end_tuple();
  w.str("is_expandable"), w.boolean(false);
  w.str("frames"), w.begin_list(), w.end_list();
  w.str("blocks");
  w.begin_list();
  for (auto const& b : g.blocks) {
    w.begin_dict();
    w.str("address"), w.integer(static_cast<long long>(b.address));
    w.str("size"), w.integer(static_cast<long long>(b.size));
    w.str("requested_size"), w.integer(static_cast<long long>(b.allocated ? b.requested : 0));
    w.str("state"), w.str(b.allocated ? "active_allocated" : "inactive");
    w.str("frames"), w.begin_list(), w.end_list();
    w.end_dict();
  }
  w.end_list();
  w.end_dict();
}

/// PyTorch's name of an event's action in a device trace.
inline char const* pytorch_trace_action(memory_event::action a) noexcept
{
  switch (a) {
    case memory_event::action::alloc: return "alloc";
    case memory_event::action::free: return "free_completed";
    case memory_event::action::segment_alloc: return "segment_alloc";
    case memory_event::action::segment_free: return "segment_free";
    case memory_event::action::oom: return "oom";
  }
  return nullptr;
}

/// An event as an entry of PyTorch's device trace.
inline void pickle_trace_entry(pickle_writer& w, memory_event const& e)
{
  w.begin_dict();
  w.str("action"), w.str(pytorch_trace_action(e.what));
  w.str("addr"), w.integer(static_cast<long long>(e.address));
  w.str("size"), w.integer(static_cast<long long>(e.bytes));
  w.str("stream"), w.integer(static_cast<long long>(e.stream));
  w.str("time_us"), w.integer(static_cast<long long>(e.time_ns / 1000));
  w.str("frames"), w.begin_list(), w.end_list();
  w.end_dict();
}

}  // namespace detail

/// The snapshot as JSON: {"device", "segments": [...], "events": [...], "dropped_events"}.
[[nodiscard]] inline std::string to_json(memory_snapshot const& s)
{
  std::string o = "{\"device\": " + std::to_string(s.device) + ", \"segments\": ";
  detail::json_list(o, s.segments, [&](auto const& g) {
    o += "{\"address\": " + std::to_string(g.address) + ", \"size\": " + std::to_string(g.size) +
         ", \"stream\": " + std::to_string(g.stream) + ", \"pool\": \"" +
         (g.small ? "small" : "large") + "\", \"blocks\": ";
    detail::json_list(o, g.blocks, [&](auto const& b) {
      o += "{\"address\": " + std::to_string(b.address) + ", \"size\": " + std::to_string(b.size) +
           ", \"requested\": " + std::to_string(b.requested) + ", \"state\": \"" +
           (b.allocated ? "allocated" : "free") + "\"}";
    });
    o += '}';
  });
  o += ", \"events\": ";
  detail::json_list(o, s.events, [&](memory_event const& e) {
    o += "{\"action\": \"" + std::string{to_string(e.what)} +
         "\", \"time_ns\": " + std::to_string(e.time_ns) +
         ", \"address\": " + std::to_string(e.address) + ", \"bytes\": " + std::to_string(e.bytes) +
         ", \"stream\": " + std::to_string(e.stream) + "}";
  });
  o += ", \"dropped_events\": " + std::to_string(s.dropped_events) + "}\n";
  return o;
}

/// The recorded block events in replay_trace's format (`a <id> <bytes> <stream>`, `f <id>`), so a
/// recorded run can be replayed. Blocks allocated before recording began and freed during it are
/// left out (as in PyTorch's traces); streams are numbered in order of appearance.
[[nodiscard]] inline std::string to_trace(memory_snapshot const& s)
{
  std::string o = "# gpukit allocation trace: a <id> <bytes> <stream> | f <id>\n";
  std::unordered_map<std::uintptr_t, std::size_t> live;
  std::map<std::uintptr_t, int> streams;
  std::size_t next = 0;
  for (auto const& e : s.events) {
    if (e.what == memory_event::action::alloc) {
      auto const [it, fresh] = streams.emplace(e.stream, static_cast<int>(streams.size()));
      (void)fresh;
      live[e.address] = next;
      o += "a " + std::to_string(next++) + " " + std::to_string(e.bytes) + " " +
           std::to_string(it->second) + "\n";
    } else if (e.what == memory_event::action::free) {
      auto it = live.find(e.address);
      if (it == live.end()) { continue; }
      o += "f " + std::to_string(it->second) + "\n";
      live.erase(it);
    }
  }
  return o;
}

/// The snapshot in PyTorch's memory-snapshot format (a pickle, as torch.cuda.memory._snapshot()
/// writes), so that `python -m torch.cuda._memory_viz` and PyTorch's memory_viz page open it.
[[nodiscard]] inline std::string to_pytorch_pickle(memory_snapshot const& s)
{
  detail::pickle_writer w;
  w.begin_dict();
  w.str("segments");
  w.begin_list();
  for (auto const& g : s.segments) { detail::pickle_segment(w, s.device, g); }
  w.end_list();
  w.str("device_traces");
  w.begin_list();
  w.begin_list();  // device 0's trace (the snapshot's device)
  for (auto const& e : s.events) { detail::pickle_trace_entry(w, e); }
  w.end_list();
  w.end_list();
  w.str("allocator_settings");
  w.begin_dict();
  w.str("PYTORCH_CUDA_ALLOC_CONF"), w.str("gpukit");
  w.end_dict();
  w.end_dict();
  return w.finish();
}

/// A self-contained HTML report (no network): allocated and reserved memory over time, per
/// stream, and the segment map of the snapshot, drawn by inline JavaScript from inline data.
[[nodiscard]] inline std::string to_html(memory_snapshot const& s)
{
  std::string o = detail::memory_report_head;
  o += to_json(s);
  o += detail::memory_report_tail;
  return o;
}

}  // namespace gpukit
