// SPDX-License-Identifier: Apache-2.0
// gpukit/checkpoint/profile_chain.hpp: the cost model of a chain, measured by running its stages
// on the device.
//
// Quick start:
//
//   #include <gpukit/checkpoint/executor.hpp>
//   #include <gpukit/checkpoint/planners.hpp>
//   #include <gpukit/checkpoint/profile_chain.hpp>
//
//   #include <cstddef>
//   #include <cstdint>
//
//   struct my_stages {  // any type with these members (i = 1..L)
//     std::size_t width;
//     // the bytes of x_i (and of δ_i), and what Fe<i> keeps for B<i> beside x_{i-1}
//     std::size_t output_bytes(std::size_t) const { return width * sizeof(float); }
//     std::size_t tape_bytes(std::size_t) const { return 2 * width * sizeof(float); }
//     // x_i = F_i(x_{i-1}); when c.recording, also fill `tape`. Enqueue the work on `s`.
//     void forward(std::size_t i, void const* x_in, void* x_out, void* tape,
//                  gpukit::checkpoint_context const& c, cudaStream_t s);
//     // δ_{i-1} from δ_i (grad_out is null for i = L: the loss stage starts the backward;
//     // grad_in is null for i = 1); accumulate parameter gradients here.
//     void backward(std::size_t i, void const* x_in, void const* tape, void const* grad_out,
//                   void* grad_in, gpukit::checkpoint_context const& c, cudaStream_t s);
//   };
//
//   void plan_from_measured_costs(my_stages& stages, std::size_t L, void const* x0,
//                                 std::int64_t budget_bytes, cudaStream_t stream)
//   {
//     gpukit::caching_allocator& alloc = gpukit::default_caching_allocator(0);
//     gpukit::chain_profile prof     = gpukit::profile_chain(alloc, stages, L, x0, stream);
//     gpukit::checkpoint_chain chain = prof.chain();  // times in microseconds, sizes in bytes
//     std::int64_t const activations = budget_bytes - prof.transient_bytes();
//     gpukit::checkpoint_plan plan   = gpukit::plan_best(chain, activations);
//     gpukit::checkpoint_executor exec{alloc};
//     exec.run_async(plan.schedule, stages, L, x0, stream);
//   }
//
// profile_chain calls each stage exactly as the executor does (same Stages interface, every
// buffer from the same caching allocator, on `stream`):
// - sizes from the allocator's requested-bytes statistics: the output size a_i is what the
//   allocator holds after a forward without recording beyond what it held before (x_i and
//   anything the stage itself keeps allocated), the tape size t_i what it holds after a recording
//   forward beyond that; the transient bytes of an operation are its peak beyond what it holds
//   after the forward (before the backward), such as a workspace the stage allocates and frees;
// - times with the runtime's timing events around each forward and backward: the median of
//   `repetitions` runs after `warmup` runs.
//
// Stage i runs on x_{i-1} as the previous stage computed it (x_0 given by the caller). Every call
// is made with checkpoint_context::recomputing set (and gpukit::is_recomputing() true), so stages
// skip their once-per-step side effects; backward calls do accumulate parameter gradients as they
// would in a step: zero them before training. Gradients handed to backward are zero bytes.
#pragma once

#include <gpukit/checkpoint/chain.hpp>
#include <gpukit/checkpoint/executor.hpp>
#include <gpukit/memory/caching_allocator.hpp>

#include <cstddef>
#include <cstdint>
#include <vector>

namespace gpukit {

/// Settings of profile_chain.
struct chain_profile_options {
  std::size_t warmup{1};       ///< untimed runs of each stage's forward and backward first
  std::size_t repetitions{5};  ///< timed runs (at least 1); the median is kept
  /// Nanoseconds per time unit of chain(): 1000 gives microseconds (the planner needs integers).
  std::int64_t time_unit_ns{1000};
};

/// What profile_chain measured for one stage.
struct stage_measurement {
  double forward_ms{0.0};               ///< median time of the stage's forward (both kinds)
  double backward_ms{0.0};              ///< median time of its backward
  std::int64_t output_bytes{0};         ///< a_i: held after a forward without recording
  std::int64_t tape_bytes{0};           ///< t_i: held after a recording forward, beyond a_i
  std::int64_t forward_transient{0};    ///< peak during the recording forward beyond a_i + t_i
  std::int64_t backward_transient{0};   ///< peak during the backward beyond what it started with
  std::vector<double> forward_samples;  ///< every timed forward, in milliseconds
  std::vector<double> backward_samples;
};

/// A chain's measured costs (see the top of this header).
struct chain_profile {
  std::vector<stage_measurement> stages;  ///< stage i at [i - 1]
  std::int64_t time_unit_ns{1000};        ///< as chain_profile_options::time_unit_ns

  /// The cost model: f_i, b_i in time units (rounded, at least 1), a_i and t_i in bytes.
  /// @throws gpukit::logic_error as checkpoint_chain's constructor
  [[nodiscard]] checkpoint_chain chain() const;
  /// The largest transient of any operation: memory the cost model does not see, to keep free
  /// beside a plan's peak (plan for budget - transient_bytes()).
  [[nodiscard]] std::int64_t transient_bytes() const noexcept;
};

/// Measures the L `stages` on the device of `allocator`, on `stream` (see the top of this header).
/// Synchronizes `stream` after each measured operation. Every buffer it allocates is freed before
/// it returns. Needs nothing else of the allocator: its peak is reset (reset_peak) while measuring.
/// @param x0 the input of stage 1, owned by the caller
/// @throws gpukit::logic_error when L is 0 or options.repetitions or options.time_unit_ns is 0
/// @throws gpukit::cuda_error when a runtime call fails; what the allocator or a stage throws
template <class Runtime, class Stages>
[[nodiscard]] chain_profile profile_chain(basic_caching_allocator<Runtime>& allocator,
                                          Stages& stages, std::size_t L, void const* x0,
                                          typename Runtime::stream_type stream,
                                          chain_profile_options const& options = {});

}  // namespace gpukit

#include <gpukit/checkpoint/detail/profile_chain_impl.hpp>
