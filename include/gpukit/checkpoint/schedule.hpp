// SPDX-License-Identifier: Apache-2.0
// gpukit/checkpoint/schedule.hpp: checkpoint schedules (lists of Fn<i>, Fe<i>, B<i>) and the
// simulator that replays one under the cost model of gpukit/checkpoint/chain.hpp, offload and
// prefetch copies (O<j>, P<j>) included.
//
// Quick start:
//
//   #include <gpukit/checkpoint/schedule.hpp>
//
//   #include <iostream>
//
//   void replay_two_stages()
//   {
//     gpukit::checkpoint_chain chain{{{1, 2, 10, 20}, {1, 2, 10, 20}}};
//     gpukit::checkpoint_schedule s = gpukit::parse_checkpoint_schedule("Fn1 Fe2 B2 Fe1 B1");
//     gpukit::checkpoint_simulation r = gpukit::simulate_checkpoint_schedule(chain, s);
//     // r.time == 1 + 1 + 2 + 1 + 2, r.peak == the largest memory of any operation
//     std::cout << gpukit::to_string(s) << ": time " << r.time << ", peak " << r.peak << '\n';
//   }
//
// A schedule written as a list of operations drops every object (each x_j, each tape) right after
// its last use, a use reading the latest computation of that object. The simulator rejects, naming
// the offending operation, a schedule in which an operation lacks an input, backward operations
// out of the order B<L> ... B<1>, a missing backward, or an operation after B<1>.
#pragma once

#include <gpukit/checkpoint/chain.hpp>
#include <gpukit/error.hpp>
#include <gpukit/error_macros.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <sstream>
#include <string>
#include <vector>

namespace gpukit {

/// The operations of the cost model: three on the compute stream, two copies on the copy stream.
enum class checkpoint_op_kind : std::uint8_t {
  forward,         ///< Fn<i>: forward without recording
  forward_record,  ///< Fe<i>: forward recording the tape
  backward,        ///< B<i>
  offload,         ///< O<j>: copy x_j to pinned host memory; its device copy is freed after
  prefetch,        ///< P<j>: copy x_j back to the device; its next use waits for the copy
};

/// Whether `kind` is a copy (offload or prefetch) rather than a compute operation.
[[nodiscard]] constexpr bool is_copy(checkpoint_op_kind kind) noexcept
{
  return kind == checkpoint_op_kind::offload || kind == checkpoint_op_kind::prefetch;
}

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

/// `O<j>`, as an op.
[[nodiscard]] constexpr checkpoint_op offload_op(std::uint32_t stage) noexcept
{
  return {checkpoint_op_kind::offload, stage};
}
/// `P<j>`, as an op.
[[nodiscard]] constexpr checkpoint_op prefetch_op(std::uint32_t stage) noexcept
{
  return {checkpoint_op_kind::prefetch, stage};
}

/// "Fn3", "Fe3", "B3", "O3" or "P3".
[[nodiscard]] inline std::string to_string(checkpoint_op op)
{
  char const* k = op.kind == checkpoint_op_kind::forward          ? "Fn"
                  : op.kind == checkpoint_op_kind::forward_record ? "Fe"
                  : op.kind == checkpoint_op_kind::backward       ? "B"
                  : op.kind == checkpoint_op_kind::offload        ? "O"
                                                                  : "P";
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

/// Parses operations separated by blanks (`Fn1 Fe2 O1 B2 P1 ...`).
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
    } else if (word.rfind("O", 0) == 0) {
      op.kind = checkpoint_op_kind::offload, digits = 1;
    } else if (word.rfind("P", 0) == 0) {
      op.kind = checkpoint_op_kind::prefetch, digits = 1;
    }
    bool ok = digits != 0 && word.size() > digits && word.size() - digits <= 9 &&
              word.find_first_not_of("0123456789", digits) == std::string::npos;
    GPUKIT_EXPECTS(ok, "checkpoint schedule: \"" + word +
                         "\" is not an operation (Fn<i>, Fe<i>, B<i>, O<i> or P<i>, i >= 1)");
    op.stage = static_cast<std::uint32_t>(std::stoul(word.substr(digits)));
    GPUKIT_EXPECTS(op.stage >= 1, "checkpoint schedule: \"" + word + "\": stages start at 1");
    s.push_back(op);
  }
  return s;
}

