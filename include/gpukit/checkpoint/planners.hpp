// SPDX-License-Identifier: Apache-2.0
// gpukit/checkpoint/planners.hpp: activation checkpointing plans under a memory budget.
//
// Quick start:
//
//   #include <gpukit/checkpoint/planners.hpp>
//
//   #include <cstdint>
//
//   std::int64_t plan_a_quarter()
//   {
//     // Stage i: {forward time, backward time, output size, tape size}, any integer units.
//     gpukit::checkpoint_chain chain = gpukit::checkpoint_chain::uniform(32, {10, 20, 4, 12});
//     gpukit::checkpoint_plan all  = gpukit::plan_store_all(chain);  // the memory to beat
//     gpukit::checkpoint_plan best = gpukit::plan_best(chain, all.peak / 4);
//     // best.schedule: "Fn1 Fn2 ... Fe32 B32 ... B1"; best.time, best.peak: replayed in the
//     // simulator (gpukit/checkpoint/schedule.hpp), best.peak <= the budget.
//     try {
//       (void)gpukit::plan_best(chain, 3);
//     } catch (gpukit::checkpoint_infeasible const& e) {
//       return e.minimum_budget();  // the least budget with a plan
//     }
//     return best.time;
//   }
//
// Planners (every one returns a plan replayed in the simulator, so its time and peak are those of
// the cost model in gpukit/checkpoint/chain.hpp):
//
// | planner                    | what it is                                                      |
// |----------------------------|-----------------------------------------------------------------|
// | plan_store_all             | record every stage: the least time, the most memory             |
// | plan_sequential(k)         | PyTorch's checkpoint_sequential(k): k equal chunks              |
// | plan_sqrt                  | Chen et al.'s sqrt(L) segments: plan_sequential(round(sqrt L))  |
// | plan_optimal               | rotor's dynamic program: the least time among persistent        |
// |                            | schedules (below) that fit the budget                           |
// | plan_exhaustive            | the least time of any schedule (shortest path over memory       |
// |                            | states), for chains of up to 11 stages                          |
// | plan_revolve               | Griewank's binomial schedule for homogeneous chains, c slots    |
// | plan_best                  | the planner to use: rotor's program made monotone in the        |
// |                            | budget, then an A* search over every schedule bounded by it:    |
// |                            | the general optimum on chains of up to 11 stages                |
// | plan_with_offload          | plan_best, or rotor's schedules with kept activations offloaded |
// |                            | to pinned host memory and prefetched back (O<j>, P<j>)          |
//
// Persistent schedules, the class in which plan_optimal is exact: every tape is recorded once and
// kept until its backward; every activation is either consumed by the next operation alone (a
// forward without recording) or kept until the backward that needs it (B<j+1>), and a recording
// forward's input and output are kept. Schedules outside the class (e.g. dropping a kept x_j and
// recomputing it later, or recording a tape in the first forward and keeping it while its input is
// dropped and recomputed) are sometimes faster at the same budget; plan_exhaustive and plan_best
// find those on chains of up to 11 stages. plan.proven_optimal says when a plan's time is proven
// the least of any schedule.
#pragma once

#include <gpukit/checkpoint/chain.hpp>
#include <gpukit/checkpoint/detail/exhaustive.hpp>
#include <gpukit/checkpoint/detail/offload.hpp>
#include <gpukit/checkpoint/detail/optimal_dp.hpp>
#include <gpukit/checkpoint/detail/revolve.hpp>
#include <gpukit/checkpoint/detail/search.hpp>
#include <gpukit/checkpoint/schedule.hpp>
#include <gpukit/error.hpp>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <numeric>
#include <string>
#include <utility>

