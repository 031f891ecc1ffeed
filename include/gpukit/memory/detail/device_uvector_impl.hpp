// SPDX-License-Identifier: Apache-2.0
// Bodies of gpukit/memory/device_uvector.hpp. Not public API.
#pragma once

#include <gpukit/error_macros.hpp>

namespace gpukit {

template <class T, class Allocator>
device_uvector<T, Allocator>::device_uvector(buffer_type&& buffer)
    : storage_{[&]() -> buffer_type&& {
        GPUKIT_EXPECTS(buffer.size() % sizeof(T) == 0 && buffer.capacity() % sizeof(T) == 0,
                       "device_uvector: a buffer of " + std::to_string(buffer.size()) +
                         " bytes (capacity " + std::to_string(buffer.capacity()) +
                         ") does not hold whole elements of " + std::to_string(sizeof(T)) +
                         " bytes");
        return std::move(buffer);
      }()}
{}

template <class T, class Allocator>
std::size_t device_uvector<T, Allocator>::bytes_for(std::size_t count)
{
  if (count > std::numeric_limits<std::size_t>::max() / sizeof(T)) {
    throw bad_alloc{"gpukit: device_uvector: " + std::to_string(count) + " elements of " +
                    std::to_string(sizeof(T)) + " bytes overflow std::size_t (at most " +
                    std::to_string(std::numeric_limits<std::size_t>::max() / sizeof(T)) +
                    " elements)"};
  }
  return count * sizeof(T);
}

template <class T, class Allocator>
void device_uvector<T, Allocator>::check_index(std::size_t i, char const* what) const
{
  GPUKIT_EXPECTS(i < size(), std::string{"device_uvector::"} + what + ": index " +
                               std::to_string(i) + " is out of range (size " +
                               std::to_string(size()) + ")");
}

template <class T, class Allocator>
void device_uvector<T, Allocator>::check_range(std::size_t first, std::size_t count,
                                               void const* host, char const* what) const
{
  GPUKIT_EXPECTS(first <= size() && count <= size() - first,
                 std::string{"device_uvector::"} + what + ": elements [" + std::to_string(first) +
                   ", " + std::to_string(first) + " + " + std::to_string(count) +
                   ") are out of range (size " + std::to_string(size()) + ")");
  GPUKIT_EXPECTS(count == 0 || host != nullptr,
                 std::string{"device_uvector::"} + what + ": the host pointer is null");
}

template <class T, class Allocator>
void device_uvector<T, Allocator>::copy(void* dst, void const* src, std::size_t bytes,
                                        memcpy_kind kind, stream_view stream) const
{
  if (bytes == 0) { return; }
  auto& rt = allocator().runtime();
  device_guard<typename Allocator::runtime_type> guard{rt, allocator().device()};
  GPUKIT_CUDA_TRY(rt.memcpy_async(dst, src, bytes, kind, stream.value()));
}

template <class T, class Allocator>
T* device_uvector<T, Allocator>::element_ptr(std::size_t i)
{
  check_index(i, "element_ptr");
  return data() + i;
}

template <class T, class Allocator>
T const* device_uvector<T, Allocator>::element_ptr(std::size_t i) const
{
  check_index(i, "element_ptr");
  return data() + i;
}

template <class T, class Allocator>
void device_uvector<T, Allocator>::set_element_async(std::size_t i, T const& value,
                                                     stream_view stream)
{
  check_index(i, "set_element_async");
  copy(data() + i, &value, sizeof(T), memcpy_kind::host_to_device, stream);
}

template <class T, class Allocator>
void device_uvector<T, Allocator>::set_element_to_zero_async(std::size_t i, stream_view stream)
{
  check_index(i, "set_element_to_zero_async");
  auto& rt = allocator().runtime();
  device_guard<typename Allocator::runtime_type> guard{rt, allocator().device()};
  GPUKIT_CUDA_TRY(rt.memset_async(data() + i, 0, sizeof(T), stream.value()));
}

template <class T, class Allocator>
void device_uvector<T, Allocator>::set_element(std::size_t i, T const& value, stream_view stream)
{
  check_index(i, "set_element");
  T const copy_of_value = value;  // the caller's may be a temporary: ours lives until the sync
  copy(data() + i, &copy_of_value, sizeof(T), memcpy_kind::host_to_device, stream);
  GPUKIT_CUDA_TRY(allocator().runtime().stream_synchronize(stream.value()));
}

template <class T, class Allocator>
T device_uvector<T, Allocator>::element(std::size_t i, stream_view stream) const
{
  check_index(i, "element");
  T value;
  copy(&value, data() + i, sizeof(T), memcpy_kind::device_to_host, stream);
  GPUKIT_CUDA_TRY(allocator().runtime().stream_synchronize(stream.value()));
  return value;
}

template <class T, class Allocator>
void device_uvector<T, Allocator>::copy_from_host_async(T const* source, std::size_t count,
                                                        stream_view stream, std::size_t first)
{
  check_range(first, count, source, "copy_from_host_async");
  copy(data() + first, source, count * sizeof(T), memcpy_kind::host_to_device, stream);
}

template <class T, class Allocator>
void device_uvector<T, Allocator>::copy_to_host_async(T* target, std::size_t count,
                                                      stream_view stream, std::size_t first) const
{
  check_range(first, count, target, "copy_to_host_async");
  copy(target, data() + first, count * sizeof(T), memcpy_kind::device_to_host, stream);
}

}  // namespace gpukit
