// SPDX-License-Identifier: Apache-2.0
// gpukit/checkpoint/detail/optimal_dp.hpp: the dynamic program behind plan_optimal. Not public API.
//
// Subproblem (s, t), 1 <= s <= t <= L: x_{s-1} is resident, δ_t is the current gradient, and B<t>
// ... B<s> remain; `m` is the memory the subproblem may use, counting x_{s-1} and δ_t (the caller
// keeps the rest of the budget for what it holds). C(s, t, m) is the least time. Three moves start
// a subproblem (rotor's, in the cost model of checkpoint/chain.hpp, where a tape does not hold
// x_i):
//   record:      Fe<s>, keep tape_s and x_s; solve (s+1, t) on x_s; then B<s>.
//                (s == t: Fe<s> B<s>.)
//   checkpoint k (s < k <= t): Fn<s> ... Fn<k-1>, each x_j dropped once x_{j+1} exists, keep
//   x_{k-1};
//                solve (k, t) on x_{k-1}; then solve (s, k-1), still on x_{s-1}.
// Sizes: in(s) = a_{s-1} (0 for s = 1), d(t) = δ_t's size (0 for t = L and t = 0).
//   record:      Fe<s> peaks at in + d(t) + a_s + t_s; (s+1, t) gets m - in - t_s; B<s> peaks at
//                in + t_s + d(s) + d(s-1).
//   checkpoint:  Fn<j> peaks at in + d(t) + [j > s] a_{j-1} + a_j; (k, t) gets m - in; (s, k-1)
//                gets m.
// C(s, t, ·) is non-increasing in m, infinite below need(s, t) (the least memory of any schedule of
// the class) and equal to the lower bound sum(f_i + b_i) from store(s, t) (the memory of storing
// everything) on, so each table keeps only m in [need, min(M, store)].
#pragma once

#include <gpukit/checkpoint/chain.hpp>
#include <gpukit/checkpoint/schedule.hpp>
#include <gpukit/error.hpp>
#include <gpukit/error_macros.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <limits>
#include <numeric>
#include <string>
#include <vector>

namespace gpukit::detail {

/// Sizes in planning units (rounded up) and the budget in those units (rounded down).
struct ckpt_units {
  std::vector<std::int64_t> a;  ///< a[0] = 0, a[1..L]
  std::vector<std::int64_t> t;  ///< t[1..L]
  std::int64_t budget{0};
  std::int64_t unit{1};
  [[nodiscard]] std::int64_t in(std::size_t s) const noexcept { return a[s - 1]; }
  [[nodiscard]] std::int64_t d(std::size_t j) const noexcept
  {
    return (j == 0 || j + 1 >= a.size()) ? 0 : a[j];
  }
};

inline ckpt_units ckpt_make_units(checkpoint_chain const& chain, std::int64_t budget,
                                  std::int64_t unit)
{
  std::size_t const L = chain.size();
  ckpt_units u;
  u.unit = unit;
  u.a.assign(L + 1, 0);
  u.t.assign(L + 1, 0);
  for (std::size_t i = 1; i <= L; ++i) {
    u.a[i] = (chain[i].output_size + unit - 1) / unit;
    u.t[i] = (chain[i].tape_size + unit - 1) / unit;
  }
  u.budget = budget / unit;
  return u;
}

/// need(s, t) and store(s, t) for every subproblem, in the units of `u`; index s * (L + 1) + t.
struct ckpt_bounds {
  std::vector<std::int64_t> need, store;
};

inline ckpt_bounds ckpt_compute_bounds(ckpt_units const& u, std::size_t L)
{
  std::size_t const W = L + 1;
  ckpt_bounds r;
  r.need.assign(W * W, 0);
  r.store.assign(W * W, 0);
  for (std::size_t len = 0; len < L; ++len) {
    for (std::size_t s = 1; s + len <= L; ++s) {
      std::size_t const t = s + len;
      auto const in = u.in(s), dt = u.d(t);
      // record (for s == t, d(s) == d(t))
      std::int64_t const rec =
        std::max(in + dt + u.a[s] + u.t[s], in + u.t[s] + u.d(s) + u.d(s - 1));
      std::int64_t rec_need = rec, rec_store = rec;
      if (s < t) {
        rec_need  = std::max(rec, r.need[(s + 1) * W + t] + in + u.t[s]);
        rec_store = std::max(rec, r.store[(s + 1) * W + t] + in + u.t[s]);
      }
      std::int64_t need = rec_need, sweep = 0;
      for (std::size_t k = s + 1; k <= t; ++k) {
        std::size_t const j = k - 1;
        sweep               = std::max(sweep, (j > s ? u.a[j - 1] : 0) + u.a[j]);
        need =
          std::min(need, std::max({in + dt + sweep, r.need[k * W + t] + in, r.need[s * W + j]}));
      }
      r.need[s * W + t]  = need;
      r.store[s * W + t] = rec_store;
    }
  }
  return r;
}

/// The least memory any schedule of the planner's class needs, in the chain's own units.
inline std::int64_t ckpt_min_budget(checkpoint_chain const& chain)
{
  auto const u = ckpt_make_units(chain, 0, 1);
  return ckpt_compute_bounds(u, chain.size()).need[1 * (chain.size() + 1) + chain.size()];
}

/// The dynamic program's tables, and the schedule read back from them.
///
/// Speed (planner_bench optimal/64/512): one allocation for every table, sized from the bounds
/// before the program runs; no choice table (the few choices the schedule needs are recomputed
/// when it is read back, with the same tie-breaking: record first, then the least k); costs in
/// 32-bit integers whenever every schedule of the chain takes less than 2^29 (twice the lanes per
/// vector); each move relaxes its memory range in at most three branch-free, vectorizable
/// stretches (both subproblems read contiguously, one of them at its stored-everything value, both
/// constant); and a move is skipped from the first memory on which the best time so far already
/// reaches the move's lower bound (forward sweep + sum(f + b) of both subproblems): the best time
/// is non-increasing in memory, so it cannot improve there. None of this changes a value or a
/// choice.
class ckpt_dp {
 public:
  static constexpr std::int64_t inf = std::numeric_limits<std::int64_t>::max() / 4;

