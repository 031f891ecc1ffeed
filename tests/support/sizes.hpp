// SPDX-License-Identifier: Apache-2.0
// tests/support/sizes.hpp: byte sizes for gpukit's tests.
//
//   void* p = alloc.allocate_async(3 * mib, s);
#pragma once

#include <cstddef>

namespace gpukit::test {

inline constexpr std::size_t kib = std::size_t{1} << 10;
inline constexpr std::size_t mib = std::size_t{1} << 20;
inline constexpr std::size_t gib = std::size_t{1} << 30;

}  // namespace gpukit::test
