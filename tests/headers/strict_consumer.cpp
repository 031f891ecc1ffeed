// SPDX-License-Identifier: Apache-2.0
// A consumer's translation unit built with the strictest warnings a C++ team turns on
// (-Wall -Wextra -Wconversion -Wsign-conversion -Werror) and gpukit's include folder as a plain -I,
// not SYSTEM, so that a warning in any gpukit header fails the build. Including the headers alone
// checks only what is not a template: every class template is instantiated here, whole (each
// member function), over both runtimes. tests/headers/CMakeLists.txt builds it with the CCCL that
// find_package(CCCL) found (scripts/cccl-compat: other CCCL releases).
#include <gpukit/gpukit.hpp>

namespace gpukit {

template class basic_caching_allocator<cuda_runtime>;
template class basic_caching_allocator<sim_runtime>;
template class basic_pinned_pool<cuda_runtime>;
template class basic_pinned_pool<sim_runtime>;
template class pinned_buffer<cuda_runtime>;
template class pinned_buffer<sim_runtime>;
template class basic_transfer_pipeline<cuda_runtime>;
template class basic_transfer_pipeline<sim_runtime>;
template class basic_prefetcher<cuda_runtime>;
template class basic_prefetcher<sim_runtime>;
template class range_timer<cuda_runtime>;
template class range_timer<sim_runtime>;
template class basic_checkpoint_executor<cuda_runtime>;
template class basic_checkpoint_executor<sim_runtime>;
template class basic_device_buffer<basic_caching_allocator<cuda_runtime>>;
template class basic_device_buffer<basic_caching_allocator<sim_runtime>>;
template class device_uvector<float, basic_caching_allocator<cuda_runtime>>;
template class device_uvector<int, basic_caching_allocator<sim_runtime>>;
template class device_scalar<double, basic_caching_allocator<cuda_runtime>>;
template class device_scalar<unsigned, basic_caching_allocator<sim_runtime>>;
template class imported_block<cuda_runtime>;
template class imported_block<sim_runtime>;
template class basic_cuda_stream<cuda_runtime>;
template class basic_cuda_stream<sim_runtime>;
template class basic_cuda_stream_view<cuda_runtime>;
template class basic_cuda_stream_view<sim_runtime>;
template class basic_stream_pool<cuda_runtime>;
template class basic_stream_pool<sim_runtime>;
template class device_guard<cuda_runtime>;
template class device_guard<sim_runtime>;
template class basic_malloc_async_resource<cuda_runtime>;
template class basic_malloc_async_resource<sim_runtime>;
template class limiting_resource_adaptor<basic_caching_allocator<cuda_runtime>>;
template class limiting_resource_adaptor<basic_malloc_async_resource<sim_runtime>>;
template class statistics_resource_adaptor<basic_caching_allocator<sim_runtime>>;
template class statistics_resource_adaptor<basic_malloc_async_resource<cuda_runtime>>;
template class tracking_resource_adaptor<basic_caching_allocator<cuda_runtime>>;
template class tracking_resource_adaptor<basic_pinned_pool<sim_runtime>>;
template class logging_resource_adaptor<basic_caching_allocator<sim_runtime>>;
template class logging_resource_adaptor<basic_malloc_async_resource<cuda_runtime>>;
template class failure_callback_resource_adaptor<basic_caching_allocator<cuda_runtime>>;
template class failure_callback_resource_adaptor<
  statistics_resource_adaptor<basic_caching_allocator<sim_runtime>>>;

}  // namespace gpukit