  ckpt_dp(checkpoint_chain const& chain, ckpt_units units, std::size_t max_entries)
      : chain_{chain}, u_{std::move(units)}, L_{chain.size()}, W_{L_ + 1}
  {
    bounds_ = ckpt_compute_bounds(u_, L_);
    lo_.assign(W_ * W_, 0);
    hi_.assign(W_ * W_, -1);
    offset_.assign(W_ * W_, 0);
    fsum_.assign(L_ + 1, 0);
    fbsum_.assign(L_ + 1, 0);
    for (std::size_t i = 1; i <= L_; ++i) {
      fsum_[i]  = fsum_[i - 1] + chain[i].forward_time;
      fbsum_[i] = fbsum_[i - 1] + chain[i].forward_time + chain[i].backward_time;
    }
    // Every table's memory range, known from the bounds alone: one allocation for all of them.
    std::size_t total = 0;
    for (std::size_t len = 0; len < L_; ++len) {
      for (std::size_t s = 1; s + len <= L_; ++s) {
        std::size_t const id = s * W_ + s + len;
        lo_[id]              = bounds_.need[id];
        hi_[id]              = std::min(u_.budget, bounds_.store[id]);
        offset_[id]          = total;
        if (lo_[id] <= hi_[id]) total += static_cast<std::size_t>(hi_[id] - lo_[id] + 1);
        GPUKIT_EXPECTS(total <= max_entries,
                       "plan_optimal: the dynamic program's tables would exceed " +
                         std::to_string(max_entries) +
                         " entries; lower checkpoint_planner_options::slots or raise "
                         "max_table_entries");
      }
    }
    // A persistent schedule runs each forward at most once per subproblem that contains its stage
    // (at most L of them): L sum(f) + sum(b) bounds every finite time.
    std::int64_t const most = static_cast<std::int64_t>(L_) * fsum_[L_] + (fbsum_[L_] - fsum_[L_]);
    narrow_                 = most < narrow_inf;
    if (narrow_) {
      cost32_.resize(total);
      build(cost32_, static_cast<std::int32_t>(narrow_inf));
    } else {
      cost64_.resize(total);
      build(cost64_, inf);
    }
  }

  /// C(1, L, budget), or inf.
  [[nodiscard]] std::int64_t time() const noexcept { return at(1 * W_ + L_, u_.budget); }

  /// The schedule achieving time(); requires time() < inf.
  [[nodiscard]] checkpoint_schedule schedule() const
  {
    checkpoint_schedule out;
    emit(1, L_, u_.budget, out);
    return out;
  }

 private:
  /// The sentinel of 32-bit tables; every finite time is below it, and a sum of three values
  /// below it does not overflow.
  static constexpr std::int64_t narrow_inf = std::int64_t{1} << 29;
  static constexpr std::size_t no_table    = static_cast<std::size_t>(-1);

  // The checkpoint moves of (s, t) in the program's order: for each k in (s, t] whose
  // subproblems (k, t) and (s, k - 1) are feasible, visit(k, right, left, first), where right and
  // left are their tables and `first` is the least memory at which the move fits (x_{s-1} kept,
  // the forward sweep to x_{k-1}, then either subproblem).
  template <class Visit>
  void for_each_checkpoint_move(std::size_t s, std::size_t t, Visit&& visit) const
  {
    auto const in = u_.in(s), dt = u_.d(t);
    std::int64_t const lo = lo_[s * W_ + t];
    std::int64_t sweep    = 0;
    for (std::size_t k = s + 1; k <= t; ++k) {
      std::size_t const j     = k - 1;
      sweep                   = std::max(sweep, (j > s ? u_.a[j - 1] : 0) + u_.a[j]);
      std::size_t const right = k * W_ + t, left = s * W_ + j;
      if (!feasible(right) || !feasible(left)) continue;
      visit(k, right, left, std::max({lo, in + dt + sweep, lo_[right] + in, lo_[left]}));
    }
  }

