// gpukit/transfer/detail/prefetcher.inl: the bodies of gpukit::basic_prefetcher. Not public API.
#pragma once

#include <gpukit/transfer/prefetcher.hpp>

#include <algorithm>
#include <cassert>
#include <string>

namespace gpukit {

template <class Runtime>
basic_prefetcher<Runtime>::basic_prefetcher(basic_transfer_pipeline<Runtime>& pipeline,
                                            basic_caching_allocator<Runtime>& allocator,
                                            source_type source, prefetcher_options options)
    : pipeline_{pipeline}, allocator_{allocator}, source_{std::move(source)}, options_{options},
      runtime_{pipeline.runtime()}
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
}

template <class Runtime>
basic_prefetcher<Runtime>::~basic_prefetcher()
{
  {
    std::lock_guard<std::mutex> lock{mutex_};
    stopping_ = true;
  }
  cv_.notify_all();
  loader_.join();
  try {
    for (auto const& b : loaded_) {
      allocator_.deallocate_async(b.data, b.bytes, stream_);
      spare_events_.push_back(b.ready);
    }
    for (auto const& b : out_) {  // not released: freed after the prefetcher's own work
      allocator_.deallocate_async(b.data, b.bytes, stream_);
      spare_events_.push_back(b.ready);
    }
    allocator_.forget_stream(stream_);
  } catch (...) {
    assert(false && "prefetcher: freeing batches failed");
  }
  for (auto e : spare_events_) { GPUKIT_ASSERT_CUDA_SUCCESS(runtime_.event_destroy(e)); }
  GPUKIT_ASSERT_CUDA_SUCCESS(runtime_.stream_destroy(stream_));
}

template <class Runtime>
void basic_prefetcher<Runtime>::load_loop()
{
  try {
    GPUKIT_CUDA_TRY(runtime_.set_device(allocator_.device()));  // the loader's own thread
    for (std::size_t index = 0;; ++index) {
      event_type ev{};
      {
        std::unique_lock<std::mutex> lock{mutex_};
        cv_.wait(lock, [&] { return stopping_ || loaded_.size() < options_.depth; });
        if (stopping_) { break; }
        if (!spare_events_.empty()) {
          ev = spare_events_.back();
          spare_events_.pop_back();
        }
      }
      if (ev == event_type{}) { GPUKIT_CUDA_TRY(runtime_.event_create(ev, false)); }
      batch_type b;
      b.index = index;
      b.ready = ev;
      try {
        host_batch const h = source_(index);
        if (h.data == nullptr && h.bytes == 0) {
          std::lock_guard<std::mutex> lock{mutex_};
          spare_events_.push_back(ev);
          break;
        }
        b.bytes = h.bytes;
        b.data  = allocator_.allocate_async(h.bytes, stream_);
        try {
          pipeline_.copy_to_device_async(b.data, h.data, h.bytes, stream_);
          GPUKIT_CUDA_TRY(runtime_.event_record(ev, stream_));
        } catch (...) {
          allocator_.deallocate_async(b.data, b.bytes, stream_);
          throw;
        }
      } catch (...) {
        std::lock_guard<std::mutex> lock{mutex_};
        spare_events_.push_back(ev);
        throw;
      }
      {
        std::lock_guard<std::mutex> lock{mutex_};
        loaded_.push_back(b);
      }
      cv_.notify_all();
    }
  } catch (...) {
    std::lock_guard<std::mutex> lock{mutex_};
    error_ = std::current_exception();
  }
  {
    std::lock_guard<std::mutex> lock{mutex_};
    finished_ = true;
  }
  cv_.notify_all();
}

template <class Runtime>
std::optional<typename basic_prefetcher<Runtime>::batch_type> basic_prefetcher<Runtime>::next()
{
  std::unique_lock<std::mutex> lock{mutex_};
  cv_.wait(lock, [&] { return !loaded_.empty() || finished_; });
  if (loaded_.empty()) {
    if (error_) {
      auto e = error_;
      error_ = nullptr;
      std::rethrow_exception(e);
    }
    return std::nullopt;
  }
  batch_type b = loaded_.front();
  out_.push_back(b);
  loaded_.pop_front();
  ++handed_out_;
  lock.unlock();
  cv_.notify_all();  // the loader may start the next batch
  return b;
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
