// SPDX-License-Identifier: Apache-2.0
// gpukit/memory/allocation_trace.hpp: reads allocation traces (the format `to_trace` writes and
// PyTorch traces are converted to) with every value checked, so a trace from anywhere can be
// replayed safely.
//
// Quick start:
//
//   #include <gpukit/memory/allocation_trace.hpp>
//
//   #include <fstream>
//
//   void replay()
//   {
//     std::ifstream in{"gpt2.trace"};
//     gpukit::allocation_trace t = gpukit::read_allocation_trace(in, "gpt2.trace");
//     for (gpukit::trace_event const& e : t.events) {
//       if (e.alloc) { /* allocate e.bytes on stream e.stream, remember it as e.id */ }
//       else         { /* free e.id */ }
//     }
//     // t.ids, t.streams: how many distinct ids and streams (both renumbered densely from 0)
//     // t.peak_live_bytes: the most requested bytes live at once
//   }
//
// Format: one event a line, `a <id> <bytes> <stream>` for an allocation and `f <id>` for its free;
// blank lines and lines whose first non-blank character is `#` are skipped. Numbers are unsigned
// decimal integers. Ids and streams may be any such number (up to 2^64 - 1): they are renumbered
// densely in order of first appearance, so a replay can index arrays by them.
//
// Errors: `trace_error` (a std::runtime_error) naming the source, the line number and the line
// (cut to 80 characters): a malformed line, a number out of range, an id allocated twice or freed
// while not live, more distinct streams or bytes than `trace_limits` allow, a line longer than
// `max_line_chars` (so a binary file or /dev/zero is refused at once instead of read into memory),
// or no events at all.
#pragma once

#include <charconv>
#include <cstddef>
#include <cstdint>
#include <istream>
#include <limits>
#include <stdexcept>
#include <string>
#include <string_view>
#include <system_error>
#include <unordered_map>
#include <vector>

namespace gpukit {

/// One event of a trace; `id` and `stream` are dense (0, 1, 2, ... in order of first appearance).
struct trace_event {
  bool alloc{false};
  std::uint32_t stream{0};  ///< allocations only
  std::size_t id{0};
  std::size_t bytes{0};  ///< allocations only
};

/// A whole trace, validated.
struct allocation_trace {
  std::vector<trace_event> events;
  std::size_t ids{0};      ///< distinct ids (ids of blocks freed and allocated again count once)
  std::size_t streams{0};  ///< distinct streams
  std::size_t peak_live_bytes{0};
  std::size_t zero_byte_allocs{0};
};

/// What read_allocation_trace accepts.
struct trace_limits {
  std::size_t max_line_chars{4096};
  std::size_t max_block_bytes{std::size_t{1} << 48};  ///< one allocation: 256 TiB
  std::size_t max_live_bytes{std::size_t{1} << 52};   ///< all live at once: 4 PiB
  std::size_t max_streams{1024};
  std::size_t max_events{std::size_t{1} << 28};
};

/// A malformed or out-of-range trace; what() names the source, line and reason.
class trace_error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

namespace detail {

/// Reads one line into `line` (without its newline); false at the end of the input. Throws when
/// the line is longer than `limit` characters, before reading the rest of it.
inline bool read_trace_line(std::istream& in, std::string& line, std::size_t limit,
                            std::string const& where)
{
  line.clear();
  std::streambuf* buf = in.rdbuf();
  if (buf == nullptr) { return false; }
  using traits = std::char_traits<char>;
  for (;;) {
    traits::int_type const c = buf->sbumpc();
    if (traits::eq_int_type(c, traits::eof())) { return !line.empty(); }
    char const ch = traits::to_char_type(c);
    if (ch == '\n') { return true; }
    if (line.size() == limit) {
      throw trace_error{where + ": line longer than " + std::to_string(limit) +
                        " characters (not a trace?)"};
    }
    line.push_back(ch);
  }
}

/// The next blank-separated field of `rest`, consumed; empty at the end.
inline std::string_view next_trace_field(std::string_view& rest)
{
  auto const begin = rest.find_first_not_of(" \t\r");
  if (begin == std::string_view::npos) {
    rest = {};
    return {};
  }
  rest.remove_prefix(begin);
  auto const end         = rest.find_first_of(" \t\r");
  std::string_view field = rest.substr(0, end);
  rest.remove_prefix(end == std::string_view::npos ? rest.size() : end);
  return field;
}

/// An unsigned decimal number filling the whole field, or false.
inline bool parse_trace_number(std::string_view field, std::uint64_t& out)
{
  if (field.empty() || field.front() < '0' || field.front() > '9') { return false; }
  auto const [end, ec] = std::from_chars(field.data(), field.data() + field.size(), out);
  return ec == std::errc{} && end == field.data() + field.size();
}

/// Dense renumbering of arbitrary 64-bit names.
class dense_names {
 public:
  [[nodiscard]] std::size_t size() const noexcept { return map_.size(); }
  /// The dense number of `name`, adding it when new.
  std::size_t get(std::uint64_t name) { return map_.try_emplace(name, map_.size()).first->second; }

