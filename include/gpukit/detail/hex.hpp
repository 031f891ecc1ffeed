// SPDX-License-Identifier: Apache-2.0
// gpukit/detail/hex.hpp: addresses as text ("0x7f3a2c000000") for error messages. Not public API.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>

namespace gpukit::detail {

/// `v` in hexadecimal with a 0x prefix.
inline std::string hex(std::uintptr_t v)
{
  char buf[2 + 2 * sizeof(std::uintptr_t) + 1];
  std::snprintf(buf, sizeof(buf), "0x%llx", static_cast<unsigned long long>(v));
  return buf;
}

/// The address `p` in hexadecimal with a 0x prefix (a null pointer is "0x0").
inline std::string hex(void const* p) { return hex(reinterpret_cast<std::uintptr_t>(p)); }

}  // namespace gpukit::detail
