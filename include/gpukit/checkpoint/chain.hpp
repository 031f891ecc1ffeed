// SPDX-License-Identifier: Apache-2.0
// gpukit/checkpoint/chain.hpp: a chain of stages to checkpoint, in the cost model of the planners.
//
// Quick start:
//
//   #include <gpukit/checkpoint/chain.hpp>
//
//   #include <sstream>
//
//   gpukit::checkpoint_chain three_stages()
//   {
//     // Stage i: forward time f, backward time b, output size a (x_i, and its gradient),
//     // tape size t (what a recording forward keeps for the backward, not counting its
//     // input). Any integer units: e.g. microseconds and MiB.
//     gpukit::checkpoint_chain chain{{{2, 4, 16, 48}, {2, 4, 16, 48}, {1, 2, 64, 64}}};
//     std::istringstream text{"2 4 16 48\n2 4 16 48\n1 2 64 64\n"};
//     // one stage a line: f b a t
//     gpukit::checkpoint_chain same = gpukit::parse_checkpoint_chain(text);
//     return same.size() == chain.size() ? same : chain;
//   }
//
// ## The cost model
//
// A chain of L stages; stage i (1-based) has forward time f_i, backward time b_i, output size a_i
// (x_i, and its gradient δ_i has the same size) and tape size t_i. Operations:
// - `Fn<i>`: forward without recording: needs x_{i-1}, creates x_i; time f_i.
// - `Fe<i>`: forward recording: needs x_{i-1}, creates x_i and tape_i; time f_i.
// - `B<i>`:  backward: needs x_{i-1}, tape_i and δ_i; creates δ_{i-1}; frees tape_i and δ_i;
//   time b_i. Backward runs B<L> ... B<1>.
// x_0 (the batch) is always resident and not counted; δ_L and δ_0 have size 0. Memory = resident
// x_j (j >= 1) + resident tapes + the current δ; the peak of an operation is the memory before it
// plus what it creates. A schedule written as a list of operations drops every object right after
// its last use (gpukit/checkpoint/schedule.hpp simulates it).
#pragma once

#include <gpukit/error.hpp>
#include <gpukit/error_macros.hpp>

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <istream>
#include <limits>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

namespace gpukit {

/// One stage of a chain: forward time, backward time, output size, tape size. Non-negative.
struct checkpoint_stage {
  std::int64_t forward_time{0};   ///< f_i
  std::int64_t backward_time{0};  ///< b_i
  std::int64_t output_size{0};    ///< a_i: the size of x_i and of δ_i
  std::int64_t tape_size{0};      ///< t_i: what `Fe<i>` keeps for `B<i>`, not counting x_{i-1}
};

/// Thrown by a planner when no plan of its kind fits the memory budget. `minimum_budget()` is the
/// least budget that planner accepts for this chain (what to raise the budget to).
class checkpoint_infeasible : public logic_error {
 public:
  /// @param message what did not fit, without the "gpukit: " prefix (the error adds it)
  /// @param minimum_budget the least budget at which the planner finds a plan
  checkpoint_infeasible(std::string const& message, std::int64_t minimum_budget)
      : logic_error{"gpukit: " + message}, minimum_budget_{minimum_budget}
  {}
  /// The least budget at which the planner that threw finds a plan.
  [[nodiscard]] std::int64_t minimum_budget() const noexcept { return minimum_budget_; }

 private:
  std::int64_t minimum_budget_;
};

/// A validated chain of L >= 1 stages. Stages are numbered 1..L as in the cost model.
class checkpoint_chain {
 public:
  /// Largest value any time or size may take, and the largest sum of all times (or all sizes) of a
  /// chain: planners add up to L times the total, so totals stay far from overflow.
  static constexpr std::int64_t max_total = std::int64_t{1} << 46;
  /// Longest chain the planners accept.
  static constexpr std::size_t max_stages = std::size_t{1} << 14;
  /// A copy bandwidth at which every copy takes no time.
  static constexpr std::int64_t infinite_bandwidth = std::numeric_limits<std::int64_t>::max();

  /// A chain of the given stages.
  /// @throws gpukit::logic_error naming the stage and the value when a time or size is negative,
  ///         when the chain is empty or longer than max_stages, or when a total exceeds max_total
  explicit checkpoint_chain(std::vector<checkpoint_stage> stages) : stages_{std::move(stages)}
  {
    validate();
  }
  checkpoint_chain(std::initializer_list<checkpoint_stage> stages)
      : checkpoint_chain{std::vector<checkpoint_stage>(stages)}
  {}

