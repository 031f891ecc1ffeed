// SPDX-License-Identifier: Apache-2.0
// gpukit/transfer/prefetcher.hpp: keeps the next training batch on its way to the GPU while the
// current one computes.
//
// Quick start:
//
//   #include <gpukit/transfer/prefetcher.hpp>
//
//   #include <vector>
//
//   void train(std::vector<std::vector<float>> const& dataset, cudaStream_t compute)
//   {
//     auto& rt    = gpukit::cuda_runtime::instance();
//     auto& alloc = gpukit::default_caching_allocator(0);
//     gpukit::pinned_pool pool{rt};
//     gpukit::transfer_pipeline pipe{rt, pool};
//     gpukit::prefetcher loader{pipe, alloc, [&](std::size_t i) {
//       if (i == dataset.size()) { return gpukit::host_batch{}; }  // the end
//       return gpukit::host_batch{dataset[i].data(), dataset[i].size() * sizeof(float)};
//     }};
//     while (auto batch = loader.next(compute)) {  // compute waits on its event
//       // forward<<<grid, block, 0, compute>>>(batch->data);  // batch i+1 loads meanwhile
//       loader.release(*batch, compute);           // reused after compute's work
//     }
//   }
//
// A loader thread owned by the prefetcher asks the source for batch i, takes a device buffer of
// its size from the caching allocator on the prefetcher's own stream and submits the copy to the
// transfer pipeline (submit_to_device: the pipeline's threads stage pageable data), then goes on
// to batch i + 1 while `depth` allows; the staging thread that finishes batch i records its ready
// event. So batch i + 1 is staging while batch i's last chunks are copied: no staging thread waits
// at a batch's end. `next` hands batches out in order. Up to `depth` batches are loading or loaded
// ahead of the ones the consumer holds. Nothing here synchronizes the device: the consumer's
// stream waits on the batch's event.
#pragma once

#include <gpukit/error.hpp>
#include <gpukit/memory/caching_allocator.hpp>
#include <gpukit/runtime/cuda_runtime.hpp>
#include <gpukit/runtime/detail/compiled_runtimes.hpp>
#include <gpukit/runtime/runtime.hpp>
#include <gpukit/transfer/transfer_pipeline.hpp>

#include <condition_variable>
#include <cstddef>
#include <deque>
#include <exception>
#include <functional>
#include <mutex>
#include <optional>
#include <thread>
#include <utility>
#include <vector>

namespace gpukit {

/// One batch as the source gives it: host memory, pinned or pageable. {nullptr, 0} ends the
/// sequence.
struct host_batch {
  void const* data{nullptr};
  std::size_t bytes{0};
};

/// One batch on the device, as the prefetcher hands it out.
template <class Runtime>
struct device_batch {
  void* data{nullptr};                   ///< device memory from the caching allocator
  std::size_t bytes{0};                  ///< its size (the source's bytes)
  std::size_t index{0};                  ///< the batch's position in the sequence (0, 1, 2, ...)
  typename Runtime::event_type ready{};  ///< completes when data holds the batch
};

/// Settings of a prefetcher.
struct prefetcher_options {
  /// Batches loaded ahead of the ones the consumer holds (at least 1).
  std::size_t depth{1};
};

/// A batch prefetcher over a Runtime (see the top of this header). Not copyable or movable.
template <class Runtime>
class basic_prefetcher final {
 public:
  using batch_type  = device_batch<Runtime>;  ///< what next() hands out
  using stream_type = typename Runtime::stream_type;
  using event_type  = typename Runtime::event_type;
  /// Called on the loader thread with 0, 1, 2, ...: the host data of that batch, which must stay
  /// valid and unchanged until next() has handed that batch out. May throw: next() rethrows.
  using source_type = std::function<host_batch(std::size_t index)>;

  /// Creates the prefetcher's stream (on the allocator's device) and starts loading batch 0.
  /// `pipeline` and `allocator` may be destroyed before it, whatever the declaration order: the
  /// first of them to go stops the loader (its destructor waits for the batch being copied); the
  /// allocator also frees every batch, handed out or not (release() throws gpukit::logic_error
  /// afterwards) and forgets the prefetcher's stream. next() then returns the batches loaded
  /// before (none once the allocator is gone), then std::nullopt.
  /// @throws gpukit::logic_error when depth is 0 or the source is empty
  /// @throws gpukit::cuda_error when the stream cannot be created
  basic_prefetcher(basic_transfer_pipeline<Runtime>& pipeline,
                   basic_caching_allocator<Runtime>& allocator, source_type source,
                   prefetcher_options options = {});
  /// Stops loading (a batch being copied finishes first), frees the batches not handed out, and
  /// destroys the stream after the allocator forgets it (waits for the prefetcher's own stream
  /// only). Release every batch handed out before. Never throws.
  ~basic_prefetcher();
  // Neither copyable nor movable (deleted copies leave no implicit moves).
  basic_prefetcher(basic_prefetcher const&)            = delete;
  basic_prefetcher& operator=(basic_prefetcher const&) = delete;

