// SPDX-License-Identifier: Apache-2.0
// gpukit_torch/csrc/cuda_allocator.h: gpukit as PyTorch's CUDA allocator, a subclass of
// c10::cuda::CUDACachingAllocator::CUDAAllocator built against the installed PyTorch.
//
// Every member forwards to gpukit_torch::backend (include/gpukit_torch/backend.hpp), which CI
// tests on the simulated GPU; this file only converts between PyTorch's types and the backend's.
// What gpukit cannot do (restoring a CUDA graph tree checkpoint whose blocks were freed since,
// MemPools with an allocator of their own, use_on_oom and no_split pools) raises a c10::Error
// naming the call.
#pragma once

#include <gpukit/runtime/cuda_runtime.hpp>
#include <gpukit_torch/backend.hpp>

#include <c10/cuda/CUDACachingAllocator.h>

#include <memory>
#include <mutex>
#include <string>
#include <unordered_set>
#include <vector>

namespace gpukit_torch {

namespace c10cuda = c10::cuda::CUDACachingAllocator;

class cuda_allocator final : public c10cuda::CUDAAllocator {
 public:
  /// `settings`: what the configuration made of the settings in `conf` (the strings it was
  /// made from, kept for snapshots). Warnings (a device without virtual memory management)
  /// become PyTorch warnings.
  cuda_allocator(backend_conf const& settings, std::string conf);

  /// The allocator PyTorch uses, when it is this one (else nullptr).
  static cuda_allocator* current() noexcept;
  [[nodiscard]] backend<gpukit::cuda_runtime>& layer() noexcept { return *backend_; }

  // c10::Allocator
  c10::DataPtr allocate(size_t nbytes) override;
  c10::DeleterFnPtr raw_deleter() const override;
  void copy_data(void* dest, const void* src, std::size_t count) const override;

  // c10::DeviceAllocator
  bool initialized() override;
  void emptyCache(c10::MempoolId_t mempool_id) override;
  c10::CachingDeviceAllocator::DeviceStats getDeviceStats(c10::DeviceIndex device) override;
  void resetAccumulatedStats(c10::DeviceIndex device) override;
  void resetPeakStats(c10::DeviceIndex device) override;

  // c10::cuda::CUDACachingAllocator::CUDAAllocator
  void* raw_alloc(size_t nbytes) override;
  void* raw_alloc_with_stream(size_t nbytes, cudaStream_t stream) override;
  void raw_delete(void* ptr) override;
  void init(int device_count) override;
  double getMemoryFraction(c10::DeviceIndex device) override;
  void setMemoryFraction(double fraction, c10::DeviceIndex device) override;
  std::vector<c10cuda::StreamSegmentSize> getExpandableSegmentSizes(
    c10::DeviceIndex device) override;
  void enable(bool value) override;
  bool isEnabled() const override;
  void cacheInfo(c10::DeviceIndex device, size_t* largestBlock) override;
  void* getBaseAllocation(void* ptr, size_t* size) override;
  void recordStream(const c10::DataPtr& ptr, c10::cuda::CUDAStream stream) override;
  c10cuda::SnapshotInfo snapshot(c10::MempoolId_t mempool_id, bool include_traces) override;
  void beginAllocateToPool(c10::DeviceIndex device, c10::MempoolId_t mempool_id,
                           std::function<bool(cudaStream_t)> filter) override;
  void endAllocateToPool(c10::DeviceIndex device, c10::MempoolId_t mempool_id) override;
  void releasePool(c10::DeviceIndex device, c10::MempoolId_t mempool_id) override;
  int getPoolUseCount(c10::DeviceIndex device, c10::MempoolId_t mempool_id) override;
  void createOrIncrefPool(c10::DeviceIndex device, c10::MempoolId_t mempool_id,
                          std::shared_ptr<c10cuda::CUDAAllocator> allocator) override;
  void setUseOnOOM(c10::DeviceIndex device, c10::MempoolId_t mempool_id, bool use_on_oom) override;
  void setNoSplit(c10::DeviceIndex device, c10::MempoolId_t mempool_id) override;
  bool checkPoolLiveAllocations(c10::DeviceIndex device, c10::MempoolId_t mempool_id,
                                const std::unordered_set<void*>& expected) override;
  c10cuda::ShareableHandle shareIpcHandle(void* ptr) override;
  std::shared_ptr<void> getIpcDevPtr(std::string handle) override;
  bool isHistoryEnabled() override;
  void recordHistory(bool enabled, c10cuda::CreateContextFn context_recorder,
                     size_t alloc_trace_max_entries, c10cuda::RecordContext when, bool clearHistory,
                     const std::vector<std::string>& skip_actions) override;
  void attachOutOfMemoryObserver(c10cuda::OutOfMemoryObserver observer) override;
  void attachAllocatorTraceTracker(c10cuda::AllocatorTraceTracker tracker) override;
  void enablePeerAccess(c10::DeviceIndex dev, c10::DeviceIndex dev_to_access) override;
  cudaError_t memcpyAsync(void* dst, int dstDevice, const void* src, int srcDevice, size_t count,
                          cudaStream_t stream, bool p2p_enabled) override;
  std::shared_ptr<c10cuda::AllocatorState> getCheckpointState(c10::DeviceIndex device,
                                                              c10::MempoolId_t id) override;
  c10cuda::CheckpointDelta setCheckpointPoolState(
    c10::DeviceIndex device, std::shared_ptr<c10cuda::AllocatorState> pps) override;
  std::string name() override;

 private:
  void* allocate_on(size_t nbytes, c10::DeviceIndex device, cudaStream_t stream);

  std::unique_ptr<backend<gpukit::cuda_runtime>> backend_;
  std::string conf_;
  bool initialized_{false};
  bool enabled_{true};
  std::mutex skip_mutex_;
  std::vector<std::string> skip_actions_;
};

}  // namespace gpukit_torch
