// SPDX-License-Identifier: Apache-2.0
// gpukit_torch/detail/thread_annotations.hpp: the backend's lock discipline, written where the data
// is and checked by clang's -Wthread-safety. Not public API.
//
// gpukit declares its own lock discipline the same way (GPUKIT_GUARDED_BY and an annotated mutex),
// but in its detail, which the binding uses no more than any user would
// (scripts/check-detail-boundary): these are the few the backend needs, under the binding's names.
// The macros expand to clang's attributes under clang, and to nothing elsewhere (g++, nvcc), so
// they change no code.
#pragma once

#include <mutex>

#if defined(__clang__) && !defined(__CUDACC__) && !defined(__NVCC__)
#define GPUKIT_TORCH_THREAD_ANNOTATION(x) __attribute__((x))
#else
#define GPUKIT_TORCH_THREAD_ANNOTATION(x)
#endif

/// A data member read and written only while holding `x`.
#define GPUKIT_TORCH_GUARDED_BY(x) GPUKIT_TORCH_THREAD_ANNOTATION(guarded_by(x))
/// A function its callers call holding the capabilities named.
#define GPUKIT_TORCH_REQUIRES(...) GPUKIT_TORCH_THREAD_ANNOTATION(requires_capability(__VA_ARGS__))

namespace gpukit_torch::detail {

/// std::mutex as a capability that clang's analysis follows (libstdc++'s carries none).
class GPUKIT_TORCH_THREAD_ANNOTATION(capability("mutex")) annotated_mutex {
 public:
  annotated_mutex()                                  = default;
  ~annotated_mutex()                                 = default;
  annotated_mutex(annotated_mutex const&)            = delete;
  annotated_mutex& operator=(annotated_mutex const&) = delete;
  annotated_mutex(annotated_mutex&&)                 = delete;
  annotated_mutex& operator=(annotated_mutex&&)      = delete;

  void lock() GPUKIT_TORCH_THREAD_ANNOTATION(acquire_capability()) { mutex_.lock(); }
  void unlock() GPUKIT_TORCH_THREAD_ANNOTATION(release_capability()) { mutex_.unlock(); }

 private:
  std::mutex mutex_;
};

/// Holds an annotated_mutex for its scope (std::lock_guard, annotated).
class GPUKIT_TORCH_THREAD_ANNOTATION(scoped_lockable) scoped_lock {
 public:
  explicit scoped_lock(annotated_mutex& m) GPUKIT_TORCH_THREAD_ANNOTATION(acquire_capability(m))
      : mutex_{m}
  {
    mutex_.lock();
  }
  ~scoped_lock() GPUKIT_TORCH_THREAD_ANNOTATION(release_capability()) { mutex_.unlock(); }
  scoped_lock(scoped_lock const&)            = delete;
  scoped_lock& operator=(scoped_lock const&) = delete;
  scoped_lock(scoped_lock&&)                 = delete;
  scoped_lock& operator=(scoped_lock&&)      = delete;

 private:
  annotated_mutex& mutex_;
};

}  // namespace gpukit_torch::detail