  /// A homogeneous chain of `length` identical stages.
  /// @throws gpukit::logic_error as the constructor
  [[nodiscard]] static checkpoint_chain uniform(std::size_t length, checkpoint_stage stage)
  {
    return checkpoint_chain{std::vector<checkpoint_stage>(length, stage)};
  }

  /// L, the number of stages.
  [[nodiscard]] std::size_t size() const noexcept { return stages_.size(); }
  /// Stage i, 1 <= i <= L (unchecked).
  [[nodiscard]] checkpoint_stage const& operator[](std::size_t i) const noexcept
  {
    return stages_[i - 1];
  }
  /// Stage i, 1 <= i <= L. @throws gpukit::logic_error naming i when out of range
  [[nodiscard]] checkpoint_stage const& at(std::size_t i) const
  {
    GPUKIT_EXPECTS(i >= 1 && i <= stages_.size(), "checkpoint_chain: stage " + std::to_string(i) +
                                                    " is out of range 1.." +
                                                    std::to_string(stages_.size()));
    return stages_[i - 1];
  }
  [[nodiscard]] std::vector<checkpoint_stage> const& stages() const noexcept { return stages_; }

  /// Size of x_j (0 for x_0, which is always resident and not counted).
  [[nodiscard]] std::int64_t activation_size(std::size_t j) const noexcept
  {
    return j == 0 ? 0 : stages_[j - 1].output_size;
  }
  /// Size of δ_j: a_j for 1 <= j < L, 0 for δ_0 and δ_L.
  [[nodiscard]] std::int64_t gradient_size(std::size_t j) const noexcept
  {
    return (j == 0 || j >= stages_.size()) ? 0 : stages_[j - 1].output_size;
  }
  /// Size units copied between device and pinned host memory per time unit; 0 (the default) when
  /// the chain has none, so that schedules with offload operations are refused;
  /// infinite_bandwidth when copies take no time.
  [[nodiscard]] std::int64_t copy_bandwidth() const noexcept { return copy_bandwidth_; }
  /// Sets copy_bandwidth(). @throws gpukit::logic_error naming the value when it is negative
  void set_copy_bandwidth(std::int64_t bandwidth)
  {
    GPUKIT_EXPECTS(bandwidth >= 0, "checkpoint_chain: copy bandwidth " + std::to_string(bandwidth) +
                                     " is negative");
    copy_bandwidth_ = bandwidth;
  }
  /// Time of one copy of x_j (either way): ceil(a_j / copy_bandwidth()), 0 at infinite bandwidth.
  /// Requires copy_bandwidth() > 0.
  [[nodiscard]] std::int64_t copy_time(std::size_t j) const noexcept
  {
    if (copy_bandwidth_ == infinite_bandwidth) return 0;
    return (activation_size(j) + copy_bandwidth_ - 1) / copy_bandwidth_;
  }
  /// Sum of f_i + b_i: the time of storing everything, a lower bound for every schedule.
  [[nodiscard]] std::int64_t compute_time() const noexcept
  {
    std::int64_t t = 0;
    for (auto const& s : stages_) t += s.forward_time + s.backward_time;
    return t;
  }

 private:
  void validate() const
  {
    GPUKIT_EXPECTS(!stages_.empty(), "checkpoint_chain: a chain needs at least one stage");
    GPUKIT_EXPECTS(stages_.size() <= max_stages,
                   "checkpoint_chain: " + std::to_string(stages_.size()) +
                     " stages exceed the limit of " + std::to_string(max_stages));
    std::int64_t time = 0, size = 0;
    for (std::size_t i = 0; i < stages_.size(); ++i) {
      auto const& s                             = stages_[i];
      std::pair<char const*, std::int64_t> v[4] = {{"forward time f", s.forward_time},
                                                   {"backward time b", s.backward_time},
                                                   {"output size a", s.output_size},
                                                   {"tape size t", s.tape_size}};
      for (auto const& [name, value] : v) {
        GPUKIT_EXPECTS(value >= 0 && value <= max_total,
                       "checkpoint_chain: stage " + std::to_string(i + 1) + " has " + name + " = " +
                         std::to_string(value) +
                         (value < 0 ? ", which is negative" : ", which exceeds 2^46"));
      }
      time += s.forward_time + s.backward_time;
      size += s.output_size + s.tape_size;
      GPUKIT_EXPECTS(time <= max_total && size <= max_total,
                     "checkpoint_chain: the total " +
                       std::string{time > max_total ? "time" : "size"} + " of stages 1.." +
                       std::to_string(i + 1) + " exceeds 2^46");
    }
  }

