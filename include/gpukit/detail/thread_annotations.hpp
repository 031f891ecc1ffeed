// SPDX-License-Identifier: Apache-2.0
// gpukit/detail/thread_annotations.hpp: lock discipline written where the data is, and checked by
// the compiler (clang's -Wthread-safety; abseil's absl/base/thread_annotations.h is the model).
// Not public API.
//
//   class counter {
//     detail::annotated_mutex mutex_;
//     int value_ GPUKIT_GUARDED_BY(mutex_){0};
//     void bump() GPUKIT_REQUIRES(mutex_) { ++value_; }  // callers hold mutex_
//    public:
//     void add() GPUKIT_EXCLUDES(mutex_)
//     {
//       detail::pool_lock lock{mutex_};
//       bump();
//     }
//   };
//
// The macros expand to clang's attributes under clang, and to nothing elsewhere (g++, nvcc, and
// clang compiling CUDA), so they cost nothing and change no code. libstdc++'s std::mutex carries no
// capability, hence annotated_mutex and its scoped locks below.
#pragma once

#include <mutex>

#if defined(__clang__) && !defined(__CUDACC__) && !defined(__NVCC__)
#define GPUKIT_THREAD_ANNOTATION(x) __attribute__((x))
#else
#define GPUKIT_THREAD_ANNOTATION(x)
#endif

/// A type whose objects are capabilities (a mutex): `class GPUKIT_CAPABILITY("mutex") m {...}`.
#define GPUKIT_CAPABILITY(x) GPUKIT_THREAD_ANNOTATION(capability(x))
/// An RAII type that acquires a capability in its constructor and releases it in its destructor.
#define GPUKIT_SCOPED_CAPABILITY GPUKIT_THREAD_ANNOTATION(scoped_lockable)
/// A data member read and written only while holding `x`.
#define GPUKIT_GUARDED_BY(x) GPUKIT_THREAD_ANNOTATION(guarded_by(x))
/// A pointer member whose pointee is read and written only while holding `x`.
#define GPUKIT_PT_GUARDED_BY(x) GPUKIT_THREAD_ANNOTATION(pt_guarded_by(x))
/// A function its callers call holding the capabilities named.
#define GPUKIT_REQUIRES(...) GPUKIT_THREAD_ANNOTATION(requires_capability(__VA_ARGS__))
/// A function that acquires the capabilities named (none: `this`) and returns holding them.
#define GPUKIT_ACQUIRE(...) GPUKIT_THREAD_ANNOTATION(acquire_capability(__VA_ARGS__))
/// A function that releases the capabilities named (none: `this`), held on entry.
#define GPUKIT_RELEASE(...) GPUKIT_THREAD_ANNOTATION(release_capability(__VA_ARGS__))
/// A function its callers must not call holding the capabilities named (it takes them).
#define GPUKIT_EXCLUDES(...) GPUKIT_THREAD_ANNOTATION(locks_excluded(__VA_ARGS__))
/// A capability that is always taken before the ones named, never while holding them (lock order;
/// checked by clang's -Wthread-safety-beta).
#define GPUKIT_ACQUIRED_BEFORE(...) GPUKIT_THREAD_ANNOTATION(acquired_before(__VA_ARGS__))
/// A capability that is always taken after the ones named.
#define GPUKIT_ACQUIRED_AFTER(...) GPUKIT_THREAD_ANNOTATION(acquired_after(__VA_ARGS__))
/// A function after which the analysis takes the capability as held (see
/// annotated_mutex::assert_held).
#define GPUKIT_ASSERT_CAPABILITY(x) GPUKIT_THREAD_ANNOTATION(assert_capability(x))
/// A function that returns a reference to the capability named.
#define GPUKIT_RETURN_CAPABILITY(x) GPUKIT_THREAD_ANNOTATION(lock_returned(x))
/// A function the analysis does not check (say why where it is used).
#define GPUKIT_NO_THREAD_SAFETY_ANALYSIS GPUKIT_THREAD_ANNOTATION(no_thread_safety_analysis)

namespace gpukit::detail {

/// std::mutex as a capability that clang's analysis follows.
class GPUKIT_CAPABILITY("mutex") annotated_mutex {
 public:
  annotated_mutex()                                  = default;
  ~annotated_mutex()                                 = default;
  annotated_mutex(annotated_mutex const&)            = delete;
  annotated_mutex& operator=(annotated_mutex const&) = delete;
  annotated_mutex(annotated_mutex&&)                 = delete;
  annotated_mutex& operator=(annotated_mutex&&)      = delete;

