// SPDX-License-Identifier: Apache-2.0
// gpukit/memory/retry_on_oom.hpp: let a training loop adapt to out-of-memory instead of crashing.
//
// Quick start:
//
//   #include <gpukit/memory/retry_on_oom.hpp>
//
//   #include <optional>
//   #include <string>
//
//   void train(gpukit::caching_allocator& alloc, void (*train_step)(int micro_batch))
//   {
//     int micro_batch = 64;
//     auto report     = gpukit::retry_on_oom(
//       alloc,
//       [&] { train_step(micro_batch); },  // the step, run again on failure
//       [&](gpukit::out_of_memory const&, int) -> std::optional<std::string> {
//         if (micro_batch == 1) { return std::nullopt; }  // give up: the error propagates
//         micro_batch /= 2;                                // ... and accumulate gradients
//         return "micro-batch halved to " + std::to_string(micro_batch);
//       });
//     // report.changes: what the policy changed; report.attempts: how many runs it took
//     (void)report;
//   }
//
// On gpukit::out_of_memory from the step, retry_on_oom returns the allocator's cached memory to the
// device (release()), asks the policy what to change, and runs the step again, up to
// `max_retries` times. The step must be safe to run again (it frees what it allocated when it
// throws, as gpukit::device_buffer and gpukit::device_uvector (memory/device_uvector.hpp) do).
#pragma once

#include <gpukit/error.hpp>
#include <gpukit/error_macros.hpp>
#include <gpukit/memory/caching_allocator.hpp>

#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace gpukit {

/// What retry_on_oom did.
struct retry_report {
  int attempts{0};                   ///< runs of the step, the successful one included
  std::vector<std::string> changes;  ///< what the policy changed before each retry
  std::vector<oom_report> failures;  ///< the report of each out-of-memory met
  std::size_t released_bytes{0};     ///< cached bytes returned to the device between tries
};

/// Runs `step()`; on gpukit::out_of_memory, releases `alloc`'s cache, calls
/// `policy(error, attempt) -> std::optional<std::string>` (a description of what it changed, or
/// std::nullopt to give up) and runs the step again, at most `max_retries` times.
/// @returns what it did, once the step succeeded
/// @throws gpukit::out_of_memory (the last one) when the policy gives up or the retries run out;
///         any other exception from the step or the policy, unchanged
/// Synchronizes only as release() does (stream-ordered frees: it does not).
template <class Runtime, class Step, class Policy>
retry_report retry_on_oom(basic_caching_allocator<Runtime>& alloc, Step&& step, Policy&& policy,
                          int max_retries = 4)
{
  GPUKIT_EXPECTS(max_retries >= 0,
                 "retry_on_oom: max_retries " + std::to_string(max_retries) + " is negative");
  retry_report report;
  for (int attempt = 0;; ++attempt) {
    ++report.attempts;
    try {
      step();
      return report;
    } catch (out_of_memory const& e) {
      report.failures.push_back(e.report());
      if (attempt >= max_retries) { throw; }
      report.released_bytes += alloc.release();
      std::optional<std::string> change = policy(e, attempt + 1);
      if (!change) { throw; }
      report.changes.push_back(std::move(*change));
    }
  }
}

/// retry_on_oom over the default allocator of the calling thread's current device.
template <class Step, class Policy>
retry_report retry_on_oom(Step&& step, Policy&& policy, int max_retries = 4)
{
  return retry_on_oom(default_caching_allocator(), std::forward<Step>(step),
                      std::forward<Policy>(policy), max_retries);
}

}  // namespace gpukit
