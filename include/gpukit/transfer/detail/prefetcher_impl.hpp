// SPDX-License-Identifier: Apache-2.0
// gpukit/transfer/detail/prefetcher_impl.hpp: the bodies of gpukit::basic_prefetcher. Not public
// API.
#pragma once

#include <gpukit/error_macros.hpp>

#include <algorithm>
#include <cassert>
#include <cstdio>
#include <exception>
#include <string>

namespace gpukit {

template <class Runtime>
basic_prefetcher<Runtime>::basic_prefetcher(basic_transfer_pipeline<Runtime>& pipeline,
                                            basic_caching_allocator<Runtime>& allocator,
                                            source_type source, prefetcher_options options)
    : pipeline_{pipeline}, allocator_{allocator}, source_{std::move(source)}, options_{options},
      runtime_{pipeline.runtime()}, allocator_life_{allocator.lifetime()}, pipeline_life_{
                                                                             pipeline.lifetime()}
{
  GPUKIT_EXPECTS(options_.depth != 0, "prefetcher: depth is 0");
  GPUKIT_EXPECTS(static_cast<bool>(source_), "prefetcher: the source is empty");
  {
    device_guard<Runtime> guard{runtime_, allocator_.device()};
    GPUKIT_CUDA_TRY(runtime_.stream_create(stream_));
  }
  try {
    loader_ = std::thread{[this] { load_loop(); }};
  } catch (...) {
    (void)runtime_.stream_destroy(stream_);
    throw;
  }
  try {
    // Whichever of the two goes first stops the loader before it is used again; the allocator
    // also takes the batches back while it can. The callbacks run under their owner's lifetime
    // lock, as long as this prefetcher lives (the destructor takes them back).
    (void)allocator_life_.on_expire(this, [this] {
      stop_loading();
      free_batches();
    });
    (void)pipeline_life_.on_expire(this, [this] { stop_loading(); });
  } catch (...) {
    allocator_life_.forget_on_expire(this);
    stop_loading();
    free_batches();
    (void)runtime_.stream_destroy(stream_);
    throw;
  }
}

template <class Runtime>
void basic_prefetcher<Runtime>::stop_loading() noexcept
{
  try {
    std::call_once(stopped_, [this] {
      {
        std::lock_guard<std::mutex> lock{mutex_};
        stopping_ = true;
      }
      cv_.notify_all();
      loader_.join();
      std::unique_lock<std::mutex> lock{mutex_};  // the pipeline's completions touch this object
      cv_.wait(lock, [this] { return submitted_ == 0; });
    });
  } catch (std::exception const& e) {  // call_once or join failed: nothing else can be done
    std::fprintf(stderr, "gpukit: prefetcher: stopping the loader: %s\n", e.what());
  }
}

template <class Runtime>
void basic_prefetcher<Runtime>::free_batches() noexcept
{
  std::lock_guard<std::mutex> lock{mutex_};
  try {
    for (auto const& e : loading_) {
      if (e.batch.data != nullptr) {
        allocator_.deallocate_async(e.batch.data, e.batch.bytes, stream_);
      }
      if (e.batch.ready != event_type{}) { spare_events_.push_back(e.batch.ready); }
    }
    loading_.clear();
    for (auto const& b : out_) {  // not released: freed after the prefetcher's own work
      allocator_.deallocate_async(b.data, b.bytes, stream_);
      spare_events_.push_back(b.ready);
    }
    out_.clear();
    allocator_.forget_stream(stream_);
  } catch (...) {
    assert(false && "prefetcher: freeing batches failed");
  }
}

template <class Runtime>
basic_prefetcher<Runtime>::~basic_prefetcher()
{
  stop_loading();  // done already when the pipeline or the allocator went first
  try {
    // Skipped when the allocator is gone: its on_expire callback freed the batches.
    (void)allocator_life_.with_alive([this] { free_batches(); });
  } catch (std::exception const& e) {  // the lifetime lock: the allocator frees them when it goes
    std::fprintf(stderr, "gpukit: prefetcher: freeing the batches: %s\n", e.what());
  }
  allocator_life_.forget_on_expire(this);
  pipeline_life_.forget_on_expire(this);
  for (auto e : spare_events_) { GPUKIT_ASSERT_CUDA_SUCCESS(runtime_.event_destroy(e)); }
  GPUKIT_ASSERT_CUDA_SUCCESS(runtime_.stream_destroy(stream_));
}

template <class Runtime>
void basic_prefetcher<Runtime>::load_loop()
{
  bool go = true;
  try {
    GPUKIT_CUDA_TRY(runtime_.set_device(allocator_.device()));  // the loader's own thread
  } catch (...) {
    fail_loading(batch_type{}, std::current_exception());
    go = false;
  }
  for (std::size_t index = 0; go; ++index) { go = load_batch(index); }
  {
    std::lock_guard<std::mutex> lock{mutex_};
    finished_ = true;
  }
  cv_.notify_all();
}

template <class Runtime>
void basic_prefetcher<Runtime>::fail_loading(batch_type const& b, std::exception_ptr error)
{
  std::lock_guard<std::mutex> lock{mutex_};
  loading_.push_back(entry{b, true, std::move(error)});
  failed_ = true;
}

template <class Runtime>
bool basic_prefetcher<Runtime>::load_batch(std::size_t index)
{
  batch_type b;
  b.index = index;
  {
    std::unique_lock<std::mutex> lock{mutex_};
    cv_.wait(lock, [&] { return stopping_ || failed_ || loading_.size() < options_.depth; });
    if (stopping_ || failed_) { return false; }
    if (!spare_events_.empty()) {
      b.ready = spare_events_.back();
      spare_events_.pop_back();
    }
  }
  host_batch h;
  try {
    if (b.ready == event_type{}) { GPUKIT_CUDA_TRY(runtime_.event_create(b.ready, false)); }
    h = source_(index);
    if (h.data == nullptr && h.bytes == 0) {
      std::lock_guard<std::mutex> lock{mutex_};
      spare_events_.push_back(b.ready);
      return false;
    }
    b.bytes = h.bytes;
    b.data  = allocator_.allocate_async(h.bytes, stream_);
  } catch (...) {  // nothing was allocated: the allocation is the last call that throws
    fail_loading(b, std::current_exception());
    return false;
  }
  {
    std::lock_guard<std::mutex> lock{mutex_};
    loading_.push_back(entry{b, false, nullptr});
    ++submitted_;
  }
  try {
    pipeline_.submit_to_device(
      b.data, h.data, h.bytes, host_memory::detect, stream_,
      [this, index](std::exception_ptr e) { on_loaded(index, std::move(e)); });
  } catch (...) {  // not submitted: no completion will come
    on_loaded(index, std::current_exception());
    return false;
  }
  return true;
}

template <class Runtime>
void basic_prefetcher<Runtime>::on_loaded(std::size_t index, std::exception_ptr error) noexcept
{
  // The batch's entry stays in loading_ until this marks it loaded (next() waits for that), and a
  // deque keeps references to its elements across push_back: find it once.
  entry* mine = nullptr;
  {
    std::lock_guard<std::mutex> lock{mutex_};
    for (auto& e : loading_) {
      if (e.batch.index == index) { mine = &e; }
    }
  }
  if (!error) {  // the prefetcher's stream waits for the copy now: mark the batch there
    try {
      GPUKIT_CUDA_TRY(runtime_.event_record(mine->batch.ready, stream_));
    } catch (...) {
      error = std::current_exception();
    }
  }
  {
    std::lock_guard<std::mutex> lock{mutex_};
    mine->loaded = true;
    if (error) { failed_ = true; }
    // Moved, not copied: this thread keeps no reference to the error once the lock is released
    // (the consumer may rethrow and free it at once).
    mine->error = std::move(error);
    --submitted_;
    // Under the lock: once it is released the destructor may run, and this touches nothing after.
    cv_.notify_all();
  }
}

template <class Runtime>
std::optional<typename basic_prefetcher<Runtime>::batch_type> basic_prefetcher<Runtime>::next()
{
  std::unique_lock<std::mutex> lock{mutex_};
  cv_.wait(lock, [&] {
    return broken_ || (!loading_.empty() && loading_.front().loaded) ||
           (loading_.empty() && finished_);
  });
  if (broken_ || loading_.empty()) { return std::nullopt; }
  entry e = loading_.front();
  loading_.pop_front();
  if (e.error) {
    broken_ = true;
    lock.unlock();
    cv_.notify_all();
    if (e.batch.data != nullptr) {  // its copy's work is ordered before this on the stream
      allocator_.deallocate_async(e.batch.data, e.batch.bytes, stream_);
    }
    if (e.batch.ready != event_type{}) {
      std::lock_guard<std::mutex> relock{mutex_};
      spare_events_.push_back(e.batch.ready);
    }
    std::rethrow_exception(e.error);
  }
  out_.push_back(e.batch);
  ++handed_out_;
  lock.unlock();
  cv_.notify_all();  // the loader may start the next batch
  return e.batch;
}

template <class Runtime>
std::optional<typename basic_prefetcher<Runtime>::batch_type> basic_prefetcher<Runtime>::next(
  stream_type consumer)
{
  auto b = next();
  if (b) { GPUKIT_CUDA_TRY(runtime_.stream_wait_event(consumer, b->ready)); }
  return b;
}

template <class Runtime>
void basic_prefetcher<Runtime>::release(batch_type const& batch, stream_type consumer)
{
  GPUKIT_EXPECTS(allocator_life_.alive(),
                 "prefetcher::release: the allocator was destroyed (it took batch " +
                   std::to_string(batch.index) + " back)");
  {
    std::lock_guard<std::mutex> lock{mutex_};
    auto it = std::find_if(out_.begin(), out_.end(), [&](batch_type const& o) {
      return o.data == batch.data && o.index == batch.index;
    });
    GPUKIT_EXPECTS(it != out_.end(), "prefetcher::release: batch " + std::to_string(batch.index) +
                                       " (" + detail::pinned_hex(batch.data) +
                                       ") is not handed out by this prefetcher");
    out_.erase(it);
  }
  if (consumer != stream_) { allocator_.record_stream(batch.data, consumer); }
  allocator_.deallocate_async(batch.data, batch.bytes, stream_);
  std::lock_guard<std::mutex> lock{mutex_};
  spare_events_.push_back(batch.ready);
}

template <class Runtime>
std::size_t basic_prefetcher<Runtime>::handed_out() const
{
  std::lock_guard<std::mutex> lock{mutex_};
  return handed_out_;
}

}  // namespace gpukit
