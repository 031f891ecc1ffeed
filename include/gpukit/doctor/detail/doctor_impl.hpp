// SPDX-License-Identifier: Apache-2.0
// gpukit/doctor/detail/doctor_impl.hpp: gpukit::run_doctor, which runs the checks of the other
// files in doctor/detail/ in the order gpukit/doctor/doctor.hpp lists them. Not public API.
#pragma once

#include <gpukit/doctor/detail/copy_checks.hpp>
#include <gpukit/doctor/detail/device_checks.hpp>
#include <gpukit/doctor/detail/driver_checks.hpp>
#include <gpukit/doctor/detail/report.hpp>
#include <gpukit/doctor/detail/system_checks.hpp>

#include <cuda_runtime_api.h>

#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace gpukit {

template <class Runtime>
doctor_report run_doctor(Runtime& rt, doctor_options const& o)
{
  doctor_report r;
  r.simulated = Runtime::is_simulated;
  auto add    = [&r](doctor_check c) { r.checks.push_back(std::move(c)); };
  std::optional<std::string> const visible = detail::env_value(o, "CUDA_VISIBLE_DEVICES");

  typename Runtime::error_type const de = rt.driver_version(r.driver_version);
  (void)rt.runtime_version(r.runtime_version);
  add(detail::check_driver<Runtime>(de, r.driver_version, r.runtime_version));
  int count                             = 0;
  typename Runtime::error_type const ce = rt.device_count(count);
  add(detail::check_devices<Runtime>(ce, count, r.driver_version, r.runtime_version, visible));
  if (ce != Runtime::success) count = 0;

  int original       = 0;
  bool const restore = count > 0 && rt.get_device(original) == Runtime::success;
  int first_usable   = -1;                       // the copies run there
  std::vector<std::pair<int, std::string>> pci;  // device, domain:bus:device.0
  for (int d = 0; d < count; ++d) {
    device_properties p;
    typename Runtime::error_type const pe = rt.get_device_properties(p, d);
    add(detail::check_device<Runtime>(d, pe, p));
    if (pe != Runtime::success) continue;
    pci.emplace_back(d, detail::pci_address(p));
    add(detail::check_architectures(d, p, o.built_architectures));
    add(detail::check_memory(rt, d));
    if (first_usable < 0 && r.checks.back().status != check_status::fail) first_usable = d;
    add(detail::check_allocator_features(d, p));
    add(detail::check_ecc(d, p));
  }
  {
    detail::copy_buffers<Runtime> buffers{rt};
    add(detail::check_pinned(rt, first_usable, buffers));
    add(detail::check_copy(rt, o, first_usable, buffers));
  }
  if (restore) (void)rt.set_device(original);

  for (auto const& [d, address] : pci) {
    add(detail::check_pcie<Runtime>(d, address, o.pci_sysfs_root));
  }
  add(detail::check_device_files<Runtime>(o.device_files_root, count, first_usable >= 0));
  add(detail::check_nvtx_tool(o));
  for (auto& c : detail::check_environment<Runtime>(o, visible, count)) add(std::move(c));
  return r;
}

}  // namespace gpukit
