// SPDX-License-Identifier: Apache-2.0
// gpukit/checkpoint/detail/offload.hpp: offload and prefetch copies inserted into a schedule.
// Not public API; behind plan_with_offload.
#pragma once

#include <gpukit/checkpoint/chain.hpp>
#include <gpukit/checkpoint/schedule.hpp>

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
  std::size_t const n = schedule.size(), L = chain.size();
  std::vector<std::int64_t> elapsed(n + 1, 0);  // compute time of ops [0, k)
  for (std::size_t k = 0; k < n; ++k) {
    auto const& st = chain[schedule[k].stage];
    elapsed[k + 1] =
      elapsed[k] +
      (schedule[k].kind == checkpoint_op_kind::backward ? st.backward_time : st.forward_time);
  }
  std::vector<std::vector<checkpoint_op>> after(n), before(n);
  // The current instance of each x_j: its last touch, and its best stretch so far.
  constexpr std::size_t none = static_cast<std::size_t>(-1);
  std::vector<std::size_t> last(L + 1, none), gap_from(L + 1, none), gap_to(L + 1, none);
  auto settle = [&](std::size_t j) {  // the instance of x_j ends: place its copies
    if (gap_from[j] == none) return;
    std::size_t const a = gap_from[j], b = gap_to[j];
    std::size_t const p = std::max(a + 2, b - std::min(b, policy.lookahead));
    auto const u        = static_cast<std::uint32_t>(j);
    after[a].push_back(offload_op(u));
    before[p].push_back(prefetch_op(u));
    gap_from[j] = gap_to[j] = none;
  };
  auto touch = [&](std::size_t j, std::size_t k) {  // a read of x_j at op k
    if (j == 0 || j >= L || chain[j].output_size == 0 || last[j] == none) return;
    std::size_t const a = last[j];
    bool const wide   = k - a - 1 >= 2 && (gap_from[j] == none || k - a > gap_to[j] - gap_from[j]);
    bool const hidden = elapsed[k] - elapsed[a + 1] >= 2 * chain.copy_time(j);
    if (wide && (hidden || !policy.hidden_only)) gap_from[j] = a, gap_to[j] = k;
    last[j] = k;
  };
  for (std::size_t k = 0; k < n; ++k) {
    auto const op = schedule[k];
    touch(op.stage - 1, k);
    if (op.kind != checkpoint_op_kind::backward && op.stage < L) {
      settle(op.stage);  // a new instance replaces the old one
      last[op.stage] = k;
    }
  }
  for (std::size_t j = 1; j < L; ++j) settle(j);
  checkpoint_schedule out;
  for (std::size_t k = 0; k < n; ++k) {
    out.insert(out.end(), before[k].begin(), before[k].end());
    out.push_back(schedule[k]);
    out.insert(out.end(), after[k].begin(), after[k].end());
  }
  return out;
}

}  // namespace gpukit::detail
