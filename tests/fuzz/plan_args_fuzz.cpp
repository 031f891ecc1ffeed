// SPDX-License-Identifier: Apache-2.0
// libFuzzer harness for gpukit-plan's command line (tools/gpukit-plan/plan_cli.hpp): the input is
// the argument list (fuzz_argv.hpp: split at newlines and NULs), run in-process by the tool's own
// run(). Every argument list must end in one of the documented exit statuses (0, 1, 2, 3) with
// nothing thrown; a failure says so on standard error only, a plan goes to standard output only.
// The chain is a small fixed one (plan_fuzz.cpp fuzzes chains): the value of every --chain other
// than "-" is replaced by a file holding it, and standard input holds it too. Revolve's work limit
// is lowered to 2^20 table steps, so that no input takes seconds under the sanitizers.
#include "../../tools/gpukit-plan/plan_cli.hpp"
#include "fuzz_argv.hpp"

#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

namespace {

// Four stages, and the copy bandwidth that --planner offload needs.
constexpr char const* chain_text = "bandwidth 2\n2 4 16 48\n2 4 16 48\n1 2 64 64\n1 1 8 8\n";

// A file holding chain_text, written once.
std::string const& chain_file()
{
  static std::string const path = [] {
    char name[]  = "/tmp/gpukit_plan_args_fuzz_XXXXXX";
    int const fd = ::mkstemp(name);
    if (fd < 0) std::abort();
    ::close(fd);
    std::ofstream{name} << chain_text;
    return std::string{name};
  }();
  return path;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(std::uint8_t const* data, std::size_t size)
{
  gpukit_fuzz::fuzz_argv args{"gpukit-plan", data, size};
  auto& words = args.words();
  for (std::size_t i = 1; i < words.size(); ++i) {
    if (words[i] == "--chain" && i + 1 < words.size() && words[i + 1] != "-") {
      words[i + 1] = chain_file();
    } else if (words[i].rfind("--chain=", 0) == 0 && words[i] != "--chain=-" &&
               words[i] != "--chain=") {
      words[i] = "--chain=" + chain_file();
    }
  }
  gpukit_plan::table_limits limits;
  limits.revolve_work = std::int64_t{1} << 20;
  std::istringstream in{chain_text};
  std::ostringstream out, err;
  int const rc = gpukit_plan::run(args.argc(), args.argv(), in, out, err, limits);
  switch (rc) {
    case 0:
      if (out.str().empty() || !err.str().empty()) std::abort();
      break;
    case gpukit_plan::exit_input:
    case gpukit_plan::exit_usage:
    case gpukit_plan::exit_infeasible:
      if (!out.str().empty() || err.str().rfind("gpukit-plan: error: ", 0) != 0) std::abort();
      if (err.str().rfind("gpukit-plan: error: gpukit: ", 0) == 0) std::abort();  // one prefix
      break;
    default: std::abort();  // exit_system or anything else: not expected of a small input
  }
  return 0;
}
