// SPDX-License-Identifier: Apache-2.0
// gpukit/doctor/detail/driver_checks.hpp: the [driver] and [devices] checks: is there a driver, is
// it new enough for the runtime, and does it see a device? Not public API.
#pragma once

#include <gpukit/doctor/detail/report.hpp>

#include <cuda_runtime_api.h>

#include <optional>
#include <string>

namespace gpukit::detail {

/// What to do when no driver is installed, for a program built with CUDA `runtime`.
inline std::string install_driver_fix(int runtime)
{
  return "install the NVIDIA driver (" + needed_driver(runtime) + " for CUDA " +
         cuda_version_string(runtime) +
         "); in a container, run it with the NVIDIA Container Toolkit (docker run --gpus all) so "
         "that the host's driver is mounted";
}

/// What to do when the driver is older than CUDA `runtime` (a major version behind).
inline std::string upgrade_driver_fix(int runtime)
{
  return "upgrade the NVIDIA driver to " + needed_driver(runtime) +
         ", or (data-center GPUs) install the CUDA forward-compatibility package " +
         compat_package(runtime) + " and put its lib directory first on LD_LIBRARY_PATH";
}

/// [driver]: the driver's CUDA version (`de`: the error reading it) against the runtime's.
template <class Runtime>
doctor_check check_driver(typename Runtime::error_type de, int driver, int runtime)
{
  std::string const id = "driver", title = "NVIDIA driver";
  std::string const d = cuda_version_string(driver), rv = cuda_version_string(runtime);
  if (de != Runtime::success) {
    return make_check(
      id, title, check_status::fail, "cannot read the driver version: " + error_text<Runtime>(de),
      "run nvidia-smi; reinstall the NVIDIA driver (" + needed_driver(runtime) + ")",
      doctor_exit::driver_error);
  }
  if (driver == 0) {
    return make_check(id, title, check_status::fail,
                      "no NVIDIA driver is installed (libcuda.so.1 was not found: the driver's "
                      "CUDA version reads 0); this program was built with CUDA runtime " +
                        rv,
                      install_driver_fix(runtime), doctor_exit::no_driver);
  }
  if (driver / 1000 < runtime / 1000) {
    return make_check(id, title, check_status::fail,
                      "the driver supports CUDA " + d + ", this program was built with CUDA " + rv +
                        ": \"CUDA driver version is insufficient for CUDA runtime version\"",
                      upgrade_driver_fix(runtime) + ", or build with CUDA " + d + " or older",
                      doctor_exit::driver_too_old);
  }
  if (driver < runtime) {
    return make_check(
      id, title, check_status::warn,
      "the driver supports CUDA " + d + ", older than the runtime's " + rv +
        ": minor-version compatibility runs it, but PTX built by the newer toolkit cannot be JIT "
        "compiled and newer APIs return cudaErrorCallRequiresNewerDriver",
      "upgrade the driver to one that supports CUDA " + rv);
  }
  return make_check(id, title, check_status::ok,
                    std::string{Runtime::is_simulated ? "simulated driver" : "driver"} +
                      " supports CUDA " + d + "; runtime CUDA " + rv);
}

/// A CUDA error that stops the device count, with a cause and a fix that depend on nothing else.
template <class Runtime>
struct device_count_cause {
  typename Runtime::error_type error;
  char const* what;
  char const* fix;
};

/// The device-count errors of device_count_cause's kind; each is a driver error
/// (doctor_exit::driver_error).
template <class Runtime>
inline constexpr device_count_cause<Runtime> device_count_causes[] = {
  {Runtime::stub_library, "the toolkit's libcuda.so stub was loaded instead of the driver",
   "remove the CUDA toolkit's lib64/stubs directory from LD_LIBRARY_PATH (it exists for linking "
   "only)"},
  {Runtime::system_driver_mismatch,
   "the kernel module and the user-space driver have different versions (the driver was upgraded "
   "without a reboot)",
   "reboot, or unload and reload the nvidia kernel modules"},
  {Runtime::devices_unavailable, "every device is busy or in exclusive-process mode",
   "see which processes hold the GPUs (nvidia-smi); set the compute mode back with nvidia-smi -c "
   "DEFAULT"},
  {Runtime::system_not_ready,
   "the system is not ready (NVSwitch systems: the fabric manager is not running)",
   "systemctl start nvidia-fabricmanager (its version must match the driver's)"},
};

/// [devices] when the device count fails with `e` (cudaErrorNoDevice also for a count of 0):
/// each CUDA error that stops it has its own cause and fix.
template <class Runtime>
doctor_check device_count_failure(typename Runtime::error_type e, int driver, int runtime,
                                  std::optional<std::string> const& visible)
{
  std::string const name = error_text<Runtime>(e);
  auto fail              = [&name](std::string what, std::string fix, int code) {
    return make_check("devices", "GPU devices", check_status::fail, name + ": " + what,
                                   std::move(fix), code);
  };
  for (auto const& cause : device_count_causes<Runtime>) {
    if (e == cause.error) { return fail(cause.what, cause.fix, doctor_exit::driver_error); }
  }
  switch (e) {
    case Runtime::insufficient_driver:
      if (driver == 0) {
        return fail("no NVIDIA driver is installed (the driver reports CUDA 0)",
                    install_driver_fix(runtime), doctor_exit::no_driver);
      }
      return fail("the driver supports CUDA " + cuda_version_string(driver) +
                    ", this program needs CUDA " + cuda_version_string(runtime),
                  upgrade_driver_fix(runtime), doctor_exit::driver_too_old);
    case Runtime::no_device:
      if (visible) {
        return fail("CUDA_VISIBLE_DEVICES=\"" + *visible + "\" leaves no device visible",
                    "unset CUDA_VISIBLE_DEVICES, or list ordinals or UUIDs that exist "
                    "(nvidia-smi -L)",
                    doctor_exit::no_device);
      }
      return fail("the driver is loaded but sees no GPU",
                  "check nvidia-smi; in a container pass the GPUs (docker run --gpus all); on a VM "
                  "check the GPU passthrough",
                  doctor_exit::no_device);
    case Runtime::compat_not_supported_on_device:
      return fail("the forward-compatibility package does not support this GPU",
                  "remove the cuda-compat directory from LD_LIBRARY_PATH and upgrade the driver "
                  "to " +
                    needed_driver(runtime),
                  doctor_exit::driver_too_old);
    default:
      return make_check("devices", "GPU devices", check_status::fail, name,
                        "run nvidia-smi and read dmesg for NVRM or Xid messages",
                        doctor_exit::driver_error);
  }
}

/// [devices]: how many devices the runtime sees (`ce`: the error counting them).
template <class Runtime>
doctor_check check_devices(typename Runtime::error_type ce, int count, int driver, int runtime,
                           std::optional<std::string> const& visible)
{
  if (ce != Runtime::success) return device_count_failure<Runtime>(ce, driver, runtime, visible);
  if (count == 0)
    return device_count_failure<Runtime>(Runtime::no_device, driver, runtime, visible);
  return make_check("devices", "GPU devices", check_status::ok,
                    std::to_string(count) + (count == 1 ? " device" : " devices") +
                      (visible ? " (CUDA_VISIBLE_DEVICES=\"" + *visible + "\")" : ""));
}

}  // namespace gpukit::detail
