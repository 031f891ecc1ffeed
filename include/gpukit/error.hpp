// SPDX-License-Identifier: Apache-2.0
// gpukit/error.hpp: the one family of errors every gpukit component throws.
//
// Quick start:
//
//   #include <gpukit/error.hpp>
//   #include <gpukit/memory/caching_allocator.hpp>
//
//   #include <iostream>
//
//   void* try_allocate(gpukit::caching_allocator& alloc, std::size_t bytes, cudaStream_t stream)
//   {
//     try {
//       return alloc.allocate_async(bytes, stream);
//     } catch (gpukit::out_of_memory const& e) {  // the device is full: e.report() says why
//       std::cerr << e.what();                    // readable, with a hint of what to change
//     } catch (gpukit::bad_alloc const&) {        // any other refused allocation
//     } catch (gpukit::cuda_error const& e) {     // a CUDA call failed: e.code(), e.call()
//       std::cerr << e.call() << " failed with " << e.name() << '\n';
//     } catch (gpukit::logic_error const&) {      // a precondition did not hold (bad input)
//     }
//     return nullptr;
//   }
//
// `cuda_error` keeps the error's value and name (as the failing runtime names it) and the call,
// file and line that failed.
//
// Every message (what()) starts with exactly one "gpukit: ", the PyTorch binding's included, then
// says what was refused, the value and the limit it broke, and what to change. The source of a
// check (the condition's text, the file and the line) is a developer's aid: it follows the message
// only when GPUKIT_ERROR_LOCATIONS is 1, which it is by default in debug builds (NDEBUG not
// defined) and not otherwise; define it to 0 or 1 before the first gpukit include to choose. Like
// assert, it must agree across the translation units of one program. cuda_error::file() and
// line() keep the location either way.
// `bad_alloc` derives from `std::bad_alloc`; `out_of_memory` derives from `bad_alloc` and carries
// an `oom_report`. `logic_error` derives from `std::logic_error` and is thrown by precondition
// checks (zero sizes, unknown pointers, double frees, ...). Nothing here synchronizes.
// The macros that check a call or a precondition and throw these errors (GPUKIT_CUDA_TRY,
// GPUKIT_EXPECTS, GPUKIT_FAIL) are in gpukit/error_macros.hpp.
#pragma once

#include <cstddef>
#include <cstdint>
#include <new>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

/// 1: messages end with the source location of the check that threw (and GPUKIT_EXPECTS's
/// condition text); 0: they end with the message. Defaults to 1 when NDEBUG is not defined.
#ifndef GPUKIT_ERROR_LOCATIONS
#ifdef NDEBUG
#define GPUKIT_ERROR_LOCATIONS 0
#else
#define GPUKIT_ERROR_LOCATIONS 1
#endif
#endif

namespace gpukit {

/// Names the error codes of a runtime family: specialized for each runtime's `error_type` next to
/// the runtime (CUDA's in gpukit/runtime/detail/cuda_errors.hpp) with
///
///   static constexpr E success;
///   static char const* name(E) noexcept;          // e.g. "cudaErrorMemoryAllocation"
///   static char const* description(E) noexcept;   // e.g. "out of memory"
///
/// GPUKIT_CUDA_TRY and gpukit::cuda_error take names from here, never from a platform directly.
template <class E>
struct error_traits;

/// Thrown when a runtime call (CUDA, the simulated GPU, or another runtime) returns an error.
class cuda_error : public std::runtime_error {
 public:
  /// @param code the error the call returned, as an integer (a cudaError_t value for CUDA)
  /// @param name the error's name (e.g. "cudaErrorMemoryAllocation"), from the runtime
  /// @param description the runtime's description of the error
  /// @param call what was called (e.g. "rt.stream_create(s)")
  /// @param file, line where the call was made
  /// @param located whether the message ends with the file and line (GPUKIT_ERROR_LOCATIONS)
  cuda_error(int code, char const* name, char const* description, std::string call,
             char const* file, int line, bool located = true)
      : cuda_error{"gpukit: " + format(code, name, description, call), code, name,
                   origin{std::move(call), file, line, located}}
  {}

  /// A runtime error explained in the caller's words: `message` (without the "gpukit: " prefix)
  /// says what went wrong and what to do; the error's name follows it in parentheses.
  /// @param message e.g. "stream 0x1234 is not a live stream of device 0 (...): ..."
  /// @param code, name, call, file, line, located as above
  cuda_error(std::string const& message, int code, char const* name, std::string call,
             char const* file, int line, bool located = true)
      : cuda_error{"gpukit: " + message + " (" + name_or_unknown(name) + ")", code, name,
                   origin{std::move(call), file, line, located}}
  {}

  /// The error's value (for CUDA runtimes: compare with cudaError_t values or Runtime::*).
  [[nodiscard]] int code() const noexcept { return code_; }
  /// The error's name as the runtime spells it (e.g. "cudaErrorMemoryAllocation").
  [[nodiscard]] char const* name() const noexcept { return name_.c_str(); }
  /// What was called.
  [[nodiscard]] char const* call() const noexcept { return call_.c_str(); }
  [[nodiscard]] char const* file() const noexcept { return file_; }
  [[nodiscard]] int line() const noexcept { return line_; }

 private:
  /// What was called, where, and whether the message ends with the place.
  struct origin {
    std::string call;
    char const* file;
    int line;
    bool located;
  };

