// SPDX-License-Identifier: Apache-2.0
// gpukit/checkpoint/detail/planners_impl.hpp: the bodies of gpukit/checkpoint/planners.hpp, and
// the planners' algorithms. Not public API; included by gpukit/checkpoint/planners.hpp, or in
// compiled mode by src/planners.cpp alone (GPUKIT_DETAIL_COMPILED_INLINE,
// gpukit/detail/compiled_mode.hpp).
#pragma once

#include <gpukit/checkpoint/chain.hpp>
#include <gpukit/checkpoint/detail/exhaustive.hpp>
#include <gpukit/checkpoint/detail/offload.hpp>
#include <gpukit/checkpoint/detail/optimal_dp.hpp>
#include <gpukit/checkpoint/detail/revolve.hpp>
#include <gpukit/checkpoint/detail/search.hpp>
#include <gpukit/checkpoint/schedule.hpp>
#include <gpukit/detail/compiled_mode.hpp>
#include <gpukit/error.hpp>
#include <gpukit/error_macros.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <numeric>
#include <string>
#include <utility>

namespace gpukit {

namespace detail {

inline checkpoint_plan ckpt_finish(checkpoint_chain const& chain, std::string planner,
                                   checkpoint_schedule schedule, std::int64_t budget)
{
  auto const sim = simulate_checkpoint_schedule(chain, schedule);
  checkpoint_plan p;
  p.planner        = std::move(planner);
  p.schedule       = std::move(schedule);
  p.time           = sim.time;
  p.peak           = sim.peak;
  p.budget         = budget;
  p.recomputations = sim.recomputations;
  p.proven_optimal = p.time == chain.compute_time();
  p.offloads       = sim.offloads;
  p.copy_time      = sim.copy_time;
  p.stall          = sim.stall;
  if (budget >= 0 && p.peak > budget) {
    throw checkpoint_infeasible{p.planner + ": the plan peaks at " + std::to_string(p.peak) +
                                  ", above the budget of " + std::to_string(budget) +
                                  "; this planner needs a budget of at least " +
                                  std::to_string(p.peak),
                                p.peak};
  }
  return p;
}

/// The checks of plan_optimal and plan_best: a budget in 0..2^47, at least one slot.
inline void ckpt_check_dp_arguments(std::string const& who, std::int64_t budget,
                                    checkpoint_planner_options const& options)
{
  GPUKIT_EXPECTS(budget >= 0, who + ": budget " + std::to_string(budget) +
                                " is negative; it is in the units of the chain's sizes");
  GPUKIT_EXPECTS(budget <= checkpoint_chain::max_total * 2,
                 who + ": budget " + std::to_string(budget) + " exceeds 2^47");
  GPUKIT_EXPECTS(options.slots >= 1,
                 who + ": options.slots = " + std::to_string(options.slots) + " is below 1");
}

inline void ckpt_check_budget(char const* who, std::int64_t budget)
{
  GPUKIT_EXPECTS(budget >= -1, std::string{who} + ": budget " + std::to_string(budget) +
                                 " is negative (use no_checkpoint_budget for none)");
}

}  // namespace detail

GPUKIT_DETAIL_COMPILED_INLINE checkpoint_plan plan_store_all(checkpoint_chain const& chain,
                                                             std::int64_t budget)
{
  detail::ckpt_check_budget("plan_store_all", budget);
  checkpoint_schedule s;
  auto const L = static_cast<std::uint32_t>(chain.size());
  for (std::uint32_t i = 1; i <= L; ++i) s.push_back(fe_op(i));
  for (std::uint32_t i = L; i >= 1; --i) s.push_back(b_op(i));
  return detail::ckpt_finish(chain, "store-all", std::move(s), budget);
}

GPUKIT_DETAIL_COMPILED_INLINE checkpoint_plan plan_sequential(checkpoint_chain const& chain,
                                                              std::size_t segments,
                                                              std::int64_t budget)
{
  detail::ckpt_check_budget("plan_sequential", budget);
  std::size_t const L = chain.size();
  GPUKIT_EXPECTS(segments >= 1 && segments <= L,
                 "plan_sequential: segments = " + std::to_string(segments) + " is outside 1.." +
                   std::to_string(L) + " (the number of stages)");
  std::size_t const size = L / segments;
  // Chunk c (0-based) covers [first[c], first[c+1]).
  std::vector<std::size_t> first;
  for (std::size_t c = 0; c < segments; ++c) first.push_back(1 + c * size);
  first.push_back(L + 1);
  auto u32 = [](std::size_t v) { return static_cast<std::uint32_t>(v); };
  checkpoint_schedule s;
  for (std::size_t c = 0; c + 1 < segments; ++c)
    for (std::size_t i = first[c]; i < first[c + 1]; ++i) s.push_back(fn_op(u32(i)));
  for (std::size_t c = segments; c-- > 0;) {
    for (std::size_t i = first[c]; i < first[c + 1]; ++i) s.push_back(fe_op(u32(i)));
    for (std::size_t i = first[c + 1]; i-- > first[c];) s.push_back(b_op(u32(i)));
  }
  return detail::ckpt_finish(chain, "sequential:" + std::to_string(segments), std::move(s), budget);
}

GPUKIT_DETAIL_COMPILED_INLINE checkpoint_plan plan_sqrt(checkpoint_chain const& chain,
                                                        std::int64_t budget)
{
  auto const k = std::max<std::size_t>(
    1, static_cast<std::size_t>(std::lround(std::sqrt(static_cast<double>(chain.size())))));
  auto p    = plan_sequential(chain, k, budget);
  p.planner = "sqrt";
  return p;
}

GPUKIT_DETAIL_COMPILED_INLINE std::int64_t optimal_min_budget(checkpoint_chain const& chain)
{
  return detail::ckpt_min_budget(chain);
}

GPUKIT_DETAIL_COMPILED_INLINE checkpoint_plan plan_optimal(
  checkpoint_chain const& chain, std::int64_t budget, checkpoint_planner_options const& options)
{
  detail::ckpt_check_dp_arguments("plan_optimal", budget, options);
  std::int64_t const minimum = optimal_min_budget(chain);
  if (budget < minimum) {
    throw checkpoint_infeasible{"plan_optimal: no schedule fits a budget of " +
                                  std::to_string(budget) + "; the least budget is " +
                                  std::to_string(minimum),
                                minimum};
  }
  std::int64_t g = 0;
  for (auto const& s : chain.stages()) g = std::gcd(std::gcd(g, s.output_size), s.tape_size);
  if (g == 0) g = 1;
  std::int64_t unit = g;
  if (budget / g > options.slots) { unit = (budget + options.slots - 1) / options.slots; }
  detail::ckpt_dp dp{chain, detail::ckpt_make_units(chain, budget, unit),
                     options.max_table_entries};
  if (dp.time() >= detail::ckpt_dp::inf) {
    throw checkpoint_infeasible{
      "plan_optimal: no schedule fits a budget of " + std::to_string(budget) +
        " at a resolution of " + std::to_string(unit) +
        " (sizes rounded up); the exact least budget is " + std::to_string(minimum) +
        ": raise checkpoint_planner_options::slots above " + std::to_string(options.slots) +
        " or the budget",
      minimum};
  }
  auto p = detail::ckpt_finish(chain, "optimal", dp.schedule(), budget);
  GPUKIT_EXPECTS(p.time == dp.time(), "plan_optimal: internal error: the plan replays in " +
                                        std::to_string(p.time) + ", the tables said " +
                                        std::to_string(dp.time()));
  p.unit  = unit;
  p.exact = unit == g;
  return p;
}

GPUKIT_DETAIL_COMPILED_INLINE checkpoint_plan plan_exhaustive(checkpoint_chain const& chain,
                                                              std::int64_t budget)
{
  GPUKIT_EXPECTS(budget >= 0, "plan_exhaustive: budget " + std::to_string(budget) + " is negative");
  GPUKIT_EXPECTS(chain.size() <= exhaustive_max_stages,
                 "plan_exhaustive: " + std::to_string(chain.size()) +
                   " stages exceed the limit of " + std::to_string(exhaustive_max_stages));
  auto r = detail::ckpt_exhaustive(chain, budget);
  if (r.time < 0) {
    throw checkpoint_infeasible{
      "plan_exhaustive: no schedule fits a budget of " + std::to_string(budget),
      optimal_min_budget(chain)};
  }
  auto p = detail::ckpt_finish(chain, "exhaustive", std::move(r.schedule), budget);
  GPUKIT_EXPECTS(p.time == r.time, "plan_exhaustive: internal error: time mismatch");
  p.proven_optimal = true;
  return p;
}

namespace detail {

/// plan_best's dynamic program, monotone in the budget: the best of rotor's program at the size
/// units g 2^k (g the gcd of the sizes), each at the budget min(budget, slots g 2^k), for every k
/// up to the first whose range covers the budget. A finer unit (a divisor) at the same budget is
/// never slower, and each level's budget only grows with the budget, so the best over the levels
/// never rises when the budget does. Levels below the least persistent budget are skipped. When
/// slots >= 2L + 2 only the last two levels run: a plan of level k fits level k + 1 (each of the at
/// most 2L + 2 objects resident at once grows by less than g 2^k when rounded to the coarser unit,
/// and level k + 1's budget is g 2^k slots more), so the levels' best times never rise with k.
/// `plan.time` is -1 when none fits.
inline checkpoint_plan ckpt_best_persistent(checkpoint_chain const& chain, std::int64_t budget,
                                            checkpoint_planner_options const& options)
{
  std::int64_t g = 0;
  for (auto const& s : chain.stages()) g = std::gcd(std::gcd(g, s.output_size), s.tape_size);
  if (g == 0) g = 1;
  std::int64_t const need = ckpt_min_budget(chain);
  checkpoint_plan best;
  best.time                     = -1;
  bool const two_levels_suffice = options.slots >= 2 * static_cast<std::int64_t>(chain.size()) + 2;
  for (std::int64_t unit = g;; unit *= 2) {
    bool const last        = budget / unit <= options.slots;
    std::int64_t const cap = last ? budget : unit * options.slots;
    bool const needed      = !two_levels_suffice || last || budget / (2 * unit) <= options.slots;
    if (cap >= need && needed) {
      ckpt_dp dp{chain, ckpt_make_units(chain, cap, unit), options.max_table_entries};
      if (dp.time() < ckpt_dp::inf && (best.time < 0 || dp.time() < best.time)) {
        best       = ckpt_finish(chain, "best", dp.schedule(), budget);
        best.unit  = unit;
        best.exact = unit == g;
      }
    }
    if (last) break;
  }
  return best;
}

}  // namespace detail

GPUKIT_DETAIL_COMPILED_INLINE checkpoint_plan plan_best(checkpoint_chain const& chain,
                                                        std::int64_t budget,
                                                        checkpoint_planner_options const& options)
{
  detail::ckpt_check_dp_arguments("plan_best", budget, options);
  GPUKIT_EXPECTS(options.max_search_states <= detail::ckpt_astar::max_states_limit,
                 "plan_best: options.max_search_states = " +
                   std::to_string(options.max_search_states) + " exceeds 2^31");
  GPUKIT_EXPECTS(
    options.search_max_stages <= detail::ckpt_astar::max_stages,
    "plan_best: options.search_max_stages = " + std::to_string(options.search_max_stages) +
      " exceeds " + std::to_string(detail::ckpt_astar::max_stages));
  auto all = plan_store_all(chain);
  if (all.peak <= budget) {
    all.planner = "best";
    all.budget  = budget;
    return all;
  }
  auto p                = detail::ckpt_best_persistent(chain, budget, options);
  bool const searchable = chain.size() <= options.search_max_stages;
  if (searchable && !(p.time >= 0 && p.proven_optimal)) {
    std::int64_t const upper = p.time >= 0 ? p.time : std::numeric_limits<std::int64_t>::max();
    auto r                   = detail::ckpt_search(chain, budget, upper, options.max_search_states);
    if (r.time >= 0) {
      auto const unit = p.time >= 0 ? p.unit : 1;
      p               = detail::ckpt_finish(chain, "best", std::move(r.schedule), budget);
      p.unit          = unit;
      GPUKIT_EXPECTS(p.time == r.time, "plan_best: internal error: time mismatch");
    }
    p.proven_optimal = p.proven_optimal || (r.complete && p.time >= 0);
    if (p.time < 0 && r.complete) {
      auto const least = detail::ckpt_least_budget(chain, budget, optimal_min_budget(chain),
                                                   options.max_search_states);
      throw checkpoint_infeasible{
        "plan_best: no schedule fits a budget of " + std::to_string(budget) +
          (least.exact
             ? "; the least budget is " + std::to_string(least.budget)
             : "; a budget of " + std::to_string(least.budget) +
                 " fits (options.max_search_states = " + std::to_string(options.max_search_states) +
                 " stopped the search before a lower one was ruled out)"),
        least.budget};
    }
  }
  if (p.time < 0) {
    std::int64_t const minimum = optimal_min_budget(chain);
    throw checkpoint_infeasible{
      "plan_best: no schedule fits a budget of " + std::to_string(budget) +
        "; the least budget of a persistent schedule is " + std::to_string(minimum) +
        (minimum <= budget ? " (sizes rounded to the resolution of options.slots = " +
                               std::to_string(options.slots) + " made it infeasible: raise slots)"
                           : std::string{}),
      minimum};
  }
  return p;
}

GPUKIT_DETAIL_COMPILED_INLINE checkpoint_plan plan_with_offload(
  checkpoint_chain const& chain, std::int64_t budget, checkpoint_planner_options const& options)
{
  GPUKIT_EXPECTS(chain.copy_bandwidth() > 0,
                 "plan_with_offload: the chain has no copy bandwidth "
                 "(checkpoint_chain::set_copy_bandwidth, or a line \"bandwidth N\")");
  checkpoint_plan best;
  best.time          = -1;
  std::int64_t least = std::numeric_limits<std::int64_t>::max();
  try {
    best = plan_best(chain, budget, options);
  } catch (checkpoint_infeasible const& e) {
    least = e.minimum_budget();
  }
  std::int64_t const top = plan_store_all(chain).peak;
  for (std::int64_t k = 1; k <= 16; ++k) {
    auto const base =
      k == 16 ? plan_store_all(chain) : detail::ckpt_best_persistent(chain, top * k / 16, options);
    if (base.time < 0) continue;
    for (std::size_t variant = 0; variant < 6; ++variant) {
      detail::ckpt_copy_policy const policy{variant % 2 == 1, std::size_t{variant / 2 * 3 / 2}};
      auto s         = detail::ckpt_insert_copies(chain, base.schedule, policy);
      auto const sim = simulate_checkpoint_schedule(chain, s);
      least          = std::min(least, sim.peak);
      if (sim.peak <= budget && (best.time < 0 || sim.time < best.time)) {
        best = detail::ckpt_finish(chain, "offload", std::move(s), budget);
      }
    }
  }
  if (best.time < 0) {
    throw checkpoint_infeasible{"plan_with_offload: no plan fits a budget of " +
                                  std::to_string(budget) + "; the least budget it found is " +
                                  std::to_string(least),
                                least};
  }
  best.planner        = "offload";
  best.proven_optimal = best.time == chain.compute_time();  // plan_best's proof excludes copies
  return best;
}

GPUKIT_DETAIL_COMPILED_INLINE std::int64_t revolve_advances(std::int64_t steps, std::int64_t slots)
{
  GPUKIT_EXPECTS(slots >= 1, "revolve_advances: slots = " + std::to_string(slots) +
                               " is below 1 (the initial state needs one)");
  GPUKIT_EXPECTS(steps >= 0, "revolve_advances: steps = " + std::to_string(steps) + " is negative");
  return detail::revolve_bound(steps, std::min(slots, std::max<std::int64_t>(steps, 1)));
}

GPUKIT_DETAIL_COMPILED_INLINE checkpoint_schedule revolve_schedule(std::size_t steps,
                                                                   std::size_t slots)
{
  GPUKIT_EXPECTS(slots >= 1, "revolve_schedule: slots = " + std::to_string(slots) +
                               " is below 1 (the initial state needs one)");
  GPUKIT_EXPECTS(steps >= 1 && steps <= 4096,
                 "revolve_schedule: steps = " + std::to_string(steps) + " is outside 1..4096");
  detail::revolve_table table{steps, slots};
  checkpoint_schedule s;
  table.emit(0, steps, slots, s);
  return s;
}

GPUKIT_DETAIL_COMPILED_INLINE checkpoint_plan plan_revolve(checkpoint_chain const& chain,
                                                           std::size_t slots, std::int64_t budget)
{
  detail::ckpt_check_budget("plan_revolve", budget);
  return detail::ckpt_finish(chain, "revolve:" + std::to_string(slots),
                             revolve_schedule(chain.size(), slots), budget);
}

}  // namespace gpukit