  /// The next batch, in order, once its copy has been enqueued (blocks the host while it is being
  /// staged; not until it is on the device); std::nullopt after the last one. The batch is ready
  /// for work that waits on `ready`.
  /// @throws what the source threw, or the error of loading the batch (gpukit::cuda_error,
  ///         gpukit::out_of_memory, ...), once the batches loaded before it have been handed out;
  ///         later calls return std::nullopt (the batches after it are dropped)
  [[nodiscard]] std::optional<batch_type> next();
  /// next(), then makes `consumer` wait for the batch (stream_wait_event; no host wait).
  [[nodiscard]] std::optional<batch_type> next(stream_type consumer);

  /// Gives a batch back once `consumer`'s work queued so far (the work that read it) is done: its
  /// memory is reused only after that work (allocator record_stream). Call it after the consumer
  /// has waited on `ready`. Does not synchronize.
  /// @throws gpukit::logic_error for a batch this prefetcher did not hand out or already released
  void release(batch_type const& batch, stream_type consumer);

  /// The stream the prefetcher allocates on and hands copies to.
  [[nodiscard]] stream_type stream() const noexcept { return stream_; }
  /// Batches handed out so far.
  [[nodiscard]] std::size_t handed_out() const;

 private:
  static_assert(
    runtime_has_core_v<Runtime>,
    "basic_prefetcher needs a Runtime with the core operations (gpukit/runtime/contract.hpp)");

  /// A batch being loaded or loaded, not handed out yet.
  struct entry {
    batch_type batch;
    bool loaded{false};        ///< its completion ran (or it failed before being submitted)
    std::exception_ptr error;  ///< why it failed
  };

  /// The loader thread: batches 0, 1, 2, ... until the end, a failure or the destructor.
  void load_loop();
  /// Waits for room, then asks the source for batch `index`, allocates it and submits its copy.
  /// False when loading ends (the source's end, a failure, or stopping).
  bool load_batch(std::size_t index);
  /// Every failure ends loading: it becomes the failed batch's entry, which next() throws.
  void fail_loading(batch_type const& b, std::exception_ptr error);
  /// The pipeline's completion of batch `index` (a staging thread, or the loader).
  void on_loaded(std::size_t index, std::exception_ptr error) noexcept;
  /// Stops the loader and waits for the pipeline's completions. Idempotent, thread-safe.
  void stop_loading() noexcept;
  /// Frees every batch (loading, loaded or handed out) and makes the allocator forget the
  /// stream; the loader must be stopped. Idempotent. Call while the allocator lives.
  void free_batches() noexcept;

  basic_transfer_pipeline<Runtime>& pipeline_;
  basic_caching_allocator<Runtime>& allocator_;
  source_type source_;
  prefetcher_options options_;
  Runtime& runtime_;
  stream_type stream_{};

  mutable std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<entry> loading_;    ///< loading or loaded, not handed out; in order
  std::size_t submitted_{0};     ///< batches whose completion has not run
  std::vector<batch_type> out_;  ///< handed out, not released
  std::vector<event_type> spare_events_;
  bool failed_{false};    ///< a batch failed: nothing more is loaded
  bool broken_{false};    ///< next() has thrown that failure: nothing more is handed out
  bool finished_{false};  ///< the loader is done (end, error or stop)
  bool stopping_{false};
  std::size_t handed_out_{0};
  std::thread loader_;
  std::once_flag stopped_;  // stop_loading ran (from the destructor or an on_expire callback)
  // Whether the allocator and the pipeline still exist: each runs an on_expire callback of this
  // prefetcher when its destruction starts (see the constructor).
  detail::lifetime_token allocator_life_;
  detail::lifetime_token pipeline_life_;
};

/// The batch prefetcher over the CUDA runtime.
using prefetcher = basic_prefetcher<cuda_runtime>;

}  // namespace gpukit

#include <gpukit/transfer/detail/prefetcher_impl.hpp>

GPUKIT_DETAIL_EXTERN_TEMPLATE(class gpukit::basic_prefetcher<gpukit::cuda_runtime>);
GPUKIT_DETAIL_EXTERN_TEMPLATE(class gpukit::basic_prefetcher<gpukit::sim_runtime>);
