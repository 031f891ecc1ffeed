// SPDX-License-Identifier: Apache-2.0
// Bodies of gpukit/memory/device_buffer.hpp. Not public API.
#pragma once

#include <gpukit/error_macros.hpp>

#include <cstdio>
#include <exception>
#include <string>

namespace gpukit {

template <class Allocator>
basic_device_buffer<Allocator>::basic_device_buffer(std::size_t bytes, stream_view stream,
                                                    Allocator& alloc)
    : alloc_{&alloc}, life_{detail::lifetime_of(alloc)}, stream_{stream}
{
  data_     = allocate(bytes, stream);
  size_     = bytes;
  capacity_ = bytes;
}

template <class Allocator>
basic_device_buffer<Allocator>::basic_device_buffer(void const* source, std::size_t bytes,
                                                    stream_view stream, Allocator& alloc)
    : basic_device_buffer{bytes, stream, alloc}
{
  if (bytes != 0) {
    GPUKIT_EXPECTS(source != nullptr,
                   "device_buffer: copying " + std::to_string(bytes) + " bytes from a null source");
    copy_async(data_, source, bytes, memcpy_kind::infer, stream);
  }
}

template <class Allocator>
basic_device_buffer<Allocator>::basic_device_buffer(basic_device_buffer const& other,
                                                    stream_view stream, Allocator& alloc)
    : basic_device_buffer{other.size_, stream, alloc}
{
  copy_async(data_, other.data_, other.size_, memcpy_kind::device_to_device, stream);
}

template <class Allocator>
basic_device_buffer<Allocator>::~basic_device_buffer()
{
  free_now();
}

template <class Allocator>
basic_device_buffer<Allocator>::basic_device_buffer(basic_device_buffer&& other) noexcept
    : alloc_{other.alloc_}, life_{other.life_}, stream_{other.stream_}, data_{std::exchange(
                                                                          other.data_, nullptr)},
      size_{std::exchange(other.size_, 0)}, capacity_{std::exchange(other.capacity_, 0)}
{}

template <class Allocator>
basic_device_buffer<Allocator>& basic_device_buffer<Allocator>::operator=(
  basic_device_buffer&& other) noexcept
{
  if (this != &other) {
    free_now();
    alloc_    = other.alloc_;
    life_     = other.life_;
    stream_   = other.stream_;
    data_     = std::exchange(other.data_, nullptr);
    size_     = std::exchange(other.size_, 0);
    capacity_ = std::exchange(other.capacity_, 0);
  }
  return *this;
}

template <class Allocator>
void basic_device_buffer<Allocator>::set_stream(stream_view stream)
{
  expect_allocator("set_stream");
  stream.register_allocator(*alloc_);
  stream_ = stream;
}

template <class Allocator>
void basic_device_buffer<Allocator>::reserve(std::size_t bytes, stream_view stream)
{
  if (bytes > capacity_) {
    reallocate(bytes, stream);
  } else {
    set_stream(stream);
  }
}

template <class Allocator>
void basic_device_buffer<Allocator>::resize(std::size_t bytes, stream_view stream)
{
  reserve(bytes, stream);
  size_ = bytes;
}

template <class Allocator>
void basic_device_buffer<Allocator>::shrink_to_fit(stream_view stream)
{
  if (size_ < capacity_) {
    reallocate(size_, stream);
  } else {
    set_stream(stream);
  }
}

template <class Allocator>
void* basic_device_buffer<Allocator>::release() noexcept
{
  size_     = 0;
  capacity_ = 0;
  return std::exchange(data_, nullptr);
}

template <class Allocator>
void* basic_device_buffer<Allocator>::allocate(std::size_t bytes, stream_view stream)
{
  expect_allocator("allocating");
  stream.register_allocator(*alloc_);  // before the allocator first sees the stream
  if (bytes == 0) { return nullptr; }
  return alloc_->allocate_async(bytes, stream.value());
}

template <class Allocator>
void basic_device_buffer<Allocator>::free_now() noexcept
{
  if (data_ == nullptr) { return; }
  if (allocator_gone()) {  // its destructor took the memory back
    data_     = nullptr;
    size_     = 0;
    capacity_ = 0;
    return;
  }
  try {
    // A stream destroyed since is freed on as the default stream: its work completed (the
    // allocator, registered with it, forgot it), and its handle names nothing now.
    alloc_->deallocate_async(data_, capacity_,
                             stream_.is_destroyed() ? stream_type{} : stream_.value());
  } catch (std::exception const& e) {
    std::fprintf(stderr, "gpukit: device_buffer: freeing %zu bytes at %p: %s\n", capacity_, data_,
                 e.what());
  }
  data_     = nullptr;
  size_     = 0;
  capacity_ = 0;
}

template <class Allocator>
void basic_device_buffer<Allocator>::expect_allocator(char const* call) const
{
  GPUKIT_EXPECTS(!allocator_gone(),
                 std::string{"device_buffer: "} + call + ": the buffer's allocator was destroyed");
}

template <class Allocator>
void basic_device_buffer<Allocator>::copy_async(void* dst, void const* src, std::size_t bytes,
                                                memcpy_kind kind, stream_view stream)
{
  if (bytes == 0) { return; }
  auto& rt = alloc_->runtime();
  device_guard<runtime_type> guard{rt, alloc_->device()};
  GPUKIT_CUDA_TRY(rt.memcpy_async(dst, src, bytes, kind, stream.value()));
}

template <class Allocator>
void basic_device_buffer<Allocator>::reallocate(std::size_t new_capacity, stream_view stream)
{
  void* fresh            = allocate(new_capacity, stream);
  std::size_t const keep = size_ < new_capacity ? size_ : new_capacity;
  try {
    copy_async(fresh, data_, keep, memcpy_kind::device_to_device, stream);
  } catch (...) {
    alloc_->deallocate_async(fresh, new_capacity, stream.value());  // nothing was copied into it
    throw;
  }
  // The old block is freed in the order of the new stream, after the copy that reads it.
  stream_ = stream;
  if (data_ != nullptr) { alloc_->deallocate_async(data_, capacity_, stream_.value()); }
  data_     = fresh;
  capacity_ = new_capacity;
  if (size_ > new_capacity) { size_ = new_capacity; }
}

}  // namespace gpukit
