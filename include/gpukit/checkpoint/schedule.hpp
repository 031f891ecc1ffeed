// SPDX-License-Identifier: Apache-2.0
// gpukit/checkpoint/schedule.hpp: checkpoint schedules (lists of Fn<i>, Fe<i>, B<i>) and the
// simulator that replays one under the cost model of gpukit/checkpoint/chain.hpp.
//
// Quick start:
//
//   #include <gpukit/checkpoint/schedule.hpp>
//
//   gpukit::checkpoint_chain chain{{{1, 2, 10, 20}, {1, 2, 10, 20}}};
//   auto s = gpukit::parse_checkpoint_schedule("Fn1 Fe2 B2 Fe1 B1");
//   gpukit::checkpoint_simulation r = gpukit::simulate_checkpoint_schedule(chain, s);
//   // r.time == 1 + 1 + 2 + 1 + 2, r.peak == the largest memory of any operation
//   std::cout << gpukit::to_string(s) << '\n';           // "Fn1 Fe2 B2 Fe1 B1"
//
// A schedule written as a list of operations drops every object (each x_j, each tape) right after
// its last use, a use reading the latest computation of that object. The simulator rejects, naming
// the offending operation, a schedule in which an operation lacks an input, backward operations
// out of the order B<L> ... B<1>, a missing backward, or an operation after B<1>.
#pragma once

#include <gpukit/checkpoint/chain.hpp>
#include <gpukit/error.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <sstream>
#include <string>
#include <vector>

namespace gpukit {

/// The three operations of the cost model.
enum class checkpoint_op_kind : std::uint8_t {
  forward,         ///< Fn<i>: forward without recording
  forward_record,  ///< Fe<i>: forward recording the tape
  backward,        ///< B<i>
};

/// One operation: a kind and a stage, 1 <= stage <= L.
struct checkpoint_op {
  checkpoint_op_kind kind{checkpoint_op_kind::forward};
  std::uint32_t stage{1};

