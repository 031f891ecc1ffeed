// SPDX-License-Identifier: Apache-2.0
// gpukit/checkpoint/detail/exhaustive.hpp: the general optimum by shortest path over memory states.
// Not public API.
//
// A state is (backward operations done, resident activations, resident tapes); edges are the
// operations (weighted by their time, allowed when their peak fits the budget) and free drops.
// Objects that no later operation can use (x_j once B<j+1> ran, tapes of finished stages) are
// dropped at once. Dijkstra finds the least total time over every schedule of the cost model, with
// drops at any time; its operations, replayed with every object dropped right after its last use,
// peak no higher (dropping earlier never raises memory), so the plan keeps the path's time.
//
// With nb = L - (backward operations done) the next backward, the activations that matter are
// x_1..x_{nb-1} and the tapes tape_1..tape_nb: 2^(2 nb - 1) states per nb, about 2^(2L+1)/3 in all.
#pragma once

#include <gpukit/checkpoint/chain.hpp>
#include <gpukit/checkpoint/schedule.hpp>
#include <gpukit/error.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <limits>
#include <queue>
#include <utility>
#include <vector>

namespace gpukit::detail {

struct ckpt_exhaustive_result {
  std::int64_t time{-1};  ///< -1 when no schedule fits
  checkpoint_schedule schedule;
};

// The states of the search, numbered: those with next backward nb (nb = L .. 0) are consecutive,
// X (x_1..x_{nb-1} resident) above T (tape_1..tape_nb resident) in the index.
class ckpt_states {
 public:
  struct state {
    std::size_t nb;
    std::uint64_t X, T;
  };

  explicit ckpt_states(checkpoint_chain const& chain) : chain_{chain}, offset_(chain.size() + 2, 0)
  {
    for (std::size_t nb = chain.size() + 1; nb-- > 0;) {
      offset_[nb] = total_;
      total_ += count(nb);
    }
  }

  [[nodiscard]] std::uint64_t size() const noexcept { return total_; }
  [[nodiscard]] static std::size_t x_bits(std::size_t nb) noexcept { return nb == 0 ? 0 : nb - 1; }
  [[nodiscard]] std::uint64_t index(std::size_t nb, std::uint64_t X, std::uint64_t T) const noexcept
  {
    return offset_[nb] + (X << nb) + T;
  }
  [[nodiscard]] state decode(std::uint64_t id) const noexcept
  {
    std::size_t nb = chain_.size();
    while (id >= offset_[nb] + count(nb)) --nb;
    std::uint64_t const local = id - offset_[nb];
    return {nb, local >> nb, local & ((std::uint64_t{1} << nb) - 1)};
  }
  /// Bytes resident in state s: the current gradient, the activations and the tapes.
  [[nodiscard]] std::int64_t memory(state const& s) const noexcept
  {
    std::int64_t m = chain_.gradient_size(s.nb);
    for (std::size_t j = 1; j < s.nb; ++j)
      if (s.X >> (j - 1) & 1) m += chain_[j].output_size;
    for (std::size_t i = 1; i <= s.nb; ++i)
      if (s.T >> (i - 1) & 1) m += chain_[i].tape_size;
    return m;
  }

 private:
  [[nodiscard]] static std::uint64_t count(std::size_t nb) noexcept
  {
    return std::uint64_t{1} << (x_bits(nb) + nb);
  }

  checkpoint_chain const& chain_;
  std::vector<std::uint64_t> offset_;
  std::uint64_t total_{0};
};

// Dijkstra over the states from (L, nothing resident) to (0, nothing resident).
class ckpt_shortest_path {
 public:
  ckpt_shortest_path(checkpoint_chain const& chain, std::int64_t budget)
      : chain_{chain}, budget_{budget}, states_{chain}, dist_(states_.size(), inf),
        parent_(states_.size(), 0), via_(states_.size()), is_op_(states_.size(), 0)
  {}

