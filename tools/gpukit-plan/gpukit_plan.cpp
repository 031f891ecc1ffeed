// SPDX-License-Identifier: Apache-2.0
// gpukit-plan: activation checkpointing plans from the command line. No GPU needed.
//
//   gpukit-plan [--chain FILE] [--budget M]
//               [--planner best|optimal|exhaustive|sqrt|sequential:K|store-all|offload]
//               [--bandwidth B]
//   gpukit-plan revolve --steps L --slots C
//
// The chain is read from FILE (or standard input when --chain is absent or "-"), one stage a line:
// `f b a t` (forward time, backward time, output size, tape size; non-negative integers; blank
// lines and lines starting with # are skipped; a line `bandwidth B` gives the copy bandwidth that
// --planner offload needs). The cost model is that of
// gpukit/checkpoint/chain.hpp; the budget is in the units of the sizes (required by best, the
// default, optimal and exhaustive; a check for the others).
//
// Standard output: the schedule on one line (`Fn1 Fe2 ... B1`), then, as the last line, a JSON
// object: {"planner", "stages", "budget" (null when none), "time", "peak", "recomputations",
// "exact"} (offload adds "offloads", "copy_time" and "stall"), "exact" true only when the time is
// proven the least of any schedule that fits (the search over every schedule completed, or the time
// is sum(f + b)); time and peak as the simulator replays the schedule (every object dropped right
// after its last use). `revolve` prints Griewank's binomial schedule for L homogeneous steps with C
// checkpoint slots (an advance is Fn<i>, the reverse of step i is Fe<i> B<i>), then
// {"steps", "slots", "advances"}: the forward steps taken without recording.
//
// Exit status: 0 on success; 1 for malformed input (the message names the line and the value);
// 2 for a bad command line (unknown option, missing or malformed value); 3 when no plan of the
// chosen planner fits the budget (the message says the least budget it accepts).
//
//   printf '2 4 16 48\n2 4 16 48\n1 2 64 64\n' | build/dev/tools/gpukit-plan --budget 150
#include "plan_input.hpp"

#include <gpukit/checkpoint/planners.hpp>

#include <cstdint>
#include <exception>
#include <iostream>
#include <string>

namespace {

using namespace gpukit_plan;

int run(int argc, char** argv)
{
  command_line const c = parse_arguments(argc, argv);
  if (c.help) {
    std::cout << usage_text;
    return 0;
  }
  if (c.revolve) {
    check_table_size(c, 0);
    auto const schedule   = gpukit::revolve_schedule(static_cast<std::size_t>(*c.steps),
                                                     static_cast<std::size_t>(*c.slots));
    std::int64_t advances = 0;
    for (auto const& op : schedule) advances += op.kind == gpukit::checkpoint_op_kind::forward;
    std::cout << gpukit::to_string(schedule) << '\n'
              << "{\"steps\": " << *c.steps << ", \"slots\": " << *c.slots
              << ", \"advances\": " << advances << "}" << std::endl;
    return 0;
  }
  auto const chain = read_chain(c);
  check_table_size(c, static_cast<std::int64_t>(chain.size()));
  gpukit::checkpoint_plan p;
  try {
    p = plan(chain, c);
  } catch (gpukit::checkpoint_infeasible const& e) {
    std::cerr << "gpukit-plan: error: budget " << c.budget.value_or(-1) << " is infeasible for "
              << c.planner << " on this " << chain.size() << "-stage chain: " << plain(e.what())
              << '\n';
    return exit_infeasible;
  }
  std::cout << gpukit::to_string(p.schedule) << '\n'
            << "{\"planner\": \"" << p.planner << "\", \"stages\": " << chain.size()
            << ", \"budget\": " << (c.budget ? std::to_string(*c.budget) : std::string{"null"})
            << ", \"time\": " << p.time << ", \"peak\": " << p.peak
            << ", \"recomputations\": " << p.recomputations
            << ", \"exact\": " << (p.proven_optimal ? "true" : "false");
  if (c.planner == "offload") {
    std::cout << ", \"offloads\": " << p.offloads << ", \"copy_time\": " << p.copy_time
              << ", \"stall\": " << p.stall;
  }
  std::cout << "}" << std::endl;
  return 0;
}

}  // namespace

int main(int argc, char** argv)
{
  try {
    return run(argc, argv);
  } catch (usage_error const& e) {
    std::cerr << "gpukit-plan: error: " << e.message << "\n" << usage_text;
    return exit_usage;
  } catch (input_error const& e) {
    std::cerr << "gpukit-plan: error: " << e.message << '\n';
    return exit_input;
  } catch (gpukit::logic_error const& e) {  // a value the planners refuse
    std::cerr << "gpukit-plan: error: " << plain(e.what()) << '\n';
    return exit_usage;
  } catch (std::exception const& e) {
    std::cerr << "gpukit-plan: error: " << e.what() << '\n';
    return 4;
  }
}