  friend bool operator==(checkpoint_op const& x, checkpoint_op const& y) noexcept
  {
    return x.kind == y.kind && x.stage == y.stage;
  }
  friend bool operator!=(checkpoint_op const& x, checkpoint_op const& y) noexcept
  {
    return !(x == y);
  }
};

/// A schedule: operations in the order they run.
using checkpoint_schedule = std::vector<checkpoint_op>;

/// `Fn<i>`, as an op.
[[nodiscard]] constexpr checkpoint_op fn_op(std::uint32_t stage) noexcept
{
  return {checkpoint_op_kind::forward, stage};
}
/// `Fe<i>`, as an op.
[[nodiscard]] constexpr checkpoint_op fe_op(std::uint32_t stage) noexcept
{
  return {checkpoint_op_kind::forward_record, stage};
}
/// `B<i>`, as an op.
[[nodiscard]] constexpr checkpoint_op b_op(std::uint32_t stage) noexcept
{
  return {checkpoint_op_kind::backward, stage};
}

/// "Fn3", "Fe3" or "B3".
[[nodiscard]] inline std::string to_string(checkpoint_op op)
{
  char const* k = op.kind == checkpoint_op_kind::forward          ? "Fn"
                  : op.kind == checkpoint_op_kind::forward_record ? "Fe"
                                                                  : "B";
  return k + std::to_string(op.stage);
}

/// The operations separated by single spaces ("Fn1 Fe2 B2 Fe1 B1").
[[nodiscard]] inline std::string to_string(checkpoint_schedule const& schedule)
{
  std::string s;
  for (auto const& op : schedule) {
    if (!s.empty()) s += ' ';
    s += to_string(op);
  }
  return s;
}

/// Parses operations separated by blanks (`Fn1 Fe2 B2 ...`).
/// @throws gpukit::logic_error naming the word that is not an operation
[[nodiscard]] inline checkpoint_schedule parse_checkpoint_schedule(std::string const& text)
{
  checkpoint_schedule s;
  std::istringstream in{text};
  std::string word;
  while (in >> word) {
    checkpoint_op op;
    std::size_t digits = 0;
    if (word.rfind("Fn", 0) == 0) {
      op.kind = checkpoint_op_kind::forward, digits = 2;
    } else if (word.rfind("Fe", 0) == 0) {
      op.kind = checkpoint_op_kind::forward_record, digits = 2;
    } else if (word.rfind("B", 0) == 0) {
      op.kind = checkpoint_op_kind::backward, digits = 1;
    }
    bool ok = digits != 0 && word.size() > digits && word.size() - digits <= 9 &&
              word.find_first_not_of("0123456789", digits) == std::string::npos;
    GPUKIT_EXPECTS(ok, "checkpoint schedule: \"" + word +
                         "\" is not an operation (Fn<i>, Fe<i> or B<i>, i >= 1)");
    op.stage = static_cast<std::uint32_t>(std::stoul(word.substr(digits)));
    GPUKIT_EXPECTS(op.stage >= 1, "checkpoint schedule: \"" + word + "\": stages start at 1");
    s.push_back(op);
  }
  return s;
}

/// What replaying a schedule under the cost model gives.
struct checkpoint_simulation {
  std::int64_t time{0};  ///< sum of the operations' times
  std::int64_t peak{0};  ///< the largest op_peak
  /// Per operation: the memory before it plus what it creates (the peak of that operation).
  std::vector<std::int64_t> op_peak;
  /// Per operation: the memory right after it, once the objects it used last are dropped.
  std::vector<std::int64_t> after;
  /// Forward operations (Fn and Fe) beyond one per stage: the recomputations.
  std::int64_t recomputations{0};
};

namespace detail {

/// The memory at and after each operation of a replayed schedule, into r.op_peak, r.after and
/// r.peak: `diff` holds the objects' changes (the memory before op k is the sum of diff[0..k]),
/// `created` what each operation creates; the current gradient δ is added here.
inline void ckpt_memory_per_op(checkpoint_chain const& chain, checkpoint_schedule const& schedule,
                               std::vector<std::int64_t> const& diff,
                               std::vector<std::int64_t> const& created, checkpoint_simulation& r)
{
  std::size_t const n = schedule.size();
  r.op_peak.resize(n);
  r.after.resize(n);
  std::int64_t resident = 0;
  std::size_t delta     = chain.size();  // before op k: δ_{L - backwards done before k}
  for (std::size_t k = 0; k < n; ++k) {
    resident += diff[k];
    std::int64_t const before = resident + chain.gradient_size(delta);
    r.op_peak[k]              = before + created[k];
    r.peak                    = std::max(r.peak, r.op_peak[k]);
    if (schedule[k].kind == checkpoint_op_kind::backward) --delta;
    r.after[k] = resident + diff[k + 1] + chain.gradient_size(delta);
  }
}

}  // namespace detail

/// Replays `schedule` on `chain` under the cost model (objects dropped right after their last use)
/// and returns its total time and peak memory. O(number of operations + L). Does not synchronize.
/// @throws gpukit::logic_error naming the offending operation (its 0-based position and text) when
///         the schedule is invalid: a stage outside 1..L, an input that no earlier operation
///         computed (x_{i-1} for Fn/Fe/B, tape_i for B), backward operations out of the order
///         B<L> ... B<1>, an operation after B<1>, or a schedule that never reaches B<1>
[[nodiscard]] inline checkpoint_simulation simulate_checkpoint_schedule(
  checkpoint_chain const& chain, checkpoint_schedule const& schedule)
{
  std::size_t const L = chain.size();
  std::size_t const n = schedule.size();
  auto where          = [&](std::size_t k) {
    return "checkpoint schedule: operation " + std::to_string(k) + " (" + to_string(schedule[k]) +
           "): ";
  };
  // Latest instance of each object: the index of the operation that created it, or npos.
  constexpr std::size_t none = static_cast<std::size_t>(-1);
  std::vector<std::size_t> x_made(L + 1, none), tape_made(L + 1, none);
  // Each instance, once closed, adds its size to memory over (created, last use]; `last_use` of
  // the live instance is tracked per object and flushed when it is replaced or at the end.
  std::vector<std::size_t> x_last(L + 1, none), tape_last(L + 1, none);
  std::vector<std::int64_t> diff(n + 1, 0);  // memory before op k = prefix sum of diff[0..k]
  std::vector<std::int64_t> created(n, 0);
  auto close = [&](std::size_t made, std::size_t last, std::int64_t size) {
    if (made == none || last == made || size == 0) return;  // unused: counted at creation only
    diff[made + 1] += size;
    diff[last + 1] -= size;  // resident before ops made+1..last
  };
  std::size_t next_backward = L;  // B<L> first
  checkpoint_simulation r;
  std::vector<char> computed(L + 1, 0);
  for (std::size_t k = 0; k < n; ++k) {
    auto const op = schedule[k];
    GPUKIT_EXPECTS(op.stage >= 1 && op.stage <= L, where(k) + "stage " + std::to_string(op.stage) +
                                                     " is outside 1.." + std::to_string(L));
    GPUKIT_EXPECTS(next_backward >= 1, where(k) + "comes after B1, which ends the schedule");
    std::size_t const i = op.stage;
    auto const& st      = chain[i];
    // Input x_{i-1}.
    GPUKIT_EXPECTS(i == 1 || x_made[i - 1] != none, where(k) + "needs x_" + std::to_string(i - 1) +
                                                      ", which no earlier operation computed");
    if (i > 1) x_last[i - 1] = k;
    if (op.kind == checkpoint_op_kind::backward) {
      GPUKIT_EXPECTS(i == next_backward, where(k) + "runs out of order: the next backward is B" +
                                           std::to_string(next_backward));
      GPUKIT_EXPECTS(tape_made[i] != none, where(k) + "needs tape_" + std::to_string(i) +
                                             ", which no Fe" + std::to_string(i) +
                                             " before it recorded");
      tape_last[i] = k;
      close(tape_made[i], tape_last[i], st.tape_size);
      tape_made[i] = none;  // consumed
      // δ_i is freed and δ_{i-1} created: the current δ is accounted below.
      created[k] = chain.gradient_size(i - 1);
      r.time += st.backward_time;
      --next_backward;
    } else {
      // A new x_i replaces the previous instance (dropped at its last use).
      close(x_made[i], x_last[i], st.output_size);
      x_made[i] = x_last[i] = k;
      created[k]            = st.output_size;
      if (op.kind == checkpoint_op_kind::forward_record) {
        close(tape_made[i], tape_last[i], st.tape_size);
        tape_made[i] = tape_last[i] = k;
        created[k] += st.tape_size;
      }
      if (computed[i]) ++r.recomputations;
      computed[i] = 1;
      r.time += st.forward_time;
    }
  }
  GPUKIT_EXPECTS(next_backward == 0, "checkpoint schedule: ends before B" +
                                       std::to_string(next_backward) + " (" +
                                       std::to_string(L - next_backward) + " of " +
                                       std::to_string(L) + " backward operations ran)");
  for (std::size_t j = 1; j <= L; ++j) {
    close(x_made[j], x_last[j], chain[j].output_size);
    close(tape_made[j], tape_last[j], chain[j].tape_size);
  }
  detail::ckpt_memory_per_op(chain, schedule, diff, created, r);
  return r;
}

}  // namespace gpukit