/// What replaying a schedule under the cost model gives.
struct checkpoint_simulation {
  std::int64_t time{0};  ///< when the compute stream finishes (operations' times and waits)
  std::int64_t peak{0};  ///< the largest op_peak: device memory; host copies are not counted
  /// Per operation: the memory before it plus what it creates (the peak of that operation).
  std::vector<std::int64_t> op_peak;
  /// Per operation: the memory right after it, once the objects it used last are dropped.
  std::vector<std::int64_t> after;
  /// Forward operations (Fn and Fe) beyond one per stage: the recomputations.
  std::int64_t recomputations{0};
  std::int64_t offloads{0};   ///< O<j> operations
  std::int64_t copy_time{0};  ///< time the copy stream is busy (offloads and prefetches)
  std::int64_t stall{0};      ///< time the compute stream waits for prefetches
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

/// The replay behind simulate_checkpoint_schedule: one pass over the operations for validity and
/// the two streams' clocks, then the memory of every object instance from when it was created
/// (or prefetched) to its last use (or, offloaded, to the end of its copy).
class ckpt_replay {
 public:
  ckpt_replay(checkpoint_chain const& chain, checkpoint_schedule const& schedule)
      : chain_{chain}, s_{schedule}, L_{chain.size()}, n_{schedule.size()}, x_made_(L_ + 1, none),
        tape_made_(L_ + 1, none), x_last_(L_ + 1, none), tape_last_(L_ + 1, none),
        on_host_(L_ + 1, 0), computed_(L_ + 1, 0), ready_(L_ + 1, 0), diff_(n_ + 1, 0),
        created_(n_, 0), start_(n_, 0)
  {}

  checkpoint_simulation run()
  {
    for (std::size_t k = 0; k < n_; ++k) step(k);
    GPUKIT_EXPECTS(next_backward_ == 0, "checkpoint schedule: ends before B" +
                                          std::to_string(next_backward_) + " (" +
                                          std::to_string(L_ - next_backward_) + " of " +
                                          std::to_string(L_) + " backward operations ran)");
    for (std::size_t j = 1; j <= L_; ++j) {
      close(x_made_[j], x_last_[j], chain_[j].output_size);
      close(tape_made_[j], tape_last_[j], chain_[j].tape_size);
    }
    for (auto const& o : offloaded_) {
      // Resident until its last use and until its copy ends: through every operation that starts
      // before the copy's end.
      auto const ends = static_cast<std::size_t>(
        std::lower_bound(start_.begin(), start_.end(), o.copy_end) - start_.begin());
      close(o.made, std::max(o.last, ends == 0 ? o.last : ends - 1), o.size);
    }
    r_.time = clock_;
    detail::ckpt_memory_per_op(chain_, s_, diff_, created_, r_);
    return r_;
  }

 private:
  static constexpr std::size_t none = static_cast<std::size_t>(-1);
  struct offloaded {
    std::size_t made, last;
    std::int64_t copy_end, size;
  };

  [[nodiscard]] std::string where(std::size_t k) const
  {
    return "checkpoint schedule: operation " + std::to_string(k) + " (" + to_string(s_[k]) + "): ";
  }
  // Each instance, once closed, adds its size to memory over (created, last use].
  void close(std::size_t made, std::size_t last, std::int64_t size)
  {
    if (made == none || last == made || size == 0) return;  // unused: counted at creation only
    diff_[made + 1] += size;
    diff_[last + 1] -= size;  // resident before ops made+1..last
  }
  // x_j, on the device, read by operation k (which starts no earlier than it is there).
  void use_x(std::size_t k, std::size_t j)
  {
    if (j == 0) return;
    GPUKIT_EXPECTS(!on_host_[j], where(k) + "needs x_" + std::to_string(j) +
                                   ", which is on the host: prefetch it (P" + std::to_string(j) +
                                   ") first");
    GPUKIT_EXPECTS(x_made_[j] != none, where(k) + "needs x_" + std::to_string(j) +
                                         ", which no earlier operation computed");
    x_last_[j] = k;
    clock_     = std::max(clock_, ready_[j]);
  }

  void step(std::size_t k)
  {
    auto const op = s_[k];
    GPUKIT_EXPECTS(op.stage >= 1 && op.stage <= L_, where(k) + "stage " + std::to_string(op.stage) +
                                                      " is outside 1.." + std::to_string(L_));
    GPUKIT_EXPECTS(next_backward_ >= 1, where(k) + "comes after B1, which ends the schedule");
    std::size_t const i = op.stage;
    if (is_copy(op.kind)) {
      copy(k, i, op.kind == checkpoint_op_kind::offload);
      return;
    }
    std::int64_t const before = clock_;
    use_x(k, i - 1);
    r_.stall += clock_ - before;
    start_[k]      = clock_;
    auto const& st = chain_[i];
    if (op.kind == checkpoint_op_kind::backward) {
      GPUKIT_EXPECTS(i == next_backward_, where(k) + "runs out of order: the next backward is B" +
                                            std::to_string(next_backward_));
      GPUKIT_EXPECTS(tape_made_[i] != none, where(k) + "needs tape_" + std::to_string(i) +
                                              ", which no Fe" + std::to_string(i) +
                                              " before it recorded");
      close(tape_made_[i], k, st.tape_size);
      tape_made_[i] = none;  // consumed; δ_i is freed and δ_{i-1} created (see ckpt_memory_per_op)
      created_[k]   = chain_.gradient_size(i - 1);
      clock_ += st.backward_time;
      --next_backward_;
      return;
    }
    // A new x_i replaces the previous instance (dropped at its last use) or its host copy.
    close(x_made_[i], x_last_[i], st.output_size);
    x_made_[i] = x_last_[i] = k;
    on_host_[i]             = 0;
    ready_[i]               = 0;
    created_[k]             = st.output_size;
    if (op.kind == checkpoint_op_kind::forward_record) {
      close(tape_made_[i], tape_last_[i], st.tape_size);
      tape_made_[i] = tape_last_[i] = k;
      created_[k] += st.tape_size;
    }
    if (computed_[i]) ++r_.recomputations;
    computed_[i] = 1;
    clock_ += st.forward_time;
  }