namespace gpukit {

/// A schedule with its replayed time and peak.
struct checkpoint_plan {
  std::string planner;             ///< "store-all", "sequential:K", "sqrt", "optimal", ...
  checkpoint_schedule schedule;    ///< the operations, in order
  std::int64_t time{0};            ///< total time, as the simulator replays the schedule
  std::int64_t peak{0};            ///< peak memory, as the simulator replays the schedule
  std::int64_t budget{-1};         ///< the budget it was planned for; -1 when none was given
  std::int64_t recomputations{0};  ///< forward operations beyond one per stage
  /// plan_optimal: true when the sizes were planned exactly, false when they were rounded up to
  /// `unit` (then the plan still fits; it is optimal for the rounded chain). Others: true.
  bool exact{true};
  std::int64_t unit{1};  ///< plan_optimal: the size unit of its tables (1 when exact)
  /// True only when the time is proven the least of any schedule that fits the budget: the
  /// search over every schedule completed (plan_exhaustive, plan_best), or the time equals the
  /// lower bound sum(f_i + b_i) (no schedule is faster than running each operation once).
  bool proven_optimal{false};
  std::int64_t offloads{0};   ///< O<j> copies in the schedule (plan_with_offload)
  std::int64_t copy_time{0};  ///< time the copy stream is busy, as the simulator replays it
  std::int64_t stall{0};      ///< time the compute stream waits for prefetches
};

/// Pass as a budget to mean "no budget".
inline constexpr std::int64_t no_checkpoint_budget = -1;

/// Settings of plan_optimal.
struct checkpoint_planner_options {
  /// Memory resolution of the dynamic program: sizes are planned exactly when the budget, in units
  /// of the greatest common divisor of all sizes, is at most `slots`; otherwise they are rounded
  /// up to ceil(budget / slots) (the plan still fits; the time is optimal for the rounded sizes).
  /// Time and memory grow as L^3 slots / 6 and L^2 slots / 2 at most.
  std::int64_t slots{512};
  /// Largest number of table entries (4 bytes each, 8 when a schedule of the chain may take 2^29
  /// time units or more) plan_optimal may allocate.
  std::size_t max_table_entries{std::size_t{1} << 25};
  /// plan_best: the longest chain on which it runs its search over every schedule (at most 29).
  /// Up to exhaustive_max_stages the search always completes (it is exact, and the time is
  /// monotone in the budget); beyond, it may stop at max_search_states and keep the dynamic
  /// program's plan, so a larger budget may then get a slower plan.
  std::size_t search_max_stages{11};
  /// plan_best: the most states its search may store (about 40 bytes each; at most 2^31).
  std::size_t max_search_states{std::size_t{1} << 23};
};

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

/// Records every stage: Fe1 ... FeL, BL ... B1. The least time (sum f + sum b) and the most memory.
/// @param budget when given (>= 0), the plan's peak must fit it
/// @throws checkpoint_infeasible when the peak exceeds the budget (minimum_budget() is the peak)
[[nodiscard]] inline checkpoint_plan plan_store_all(checkpoint_chain const& chain,
                                                    std::int64_t budget = no_checkpoint_budget)
{
  detail::ckpt_check_budget("plan_store_all", budget);
  checkpoint_schedule s;
  auto const L = static_cast<std::uint32_t>(chain.size());
  for (std::uint32_t i = 1; i <= L; ++i) s.push_back(fe_op(i));
  for (std::uint32_t i = L; i >= 1; --i) s.push_back(b_op(i));
  return detail::ckpt_finish(chain, "store-all", std::move(s), budget);
}

/// PyTorch's `checkpoint_sequential(functions, segments)`: chunks of floor(L / segments) stages,
/// the remainder going to the last chunk. The first segments - 1 chunks run forward without
/// recording (keeping each chunk's input), the last chunk records; in the backward, each earlier
/// chunk is recomputed with recording from its input, then run backward.
/// @param segments 1 <= segments <= L
/// @throws gpukit::logic_error naming `segments` when out of range
/// @throws checkpoint_infeasible when the peak exceeds a given budget
[[nodiscard]] inline checkpoint_plan plan_sequential(checkpoint_chain const& chain,
                                                     std::size_t segments,
                                                     std::int64_t budget = no_checkpoint_budget)
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

/// Chen et al.'s sqrt(L) checkpointing: plan_sequential with round(sqrt(L)) segments.
/// @throws checkpoint_infeasible when the peak exceeds a given budget
[[nodiscard]] inline checkpoint_plan plan_sqrt(checkpoint_chain const& chain,
                                               std::int64_t budget = no_checkpoint_budget)
{
  auto const k = std::max<std::size_t>(
    1, static_cast<std::size_t>(std::lround(std::sqrt(static_cast<double>(chain.size())))));
  auto p    = plan_sequential(chain, k, budget);
  p.planner = "sqrt";
  return p;
}

/// The least budget plan_optimal accepts for `chain`: the least peak of any persistent schedule
/// (see the top of this header), in the chain's size units. O(L^3).
[[nodiscard]] inline std::int64_t optimal_min_budget(checkpoint_chain const& chain)
{
  return detail::ckpt_min_budget(chain);
}

/// The fastest persistent schedule (see the top of this header) whose peak fits `budget`: rotor's
/// dynamic program in the cost model of gpukit/checkpoint/chain.hpp. Exact when the budget, in
/// units of the gcd of the sizes, is at most options.slots; otherwise sizes are rounded up
/// (plan.exact is false, the plan still fits). O(L^3 slots / 6) time at most, O(L^2 slots / 2)
/// memory at most.
/// @throws checkpoint_infeasible when no persistent schedule fits (minimum_budget() says the least
///         budget; when the budget is above it but rounding made it infeasible, the message says to
///         raise options.slots)
/// @throws gpukit::logic_error for a negative budget, slots < 1, or tables over
///         options.max_table_entries
[[nodiscard]] inline checkpoint_plan plan_optimal(checkpoint_chain const& chain,
                                                  std::int64_t budget,
                                                  checkpoint_planner_options const& options = {})
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

/// Longest chain plan_exhaustive accepts (its memory grows as 4^L: about 40 MB at 11 stages).
inline constexpr std::size_t exhaustive_max_stages = 11;

/// The fastest schedule of any kind whose peak fits `budget` (the general problem, NP-hard):
/// Dijkstra over memory states. For short chains, and to measure how far plan_optimal is from the
/// general optimum.
/// @throws gpukit::logic_error when the chain has more than exhaustive_max_stages stages or the
///         budget is negative
/// @throws checkpoint_infeasible when no schedule fits (minimum_budget() is the least budget
///         plan_optimal accepts, an upper bound of the general one)
[[nodiscard]] inline checkpoint_plan plan_exhaustive(checkpoint_chain const& chain,
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

/// The fastest plan this library can find for `budget`, monotone in the budget:
/// - a budget that fits plan_store_all gets it (no schedule is faster);
/// - otherwise rotor's dynamic program (plan_optimal's persistent schedules), taken as the best of
///   its size resolutions over budgets up to `budget` so that the time never rises with the budget
///   (see detail::ckpt_best_persistent; options.slots as in plan_optimal);
/// - then, on chains of up to options.search_max_stages stages, an A* search over every schedule
///   (the states of plan_exhaustive), bounded by that plan's time: it finds the schedules rotor's
///   class misses (a kept activation dropped and recomputed, a tape kept while its input is
///   recomputed). Up to exhaustive_max_stages it always completes, so the plan is the general
///   optimum, exactly plan_exhaustive's time.
/// plan.proven_optimal says whether the time is proven the least of any schedule (search completed,
/// or the time is sum(f + b)). plan.planner is "best".
/// @throws checkpoint_infeasible when no plan fits: minimum_budget() is the least budget of any
///         schedule when the searches ran to the end (a budget at which one fits when they stopped
///         at options.max_search_states, in all), else the least persistent one
/// @throws gpukit::logic_error as plan_optimal, or when options.search_max_stages exceeds 29
[[nodiscard]] inline checkpoint_plan plan_best(checkpoint_chain const& chain, std::int64_t budget,
                                               checkpoint_planner_options const& options = {})
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

/// plan_best with offload as a third choice for each kept activation (keep it on the device,
/// recompute it, or copy it to pinned host memory and prefetch it before its next use), priced by
/// chain.copy_bandwidth() in the two-stream model of simulate_checkpoint_schedule. Candidates:
/// plan_best at `budget` (so offload never makes a plan slower), and the schedules of rotor's
/// program at budgets k/16 of store-all's peak (k = 1..16; store-all itself at 16) with copies
/// inserted (detail::ckpt_insert_copies: each kept activation's longest idle stretch offloaded,
/// prefetched zero, one or three operations ahead, everywhere or only where the copies hide behind
/// compute), each replayed; the fastest that fits wins. The candidates other than plan_best do not
/// depend on the budget, so the time never rises with it. At infinite bandwidth the store-all
/// candidate keeps store-all's time at a lower peak. A heuristic: proven_optimal only when the time
/// is sum(f + b). plan.planner is "offload".
/// @throws gpukit::logic_error when the chain has no copy bandwidth, and as plan_best
/// @throws checkpoint_infeasible when no candidate fits (minimum_budget(): the least peak of any)
[[nodiscard]] inline checkpoint_plan plan_with_offload(
  checkpoint_chain const& chain, std::int64_t budget,
  checkpoint_planner_options const& options = {})
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

/// Griewank's binomial bound: the least number of forward steps without recording (the first sweep
/// included) that reverses `steps` steps with `slots` checkpoint slots, the initial state in one of
/// them and the current state not counted, when every reverse step reruns its own step with
/// recording (ADOL-C's `numforw`). 0 for steps <= 1.
/// @throws gpukit::logic_error when slots < 1 or steps < 0
[[nodiscard]] inline std::int64_t revolve_advances(std::int64_t steps, std::int64_t slots)
{
  GPUKIT_EXPECTS(slots >= 1, "revolve_advances: slots = " + std::to_string(slots) +
                               " is below 1 (the initial state needs one)");
  GPUKIT_EXPECTS(steps >= 0, "revolve_advances: steps = " + std::to_string(steps) + " is negative");
  return detail::revolve_bound(steps, std::min(slots, std::max<std::int64_t>(steps, 1)));
}

/// The binomial (Revolve) schedule reversing `steps` homogeneous steps with `slots` slots, as
/// operations: an advance is Fn<i>, the reverse step of step i is Fe<i> B<i>. It takes
/// revolve_advances(steps, slots) advances. O(steps^2 min(slots, steps)) time.
/// @throws gpukit::logic_error when slots < 1, steps < 1 or steps > 4096
[[nodiscard]] inline checkpoint_schedule revolve_schedule(std::size_t steps, std::size_t slots)
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

/// plan_revolve: the Revolve schedule for `chain` (meant for homogeneous chains: it ignores the
/// costs) with `slots` slots, replayed in the simulator.
/// @throws as revolve_schedule; checkpoint_infeasible when the peak exceeds a given budget
[[nodiscard]] inline checkpoint_plan plan_revolve(checkpoint_chain const& chain, std::size_t slots,
                                                  std::int64_t budget = no_checkpoint_budget)
{
  detail::ckpt_check_budget("plan_revolve", budget);
  return detail::ckpt_finish(chain, "revolve:" + std::to_string(slots),
                             revolve_schedule(chain.size(), slots), budget);
}

}  // namespace gpukit
