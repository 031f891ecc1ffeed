// gpukit-plan: activation checkpointing plans from the command line. No GPU needed.
//
//   gpukit-plan [--chain FILE] [--budget M] [--planner optimal|sqrt|sequential:K|store-all]
//   gpukit-plan revolve --steps L --slots C
//
// The chain is read from FILE (or standard input when --chain is absent or "-"), one stage a line:
// `f b a t` (forward time, backward time, output size, tape size; non-negative integers; blank
// lines and lines starting with # are skipped). The cost model is that of
// gpukit/checkpoint/chain.hpp; the budget is in the units of the sizes (required by the optimal
// planner, a check for the others).
//
// Standard output: the schedule on one line (`Fn1 Fe2 ... B1`), then, as the last line, a JSON
// object: {"planner", "stages", "budget" (null when none), "time", "peak", "recomputations",
// "exact"}, time and peak as the simulator replays the schedule (every object dropped right after
// its last use). `revolve` prints Griewank's binomial schedule for L homogeneous steps with C
// checkpoint slots (an advance is Fn<i>, the reverse of step i is Fe<i> B<i>), then
// {"steps", "slots", "advances"}: the forward steps taken without recording.
//
// Exit status: 0 on success; 1 for malformed input (the message names the line and the value);
// 2 for a bad command line (unknown option, missing or malformed value); 3 when no plan of the
// chosen planner fits the budget (the message says the least budget it accepts).
//
//   printf '2 4 16 48\n2 4 16 48\n1 2 64 64\n' | build/dev/tools/gpukit-plan --budget 150
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

namespace {

constexpr int exit_input      = 1;
constexpr int exit_usage      = 2;
constexpr int exit_infeasible = 3;

char const* const usage_text =
  "usage: gpukit-plan [--chain FILE] [--budget M] "
  "[--planner optimal|sqrt|sequential:K|store-all]\n"
  "       gpukit-plan revolve --steps L --slots C\n"
  "The chain (FILE, or standard input) has one stage a line: f b a t (forward time, backward\n"
  "time, output size, tape size; non-negative integers). The budget is in the units of the\n"
  "sizes; the optimal planner (the default) needs one. Prints the schedule, then a JSON line.\n";

/// A bad command line: exit 2.
struct usage_error {
  std::string message;
};
/// Malformed input: exit 1.
struct input_error {
  std::string message;
};

/// gpukit's messages end with the source location that threw, "(.../file.hpp:123)": useful in a
/// library, noise for a command-line user.
std::string plain(std::string message)
{
  if (message.rfind("gpukit: ", 0) == 0) message.erase(0, 8);
  auto const open = message.rfind(" (");
  if (open != std::string::npos && !message.empty() && message.back() == ')' &&
      message.find(':', open) != std::string::npos &&
      message.find(' ', open + 2) == std::string::npos) {
    message.erase(open);
  }
  return message;
}

/// A non-negative decimal integer that fits in int64, or a usage error naming the option.
std::int64_t parse_count(std::string const& option, std::string const& text)
{
  bool ok =
    !text.empty() && text.size() <= 18 && text.find_first_not_of("0123456789") == std::string::npos;
  if (!ok) {
    throw usage_error{option + ": \"" + text + "\" is not a non-negative integer" +
                      (text.size() > 18 && text.find_first_not_of("0123456789") == std::string::npos
                         ? " below 10^18"
                         : "")};
  }
  return std::stoll(text);
}

struct command_line {
  bool revolve{false};
  bool help{false};
  std::optional<std::string> chain_file;
  std::optional<std::int64_t> budget;
  std::string planner{"optimal"};
  std::optional<std::int64_t> steps, slots;
};

command_line parse_arguments(int argc, char** argv)
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
                                 : (name == "--chain" || name == "--budget" || name == "--planner");
    if (!known) {
      if (name.rfind("-", 0) != 0) {
        throw usage_error{"unexpected argument \"" + name + "\"" +
                          (c.revolve || k != 0 ? "" : " (the only subcommand is revolve)")};
      }
      throw usage_error{"unknown option \"" + name + "\"" +
                        (c.revolve ? " for revolve (it takes --steps L --slots C)"
                                   : " (options: --chain FILE, --budget M, --planner NAME)")};
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
  bool const known_planner = c.planner == "optimal" || c.planner == "sqrt" ||
                             c.planner == "store-all" || c.planner.rfind("sequential:", 0) == 0;
  if (!known_planner) {
    throw usage_error{"--planner \"" + c.planner +
                      "\" is not one of optimal, sqrt, sequential:K, store-all"};
  }
  if (c.planner == "optimal" && !c.budget) {
    throw usage_error{"the optimal planner needs --budget M (in the units of the sizes)"};
  }
  return c;
}

gpukit::checkpoint_chain read_chain(command_line const& c)
{
  std::string const name = c.chain_file.value_or("-");
  try {
    if (name == "-") return gpukit::parse_checkpoint_chain(std::cin);
    std::ifstream in{name};
    if (!in) throw input_error{"cannot open the chain file \"" + name + "\""};
    return gpukit::parse_checkpoint_chain(in);
  } catch (gpukit::logic_error const& e) {
    throw input_error{(name == "-" ? std::string{"standard input"} : name) + ": " +
                      plain(e.what())};
  }
}

gpukit::checkpoint_plan plan(gpukit::checkpoint_chain const& chain, command_line const& c)
{
  std::int64_t const budget = c.budget.value_or(gpukit::no_checkpoint_budget);
  if (c.planner == "store-all") return gpukit::plan_store_all(chain, budget);
  if (c.planner == "sqrt") return gpukit::plan_sqrt(chain, budget);
  if (c.planner == "optimal") {
    // Sizes are rounded to budget / slots when the budget is large in units of their gcd. Should
    // the rounding alone make the budget infeasible, plan at a finer resolution.
    gpukit::checkpoint_planner_options options;
    while (true) {
      try {
        return gpukit::plan_optimal(chain, budget, options);
      } catch (gpukit::checkpoint_infeasible const& e) {
        if (e.minimum_budget() > budget || options.slots >= (std::int64_t{1} << 20)) throw;
        options.slots *= 4;
      }
    }
  }
  std::string const k = c.planner.substr(std::string{"sequential:"}.size());
  if (k.empty() || k.find_first_not_of("0123456789") != std::string::npos || k.size() > 9) {
    throw usage_error{"--planner \"" + c.planner +
                      "\": K in sequential:K must be a positive integer (the number of segments)"};
  }
  std::size_t const segments = std::stoul(k);
  if (segments < 1 || segments > chain.size()) {
    throw usage_error{"--planner \"" + c.planner + "\": " + std::to_string(segments) +
                      " segments is outside 1.." + std::to_string(chain.size()) +
                      " (the number of stages)"};
  }
  return gpukit::plan_sequential(chain, segments, budget);
}

int run(int argc, char** argv)
{
  command_line const c = parse_arguments(argc, argv);
  if (c.help) {
    std::cout << usage_text;
    return 0;
  }
  if (c.revolve) {
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
            << ", \"exact\": " << (p.exact ? "true" : "false") << "}" << std::endl;
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
