// SPDX-License-Identifier: Apache-2.0
// gpukit/gpukit.hpp: every public header of gpukit in one include.
//
// Quick start:
//
//   #include <gpukit/gpukit.hpp>
//
//   #include <cstddef>
//
//   void step(cudaStream_t stream, std::size_t bytes)
//   {
//     gpukit::caching_allocator& alloc = gpukit::default_caching_allocator(0);
//     GPUKIT_RANGE("step");
//     void* p = alloc.allocate_async(bytes, stream);
//     alloc.deallocate_async(p, bytes, stream);
//   }
//
// The host headers (.hpp) compile with any C++17 host compiler; the headers that need nvcc (.cuh)
// are included too when the translation unit is compiled by nvcc (__CUDACC__ is defined). Including
// one component's header instead (gpukit/memory/caching_allocator.hpp, say) compiles faster. A
// test (tests/headers) fails when a public header is missing here.
#pragma once

#include <gpukit/checkpoint/chain.hpp>
#include <gpukit/checkpoint/executor.hpp>
#include <gpukit/checkpoint/planners.hpp>
#include <gpukit/checkpoint/profile_chain.hpp>
#include <gpukit/checkpoint/schedule.hpp>
#include <gpukit/doctor/doctor.hpp>
#include <gpukit/error.hpp>
#include <gpukit/error_macros.hpp>
#include <gpukit/host/pinned_pool.hpp>
#include <gpukit/memory/adaptors/failure_callback_resource_adaptor.hpp>
#include <gpukit/memory/adaptors/limiting_resource_adaptor.hpp>
#include <gpukit/memory/adaptors/logging_resource_adaptor.hpp>
#include <gpukit/memory/adaptors/statistics_resource_adaptor.hpp>
#include <gpukit/memory/adaptors/tracking_resource_adaptor.hpp>
#include <gpukit/memory/alloc_conf.hpp>
#include <gpukit/memory/allocation_trace.hpp>
#include <gpukit/memory/caching_allocator.hpp>
#include <gpukit/memory/caching_allocator_options.hpp>
#include <gpukit/memory/caching_allocator_stats.hpp>
#include <gpukit/memory/cuda_stream.hpp>
#include <gpukit/memory/current_resource.hpp>
#include <gpukit/memory/device_buffer.hpp>
#include <gpukit/memory/device_scalar.hpp>
#include <gpukit/memory/device_uvector.hpp>
#include <gpukit/memory/ipc.hpp>
#include <gpukit/memory/malloc_async_resource.hpp>
#include <gpukit/memory/memory_history.hpp>
#include <gpukit/memory/memory_summary.hpp>
#include <gpukit/memory/retry_on_oom.hpp>
#include <gpukit/memory/temp_storage.hpp>
#include <gpukit/memory/testing.hpp>
#include <gpukit/profile/memory_annotation.hpp>
#include <gpukit/profile/nvtx.hpp>
#include <gpukit/profile/range_timer.hpp>
#include <gpukit/runtime/contract.hpp>
#include <gpukit/runtime/cuda_runtime.hpp>
#include <gpukit/runtime/runtime.hpp>
#include <gpukit/runtime/runtime_types.hpp>
#include <gpukit/runtime/sim_runtime.hpp>
#include <gpukit/stats.hpp>
#include <gpukit/transfer/prefetcher.hpp>
#include <gpukit/transfer/transfer_pipeline.hpp>
#include <gpukit/version.hpp>

#ifdef __CUDACC__
#include <gpukit/memory/thrust_allocator.cuh>
#endif
