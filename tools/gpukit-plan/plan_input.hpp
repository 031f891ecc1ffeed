// SPDX-License-Identifier: Apache-2.0
// plan_input.hpp: gpukit-plan's input, parsed and checked: the command line, the chain, and the
// size of the tables a planner would build, refused before anything is allocated. Shared by the
// tool (gpukit_plan.cpp, through plan_cli.hpp) and its fuzz harnesses (tests/fuzz/plan_fuzz.cpp,
// plan_args_fuzz.cpp). Not installed.
#pragma once

#include <gpukit/checkpoint/planners.hpp>

#include <cstdint>
#include <cstdio>
#include <exception>
#include <fstream>
#include <iostream>
#include <limits>
#include <optional>
#include <string>
#include <vector>

namespace gpukit_plan {

inline constexpr int exit_input      = 1;
inline constexpr int exit_usage      = 2;
inline constexpr int exit_infeasible = 3;

inline char const* const usage_text =
  "usage: gpukit-plan [--chain FILE] [--budget M] [--planner NAME] [--bandwidth B]\n"
  "       gpukit-plan revolve --steps L --slots C\n"
  "The chain (FILE, or standard input) has one stage a line: f b a t (forward time, backward\n"
  "time, output size, tape size; non-negative integers). The budget is in the units of the\n"
  "sizes. Prints the schedule, then a JSON line (\"exact\": true only when the time is proven\n"
  "the least of any schedule that fits the budget).\n"
  "Planners (--planner NAME):\n"
  "  best          the default: rotor's dynamic program, then a search over every schedule on\n"
  "                chains of up to 11 stages (exact there); needs --budget\n"
  "  optimal       rotor's dynamic program alone: the fastest persistent schedule; needs --budget\n"
  "  exhaustive    shortest path over every memory state, up to 11 stages; needs --budget\n"
  "  sqrt          sqrt(L) equal segments\n"
  "  sequential:K  K equal segments (PyTorch's checkpoint_sequential)\n"
  "  store-all     record every stage\n"
  "  offload       best, with kept activations also offloaded to pinned host memory and\n"
  "                prefetched back (ops O<j>, P<j>); needs --budget and a copy bandwidth\n"
  "--bandwidth B: size units copied per time unit (or inf), overriding a \"bandwidth B\" line\n"
  "of the chain; a copy overlaps compute on a stream of its own.\n";

/// The planners --planner accepts, for messages.
inline char const* const planner_names =
  "best, optimal, exhaustive, sqrt, sequential:K, store-all, offload";

/// A bad command line: exit 2.
struct usage_error {
  std::string message;
};
/// Malformed input: exit 1.
struct input_error {
  std::string message;
};

/// A gpukit message without its "gpukit: " prefix: the tool prints its own. (The tool is built
/// with GPUKIT_ERROR_LOCATIONS=0: no source location follows the message.)
inline std::string plain(std::string message)
{
  if (message.rfind("gpukit: ", 0) == 0) message.erase(0, 8);
  return message;
}

/// A non-negative decimal integer that fits in int64, or a usage error naming the option.
inline std::int64_t parse_count(std::string const& option, std::string const& text)
{
  bool ok =
    !text.empty() && text.size() <= 18 && text.find_first_not_of("0123456789") == std::string::npos;
  if (!ok) {
    throw usage_error{option + ": \"" + text + "\" is not a non-negative integer" +
                      (text.size() > 18 && text.find_first_not_of("0123456789") == std::string::npos
                         ? " below 10^18"
                         : "")};
  }
  std::int64_t v = 0;  // at most 18 digits: below 10^18, no overflow
  for (char const d : text) v = v * 10 + (d - '0');
  return v;
}

struct command_line {
  bool revolve{false};
  bool help{false};
  std::optional<std::string> chain_file;
  std::optional<std::int64_t> budget;
  std::string planner{"best"};
  std::optional<std::int64_t> steps, slots;
  std::optional<std::int64_t> bandwidth;  ///< --bandwidth; infinite_bandwidth for inf
};

inline command_line parse_arguments(int argc, char** argv)
{
  command_line c;
  std::vector<std::string> args(argv + 1, argv + argc);
  std::size_t k = 0;
  if (!args.empty() && args[0] == "revolve") c.revolve = true, k = 1;
  std::vector<std::string> seen;
  for (; k < args.size(); ++k) {
    std::string name = args[k], value;
    bool has_value   = false;
    if (name == "--help" || name == "-h") {
      c.help = true;
      continue;
    }
    if (auto eq = name.find('='); name.rfind("--", 0) == 0 && eq != std::string::npos) {
      value = name.substr(eq + 1), name = name.substr(0, eq), has_value = true;
    }
    bool const known = c.revolve ? (name == "--steps" || name == "--slots")
                                 : (name == "--chain" || name == "--budget" ||
                                    name == "--planner" || name == "--bandwidth");
    if (!known) {
      if (name.rfind("-", 0) != 0) {
        throw usage_error{"unexpected argument \"" + name + "\"" +
                          (c.revolve || k != 0 ? "" : " (the only subcommand is revolve)")};
      }
      throw usage_error{
        "unknown option \"" + name + "\"" +
        (c.revolve ? " for revolve (it takes --steps L --slots C)"
                   : " (options: --chain FILE, --budget M, --planner NAME, --bandwidth B)")};
    }
    for (auto const& s : seen)
      if (s == name) throw usage_error{name + " is given twice"};
    seen.push_back(name);
    if (!has_value) {
      if (k + 1 >= args.size()) throw usage_error{name + " needs a value"};
      value = args[++k];
    }
    if (name == "--chain") {
      if (value.empty()) throw usage_error{"--chain needs a file name"};
      c.chain_file = value;
    } else if (name == "--budget") {
      c.budget = parse_count(name, value);
    } else if (name == "--planner") {
      c.planner = value;
    } else if (name == "--bandwidth") {
      c.bandwidth =
        value == "inf" ? gpukit::checkpoint_chain::infinite_bandwidth : parse_count(name, value);
      if (*c.bandwidth == 0) throw usage_error{"--bandwidth 0: a copy bandwidth is positive"};
    } else if (name == "--steps") {
      c.steps = parse_count(name, value);
    } else {
      c.slots = parse_count(name, value);
    }
  }
  if (c.help) return c;
  if (c.revolve) {
    if (!c.steps) throw usage_error{"revolve needs --steps L"};
    if (!c.slots) throw usage_error{"revolve needs --slots C"};
    if (*c.steps < 1 || *c.steps > 4096)
      throw usage_error{"--steps " + std::to_string(*c.steps) + " is outside 1..4096"};
    if (*c.slots < 1) throw usage_error{"--slots 0 is below 1 (the initial state takes a slot)"};
    return c;
  }
  bool const needs_budget = c.planner == "best" || c.planner == "optimal" ||
                            c.planner == "exhaustive" || c.planner == "offload";
  bool const known_planner = needs_budget || c.planner == "sqrt" || c.planner == "store-all" ||
                             c.planner.rfind("sequential:", 0) == 0;
  if (!known_planner) {
    throw usage_error{"--planner \"" + c.planner + "\" is not one of " + planner_names};
  }
  if (needs_budget && !c.budget) {
    throw usage_error{"the " + c.planner + " planner needs --budget M (in the units of the sizes)"};
  }
  return c;
}

/// The chain of --chain FILE, or read from `in` when there is none or it is "-".
inline gpukit::checkpoint_chain read_chain(command_line const& c, std::istream& in = std::cin)
{
  std::string const name = c.chain_file.value_or("-");
  auto with_bandwidth    = [&](gpukit::checkpoint_chain chain) {
    if (c.bandwidth) chain.set_copy_bandwidth(*c.bandwidth);
    return chain;
  };
  try {
    if (name == "-") return with_bandwidth(gpukit::parse_checkpoint_chain(in));
    std::ifstream file{name};
    if (!file) throw input_error{"cannot open the chain file \"" + name + "\""};
    return with_bandwidth(gpukit::parse_checkpoint_chain(file));
  } catch (gpukit::logic_error const& e) {
    throw input_error{(name == "-" ? std::string{"standard input"} : name) + ": " +
                      plain(e.what())};
  }
}

inline gpukit::checkpoint_plan plan(gpukit::checkpoint_chain const& chain, command_line const& c)
{
  std::int64_t const budget = c.budget.value_or(gpukit::no_checkpoint_budget);
  if (c.planner == "store-all") return gpukit::plan_store_all(chain, budget);
  if (c.planner == "sqrt") return gpukit::plan_sqrt(chain, budget);
  if (c.planner == "offload") {
    if (chain.copy_bandwidth() == 0) {
      throw usage_error{
        "--planner offload needs a copy bandwidth: --bandwidth B or a line "
        "\"bandwidth B\" in the chain"};
    }
    return gpukit::plan_with_offload(chain, budget);
  }
  if (c.planner == "exhaustive") {
    if (chain.size() > gpukit::exhaustive_max_stages) {
      throw usage_error{"--planner exhaustive takes chains of up to " +
                        std::to_string(gpukit::exhaustive_max_stages) + " stages; this one has " +
                        std::to_string(chain.size()) + " (--planner best plans any length)"};
    }
    return gpukit::plan_exhaustive(chain, budget);
  }
  if (c.planner == "best" || c.planner == "optimal") {
    // Sizes are rounded to budget / slots when the budget is large in units of their gcd. Should
    // the rounding alone make the budget infeasible, plan at a finer resolution.
    gpukit::checkpoint_planner_options options;
    while (true) {
      try {
        return c.planner == "best" ? gpukit::plan_best(chain, budget, options)
                                   : gpukit::plan_optimal(chain, budget, options);
      } catch (gpukit::checkpoint_infeasible const& e) {
        if (e.minimum_budget() > budget || options.slots >= (std::int64_t{1} << 20)) throw;
        options.slots *= 4;
      }
    }
  }
  std::string const k = c.planner.substr(std::string{"sequential:"}.size());
  if (k.empty() || k.find_first_not_of("0123456789") != std::string::npos) {
    throw usage_error{"--planner \"" + c.planner +
                      "\": K in sequential:K must be a positive integer (the number of segments)"};
  }
  std::size_t segments = 0;  // more than 9 digits: beyond any chain, and no overflow
  if (k.size() <= 9) {
    for (char const d : k) segments = segments * 10 + static_cast<std::size_t>(d - '0');
  }
  if (k.size() > 9 || segments < 1 || segments > chain.size()) {
    throw usage_error{
      "--planner \"" + c.planner + "\": " + (k.size() > 9 ? k : std::to_string(segments)) +
      " segments is outside 1.." + std::to_string(chain.size()) + " (the number of stages)"};
  }
  return gpukit::plan_sequential(chain, segments, budget);
}

/// Most memory the tables of one plan may take (bytes): larger inputs are refused up front.
inline constexpr std::int64_t memory_limit_bytes = std::int64_t{1} << 30;

/// Most inner steps of revolve's dynamic program (steps^2 min(slots, steps)): seconds, not minutes.
inline constexpr std::int64_t revolve_work_limit = std::int64_t{1} << 33;

/// Bytes plan_optimal's tables take at most for an L-stage chain: five (L+1)^2 index tables of 8
/// bytes (bounds, ranges, offsets), plus the dynamic program itself, capped at max_table_entries
/// of 8 bytes.
[[nodiscard]] inline std::int64_t optimal_table_bytes(std::int64_t stages)
{
  std::int64_t const w = stages + 1;
  return 40 * w * w +
         8 * static_cast<std::int64_t>(gpukit::checkpoint_planner_options{}.max_table_entries);
}

/// Bytes revolve_schedule's tables take for L steps and C slots: two (L+1)(min(C, L)+1) tables of
/// 8 bytes.
[[nodiscard]] inline std::int64_t revolve_table_bytes(std::int64_t steps, std::int64_t slots)
{
  std::int64_t const c = std::min(slots, std::max<std::int64_t>(steps, 1));
  return 16 * (steps + 1) * (c + 1);
}

/// The limits check_table_size enforces: the tool's by default (a fuzz harness lowers them, so
/// that no input takes seconds).
struct table_limits {
  std::int64_t memory_bytes{memory_limit_bytes};
  std::int64_t revolve_work{revolve_work_limit};
};

/// Refuses, before anything is allocated, a revolve or an optimal plan whose tables would take
/// more than `limits.memory_bytes`, or a revolve of more than `limits.revolve_work` table steps (an
/// input_error naming the count and the limit). Other planners take memory linear in the chain.
inline void check_table_size(command_line const& c, std::int64_t stages,
                             table_limits const& limits = {})
{
  constexpr std::int64_t mib = std::int64_t{1} << 20;
  if (c.revolve) {
    std::int64_t const bytes = revolve_table_bytes(*c.steps, *c.slots);
    std::int64_t const c2    = std::min(*c.slots, std::max<std::int64_t>(*c.steps, 1));
    std::int64_t const work  = *c.steps * *c.steps * c2;  // its dynamic program's inner steps
    if (work > limits.revolve_work) {
      throw input_error{"revolve with --steps " + std::to_string(*c.steps) + " and --slots " +
                        std::to_string(*c.slots) + " takes about " + std::to_string(work) +
                        " table steps, over the limit of " + std::to_string(limits.revolve_work) +
                        " (fewer steps or slots)"};
    }
    if (bytes > limits.memory_bytes) {
      throw input_error{"revolve with --steps " + std::to_string(*c.steps) + " and --slots " +
                        std::to_string(*c.slots) + " needs tables of " +
                        std::to_string(bytes / mib) + " MiB, over the limit of " +
                        std::to_string(limits.memory_bytes / mib) + " MiB"};
    }
    return;
  }
  if (c.planner != "optimal" && c.planner != "best" && c.planner != "offload") return;
  std::int64_t const bytes = optimal_table_bytes(stages);
  if (bytes > limits.memory_bytes) {
    std::int64_t most = 1;  // the longest chain under the limit
    while (optimal_table_bytes(most + 1) <= limits.memory_bytes) most += 1 + most / 8;
    while (optimal_table_bytes(most) > limits.memory_bytes) --most;
    throw input_error{"the " + c.planner + " planner on " + std::to_string(stages) +
                      " stages needs tables of about " + std::to_string(bytes / mib) +
                      " MiB, over the limit of " + std::to_string(limits.memory_bytes / mib) +
                      " MiB (at most " + std::to_string(most) +
                      " stages; --planner sqrt, sequential:K or store-all take any length)"};
  }
}

}  // namespace gpukit_plan
