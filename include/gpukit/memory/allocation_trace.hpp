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
#include <utility>
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

/// One line of a trace being read: its text and where it is ("<source>:<line number>").
struct trace_line {
  std::string const& text;
  std::string const& where;

  /// The error for this line: its place, `why`, and the line (cut to 80 characters).
  [[nodiscard]] trace_error bad(std::string const& why) const
  {
    std::string shown = text.size() > 80 ? text.substr(0, 80) + "..." : text;
    return trace_error{where + ": " + why + ": '" + shown + "'"};
  }
};

/// What read_allocation_trace knows while it reads, line by line: the trace so far, the dense
/// names of ids and streams, and the bytes of each live id.
class trace_reader {
 public:
  explicit trace_reader(trace_limits const& limits) : limits_{limits} {}

  /// Adds the event of `line`, if it has one (not blank, not a comment). Throws trace_error.
  void read(trace_line const& line)
  {
    std::string_view rest{line.text};
    std::string_view const op = next_trace_field(rest);
    if (op.empty() || op.front() == '#') { return; }
    if (t_.events.size() == limits_.max_events) {
      throw line.bad("more than " + std::to_string(limits_.max_events) + " events");
    }
    trace_event e{};
    if (op == "a") {
      e = read_alloc(line, rest);
    } else if (op == "f") {
      e = read_free(line, rest);
    } else {
      throw line.bad("unknown event '" + std::string{op} + "' (expected 'a' or 'f')");
    }
    std::string_view const extra = next_trace_field(rest);
    if (!extra.empty()) {
      throw line.bad("unexpected '" + std::string{extra} + "' at the end of the line");
    }
    t_.events.push_back(e);
  }

  /// The whole trace; `source` names it in the error when it has no events.
  allocation_trace finish(std::string const& source) &&
  {
    if (t_.events.empty()) { throw trace_error{source + ": no events"}; }
    t_.ids     = ids_.size();
    t_.streams = streams_.size();
    return std::move(t_);
  }

 private:
  static constexpr std::size_t not_live = std::numeric_limits<std::size_t>::max();

  /// `a <id> <bytes> <stream>`, the fields after the `a` in `rest`.
  trace_event read_alloc(trace_line const& line, std::string_view& rest)
  {
    std::uint64_t name = 0, bytes = 0, stream = 0;
    if (!parse_trace_number(next_trace_field(rest), name) ||
        !parse_trace_number(next_trace_field(rest), bytes) ||
        !parse_trace_number(next_trace_field(rest), stream)) {
      throw line.bad("expected 'a <id> <bytes> <stream>' with unsigned decimal integers");
    }
    if (bytes > limits_.max_block_bytes) {
      throw line.bad("allocation of " + std::to_string(bytes) + " bytes exceeds the limit of " +
                     std::to_string(limits_.max_block_bytes));
    }
    trace_event e{};
    e.alloc = true;
    e.id    = ids_.get(name);
    e.bytes = static_cast<std::size_t>(bytes);
    if (streams_.size() == limits_.max_streams && streams_.get(stream) == limits_.max_streams) {
      throw line.bad("more than " + std::to_string(limits_.max_streams) + " distinct streams");
    }
    e.stream = static_cast<std::uint32_t>(streams_.get(stream));
    if (e.id == live_bytes_of_.size()) { live_bytes_of_.push_back(not_live); }
    if (live_bytes_of_[e.id] != not_live) {
      throw line.bad("id " + std::to_string(name) + " is allocated twice");
    }
    if (e.bytes > limits_.max_live_bytes - live_) {
      throw line.bad("live bytes exceed the limit of " + std::to_string(limits_.max_live_bytes));
    }
    live_bytes_of_[e.id] = e.bytes;
    live_ += e.bytes;
    if (live_ > t_.peak_live_bytes) { t_.peak_live_bytes = live_; }
    if (e.bytes == 0) { ++t_.zero_byte_allocs; }
    return e;
  }

  /// `f <id>`, the field after the `f` in `rest`.
  trace_event read_free(trace_line const& line, std::string_view& rest)
  {
    std::uint64_t name = 0;
    if (!parse_trace_number(next_trace_field(rest), name)) {
      throw line.bad("expected 'f <id>' with an unsigned decimal integer");
    }
    std::size_t const before = ids_.size();
    trace_event e{};
    e.id = ids_.get(name);
    if (e.id == before || live_bytes_of_[e.id] == not_live) {
      throw line.bad("free of id " + std::to_string(name) + ", which is not live");
    }
    live_ -= live_bytes_of_[e.id];
    live_bytes_of_[e.id] = not_live;
    return e;
  }

  trace_limits const& limits_;
  allocation_trace t_;
  dense_names ids_, streams_;
  std::vector<std::size_t> live_bytes_of_;  // by dense id; not_live: not live
  std::size_t live_{0};
};

}  // namespace detail

/// Reads and validates a whole trace from `in`; `source` names it in errors. Throws trace_error.
inline allocation_trace read_allocation_trace(std::istream& in, std::string const& source,
                                              trace_limits const& limits = {})
{
  detail::trace_reader reader{limits};
  std::string line;
  for (std::size_t no = 1;; ++no) {
    std::string const where = source + ":" + std::to_string(no);
    if (!detail::read_trace_line(in, line, limits.max_line_chars, where)) { break; }
    reader.read(detail::trace_line{line, where});
  }
  return std::move(reader).finish(source);
}

}  // namespace gpukit
