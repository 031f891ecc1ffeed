// SPDX-License-Identifier: Apache-2.0
// libFuzzer harness for replay_trace's command line (benchmarks/memory/replay_trace_cli.hpp): the
// input is the argument list (fuzz_argv.hpp: split at newlines and NULs), run in-process by the
// program's own run(). Every argument list must end in one of the documented exit codes (0, 1, 2)
// with nothing thrown; a failure says so on standard error only, with one prefix.
// The trace is a small fixed one (trace_fuzz.cpp fuzzes traces): the value of every --trace is
// replaced by a file holding it. --runtime cuda runs gpukit's allocators on a simulated GPU, and
// the CUDA anchors fail as they do on a machine without a GPU (exit 1). --repeat is limited to 64.
#include "../../benchmarks/memory/replay_trace_cli.hpp"
#include "fuzz_argv.hpp"

#include <gpukit/error.hpp>
#include <gpukit/runtime/sim_runtime.hpp>

#include <cuda_runtime_api.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

namespace {

// Two streams, a zero-byte allocation, a block left live at the end.
constexpr char const* trace_text =
  "# fuzz\na 1 1024 0\na 2 4096 0\nf 1\na 3 100 1\na 4 0 1\nf 2\na 5 3000000 1\nf 3\n";

// A file holding trace_text, written once.
std::string const& trace_file()
{
  static std::string const path = [] {
    char name[]  = "/tmp/gpukit_replay_args_fuzz_XXXXXX";
    int const fd = ::mkstemp(name);
    if (fd < 0) std::abort();
    ::close(fd);
    std::ofstream{name} << trace_text;
    return std::string{name};
  }();
  return path;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(std::uint8_t const* data, std::size_t size)
{
  static gpukit::sim_runtime cuda{gpukit::sim_config{}.with_devices(1, std::size_t{1} << 30)};
  gpukit_fuzz::fuzz_argv args{"replay_trace", data, size};
  auto& words = args.words();
  for (std::size_t i = 1; i + 1 < words.size(); ++i) {
    if (words[i] == "--trace") words[i + 1] = trace_file();
  }
  auto no_gpu = [](std::string const&, replay_trace_cli::trace const&,
                   int) -> replay_trace_cli::result {
    throw gpukit::cuda_error{static_cast<int>(cudaErrorNoDevice),
                             "cudaErrorNoDevice",
                             "no CUDA-capable device is detected",
                             "cudaStreamCreateWithFlags",
                             __FILE__,
                             __LINE__};
  };
  replay_trace_cli::run_limits limits;
  limits.max_repeat = 64;
  std::ostringstream out, err;
  int const rc = replay_trace_cli::run(args.argc(), args.argv(), out, err, cuda, no_gpu, limits);
  switch (rc) {
    case replay_trace_cli::exit_ok:
      if (out.str().empty() || !err.str().empty()) std::abort();
      break;
    case replay_trace_cli::exit_failed:
    case replay_trace_cli::exit_usage:
      if (err.str().rfind("replay_trace: ", 0) != 0) std::abort();
      if (err.str().rfind("replay_trace: gpukit: ", 0) == 0) std::abort();  // one prefix
      break;
    default: std::abort();
  }
  return 0;
}
