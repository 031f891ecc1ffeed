// SPDX-License-Identifier: Apache-2.0
// gpukit/checkpoint/detail/revolve.hpp: binomial (Revolve) schedules for homogeneous chains. Not
// public API.
//
// Reversing l steps from a state held in a slot, with c slots in all (that one included; the
// current state not counted): when l <= 1 nothing need be advanced; with one slot every reverse
// step advances from the start; otherwise advance j steps, keep the reached state in a new slot,
// reverse the last l - j steps with c - 1 slots, then the first j with c. The least number of
// advances
//   T(l, c) = min_j  j + T(l - j, c - 1) + T(j, c),   T(l, 1) = l (l - 1) / 2,   T(0|1, c) = 0,
// is Griewank's binomial bound r l - C(c + r, r - 1), r the least integer with C(c + r, c) >= l
// (what ADOL-C's numforw computes); the table finds the split j.
#pragma once

#include <gpukit/checkpoint/schedule.hpp>
#include <gpukit/error.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

namespace gpukit::detail {

/// Griewank's binomial bound on the advances (forward steps without recording) for l steps and c
/// slots. Saturates at INT64_MAX.
inline std::int64_t revolve_bound(std::int64_t l, std::int64_t c)
{
  if (l <= 1) return 0;
  // beta(c, r) = C(c + r, c); find the least r with beta >= l.
  std::int64_t r = 0, beta = 1;  // beta(c, 0) = 1
  while (beta < l) {
    ++r;
    beta = beta * (c + r) / r;  // exact: C(c+r, r) = C(c+r-1, r-1) (c+r) / r
  }
  // C(c + r, r - 1) = beta * r / (c + 1)
  return r * l - beta * r / (c + 1);
}

class revolve_table {
 public:
  revolve_table(std::size_t l, std::size_t c) : l_{l}, c_{std::min(c, std::max<std::size_t>(l, 1))}
  {
    cost_.assign((l_ + 1) * (c_ + 1), 0);
    split_.assign((l_ + 1) * (c_ + 1), 0);
    for (std::size_t cc = 1; cc <= c_; ++cc) {
      for (std::size_t ll = 2; ll <= l_; ++ll) {
        if (cc == 1) {
          cost_[ix(ll, 1)] = static_cast<std::int64_t>(ll * (ll - 1) / 2);
          continue;
        }
        std::int64_t best = std::numeric_limits<std::int64_t>::max();
        std::size_t arg   = 1;
        for (std::size_t j = 1; j < ll; ++j) {
          std::int64_t const v =
            static_cast<std::int64_t>(j) + cost_[ix(ll - j, cc - 1)] + cost_[ix(j, cc)];
          if (v < best) best = v, arg = j;
        }
        cost_[ix(ll, cc)]  = best;
        split_[ix(ll, cc)] = arg;
      }
    }
  }
  [[nodiscard]] std::int64_t advances() const { return cost_[ix(l_, c_)]; }
  /// Ops for reversing steps s+1..s+l from x_s with c slots.
  void emit(std::size_t s, std::size_t l, std::size_t c, checkpoint_schedule& out) const
  {
    c        = std::min(c, c_);
    auto u32 = [](std::size_t v) { return static_cast<std::uint32_t>(v); };
    while (l > 0) {
      if (l == 1) {
        out.push_back(fe_op(u32(s + 1)));
        out.push_back(b_op(u32(s + 1)));
        return;
      }
      if (c == 1) {
        for (std::size_t i = s + l; i > s; --i) {
          for (std::size_t j = s + 1; j < i; ++j) out.push_back(fn_op(u32(j)));
          out.push_back(fe_op(u32(i)));
          out.push_back(b_op(u32(i)));
        }
        return;
      }
      std::size_t const j = split_[ix(l, c)];
      for (std::size_t k = s + 1; k <= s + j; ++k) out.push_back(fn_op(u32(k)));
      emit(s + j, l - j, c - 1, out);
      l = j;  // then the first j steps, all c slots free again
    }
  }

 private:
  [[nodiscard]] std::size_t ix(std::size_t l, std::size_t c) const { return l * (c_ + 1) + c; }
  std::size_t l_, c_;
  std::vector<std::int64_t> cost_;
  std::vector<std::size_t> split_;
};

}  // namespace gpukit::detail
