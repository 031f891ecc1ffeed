// SPDX-License-Identifier: Apache-2.0
// gpukit/memory/detail/caching_block.hpp: the block descriptor of basic_caching_allocator (one per
// run of bytes inside a segment, whatever its state) and the rounding every size goes through.
// Not public API.
//
// Descriptors are never deallocated while their allocator lives (they are recycled through a
// spare list), so a thread may read one that another thread reuses: its address and state are
// atomics for that reason.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <vector>

namespace gpukit::detail {

/// `n` rounded up to a multiple of `a` (a > 0); std::numeric_limits<std::size_t>::max() rounded
/// down to a multiple of `a` when the true result does not fit (callers that can see such sizes use
/// checked_round_up).
inline std::size_t round_up(std::size_t n, std::size_t a) noexcept
{
  std::size_t const r = n % a;
  if (r == 0) { return n; }
  return n > std::numeric_limits<std::size_t>::max() - (a - r)
           ? std::numeric_limits<std::size_t>::max() / a * a
           : n + (a - r);
}

/// `n` rounded up to a multiple of `a` (a > 0) in `out`; false (out untouched) when it overflows.
inline bool checked_round_up(std::size_t n, std::size_t a, std::size_t& out) noexcept
{
  std::size_t const r = n % a;
  if (r == 0) {
    out = n;
    return true;
  }
  if (n > std::numeric_limits<std::size_t>::max() - (a - r)) { return false; }
  out = n + (a - r);
  return true;
}

enum class block_state : std::uint8_t {
  allocated,  // held by a user
  cached,     // in a thread cache
  free,       // in a pool index
  pending,    // freed, waiting for events on recorded streams
  unmapped,   // growable segments: address range without usable memory (page-aligned)
  dead,       // descriptor not describing any block (spare)
};

template <class Runtime>
struct caching_block {
  using stream_type = typename Runtime::stream_type;

  [[nodiscard]] std::uintptr_t address() const noexcept
  {
    return ptr.load(std::memory_order_relaxed);
  }
  [[nodiscard]] void* data() const noexcept { return reinterpret_cast<void*>(address()); }

  std::atomic<std::uintptr_t> ptr{0};
  std::atomic<block_state> state{block_state::dead};
  // The thread cache whose hand-out began the block's current life; nullptr once a free claimed
  // it. A free is accepted only by the one compare-exchange that takes it from a live owner to
  // nullptr, so of two racing frees exactly one wins, and a thread's record of an earlier life
  // (its owner is another cache now, or none) is recognised as stale.
  std::atomic<void*> owner{nullptr};
  std::size_t size{0};
  std::size_t requested{0};
  stream_type stream{};           // allocated on / freed on (owner when free and not global)
  bool global{false};             // free and usable on any stream
  int kind{0};                    // small or large pool
  std::uint64_t free_seq{0};      // when it entered its stream's pool
  std::uint64_t capture_pool{0};  // private pool of a graph capture (0: none)
  void* segment{nullptr};
  caching_block* prev{nullptr};  // neighbours by address within the segment
  caching_block* next{nullptr};
  caching_block* free_prev{nullptr};  // index links (also the spare list)
  caching_block* free_next{nullptr};
  std::vector<stream_type> recorded;  // record_stream
};

}  // namespace gpukit::detail
