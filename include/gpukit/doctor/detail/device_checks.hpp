// SPDX-License-Identifier: Apache-2.0
// gpukit/doctor/detail/device_checks.hpp: the checks of each device: [device.<d>], [arch.<d>],
// [memory.<d>], [features.<d>] and [ecc.<d>]. Not public API.
#pragma once

#include <gpukit/doctor/detail/report.hpp>
#include <gpukit/runtime/runtime.hpp>

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdio>
#include <string>
#include <string_view>

namespace gpukit::detail {

/// The device's PCI address as sysfs names it: domain:bus:device.0.
inline std::string pci_address(device_properties const& p)
{
  char pci[32];
  std::snprintf(pci, sizeof pci, "%04x:%02x:%02x.0", p.pci_domain_id, p.pci_bus_id,
                p.pci_device_id);
  return pci;
}

/// [device.<d>]: what the device is (`pe`: the error reading its properties `p`).
template <class Runtime>
doctor_check check_device(int d, typename Runtime::error_type pe, device_properties const& p)
{
  std::string const sd = std::to_string(d);
  if (pe != Runtime::success) {
    return make_check("device." + sd, "device " + sd, check_status::fail,
                      "cannot read its properties: " + error_text<Runtime>(pe),
                      "run nvidia-smi -q -i " + sd + "; reset the GPU or reboot",
                      doctor_exit::device_unusable);
  }
  return make_check("device." + sd, "device " + sd, check_status::ok,
                    p.name + ", compute capability " + std::to_string(p.major) + "." +
                      std::to_string(p.minor) + ", " + std::to_string(p.total_memory >> 20) +
                      " MiB, " + std::to_string(p.multiprocessor_count) + " SMs, " +
                      std::to_string(p.async_engine_count) + " copy engines, PCI " +
                      pci_address(p) + (p.simulated ? " (simulated)" : ""));
}

/// One entry of a CMAKE_CUDA_ARCHITECTURES list, taken apart.
struct arch_entry {
  int number{0};         ///< 90 for "90a-real"
  bool real{true};       ///< native code (SASS) is built ("-virtual" clears it)
  bool virt{true};       ///< PTX is built ("-real" clears it)
  bool specific{false};  ///< "90a": arch-specific features, runs on exactly that capability
  bool family{false};    ///< "100f": family-specific, runs on the same major, minor >=
};

/// The smallest and largest architecture number an entry may name (compute capability
/// major * 10 + minor).
inline constexpr int arch_number_min = 10;
inline constexpr int arch_number_max = 999;

/// Reads `entry` ("90", "80-real", "90a", "100f-virtual"; not "all", "all-major" or "native")
/// into `out`; false when it is not spelled that way or its number is outside
/// [arch_number_min, arch_number_max]. Never throws.
inline bool parse_arch_entry(std::string_view entry, arch_entry& out) noexcept
{
  arch_entry e;
  constexpr std::string_view real_suffix = "-real", virtual_suffix = "-virtual";
  if (entry.size() > real_suffix.size() &&
      entry.substr(entry.size() - real_suffix.size()) == real_suffix) {
    e.virt = false;
    entry.remove_suffix(real_suffix.size());
  } else if (entry.size() > virtual_suffix.size() &&
             entry.substr(entry.size() - virtual_suffix.size()) == virtual_suffix) {
    e.real = false;
    entry.remove_suffix(virtual_suffix.size());
  }
  if (!entry.empty() && (entry.back() == 'a' || entry.back() == 'f')) {
    e.specific = entry.back() == 'a';
    e.family   = entry.back() == 'f';
    entry.remove_suffix(1);
  }
  // Digits only, and few enough of them that the value cannot overflow an int.
  if (entry.empty() || entry.size() > 4 ||
      entry.find_first_not_of("0123456789") != std::string_view::npos) {
    return false;
  }
  int n = 0;
  for (char const c : entry) n = n * 10 + (c - '0');
  if (n < arch_number_min || n > arch_number_max) return false;
  e.number = n;
  out      = e;
  return true;
}

/// Calls `f(entry)` for each non-empty entry of a CMAKE_CUDA_ARCHITECTURES list (separated by
/// ';', ',' or ' ') until it returns false.
template <class F>
void for_each_arch_entry(std::string_view archs, F&& f)
{
  std::size_t pos = 0;
  while (pos <= archs.size()) {
    std::size_t end = archs.find_first_of(";, ", pos);
    if (end == std::string_view::npos) end = archs.size();
    std::string_view const entry = archs.substr(pos, end - pos);
    pos                          = end + 1;
    if (!entry.empty() && !f(entry)) return;
  }
}

/// Whether native code (SASS) built for `e` runs on compute capability major.minor.
inline bool arch_sass_fits(arch_entry const& e, int major, int minor) noexcept
{
  int const a = e.number;
  return e.specific ? a == major * 10 + minor : (a / 10 == major && a % 10 <= minor);
}

/// Whether PTX built for `e` can be JIT-compiled for compute capability major.minor.
inline bool arch_ptx_fits(arch_entry const& e, int major, int minor) noexcept
{
  int const a = e.number, cc = major * 10 + minor;
  if (e.specific) return a == cc;
  return e.family ? (a / 10 == major && a % 10 <= minor) : a <= cc;
}

/// Whether a CMAKE_CUDA_ARCHITECTURES entry is one whose architectures only the build knows.
inline bool arch_chosen_at_build(std::string_view entry) noexcept
{
  return entry == "all" || entry == "all-major" || entry == "native";
}

/// How a binary built for `archs` (CMAKE_CUDA_ARCHITECTURES) runs on compute capability
/// major.minor: 2 native code (SASS), 1 only by JIT-compiling PTX, 0 not at all, -1 unknown.
/// `how` names the entry that fits. Entries that are not architectures
/// (gpukit::architectures_error names them) are passed over.
inline int arch_fit(std::string const& archs, int major, int minor, std::string& how)
{
  int best     = 0;
  bool decided = false;  // "all", "all-major" or "native": known only at build time
  for_each_arch_entry(archs, [&](std::string_view entry) {
    if (arch_chosen_at_build(entry)) {
      how     = std::string{entry};
      decided = true;
      return false;
    }
    arch_entry e;
    if (!parse_arch_entry(entry, e)) return true;
    if (e.real && best < 2 && arch_sass_fits(e, major, minor)) {
      best = 2;
      how  = "sm_" + std::to_string(e.number) + (e.specific ? "a" : e.family ? "f" : "");
    }
    if (e.virt && best < 1 && arch_ptx_fits(e, major, minor)) {
      best = 1;
      how  = "compute_" + std::to_string(e.number);
    }
    return true;
  });
  return decided ? -1 : best;
}

/// [arch.<d>]: the architectures the kernels were built for (`built`, as CMAKE_CUDA_ARCHITECTURES
/// spells them) against the device's compute capability.
inline doctor_check check_architectures(int d, device_properties const& p, std::string const& built)
{
  std::string const id = "arch." + std::to_string(d), title = "kernel architectures";
  if (built.empty()) {
    return make_check(id, title, check_status::skip,
                      "not told which architectures the kernels were built for");
  }
  std::string const cc   = std::to_string(p.major) + "." + std::to_string(p.minor);
  std::string const want = std::to_string(p.major) + std::to_string(p.minor);
  std::string how;
  switch (arch_fit(built, p.major, p.minor, how)) {
    case 2:
      return make_check(
        id, title, check_status::ok,
        "built for \"" + built + "\": native code " + how + " runs on compute capability " + cc);
    case 1:
      return make_check(id, title, check_status::warn,
                        "built for \"" + built + "\": no native code for compute capability " + cc +
                          "; the driver JIT-compiles " + how +
                          " PTX at first launch (slow start, maybe slower kernels)",
                        "add " + want +
                          " to CMAKE_CUDA_ARCHITECTURES (-DCMAKE_CUDA_ARCHITECTURES=\"" + built +
                          ";" + want + "\")");
    case 0:
      return make_check(
        id, title, check_status::fail,
        "built for \"" + built + "\": nothing runs on compute capability " + cc +
          " (kernel launches fail with \"no kernel image is available for execution on the "
          "device\")",
        "rebuild with -DCMAKE_CUDA_ARCHITECTURES=" + want + " (or add " + want + " to the list)",
        doctor_exit::arch_mismatch);
    default:
      return make_check(id, title, check_status::skip,
                        "built for \"" + built + "\" (" + how + "): decided at build time");
  }
}

/// [memory.<d>]: the device can be made current and its free memory read. Leaves `d` current.
/// A failure here marks the device unusable: the doctor's copies run on another.
template <class Runtime>
doctor_check check_memory(Runtime& rt, int d)
{
  std::string const id = "memory." + std::to_string(d), title = "device memory";
  std::size_t free = 0, total = 0;
  typename Runtime::error_type me = rt.set_device(d);
  if (me == Runtime::success) me = rt.mem_get_info(free, total);
  if (me != Runtime::success) {
    return make_check(id, title, check_status::fail,
                      "cannot use the device: " + error_text<Runtime>(me),
                      "see which processes hold it (nvidia-smi), its compute mode (nvidia-smi -q "
                      "-d COMPUTE), and dmesg for Xid errors",
                      doctor_exit::device_unusable);
  }
  std::string const found =
    std::to_string(free >> 20) + " MiB free of " + std::to_string(total >> 20) + " MiB";
  if (total > 0 && free < total / 10) {
    return make_check(id, title, check_status::warn, found + ": other processes hold most of it",
                      "nvidia-smi --query-compute-apps=pid,used_memory --format=csv");
  }
  return make_check(id, title, check_status::ok, found);
}

/// [features.<d>]: virtual memory management and memory pools, which gpukit's allocator uses.
inline doctor_check check_allocator_features(int d, device_properties const& p)
{
  std::string const id = "features." + std::to_string(d), title = "allocator features";
  std::string missing;
  if (!p.virtual_memory_management) missing += "virtual memory management (cuMem*)";
  if (!p.memory_pools) {
    missing += std::string{missing.empty() ? "" : " and "} + "memory pools (cudaMallocAsync)";
  }
  if (missing.empty()) {
    return make_check(id, title, check_status::ok,
                      "virtual memory management and memory pools supported");
  }
  return make_check(
    id, title, check_status::warn, "not supported: " + missing,
    "gpukit's caching allocator falls back to cudaMalloc/cudaFree segments (cudaFree "
    "synchronizes the device); on a VM or MIG slice check that the hypervisor exposes them");
}

/// [ecc.<d>]: ECC on device memory.
inline doctor_check check_ecc(int d, device_properties const& p)
{
  std::string const sd = std::to_string(d);
  if (p.ecc_enabled) {
    return make_check("ecc." + sd, "ECC", check_status::ok, "enabled on device memory");
  }
  return make_check("ecc." + sd, "ECC", check_status::warn,
                    "disabled (or not supported by this GPU): bit flips in device memory go "
                    "unnoticed and corrupt results silently",
                    "data-center GPUs: nvidia-smi -i " + sd +
                      " -e 1 as root, then reset the GPU (nvidia-smi -r -i " + sd +
                      ") or reboot; consumer GPUs have no ECC");
}

}  // namespace gpukit::detail

namespace gpukit {

inline std::string architectures_error(std::string_view list)
{
  std::string error;
  detail::for_each_arch_entry(list, [&](std::string_view entry) {
    detail::arch_entry e;
    if (entry == "all" || entry == "all-major" || entry == "native" ||
        detail::parse_arch_entry(entry, e)) {
      return true;
    }
    error = "\"" + std::string{entry} + "\" is not a CUDA architecture: expected a number from " +
            std::to_string(detail::arch_number_min) + " to " +
            std::to_string(detail::arch_number_max) +
            " (compute capability major * 10 + minor), optionally followed by a or f and by -real "
            "or -virtual (\"90\", \"90a-real\"), or all, all-major or native";
    return false;
  });
  return error;
}

}  // namespace gpukit
