// SPDX-License-Identifier: Apache-2.0
// gpukit_torch/csrc/cuda_allocator.cpp: PyTorch's allocator interface, forwarded to the backend.
#include "cuda_allocator.h"

#include <c10/core/Allocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <atomic>
#include <exception>
#include <limits>
#include <utility>

namespace gpukit_torch {

namespace {

std::atomic<cuda_allocator*> the_allocator{nullptr};

void delete_block(void* ptr)
{
  cuda_allocator* a = the_allocator.load(std::memory_order_acquire);
  if (a == nullptr || ptr == nullptr) { return; }
  try {
    a->layer().deallocate(ptr);
  } catch (std::exception const& e) {
    // A deleter must not throw (it runs in destructors): report, and leave the block.
    TORCH_WARN("gpukit: freeing a tensor's memory failed: ", e.what());
  }
}

// Runs `f`, turning gpukit's errors into PyTorch's: out of memory (a limit, a fraction, or the
// device) into c10::OutOfMemoryError, anything else into c10::Error.
template <class F>
auto translate(char const* what, F&& f) -> decltype(f())
{
  try {
    return f();
  } catch (c10::Error const&) {
    throw;
  } catch (gpukit::bad_alloc const& e) {
    TORCH_CHECK_WITH(OutOfMemoryError, false, "CUDA out of memory (gpukit, ", what, "). ",
                     e.what());
  } catch (std::exception const& e) {
    TORCH_CHECK(false, "gpukit: ", what, ": ", e.what());
  }
}

[[noreturn]] void unsupported(char const* call, char const* why)
{
  TORCH_CHECK(false, "gpukit: ", call, " is not supported by gpukit's PyTorch allocator: ", why);
}

pool_id to_pool(c10::MempoolId_t id) { return {id.first, id.second}; }

c10::CachingAllocator::Stat to_c10(stat const& s)
{
  c10::CachingAllocator::Stat out;
  out.current   = s.current;
  out.peak      = s.peak;
  out.allocated = s.allocated;
  out.freed     = s.freed;
  return out;
}

// One statistic of `s`: the aggregate and each pool kind's.
c10::CachingAllocator::StatArray to_c10_array(device_stats const& s,
                                              stat gpukit_torch::device_pool_stats::*member)
{
  using c10::CachingAllocator::StatType;
  c10::CachingAllocator::StatArray a{};
  a[static_cast<size_t>(StatType::AGGREGATE)]  = to_c10(s.*member);
  a[static_cast<size_t>(StatType::SMALL_POOL)] = to_c10(s.small_pool.*member);
  a[static_cast<size_t>(StatType::LARGE_POOL)] = to_c10(s.large_pool.*member);
  return a;
}

std::shared_ptr<c10::GatheredContext> to_context(std::shared_ptr<void> const& p)
{
  return std::static_pointer_cast<c10::GatheredContext>(p);
}

c10::CachingDeviceAllocator::TraceEntry::Action to_c10(trace_entry::action a)
{
  using A = c10::CachingDeviceAllocator::TraceEntry::Action;
  switch (a) {
    case trace_entry::action::alloc: return A::ALLOC;
    case trace_entry::action::free_requested: return A::FREE_REQUESTED;
    case trace_entry::action::free_completed: return A::FREE_COMPLETED;
    case trace_entry::action::segment_alloc: return A::SEGMENT_ALLOC;
    case trace_entry::action::segment_free: return A::SEGMENT_FREE;
    case trace_entry::action::oom: return A::OOM;
  }
  return A::ALLOC;
}

char const* action_name(trace_entry::action a)
{
  switch (a) {
    case trace_entry::action::alloc: return "alloc";
    case trace_entry::action::free_requested: return "free_requested";
    case trace_entry::action::free_completed: return "free_completed";
    case trace_entry::action::segment_alloc: return "segment_alloc";
    case trace_entry::action::segment_free: return "segment_free";
    case trace_entry::action::oom: return "oom";
  }
  return "unknown";
}

c10::CachingDeviceAllocator::TraceEntry to_c10(trace_entry const& e)
{
  c10::CachingDeviceAllocator::TraceEntry t{to_c10(e.what),
                                            static_cast<c10::DeviceIndex>(e.device),
                                            e.address,
                                            e.bytes,
                                            reinterpret_cast<void*>(e.stream),
                                            {e.pool.first, e.pool.second},
                                            0,
                                            to_context(e.context)};
  t.time_.t_ = static_cast<time_t>(e.time_us);  // snapshots carry microseconds, as PyTorch's
  return t;
}

c10::CachingDeviceAllocator::SegmentInfo to_c10(segment_info const& s)
{
  c10::CachingDeviceAllocator::SegmentInfo out;
  out.device                = static_cast<c10::DeviceIndex>(s.device);
  out.address               = s.address;
  out.total_size            = s.total_size;
  out.requested_size        = s.requested_size;
  out.allocated_size        = s.allocated_size;
  out.active_size           = s.allocated_size;
  out.stream                = reinterpret_cast<void*>(s.stream);
  out.is_large              = s.is_large;
  out.is_expandable         = s.is_expandable;
  out.owner_private_pool_id = {s.owner.first, s.owner.second};
  for (auto const& b : s.blocks) {
    c10::CachingDeviceAllocator::BlockInfo bi;
    bi.size                   = b.size;
    bi.requested_size         = b.requested;
    bi.allocated              = b.allocated;
    bi.active                 = b.allocated;
    bi.context_when_allocated = to_context(b.context);
    out.blocks.push_back(std::move(bi));
  }
  return out;
}

}  // namespace

cuda_allocator::cuda_allocator(backend_conf const& settings, std::string conf)
    : backend_{std::make_unique<backend<gpukit::cuda_runtime>>(gpukit::cuda_runtime::instance(),
                                                               settings)},
      conf_{std::move(conf)}
{
  backend_->set_warning_handler([](std::string const& w) { TORCH_WARN(w); });
  the_allocator.store(this, std::memory_order_release);
}

cuda_allocator* cuda_allocator::current() noexcept
{
  cuda_allocator* a = the_allocator.load(std::memory_order_acquire);
  return a != nullptr && c10cuda::get() == a ? a : nullptr;
}

void* cuda_allocator::allocate_on(size_t nbytes, c10::DeviceIndex device, cudaStream_t stream)
{
  try {
    return backend_->allocate(device, nbytes, stream);
  } catch (gpukit::bad_alloc const& e) {
    auto const s = backend_->stats(device);
    c10::reportOutOfMemoryToProfiler(
      static_cast<int64_t>(nbytes), static_cast<size_t>(s.allocated_bytes.current),
      static_cast<size_t>(s.reserved_bytes.current), c10::Device(c10::DeviceType::CUDA, device));
    TORCH_CHECK_WITH(OutOfMemoryError, false, "CUDA out of memory. Tried to allocate ", nbytes,
                     " bytes on device ", static_cast<int>(device), ". ", e.what());
  } catch (std::exception const& e) {
    TORCH_CHECK(false, "gpukit: allocating ", nbytes, " bytes on device ", static_cast<int>(device),
                " failed: ", e.what());
  }
}

c10::DataPtr cuda_allocator::allocate(size_t nbytes)
{
  c10::DeviceIndex const device = c10::cuda::current_device();
  cudaStream_t const stream     = c10::cuda::getCurrentCUDAStream(device).stream();
  void* p                       = allocate_on(nbytes, device, stream);
  return {p, p, &delete_block, c10::Device(c10::DeviceType::CUDA, device)};
}

c10::DeleterFnPtr cuda_allocator::raw_deleter() const { return &delete_block; }

void cuda_allocator::copy_data(void* dest, const void* src, std::size_t count) const
{
  C10_CUDA_CHECK(cudaMemcpy(dest, src, count, cudaMemcpyDeviceToDevice));
}

bool cuda_allocator::initialized() { return initialized_; }

void cuda_allocator::emptyCache(c10::MempoolId_t /*mempool_id*/)
{
  // gpukit releases every fully free segment (a pool's, once released, included).
  translate("emptyCache", [&] { return backend_->empty_cache(); });
}

c10::CachingDeviceAllocator::DeviceStats cuda_allocator::getDeviceStats(c10::DeviceIndex device)
{
  device_stats const s = backend_->stats(device);
  c10::CachingDeviceAllocator::DeviceStats out;
  using m                  = gpukit_torch::device_pool_stats;
  out.allocation           = to_c10_array(s, &m::allocation);
  out.segment              = to_c10_array(s, &m::segment);
  out.active               = to_c10_array(s, &m::active);
  out.inactive_split       = to_c10_array(s, &m::inactive_split);
  out.allocated_bytes      = to_c10_array(s, &m::allocated_bytes);
  out.reserved_bytes       = to_c10_array(s, &m::reserved_bytes);
  out.active_bytes         = to_c10_array(s, &m::active_bytes);
  out.inactive_split_bytes = to_c10_array(s, &m::inactive_split_bytes);
  out.requested_bytes      = to_c10_array(s, &m::requested_bytes);
  out.num_alloc_retries    = s.num_alloc_retries;
  out.num_ooms             = s.num_ooms;
  out.num_sync_all_streams = s.num_sync_all_streams;
  out.num_device_alloc     = s.num_device_alloc;
  out.num_device_free      = s.num_device_free;
  out.max_split_size       = s.max_split_size;  // -1: unlimited, as PyTorch reports SIZE_MAX
  out.oversize_allocations = to_c10(s.oversize_allocations);
  out.oversize_segments    = to_c10(s.oversize_segments);
  return out;
}

void cuda_allocator::resetAccumulatedStats(c10::DeviceIndex device)
{
  backend_->reset_accumulated_stats(device);
}

void cuda_allocator::resetPeakStats(c10::DeviceIndex device) { backend_->reset_peak_stats(device); }

void* cuda_allocator::raw_alloc(size_t nbytes)
{
  c10::DeviceIndex const device = c10::cuda::current_device();
  return allocate_on(nbytes, device, c10::cuda::getCurrentCUDAStream(device).stream());
}

void* cuda_allocator::raw_alloc_with_stream(size_t nbytes, cudaStream_t stream)
{
  return allocate_on(nbytes, c10::cuda::current_device(), stream);
}

void cuda_allocator::raw_delete(void* ptr)
{
  translate("raw_delete", [&] { backend_->deallocate(ptr); });
}

void cuda_allocator::init(int /*device_count*/) { initialized_ = true; }

double cuda_allocator::getMemoryFraction(c10::DeviceIndex device)
{
  return backend_->memory_fraction(device);
}

void cuda_allocator::setMemoryFraction(double fraction, c10::DeviceIndex device)
{
  translate("setMemoryFraction", [&] { backend_->set_memory_fraction(device, fraction); });
}

std::vector<c10cuda::StreamSegmentSize> cuda_allocator::getExpandableSegmentSizes(
  c10::DeviceIndex /*device*/)
{
  return {};  // gpukit's growable segments are not PyTorch's expandable segments
}

void cuda_allocator::enable(bool value)
{
  if (!value) {
    TORCH_WARN_ONCE("gpukit: the caching allocator cannot be disabled; it keeps caching");
  }
  enabled_ = value;
}

bool cuda_allocator::isEnabled() const { return enabled_; }

void cuda_allocator::cacheInfo(c10::DeviceIndex device, size_t* largestBlock)
{
  *largestBlock =
    translate("cacheInfo", [&] { return backend_->cache_info(device, *largestBlock); });
}

void* cuda_allocator::getBaseAllocation(void* ptr, size_t* size)
{
  auto const base = translate("getBaseAllocation", [&] { return backend_->base_allocation(ptr); });
  if (size != nullptr) { *size = base.second; }
  return base.first;
}

void cuda_allocator::recordStream(const c10::DataPtr& ptr, c10::cuda::CUDAStream stream)
{
  if (ptr.get() == nullptr || ptr.get_deleter() != &delete_block) { return; }
  translate("recordStream", [&] { backend_->record_stream(ptr.get(), stream.stream()); });
}

c10cuda::SnapshotInfo cuda_allocator::snapshot(c10::MempoolId_t mempool_id, bool include_traces)
{
  memory_state const m = backend_->snapshot(to_pool(mempool_id), include_traces);
  c10cuda::SnapshotInfo out;
  for (auto const& s : m.segments) { out.segments.push_back(to_c10(s)); }
  std::vector<std::string> skip;
  {
    std::lock_guard<std::mutex> lock{skip_mutex_};
    skip = skip_actions_;
  }
  int const devices = c10::cuda::device_count();
  out.device_traces.resize(std::max<std::size_t>(m.traces.size(), static_cast<size_t>(devices)));
  for (std::size_t d = 0; d < m.traces.size(); ++d) {
    for (auto const& e : m.traces[d]) {
      if (std::find(skip.begin(), skip.end(), action_name(e.what)) != skip.end()) { continue; }
      out.device_traces[d].push_back(to_c10(e));
    }
  }
  auto& c                        = out.config_metadata;
  c.garbage_collection_threshold = 0.0;
  c.max_split_size               = std::numeric_limits<size_t>::max();
  c.pinned_num_register_threads  = 1;
  c.expandable_segments          = backend_->options().source == gpukit::segment_source::growable;
  c.release_lock_on_malloc       = false;
  c.pinned_use_host_register     = false;
  c.graph_capture_record_stream_reuse = false;
  c.last_allocator_settings           = "gpukit: " + conf_;
  return out;
}

void cuda_allocator::beginAllocateToPool(c10::DeviceIndex device, c10::MempoolId_t mempool_id,
                                         std::function<bool(cudaStream_t)> filter)
{
  translate("beginAllocateToPool", [&] {
    backend_->begin_allocate_to_pool(device, to_pool(mempool_id), std::move(filter));
  });
}

void cuda_allocator::endAllocateToPool(c10::DeviceIndex device, c10::MempoolId_t mempool_id)
{
  translate("endAllocateToPool",
            [&] { backend_->end_allocate_to_pool(device, to_pool(mempool_id)); });
}

void cuda_allocator::releasePool(c10::DeviceIndex device, c10::MempoolId_t mempool_id)
{
  translate("releasePool", [&] { backend_->release_pool(device, to_pool(mempool_id)); });
}

int cuda_allocator::getPoolUseCount(c10::DeviceIndex device, c10::MempoolId_t mempool_id)
{
  return backend_->pool_use_count(device, to_pool(mempool_id));
}

void cuda_allocator::createOrIncrefPool(c10::DeviceIndex device, c10::MempoolId_t mempool_id,
                                        std::shared_ptr<c10cuda::CUDAAllocator> allocator)
{
  if (allocator && allocator.get() != this) {
    unsupported("MemPool(allocator=...)",
                "a pool's memory always comes from gpukit; create the MemPool without one");
  }
  translate("createOrIncrefPool",
            [&] { backend_->create_or_incref_pool(device, to_pool(mempool_id)); });
}

void cuda_allocator::setUseOnOOM(c10::DeviceIndex /*device*/, c10::MempoolId_t /*mempool_id*/,
                                 bool use_on_oom)
{
  if (use_on_oom) {
    unsupported("MemPool(use_on_oom=True)",
                "gpukit's out-of-memory recovery does not borrow from private pools");
  }
}

void cuda_allocator::setNoSplit(c10::DeviceIndex /*device*/, c10::MempoolId_t /*mempool_id*/)
{
  unsupported("MemPool(no_split=True)", "gpukit splits blocks of every pool");
}

bool cuda_allocator::checkPoolLiveAllocations(c10::DeviceIndex device, c10::MempoolId_t mempool_id,
                                              const std::unordered_set<void*>& expected)
{
  return backend_->check_pool_live_allocations(device, to_pool(mempool_id), expected);
}

c10cuda::ShareableHandle cuda_allocator::shareIpcHandle(void* ptr)
{
  auto const h = translate("shareIpcHandle", [&] { return backend_->share_ipc_handle(ptr); });
  return {static_cast<ptrdiff_t>(h.second), h.first};
}

std::shared_ptr<void> cuda_allocator::getIpcDevPtr(std::string handle)
{
  return translate("getIpcDevPtr", [&] { return backend_->open_ipc_handle(handle); });
}

bool cuda_allocator::isHistoryEnabled() { return backend_->history_enabled(); }

void cuda_allocator::recordHistory(bool enabled, c10cuda::CreateContextFn context_recorder,
                                   size_t alloc_trace_max_entries, c10cuda::RecordContext when,
                                   bool clearHistory, const std::vector<std::string>& skip_actions)
{
  {
    std::lock_guard<std::mutex> lock{skip_mutex_};
    skip_actions_ = skip_actions;
  }
  backend<gpukit::cuda_runtime>::context_recorder recorder;
  if (context_recorder != nullptr) {
    recorder = [context_recorder] { return std::shared_ptr<void>{context_recorder()}; };
  }
  backend_->record_history(enabled, std::move(recorder), alloc_trace_max_entries,
                           static_cast<record_when>(static_cast<int>(when)), clearHistory);
}

void cuda_allocator::attachOutOfMemoryObserver(c10cuda::OutOfMemoryObserver observer)
{
  backend_->add_oom_observer([observer = std::move(observer)](oom_info const& i) {
    observer(i.device, i.allocated, i.device_total, i.device_free);
  });
}

void cuda_allocator::attachAllocatorTraceTracker(c10cuda::AllocatorTraceTracker tracker)
{
  backend_->add_trace_observer(
    [tracker = std::move(tracker)](trace_entry const& e) { tracker(to_c10(e)); });
}

void cuda_allocator::enablePeerAccess(c10::DeviceIndex dev, c10::DeviceIndex dev_to_access)
{
  c10::cuda::CUDAGuard guard{dev};
  cudaError_t const err = cudaDeviceEnablePeerAccess(dev_to_access, 0);
  if (err == cudaErrorPeerAccessAlreadyEnabled) {
    (void)cudaGetLastError();
  } else {
    C10_CUDA_CHECK(err);
  }
  // cudaDeviceEnablePeerAccess covers cudaMalloc memory only: growable pages (virtual memory)
  // need cuMemSetAccess for the peer, now and as they are mapped.
  translate("enablePeerAccess", [&] { backend_->grant_peer_access(dev, dev_to_access); });
}

cudaError_t cuda_allocator::memcpyAsync(void* dst, int dstDevice, const void* src, int srcDevice,
                                        size_t count, cudaStream_t stream, bool p2p_enabled)
{
  if (p2p_enabled || srcDevice == dstDevice) {
    return cudaMemcpyAsync(dst, src, count, cudaMemcpyDeviceToDevice, stream);
  }
  // Without peer access only the peer copy handles memory not from cudaMalloc (gpukit's
  // stream-ordered and growable segments).
  return cudaMemcpyPeerAsync(dst, dstDevice, src, srcDevice, count, stream);
}

namespace {

// A private pool's allocated blocks at one moment (CUDA graph trees checkpoint them).
struct pool_checkpoint final : c10cuda::AllocatorState {
  c10::DeviceIndex device{0};
  pool_id pool{0, 0};
  std::vector<void*> blocks;
};

}  // namespace

std::shared_ptr<c10cuda::AllocatorState> cuda_allocator::getCheckpointState(c10::DeviceIndex device,
                                                                            c10::MempoolId_t id)
{
  auto state    = std::make_shared<pool_checkpoint>();
  state->device = device;
  state->pool   = to_pool(id);
  state->blocks = backend_->pool_live_blocks(device, state->pool);
  return state;
}

c10cuda::CheckpointDelta cuda_allocator::setCheckpointPoolState(
  c10::DeviceIndex device, std::shared_ptr<c10cuda::AllocatorState> pps)
{
  auto const* state = dynamic_cast<pool_checkpoint const*>(pps.get());
  TORCH_CHECK(state != nullptr && state->device == device,
              "gpukit: setCheckpointPoolState: not a checkpoint of gpukit's pool on device ",
              static_cast<int>(device));
  c10cuda::CheckpointDelta delta;
  delta.ptrs_freed = translate("setCheckpointPoolState", [&] {
    return backend_->restore_pool(device, state->pool, state->blocks);
  });
  // The checkpoint's blocks, with deleters again: PyTorch gives them to the storages whose
  // deleters it removed, and releases the others without freeing.
  for (void* p : state->blocks) {
    delta.dataptrs_allocd.emplace_back(p, p, &delete_block,
                                       c10::Device(c10::DeviceType::CUDA, device));
  }
  return delta;
}

std::string cuda_allocator::name() { return "gpukit"; }

}  // namespace gpukit_torch
