// SPDX-License-Identifier: Apache-2.0
// gpukit/checkpoint/detail/search.hpp: the general optimum by A* over memory states, pruned by an
// upper bound (the time of a plan already found). Not public API; behind plan_best.
//
// The states are those of detail/exhaustive.hpp: (next backward nb, resident activations
// x_1..x_{nb-1}, resident tapes tape_1..tape_nb); edges are the operations, weighted by their time
// and allowed when their peak fits the budget. The search differs from that Dijkstra in four
// ways, none of which changes the least time it finds:
// - no free drop edges: each operation chooses which of its inputs and outputs it keeps (an
//   object dropped at its last use, the only drop that matters), and forwards that would only
//   recreate resident objects are left out;
// - it is guided by a lower bound of the time left: sum(b_i, i <= nb) for the backward operations,
//   plus f_i for every stage i <= nb that must still run forward, because tape_i is missing or
//   x_i (i < nb, needed by B<i+1>) is missing. Each forward satisfies one stage and each backward
//   needs its inputs resident, so the bound is consistent: A* expands each state once, at its least
//   time;
// - a state whose time plus bound reaches `upper` is never stored: a plan of time `upper` is known,
//   so the search only looks for strictly faster ones;
// - states live in an open-addressing table of 32-bit node indices (nodes in one vector), so its
//   memory follows the states the search touches, not 4^L, and a state costs about 40 bytes;
// - a budget below ckpt_necessary_budget (a lower bound of what any schedule needs) is refused
//   before any state is stored: without it, an infeasible budget makes the search visit every
//   reachable state (about 350,000 at 10 stages, a second).
#pragma once

#include <gpukit/checkpoint/chain.hpp>
#include <gpukit/checkpoint/schedule.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <limits>
#include <queue>
#include <tuple>
#include <utility>
#include <vector>

namespace gpukit::detail {

struct ckpt_search_result {
  std::int64_t time{-1};  ///< -1 when no schedule faster than `upper` fits
  checkpoint_schedule schedule;
  std::size_t states{0};  ///< states stored
  bool complete{true};    ///< false when the search stopped at max_states
};

/// A lower bound of the least budget of any schedule, from what every schedule must hold. B<i>
/// holds delta_i, x_{i-1}, tape_i and the delta_{i-1} it writes (R_i). The last Fe<i> before B<i>
/// runs when the next backward is some nb >= i: it holds delta_nb, x_{i-1} and writes x_i and
/// tape_i, and tape_i then stays through B<nb> .. B<i+1>, each of which needs R_k besides. So
/// stage i needs at least the least, over nb, of those peaks. O(L^2).
[[nodiscard]] inline std::int64_t ckpt_necessary_budget(checkpoint_chain const& chain) noexcept
{
  std::size_t const L = chain.size();
  auto backward       = [&](std::size_t k) {
    return chain.gradient_size(k) + chain.activation_size(k - 1) + chain[k].tape_size +
           chain.gradient_size(k - 1);
  };
  std::int64_t need = 0;
  for (std::size_t i = 1; i <= L; ++i) need = std::max(need, backward(i));
  for (std::size_t i = 1; i <= L; ++i) {
    auto const& s             = chain[i];
    std::int64_t const made   = chain.activation_size(i - 1) + s.output_size + s.tape_size;
    std::int64_t least        = std::numeric_limits<std::int64_t>::max();
    std::int64_t held_through = 0;  // max of R_k + tape_i over i < k <= nb
    for (std::size_t nb = i; nb <= L; ++nb) {
      if (nb > i) held_through = std::max(held_through, backward(nb) + s.tape_size);
      least = std::min(least, std::max(chain.gradient_size(nb) + made, held_through));
    }
    need = std::max(need, least);
  }
  return need;
}

class ckpt_astar {
 public:
  /// Longest chain the state keys hold (5 bits of nb, 29 of activations, 29 of tapes).
  static constexpr std::size_t max_stages = 29;
  /// Most states one search may store (node indices are 32-bit).
  static constexpr std::size_t max_states_limit = std::size_t{1} << 31;

  ckpt_astar(checkpoint_chain const& chain, std::int64_t budget, std::int64_t upper,
             std::size_t max_states)
      : chain_{chain}, budget_{budget}, upper_{upper}, max_states_{
                                                         std::min(max_states, max_states_limit)}
  {
    std::size_t const L = chain.size();
    f_.assign(L + 1, 0);
    b_.assign(L + 1, 0);
    out_.assign(L + 1, 0);
    tape_.assign(L + 1, 0);
    grad_.assign(L + 1, 0);
    bsum_.assign(L + 1, 0);
    for (std::size_t i = 1; i <= L; ++i) {
      f_[i]    = chain[i].forward_time;
      b_[i]    = chain[i].backward_time;
      out_[i]  = chain[i].output_size;
      tape_[i] = chain[i].tape_size;
      bsum_[i] = bsum_[i - 1] + b_[i];
    }
    for (std::size_t j = 0; j <= L; ++j) grad_[j] = chain.gradient_size(j);
  }

