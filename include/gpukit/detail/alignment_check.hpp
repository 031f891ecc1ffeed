// SPDX-License-Identifier: Apache-2.0
// gpukit/detail/alignment_check.hpp: the alignment check of the resources' CCCL entry points.
// Not public API.
#pragma once

#include <gpukit/error_macros.hpp>

#include <cstddef>
#include <string>

namespace gpukit::detail {

/// Throws gpukit::logic_error naming `who` and `align` unless `align` is a power of two no larger
/// than `max`.
inline void check_alignment(char const* who, std::size_t align, std::size_t max)
{
  GPUKIT_EXPECTS(align != 0 && (align & (align - 1)) == 0 && align <= max,
                 std::string{who} + ": alignment " + std::to_string(align) +
                   " is not a power of two up to " + std::to_string(max));
}

}  // namespace gpukit::detail
