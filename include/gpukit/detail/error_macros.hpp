// SPDX-License-Identifier: Apache-2.0
// gpukit/detail/error_macros.hpp: the functions behind gpukit's error macros, which
// gpukit/error_macros.hpp declares and documents. Not public API.
//
// The error's name and description come from error_traits of the status's type, that is from the
// runtime family that returned it; nothing here calls a platform. Runtime calls return errors
// already cleared from any last-error slot the platform keeps, so these macros clear nothing.
#pragma once

#include <gpukit/error.hpp>
#include <gpukit/runtime/detail/cuda_errors.hpp>

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

/// Throws gpukit::cuda_error for `code`, named by error_traits<E>.
/// @param call what was called (copied: a temporary string is fine)
template <class E>
[[noreturn]] void throw_cuda_error(E code, std::string const& call, char const* file, int line)
{
  using traits = ::gpukit::error_traits<E>;
  throw ::gpukit::cuda_error{
    static_cast<int>(code), traits::name(code), traits::description(code), call, file, line};
}

/// Throws when `code` is not its family's success; `call_text` names what was called.
template <class E>
void try_status(E code, char const* call_text, char const* file, int line)
{
  if (code != ::gpukit::error_traits<E>::success) {
    throw_cuda_error(code, describe_failed_call(call_text), file, line);
  }
}

/// Throws when `code` is not its family's success; `what` names the call that returned it.
template <class E>
void try_named_status(E code, std::string const& what, char const* file, int line)
{
  if (code != ::gpukit::error_traits<E>::success) { throw_cuda_error(code, what, file, line); }
}

template <class E>
[[nodiscard]] constexpr bool is_success(E code) noexcept
{
  return code == ::gpukit::error_traits<E>::success;
}

/// Throws gpukit::logic_error: "gpukit: <message> (<where>)", where says the condition that did
/// not hold (when `condition` is not null) and the file and line.
[[noreturn]] inline void throw_logic_error(std::string const& message, char const* condition,
                                           char const* file, int line)
{
  std::string text = "gpukit: " + message + " (";
  if (condition != nullptr) {
    text += "precondition `";
    text += condition;
    text += "` failed at ";
  }
  text += file;
  text += ':';
  text += std::to_string(line);
  text += ')';
  throw ::gpukit::logic_error{text};
}

}  // namespace gpukit::detail

#define GPUKIT_DETAIL_TRY_CALL(call) ::gpukit::detail::try_status((call), #call, __FILE__, __LINE__)
#define GPUKIT_DETAIL_TRY_NAMED(status, what) \
  ::gpukit::detail::try_named_status((status), (what), __FILE__, __LINE__)
#define GPUKIT_DETAIL_TRY_SELECT(first, second, chosen, ...) chosen
