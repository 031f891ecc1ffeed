// SPDX-License-Identifier: Apache-2.0
// gpukit/checkpoint/detail/offload.hpp: offload and prefetch copies inserted into a schedule.
// Not public API; behind plan_with_offload.
#pragma once

#include <gpukit/checkpoint/chain.hpp>
#include <gpukit/checkpoint/schedule.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

namespace gpukit::detail {

/// How ckpt_insert_copies chooses.
struct ckpt_copy_policy {
  /// Offload only where the compute between the two touches is at least twice the copy time (both
  /// copies hidden); otherwise wherever at least two operations lie between them.
  bool hidden_only{false};
  /// P<j> is issued this many compute operations before the one that reads x_j (0: right before
  /// it, which waits for the whole copy).
  std::size_t lookahead{1};
};

/// The compute time of the operations [0, k) of `schedule`, for k = 0 .. schedule.size().
inline std::vector<std::int64_t> ckpt_elapsed(checkpoint_chain const& chain,
                                              checkpoint_schedule const& schedule)
{
  std::vector<std::int64_t> elapsed(schedule.size() + 1, 0);
  for (std::size_t k = 0; k < schedule.size(); ++k) {
    auto const& st = chain[schedule[k].stage];
    elapsed[k + 1] =
      elapsed[k] +
      (schedule[k].kind == checkpoint_op_kind::backward ? st.backward_time : st.forward_time);
  }
  return elapsed;
}

/// ckpt_insert_copies' walk over a schedule: the current instance of each activation x_j (its
/// last touch and its best stretch without touches so far), and the copies placed before and after
/// each operation for the instances that ended.
class ckpt_copy_placer {
 public:
  ckpt_copy_placer(checkpoint_chain const& chain, checkpoint_schedule const& schedule,
                   ckpt_copy_policy const& policy)
      : chain_{chain}, schedule_{schedule}, policy_{policy}, elapsed_{ckpt_elapsed(chain,
                                                                                   schedule)},
        after_(schedule.size()), before_(schedule.size()), last_(chain.size() + 1, none),
        gap_from_(chain.size() + 1, none), gap_to_(chain.size() + 1, none)
  {}

  /// The schedule with the copies of every instance.
  checkpoint_schedule place()
  {
    std::size_t const n = schedule_.size(), L = chain_.size();
    for (std::size_t k = 0; k < n; ++k) {
      auto const op = schedule_[k];
      touch(op.stage - 1, k);
      if (op.kind != checkpoint_op_kind::backward && op.stage < L) {
        settle(op.stage);  // a new instance replaces the old one
        last_[op.stage] = k;
      }
    }
    for (std::size_t j = 1; j < L; ++j) settle(j);
    checkpoint_schedule out;
    for (std::size_t k = 0; k < n; ++k) {
      out.insert(out.end(), before_[k].begin(), before_[k].end());
      out.push_back(schedule_[k]);
      out.insert(out.end(), after_[k].begin(), after_[k].end());
    }
    return out;
  }

 private:
  static constexpr std::size_t none = static_cast<std::size_t>(-1);

  /// The instance of x_j ends: place its copies.
  void settle(std::size_t j)
  {
    if (gap_from_[j] == none) return;
    std::size_t const a = gap_from_[j], b = gap_to_[j];
    std::size_t const p = std::max(a + 2, b - std::min(b, policy_.lookahead));
    auto const u        = static_cast<std::uint32_t>(j);
    after_[a].push_back(offload_op(u));
    before_[p].push_back(prefetch_op(u));
    gap_from_[j] = gap_to_[j] = none;
  }

  /// A read of x_j at op k.
  void touch(std::size_t j, std::size_t k)
  {
    if (j == 0 || j >= chain_.size() || chain_[j].output_size == 0 || last_[j] == none) return;
    std::size_t const a = last_[j];
    bool const wide = k - a - 1 >= 2 && (gap_from_[j] == none || k - a > gap_to_[j] - gap_from_[j]);
    bool const hidden = elapsed_[k] - elapsed_[a + 1] >= 2 * chain_.copy_time(j);
    if (wide && (hidden || !policy_.hidden_only)) gap_from_[j] = a, gap_to_[j] = k;
    last_[j] = k;
  }

  checkpoint_chain const& chain_;
  checkpoint_schedule const& schedule_;
  ckpt_copy_policy const& policy_;
  std::vector<std::int64_t> elapsed_;  ///< compute time of ops [0, k)
  std::vector<std::vector<checkpoint_op>> after_, before_;
  std::vector<std::size_t> last_, gap_from_, gap_to_;
};

/// `schedule` (compute operations only) with copies: every instance of an activation x_j
/// (1 <= j < L, a_j > 0) that is read after it is created is offloaded right after the touch
/// (creation or read) that starts its longest stretch without touches, and prefetched `lookahead`
/// operations before the read that ends it, when at least two operations lie in between (else
/// the copy could not free anything). Device memory never rises (x_j leaves the device for the
/// stretch); time rises only where a prefetch is not done before its read.
inline checkpoint_schedule ckpt_insert_copies(checkpoint_chain const& chain,
                                              checkpoint_schedule const& schedule,
                                              ckpt_copy_policy const& policy)
{
  return ckpt_copy_placer{chain, schedule, policy}.place();
}

}  // namespace gpukit::detail
