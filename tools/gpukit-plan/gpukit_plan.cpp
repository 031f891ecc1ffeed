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
// chosen planner fits the budget (the message says the least budget it accepts); 4 when the system
// fails (out of memory). plan_cli.hpp runs it, in-process for the argument fuzz harness too.
//
//   printf '2 4 16 48\n2 4 16 48\n1 2 64 64\n' | build/dev/tools/gpukit-plan --budget 150
#include "plan_cli.hpp"

#include <iostream>

int main(int argc, char** argv)
{
  return gpukit_plan::run(argc, argv, std::cin, std::cout, std::cerr);
}
