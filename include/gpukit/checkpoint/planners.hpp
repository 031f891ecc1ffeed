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
#include <gpukit/checkpoint/schedule.hpp>
#include <gpukit/detail/compiled_mode.hpp>
#include <gpukit/error.hpp>

#include <cstddef>
#include <cstdint>
#include <string>

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

/// Records every stage: Fe1 ... FeL, BL ... B1. The least time (sum f + sum b) and the most memory.
/// @param budget when given (>= 0), the plan's peak must fit it
/// @throws checkpoint_infeasible when the peak exceeds the budget (minimum_budget() is the peak)
[[nodiscard]] checkpoint_plan plan_store_all(checkpoint_chain const& chain,
                                             std::int64_t budget = no_checkpoint_budget);

/// PyTorch's `checkpoint_sequential(functions, segments)`: chunks of floor(L / segments) stages,
/// the remainder going to the last chunk. The first segments - 1 chunks run forward without
/// recording (keeping each chunk's input), the last chunk records; in the backward, each earlier
/// chunk is recomputed with recording from its input, then run backward.
/// @param segments 1 <= segments <= L
/// @throws gpukit::logic_error naming `segments` when out of range
/// @throws checkpoint_infeasible when the peak exceeds a given budget
[[nodiscard]] checkpoint_plan plan_sequential(checkpoint_chain const& chain, std::size_t segments,
                                              std::int64_t budget = no_checkpoint_budget);

/// Chen et al.'s sqrt(L) checkpointing: plan_sequential with round(sqrt(L)) segments.
/// @throws checkpoint_infeasible when the peak exceeds a given budget
[[nodiscard]] checkpoint_plan plan_sqrt(checkpoint_chain const& chain,
                                        std::int64_t budget = no_checkpoint_budget);

/// The least budget plan_optimal accepts for `chain`: the least peak of any persistent schedule
/// (see the top of this header), in the chain's size units. O(L^3).
[[nodiscard]] std::int64_t optimal_min_budget(checkpoint_chain const& chain);

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
[[nodiscard]] checkpoint_plan plan_optimal(checkpoint_chain const& chain, std::int64_t budget,
                                           checkpoint_planner_options const& options = {});

/// Longest chain plan_exhaustive accepts (its memory grows as 4^L: about 40 MB at 11 stages).
inline constexpr std::size_t exhaustive_max_stages = 11;

/// The fastest schedule of any kind whose peak fits `budget` (the general problem, NP-hard):
/// Dijkstra over memory states. For short chains, and to measure how far plan_optimal is from the
/// general optimum.
/// @throws gpukit::logic_error when the chain has more than exhaustive_max_stages stages or the
///         budget is negative
/// @throws checkpoint_infeasible when no schedule fits (minimum_budget() is the least budget
///         plan_optimal accepts, an upper bound of the general one)
[[nodiscard]] checkpoint_plan plan_exhaustive(checkpoint_chain const& chain, std::int64_t budget);

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
[[nodiscard]] checkpoint_plan plan_best(checkpoint_chain const& chain, std::int64_t budget,
                                        checkpoint_planner_options const& options = {});

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
[[nodiscard]] checkpoint_plan plan_with_offload(checkpoint_chain const& chain, std::int64_t budget,
                                                checkpoint_planner_options const& options = {});

/// Griewank's binomial bound: the least number of forward steps without recording (the first sweep
/// included) that reverses `steps` steps with `slots` checkpoint slots, the initial state in one of
/// them and the current state not counted, when every reverse step reruns its own step with
/// recording (ADOL-C's `numforw`). 0 for steps <= 1.
/// @throws gpukit::logic_error when slots < 1 or steps < 0
[[nodiscard]] std::int64_t revolve_advances(std::int64_t steps, std::int64_t slots);

/// The binomial (Revolve) schedule reversing `steps` homogeneous steps with `slots` slots, as
/// operations: an advance is Fn<i>, the reverse step of step i is Fe<i> B<i>. It takes
/// revolve_advances(steps, slots) advances. O(steps^2 min(slots, steps)) time.
/// @throws gpukit::logic_error when slots < 1, steps < 1 or steps > 4096
[[nodiscard]] checkpoint_schedule revolve_schedule(std::size_t steps, std::size_t slots);

/// plan_revolve: the Revolve schedule for `chain` (meant for homogeneous chains: it ignores the
/// costs) with `slots` slots, replayed in the simulator.
/// @throws as revolve_schedule; checkpoint_infeasible when the peak exceeds a given budget
[[nodiscard]] checkpoint_plan plan_revolve(checkpoint_chain const& chain, std::size_t slots,
                                           std::int64_t budget = no_checkpoint_budget);

}  // namespace gpukit

// The bodies: compiled by every includer header-only, once in gpukit::compiled (src/planners.cpp)
// in compiled mode, where the planners' algorithms (detail/) are no consumer's include.
#ifndef GPUKIT_COMPILED_LIBRARY
#include <gpukit/checkpoint/detail/planners_impl.hpp>
#endif
