// SPDX-License-Identifier: Apache-2.0
// gpukit/detail/error_macros.hpp: the functions behind gpukit's error macros, which
// gpukit/error_macros.hpp declares and documents. Not public API.
//
// The error's name and description come from error_traits of the status's type, that is from the
// runtime family that returned it; nothing here calls a platform. Runtime calls return errors
// already cleared from any last-error slot the platform keeps, so these macros clear nothing.
#pragma once

#include <gpukit/error.hpp>

#include <cassert>
#include <cstring>
#include <string>
#include <type_traits>

namespace gpukit::detail {

/// The call text a message names: `text` itself when it is a call, or, when it is only the name of
/// a status variable (GPUKIT_CUDA_TRY(e)), words that say so.
inline std::string describe_failed_call(char const* text)
{
  if (std::strchr(text, '(') != nullptr) { return text; }
  return std::string{"the runtime call whose status is `"} + text + '`';
}

/// Whether messages end with the check's source location (GPUKIT_ERROR_LOCATIONS): the macros
/// pass it to the functions below, so that their bodies are the same in every translation unit.
inline constexpr bool error_locations = GPUKIT_ERROR_LOCATIONS != 0;

/// Throws gpukit::cuda_error for `code`, named by error_traits<E>.
/// @param call what was called (copied: a temporary string is fine)
/// @param located whether the message ends with `file` and `line`
template <class E>
[[noreturn]] void throw_cuda_error(E code, std::string const& call, char const* file, int line,
                                   bool located)
{
  using traits = ::gpukit::error_traits<E>;
  throw ::gpukit::cuda_error{static_cast<int>(code),
                             traits::name(code),
                             traits::description(code),
                             call,
                             file,
                             line,
                             located};
}

/// Throws gpukit::cuda_error for `code` with `message` (no prefix) in place of the call's text:
/// for a failure that a user knows by another name than the call that noticed it.
template <class E>
[[noreturn]] void throw_explained_cuda_error(E code, std::string const& message,
                                             std::string const& call, char const* file, int line,
                                             bool located)
{
  throw ::gpukit::cuda_error{
    message, static_cast<int>(code), ::gpukit::error_traits<E>::name(code), call, file, line,
    located};
}

/// Throws when `code` is not its family's success; `call_text` names what was called.
template <class E>
void try_status(E code, char const* call_text, char const* file, int line, bool located)
{
  if (code != ::gpukit::error_traits<E>::success) {
    throw_cuda_error(code, describe_failed_call(call_text), file, line, located);
  }
}

/// Throws when `code` is not its family's success; `what` names the call that returned it.
template <class E>
void try_named_status(E code, std::string const& what, char const* file, int line, bool located)
{
  if (code != ::gpukit::error_traits<E>::success) {
    throw_cuda_error(code, what, file, line, located);
  }
}

template <class E>
[[nodiscard]] constexpr bool is_success(E code) noexcept
{
  return code == ::gpukit::error_traits<E>::success;
}

/// Throws gpukit::logic_error: "gpukit: <message>", followed, when `file` is not null, by
/// " (precondition `<condition>` failed at <file>:<line>)" (or " (<file>:<line>)" without a
/// condition). `message` carries no prefix of its own.
[[noreturn]] inline void throw_logic_error(std::string const& message, char const* condition,
                                           char const* file, int line)
{
  std::string text = "gpukit: " + message;
  if (file != nullptr) {
    text += " (";
    if (condition != nullptr) {
      text += "precondition `";
      text += condition;
      text += "` failed at ";
    }
    text += file;
    text += ':';
    text += std::to_string(line);
    text += ')';
  }
  throw ::gpukit::logic_error{text};
}

}  // namespace gpukit::detail

/// The source arguments of a throw: the file and line, and whether the message names them.
#define GPUKIT_DETAIL_SOURCE __FILE__, __LINE__, ::gpukit::detail::error_locations
/// The source arguments of throw_logic_error: the file (null when messages name no location) and
/// line; GPUKIT_DETAIL_CONDITION adds the condition's text before them.
#if GPUKIT_ERROR_LOCATIONS
#define GPUKIT_DETAIL_WHERE           __FILE__, __LINE__
#define GPUKIT_DETAIL_CONDITION(cond) #cond, GPUKIT_DETAIL_WHERE
#else
#define GPUKIT_DETAIL_WHERE           nullptr, __LINE__
#define GPUKIT_DETAIL_CONDITION(cond) nullptr, GPUKIT_DETAIL_WHERE
#endif

#define GPUKIT_DETAIL_TRY_CALL(call) \
  ::gpukit::detail::try_status((call), #call, GPUKIT_DETAIL_SOURCE)
#define GPUKIT_DETAIL_TRY_NAMED(status, what) \
  ::gpukit::detail::try_named_status((status), (what), GPUKIT_DETAIL_SOURCE)
#define GPUKIT_DETAIL_TRY_SELECT(first, second, chosen, ...) chosen
