// SPDX-License-Identifier: Apache-2.0
// libFuzzer harness for gpukit-doctor's command line (tools/gpukit-doctor/doctor_cli.hpp): the
// input is the argument list (fuzz_argv.hpp: split at newlines and NULs), run in-process by the
// tool's own run() against simulated GPUs (with and without --sim). Every argument list must end in
// one of the documented exit codes with nothing thrown; a usage error says so on standard error
// only, a report goes to standard output only. The bandwidth probe is off (probe_bytes 0): it
// times 64 MiB copies, which is speed, not argument handling.
#include "../../tools/gpukit-doctor/doctor_cli.hpp"
#include "fuzz_argv.hpp"

#include <gpukit/runtime/sim_runtime.hpp>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <sstream>
#include <string>

extern "C" int LLVMFuzzerTestOneInput(std::uint8_t const* data, std::size_t size)
{
  static gpukit::sim_runtime gpu{gpukit::sim_config{}.with_devices(1, std::size_t{1} << 30)};
  gpukit_fuzz::fuzz_argv args{"gpukit-doctor", data, size};
  gpukit::doctor_options options;
  options.probe_bytes = 0;
  std::ostringstream out, err;
  int const rc = gpukit_doctor::run(args.argc(), args.argv(), out, err, gpu, options);
  switch (rc) {
    case gpukit::doctor_exit::usage:
      if (!out.str().empty() || err.str().rfind("gpukit-doctor: error: ", 0) != 0) std::abort();
      break;
    case gpukit::doctor_exit::ok:
    case gpukit::doctor_exit::no_driver:
    case gpukit::doctor_exit::driver_too_old:
    case gpukit::doctor_exit::no_device:
    case gpukit::doctor_exit::driver_error:
    case gpukit::doctor_exit::arch_mismatch:
    case gpukit::doctor_exit::device_unusable:
      // A report, or the usage text of --help; or (13) what went wrong, such as std::bad_alloc.
      if (out.str().empty() && (rc != gpukit::doctor_exit::driver_error ||
                                err.str().rfind("gpukit-doctor: error: ", 0) != 0)) {
        std::abort();
      }
      break;
    default: std::abort();  // not a documented exit code
  }
  return 0;
}
