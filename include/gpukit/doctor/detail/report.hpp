// SPDX-License-Identifier: Apache-2.0
// gpukit/doctor/detail/report.hpp: the doctor's report (verdict, text, JSON), its version helpers,
// and the small pieces every check uses. Not public API.
#pragma once

#include <gpukit/detail/json.hpp>

#include <cuda_runtime_api.h>

#include <optional>
#include <string>
#include <utility>

namespace gpukit {

inline std::string cuda_version_string(int v)
{
  return std::to_string(v / 1000) + "." + std::to_string((v % 1000) / 10);
}

inline char const* minimum_driver_branch(int cuda_version) noexcept
{
  switch (cuda_version / 1000) {
    case 13: return "580";
    case 12: return "525";
    case 11: return "450";
    default: return "";
  }
}

inline check_status doctor_report::verdict() const noexcept
{
  check_status v = check_status::ok;
  for (auto const& c : checks) {
    if (c.status == check_status::fail) return check_status::fail;
    if (c.status == check_status::warn) v = check_status::warn;
  }
  return v;
}

inline int doctor_report::exit_code() const noexcept
{
  for (auto const& c : checks) {
    if (c.status == check_status::fail) return c.exit_code != 0 ? c.exit_code : 1;
  }
  return doctor_exit::ok;
}

inline doctor_check const* doctor_report::find(std::string_view id) const noexcept
{
  for (auto const& c : checks) {
    if (c.id == id) return &c;
  }
  return nullptr;
}

inline std::string doctor_report::to_text() const
{
  std::string out = simulated
                      ? "gpukit doctor: SIMULATED GPU (sim_runtime), not this machine's hardware\n"
                      : "gpukit doctor\n";
  for (auto const& c : checks) {
    char const* tag = c.status == check_status::ok     ? "[ ok ]"
                      : c.status == check_status::warn ? "[warn]"
                      : c.status == check_status::fail ? "[FAIL]"
                                                       : "[skip]";
    std::string id  = c.id;
    if (id.size() < 18) id.resize(18, ' ');
    out += std::string{tag} + " " + id + " " + c.title + ": " + c.detail + "\n";
    if (!c.fix.empty()) out += "       fix: " + c.fix + "\n";
  }
  auto const v = verdict();
  out += std::string{"verdict: "} +
         (v == check_status::fail   ? "FAIL"
          : v == check_status::warn ? "ok, with warnings"
                                    : "ok") +
         " (exit " + std::to_string(exit_code()) + ")\n";
  return out;
}

inline std::string doctor_report::to_json() const
{
  using detail::json_string;
  std::string out = "{\"simulated\":" + std::string{simulated ? "true" : "false"} +
                    ",\"driver_version\":" + std::to_string(driver_version) +
                    ",\"runtime_version\":" + std::to_string(runtime_version) +
                    ",\"verdict\":" + json_string(to_string(verdict())) +
                    ",\"exit_code\":" + std::to_string(exit_code()) + ",\"checks\":[";
  bool first = true;
  for (auto const& c : checks) {
    if (!first) out += ',';
    first = false;
    out += "{\"id\":" + json_string(c.id) + ",\"title\":" + json_string(c.title) +
           ",\"status\":" + json_string(to_string(c.status)) +
           ",\"detail\":" + json_string(c.detail) + ",\"fix\":" + json_string(c.fix) +
           ",\"exit_code\":" + std::to_string(c.exit_code) + "}";
  }
  return out + "]}";
}

namespace detail {

inline doctor_check make_check(std::string id, std::string title, check_status s,
                               std::string detail, std::string fix = {}, int code = 0)
{
  return doctor_check{std::move(id), std::move(title), s, std::move(detail), std::move(fix), code};
}

/// "cudaErrorNoDevice (no CUDA-capable device is detected)", as the runtime names it.
template <class Runtime>
std::string error_text(typename Runtime::error_type e)
{
  return std::string{Runtime::error_name(e)} + " (" + Runtime::error_string(e) + ")";
}

/// "R580 or newer": the driver a runtime version needs.
inline std::string needed_driver(int runtime)
{
  return std::string{"R"} + minimum_driver_branch(runtime) + " or newer";
}

/// "cuda-compat-13-0": the forward-compatibility package of a runtime version.
inline std::string compat_package(int runtime)
{
  return "cuda-compat-" + std::to_string(runtime / 1000) + "-" +
         std::to_string((runtime % 1000) / 10);
}

/// An environment variable through doctor_options::getenv; nullopt when unset.
inline std::optional<std::string> env_value(doctor_options const& o, char const* name)
{
  char const* v = o.getenv ? o.getenv(name) : nullptr;
  if (v == nullptr) return std::nullopt;
  return std::string{v};
}

}  // namespace detail

}  // namespace gpukit