  // The peak of the record move's own operations (Fe<s>, B<s>), before its subproblem.
  [[nodiscard]] std::int64_t record_first(std::size_t s, std::size_t t) const noexcept
  {
    auto const in = u_.in(s);
    return std::max(in + u_.d(t) + u_.a[s] + u_.t[s], in + u_.t[s] + u_.d(s) + u_.d(s - 1));
  }
  [[nodiscard]] bool feasible(std::size_t id) const noexcept { return lo_[id] <= hi_[id]; }

  template <class C>
  void build(std::vector<C>& cost, C const cinf)
  {
    for (std::size_t len = 0; len < L_; ++len) {
      for (std::size_t s = 1; s + len <= L_; ++s) {
        std::size_t const t  = s + len;
        std::size_t const id = s * W_ + t;
        if (!feasible(id)) continue;  // infeasible within the budget
        std::int64_t const lo = lo_[id], hi = hi_[id];
        std::size_t const n = static_cast<std::size_t>(hi - lo + 1);
        C* const best       = cost.data() + offset_[id];
        auto const in       = u_.in(s);
        C const fb          = static_cast<C>(chain_[s].forward_time + chain_[s].backward_time);
        // record
        {
          std::int64_t first = record_first(s, t);
          if (s < t) first = std::max(first, lo_[(s + 1) * W_ + t] + in + u_.t[s]);
          std::size_t const q0 = static_cast<std::size_t>(std::clamp(first, lo, hi + 1) - lo);
          std::fill(best, best + n, cinf);
          if (s == t) {
            std::fill(best + q0, best + n, fb);
          } else if (q0 < n) {
            relax_range(cost, best, lo, lo + static_cast<std::int64_t>(q0), hi + 1,
                        (s + 1) * W_ + t, in + u_.t[s], fb);
          }
        }
        for_each_checkpoint_move(
          s, t, [&](std::size_t k, std::size_t right, std::size_t left, std::int64_t first) {
            if (first > hi) return;
            std::size_t const j = k - 1;
            C const fw          = static_cast<C>(fsum_[j] - fsum_[s - 1]);
            // Lower bound of this move: the sweep, then both subproblems at their fastest.
            C const floor = static_cast<C>(fsum_[j] - fsum_[s - 1] + (fbsum_[t] - fbsum_[j]) +
                                           (fbsum_[j] - fbsum_[s - 1]));
            // best is non-increasing in m: the move can only improve it before the first m where
            // best <= floor.
            C* const from = best + (first - lo);
            std::int64_t const end =
              first + (std::lower_bound(from, best + n, floor, std::greater<C>{}) - from);
            if (end > first) { relax_range(cost, best, lo, first, end, right, in, fw, left); }
          });
      }
    }
  }

  // best[m - lo] = min(best[m - lo], fw + T_a(m - shift) + T_b(m)) for m in [from, end), where
  // T_x(m) is table x at min(m, hi_x) (every m read is >= lo_x); without b, T_b is 0. Three
  // stretches, each a branch-free loop over contiguous memory: both tables read in range, one of
  // them past its range (its last entry, a constant), both past their ranges.
  template <class C>
  void relax_range(std::vector<C> const& cost, C* best, std::int64_t lo, std::int64_t from,
                   std::int64_t end, std::size_t a, std::int64_t shift, C fw,
                   std::size_t b = no_table) const
  {
    C* const out              = best + (from - lo);  // out[q]: m = from + q
    C const* const ta         = cost.data() + offset_[a];
    std::int64_t const a_last = hi_[a] + shift;  // the last m at which T_a is not clamped
    C const a_end             = ta[hi_[a] - lo_[a]];
    C const* const pa         = ta + (from - shift - lo_[a]);  // pa[q] = T_a(from + q - shift)
    std::int64_t b_last       = end;
    C b_end                   = 0;
    C const* pb               = nullptr;
    if (b != no_table) {
      C const* const tb = cost.data() + offset_[b];
      b_last            = hi_[b];
      b_end             = tb[hi_[b] - lo_[b]];
      pb                = tb + (from - lo_[b]);
    }
    auto const index = [&](std::int64_t m) {
      return static_cast<std::size_t>(std::clamp(m, from, end) - from);
    };
    std::size_t const e1 = index(std::min(a_last, b_last) + 1);
    std::size_t const e2 = std::max(e1, index(std::max(a_last, b_last) + 1));
    std::size_t const n  = index(end);
    std::size_t q        = 0;
    if (pb == nullptr) {
      for (; q < e1; ++q) out[q] = std::min(out[q], static_cast<C>(fw + pa[q]));
      C const c = fw + a_end;
      for (; q < n; ++q) out[q] = std::min(out[q], c);
      return;
    }
    for (; q < e1; ++q) out[q] = std::min(out[q], static_cast<C>(fw + pa[q] + pb[q]));
    if (a_last < b_last) {  // T_a clamped, T_b read
      C const c = fw + a_end;
      for (; q < e2; ++q) out[q] = std::min(out[q], static_cast<C>(c + pb[q]));
    } else {  // T_b clamped, T_a read
      C const c = fw + b_end;
      for (; q < e2; ++q) out[q] = std::min(out[q], static_cast<C>(c + pa[q]));
    }
    C const c = fw + a_end + b_end;
    for (; q < n; ++q) out[q] = std::min(out[q], c);
  }

