// SPDX-License-Identifier: Apache-2.0
// gpukit/detail/spare_events.hpp: events kept for reuse by their owner. Not public API.
//
// Creating an event is a runtime call; recording one that is spare is not. Components that record
// events again and again keep the ones they are done with in a vector and take from it first.
#pragma once

#include <gpukit/error.hpp>
#include <gpukit/error_macros.hpp>

#include <vector>

namespace gpukit::detail {

/// The last of `spares`, taken out of it; else a new event of `rt` (on the current device),
/// recording timestamps when `timing`. The caller guards `spares` when threads share it.
/// @throws gpukit::cuda_error when an event cannot be created
template <class Runtime>
[[nodiscard]] typename Runtime::event_type take_spare_event(
  Runtime& rt, std::vector<typename Runtime::event_type>& spares, bool timing)
{
  if (!spares.empty()) {
    typename Runtime::event_type e = spares.back();
    spares.pop_back();
    return e;
  }
  typename Runtime::event_type e{};
  GPUKIT_CUDA_TRY(rt.event_create(e, timing));
  return e;
}

}  // namespace gpukit::detail