  std::vector<checkpoint_stage> stages_;
  std::int64_t copy_bandwidth_{0};
};

namespace detail {

/// The value of a `bandwidth N` line of a chain text (N a positive integer or `inf`).
inline std::int64_t ckpt_parse_bandwidth(std::string const& line, std::size_t number)
{
  std::istringstream fields{line};
  std::string name, value, extra;
  fields >> name >> value;
  bool const digits = !value.empty() && value.size() <= 18 &&
                      value.find_first_not_of("0123456789") == std::string::npos;
  GPUKIT_EXPECTS(name == "bandwidth" && (digits || value == "inf") && !(fields >> extra) &&
                   (value == "inf" || std::stoll(value) > 0),
                 "checkpoint chain: line " + std::to_string(number) +
                   ": expected \"bandwidth N\" (N a positive integer below 10^18, or inf): \"" +
                   line + "\"");
  return value == "inf" ? checkpoint_chain::infinite_bandwidth : std::stoll(value);
}

}  // namespace detail

/// Reads a chain, one stage a line: `f b a t` (four non-negative integers separated by blanks).
/// Blank lines and lines starting with `#` are skipped. A line `bandwidth N` (N a positive
/// integer, or `inf`) sets the chain's copy bandwidth.
/// @throws gpukit::logic_error naming the line and the offending text for malformed input or a
///         negative or too large value, and as checkpoint_chain's constructor for bad totals
[[nodiscard]] inline checkpoint_chain parse_checkpoint_chain(std::istream& in)
{
  std::vector<checkpoint_stage> stages;
  std::string line;
  std::int64_t bandwidth = 0;
  for (std::size_t number = 1; std::getline(in, line); ++number) {
    auto const first = line.find_first_not_of(" \t\r");
    if (first == std::string::npos || line[first] == '#') continue;
    if (line.compare(first, 9, "bandwidth") == 0) {
      bandwidth = detail::ckpt_parse_bandwidth(line, number);
      continue;
    }
    std::istringstream fields{line};
    std::int64_t v[4];
    std::string word;
    for (int k = 0; k < 4; ++k) {
      GPUKIT_EXPECTS(static_cast<bool>(fields >> word),
                     "checkpoint chain: line " + std::to_string(number) + " has " +
                       std::to_string(k) + " fields, expected 4 (f b a t): \"" + line + "\"");
      std::size_t used = 0;
      bool ok          = word.find_first_not_of("0123456789") == std::string::npos ||
                (word[0] == '-' && word.size() > 1 &&
                 word.find_first_not_of("0123456789", 1) == std::string::npos);
      if (ok) {
        try {
          v[k] = std::stoll(word, &used);
        } catch (std::exception const&) {
          ok = false;
        }
      }
      GPUKIT_EXPECTS(ok && used == word.size(), "checkpoint chain: line " + std::to_string(number) +
                                                  ": \"" + word + "\" is not an integer");
    }
    GPUKIT_EXPECTS(!(fields >> word), "checkpoint chain: line " + std::to_string(number) +
                                        " has more than 4 fields (f b a t): \"" + line + "\"");
    char const* names[4] = {"forward time f", "backward time b", "output size a", "tape size t"};
    for (int k = 0; k < 4; ++k) {
      GPUKIT_EXPECTS(v[k] >= 0 && v[k] <= checkpoint_chain::max_total,
                     "checkpoint chain: line " + std::to_string(number) + ": " + names[k] + " = " +
                       std::to_string(v[k]) + (v[k] < 0 ? " is negative" : " exceeds 2^46"));
    }
    stages.push_back({v[0], v[1], v[2], v[3]});
  }
  checkpoint_chain chain{std::move(stages)};
  chain.set_copy_bandwidth(bandwidth);
  return chain;
}

}  // namespace gpukit
