// SPDX-License-Identifier: Apache-2.0
// tests/support/pattern.hpp: byte patterns that show a shifted, truncated, stale or overlapping
// copy.
//
//   auto const src = gpukit::test::pattern_bytes(bytes, 42);   // a host buffer of pattern 42
//   ... copy it there and back into dst ...
//   CHECK(gpukit::test::first_mismatch(dst.data(), bytes, 42) == bytes);
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace gpukit::test {

/// Fills [p, p + bytes) with a pattern that differs per byte and per seed.
inline void fill_pattern(void* p, std::size_t bytes, std::uint32_t seed)
{
  auto* b         = static_cast<unsigned char*>(p);
  std::uint32_t x = seed * 2654435761u + 1;
  for (std::size_t i = 0; i < bytes; ++i) {
    x ^= x << 13;
    x ^= x >> 17;
    x ^= x << 5;
    b[i] = static_cast<unsigned char>(x);
  }
}

/// A host buffer of `bytes` bytes holding pattern `seed`.
inline std::vector<unsigned char> pattern_bytes(std::size_t bytes, std::uint32_t seed)
{
  std::vector<unsigned char> out(bytes);
  fill_pattern(out.data(), bytes, seed);
  return out;
}

/// The index of the first byte that differs from pattern `seed`, or `bytes` when none does.
inline std::size_t first_mismatch(void const* p, std::size_t bytes, std::uint32_t seed)
{
  std::vector<unsigned char> const want = pattern_bytes(bytes, seed);
  auto const* b                         = static_cast<unsigned char const*>(p);
  for (std::size_t i = 0; i < bytes; ++i) {
    if (b[i] != want[i]) { return i; }
  }
  return bytes;
}

}  // namespace gpukit::test
