// SPDX-License-Identifier: Apache-2.0
// gpukit/transfer/detail/nontemporal_copy.hpp: the staging threads' copy with streaming stores
// (staging_copy::nontemporal). Not public API.
//
// One preprocessor test picks the body: SSE2 intrinsics on x86-64, memcpy elsewhere. It defines
// no macro, so nothing of this choice shows in the code that includes it.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>

#if defined(__x86_64__) || defined(_M_X64)
#include <emmintrin.h>

namespace gpukit::detail {

/// Copies with non-temporal (streaming) stores: the destination's lines are written without being
/// read into the cache first. Any alignment; never throws.
inline void copy_nontemporal(void* dst, void const* src, std::size_t bytes) noexcept
{
  auto* d       = static_cast<char*>(dst);
  auto const* s = static_cast<char const*>(src);
  // Head: up to the destination's next 64-byte boundary.
  std::size_t const head = std::min(bytes, (64 - (reinterpret_cast<std::uintptr_t>(d) & 63)) & 63);
  std::memcpy(d, s, head);
  d += head;
  s += head;
  bytes -= head;
  std::size_t const lines = bytes / 64;
  for (std::size_t i = 0; i < lines; ++i, d += 64, s += 64) {
    __m128i const a = _mm_loadu_si128(reinterpret_cast<__m128i const*>(s));
    __m128i const b = _mm_loadu_si128(reinterpret_cast<__m128i const*>(s + 16));
    __m128i const c = _mm_loadu_si128(reinterpret_cast<__m128i const*>(s + 32));
    __m128i const e = _mm_loadu_si128(reinterpret_cast<__m128i const*>(s + 48));
    _mm_stream_si128(reinterpret_cast<__m128i*>(d), a);
    _mm_stream_si128(reinterpret_cast<__m128i*>(d + 16), b);
    _mm_stream_si128(reinterpret_cast<__m128i*>(d + 32), c);
    _mm_stream_si128(reinterpret_cast<__m128i*>(d + 48), e);
  }
  _mm_sfence();  // streaming stores are weakly ordered: visible before the copy is enqueued
  std::memcpy(d, s, bytes - lines * 64);
}

}  // namespace gpukit::detail

#else  // no streaming stores on this CPU: an ordinary copy

namespace gpukit::detail {

inline void copy_nontemporal(void* dst, void const* src, std::size_t bytes) noexcept
{
  std::memcpy(dst, src, bytes);
}

}  // namespace gpukit::detail

#endif