  [[nodiscard]] std::int64_t at(std::size_t id, std::int64_t m) const noexcept
  {
    if (m < lo_[id] || lo_[id] > hi_[id]) return inf;
    std::size_t const q = offset_[id] + static_cast<std::size_t>(std::min(m, hi_[id]) - lo_[id]);
    if (narrow_) return cost32_[q] >= narrow_inf ? inf : cost32_[q];
    return cost64_[q];
  }

  // The move the program chose for (s, t) at memory m (0: record; c > 0: checkpoint at s + c):
  // the first, in the program's order, whose time equals the table's.
  [[nodiscard]] std::size_t choice(std::size_t s, std::size_t t, std::int64_t m) const
  {
    std::size_t const id      = s * W_ + t;
    m                         = std::min(m, hi_[id]);
    std::int64_t const target = at(id, m);
    auto const in             = u_.in(s);
    {
      std::int64_t first = std::max(lo_[id], record_first(s, t));
      std::int64_t c     = chain_[s].forward_time + chain_[s].backward_time;
      if (s < t) {
        std::size_t const sub = (s + 1) * W_ + t;
        first                 = std::max(first, lo_[sub] + in + u_.t[s]);
        c += m >= first ? at(sub, m - in - u_.t[s]) : 0;
      }
      if (m >= first && c == target) return 0;
    }
    std::size_t chosen = 0;
    for_each_checkpoint_move(
      s, t, [&](std::size_t k, std::size_t right, std::size_t left, std::int64_t first) {
        if (chosen == 0 && m >= first &&
            fsum_[k - 1] - fsum_[s - 1] + at(right, m - in) + at(left, m) == target) {
          chosen = k - s;  // the first such move
        }
      });
    if (chosen != 0) return chosen;
    GPUKIT_EXPECTS(false, "plan_optimal: internal error: no move of (" + std::to_string(s) + ", " +
                            std::to_string(t) + ") at memory " + std::to_string(m) +
                            " takes the table's time " + std::to_string(target));
    return 0;
  }

  void emit(std::size_t s, std::size_t t, std::int64_t m, checkpoint_schedule& out) const
  {
    auto const op = [](checkpoint_op_kind k, std::size_t i) {
      return checkpoint_op{k, static_cast<std::uint32_t>(i)};
    };
    // Iterative along the record moves (each only nests one subproblem to its right).
    std::vector<std::size_t> pending_backward;
    while (true) {
      std::size_t const c = choice(s, t, m);
      if (c == 0) {
        out.push_back(op(checkpoint_op_kind::forward_record, s));
        if (s == t) {
          out.push_back(op(checkpoint_op_kind::backward, s));
          break;
        }
        pending_backward.push_back(s);
        m -= u_.in(s) + u_.t[s];
        ++s;
        continue;
      }
      std::size_t const k = s + c;
      for (std::size_t j = s; j < k; ++j) out.push_back(op(checkpoint_op_kind::forward, j));
      emit(k, t, m - u_.in(s), out);
      t = k - 1;  // then (s, k-1) with the same memory
    }
    for (auto it = pending_backward.rbegin(); it != pending_backward.rend(); ++it) {
      out.push_back(op(checkpoint_op_kind::backward, *it));
    }
  }

  checkpoint_chain const& chain_;
  ckpt_units u_;
  std::size_t L_, W_;
  ckpt_bounds bounds_;
  std::vector<std::int64_t> lo_, hi_;
  std::vector<std::size_t> offset_;
  std::vector<std::int64_t> fsum_, fbsum_;  ///< prefix sums of f, and of f + b
  bool narrow_{false};                      ///< the tables are cost32_ (else cost64_)
  std::vector<std::int32_t> cost32_;
  std::vector<std::int64_t> cost64_;
};

}  // namespace gpukit::detail
