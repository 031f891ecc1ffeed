// SPDX-License-Identifier: Apache-2.0
// gpukit/memory/detail/shared_counts.hpp: the counters behind the caching allocator's statistics
// that more than one thread writes: frees waiting on other streams (pending_counts) and the
// current values and peaks once a second thread uses the allocator (shared_counts). Not public
// API; included by caching_allocator.hpp.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>

namespace gpukit::detail {

/// Bytes and blocks of each pool kind whose frees wait for other streams' work: freed by their
/// user, still active. Written under the allocator's lock, read on the fast path. While none is
/// pending, active equals allocated and its peaks follow the allocated ones: the fast path then
/// reads one counter (`blocks`), on a line of its own.
struct alignas(64) pending_counts {
  std::atomic<std::int64_t> blocks{0};  // of both kinds
  std::atomic<std::int64_t> bytes[2]{}, count[2]{};

  void add(int kind, std::int64_t size, std::int64_t n) noexcept
  {
    auto const k = static_cast<std::size_t>(kind);
    bytes[k].store(bytes[k].load(std::memory_order_relaxed) + size, std::memory_order_relaxed);
    count[k].store(count[k].load(std::memory_order_relaxed) + n, std::memory_order_relaxed);
    blocks.store(blocks.load(std::memory_order_relaxed) + n, std::memory_order_relaxed);
  }
};

/// The allocator's current values and peaks once more than one thread has used it. A thread's
/// own counters then no longer say what the allocator holds at an instant (another thread frees
/// its blocks, or holds blocks at the same time), so every allocation and free also adds to these
/// shared ones and an allocation raises the peaks it makes, on whatever thread it runs. Until a
/// second thread comes, the one thread's counters are exact and nothing here is written.
struct shared_counts {
  // Three groups on lines of their own: the switch, read by every operation and written once; the
  // current values, written by every operation; the peaks, read by every allocation and written
  // only when one is exceeded.
  alignas(64) std::atomic<bool> on{false};
  alignas(64) std::atomic<std::int64_t> bytes[2]{}, requested[2]{}, count[2]{};  // by pool kind
  // The counts of the threads that have not operated since the switch (each joins with its own
  // counts at its next operation): read by every allocation, written at joins.
  alignas(64) std::atomic<std::int64_t> unjoined_bytes[2]{}, unjoined_requested[2]{},
    unjoined_count[2]{};
  // Peaks by pool kind, then of both: [0] small, [1] large, [2] both. Active peaks are raised only
  // while frees are pending; otherwise they are the allocated ones.
  alignas(64) std::atomic<std::int64_t> peak_bytes[3]{}, peak_requested[3]{}, peak_count[3]{};
  std::atomic<std::int64_t> peak_active_bytes[3]{}, peak_active_count[3]{};

  static void raise(std::atomic<std::int64_t>& peak, std::int64_t v) noexcept
  {
    std::int64_t p = peak.load(std::memory_order_relaxed);
    while (v > p && !peak.compare_exchange_weak(p, v, std::memory_order_relaxed)) {}
  }

  void count_alloc(int kind, std::int64_t size, std::int64_t req,
                   pending_counts const& pending) noexcept
  {
    auto const k    = static_cast<std::size_t>(kind);
    auto const o    = k ^ 1;
    auto const load = [](std::atomic<std::int64_t> const& a) {
      return a.load(std::memory_order_relaxed);
    };
    std::int64_t const b =
      bytes[k].fetch_add(size, std::memory_order_relaxed) + size + load(unjoined_bytes[k]);
    std::int64_t const r =
      requested[k].fetch_add(req, std::memory_order_relaxed) + req + load(unjoined_requested[k]);
    std::int64_t const c =
      count[k].fetch_add(1, std::memory_order_relaxed) + 1 + load(unjoined_count[k]);
    std::int64_t const ob  = load(bytes[o]) + load(unjoined_bytes[o]);
    std::int64_t const orq = load(requested[o]) + load(unjoined_requested[o]);
    std::int64_t const oc  = load(count[o]) + load(unjoined_count[o]);
    raise(peak_bytes[k], b);
    raise(peak_requested[k], r);
    raise(peak_count[k], c);
    raise(peak_bytes[2], b + ob);
    raise(peak_requested[2], r + orq);
    raise(peak_count[2], c + oc);
    if (pending.blocks.load(std::memory_order_relaxed) == 0) { return; }  // active == allocated
    std::int64_t const pb  = pending.bytes[k].load(std::memory_order_relaxed);
    std::int64_t const pc  = pending.count[k].load(std::memory_order_relaxed);
    std::int64_t const opb = pending.bytes[k ^ 1].load(std::memory_order_relaxed);
    std::int64_t const opc = pending.count[k ^ 1].load(std::memory_order_relaxed);
    raise(peak_active_bytes[k], b + pb);
    raise(peak_active_count[k], c + pc);
    raise(peak_active_bytes[2], b + pb + ob + opb);
    raise(peak_active_count[2], c + pc + oc + opc);
  }

  void count_free(int kind, std::int64_t size, std::int64_t req) noexcept
  {
    auto const k = static_cast<std::size_t>(kind);
    bytes[k].fetch_sub(size, std::memory_order_relaxed);
    requested[k].fetch_sub(req, std::memory_order_relaxed);
    count[k].fetch_sub(1, std::memory_order_relaxed);
  }
};

}  // namespace gpukit::detail