  /// `message` is whole but for the place, which locate() adds.
  cuda_error(std::string message, int code, char const* name, origin where)
      : std::runtime_error{locate(std::move(message), where.file, where.line, where.located)},
        code_{code}, name_{name_or_unknown(name)}, call_{std::move(where.call)}, file_{where.file},
        line_{where.line}
  {}

  static std::string name_or_unknown(char const* name)
  {
    return name != nullptr ? name : "unknown error";
  }

  static std::string format(int code, char const* name, char const* description,
                            std::string const& call)
  {
    std::string s = call;
    s += " failed with ";
    s += name_or_unknown(name);
    s += " (";
    s += std::to_string(code);
    s += "): ";
    s += description != nullptr ? description : "no description";
    return s;
  }

  static std::string locate(std::string message, char const* file, int line, bool located)
  {
    if (located && file != nullptr) {
      message += " at ";
      message += file;
      message += ':';
      message += std::to_string(line);
    }
    return message;
  }

  int code_;
  std::string name_;
  std::string call_;
  char const* file_;
  int line_;
};

/// Thrown when a precondition of a gpukit call does not hold; the message names the value.
class logic_error : public std::logic_error {
 public:
  using std::logic_error::logic_error;
};

/// Thrown when an allocation cannot be satisfied for a reason other than a full device
/// (a limit, a size no device could hold, a pool's own refusal).
class bad_alloc : public std::bad_alloc {
 public:
  explicit bad_alloc(std::string message) : message_{std::move(message)} {}
  [[nodiscard]] char const* what() const noexcept override { return message_.c_str(); }

 private:
  std::string message_;
};

/// What an allocator knew and tried when it ran out of device memory.
struct oom_report {
  /// One step of a recovery ladder and what it gave back.
  struct step {
    std::string name;                ///< e.g. "release cached segments of all streams"
    std::size_t bytes_reclaimed{0};  ///< bytes that step returned to the device or the pool
    bool attempted{false};           ///< false when the step did not apply
  };
  /// Bytes cached (free, reserved) for one stream.
  struct stream_cache {
    std::uintptr_t stream{0};
    std::size_t bytes{0};
  };

  std::size_t requested{0};           ///< bytes asked for
  int device{-1};                     ///< device ordinal
  std::size_t device_total{0};        ///< total memory of the device
  std::size_t device_free{0};         ///< free memory of the device as the runtime reports it
  std::size_t allocated{0};           ///< bytes handed to users and not yet freed
  std::size_t reserved{0};            ///< bytes the allocator holds from the device
  std::size_t largest_free_block{0};  ///< largest block free in the allocator's pool
  std::size_t total_free_in_pool{0};  ///< all free bytes in the allocator's pool
  std::size_t limit{0};               ///< allocator limit; 0 when none is set
  std::vector<stream_cache> cached_per_stream;
  std::vector<step> steps;
  std::string hint;  ///< a concrete action that would have made it fit

  /// 1 - largest free block / total free in the pool (0 when nothing is free).
  [[nodiscard]] double fragmentation() const noexcept
  {
    return total_free_in_pool == 0 ? 0.0
                                   : 1.0 - static_cast<double>(largest_free_block) /
                                             static_cast<double>(total_free_in_pool);
  }

  /// A readable, multi-line description of the report.
  [[nodiscard]] std::string to_string() const
  {
    auto human = [](std::size_t b) {  // one decimal in the largest unit that keeps b >= 1
      if (b < 1024) { return std::to_string(b) + " B"; }
      char const* const units[] = {"KiB", "MiB", "GiB", "TiB"};
      std::size_t unit          = 1024;
      int u                     = 0;
      while (u < 3 && b / unit >= 1024) {
        unit *= 1024;
        ++u;
      }
      std::string s = std::to_string(b / unit);
      s += '.';
      s += std::to_string((b % unit) * 10 / unit);
      return s + " " + units[u];
    };
    std::string s = "gpukit: out of memory on device " + std::to_string(device) +
                    ": tried to allocate " + human(requested) + " (" + std::to_string(requested) +
                    " bytes)";
    s += "\n  device: " + human(device_total) + " total, " + human(device_free) + " free";
    s += "\n  allocator: " + human(allocated) + " allocated, " + human(reserved) + " reserved, " +
         human(total_free_in_pool) + " free in pool, largest free block " +
         human(largest_free_block);
    s += ", fragmentation " + std::to_string(static_cast<int>(fragmentation() * 100.0 + 0.5)) + "%";
    if (limit != 0) s += "\n  limit: " + human(limit);
    for (auto const& c : cached_per_stream) {
      s += "\n  cached for stream " + std::to_string(c.stream) + ": " + human(c.bytes);
    }
    for (auto const& st : steps) {
      s += "\n  recovery: " + st.name + ": ";
      s += st.attempted ? "reclaimed " + human(st.bytes_reclaimed) : std::string{"not applicable"};
    }
    if (!hint.empty()) s += "\n  hint: " + hint;
    return s;
  }
};

/// Thrown when the device (or a limit standing for it) has no room for an allocation, after
/// every recovery step has run. Catch it to adapt (e.g. halve the micro-batch) instead of crashing.
class out_of_memory : public bad_alloc {
 public:
  explicit out_of_memory(oom_report report)
      : bad_alloc{report.to_string()}, report_{std::move(report)}
  {}
  [[nodiscard]] oom_report const& report() const noexcept { return report_; }

 private:
  oom_report report_;
};

}  // namespace gpukit
