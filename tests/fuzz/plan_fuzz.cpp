// SPDX-License-Identifier: Apache-2.0
// libFuzzer harness for gpukit-plan's input (tools/gpukit-plan/plan_input.hpp): the input's first
// line is the command line (split at spaces), the rest the chain. Every input is parsed or refused
// with the tool's own errors (usage_error, input_error, gpukit::logic_error); nothing else may
// escape, crash, or ask for more memory than the tool's limit. Small accepted inputs are planned.
#include "../../tools/gpukit-plan/plan_input.hpp"

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <sstream>
#include <string>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(std::uint8_t const* data, std::size_t size)
{
  std::string const input{reinterpret_cast<char const*>(data), size};
  auto const nl          = input.find('\n');
  std::string const line = input.substr(0, nl);
  std::vector<std::string> words{"gpukit-plan"};
  std::istringstream split{line};
  for (std::string w; split >> w && words.size() < 16;) { words.push_back(w); }
  std::vector<char*> argv;
  for (auto& w : words) { argv.push_back(w.data()); }
  argv.push_back(nullptr);
  try {
    gpukit_plan::command_line c =
      gpukit_plan::parse_arguments(static_cast<int>(words.size()), argv.data());
    if (c.help) { return 0; }
    if (c.revolve) {
      gpukit_plan::check_table_size(c, 0);
      if (*c.steps <= 64) {
        (void)gpukit::revolve_schedule(static_cast<std::size_t>(*c.steps),
                                       static_cast<std::size_t>(*c.slots));
      }
      return 0;
    }
    std::istringstream chain_text{nl == std::string::npos ? std::string{} : input.substr(nl + 1)};
    gpukit::checkpoint_chain const chain = gpukit::parse_checkpoint_chain(chain_text);
    gpukit_plan::check_table_size(c, static_cast<std::int64_t>(chain.size()));
    if (c.planner == "optimal" && gpukit_plan::optimal_table_bytes(static_cast<std::int64_t>(
                                    chain.size())) > gpukit_plan::memory_limit_bytes) {
      std::abort();  // check_table_size let through what the limit refuses
    }
    // The exact search behind best, exhaustive and offload is exponential in the stages (up to a
    // second at 11 stages, ten under AddressSanitizer: beyond the fuzzer's 10 s per input); its
    // speed is planner_bench's business, so only short chains are searched here.
    bool const searches =
      c.planner == "best" || c.planner == "exhaustive" || c.planner == "offload";
    if (chain.size() <= (searches ? 7u : 12u)) {
      try {
        (void)gpukit_plan::plan(chain, c);
      } catch (gpukit::checkpoint_infeasible const&) {}
    }
  } catch (gpukit_plan::usage_error const&) {
  } catch (gpukit_plan::input_error const&) {
  } catch (gpukit::logic_error const&) {}
  return 0;
}
