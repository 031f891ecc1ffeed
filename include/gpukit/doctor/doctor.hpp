// SPDX-License-Identifier: Apache-2.0
// gpukit/doctor/doctor.hpp: is this machine's driver, runtime and GPU right for CUDA work? Each
// check says ok, warn or fail, and what to do about it.
//
// Quick start:
//
//   #include <gpukit/doctor/doctor.hpp>
//   #include <gpukit/runtime/sim_runtime.hpp>
//
//   #include <iostream>
//
//   int check()
//   {
//     gpukit::doctor_options o;
//     o.built_architectures = "90";  // CMAKE_CUDA_ARCHITECTURES of your kernels
//     gpukit::doctor_report r = gpukit::run_doctor(gpukit::cuda_runtime::instance(), o);
//     std::cout << r.to_text();      // or r.to_json()
//     return r.exit_code();          // 0, or the code of the first failure
//   }
//
//   int check_simulated()  // the same checks against the simulated GPU, with a fault injected
//   {
//     gpukit::sim_runtime sim;
//     sim.inject_fault(gpukit::sim_op::device_count, 1, cudaErrorNoDevice);
//     return gpukit::run_doctor(sim).exit_code();  // gpukit::doctor_exit::no_device
//   }
//
// gpukit's command-line tool `gpukit-doctor [--json] [--sim] [--arch LIST]`, installed with gpukit,
// prints this report.
//
// Checks, in order (ids in brackets; <d> is a device ordinal). Each is one function in
// gpukit/doctor/detail/ (driver_checks, device_checks, copy_checks, system_checks), and
// detail/doctor_impl.hpp runs them:
//   [driver]           driver present, and its CUDA version against the runtime's: no driver at
//                      all (the version reads 0) is told apart from a driver that is too old
//   [devices]          device count, and each CUDA error that stops it (stub libcuda, kernel module
//                      mismatch, fabric manager, exclusive mode, CUDA_VISIBLE_DEVICES hiding all)
//   [device.<d>]       name, compute capability, memory, SMs, copy engines, PCI address
//   [arch.<d>]         compute capability against the architectures the kernels were built for
//   [memory.<d>]       free memory (warns when other processes hold most of it)
//   [features.<d>]     virtual memory management and memory pools (what gpukit's allocator uses)
//   [ecc.<d>]          ECC on device memory enabled (warns when off: bit flips go unnoticed)
//   [pinned]           a pinned host allocation works
//   [copy]             a round trip host -> device -> host returns the same bytes; pinned and
//                      pageable host-to-device bandwidth
//   [pcie.<d>]         PCIe link generation and width, current and maximum, from sysfs
//                      (/sys/bus/pci/devices/<domain:bus:device.0>/{current,max}_link_{speed,width});
//                      warns when the link runs narrower or slower than its maximum (a GPU in an
//                      x8 slot, a Gen3 riser); "unknown" (skip) when sysfs cannot be read. Read
//                      after the copies, so that a link idling at a low speed has trained up
//   [device_files]     /dev/nvidiactl, /dev/nvidia-uvm, /dev/nvidia<d> exist and are accessible
//   [nvtx]             whether an NVTX tool is attached (NVTX_INJECTION64_PATH)
//   [env.<NAME>]       environment variables that change CUDA's behavior, when set
//
// Exit codes (`doctor_exit`): 0 ok (warnings allowed), 10 no driver, 11 driver too old for the
// runtime, 12 no usable device, 13 driver or system error, 14 kernels not built for the device,
// 15 device present but unusable (allocation, pinned memory or copy fails). 2 is left for usage
// errors of programs built on it.
//
// `run_doctor` is a template over a Runtime (gpukit/runtime/runtime.hpp); it needs only the
// device, memory, stream and version calls. It does not throw for CUDA errors (they become
// checks); it may throw std::bad_alloc.
#pragma once

#include <gpukit/runtime/cuda_runtime.hpp>
#include <gpukit/runtime/runtime.hpp>

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdlib>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