 private:
  std::unordered_map<std::uint64_t, std::size_t> map_;
};

}  // namespace detail

/// Reads and validates a whole trace from `in`; `source` names it in errors. Throws trace_error.
inline allocation_trace read_allocation_trace(std::istream& in, std::string const& source,
                                              trace_limits const& limits = {})
{
  allocation_trace t;
  detail::dense_names ids, streams;
  std::vector<std::size_t> live_bytes_of;  // by dense id; SIZE_MAX: not live
  constexpr std::size_t not_live = std::numeric_limits<std::size_t>::max();
  std::size_t live               = 0;
  std::string line;
  for (std::size_t no = 1;; ++no) {
    std::string const where = source + ":" + std::to_string(no);
    if (!detail::read_trace_line(in, line, limits.max_line_chars, where)) { break; }
    auto bad = [&](std::string const& why) {
      std::string shown = line.size() > 80 ? line.substr(0, 80) + "..." : line;
      return trace_error{where + ": " + why + ": '" + shown + "'"};
    };
    std::string_view rest{line};
    std::string_view const op = detail::next_trace_field(rest);
    if (op.empty() || op.front() == '#') { continue; }
    if (t.events.size() == limits.max_events) {
      throw bad("more than " + std::to_string(limits.max_events) + " events");
    }
    std::uint64_t name = 0;
    trace_event e{};
    if (op == "a") {
      std::uint64_t bytes = 0, stream = 0;
      if (!detail::parse_trace_number(detail::next_trace_field(rest), name) ||
          !detail::parse_trace_number(detail::next_trace_field(rest), bytes) ||
          !detail::parse_trace_number(detail::next_trace_field(rest), stream)) {
        throw bad("expected 'a <id> <bytes> <stream>' with unsigned decimal integers");
      }
      if (bytes > limits.max_block_bytes) {
        throw bad("allocation of " + std::to_string(bytes) + " bytes exceeds the limit of " +
                  std::to_string(limits.max_block_bytes));
      }
      e.alloc = true;
      e.id    = ids.get(name);
      e.bytes = static_cast<std::size_t>(bytes);
      if (streams.size() == limits.max_streams && streams.get(stream) == limits.max_streams) {
        throw bad("more than " + std::to_string(limits.max_streams) + " distinct streams");
      }
      e.stream = static_cast<std::uint32_t>(streams.get(stream));
      if (e.id == live_bytes_of.size()) { live_bytes_of.push_back(not_live); }
      if (live_bytes_of[e.id] != not_live) {
        throw bad("id " + std::to_string(name) + " is allocated twice");
      }
      if (e.bytes > limits.max_live_bytes - live) {
        throw bad("live bytes exceed the limit of " + std::to_string(limits.max_live_bytes));
      }
      live_bytes_of[e.id] = e.bytes;
      live += e.bytes;
      if (live > t.peak_live_bytes) { t.peak_live_bytes = live; }
      if (e.bytes == 0) { ++t.zero_byte_allocs; }
    } else if (op == "f") {
      if (!detail::parse_trace_number(detail::next_trace_field(rest), name)) {
        throw bad("expected 'f <id>' with an unsigned decimal integer");
      }
      std::size_t const before = ids.size();
      e.id                     = ids.get(name);
      if (e.id == before || live_bytes_of[e.id] == not_live) {
        throw bad("free of id " + std::to_string(name) + ", which is not live");
      }
      live -= live_bytes_of[e.id];
      live_bytes_of[e.id] = not_live;
    } else {
      throw bad("unknown event '" + std::string{op} + "' (expected 'a' or 'f')");
    }
    std::string_view const extra = detail::next_trace_field(rest);
    if (!extra.empty()) {
      throw bad("unexpected '" + std::string{extra} + "' at the end of the line");
    }
    t.events.push_back(e);
  }
  if (t.events.empty()) { throw trace_error{source + ": no events"}; }
  t.ids     = ids.size();
  t.streams = streams.size();
  return t;
}

}  // namespace gpukit
