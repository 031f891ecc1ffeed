// gpukit/checkpoint/detail/optimal_dp.hpp: the dynamic program behind plan_optimal. Not public API.
//
// Subproblem (s, t), 1 <= s <= t <= L: x_{s-1} is resident, δ_t is the current gradient, and B<t>
// ... B<s> remain; `m` is the memory the subproblem may use, counting x_{s-1} and δ_t (the caller
// keeps the rest of the budget for what it holds). C(s, t, m) is the least time. Three moves start
// a subproblem (rotor's, in the cost model of issue 8, where a tape does not hold x_i):
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

#include <algorithm>
#include <cstddef>
#include <cstdint>
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
    std::vector<std::int64_t> fsum(L_ + 1, 0);
    for (std::size_t i = 1; i <= L_; ++i) fsum[i] = fsum[i - 1] + chain[i].forward_time;
    std::size_t total = 0;
    std::vector<std::int64_t> best;
    std::vector<std::uint16_t> pick;
    for (std::size_t len = 0; len < L_; ++len) {
      for (std::size_t s = 1; s + len <= L_; ++s) {
        std::size_t const t   = s + len;
        std::size_t const id  = s * W_ + t;
        std::int64_t const lo = bounds_.need[id];
        std::int64_t const hi = std::min(u_.budget, bounds_.store[id]);
        lo_[id]               = lo;
        hi_[id]               = hi;
        offset_[id]           = total;
        if (lo > hi) continue;  // infeasible within the budget
        std::size_t const n = static_cast<std::size_t>(hi - lo + 1);
        total += n;
        GPUKIT_EXPECTS(total <= max_entries,
                       "plan_optimal: the dynamic program's tables would exceed " +
                         std::to_string(max_entries) +
                         " entries; lower checkpoint_planner_options::slots or raise "
                         "max_table_entries");
        best.assign(n, inf);
        pick.assign(n, 0);
        auto const in = u_.in(s), dt = u_.d(t);
        auto const fb = chain[s].forward_time + chain[s].backward_time;
        // record
        {
          std::int64_t first =
            std::max(in + dt + u_.a[s] + u_.t[s], in + u_.t[s] + u_.d(s) + u_.d(s - 1));
          if (s == t) {
            for (std::int64_t m = std::max(lo, first); m <= hi; ++m) best[m - lo] = fb;
          } else {
            std::size_t const sub = (s + 1) * W_ + t;
            std::int64_t const sh = in + u_.t[s];
            first                 = std::max(first, lo_[sub] + sh);
            for (std::int64_t m = std::max(lo, first); m <= hi; ++m) {
              best[m - lo] = fb + at(sub, m - sh);
            }
          }
        }
        // checkpoint at k
        std::int64_t sweep = 0;
        for (std::size_t k = s + 1; k <= t; ++k) {
          std::size_t const j     = k - 1;
          sweep                   = std::max(sweep, (j > s ? u_.a[j - 1] : 0) + u_.a[j]);
          std::size_t const right = k * W_ + t, left = s * W_ + j;
          if (lo_[right] > hi_[right] || lo_[left] > hi_[left]) continue;
          std::int64_t const first = std::max({lo, in + dt + sweep, lo_[right] + in, lo_[left]});
          std::int64_t const fw    = fsum[j] - fsum[s - 1];
          // The unclamped stretch first (contiguous reads: vectorizable), then the clamped tail.
          auto const tag         = static_cast<std::uint16_t>(k - s);
          std::int64_t const mid = std::min({hi, hi_[right] + in, hi_[left]});
          std::int64_t m         = first;
          if (first <= mid) {
            std::int64_t const* rp = cost_.data() + offset_[right] + (first - in - lo_[right]);
            std::int64_t const* lp = cost_.data() + offset_[left] + (first - lo_[left]);
            std::int64_t* bp       = best.data() + (first - lo);
            std::uint16_t* pp      = pick.data() + (first - lo);
            std::size_t const n    = static_cast<std::size_t>(mid - first + 1);
            for (std::size_t q = 0; q < n; ++q) {
              std::int64_t const c = fw + rp[q] + lp[q];
              bool const better    = c < bp[q];
              bp[q]                = better ? c : bp[q];
              pp[q]                = better ? tag : pp[q];
            }
            m = mid + 1;
          }
          for (; m <= hi; ++m) {
            std::int64_t const c = fw + at(right, m - in) + at(left, m);
            if (c < best[m - lo]) best[m - lo] = c, pick[m - lo] = tag;
          }
        }
        cost_.insert(cost_.end(), best.begin(), best.end());
        choice_.insert(choice_.end(), pick.begin(), pick.end());
      }
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
  [[nodiscard]] std::int64_t at(std::size_t id, std::int64_t m) const noexcept
  {
    if (m < lo_[id] || lo_[id] > hi_[id]) return inf;
    return cost_[offset_[id] + static_cast<std::size_t>(std::min(m, hi_[id]) - lo_[id])];
  }
  [[nodiscard]] std::size_t choice(std::size_t id, std::int64_t m) const noexcept
  {
    return choice_[offset_[id] + static_cast<std::size_t>(std::min(m, hi_[id]) - lo_[id])];
  }

  void emit(std::size_t s, std::size_t t, std::int64_t m, checkpoint_schedule& out) const
  {
    auto const op = [](checkpoint_op_kind k, std::size_t i) {
      return checkpoint_op{k, static_cast<std::uint32_t>(i)};
    };
    // Iterative along the record moves (each only nests one subproblem to its right).
    std::vector<std::size_t> pending_backward;
    while (true) {
      std::size_t const id = s * W_ + t;
      std::size_t const c  = choice(id, m);
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
  std::vector<std::int64_t> cost_;
  std::vector<std::uint16_t> choice_;
};

}  // namespace gpukit::detail