namespace gpukit {

/// The verdict of one check.
enum class check_status { ok, warn, fail, skip };

/// "ok", "warn", "fail", "skip".
[[nodiscard]] constexpr char const* to_string(check_status s) noexcept
{
  switch (s) {
    case check_status::ok: return "ok";
    case check_status::warn: return "warn";
    case check_status::fail: return "fail";
    default: return "skip";
  }
}

/// The doctor's exit codes, one per kind of problem (see the top of this header).
struct doctor_exit {
  static constexpr int ok              = 0;
  static constexpr int usage           = 2;
  static constexpr int no_driver       = 10;
  static constexpr int driver_too_old  = 11;
  static constexpr int no_device       = 12;
  static constexpr int driver_error    = 13;
  static constexpr int arch_mismatch   = 14;
  static constexpr int device_unusable = 15;
};

/// One check: what was looked at, the verdict, what was found and, unless ok, what to do.
struct doctor_check {
  std::string id;     ///< e.g. "driver", "arch.0", "env.CUDA_LAUNCH_BLOCKING"
  std::string title;  ///< a few words
  check_status status{check_status::ok};
  std::string detail;  ///< what was found
  std::string fix;     ///< a concrete action (empty when ok)
  int exit_code{0};    ///< doctor_exit code of a failure (0 otherwise)
};

/// How the doctor runs.
struct doctor_options {
  /// The CUDA architectures the program's kernels were built for, as CMAKE_CUDA_ARCHITECTURES
  /// spells them ("90", "80;90-real", "90a-real", "all", ...). Empty: the arch check is skipped.
  std::string built_architectures{};
  /// Bytes copied by the bandwidth probe (pinned and pageable host to device); 0: no probe.
  std::size_t probe_bytes{std::size_t{64} << 20};
  /// Reads an environment variable (nullptr when unset). Default: std::getenv.
  std::function<char const*(char const*)> getenv{[](char const* n) { return std::getenv(n); }};
  /// Where the device files are looked for.
  std::string device_files_root{"/dev"};
  /// Where the PCI devices' sysfs directories are looked for (a test seam).
  std::string pci_sysfs_root{"/sys/bus/pci/devices"};
};

/// Every check's result, in order.
struct doctor_report {
  std::vector<doctor_check> checks;
  bool simulated{false};  ///< run against a simulated GPU
  int runtime_version{0};
  int driver_version{0};

  /// The worst status (fail > warn > ok; skips ignored).
  [[nodiscard]] check_status verdict() const noexcept;
  /// The exit code of the first failed check, else doctor_exit::ok.
  [[nodiscard]] int exit_code() const noexcept;
  /// The check with this id, or nullptr.
  [[nodiscard]] doctor_check const* find(std::string_view id) const noexcept;
  /// A readable report: one line per check, its fix indented below, the verdict last.
  [[nodiscard]] std::string to_text() const;
  /// One JSON object: {"simulated":..., "driver_version":..., "runtime_version":...,
  /// "verdict":"ok|warn|fail", "exit_code":N, "checks":[{"id","title","status","detail","fix",
  /// "exit_code"}]}.
  [[nodiscard]] std::string to_json() const;
};

/// Runs every check against `rt` (see the top of this header). Leaves the calling thread's current
/// device as it found it when it can. Blocks while copies and the bandwidth probe run.
template <class Runtime>
[[nodiscard]] doctor_report run_doctor(Runtime& rt, doctor_options const& options = {});

/// Empty when every entry of `list` (separated by ';', ',' or ' ') names a CUDA architecture as
/// CMAKE_CUDA_ARCHITECTURES spells it: "all", "all-major", "native", or a number from 10 to 999
/// (compute capability major * 10 + minor), optionally followed by "a" or "f" and by "-real" or
/// "-virtual"; else a message naming the first entry that does not and saying what is allowed.
/// run_doctor's [arch] check passes over such entries; gpukit-doctor refuses them. Never throws
/// but std::bad_alloc.
[[nodiscard]] std::string architectures_error(std::string_view list);

/// "13.0" for 13000 (CUDA's version encoding).
[[nodiscard]] std::string cuda_version_string(int v);

/// The oldest Linux driver branch for a CUDA major version (minor-version compatibility):
/// "580" for 13, "525" for 12, "450" for 11; "" when unknown.
[[nodiscard]] char const* minimum_driver_branch(int cuda_version) noexcept;

}  // namespace gpukit

#include <gpukit/doctor/detail/doctor_impl.hpp>