  // O<j> (out) or P<j>: issued when the compute stream reaches it, run when the copy stream is
  // free.
  void copy(std::size_t k, std::size_t j, bool out)
  {
    GPUKIT_EXPECTS(
      chain_.copy_bandwidth() > 0,
      where(k) + "copies x_" + std::to_string(j) +
        ", but the chain has no copy bandwidth (checkpoint_chain::set_copy_bandwidth)");
    start_[k]                 = clock_;
    std::int64_t const begins = std::max({copy_clock_, clock_, out ? ready_[j] : 0});
    copy_clock_               = begins + chain_.copy_time(j);
    r_.copy_time += chain_.copy_time(j);
    if (out) {
      GPUKIT_EXPECTS(x_made_[j] != none && !on_host_[j],
                     where(k) + "offloads x_" + std::to_string(j) + ", which is not on the device");
      offloaded_.push_back({x_made_[j], x_last_[j], copy_clock_, chain_[j].output_size});
      x_made_[j] = x_last_[j] = none;
      on_host_[j]             = 1;
      ++r_.offloads;
      return;
    }
    GPUKIT_EXPECTS(on_host_[j], where(k) + "prefetches x_" + std::to_string(j) +
                                  ", which is not on the host (no O" + std::to_string(j) +
                                  " since it was computed)");
    x_made_[j] = x_last_[j] = k;  // device memory from here on
    on_host_[j]             = 0;
    ready_[j]               = copy_clock_;
    created_[k]             = chain_[j].output_size;
  }

  checkpoint_chain const& chain_;
  checkpoint_schedule const& s_;
  std::size_t L_, n_;
  // Latest instance of each object: the index of the operation that created it, or none.
  std::vector<std::size_t> x_made_, tape_made_, x_last_, tape_last_;
  std::vector<char> on_host_, computed_;
  std::vector<std::int64_t> ready_;  ///< when a prefetched x_j is on the device
  std::vector<std::int64_t> diff_;   ///< memory before op k = prefix sum of diff_[0..k]
  std::vector<std::int64_t> created_;
  std::vector<std::int64_t> start_;  ///< when each operation starts (copies: when issued)
  std::vector<offloaded> offloaded_;
  std::size_t next_backward_{L_};  // B<L> first
  std::int64_t clock_{0}, copy_clock_{0};
  checkpoint_simulation r_;
};

}  // namespace detail

/// Replays `schedule` on `chain` under the cost model (objects dropped right after their last use)
/// and returns its total time and peak memory. O(number of operations + L). Does not synchronize.
///
/// Copies (the two-stream model): the compute operations run one after another on the compute
/// stream; O<j> and P<j> are issued when the compute stream reaches them and run, one at a time in
/// issue order, on a copy stream, each taking chain.copy_time(j), so they overlap compute. An
/// offloaded x_j stays on the device through every operation that starts before its copy ends,
/// then only its host copy remains (not counted in the peak) until P<j> allocates it on the device
/// again; the first operation that reads it waits for that copy (the wait adds to time and to
/// stall). A new Fn<j>/Fe<j> replaces a host copy as it replaces a device one.
/// @throws gpukit::logic_error naming the offending operation (its 0-based position and text) when
///         the schedule is invalid: a stage outside 1..L, an input that no earlier operation
///         computed (x_{i-1} for Fn/Fe/B, tape_i for B) or that is on the host, backward operations
///         out of the order B<L> ... B<1>, an operation after B<1>, a schedule that never reaches
///         B<1>, an offload of an x_j not on the device, a prefetch of one not on the host, or a
///         copy on a chain without copy bandwidth
[[nodiscard]] inline checkpoint_simulation simulate_checkpoint_schedule(
  checkpoint_chain const& chain, checkpoint_schedule const& schedule)
{
  return detail::ckpt_replay{chain, schedule}.run();
}

}  // namespace gpukit