  ckpt_exhaustive_result run()
  {
    std::uint64_t const start = states_.index(chain_.size(), 0, 0);
    std::uint64_t const goal  = states_.index(0, 0, 0);
    dist_[start]              = 0;
    queue_.push({0, start});
    while (!queue_.empty()) {
      auto [d, id] = queue_.top();
      queue_.pop();
      if (d != dist_[id]) continue;
      if (id == goal) break;
      expand(id, d);
    }
    ckpt_exhaustive_result r;
    if (dist_[goal] == inf) return r;
    r.time = dist_[goal];
    for (std::uint64_t id = goal; id != start; id = parent_[id])
      if (is_op_[id]) r.schedule.push_back(via_[id]);
    std::reverse(r.schedule.begin(), r.schedule.end());
    return r;
  }

 private:
  static constexpr std::int64_t inf = std::numeric_limits<std::int64_t>::max();

  void relax(std::uint64_t from, std::uint64_t to, std::int64_t d, checkpoint_op op, bool real)
  {
    if (d < dist_[to]) {
      dist_[to]   = d;
      parent_[to] = from;
      via_[to]    = op;
      is_op_[to]  = real;
      queue_.push({d, to});
    }
  }

  // Every edge out of state `id`, reached at time d: drops, forwards, and the next backward.
  void expand(std::uint64_t id, std::int64_t d)
  {
    auto const [nb, X, T]  = states_.decode(id);
    std::int64_t const mem = states_.memory({nb, X, T});
    auto has_x             = [X = X](std::size_t j) { return j == 0 || (X >> (j - 1) & 1); };
    auto bit               = [](std::size_t j) { return std::uint64_t{1} << (j - 1); };
    for (std::size_t j = 1; j < nb; ++j)
      if (X & bit(j)) relax(id, states_.index(nb, X & ~bit(j), T), d, {}, false);
    for (std::size_t i = 1; i <= nb; ++i)
      if (T & bit(i)) relax(id, states_.index(nb, X, T & ~bit(i)), d, {}, false);
    for (std::size_t i = 1; i <= nb; ++i) {
      if (!has_x(i - 1)) continue;
      auto const& st         = chain_[i];
      std::uint64_t const X2 = i < nb ? X | bit(i) : X;
      if (mem + st.output_size <= budget_) {
        relax(id, states_.index(nb, X2, T), d + st.forward_time,
              fn_op(static_cast<std::uint32_t>(i)), true);
      }
      if (mem + st.output_size + st.tape_size <= budget_) {
        relax(id, states_.index(nb, X2, T | bit(i)), d + st.forward_time,
              fe_op(static_cast<std::uint32_t>(i)), true);
      }
    }
    if (nb >= 1 && (T & bit(nb)) && has_x(nb - 1) &&
        mem + chain_.gradient_size(nb - 1) <= budget_) {
      std::size_t const nb2 = nb - 1;
      // x_{nb-1} and tape_nb are no longer useful; what remains fits the smaller state.
      std::uint64_t const X2 = X & ((std::uint64_t{1} << ckpt_states::x_bits(nb2)) - 1);
      std::uint64_t const T2 = T & ((std::uint64_t{1} << nb2) - 1);
      relax(id, states_.index(nb2, X2, T2), d + chain_[nb].backward_time,
            b_op(static_cast<std::uint32_t>(nb)), true);
    }
  }

  using item = std::pair<std::int64_t, std::uint64_t>;

  checkpoint_chain const& chain_;
  std::int64_t budget_;
  ckpt_states states_;
  std::vector<std::int64_t> dist_;
  std::vector<std::uint64_t> parent_;
  std::vector<checkpoint_op> via_;
  std::vector<char> is_op_;
  std::priority_queue<item, std::vector<item>, std::greater<item>> queue_;
};

inline ckpt_exhaustive_result ckpt_exhaustive(checkpoint_chain const& chain, std::int64_t budget)
{
  return ckpt_shortest_path{chain, budget}.run();
}

}  // namespace gpukit::detail