  ckpt_search_result run()
  {
    ckpt_search_result r;
    if (budget_ < ckpt_necessary_budget(chain_)) return r;  // complete: nothing fits
    std::size_t const L = chain_.size();
    key const start     = pack(L, 0, 0);
    push(start, no_parent, 0, {}, false);
    while (!queue_.empty()) {
      auto const [f, negative_g, id] = queue_.top();
      queue_.pop();
      std::int64_t const g = -negative_g;
      node const& n        = nodes_[id];
      if (g != n.g) continue;     // a stale entry
      if (unpack_nb(n.k) == 0) {  // B1 ran: nothing after it
        r.time = g;
        for (std::uint32_t i = id; nodes_[i].parent != no_parent; i = nodes_[i].parent)
          if (nodes_[i].real) r.schedule.push_back(nodes_[i].op);
        std::reverse(r.schedule.begin(), r.schedule.end());
        break;
      }
      if (nodes_.size() > max_states_) {
        r.complete = false;
        break;
      }
      expand(id, g);
    }
    r.states = nodes_.size();
    return r;
  }

 private:
  using key                                = std::uint64_t;
  static constexpr std::uint32_t no_parent = 0xffffffffu;
  struct node {
    key k;
    std::int64_t g;
    std::uint32_t parent;
    bool real;
    checkpoint_op op;
  };

  static key pack(std::size_t nb, std::uint64_t X, std::uint64_t T) noexcept
  {
    return (static_cast<key>(nb) << 58) | (X << 29) | T;
  }
  static std::size_t unpack_nb(key k) noexcept { return static_cast<std::size_t>(k >> 58); }
  static std::uint64_t bit(std::size_t j) noexcept { return std::uint64_t{1} << (j - 1); }

  // A state unpacked: next backward nb, resident activations X and tapes T (bit j-1: stage j).
  struct state {
    std::size_t nb;
    std::uint64_t X, T;
  };

  static state unpack(key k) noexcept
  {
    return {unpack_nb(k), (k >> 29) & ((std::uint64_t{1} << 29) - 1),
            k & ((std::uint64_t{1} << 29) - 1)};
  }

  // Whether x_j is resident in X (x_0 always is).
  static bool has_x(std::uint64_t X, std::size_t j) noexcept { return j == 0 || (X & bit(j)); }

  // Sum of v[j] over the set bits j (1-based) of m.
  static std::int64_t sum_bits(std::vector<std::int64_t> const& v, std::uint64_t m) noexcept
  {
    std::int64_t s = 0;
    for (; m != 0; m &= m - 1) s += v[static_cast<std::size_t>(__builtin_ctzll(m)) + 1];
    return s;
  }

  // The consistent lower bound of the time left (see the top of this header).
  [[nodiscard]] std::int64_t bound(std::size_t nb, std::uint64_t X, std::uint64_t T) const noexcept
  {
    std::uint64_t const upto    = (std::uint64_t{1} << nb) - 1;        // stages 1..nb
    std::uint64_t const below   = (std::uint64_t{1} << (nb - 1)) - 1;  // stages 1..nb-1
    std::uint64_t const forward = (~T & upto) | (~X & below);
    return bsum_[nb] + sum_bits(f_, forward);
  }

  [[nodiscard]] std::int64_t memory(std::size_t nb, std::uint64_t X, std::uint64_t T) const noexcept
  {
    return grad_[nb] + sum_bits(out_, X) + sum_bits(tape_, T);
  }

  // The slot of `k` in the open-addressing table, or the empty slot where it would go.
  std::size_t slot_of(key k) const noexcept
  {
    std::size_t const mask = table_.size() - 1;
    std::uint64_t const h  = k * 0x9e3779b97f4a7c15ULL;
    for (std::size_t i = static_cast<std::size_t>(h >> 20) & mask;; i = (i + 1) & mask) {
      std::uint32_t const t = table_[i];
      if (t == no_parent || nodes_[t].k == k) return i;
    }
  }

  void grow()
  {
    std::vector<std::uint32_t> old = std::move(table_);
    table_.assign(old.empty() ? 1024 : old.size() * 2, no_parent);
    for (std::uint32_t t : old)
      if (t != no_parent) table_[slot_of(nodes_[t].k)] = t;
  }

  void push(key to, std::uint32_t from, std::int64_t g, checkpoint_op op, bool real)
  {
    state const st         = unpack(to);
    std::int64_t const est = g + (st.nb == 0 ? 0 : bound(st.nb, st.X, st.T));
    if (est >= upper_) return;
    if ((nodes_.size() + 1) * 2 > table_.size()) grow();
    std::size_t const s = slot_of(to);
    std::uint32_t id    = table_[s];
    if (id == no_parent) {
      id        = static_cast<std::uint32_t>(nodes_.size());
      table_[s] = id;
      nodes_.push_back(node{to, g, from, real, op});
    } else {
      if (nodes_[id].g <= g) return;
      nodes_[id] = node{to, g, from, real, op};
    }
    queue_.push({est, -g, id});
  }

