// SPDX-License-Identifier: Apache-2.0
// gpukit/profile/detail/slow_path_range.hpp: gpukit's own NVTX ranges around its slow paths
// (segments grown, trimmed or released, the out-of-memory ladder's steps, pinned pool growth,
// pipeline chunks, recomputation). Not public API.
//
// Each range is a push/pop in the "gpukit" domain, in the category of the component that opens it
// (categories::allocator, pinned_pool, transfer, checkpoint), colored by that category, so that
// Nsight Systems shows gpukit's work on its own rows beside the user's ranges. Fixed names are
// registered strings (GPUKIT_DETAIL_SLOW_PATH_RANGE: one registration per call site, a push and a
// pop per range); names with numbers in them are formatted into a buffer on the stack, only when
// an NVTX tool is configured (NVTX_INJECTION64_PATH, as Nsight Systems sets it). Without a tool a
// range costs a call or two and the test of a static flag. Nothing here runs on the allocator's
// fast path (a block served from or returned to the cache), and all of it is out of line and
// cold, so that it does not change what the compiler inlines there either.
//
// GPUKIT_DISABLE_INTERNAL_NVTX (implied by GPUKIT_DISABLE_NVTX and NVTX_DISABLE) compiles every
// such range away and leaves the user's own ranges alone. Like any macro that changes gpukit's
// bodies, define it alike in every translation unit of a program.
#pragma once

#include <gpukit/profile/nvtx.hpp>

#if defined(GPUKIT_DISABLE_NVTX) && !defined(GPUKIT_DISABLE_INTERNAL_NVTX)
#define GPUKIT_DISABLE_INTERNAL_NVTX
#endif

#include <cstddef>

#ifndef GPUKIT_DISABLE_INTERNAL_NVTX
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <type_traits>
#endif

namespace gpukit::detail {

#ifndef GPUKIT_DISABLE_INTERNAL_NVTX

/// True when an NVTX tool is configured for this process (read once, at the first slow path).
[[nodiscard]] inline bool slow_path_ranges_wanted() noexcept
{
  static bool const wanted = std::getenv("NVTX_INJECTION64_PATH") != nullptr;
  return wanted;
}

/// A formatted range name: empty when no tool is configured.
struct slow_path_text {
  char chars[128];
};

/// Formats `text` (std::snprintf's `format` and arguments, checked by the compiler) when an NVTX
/// tool is configured, else leaves it empty. Out of line and cold, as is everything a range does,
/// so that a slow path grows by a call and the code the compiler inlines around it (the fast path
/// included) stays as it was.
__attribute__((noinline, cold, format(printf, 2, 3))) inline void format_slow_path_text(
  slow_path_text& text, char const* format, ...) noexcept
{
  text.chars[0] = '\0';
  if (!slow_path_ranges_wanted()) { return; }
  std::va_list args;
  va_start(args, format);
  std::vsnprintf(text.chars, sizeof(text.chars), format, args);
  va_end(args);
}

/// A range of gpukit's own around one slow path, in the gpukit domain and category `C`, on the
/// calling thread for the lifetime of the object.
template <class C>
class slow_path_range {
 public:
  /// A range named by a string registered with the gpukit domain (none when no tool is
  /// configured).
  __attribute__((noinline, cold)) explicit slow_path_range(
    registered_string_in<nvtx_domain> const& name) noexcept
  {
    if (slow_path_ranges_wanted()) { push(event_attributes{name, category_of<C>(), color_of()}); }
  }

  /// A range named by `text` (none when it is empty: no tool configured).
  __attribute__((noinline, cold)) explicit slow_path_range(slow_path_text const& text) noexcept
  {
    if (text.chars[0] != '\0') {
      push(event_attributes{message{text.chars}, category_of<C>(), color_of()});
    }
  }

  ~slow_path_range() noexcept
  {
    if (pushed_) { pop(); }
  }
  slow_path_range(slow_path_range const&)            = delete;
  slow_path_range& operator=(slow_path_range const&) = delete;
  slow_path_range(slow_path_range&&)                 = delete;
  slow_path_range& operator=(slow_path_range&&)      = delete;
  void* operator new(std::size_t)                    = delete;

 private:
  static color color_of() noexcept { return color_for(C::name); }
  void push(event_attributes const& a) noexcept
  {
    nvtxDomainRangePushEx(nvtx3::v1::domain::get<nvtx_domain>(), a.get());
    pushed_ = true;
  }
  __attribute__((noinline, cold)) static void pop() noexcept
  {
    nvtxDomainRangePop(nvtx3::v1::domain::get<nvtx_domain>());
  }
  bool pushed_{false};
};

/// A stream as a pointer for "%p" (cudaStream_t and the simulated GPU's handles are pointers).
template <class Stream>
[[nodiscard]] void const* stream_address(Stream const& s) noexcept
{
  if constexpr (std::is_pointer_v<Stream>) {
    return static_cast<void const*>(s);
  } else {
    return nullptr;
  }
}

#endif  // GPUKIT_DISABLE_INTERNAL_NVTX

/// Bytes in MiB, for range names.
[[nodiscard]] constexpr double mib(std::size_t bytes) noexcept
{
  return static_cast<double>(bytes) / (1024.0 * 1024.0);
}

}  // namespace gpukit::detail

#define GPUKIT_DETAIL_NVTX_CONCAT_(a, b) a##b
#define GPUKIT_DETAIL_NVTX_CONCAT(a, b)  GPUKIT_DETAIL_NVTX_CONCAT_(a, b)

#ifndef GPUKIT_DISABLE_INTERNAL_NVTX
/// gpukit's own range in category `C` (a ::gpukit::categories tag) named by `name` (a string
/// literal, or a std::string expression evaluated once), registered once per call site, until the
/// end of the enclosing scope.
#define GPUKIT_DETAIL_SLOW_PATH_RANGE(C, name)                                                  \
  static ::gpukit::registered_string_in<::gpukit::nvtx_domain> const GPUKIT_DETAIL_NVTX_CONCAT( \
    gpukit_slow_path_name_, __LINE__){name};                                                    \
  ::gpukit::detail::slow_path_range<C> const GPUKIT_DETAIL_NVTX_CONCAT(gpukit_slow_path_,       \
                                                                       __LINE__)                \
  {                                                                                             \
    GPUKIT_DETAIL_NVTX_CONCAT(gpukit_slow_path_name_, __LINE__)                                 \
  }
/// gpukit's own range in category `C` named by std::snprintf(format, ...), formatted only when an
/// NVTX tool is configured, until the end of the enclosing scope.
#define GPUKIT_DETAIL_SLOW_PATH_RANGEF(C, ...)                                                  \
  ::gpukit::detail::slow_path_text GPUKIT_DETAIL_NVTX_CONCAT(gpukit_slow_path_text_, __LINE__); \
  ::gpukit::detail::format_slow_path_text(                                                      \
    GPUKIT_DETAIL_NVTX_CONCAT(gpukit_slow_path_text_, __LINE__), __VA_ARGS__);                  \
  ::gpukit::detail::slow_path_range<C> const GPUKIT_DETAIL_NVTX_CONCAT(gpukit_slow_path_,       \
                                                                       __LINE__)                \
  {                                                                                             \
    GPUKIT_DETAIL_NVTX_CONCAT(gpukit_slow_path_text_, __LINE__)                                 \
  }
#else
#define GPUKIT_DETAIL_SLOW_PATH_RANGE(C, name) static_cast<void>(0)
#define GPUKIT_DETAIL_SLOW_PATH_RANGEF(C, ...) static_cast<void>(0)
#endif