  void lock() GPUKIT_ACQUIRE() { mutex_.lock(); }
  /// lock(), telling whether another thread held the mutex first (this one had to wait).
  [[nodiscard]] bool lock_contended() GPUKIT_ACQUIRE()
  {
    if (mutex_.try_lock()) { return false; }
    mutex_.lock();
    return true;
  }
  void unlock() GPUKIT_RELEASE() { mutex_.unlock(); }
  /// Tells the analysis that the caller holds this mutex; checks nothing at run time. For the one
  /// place it cannot see the lock: a lambda that runs while its enclosing function holds it (the
  /// analysis checks a lambda's body as a function of its own, and a lambda cannot be annotated
  /// without its caller, a helper such as address_map::for_each, requiring the lock too).
  void assert_held() const GPUKIT_ASSERT_CAPABILITY(this) {}
  /// The mutex itself, for a condition variable's wait (see pool_lock::wait_for).
  [[nodiscard]] std::mutex& native() noexcept { return mutex_; }

 private:
  std::mutex mutex_;
};

/// Holds an annotated_mutex for its scope (std::lock_guard, annotated).
class GPUKIT_SCOPED_CAPABILITY pool_lock {
 public:
  explicit pool_lock(annotated_mutex& m) GPUKIT_ACQUIRE(m) : mutex_{m} { mutex_.lock(); }
  /// Holds `m`, setting `waited` to whether another thread held it first.
  pool_lock(annotated_mutex& m, bool& waited) GPUKIT_ACQUIRE(m) : mutex_{m}
  {
    waited = mutex_.lock_contended();
  }
  ~pool_lock() GPUKIT_RELEASE() { mutex_.unlock(); }
  pool_lock(pool_lock const&)            = delete;
  pool_lock& operator=(pool_lock const&) = delete;
  pool_lock(pool_lock&&)                 = delete;
  pool_lock& operator=(pool_lock&&)      = delete;

  /// Releases `m` (held by the caller) for its scope, and takes it again at the end of the scope,
  /// also when an exception leaves it: the one way gpukit code runs unlocked inside a function that
  /// requires the lock (the out-of-memory ladder's callbacks). The analysis sees `m` released
  /// inside and held again after.
  class GPUKIT_SCOPED_CAPABILITY unlocked_scope {
   public:
    explicit unlocked_scope(annotated_mutex& m) GPUKIT_RELEASE(m) : mutex_{m} { mutex_.unlock(); }
    // clang 14 reads a scoped capability's destructor as "undo the constructor": RELEASE() here
    // re-acquires what the constructor released.
    ~unlocked_scope() GPUKIT_RELEASE() { mutex_.lock(); }
    unlocked_scope(unlocked_scope const&)            = delete;
    unlocked_scope& operator=(unlocked_scope const&) = delete;
    unlocked_scope(unlocked_scope&&)                 = delete;
    unlocked_scope& operator=(unlocked_scope&&)      = delete;

   private:
    annotated_mutex& mutex_;
  };

 private:
  annotated_mutex& mutex_;
};

/// Waits on `cv` for up to `timeout`, releasing `m` (held by the caller) meanwhile and holding it
/// again on return, as std::condition_variable::wait_for does with a std::unique_lock.
template <class ConditionVariable, class Duration>
void wait_for(ConditionVariable& cv, annotated_mutex& m, Duration timeout) GPUKIT_REQUIRES(m)
{
  std::unique_lock<std::mutex> lock{m.native(), std::adopt_lock};
  cv.wait_for(lock, timeout);
  lock.release();  // still held: the caller's
}

/// Waits on `cv` until notified (or woken spuriously), releasing `m` (held by the caller) meanwhile
/// and holding it again on return, as std::condition_variable::wait does with a std::unique_lock.
/// The caller loops on its condition, `while (!ready_) detail::wait(cv_, mutex_);` (what
/// wait(lock, predicate) does), so that the condition is read where the analysis sees `m` held: a
/// predicate lambda is checked as a function of its own.
template <class ConditionVariable>
void wait(ConditionVariable& cv, annotated_mutex& m) GPUKIT_REQUIRES(m)
{
  std::unique_lock<std::mutex> lock{m.native(), std::adopt_lock};
  cv.wait(lock);
  lock.release();  // still held: the caller's
}

}  // namespace gpukit::detail