  // Every edge out of state `id`, reached at time g. Drops are not edges of their own: every
  // object is dropped right after its last use or never (dropping earlier never raises memory nor
  // changes time), so an operation's edges choose whether to keep its input x_{i-1} and, for Fe<i>,
  // its output x_i. Forwards that create only objects already resident are skipped.
  void expand(std::uint32_t id, std::int64_t g)
  {
    state const s          = unpack(nodes_[id].k);
    std::int64_t const mem = memory(s.nb, s.X, s.T);
    for (std::size_t i = 1; i <= s.nb; ++i) {
      if (has_x(s.X, i - 1)) expand_forwards(id, g, s, mem, i);
    }
    if ((s.T & bit(s.nb)) && has_x(s.X, s.nb - 1) && mem + grad_[s.nb - 1] <= budget_) {
      std::size_t const nb2 = s.nb - 1;
      // x_{nb-1} and tape_nb are no longer useful; what remains fits the smaller state.
      std::uint64_t const X2 = nb2 == 0 ? 0 : s.X & ((std::uint64_t{1} << (nb2 - 1)) - 1);
      std::uint64_t const T2 = s.T & ((std::uint64_t{1} << nb2) - 1);
      push(pack(nb2, X2, T2), id, g + b_[s.nb], b_op(static_cast<std::uint32_t>(s.nb)), true);
    }
  }

  // The edges of Fn<i> and Fe<i> out of state `id` (s, holding mem), whose input x_{i-1} is
  // resident.
  void expand_forwards(std::uint32_t id, std::int64_t g, state const& s, std::int64_t mem,
                       std::size_t i)
  {
    auto const u = static_cast<std::uint32_t>(i);
    // Keeping x_{i-1} or dropping it (x_0 is always resident).
    std::uint64_t const in_kept[2] = {s.X, i > 1 ? s.X & ~bit(i - 1) : s.X};
    std::size_t const ways         = i > 1 ? 2 : 1;
    bool const x_tracked           = i < s.nb;
    bool const x_there             = x_tracked && (s.X & bit(i));
    if (x_tracked && !x_there && mem + out_[i] <= budget_) {
      for (std::size_t w = 0; w < ways; ++w)
        push(pack(s.nb, in_kept[w] | bit(i), s.T), id, g + f_[i], fn_op(u), true);
    }
    if (!(s.T & bit(i)) && mem + out_[i] + tape_[i] <= budget_) {
      for (std::size_t w = 0; w < ways; ++w) {
        push(pack(s.nb, in_kept[w], s.T | bit(i)), id, g + f_[i], fe_op(u), true);
        if (x_tracked && !x_there) {
          push(pack(s.nb, in_kept[w] | bit(i), s.T | bit(i)), id, g + f_[i], fe_op(u), true);
        }
      }
    }
  }

  using item = std::tuple<std::int64_t, std::int64_t, std::uint32_t>;  // (g + bound, -g, node)

  checkpoint_chain const& chain_;
  std::int64_t budget_, upper_;
  std::size_t max_states_;
  std::vector<std::int64_t> f_, b_, out_, tape_, grad_, bsum_;  // by stage (grad_ by delta index)
  std::vector<node> nodes_;
  std::vector<std::uint32_t> table_;  // open addressing: node indices, no_parent when empty
  std::priority_queue<item, std::vector<item>, std::greater<item>> queue_;
};

inline ckpt_search_result ckpt_search(checkpoint_chain const& chain, std::int64_t budget,
                                      std::int64_t upper, std::size_t max_states)
{
  return ckpt_astar{chain, budget, upper, max_states}.run();
}

/// The least budget at which some schedule fits, given that none fits `infeasible` and one fits
/// `feasible` (> infeasible): a bisection with the search as the test, from
/// ckpt_necessary_budget up. The searches share `max_states` (stored states in all); once it is
/// spent, or a search stops at it, the budget in question counts as infeasible, so `budget` is
/// always one at which a schedule is known to fit, and `exact` says whether it is proven the least.
struct ckpt_least_budget_result {
  std::int64_t budget;
  bool exact;
};

inline ckpt_least_budget_result ckpt_least_budget(checkpoint_chain const& chain,
                                                  std::int64_t infeasible, std::int64_t feasible,
                                                  std::size_t max_states)
{
  constexpr std::int64_t none = std::numeric_limits<std::int64_t>::max();
  infeasible                  = std::max(infeasible, ckpt_necessary_budget(chain) - 1);
  std::size_t left            = max_states;
  bool exact                  = true;
  while (feasible - infeasible > 1) {
    std::int64_t const mid = infeasible + (feasible - infeasible) / 2;
    auto const r =
      left == 0 ? ckpt_search_result{-1, {}, 0, false} : ckpt_search(chain, mid, none, left);
    left -= std::min(left, r.states);
    exact                                 = exact && (r.time >= 0 || r.complete);
    (r.time >= 0 ? feasible : infeasible) = mid;
  }
  return {feasible, exact};
}

}  // namespace gpukit::detail
