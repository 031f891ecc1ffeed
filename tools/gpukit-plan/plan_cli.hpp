// SPDX-License-Identifier: Apache-2.0
// plan_cli.hpp: gpukit-plan run in-process: its command line, the chain read from a file or from
// `in`, the plan written to `out` and errors to `err`. Shared by the tool (gpukit_plan.cpp) and its
// argument fuzz harness (tests/fuzz/plan_args_fuzz.cpp). Not installed.
#pragma once

#include "plan_input.hpp"

#include <gpukit/checkpoint/planners.hpp>

#include <cstdint>
#include <exception>
#include <istream>
#include <ostream>
#include <string>

namespace gpukit_plan {

/// The exit status of a failure that is none of the above: the system's (out of memory).
inline constexpr int exit_system = 4;

namespace detail {

inline int run_unchecked(int argc, char** argv, std::istream& in, std::ostream& out,
                         std::ostream& err, table_limits const& limits)
{
  command_line const c = parse_arguments(argc, argv);
  if (c.help) {
    out << usage_text;
    return 0;
  }
  if (c.revolve) {
    check_table_size(c, 0, limits);
    auto const schedule   = gpukit::revolve_schedule(static_cast<std::size_t>(*c.steps),
                                                     static_cast<std::size_t>(*c.slots));
    std::int64_t advances = 0;
    for (auto const& op : schedule) advances += op.kind == gpukit::checkpoint_op_kind::forward;
    out << gpukit::to_string(schedule) << '\n'
        << "{\"steps\": " << *c.steps << ", \"slots\": " << *c.slots
        << ", \"advances\": " << advances << "}" << std::endl;
    return 0;
  }
  auto const chain = read_chain(c, in);
  check_table_size(c, static_cast<std::int64_t>(chain.size()), limits);
  gpukit::checkpoint_plan p;
  try {
    p = plan(chain, c);
  } catch (gpukit::checkpoint_infeasible const& e) {
    err << "gpukit-plan: error: budget " << c.budget.value_or(-1) << " is infeasible for "
        << c.planner << " on this " << chain.size() << "-stage chain: " << plain(e.what()) << '\n';
    return exit_infeasible;
  }
  out << gpukit::to_string(p.schedule) << '\n'
      << "{\"planner\": \"" << p.planner << "\", \"stages\": " << chain.size()
      << ", \"budget\": " << (c.budget ? std::to_string(*c.budget) : std::string{"null"})
      << ", \"time\": " << p.time << ", \"peak\": " << p.peak
      << ", \"recomputations\": " << p.recomputations
      << ", \"exact\": " << (p.proven_optimal ? "true" : "false");
  if (c.planner == "offload") {
    out << ", \"offloads\": " << p.offloads << ", \"copy_time\": " << p.copy_time
        << ", \"stall\": " << p.stall;
  }
  out << "}" << std::endl;
  return 0;
}

}  // namespace detail

/// gpukit-plan with arguments `argv` (see gpukit_plan.cpp): the chain comes from --chain FILE or
/// from `in`, the plan goes to `out`, errors to `err`. Returns the exit status: 0, exit_input,
/// exit_usage, exit_infeasible, or exit_system. `limits` bound the tables (the tool's by default).
/// Throws nothing.
inline int run(int argc, char** argv, std::istream& in, std::ostream& out, std::ostream& err,
               table_limits const& limits = {}) noexcept
{
  try {
    try {
      return detail::run_unchecked(argc, argv, in, out, err, limits);
    } catch (usage_error const& e) {
      err << "gpukit-plan: error: " << e.message << "\n" << usage_text;
      return exit_usage;
    } catch (input_error const& e) {
      err << "gpukit-plan: error: " << e.message << '\n';
      return exit_input;
    } catch (gpukit::logic_error const& e) {  // a value the planners refuse
      err << "gpukit-plan: error: " << plain(e.what()) << '\n';
      return exit_usage;
    } catch (std::exception const& e) {
      err << "gpukit-plan: error: " << plain(e.what()) << '\n';
      return exit_system;
    }
  } catch (...) {  // the error stream itself failed
    return exit_system;
  }
}

}  // namespace gpukit_plan
